"""tracejit.autodiff: grad, value_and_grad and eval_shape, eager and under jit.
"""
import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F
from tracejit import Variable
from tracejit.models import MLP
from tracejit.testing import assert_jit_matches_eager

from tracejit.testing.checks import assert_call_matches_eager

N_CALLS = 6          # >= 5: warm-up, trace, then at least 3 replays

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")


def goldstein(x, y):
    return (1 + (x + y + 1) ** 2 * (19 - 14 * x + 3 * x ** 2 - 14 * y + 6 * x * y
                                     + 3 * y ** 2)) * \
        (30 + (2 * x - 3 * y) ** 2 * (18 - 32 * x + 12 * x ** 2 + 48 * y - 36 * x * y
                                      + 27 * y ** 2))


def rosenbrock(x0, x1):
    return 100 * (x1 - x0 ** 2) ** 2 + (x0 - 1) ** 2


@pytest.mark.parametrize("fn", [goldstein, rosenbrock])
def test_jit_value_and_grad_zero_d(fn):
    vg = tj.value_and_grad(fn, argnums=(0, 1))
    jvg = tj.jit(vg)
    r = np.random.default_rng(19)
    for i in range(N_CALLS):
        a, b = np.array(r.uniform(-1.5, 1.5)), np.array(r.uniform(-1.5, 1.5))
        assert_call_matches_eager(jvg, vg, a, b, backward=False, rtol=1e-10, atol=1e-12)
        # Variables too, against eager's results for the arrays: the user's Variables
        # keep no .grad
        x0, x1 = Variable(a.copy()), Variable(b.copy())
        assert_call_matches_eager(jvg, vg, x0, x1, eager_args=(a, b), backward=False,
                                  rtol=1e-10, atol=1e-12)
        assert x0.grad is None and x1.grad is None
    assert jvg.cache_info()["fallbacks"] == 0, jvg.cache_info()


def test_jit_grad_of_grad():
    f = lambda x: F.sum(F.sin(x) * x)
    g2 = tj.grad(lambda x: F.sum(tj.grad(f)(x)))
    jg2 = tj.jit(g2)
    r = np.random.default_rng(20)
    for i in range(N_CALLS):
        xa = r.standard_normal(3)
        assert_call_matches_eager(jg2, g2, xa, backward=False, rtol=1e-10, atol=1e-12)
        # and the right answer (jit and eager share the autodiff): -x sin x + 2 cos x
        want = -xa * np.sin(xa) + 2 * np.cos(xa)
        np.testing.assert_allclose(jg2(xa).data, want, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(g2(xa).data, want, rtol=1e-10, atol=1e-12)
    assert jg2.cache_info()["fallbacks"] == 0, jg2.cache_info()


def test_eval_shape_mlp_like_no_softmax():
    W1 = Variable(np.zeros((784, 100), np.float32))
    b1 = Variable(np.zeros(100, np.float32))
    W2 = Variable(np.zeros((100, 10), np.float32))

    def f(x, t):
        h = F.sigmoid(F.linear(x, W1, b1))
        y = F.matmul(F.relu(h), W2) * 2.0
        return y, F.mean_squared_error(y, t)

    y, loss = tj.eval_shape(f, tj.ShapeDtype((32, 784), np.float32),
                            tj.ShapeDtype((32, 10), np.float32))
    assert y == tj.ShapeDtype((32, 10), np.float32)
    assert tuple(loss.shape) == () and np.dtype(loss.dtype) == np.float32


def test_eval_shape_mlp_model():
    m = MLP((100, 10))
    m(np.zeros((1, 784), np.float32))            # lazy init (an eager call)
    out = tj.eval_shape(lambda x: m(x), tj.ShapeDtype((32, 784), np.float32))
    assert out == tj.ShapeDtype((32, 10), np.float32)


def test_eval_shape_mlp_like():
    W1 = Variable(np.zeros((784, 100), np.float32))
    b1 = Variable(np.zeros(100, np.float32))
    W2 = Variable(np.zeros((100, 10), np.float32))

    def f(x):
        h = F.relu(F.matmul(x, W1) + b1)
        return F.softmax(F.matmul(h, W2))

    out = tj.eval_shape(f, tj.ShapeDtype((32, 784), np.float32))
    assert out == tj.ShapeDtype((32, 10), np.float32)
    assert tuple(out.shape) == (32, 10) and np.dtype(out.dtype) == np.float32


def test_eval_shape_mismatch_names_shapes_and_line():
    W = Variable(np.zeros((100, 10)))

    def f(x):
        return F.matmul(x, W)  # EVAL-SHAPE-LINE

    with pytest.raises(ValueError) as e:
        tj.eval_shape(f, tj.ShapeDtype((32, 784)))
    msg = str(e.value)
    assert "784" in msg and "100" in msg
    assert "EVAL-SHAPE-LINE" in msg


# ---------------------------------------------------------------- grad and value_and_grad

def test_grad_with_argnums_gives_each_gradient_and_zeros_for_an_unused_argument():
    def f(x, y):
        return F.sum(x * x * 3.0)

    g = tj.grad(f, argnums=(0, 1))
    x, y = Variable(np.arange(3.0)), np.ones(2, np.float32)
    gx, gy = g(x, y)
    np.testing.assert_allclose(gx.data, 6.0 * np.arange(3.0))
    assert gy.dtype == np.float32 and not gy.data.any()      # zeros, not None
    assert x.grad is None                   # a fresh leaf: the caller's Variable untouched
    assert_jit_matches_eager(g, make_args=lambda i: [Variable(np.arange(3.0) + i), y],
                             calls=3)


def test_value_and_grad_gives_the_value_and_the_gradient_of_a_python_float():
    vg = tj.value_and_grad(lambda s, x: F.sum(F.tanh(x * s)))
    x = Variable(np.linspace(-1.0, 1.0, 4))
    v, g = vg(0.5, x)
    xe = Variable(np.asarray(0.5))
    ye = F.sum(F.tanh(x * xe))
    ye.backward()
    np.testing.assert_allclose(v.data, ye.data)
    np.testing.assert_allclose(g.data, xe.grad.data)
    assert g.dtype == np.float64 and g.shape == ()


@pytest.mark.parametrize("bad, error, match", [
    (lambda x: x * 2.0, ValueError, "scalar"),
    (lambda x: float(F.sum(x).data), TypeError, "must return a Variable"),
], ids=["not-a-scalar", "not-a-variable"])
def test_grad_of_a_function_that_does_not_return_a_scalar_variable(bad, error, match):
    with pytest.raises(error, match=match):
        tj.grad(bad)(Variable(np.ones(3)))


def test_grad_argnums_beyond_the_arguments_is_a_type_error():
    with pytest.raises(TypeError, match="argnums 1"):
        tj.grad(lambda x: F.sum(x), argnums=1)(Variable(np.ones(3)))


def test_eval_shape_keeps_the_result_structure_and_computes_nothing():
    calls = []

    def f(x):
        calls.append(x.shape)
        return {"y": F.tanh(x), "s": (F.sum(x), x[0])}

    out = tj.eval_shape(f, tj.ShapeDtype((4, 3), np.float32))
    assert out == {"y": tj.ShapeDtype((4, 3), np.float32),
                   "s": (tj.ShapeDtype((), np.float32), tj.ShapeDtype((3,), np.float32))}
    assert calls == [(4, 3)]
