"""cache_info() adds up (calls == hits + misses + fallbacks) after every call, on every
path a call can take: a function that runs eagerly for good after a failed trace, a
trace that fails before the function runs (nothing of the trace left behind), a call
the signature refuses, state threaded once the caller replaces a Variable, a call
whose function raises, a signature past max_variants."""
import warnings

import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F
from tracejit import core
from tracejit.trace import record


def _adds_up(jf, calls):
    info = jf.cache_info()
    assert info["calls"] == calls, info
    assert info["calls"] == info["hits"] + info["misses"] + info["fallbacks"], info


def _calls(f, n, make, between=lambda k: None):
    """n calls of f and jit(f), compared; cache_info checked after each."""
    jf = tj.jit(f)
    for k in range(n):
        between(k)
        a = make(k)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", tj.JitWarning)
            got = jf(tj.Variable(a))
        want = f(tj.Variable(a.copy()))
        np.testing.assert_allclose(got.data, want.data, rtol=1e-12)
        _adds_up(jf, k + 1)
    return jf


def test_a_function_whose_trace_fails_for_good():
    def f(x):
        if core._state.trace is not None:      # true only while tracing
            raise ValueError("not while tracing")
        return F.sum(x * 2.0)
    jf = _calls(f, 6, lambda k: np.full(3, float(k)))
    assert jf.cache_info()["eager_signatures"] == 1
    assert jf.cache_info()["fallbacks"] >= 4


def test_prop_py_a_property_and_a_getattr_raising_keyerror():
    # /work/helpers/prop.py: 4 calls were counted as 2 (the failed trace stayed active,
    # so later calls looked nested in it and were not counted).
    class Cfg:
        def __init__(self):
            self._lr = 0.5

        @property
        def lr(self):
            return self._lr

    class G:
        def __init__(self):
            self.d = {"s": 1.0}

        def __getattr__(self, k):
            return self.d[k]
    cfg, g = Cfg(), G()

    def between(k):
        cfg._lr = 0.5 + k
        g.d["s"] = 10.0 * k
    _calls(lambda x: F.sum(x * cfg.lr) + g.s, 6, lambda k: np.random.randn(3), between)
    assert core._state.trace is None


def test_a_failure_before_the_function_runs_leaves_no_trace_behind(monkeypatch):
    w = np.ones(3)

    def boom(*a, **k):
        raise RuntimeError("analysis failed")
    monkeypatch.setattr(record, "swap_scalar_code", boom)
    f = lambda x: F.sum(x * w)          # noqa: E731
    jf = _calls(f, 5, lambda k: np.full(3, float(k)))
    assert core._state.trace is None
    assert type(w) is np.ndarray and type(f.__closure__[0].cell_contents) is np.ndarray
    assert jf.cache_info()["eager_signatures"] == 1


def test_a_call_the_signature_refuses_is_no_call():
    jf = tj.jit(lambda x, s: F.sum(x * 2.0), static_argnums=(1,))
    jf(tj.Variable(np.ones(3)), 1)
    with pytest.raises(TypeError):
        jf(tj.Variable(np.ones(3)), [1])           # an unhashable static value
    _adds_up(jf, 1)


def test_a_variable_the_caller_replaces_every_call():
    class S:
        pass
    s = S()

    def between(k):
        s.h = tj.Variable(np.full(3, 0.1 * k))
    jf = _calls(lambda x: F.sum(x * s.h), 8, lambda k: np.full(3, 1.0 + k), between)
    assert jf.cache_info()["hits"] >= 3


def test_calls_that_raise():
    def f(x):
        if float(x.data.sum()) > 10:
            raise ValueError("too big")
        return F.sum(x * 3.0)
    jf = tj.jit(f)
    n = 0
    for k in range(8):
        a = np.full(3, 5.0 if k % 3 == 2 else 1.0)
        n += 1
        if k % 3 == 2:
            with pytest.raises(ValueError):
                jf(tj.Variable(a))
        else:
            np.testing.assert_allclose(jf(tj.Variable(a)).data, f(tj.Variable(a)).data)
        _adds_up(jf, n)


def test_past_max_variants():
    def f(x):
        n = int(x.data[0])
        y = x
        for _ in range(n):
            y = y * 1.5
        return F.sum(y)
    jf = _calls(tj.jit(f, max_variants=2).fn, 1, lambda k: np.ones(3))
    jf = tj.jit(f, max_variants=2)
    for k in range(9):
        a = np.full(3, float(k % 5))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", tj.JitWarning)
            np.testing.assert_allclose(jf(tj.Variable(a)).data, f(tj.Variable(a)).data)
        _adds_up(jf, k + 1)
