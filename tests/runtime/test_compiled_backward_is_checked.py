"""The first call's check runs the compiled backward kernels (the code later calls'
backward runs), not an interpretation of the backward graph: a code generation error
in a backward kernel falls back with a warning naming the cause, in both calling forms
(`z = f(x); z.backward()` after the call, and backward inside the function). Correct
programs keep compiling.
"""
import warnings

import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F
from tracejit import Variable
from tracejit.ops.primitive import Elementwise, primitive

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")


# Test-only primitives: an exact forward whose backward goes through an op whose
# compiled kernel computes 1% more than its NumPy forward (only kernels run `expr`).
@primitive
class PlantedBackwardKernel(Elementwise):
    expr = "{0} * 3.03"

    def forward(self, x):
        return x * x.dtype.type(3)

    def backward(self, gy):
        return gy * 3.0


@primitive
class TripleWithPlantedBackward(Elementwise):
    expr = "{0} * 3.0"

    def forward(self, x):
        return x * x.dtype.type(3)

    def backward(self, gy):
        return PlantedBackwardKernel()(gy)


def _loss(x):
    return F.sum(F.tanh(TripleWithPlantedBackward()(x)))


def _loss_and_grad_inside(x):
    y = _loss(x)
    y.backward()
    return y, x.grad


def _x(i, dtype):
    return (np.random.default_rng(i).standard_normal((4, 5)) * 0.3).astype(dtype)


def _tol(dtype):
    # float32: a rounding of a gradient's cancellation is no difference
    return dict(rtol=1e-5, atol=1e-6) if dtype == np.float32 else dict(rtol=1e-12)


def _calls(form, dtype, n=4):
    """Run the jitted function n times in the calling form; each call's gradient and
    eager's. Returns (jitted, JitWarning messages)."""
    fn = _loss if form == "after" else _loss_and_grad_inside
    jf = tj.jit(fn)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always", tj.JitWarning)
        for i in range(n):
            a = _x(i, dtype)
            x, xe = Variable(a.copy()), Variable(a.copy())
            if form == "after":
                jf(x).backward()
                _loss(xe).backward()
                got, want = x.grad.data, xe.grad.data
            else:
                got, want = jf(x)[1].data, _loss_and_grad_inside(xe)[1].data
            np.testing.assert_allclose(got, want, **_tol(dtype), err_msg=f"call {i}")
    return jf, [str(w.message) for w in seen if issubclass(w.category, tj.JitWarning)]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("form", ["after", "inside"])
def test_a_planted_1pct_backward_kernel_error_falls_back_with_a_warning(form, dtype):
    jf, msgs = _calls(form, dtype)
    assert msgs, "the planted backward kernel error was not caught"
    assert "runs eagerly" in msgs[0] and "differs from eager" in msgs[0], msgs[0]
    assert "froze a value" not in msgs[0], msgs[0]
    info = jf.cache_info()
    assert info["hits"] == 0 and info["fallbacks"] >= 3, info


def _good_loss(x):
    return F.sum(F.tanh(x * 3.0) * F.sigmoid(x))


def _good_inside(x):
    y = _good_loss(x)
    y.backward()
    return y, x.grad


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("form", ["after", "inside"])
def test_a_correct_backward_keeps_compiling(form, dtype):
    fn = _good_loss if form == "after" else _good_inside
    jf = tj.jit(fn)
    for i in range(5):
        a = _x(i, dtype)
        x, xe = Variable(a.copy()), Variable(a.copy())
        if form == "after":
            jf(x).backward()
            fn(xe).backward()
            np.testing.assert_allclose(x.grad.data, xe.grad.data, **_tol(dtype))
        else:
            np.testing.assert_allclose(jf(x)[1].data, fn(xe)[1].data, **_tol(dtype))
    info = jf.cache_info()
    assert info["fallbacks"] == 0 and info["hits"] >= 3, info
