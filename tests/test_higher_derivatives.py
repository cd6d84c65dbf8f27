"""Nested functional transforms give the mathematical higher derivatives: grad of grad
(any depth, any argnums), grad of value_and_grad, the user's backward on a grad's
result, under tj.jit and eagerly, checked against known derivatives and central
differences of the inner gradient (never only jit against eager: both run the same
autodiff, so a wrong derivative in it would agree with itself).
"""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import tracejit as tj
import tracejit.functions as F
from tracejit import Variable
from tracejit.testing import gradcheck
from tracejit.testing.strategies import programs

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")


def _numeric_grad(fn, arrays, k, eps=1e-6):
    """d fn / d arrays[k] by central differences; fn maps arrays to a float."""
    x = arrays[k]
    g = np.zeros_like(x, dtype=np.float64)
    for idx in np.ndindex(x.shape):
        hi = [a.copy() for a in arrays]
        lo = [a.copy() for a in arrays]
        hi[k][idx] += eps
        lo[k][idx] -= eps
        g[idx] = (fn(*hi) - fn(*lo)) / (2 * eps)
    return g


def _close(got, want, what, rtol=1e-4, atol=1e-5):
    got = got.data if isinstance(got, Variable) else np.asarray(got)
    scale = max(1.0, float(np.max(np.abs(want), initial=0.0)))
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol * scale, err_msg=what)


def _as_float(v):
    return float(np.asarray(v.data if isinstance(v, Variable) else v))


# ------------------------------------------------------------------ known derivatives

CUBE = lambda x: x ** 3


@pytest.mark.parametrize("arg", [lambda v: v, lambda v: np.array(v),
                                 lambda v: Variable(np.array(v))],
                         ids=["float", "ndarray", "Variable"])
@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_grad_of_grad_of_cube(arg, jit):
    for depth, want in ((2, lambda v: 6 * v), (3, lambda v: 6.0 + 0 * v)):
        g = CUBE
        for _ in range(depth):
            g = tj.grad(g)
        if jit:
            g = tj.jit(g)
        for v in (2.0, -1.5, 3.0, 0.5):
            x = arg(v)
            _close(g(x), want(v), f"depth {depth} at {v}")
            if isinstance(x, Variable):
                assert x.grad is None, "grad() filled the argument's .grad"
        if jit:
            assert g.cache_info()["fallbacks"] == 0, g.cache_info()


def _sin_x3(x):
    return F.sin(x) * x ** 3


def _sin_x3_dd(v):
    return -v ** 3 * np.sin(v) + 6 * v ** 2 * np.cos(v) + 6 * v * np.sin(v)


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_backward_on_a_grad_result_gives_the_second_derivative(jit):
    g = tj.grad(_sin_x3)
    if jit:
        g = tj.jit(g)
    for v in (0.3, 1.3, -0.7, 2.1):
        x = Variable(np.array(v))
        d = g(x)
        assert x.grad is None
        d.backward()
        _close(x.grad, _sin_x3_dd(v), f"x.grad at {v}")


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_mixed_argnums_and_value_and_grad(jit):
    h = lambda x, y: x ** 2 * y ** 3
    # d/dx (dh/dy) = 6 x y^2; d/dy of value_and_grad's gradient in x: 6 x y^2 too
    gxy = tj.grad(lambda x, y: tj.grad(h, argnums=1)(x, y), argnums=0)
    vgy = tj.grad(lambda x, y: tj.value_and_grad(h, argnums=(0, 1))(x, y)[1][0],
                  argnums=1)
    both = tj.grad(lambda x, y: F.sum(tj.value_and_grad(h)(x, y)[0]
                                      + tj.grad(h, argnums=(0, 1))(x, y)[1]),
                   argnums=(0, 1))
    if jit:
        gxy, vgy, both = tj.jit(gxy), tj.jit(vgy), tj.jit(both)
    for x, y in ((2.0, 3.0), (-1.0, 0.5), (1.5, -2.0), (0.3, 1.1)):
        _close(gxy(x, y), 6 * x * y ** 2, "d2h/dxdy")
        _close(vgy(x, y), 6 * x * y ** 2, "d2h/dydx")
        # d/dx (h + 3x^2y^2) = 2xy^3 + 6xy^2; d/dy = 3x^2y^2 + 6x^2y
        gx, gy = both(x, y)
        _close(gx, 2 * x * y ** 3 + 6 * x * y ** 2, "both x")
        _close(gy, 3 * x ** 2 * y ** 2 + 6 * x ** 2 * y, "both y")


