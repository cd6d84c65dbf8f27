"""DeZero semantics of the eager core: Variable, Function, Config, backward."""
import gc
import sys
import weakref

import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F
from tracejit import Function, Variable


class Square(Function):
    def forward(self, x):
        return x ** 2

    def backward(self, gy):
        x, = self.inputs
        return 2 * x * gy


# ---------------------------------------------------------------- construction

def test_variable_rejects_non_ndarray():
    for bad in [1.0, 3, [1.0, 2.0], (1,), "x"]:
        with pytest.raises(TypeError, match="numpy.ndarray"):
            Variable(bad)
    assert Variable(None).data is None


def test_variable_rejects_object_dtype():
    with pytest.raises(TypeError, match="object"):
        Variable(np.array([1, "a"], dtype=object))


def test_as_array_and_as_variable():
    a = tj.as_array(2.0)
    assert isinstance(a, np.ndarray) and a.shape == ()
    v = Variable(np.ones(2))
    assert tj.as_variable(v) is v
    assert isinstance(tj.as_variable(np.ones(2)), Variable)
    assert isinstance(tj.Parameter(np.ones(2)), Variable)


# ---------------------------------------------------------------- 0-d and dispatch

def test_zero_dim_results_stay_ndarrays():
    x = Variable(np.array(2.0))
    results = [x * x, x + 1, 1 - x, x / 2, x ** 3, -x, F.sin(x), F.sum(Variable(np.ones(3))),
               F.max(Variable(np.arange(3.0))), F.exp(x), F.matmul(np.ones(3), np.ones(3))]
    for y in results:
        assert isinstance(y.data, np.ndarray), type(y.data)
        assert y.shape == ()
    y = x * F.sin(x)
    y.backward()
    assert isinstance(x.grad.data, np.ndarray) and x.grad.shape == ()


OPS = {"+": np.add, "-": np.subtract, "*": np.multiply, "/": np.divide, "**": np.power}


@pytest.mark.parametrize("op", sorted(OPS))
def test_ndarray_op_variable_dispatches_to_variable(op):
    a = np.array([1.5, 2.0, 3.0])
    v = Variable(np.array([0.5, 1.0, 2.0]))
    left = eval(f"a {op} v")
    right = eval(f"v {op} a")
    assert isinstance(left, Variable) and isinstance(right, Variable)
    np.testing.assert_allclose(left.data, OPS[op](a, v.data))
    np.testing.assert_allclose(right.data, OPS[op](v.data, a))
    left.backward()
    assert v.grad is not None and v.grad.shape == v.shape


@pytest.mark.parametrize("op", sorted(OPS))
def test_python_scalar_op_variable(op):
    v = Variable(np.array([0.5, 1.0, 2.0]))
    np.testing.assert_allclose(eval(f"2.0 {op} v").data, OPS[op](2.0, v.data))
    np.testing.assert_allclose(eval(f"v {op} 2.0").data, OPS[op](v.data, 2.0))


def test_dtype_rules_for_scalars():
    x32 = Variable(np.ones(3, np.float32))
    assert (x32 * 2.0).dtype == np.float32
    assert (2.0 * x32).dtype == np.float32
    assert (x32 + 1).dtype == np.float32
    xi = Variable(np.arange(3))
    assert (xi * 2.0).dtype == np.float64          # as in NumPy: int array * float
    assert (xi * 2).dtype == xi.dtype
    assert (xi * 2.0).dtype == (xi.data * 2.0).dtype


# ---------------------------------------------------------------- Config

def test_no_grad_builds_no_graph():
    x = Variable(np.array(3.0))
    with tj.no_grad():
        y = F.sin(x) * x + 1
        assert tj.Config.enable_backprop is False
    assert y.creator is None
    assert tj.Config.enable_backprop is True
    z = F.sin(x)
    assert z.creator is not None


def test_config_restored_after_exception():
    with pytest.raises(RuntimeError):
        with tj.test_mode():
            assert tj.Config.train is False
            raise RuntimeError
    assert tj.Config.train is True


# ---------------------------------------------------------------- backward

def test_diamond_graph_generations():
    x = Variable(np.array(2.0))
    a = x ** 2
    y = a ** 2 + a ** 2          # 2 x^4
    y.backward()
    assert float(y.data) == 32.0
    assert float(x.grad.data) == 64.0   # 8 x^3, only right if a's grad is complete first


def test_diamond_with_user_function():
    x = Variable(np.array(3.0))
    a = Square()(x)
    y = Square()(a) + Square()(a)       # 2 x^4
    y.backward()
    assert float(x.grad.data) == 8 * 27.0


