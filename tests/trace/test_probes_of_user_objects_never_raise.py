"""The attribute looks tracejit itself takes at the objects a jitted function reaches
(__dict__, __name__, __module__, __self__, __code__, __wrapped__, ...) never raise what a
user __getattr__ raises for names it does not know (KeyError, RuntimeError: not only
AttributeError): eager never makes those looks, so the function compiles and gives
eager's results, whether the object is captured, a module global, an argument, the
callable object jitted itself, or the value of one of its attributes."""
import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")


def _strict(error):
    class Strict:
        def __init__(self, **kw):
            object.__setattr__(self, "d", dict(kw))

        def __getattr__(self, k):
            d = object.__getattribute__(self, "d")
            if k in d:
                return d[k]
            raise error(k)
    return Strict


ERRORS = [KeyError, RuntimeError, ValueError, TypeError]
G = None      # a module global of a strict class (set by the test)


def _compare(jf, f, make_args, between, n=6):
    for call in range(n):
        between(call)
        a0, a1 = make_args(call), make_args(call)
        np.testing.assert_allclose(jf(*a1).data, f(*a0).data, rtol=1e-12)
    info = jf.cache_info()
    assert info["hits"] >= 2
    assert info["calls"] == info["hits"] + info["misses"] + info["fallbacks"] == n


def _x(call):
    return tj.Variable(np.random.default_rng(call).standard_normal(3))


@pytest.mark.parametrize("error", ERRORS)
def test_a_captured_strict_object(error):
    g = _strict(error)(s=1.0)

    def f(x):
        return F.sum(x * g.s)
    _compare(tj.jit(f), f, lambda c: (_x(c),), lambda c: g.d.__setitem__("s", 1.0 + c // 3))


@pytest.mark.parametrize("error", ERRORS)
def test_a_module_global_strict_object(error):
    global G
    G = _strict(error)(w=np.ones(3))

    def f(x):
        return F.sum(x * G.w)
    _compare(tj.jit(f), f, lambda c: (_x(c),), lambda c: None)


@pytest.mark.parametrize("error", ERRORS)
def test_a_strict_argument_object(error):
    g = _strict(error)(s=2.0, w=np.ones(3))

    def f(o, x):
        return F.sum(x * o.w * o.s)
    _compare(tj.jit(f), f, lambda c: (g, _x(c)), lambda c: None)


@pytest.mark.parametrize("error", ERRORS)
def test_a_strict_callable_object_jitted(error):
    base = _strict(error)

    class Model(base):
        def __call__(self, x):
            return F.sum(x * self.w)
    m = Model(w=np.full(3, 2.0))
    _compare(tj.jit(m), m, lambda c: (_x(c),), lambda c: None)


@pytest.mark.parametrize("error", ERRORS)
def test_a_strict_object_held_by_a_captured_one(error):
    class Holder:
        pass
    h = Holder()
    h.inner = _strict(error)(w=np.ones(3), lr=0.5)

    def f(x):
        return F.sum(x * h.inner.w) * h.inner.lr
    _compare(tj.jit(f), f, lambda c: (_x(c),), lambda c: None)


def test_trace_and_eval_shape_with_a_strict_object():
    g = _strict(KeyError)(w=np.ones(3))

    def f(x):
        return F.sum(x * g.w)
    jf = tj.jit(f)
    assert jf.trace(_x(0)) is not None
    assert tj.eval_shape(f, _x(0)).shape == ()
