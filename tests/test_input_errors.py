"""Bad input gets a TypeError/ValueError in the user's terms (naming the op, argument,
shape or dtype), eager and under jit alike; never a numba traceback, an AttributeError
from inside an op, or a result of the wrong shape.
"""
import re

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import tracejit as tj
import tracejit.functions as F
import tracejit.testing.strategies as S

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")


def _both(fn, *args):
    """fn eagerly and under jit (the same error expected from each)."""
    return [lambda: fn(*args), lambda: tj.jit(fn)(*args)]


def _sums_to(x_shape, shape):
    """NumPy's rule: shape broadcasts to x_shape exactly."""
    try:
        return np.broadcast_shapes(shape, x_shape) == tuple(x_shape)
    except ValueError:
        return False


@given(S.shapes(min_dims=0, max_dims=3, max_side=3), S.shapes(min_dims=0, max_dims=4,
                                                              max_side=3))
def test_sum_to_gives_the_shape_or_raises_naming_both(x_shape, shape):
    x = tj.Variable(np.ones(x_shape))
    if _sums_to(x_shape, shape):
        y = F.sum_to(x, shape)
        assert y.shape == tuple(shape)
        # as NumPy: the sum over the broadcast axes
        ref = np.ones(x_shape).sum(axis=tuple(range(len(x_shape) - len(shape))))
        ref = ref.sum(axis=tuple(k for k, d in enumerate(shape) if d == 1), keepdims=True) \
            if ref.ndim else ref
        np.testing.assert_array_equal(y.data, np.asarray(ref).reshape(shape))
    else:
        with pytest.raises(ValueError, match=r"sum_to: cannot sum shape .* to "):
            F.sum_to(x, shape)


@pytest.mark.parametrize("shape", [(4,), (3, 2), (2, 1, 3), (2,)])
def test_sum_to_bad_shape_eager_and_jit(shape):
    for call in _both(lambda v: F.sum_to(v, shape), tj.Variable(np.ones((2, 3)))):
        with pytest.raises(ValueError, match=rf"cannot sum shape \(2, 3\) to "
                                             rf"{re.escape(str(shape))}"):
            call()


@pytest.mark.parametrize("fn,match", [
    (lambda v: F.broadcast_to(v, (4,)), r"broadcast_to: cannot broadcast shape \(2, 3\)"),
    (lambda v: F.reshape(v, (4,)), r"reshape: cannot reshape array of shape \(2, 3\)"),
    (lambda v: F.sum(v, axis=2), r"sum: axis 2 is out of bounds .* dimension 2"),
    (lambda v: F.max(v, axis=-3), r"max: axis -3 is out of bounds"),
    (lambda v: F.sum(v, axis=(0, 0)), r"sum: duplicate value in axis"),
    (lambda v: v + tj.Variable(np.ones(4)), r"add: operands cannot be broadcast together: "
                                            r"x0 has shape \(2, 3\) and x1 has shape \(4,\)"),
    (lambda v: v * np.ones((3, 2)), r"mul: operands cannot be broadcast"),
])
def test_shape_errors_name_the_shapes(fn, match):
    for call in _both(fn, tj.Variable(np.ones((2, 3)))):
        with pytest.raises(ValueError, match=match):
            call()


@pytest.mark.parametrize("axis", [1.5, "a", [0.0], (1, "b"), True])
@pytest.mark.parametrize("reduce", [F.sum, F.max, F.min, F.mean])
def test_non_integer_axis_is_a_type_error(reduce, axis):
    for call in _both(lambda v: reduce(v, axis=axis), tj.Variable(np.ones((2, 3)))):
        with pytest.raises(TypeError, match=r"axis must be None, an int or a tuple of ints"):
            call()


@pytest.mark.parametrize("data", [np.array(["a", "b"]), np.array([b"x"]),
                                  np.array([1.0], dtype=object),
                                  np.zeros(2, dtype=[("a", "f8")])])
def test_string_object_and_record_dtypes_are_refused(data):
    with pytest.raises(TypeError, match=rf"dtype {re.escape(str(data.dtype))}; tracejit "
                                        r"supports numeric and bool arrays only"):
        tj.Variable(data)
    for call in _both(lambda v: F.exp(v) * 2.0, data) + _both(F.sum, data):
        with pytest.raises(TypeError, match=r"supports numeric and bool arrays only"):
            call()


def test_variable_without_data_in_an_op_names_the_op_and_argument():
    empty = tj.Variable(None, name="w")
    x = tj.Variable(np.ones(3))
    with pytest.raises(TypeError, match=r"add: input x1 is a Variable 'w' whose data is None"):
        x + empty
    with pytest.raises(TypeError, match=r"exp: input x0 is a Variable 'w' whose data is None"):
        F.exp(empty)
    with pytest.raises(TypeError, match=r"jit\(<lambda>\): argument 'v' is a Variable whose data is None"):
        tj.jit(lambda v: F.exp(v) + 1.0)(empty)


def test_captured_variable_without_data_is_named_on_every_call():
    W = tj.Variable(None, name="W")
    jf = tj.jit(lambda x: F.sum(x * W))
    for call in range(3):           # the eager first call, the trace, and after
        with pytest.raises(TypeError, match=r"mul: input x1 is a Variable 'W' whose data"):
            jf(tj.Variable(np.ones(3)))


def test_string_data_assigned_later_names_the_op_and_dtypes():
    P = tj.Parameter(np.ones(3))
    P.data = np.array(["a", "b", "c"])
    for call in _both(lambda x: F.sum(x * P), tj.Variable(np.ones(3))):
        with pytest.raises(TypeError, match=r"mul\(x0: f64\[3\], x1: str32\[3\]\): ufunc"):
            call()


def test_valid_calls_still_compile():
    # The checks reject only bad input: integer axes of every kind still run compiled.
    def f(x):
        return F.sum(x, axis=np.int64(0)) + F.sum(F.sum_to(x, (1, 3)), axis=[0])
    jf = tj.jit(f)
    rng = np.random.default_rng(0)
    for call in range(4):
        xv = rng.standard_normal((2, 3))
        a, b = tj.Variable(xv.copy()), tj.Variable(xv.copy())
        ya, yb = f(a), jf(b)
        np.testing.assert_allclose(yb.data, ya.data, rtol=1e-12)
        ya.backward(), yb.backward()
        np.testing.assert_allclose(b.grad.data, a.grad.data, rtol=1e-12)