def test_backward_frees_intermediate_grads_unless_retained():
    x = Variable(np.array(1.0))
    a = x * 2
    y = a * 3
    y.backward()
    assert a.grad is None and y.grad is None
    assert float(x.grad.data) == 6.0
    x.cleargrad()
    assert x.grad is None
    a = x * 2
    y = a * 3
    y.backward(retain_grad=True)
    assert float(a.grad.data) == 3.0 and float(y.grad.data) == 1.0
    assert float(x.grad.data) == 6.0


def test_gradients_accumulate_until_cleargrad():
    x = Variable(np.array(2.0))
    (x * x).backward()
    (x * x).backward()
    assert float(x.grad.data) == 8.0
    x.cleargrad()
    (x * x).backward()
    assert float(x.grad.data) == 4.0


def _derivatives(fn, x0, n):
    x = Variable(np.array(x0))
    y = fn(x)
    y.backward(create_graph=True)
    out = []
    for _ in range(n):
        gx = x.grad
        out.append(float(gx.data))
        x.cleargrad()
        gx.backward(create_graph=True)
    return out


def test_create_graph_higher_order_sin():
    x0 = 0.7
    got = _derivatives(F.sin, x0, 4)
    np.testing.assert_allclose(got, [np.cos(x0), -np.sin(x0), -np.cos(x0), np.sin(x0)],
                               rtol=1e-12)


def test_create_graph_higher_order_tanh():
    x0 = 0.4
    t = np.tanh(x0)
    s = 1 - t * t
    expected = [s, -2 * t * s, -2 * s * (1 - 3 * t * t), 8 * t * s * (2 - 3 * t * t)]
    np.testing.assert_allclose(_derivatives(F.tanh, x0, 4), expected, rtol=1e-12)


def test_create_graph_higher_order_polynomial():
    # y = x^4 - 2x^2: the DeZero Newton's-method example.
    got = _derivatives(lambda x: x ** 4 - 2 * x ** 2, 2.0, 4)
    assert got == [24.0, 44.0, 48.0, 24.0]


def test_plain_backward_leaves_no_reference_cycles():
    gc.collect()
    gc.disable()
    try:
        x = Variable(np.ones(3))
        a = F.sin(x)
        b = F.tanh(a) * x
        y = F.sum(b)
        refs = [weakref.ref(a.creator), weakref.ref(b.creator), weakref.ref(y.creator),
                weakref.ref(a)]
        y.backward()
        assert x.grad is not None and x.grad.creator is None
        del a, b, y
        # Reference counting alone must free the graph: no cycle holds it.
        assert all(r() is None for r in refs)
    finally:
        gc.enable()


def test_create_graph_graph_is_collected():
    x = Variable(np.ones(3))
    y = F.sum(F.sin(x) * x)
    ref = weakref.ref(y.creator)
    y.backward(create_graph=True)
    assert x.grad.creator is not None
    del y
    x.cleargrad()
    gc.collect()
    assert ref() is None


def test_unchain_backward():
    x = Variable(np.array(1.0))
    a = x * 2
    b = a + 1
    y = b * 3
    y.unchain_backward()
    assert a.creator is None and b.creator is None and x.creator is None
    assert y.creator is not None
    y.backward()
    assert x.grad is None
    assert float(b.grad.data) == 3.0     # b is a leaf now: its gradient is kept


def test_unchain_backward_stops_gradient():
    x = Variable(np.array(2.0))
    h = x * x
    h.unchain()                          # h becomes a leaf: nothing flows to x
    y = h * 3
    y.backward()
    assert x.grad is None


def test_backward_wrong_number_of_gradients_is_reported():
    class Bad(Function):
        def forward(self, a, b):
            return a + b

        def backward(self, gy):
            return gy

    y = Bad()(np.ones(2), np.ones(2))
    with pytest.raises(ValueError, match="Bad.backward returned 1 gradients for 2 inputs"):
        y.backward()


def test_long_chain_backward_has_no_recursion_limit():
    n = 10_000
    assert n > sys.getrecursionlimit()
    x = Variable(np.array(1.0))
    y = x
    for _ in range(n):
        y = y + 1.0
    y.backward()
    assert float(y.data) == n + 1.0
    assert float(x.grad.data) == 1.0
    del y                                # freeing a 10k-deep graph must not crash


# ---------------------------------------------------------------- Variable API

def test_repr_format():
    assert repr(Variable(np.array([1, 2, 3]))) == "variable([1 2 3])"
    assert repr(Variable(np.array(1.5))) == "variable(1.5)"
    assert repr(Variable(None)) == "variable(None)"
    assert repr(Variable(np.array([[1, 2], [3, 4]]))) == ("variable([[1 2]\n"
                                                          "          [3 4]])")


