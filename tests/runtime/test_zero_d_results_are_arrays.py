"""A compiled 0-d result holds a 0-d ndarray, as eager's, on every backend path: the
float32 groups that run as NumPy ufuncs on blocks (>= NUMPY_MATH_MIN elements) finished
mean(tanh(x)) with NumPy's scalar division, so .data was an np.float32."""
import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F
from tracejit.backends.numba import NUMPY_MATH_MIN

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")

PROGRAMS = {
    "mean_tanh": lambda x: F.mean(F.tanh(x)),
    "sum_exp_scaled": lambda x: F.sum(F.exp(x)) * 0.5,
    "mean_sigmoid_plus": lambda x: F.mean(F.sigmoid(x)) + 1.0,
    "max_log": lambda x: F.max(F.log(x + 1.0)) / 3.0,
}


@pytest.mark.parametrize("name", sorted(PROGRAMS))
@pytest.mark.parametrize("n", [7, NUMPY_MATH_MIN * 4])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_zero_d_result_data_is_an_ndarray(name, n, dtype):
    f = PROGRAMS[name]
    jf = tj.jit(f)
    rng = np.random.RandomState(3)
    for _ in range(4):
        a = rng.rand(n).astype(dtype)
        e, j = f(tj.Variable(a.copy())), jf(tj.Variable(a.copy()))
        assert type(j.data) is type(e.data) is np.ndarray
        assert j.data.dtype == e.data.dtype and j.shape == e.shape == ()
        np.testing.assert_allclose(j.data, e.data, rtol=1e-5)
        x = tj.Variable(a.copy())
        jf(x).backward()
        xe = tj.Variable(a.copy())
        f(xe).backward()
        np.testing.assert_allclose(x.grad.data, xe.grad.data, rtol=1e-5, atol=1e-7)
