"""Shared by the files split from test_jit.py: a structure-aware comparison of a jitted call's
results with eager's (Variables, arrays, floats, containers) and small call helpers.
"""
import numpy as np

from tracejit import Variable


N_CALLS = 6          # >= 5: warm-up, trace, then at least 3 replays (more in loops)


def _arr(x):
    if isinstance(x, Variable):
        return x.data
    return np.asarray(x)


def assert_close(a, b, rtol=1e-10, atol=1e-12):
    """Structure-aware comparison of results (Variables, arrays, floats, containers)."""
    if isinstance(b, dict):
        assert isinstance(a, dict) and list(a) == list(b)
        for k in b:
            assert_close(a[k], b[k], rtol, atol)
        return
    if isinstance(b, (tuple, list)):
        assert type(a) is type(b) and len(a) == len(b)
        for x, y in zip(a, b):
            assert_close(x, y, rtol, atol)
        return
    assert type(a) is type(b), (type(a), type(b))
    if isinstance(b, (Variable, np.ndarray)):
        xa, xb = _arr(a), _arr(b)
        assert xa.shape == xb.shape and xa.dtype == xb.dtype, \
            (xa.shape, xa.dtype, xb.shape, xb.dtype)
        np.testing.assert_allclose(xa, xb, rtol=rtol, atol=atol)
    elif isinstance(b, float):
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)
    else:
        assert a == b


def assert_grad_close(a, b, rtol=1e-10, atol=1e-12):
    if b.grad is None:
        assert a.grad is None
        return
    assert a.grad is not None
    assert_close(a.grad, b.grad, rtol, atol)


def no_fallbacks(jf):
    info = jf.cache_info()
    assert info["fallbacks"] == 0, info


def rng(seed=0):
    return np.random.default_rng(seed)
