"""eval_shape changes no state: it gives shapes and dtypes, and everything the function
can reach is as it was afterwards.

Under eval_shape the function runs once on shapes alone. What it writes does not leak
out: in-place updates of a Variable's data (`W.data -= ...`, a BatchNorm layer's running
averages in train mode) or of an array it captures or is passed, `.data =` and `.grad =`
(a lazy layer's initialization, cleargrad), an attribute, global or dict entry it
rebinds (an optimizer's new per-parameter buffers, its step count), and draws from
NumPy's and Python's global random streams (the next eager call draws what it would
have). Plain Python side effects (a list it appends to) do happen, once.
"""
import random

import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F
import tracejit.layers as L
import tracejit.optimizers as O
from tracejit import Parameter, Variable
from tracejit.core import ShapeDtype

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")

SPEC = ShapeDtype((8, 3), np.float64)


def state_of(*objs):
    """Each object's state, by value and by identity (data and .grad objects)."""
    out = []
    for o in objs:
        if isinstance(o, Variable):
            g = o._grad
            out.append(("var", id(o._data), None if o._data is None else o._data.copy(),
                        id(g), None if g is None else g._data.copy()))
        else:
            out.append(("array", o.copy()))
    return out


def assert_unchanged(before, objs):
    for b, a in zip(before, state_of(*objs)):
        assert b[0] == a[0]
        for u, v in zip(b[1:], a[1:]):
            if isinstance(u, np.ndarray) or isinstance(v, np.ndarray):
                np.testing.assert_array_equal(u, v)
            else:
                assert u == v


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_a_batchnorm_layer_in_train_mode_keeps_its_running_averages(dtype):
    bn = L.BatchNorm()
    bn(np.random.randn(8, 3).astype(dtype))          # initialized, averages moved once
    params = (bn.avg_mean, bn.avg_var, bn.gamma, bn.beta)
    before = state_of(*params)
    for _ in range(3):
        assert tj.eval_shape(bn, ShapeDtype((8, 3), dtype)) == ShapeDtype((8, 3), dtype)
        assert_unchanged(before, params)


def test_the_dezero_batchnorm_function_keeps_its_running_arrays():
    mean, var = np.random.rand(3), np.random.rand(3) + 1.0
    bn = F.BatchNorm(mean, var)
    before = state_of(mean, var)
    g, b = Parameter(np.ones(3)), Parameter(np.zeros(3))
    assert tj.eval_shape(lambda x: bn(x, g, b), SPEC) == SPEC
    assert bn.avg_mean is mean and bn.avg_var is var
    assert_unchanged(before, (mean, var))


def test_an_in_place_update_of_a_captured_parameter_and_cleargrad_leave_it():
    W = Parameter(np.random.randn(3), name="W")
    W.grad = Variable(np.random.randn(3))

    def step(x):
        loss = F.sum(x * W)
        W.data -= 0.1 * W.grad.data
        W.data[0] = 5.0
        W.cleargrad()
        return loss

    before = state_of(W)
    assert tj.eval_shape(step, SPEC) == ShapeDtype((), np.float64)
    assert_unchanged(before, (W,))


def test_data_and_grad_assignments_and_attribute_rebinding_are_put_back():
    class Holder:
        pass

    h = Holder()
    h.v, h.k, h.arr, h.cache = Variable(np.zeros(3)), 1.0, np.zeros(3), {"a": 1}
    v, arr = h.v, h.arr
    before = state_of(h.v, h.arr)

    def f(x):
        h.v.grad = Variable(np.ones(3))
        h.v.data = np.ones(5)
        h.k = 2.0
        h.arr = np.ones(3)
        h.cache["b"] = x
        h.v = Variable(np.ones(2))
        h.made = x                            # a new attribute
        return x * 2.0

    assert tj.eval_shape(f, SPEC) == SPEC
    assert h.v is v and h.arr is arr and h.k == 1.0 and h.cache == {"a": 1}
    assert not hasattr(h, "made")
    assert_unchanged(before, (h.v, h.arr))


def test_captured_and_argument_arrays_updated_in_place_are_left_alone():
    K = np.random.randn(3)
    before = state_of(K)

    def f(x, a):
        nonlocal K
        K *= 0.9
        np.multiply(K, 2.0, out=K)
        a += 1.0
        return x * K + a

    a = np.ones((8, 3))
    assert tj.eval_shape(f, SPEC, a) == SPEC
    assert_unchanged(before, (K,))
    np.testing.assert_array_equal(a, np.ones((8, 3)))


