"""Two MLPs with the same parameters, one for each side of a jit-vs-eager comparison."""
import numpy as np

from tracejit.models import MLP


def twins(seed, sizes, dtype=np.float64, in_size=3):
    m1, m2 = MLP(sizes), MLP(sizes)
    x0 = np.zeros((2, in_size), dtype)
    np.random.seed(seed)
    m1(x0)                      # one eager forward: the lazy Linear layers initialise
    np.random.seed(seed)
    m2(x0)
    if dtype == np.float64:       # Linear defaults to float32 parameters
        for p in list(m1.params()) + list(m2.params()):
            p.data = p.data.astype(np.float64)
    for p1, p2 in zip(m1.params(), m2.params()):
        np.testing.assert_array_equal(p1.data, p2.data)
    return m1, m2
