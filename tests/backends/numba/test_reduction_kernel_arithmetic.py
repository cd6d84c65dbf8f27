"""A kernel with a reduction computes its fused elementwise producers as NumPy does, op
by op: only the sum's accumulation may be reordered. ('reassoc' on the whole kernel let
LLVM rewrite (x * 3.0) * (1 / 3.0) as x and (x * 1e300) * 1e10 * 1e-10 as x * inf.)"""
import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")

PRODUCERS = {
    "mul_3_third": lambda x: (x * 3.0) * (1 / 3.0),
    "add_tenth_fifth": lambda x: (x + 0.1) + 0.2,
    "mul_overflow": lambda x: ((x * 1e300) * 1e10) * 1e-10,
    "add_cancel": lambda x: (x + 1e16) - 1e16,
}
# (64, 512): above PARALLEL_MIN, so the axis-1 sum runs in a prange kernel
SHAPES_AXES = [((257,), None), ((6, 33), 1), ((6, 33), 0), ((64, 512), 1), ((64, 512), None)]


@pytest.mark.parametrize("name", sorted(PRODUCERS))
@pytest.mark.parametrize("shape,axis", SHAPES_AXES)
def test_producer_of_a_sum_is_numpys(name, shape, axis):
    prod = PRODUCERS[name]

    def f(x):
        y = prod(x)
        return y, F.sum(y, axis=axis)

    jf = tj.jit(f)
    rng = np.random.RandomState(7)
    for _ in range(4):
        a = rng.rand(*shape) * 0.02
        with np.errstate(all="ignore"):
            e = f(tj.Variable(a.copy()))
            j = jf(tj.Variable(a.copy()))
        # the elementwise value is written by the reduction kernel: bit for bit NumPy's
        np.testing.assert_array_equal(j[0].data, e[0].data)
        assert j[1].data.dtype == e[1].data.dtype
        np.testing.assert_allclose(j[1].data, e[1].data, rtol=1e-12)