def test_a_large_captured_array_is_read_only_while_it_runs_and_writable_after():
    big = np.zeros(1 << 22)                  # 32 MB: not copied

    def reads(x):
        return x * float(0) + big[:3]

    def writes(x):
        big[:3] += 1.0
        return x

    assert tj.eval_shape(reads, ShapeDtype((3,), np.float64)) == ShapeDtype((3,))
    with pytest.raises(ValueError, match="read-only"):
        tj.eval_shape(writes, ShapeDtype((3,), np.float64))
    assert big.flags.writeable and not big[:3].any()


def test_random_draws_leave_the_global_streams_where_they_were():
    def f(x):
        np.random.randn(3)
        random.random()
        return F.dropout(x) + np.random.rand(*x.shape)

    np.random.seed(3)
    random.seed(3)
    tj.eval_shape(f, SPEC)
    after = np.random.rand(), random.random()
    np.random.seed(3)
    random.seed(3)
    assert after == (np.random.rand(), random.random())


def test_a_lazy_layer_and_an_optimizer_step_are_not_initialized_or_stepped():
    np.random.seed(0)
    lin = L.Linear(4)
    sgd, adam = O.MomentumSGD().setup(lin), O.Adam().setup(lin)

    def step(x):
        loss = F.sum(lin(x))
        lin.cleargrads()
        loss.backward()
        sgd.update()
        adam.update()
        return loss

    attrs = {k: v for k, v in vars(lin).items()}
    np.random.seed(1)
    assert tj.eval_shape(step, SPEC) == ShapeDtype((), np.float64)
    assert lin.W.data is None and sgd.vs == {} and adam.ms == {} and adam.t == 0
    # Its first call's bookkeeping (inputs, outputs) is not left behind either.
    assert vars(lin).keys() == attrs.keys() and all(
        vars(lin)[k] is v for k, v in attrs.items())
    # The first real call initializes W from the stream eval_shape left where it was.
    lin(np.ones((2, 3)))
    twin = L.Linear(4)
    np.random.seed(1)
    twin(np.ones((2, 3)))
    np.testing.assert_array_equal(lin.W.data, twin.W.data)


def test_python_side_effects_still_happen_once():
    seen = []

    def f(x):
        seen.append(x.shape)
        return F.tanh(x)

    assert tj.eval_shape(f, SPEC) == SPEC
    assert seen == [(8, 3)]


def test_eval_shape_inside_a_jitted_function_changes_only_what_the_function_does():
    P = Parameter(np.ones(3), name="P")

    def inner(x):
        P.data *= 3.0                       # eval_shape's: put back
        return x * P

    def f(x):
        spec = tj.eval_shape(inner, ShapeDtype(x.shape, x.dtype))
        assert spec.shape == (3,)
        P.data -= 0.5                        # the jitted function's own update
        return x * P

    jf = tj.jit(f)
    for k in range(5):
        x = Variable(np.full(3, 1.0 + k))
        before = P.data.copy()
        y = jf(x)
        np.testing.assert_allclose(P.data, before - 0.5)
        np.testing.assert_allclose(y.data, x.data * (before - 0.5))
    assert jf.cache_info()["fallbacks"] == 0


def test_eval_shape_inside_jit_of_a_function_updating_a_captured_array_stays_compiled():
    # The jitted function's captured K is its trace's view there: an in-place update
    # of it under eval_shape must not become an effect of the compiled calls.
    K = np.ones(3)
    W = Parameter(np.ones(3), name="W")

    def inner(a):
        np.multiply(K, 0.9, out=K)
        W.data *= 0.5
        return a * 2.0

    def f(x):
        tj.eval_shape(inner, x)
        return x * K * W

    jf = tj.jit(f)
    for k in range(5):
        x = Variable(np.full(3, 1.0 + k))
        np.testing.assert_array_equal(jf(x).data, x.data)
        np.testing.assert_array_equal(K, np.ones(3))
        np.testing.assert_array_equal(W.data, np.ones(3))
    assert jf.cache_info()["fallbacks"] == 0 and jf.cache_info()["hits"] >= 3


def test_state_of_an_object_passed_as_an_argument_is_put_back_too():
    class Counter(L.Layer):
        def __init__(self):
            super().__init__()
            self.bn = L.BatchNorm()
            self.calls = 0
            self.stats = {}

        def forward(self, x):
            self.calls += 1
            self.stats["last"] = x
            return self.bn(x)

    m = Counter()
    m(np.random.randn(8, 3))
    params = (m.bn.avg_mean, m.bn.avg_var)
    before, stats = state_of(*params), dict(m.stats)
    for _ in range(3):
        assert tj.eval_shape(lambda model, x: model(x), m, SPEC) == SPEC
        assert m.calls == 1 and m.stats == stats and m.stats["last"] is stats["last"]
        assert_unchanged(before, params)