def test_inner_backward_stops_at_the_differentiated_input():
    # The inner pass must not walk the outer graph: a Function before the argument
    # would see its backward called (and a captured Parameter's .grad stays None).
    calls = []

    class Spy(F.Function):
        def forward(self, x):
            return x * 1.0

        def backward(self, gy):
            calls.append(1)
            return gy

    w = tj.Parameter(np.array(1.5))
    z = Spy()(Variable(np.array(2.0)))
    g = tj.grad(lambda x: x ** 3 * w)(z)
    assert calls == [] and w.grad is None
    _close(g, 3 * 4.0 * 1.5, "inner gradient")
    g.backward()                  # the outer pass goes through: d/dz 3 z^2 w = 6 z w
    assert calls == [1]
    _close(w.grad, 3 * 4.0, "w.grad")


def test_under_no_grad_the_result_is_a_constant():
    x = Variable(np.array(2.0))
    with tj.no_grad():
        g = tj.grad(CUBE)(x)
    assert g.creator is None
    _close(g, 12.0, "grad under no_grad")


# ------------------------------------------------------------------ property tests

def _scalar(f):
    return lambda *xs: F.sum(f(*xs))


def _inner_numeric(f, arrays, k, j, v):
    """d/d x_j of sum(grad_k(sum f)(x) * v) by central differences of the inner grad."""
    g = tj.grad(_scalar(f), argnums=k)
    phi = lambda *a: float(np.sum(g(*[Variable(np.asarray(b)) for b in a]).data * v))
    return _numeric_grad(phi, arrays, j)


def _nested(f, k, j, v, value_and=False):
    if value_and:
        inner = lambda *xs: tj.value_and_grad(_scalar(f), argnums=k)(*xs)[1]
    else:
        inner = tj.grad(_scalar(f), argnums=k)
    return tj.grad(lambda *xs: F.sum(inner(*xs) * v), argnums=j)


def _draw_case(data):
    f, xs = data.draw(programs(max_inputs=2, max_steps=5, max_side=3), label="program")
    k = data.draw(st.integers(0, len(xs) - 1), label="inner argnum")
    j = data.draw(st.integers(0, len(xs) - 1), label="outer argnum")
    v = np.random.default_rng(len(xs)).uniform(0.5, 1.5, xs[k].shape)
    return f, xs, k, j, v


@settings(max_examples=20)
@given(st.data(), st.booleans())
def test_grad_of_grad_matches_numerics(data, value_and):
    f, xs, k, j, v = _draw_case(data)
    gg = _nested(f, k, j, v, value_and)
    _close(gg(*[Variable(a.copy()) for a in xs]), _inner_numeric(f, xs, k, j, v),
           f"{f!r}\nd/dx{j} grad_x{k}")


@settings(max_examples=15)
@given(st.data())
def test_backward_on_grad_matches_gradcheck(data):
    f, xs, k, j, v = _draw_case(data)
    inner = tj.grad(_scalar(f), argnums=k)
    gradcheck(lambda *a: inner(*a) * v, *[a.copy() for a in xs], rtol=1e-4, atol=1e-5)


def _new_values(xs, i):
    r = np.random.default_rng(i)
    return [np.asarray(np.clip(a + r.uniform(-0.3, 0.3, a.shape), -2, 2)) for a in xs]


@settings(max_examples=8)
@given(st.data())
def test_jit_of_grad_of_grad_matches_numerics(data):
    f, xs, k, j, v = _draw_case(data)
    jgg = tj.jit(_nested(f, k, j, v))
    for i in range(4):
        a = xs if i == 0 else _new_values(xs, i)
        _close(jgg(*[Variable(b.copy()) for b in a]), _inner_numeric(f, a, k, j, v),
               f"{f!r}\ncall {i}: d/dx{j} grad_x{k}")
    assert jgg.cache_info()["fallbacks"] == 0, jgg.cache_info()


@settings(max_examples=8)
@given(st.data())
def test_grad_of_jit_of_grad_matches_numerics(data):
    f, xs, k, j, v = _draw_case(data)
    jinner = tj.jit(tj.grad(_scalar(f), argnums=k))
    outer = tj.grad(lambda *a: F.sum(jinner(*a) * v), argnums=j)
    for i in range(4):
        a = xs if i == 0 else _new_values(xs, i)
        _close(outer(*[Variable(b.copy()) for b in a]), _inner_numeric(f, a, k, j, v),
               f"{f!r}\ncall {i}: d/dx{j} of jit(grad_x{k})")
    assert jinner.cache_info()["fallbacks"] == 0, jinner.cache_info()
