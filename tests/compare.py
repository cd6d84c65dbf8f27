"""Comparing a jitted call's result with eager's, for the review test files."""
import numpy as np

from tracejit import Variable


def data_of(a):
    return a._data if isinstance(a, Variable) else a


def same(got, want, creator=True):
    """got == want: structure, type (Variable / Parameter / ndarray / NumPy scalar /
    Python scalar), dtype, shape, values and (creator=True) whether a Variable has one."""
    if isinstance(want, (tuple, list)):
        assert type(got) is type(want) and len(got) == len(want), (got, want)
        for g, w in zip(got, want):
            same(g, w, creator)
        return
    assert type(got) is type(want), (type(got), type(want))
    if creator and isinstance(want, Variable):
        assert (got.creator is None) == (want.creator is None), (got.creator, want.creator)
    g, w = data_of(got), data_of(want)
    assert type(g) is type(w), (type(g), type(w))
    if isinstance(w, (np.ndarray, np.generic)):
        assert g.dtype == w.dtype and g.shape == w.shape, (g.dtype, w.dtype, g.shape, w.shape)
    np.testing.assert_allclose(np.asarray(g, np.float64), np.asarray(w, np.float64),
                               rtol=1e-6, atol=1e-12)
