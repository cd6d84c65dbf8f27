"""tracejit.core_simple, DeZero's simple core, and the book's step 28/29 scripts on it.

The step scripts are the book's, with `dezero` imported as tracejit; their results
are compared with the same iteration written out by hand in floats.
"""
import gc

import numpy as np
import pytest

import tracejit
from tracejit import core_simple as cs


def test_is_simple_core_is_false_and_the_full_core_is_exported():
    assert tracejit.is_simple_core is False
    assert tracejit.Variable is tracejit.core.Variable
    assert tracejit.core_simple.Variable is not tracejit.Variable


def _step28(iters):
    # steps/step28.py with `dezero` -> tracejit (printing left out).
    import tracejit as dezero
    from tracejit import Variable
    if not dezero.is_simple_core:
        from tracejit.core_simple import Variable
        from tracejit.core_simple import setup_variable
        setup_variable()

    def rosenbrock(x0, x1):
        y = 100 * (x1 - x0 ** 2) ** 2 + (x0 - 1) ** 2
        return y

    x0 = Variable(np.array(0.0))
    x1 = Variable(np.array(2.0))
    lr = 0.001
    for i in range(iters):
        y = rosenbrock(x0, x1)
        x0.cleargrad()
        x1.cleargrad()
        y.backward()
        assert type(x0.grad) is np.ndarray and type(x1.grad) is np.ndarray
        x0.data -= lr * x0.grad
        x1.data -= lr * x1.grad
    return x0, x1


def test_step28_rosenbrock_gradient_descent():
    x0, x1 = _step28(1000)
    a, b = 0.0, 2.0
    for _ in range(1000):
        ga = -400 * a * (b - a * a) + 2 * (a - 1)
        gb = 200 * (b - a * a)
        a, b = a - 0.001 * ga, b - 0.001 * gb
    np.testing.assert_allclose([float(x0.data), float(x1.data)], [a, b], rtol=1e-10)
    assert type(x0) is cs.Variable
    assert repr(x0).startswith("variable(0.68")      # the book's printed value


def test_step29_newton():
    import tracejit as dezero
    from tracejit import Variable
    if not dezero.is_simple_core:
        from tracejit.core_simple import Variable
        from tracejit.core_simple import setup_variable
        setup_variable()

    def f(x):
        y = x ** 4 - 2 * x ** 2
        return y

    def gx2(x):
        return 12 * x ** 2 - 4

    x = Variable(np.array(2.0))
    want = 2.0
    for i in range(10):
        y = f(x)
        x.cleargrad()
        y.backward()
        x.data -= x.grad / gx2(x.data)
        want -= (4 * want ** 3 - 4 * want) / (12 * want ** 2 - 4)
        assert float(x.data) == pytest.approx(want, rel=1e-12)
    assert float(x.data) == pytest.approx(1.0, abs=1e-12)


def test_gradients_are_ndarrays_and_accumulate_over_shared_inputs():
    x = cs.Variable(np.array(2.0))
    a = x ** 2
    y = a ** 2 + a ** 2          # generations: a's creator runs once, after both uses
    y.backward()
    assert float(y.data) == 32.0
    assert type(x.grad) is np.ndarray and float(x.grad) == 64.0
    assert a.grad is None        # intermediate gradients are dropped ...
    x.cleargrad()
    y = (x + x) * x
    y.backward(retain_grad=True)
    assert float(x.grad) == 8.0  # d(2x^2)/dx
    assert y.grad is not None and float(y.grad) == 1.0   # ... unless retained


@pytest.mark.parametrize("op, gx0, gx1", [
    (lambda a, b: a + b, 1.0, 1.0),
    (lambda a, b: a - b, 1.0, -1.0),
    (lambda a, b: a * b, 5.0, 3.0),
    (lambda a, b: a / b, 1 / 5.0, -3.0 / 25.0),
])
def test_binary_operators_and_their_gradients(op, gx0, gx1):
    a, b = cs.Variable(np.array(3.0)), cs.Variable(np.array(5.0))
    y = op(a, b)
    assert float(y.data) == op(3.0, 5.0)
    y.backward()
    assert float(a.grad) == pytest.approx(gx0) and float(b.grad) == pytest.approx(gx1)


def test_operators_with_scalars_and_arrays_on_either_side():
    x = cs.Variable(np.array([1.0, 2.0]))
    for y, want in [(x + 1, [2, 3]), (1 + x, [2, 3]), (x - 1, [0, 1]), (3 - x, [2, 1]),
                    (x * 2, [2, 4]), (2 * x, [2, 4]), (x / 2, [0.5, 1]), (2 / x, [2, 1]),
                    (-x, [-1, -2]), (x ** 3, [1, 8]), (np.array([1.0, 1.0]) + x, [2, 3])]:
        assert isinstance(y, cs.Variable)
        np.testing.assert_allclose(y.data, want)
    y = 2 / x
    y.backward()
    np.testing.assert_allclose(x.grad, [-2.0, -0.5])


def test_no_grad_and_using_config():
    x = cs.Variable(np.ones(3))
    with cs.no_grad():
        y = x * 2
    assert y.creator is None
    assert cs.Config.enable_backprop is True
    with cs.using_config("enable_backprop", False):
        assert cs.Config.enable_backprop is False
    # The simple core's switch is its own: the full core's stays on.
    with cs.no_grad():
        assert tracejit.Config.enable_backprop is True


def test_outputs_are_held_weakly_and_bad_data_is_rejected():
    x = cs.Variable(np.ones(2))
    y = x * 2
    f = y.creator
    del y
    gc.collect()
    assert f.outputs[0]() is None
    with pytest.raises(TypeError, match="ndarray"):
        cs.Variable(1.0)
    assert cs.as_variable(x) is x
    assert isinstance(cs.as_array(1.0), np.ndarray)
    v = cs.Variable(np.zeros((2, 3)), name="v")
    assert (v.shape, v.ndim, v.size, v.dtype, len(v)) == ((2, 3), 2, 6, np.float64, 2)
    assert repr(cs.Variable(None)) == "variable(None)"


def test_simple_core_leaves_the_full_core_alone():
    cs.setup_variable()
    v = tracejit.Variable(np.array(2.0))
    y = v * v + 1
    assert type(y) is tracejit.Variable
    y.backward()
    assert isinstance(v.grad, tracejit.Variable) and float(v.grad.data) == 4.0
