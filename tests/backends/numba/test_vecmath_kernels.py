"""Generated kernels calling tracejit.backends.numba.vecmath: jit against eager for fused
transcendental chains (values and gradients, reductions, prange and serial sizes),
NaN/inf inputs, and the libm rerun when a sin/cos argument is beyond the range the
vector path reduces (it must never return the NaN flag as a value)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tracejit as tj
import tracejit.functions as F

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")


def chain(x, y):
    return F.sum(F.tanh(F.sin(F.exp(x * 0.1)) * y) + F.cos(x) * F.sigmoid(y)
                 + F.log(F.exp(-x * x) + 1.0))


def trig_max(x, y):
    return F.max(F.sin(x) * y + F.cos(y), axis=0)


_VG = tj.value_and_grad(chain, argnums=(0, 1))
_JVG = tj.jit(_VG)
_JMAX = tj.jit(trig_max)


def _close(a, b, rtol):
    a, b = np.asarray(a), np.asarray(b)
    assert a.shape == b.shape and a.dtype == b.dtype
    np.testing.assert_allclose(a, b, rtol=rtol, atol=rtol)


def _compare_vg(x, y, rtol=1e-12):
    got, want = _JVG(x, y), _VG(x, y)
    _close(got[0].data, want[0].data, rtol)
    for g, w in zip(got[1], want[1]):
        _close(g.data, w.data, rtol)


@settings(deadline=None, max_examples=12)
@given(n=st.sampled_from([7, 300, 20000]), seed=st.integers(0, 2 ** 16))
def test_fused_transcendental_chain_matches_eager(n, seed):
    rng = np.random.default_rng(seed)
    for _ in range(3):
        _compare_vg(rng.uniform(-3, 3, n), rng.uniform(-3, 3, n))
    assert _JVG.cache_info()["fallbacks"] == 0


def test_the_kernel_calls_vecmath_not_libm():
    x = np.linspace(-1, 1, 20000)
    for _ in range(3):
        _compare_vg(x, x[::-1].copy())
    g = _JVG.trace(x, x)
    assert "vm.exp64(" in g.source and "vm.sin64_fast(" in g.source
    assert g.summary()["numpy_calls"] == 0 and g.summary()["blocked_groups"] == 0


@pytest.mark.parametrize("n", [50, 20000])
def test_sin_cos_beyond_the_vector_range_rerun_with_libm(n):
    rng = np.random.default_rng(1)
    for k in range(5):
        x = rng.uniform(-3, 3, (n, 3))
        y = rng.uniform(-3, 3, (n, 3))
        if k >= 2:
            x[n // 2, 1] = 3.0e7 * (k - 1)      # finite, far beyond vm.TRIG_MAX
            y[n // 3, 2] = -1.0e300
        got, want = _JMAX(x, y), trig_max(x, y)
        assert not np.isnan(got.data).any()
        _close(got.data, want.data, 1e-12)
    assert _JMAX.cache_info()["fallbacks"] == 0


def test_nan_and_inf_propagate_as_in_eager():
    x = np.array([0.5, np.nan, np.inf, -np.inf, 710.0, -1000.0, 0.0, -0.0] * 40)
    y = np.array([1.0, 2.0, -np.inf, np.nan, 0.5, 3.0, -0.0, 1e308] * 40)
    f = tj.jit(lambda a, b: F.exp(a) * F.tanh(b) + F.cos(a) - F.log(F.exp(b)))
    eager = lambda a, b: F.exp(a) * F.tanh(b) + F.cos(a) - F.log(F.exp(b))  # noqa: E731
    with np.errstate(all="ignore"):
        for k in range(4):
            got, want = f(x + k, y), eager(x + k, y)
            np.testing.assert_array_equal(np.isnan(got.data), np.isnan(want.data))
            np.testing.assert_allclose(got.data, want.data, rtol=1e-13)
    assert f.cache_info()["fallbacks"] == 0


def test_float32_chains_stay_float32():
    f = tj.jit(lambda a: F.sum(F.tanh(F.exp(a) * 0.5) + F.sin(a)))
    rng = np.random.default_rng(2)
    for n in (40, 40, 40, 5000):
        x = rng.uniform(-2, 2, n).astype(np.float32)
        got, want = f(x), F.sum(F.tanh(F.exp(x) * 0.5) + F.sin(x))
        assert got.data.dtype == np.float32
        np.testing.assert_allclose(got.data, want.data, rtol=1e-5)
    assert f.cache_info()["fallbacks"] == 0