def test_shape_properties():
    data = np.arange(6.0, dtype=np.float32).reshape(2, 3)
    x = Variable(data, name="x")
    assert x.name == "x"
    assert len(x) == 2
    assert x.shape == (2, 3) and x.ndim == 2 and x.size == 6 and x.dtype == np.float32
    assert x.T.shape == (3, 2)
    np.testing.assert_array_equal(x.T.data, data.T)
    with pytest.raises(TypeError):
        len(Variable(np.array(1.0)))


def test_reshape_transpose_sum_methods():
    data = np.arange(6.0).reshape(2, 3)
    for y in [Variable(data).reshape(3, 2), Variable(data).reshape((3, 2)),
              Variable(data).reshape([3, 2])]:
        np.testing.assert_array_equal(y.data, data.reshape(3, 2))
    for y in [Variable(data).transpose(), Variable(data).transpose(1, 0),
              Variable(data).transpose((1, 0)), Variable(data).transpose(None)]:
        np.testing.assert_array_equal(y.data, data.T)
    np.testing.assert_array_equal(Variable(data).sum().data, data.sum())
    np.testing.assert_array_equal(Variable(data).sum(axis=0, keepdims=True).data,
                                  data.sum(axis=0, keepdims=True))
    x = Variable(data)
    y = (x.reshape(3, 2).T * Variable(np.arange(6.0).reshape(2, 3))).sum(axis=1)
    y.backward()
    assert x.grad.shape == (2, 3)
    np.testing.assert_array_equal(x.grad.data,
                                  np.arange(6.0).reshape(2, 3).T.reshape(2, 3))


def test_user_function_square():
    x = Variable(np.array([1.0, 2.0, 3.0]))
    y = Square()(x)
    np.testing.assert_array_equal(y.data, [1.0, 4.0, 9.0])
    assert y.creator.inputs[0] is x and y.generation == 1
    F.sum(y).backward()
    np.testing.assert_array_equal(x.grad.data, [2.0, 4.0, 6.0])


# ---------------------------------------------------------------- error messages

def test_matmul_mismatch_names_both_shapes():
    with pytest.raises(ValueError, match=r"matmul.*\(2, 3\).*\(4, 5\)"):
        F.matmul(Variable(np.ones((2, 3))), Variable(np.ones((4, 5))))


def test_reshape_incompatible():
    with pytest.raises(ValueError, match=r"reshape.*\(2, 3\).*\(4, 2\)"):
        Variable(np.ones((2, 3))).reshape(4, 2)


def test_broadcast_mismatch_names_shapes():
    with pytest.raises(ValueError, match=r"\(2, 3\).*\(2,\)"):
        Variable(np.ones((2, 3))) + Variable(np.ones(2))
    with pytest.raises(ValueError, match=r"broadcast_to.*\(2, 3\).*\(4, 3\)"):
        F.broadcast_to(Variable(np.ones((2, 3))), (4, 3))


def test_data_set_to_a_numpy_scalar_stays_an_array():
    # DeZero programs write `x.data = x.data - gx / gx2` on 0-d data: NumPy returns a
    # scalar there; the Variable keeps a 0-d array (jit and views rely on it).
    x = tj.Variable(np.array(2.0))
    x.data = x.data - 0.5
    assert isinstance(x.data, np.ndarray) and x.data.shape == () and float(x.data) == 1.5


def test_an_output_gradient_smaller_than_the_output_stands_for_every_element():
    # y.grad set by the user with another (broadcastable) shape: each input's gradient
    # has the input's shape (DeZero would hand a 0-d gradient to x).
    x = Variable(np.array([0.3, 0.5]))
    y = F.sin(x) * 3.0
    y.grad = Variable(np.array(1.5))
    y.backward()
    assert x.grad.shape == (2,)
    np.testing.assert_allclose(x.grad.data, 1.5 * 3.0 * np.cos(x.data), rtol=1e-14)


def test_unchain_backward_does_not_call_a_user_functions_expand():
    # core cuts inside a compiled call's creator (a RegionFunction) by its type: a user
    # Function with a method of its own named expand is an ordinary creator.
    class Twice(Function):
        def forward(self, x):
            return x * 2

        def backward(self, gy):
            return gy * 2

        def expand(self):
            raise AssertionError("a user's expand() must not be called")

    x = Variable(np.ones(2))
    h = Twice()(x)
    y = Twice()(h)
    y.unchain_backward()
    assert h.creator is None and y.creator is not None
