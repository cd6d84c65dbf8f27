"""A kernel casts a value only where numba would type it otherwise than the IR does.

Each cast in a kernel's source is a call numba types (compile time: W7's 10 kernels had
47 float64 casts). float64 arithmetic with a float32 operand (a float32 weight times a
float64 activation) is typed float64 by numba, computed in float64 as NumPy does, so it
needs none; a float64 value added to a float64 accumulator needs none; a cast is not
cast twice. Where numba would type otherwise (float32 results) the cast stays. Each
case: the jitted function against eager over calls with new values.
"""
import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F
from tracejit.testing import assert_jit_matches_eager

pytestmark = pytest.mark.usefixtures("kernel_cache_dir", "jit_warnings_are_errors")


def _kernels(jf, *args):
    return jf.trace(*args).source.split("\n# kernel\n")[1:]


def _same_as_eager(f, make_args, calls=4):
    info = assert_jit_matches_eager(f, make_args=make_args, calls=calls, backward=False)
    assert info["fallbacks"] == 0
    jf = tj.jit(f)
    for k in range(calls):
        args = make_args(k)
        got, want = jf(*args), f(*args)
        for a, b in zip(got, want):
            assert a.data.dtype == b.data.dtype
            rtol = 1e-12 if a.data.dtype == np.float64 else 1e-6
            np.testing.assert_allclose(a.data, b.data, rtol=rtol, atol=rtol)
    return jf


def test_float64_arithmetic_with_float32_operands_and_sums_have_no_casts():
    rng = np.random.default_rng(0)

    def f(x, w, b):
        y = F.tanh(x * w + b) * 0.5 + x           # float64 x, float32 w (1, 4) and b (4,)
        return y, F.sum(y * w, axis=0)

    def make_args(k):
        return (rng.standard_normal((5, 4)), rng.standard_normal((1, 4)).astype(np.float32),
                rng.standard_normal(4).astype(np.float32))
    jf = _same_as_eager(f, make_args)
    kernels = _kernels(jf, *make_args(9))
    assert kernels and not any("np.float64(" in k for k in kernels), kernels


def test_float32_results_keep_their_casts_and_a_cast_is_not_cast_twice():
    rng = np.random.default_rng(1)

    def f(x, w):
        # float32 arithmetic (numba would type x * 0.5 as float64), and a float64 value
        # cast to float32 inside the kernel
        return F.exp(w * 0.5 + 1.0), F.cast(x * 2.0, np.float32) * w

    def make_args(k):
        return rng.standard_normal((3, 4)), rng.standard_normal((3, 4)).astype(np.float32)
    jf = _same_as_eager(f, make_args)
    kernels = _kernels(jf, *make_args(9))
    assert any("np.float32(" in k for k in kernels), kernels
    assert not any("np.float32(np.float32(" in k for k in kernels), kernels
