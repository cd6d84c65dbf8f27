"""Adversarial soundness tests: a jitted function must return what the eager one returns
(values, gradients, dtypes, shapes, mutated state, RNG stream), or fall back with a
JitWarning. Never silently wrong.

Every test calls the jitted function >= 5 times (warm-up, trace, >= 3 compiled calls)
with new values and compares each call with the eager function run under
tj.disable_jit(). JitWarning is an error unless the test expects a fallback.

Many attacks here keep the inputs identical for the first three calls and change them
afterwards: the first compiled call of a variant is checked against eager (the
"safety net"), so a value frozen at trace time only shows up on later calls. This is
what a user sees, e.g. a learning-rate schedule that is constant for the first epochs.

Tests marked xfail(strict=True) are bugs in tracejit found by this file.
"""
import math
import random
import threading
import types
import warnings

import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F
import tracejit.layers as L
from tracejit import Parameter, Variable
from tracejit.models import MLP, Model
from tracejit.optimizers import SGD, AdaGrad, Adam, MomentumSGD

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")

N = 7                   # calls per test: warm-up, trace, checked call, >= 4 replays
SWITCH = 3              # attacks on the safety net change values from this call on


# ------------------------------------------------------------------ helpers

def _arr(x):
    return x.data if isinstance(x, Variable) else np.asarray(x)


def _tol(dtype):
    return (2e-6, 1e-6) if np.dtype(dtype) == np.float32 else (1e-9, 1e-12)


def assert_same(a, b, what=""):
    """Structure, type, shape, dtype and values (NaN pattern included) of a and b."""
    if isinstance(b, dict):
        assert isinstance(a, dict) and list(a) == list(b), (what, a, b)
        for k in b:
            assert_same(a[k], b[k], f"{what}[{k!r}]")
        return
    if isinstance(b, (tuple, list)):
        assert type(a) is type(b) and len(a) == len(b), (what, a, b)
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{what}[{i}]")
        return
    assert type(a) is type(b), (what, type(a), type(b))
    if isinstance(b, (Variable, np.ndarray)):
        xa, xb = _arr(a), _arr(b)
        assert xa.shape == xb.shape and xa.dtype == xb.dtype, \
            (what, xa.shape, xa.dtype, xb.shape, xb.dtype)
        rtol, atol = _tol(xb.dtype) if xb.dtype.kind == "f" else (0, 0)
        np.testing.assert_allclose(xa, xb, rtol=rtol, atol=atol, err_msg=what)
    elif isinstance(b, float):
        np.testing.assert_allclose(a, b, rtol=1e-9, err_msg=what)
    else:
        assert a == b, (what, a, b)


def assert_grads(args_j, args_e, what=""):
    for k, (p, q) in enumerate(zip(args_j, args_e)):
        if isinstance(q, Variable):
            if q.grad is None:
                assert p.grad is None, f"{what}: arg {k} has a grad, eager has none"
            else:
                assert p.grad is not None, f"{what}: arg {k} has no grad"
                assert_same(p.grad, q.grad, f"{what} grad of arg {k}")


def no_fallbacks(jf):
    assert jf.cache_info()["fallbacks"] == 0, jf.cache_info()


def check(fn, make_args, n=N, post=None, mutate=None, compare_args=True, fallback_ok=False,
          **jit_kw):
    """Call jit(fn) and eager fn n times on twin arguments; compare results, argument
    state, gradients (after post(result)) and the global NumPy RNG stream.

    fallback_ok: the function escapes the tracer, so running eagerly with a JitWarning
    naming the cause is a correct outcome too; every call must still match eager.
    """
    if fallback_ok:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", tj.JitWarning)
            jf = check(fn, make_args, n, post, mutate, compare_args, _allow=True, **jit_kw)
        if jf.cache_info()["fallbacks"]:
            msgs = [str(w.message) for w in caught if issubclass(w.category, tj.JitWarning)]
            assert msgs and "runs eagerly" in msgs[0], msgs
        return jf
    allow = jit_kw.pop("_allow", False)
    jf = tj.jit(fn, **jit_kw)
    for i in range(n):
        if mutate is not None:
            mutate(i)
        aj, ae = make_args(i), make_args(i)
        st = np.random.get_state()
        yj = jf(*aj)
        rj = np.random.random()
        np.random.set_state(st)
        with tj.disable_jit():
            ye = fn(*ae)
        re_ = np.random.random()
        assert rj == re_, f"call {i}: NumPy RNG stream differs after the call"
        assert_same(yj, ye, f"call {i}")
        if compare_args:
            for k, (p, q) in enumerate(zip(aj, ae)):
                if isinstance(q, (Variable, np.ndarray)):
                    assert_same(p, q, f"call {i}: argument {k} after the call")
        if post is not None:
            post(yj, aj)
            post(ye, ae)
            assert_grads(aj, ae, f"call {i}")
    if not allow:
        no_fallbacks(jf)
    return jf


def V(i, shape=(3,), dtype=np.float64, off=0, hold=False):
    """A fresh Variable for call i (the same values for calls < SWITCH when hold)."""
    if hold and i < SWITCH:
        i = 0
    return Variable(np.random.default_rng(1000 * off + i).standard_normal(shape)
                    .astype(dtype))


def A(i, shape=(3,), dtype=np.float64, off=0):
    return np.random.default_rng(1000 * off + i + 7).standard_normal(shape).astype(dtype)


def held(i, a, b):
    """a for the calls the safety net sees, b(i) afterwards."""
    return a if i < SWITCH else b(i)


def bw(y, args):
    (y if y.ndim == 0 else F.sum(y)).backward()


# ================================================================== 1. control flow

def _loop_trip(x):
    n = int(abs(x.data.sum()) * 3) % 5
    y = x
    for _ in range(n):
        y = y * 1.1 + 0.1
    return F.sum(y)


def test_loop_trip_count_from_data():
    check(_loop_trip, lambda i: (V(i),), n=12, post=bw, max_variants=16)


def _cmp_two(x, y):
    if x.data.sum() > y.data.sum():
        if float(x.data.max()) > 1.0:
            return F.sum(x * y)
        return F.sum(x - y)
    return F.sum(F.exp(y) * 0.5)


def test_nested_ifs_comparing_two_traced_values():
    check(_cmp_two, lambda i: (V(i), V(i, off=1)), n=14, post=bw, max_variants=16)


def _minmax(x):
    s = float(x.data.sum())
    return x * min(s, 0.5) + max(s, -0.2)


def test_min_max_of_python_floats_from_data():
    check(_minmax, lambda i: (V(i),), n=8, post=bw, max_variants=16)


def _while_break(x):
    y = x
    while True:
        y = y * 0.5
        if float(F.sum(y * y).data) < 0.1:
            break
    return y


def test_while_with_break():
    check(_while_break, lambda i: (V(i) * (i % 4 + 1),), n=10, post=bw, max_variants=16)


def test_item_and_indexed_item():
    check(lambda x: x * x.data.item(0) + x.data[1].item(), lambda i: (V(i),), post=bw,
          max_variants=16)


def test_branch_on_shape():
    check(lambda x: x * 2 if x.shape[0] > 3 else x * 3,
          lambda i: (V(i, shape=(2 + i % 4,)),), n=12, post=bw)


def _raise_on_data(x):
    if float(x.data.max()) > 1.5:
        raise ValueError("too large")
    return F.sum(x * x)


def test_exception_raised_on_data_propagates_every_time():
    jf = tj.jit(_raise_on_data)
    for i in range(8):
        big = i % 2 == 1
        xa = np.array([0.1, 0.2, 2.0 + i]) if big else np.array([0.1, 0.2, 0.3 * i / 8])
        if big:
            with pytest.raises(ValueError, match="too large"):
                jf(Variable(xa))
        else:
            assert_same(jf(Variable(xa)), _raise_on_data(Variable(xa)), f"call {i}")


# ================================================================== 2. float arguments

@pytest.mark.parametrize("op", [
    lambda s: s * 2.0 + 1.0 / s,
    lambda s: s ** 0.5,
    lambda s: abs(s),
    lambda s: min(s, 2.0),
    lambda s: np.sqrt(s),
])
def test_float_argument_runtime_ops(op):
    check(lambda x, s: x * op(s), lambda i: (V(i), held(i, 0.5, lambda i: 0.1234 + i)),
          post=bw)


@pytest.mark.parametrize("op", [
    pytest.param(lambda s: math.sqrt(s), id="math.sqrt"),
    pytest.param(lambda s: s // 0.3, id="floordiv"),
    pytest.param(lambda s: s % 0.3, id="mod"),
    pytest.param(lambda s: round(s, 1), id="round"),
    pytest.param(lambda s: math.exp(s), id="math.exp"),
    pytest.param(lambda s: len(str(s)), id="str"),
])
def test_float_argument_through_python_math_is_not_frozen(op):
    # A learning rate that is constant for the first calls, then decays: the first
    # compiled call agrees with eager, the later ones must too.
    check(lambda x, s: x * op(s), lambda i: (V(i), held(i, 0.5, lambda i: 0.1234 + i)))


def test_float_argument_in_containers_and_returned():
    check(lambda x, ss: (x * ss[0] + ss[1], ss[0] * 2),
          lambda i: (V(i), [0.1 + i, 0.2 * i]))


def test_float32_times_float_argument_stays_float32():
    check(lambda x, s: x * s + 1.5, lambda i: (V(i, dtype=np.float32), 0.1 + i), post=bw)


# ================================================================== 3. captured state

class _C:
    pass


@pytest.mark.parametrize("where", ["global_array", "cell_array", "global_param", "attr_array",
                                   "attr_param", "dict_array", "model_layer", "model_param"])
def test_rebound_capture_is_read_live(where):
    ns = types.SimpleNamespace()
    g = globals()
    if where == "global_array":
        g["_G_ARR"] = np.ones(3)
        fn = lambda x: x * _G_ARR                              # noqa: E731
        rebind = lambda v: g.__setitem__("_G_ARR", v)          # noqa: E731
    elif where == "cell_array":
        c = np.ones(3)

        def fn(x):
            return x * c

        def rebind(v):
            nonlocal c
            c = v
    elif where == "global_param":
        g["_G_PAR"] = Parameter(np.ones(3))
        fn = lambda x: x * _G_PAR                              # noqa: E731
        rebind = lambda v: g.__setitem__("_G_PAR", Parameter(v))  # noqa: E731
    elif where == "attr_array":
        ns.w = np.ones(3)
        fn = lambda x: x * ns.w                                # noqa: E731
        rebind = lambda v: setattr(ns, "w", v)                 # noqa: E731
    elif where == "attr_param":
        ns.w = Parameter(np.ones(3))
        fn = lambda x: x * ns.w                                # noqa: E731
        rebind = lambda v: setattr(ns, "w", Parameter(v))      # noqa: E731
    elif where == "dict_array":
        d = {"w": np.ones(3)}
        fn = lambda x: x * d["w"]                              # noqa: E731
        rebind = lambda v: d.__setitem__("w", v)               # noqa: E731
    elif where == "model_layer":
        model = Model()
        model.l1 = L.Linear(3, in_size=3)
        fn = lambda x: model.l1(x)                             # noqa: E731

        def rebind(v):
            model.l1 = L.Linear(3, in_size=3)
            model.l1.W.data[...] = v
    else:
        model = Model()
        model.l1 = L.Linear(3, in_size=3)
        fn = lambda x: model.l1(x)                             # noqa: E731
        rebind = lambda v: setattr(model.l1, "W", Parameter(np.outer(v, v)))  # noqa: E731

    def mutate(i):
        if i >= SWITCH:
            rebind(np.full(3, float(i)))

    mk = (lambda i: (V(i, shape=(2, 3)),)) if where.startswith("model") else \
        (lambda i: (V(i),))
    check(fn, mk, mutate=mutate)


_GLOBAL_LIST = [np.ones(3)]


def test_list_element_array_mutated_in_place_used_in_variable_ops():
    def mutate(i):
        if i >= SWITCH:
            _GLOBAL_LIST[0][...] = float(i)
    check(lambda x: x * _GLOBAL_LIST[0], lambda i: (V(i),), mutate=mutate, post=bw)


_NP_SCALAR = np.float64(1.0)
_FLOATS = [1.0, 2.0]
_TUPLE = (1.0, 2.0)


@pytest.mark.parametrize("where", ["class_attr", "default_arg", "np_float64_global",
                                   "list_item", "tuple_global", "two_deep_attr"])
def test_python_scalar_change_is_seen(where):
    g = globals()
    if where == "class_attr":
        class M:
            k = 1.0

            def f(self, x):
                return x * self.k
        fn = M().f
        change = lambda v: setattr(M, "k", v)                  # noqa: E731
    elif where == "default_arg":
        def fn(x, s=1.0):
            return x * s
        change = lambda v: setattr(fn, "__defaults__", (v,))   # noqa: E731
    elif where == "np_float64_global":
        fn = lambda x: x * _NP_SCALAR                          # noqa: E731
        change = lambda v: g.__setitem__("_NP_SCALAR", np.float64(v))  # noqa: E731
    elif where == "list_item":
        fn = lambda x: x * _FLOATS[0] + _FLOATS[1]             # noqa: E731
        change = lambda v: _FLOATS.__setitem__(0, v)           # noqa: E731
    elif where == "tuple_global":
        fn = lambda x: x * _TUPLE[0]                           # noqa: E731
        change = lambda v: g.__setitem__("_TUPLE", (v, 2.0))  # noqa: E731
    else:
        obj = _C()
        obj.cfg = _C()
        obj.cfg.scale = 1.0
        fn = lambda x: x * obj.cfg.scale                       # noqa: E731
        change = lambda v: setattr(obj.cfg, "scale", v)        # noqa: E731

    def mutate(i):
        if i >= SWITCH:
            change(float(i))
    check(fn, lambda i: (V(i),), mutate=mutate)


@pytest.mark.parametrize("where", ["list_element", "two_deep_attr"])
def test_numpy_on_unreachable_array_mutated_later(where):
    if where == "list_element":
        box = [np.ones(3)]
        get = lambda: box[0]                                   # noqa: E731
        fn = lambda x: x * (box[0] * 2 + 1)                    # noqa: E731
    else:
        obj = _C()
        obj.cfg = _C()
        obj.cfg.w = np.ones(3)
        get = lambda: obj.cfg.w                                # noqa: E731
        fn = lambda x: x * np.exp(obj.cfg.w)                   # noqa: E731

    def mutate(i):
        if i >= SWITCH:
            get()[...] = float(i)
    check(fn, lambda i: (V(i),), mutate=mutate)


def test_captured_variable_data_set_to_other_dtype_and_shape():
    cv = Variable(np.ones(3))

    def mutate(i):
        if i == 4:
            cv.data = np.full(3, 2.0, np.float32)
        elif i == 6:
            cv.data = np.full((2, 3), 3.0)
    check(lambda x: x * cv, lambda i: (V(i),), n=9, mutate=mutate)


def test_attribute_python_int_loop_count_change_retraces():
    def fn(x):
        y = x
        for _ in range(K_BOX.k):
            y = y * 2
        return y
    K_BOX.k = 2

    def mutate(i):
        if i >= SWITCH:
            K_BOX.k = i % 3 + 1
    check(fn, lambda i: (V(i),), mutate=mutate, post=bw)


K_BOX = types.SimpleNamespace(k=2)


def test_default_argument_array_mutated_in_place():
    def fn(x, w=np.ones(3)):
        return x * w

    def mutate(i):
        if i >= SWITCH:
            fn.__defaults__[0][...] = float(i)
    check(fn, lambda i: (V(i),), mutate=mutate, post=bw)


# ================================================================== 4. in-place ops

def _data_iadd(x):
    x.data += 1
    return x * 2


def test_inplace_add_on_argument_data():
    check(_data_iadd, lambda i: (V(i),), post=bw)


def _np_add_out(x, a):
    np.add(a, 1.0, out=a)
    return x * a


_LIVE_C = np.zeros(3)
_LIVE_P = Parameter(np.zeros(3))


def _update_arg(x, a):
    np.add(a, 1.0, out=a)
    return F.sum(F.exp(x * a))


def _update_closure_array(x):
    np.add(_LIVE_C, 1.0, out=_LIVE_C)
    return F.sum(F.exp(x * _LIVE_C))


def _update_param(x):
    _LIVE_P.data += 1.0
    return F.sum(F.exp(x * _LIVE_P))


@pytest.mark.parametrize("where", ["argument_array", "closure_array", "parameter"])
def test_inplace_update_of_live_input_then_backward(where):
    if where == "argument_array":
        fn, mk, reset = _update_arg, (lambda i: (V(i), A(i))), (lambda i: None)
    elif where == "closure_array":
        fn, mk = _update_closure_array, (lambda i: (V(i),))
        reset = lambda i: _LIVE_C.__setitem__(Ellipsis, A(i))      # noqa: E731
    else:
        fn, mk = _update_param, (lambda i: (V(i),))

        def reset(i):
            _LIVE_P.data[...] = A(i)
            _LIVE_P.cleargrad()
    jf = tj.jit(fn)
    for i in range(N):
        reset(i)
        aj = mk(i)
        yj = jf(*aj)
        yj.backward()
        state_j = (_LIVE_C.copy(), _LIVE_P.data.copy(),
                   None if _LIVE_P.grad is None else _LIVE_P.grad.data.copy())
        reset(i)
        ae = mk(i)
        ye = fn(*ae)
        ye.backward()
        assert_same(yj, ye, f"call {i}")
        for k, (p, q) in enumerate(zip(aj, ae)):
            assert_same(p, q, f"call {i}: argument {k}")
        assert_grads(aj, ae, f"call {i}")
        np.testing.assert_allclose(state_j[0], _LIVE_C, rtol=1e-12)
        np.testing.assert_allclose(state_j[1], _LIVE_P.data, rtol=1e-12)
        if _LIVE_P.grad is not None:
            np.testing.assert_allclose(state_j[2], _LIVE_P.grad.data, rtol=1e-10)
    no_fallbacks(jf)


def _slice_inplace(x, p):
    p.data[1:] *= 2
    return x * p


def test_slice_inplace_on_parameter_compiles():
    # `p.data[1:] *= 2`: the write through the slice is p.data[1:] = the product, then
    # Python's assignment of that view back (AssignItem both): an effect on p's data.
    jf = tj.jit(_slice_inplace)
    for i in range(N):
        aj = (V(i), Parameter(A(i)))
        ae = (V(i), Parameter(A(i)))
        assert_same(jf(*aj), _slice_inplace(*ae), f"call {i}")
        assert_same(aj[1].data, ae[1].data)
    no_fallbacks(jf)
    assert jf.cache_info()["hits"] >= 2


def _grad_write(x):
    y = F.sum(x * x)
    y.backward()
    x.grad.data *= 0.5
    return y


def test_inplace_on_grad_data_falls_back_with_warning():
    jf = tj.jit(_grad_write)
    with pytest.warns(tj.JitWarning):
        for i in range(N):
            xj, xe = V(i), V(i)
            assert_same(jf(xj), _grad_write(xe), f"call {i}")
            assert_same(xj.grad, xe.grad)


# ================================================================== 5. traced data leaving NumPy

@pytest.mark.parametrize("op", [
    pytest.param(lambda d: np.asarray(d), id="np.asarray"),
    pytest.param(lambda d: np.array(d), id="np.array"),
    pytest.param(lambda d: d.view(np.ndarray), id="view"),
    pytest.param(lambda d: np.ascontiguousarray(d), id="ascontiguousarray"),
    pytest.param(lambda d: d.dot(d), id="ndarray.dot"),
    pytest.param(lambda d: complex(d.sum()).real, id="complex"),
    pytest.param(lambda d: memoryview(d).tolist()[0], id="memoryview"),
])
def test_traced_data_leaving_numpy_is_not_frozen(op):
    # Data copied out of the tracer's sight: compiled-and-right or eager-with-a-warning.
    check(lambda x: x * op(x.data), lambda i: (V(i, hold=True),), fallback_ok=True)


def test_detach_by_copying_data_is_not_frozen():
    def fn(x):
        c = Variable(np.array(x.data))
        return F.sum(c * x)
    check(fn, lambda i: (V(i, hold=True),), post=bw, fallback_ok=True)


def test_detach_by_new_variable_of_data():
    check(lambda x: F.sum(Variable(x.data * 2) * x), lambda i: (V(i, hold=True),), post=bw)


@pytest.mark.parametrize("op", [
    lambda d: d.copy(), lambda d: np.copy(d), lambda d: d[None], lambda d: np.exp(d),
    lambda d: d.max(), lambda d: d.sum(axis=0, keepdims=True), lambda d: d.astype(np.float32),
    lambda d: np.float64(d[0]), lambda d: d[::-1], lambda d: np.flip(d),
    lambda d: np.cumsum(d), lambda d: np.linalg.norm(d), lambda d: np.isnan(d),
    lambda d: d @ d, lambda d: np.dot(d, d), lambda d: np.mean(d), lambda d: sum(d),
])
def test_numpy_on_data_tracked(op):
    check(lambda x: x * op(x.data), lambda i: (V(i, hold=True),), post=bw)


# ================================================================== 6. autodiff

def test_output_used_twice_and_backward_twice():
    def post(y, a):
        y.backward()
        y.backward()
    check(lambda x: (lambda y: F.sum(y * y + y))(F.sin(x)), lambda i: (V(i),), post=post)


def test_gradients_accumulate_on_preexisting_grad():
    def mk(i):
        x = V(i)
        x.grad = Variable(np.ones(3) * i)
        return (x,)
    check(lambda x: F.sum(x * x), mk, post=bw)


def test_create_graph_through_region_then_backward_again():
    def post(y, a):
        y.backward(create_graph=True)
        gx = a[0].grad
        a[0].cleargrad()
        F.sum(gx * gx).backward()
    check(lambda x: F.sum(F.tanh(x) * F.exp(x) * x ** 3), lambda i: (V(i),), post=post)


def test_tuple_output_mixed_with_eager_ops():
    def post(y, a):
        (F.sum(y[0] * y[1]) + F.sum(a[0])).backward()
    check(lambda x, w: (F.sin(x), x * w), lambda i: (V(i), V(i, off=1)), post=post)


def test_retain_grad_on_compiled_output():
    check(lambda x: F.sum(F.exp(x)), lambda i: (V(i),),
          post=lambda y, a: y.backward(retain_grad=True))


def test_unchain_backward_on_compiled_output():
    def post(y, a):
        y.unchain_backward()
        y.backward()
    check(lambda x: F.sum(F.exp(x) * 2), lambda i: (V(i),), post=post)


def test_returning_arguments_unchanged():
    check(lambda x, y: (y, x), lambda i: (V(i), V(i, off=1)),
          post=lambda y, a: F.sum(y[0] * y[1]).backward())


def test_grad_of_grad_under_jit():
    jf = check(tj.grad(tj.grad(lambda x: F.sin(x) * x ** 3)),
               lambda i: (Variable(np.array(0.3 + i)),))
    # jit and eager share the autodiff: also against the known second derivative
    for i in range(N):
        v = 0.3 + i
        want = -v ** 3 * np.sin(v) + 6 * v ** 2 * np.cos(v) + 6 * v * np.sin(v)
        np.testing.assert_allclose(jf(Variable(np.array(v))).data, want, rtol=1e-9)


def test_value_and_grad_two_argnums():
    check(tj.value_and_grad(lambda x, w: F.sum(F.tanh(x * w)), argnums=(0, 1)),
          lambda i: (V(i), V(i, off=1)))


def _second_order_inside(x):
    y = F.sum(x ** 3)
    y.backward(create_graph=True)
    g = x.grad
    x.cleargrad()
    F.sum(g).backward()
    return x.grad


def test_second_order_backward_inside_function():
    check(_second_order_inside, lambda i: (V(i),))


def _no_grad_inside(x):
    with tj.no_grad():
        z = x * 2
    return F.sum(z * x)


def test_no_grad_block_inside():
    check(_no_grad_inside, lambda i: (V(i),), post=bw)


def test_no_grad_mode_outside():
    def run():
        with tj.no_grad():
            check(lambda x: F.sum(F.exp(x) * x), lambda i: (V(i),))
    run()


# ================================================================== 7. dtypes and layouts

@pytest.mark.parametrize("fn,mk", [
    (lambda x: x * 0.1 + 1.5, lambda i: (V(i, dtype=np.float32),)),
    (lambda x, y: x * y, lambda i: (V(i, dtype=np.float32), V(i, off=1))),
    (lambda x: x * 2 + 1, lambda i: (Variable(np.arange(3) + i),)),
    (lambda x: x / 2, lambda i: (Variable(np.arange(3) + i),)),
    (lambda x, m: x * m, lambda i: (V(i), A(i) > 0)),
    (lambda x: F.sin(x) * x, lambda i: (Variable(np.array(0.3 + i)),)),
    (lambda x: F.sum(x * 2, axis=0), lambda i: (Variable(np.zeros((0, 3))),)),
    (lambda x: F.exp(x) * 2, lambda i: (Variable(A(i, shape=(3, 4)).T),)),
    (lambda x: F.exp(x) * 2, lambda i: (Variable(A(i, shape=(8,))[::2]),)),
    (lambda x, y: F.matmul(x, y) + F.sum(x),
     lambda i: (Variable(np.asfortranarray(A(i, shape=(3, 3)))),
                Variable(np.asfortranarray(A(i, shape=(3, 3), off=1))))),
    (lambda x, y: x * y + y, lambda i: (V(i, shape=(3, 1)), V(i, shape=(1, 4), off=1))),
    (lambda x: x - 3, lambda i: (Variable(np.arange(3, dtype=np.uint8) + i),)),
    (lambda x: x * 100, lambda i: (Variable(np.arange(3, dtype=np.int8) + i),)),
    (lambda x: F.sum(x), lambda i: (Variable(np.array([True, False, i % 2 == 0])),)),
    (lambda x, s: x * s, lambda i: (V(i, dtype=np.float32), np.float64(1.5 + i))),
    (lambda x, s: x * s, lambda i: (V(i), np.float32(1.5 + i))),
    (lambda x, s: x * s, lambda i: (Variable(np.arange(3) + i), 1.5 + i)),
    (lambda x: F.exp(x) + F.log(F.abs(x) + 1), lambda i: (V(i, dtype=np.float32),)),
], ids=lambda v: "" if callable(v) else None)
def test_dtypes_and_layouts(fn, mk):
    check(fn, mk)


def _nan_args(i):
    a = A(i)
    a[i % 3] = [np.nan, np.inf, -np.inf][i % 3]
    return (Variable(a),)


@pytest.mark.parametrize("fn", [
    lambda x: F.exp(x) * 0 + F.maximum(x, x * 0) + F.relu(x),
    lambda x: F.max(x) + F.min(x),
    lambda x: F.clip(x, -1.0, 1.0),
    lambda x: F.sum(F.tanh(x)) + F.sigmoid(x),
])
def test_nan_inf_pattern_matches_eager(fn):
    with np.errstate(all="ignore"):
        check(fn, _nan_args, post=bw)


# ================================================================== 8. random

def test_dropout_masks_and_stream_match_eager():
    def post(y, a):
        F.sum(y).backward()
    for i in range(2):
        np.random.seed(i)
        check(lambda x: F.dropout(x, 0.3) * 2 + F.dropout(x, 0.6),
              lambda i: (V(i, shape=(20,)),), post=post)


def _drop_branch(x):
    y = F.dropout(x, 0.5)
    if y.data.sum() > 0:
        return y * 2
    return y - 1


def test_dropout_then_data_dependent_branch():
    np.random.seed(3)
    check(_drop_branch, lambda i: (V(i, shape=(6,)),), n=12, post=bw, max_variants=16)


def test_dropout_test_mode_variant():
    with tj.test_mode():
        check(lambda x: F.dropout(x, 0.5) * 3, lambda i: (V(i),), post=bw)


def test_np_random_inside_falls_back_and_matches_stream():
    fn = lambda x: x * np.random.rand(3)                       # noqa: E731
    with pytest.warns(tj.JitWarning, match="random"):
        jf = tj.jit(fn)
        for i in range(N):
            np.random.seed(i)
            yj = jf(V(i))
            rj = np.random.rand()
            np.random.seed(i)
            ye = fn(V(i))
            assert rj == np.random.rand()
            assert_same(yj, ye, f"call {i}")


@pytest.mark.parametrize("source", ["python_random", "np_generator"])
def test_non_global_random_source_is_not_frozen(source):
    gen = np.random.default_rng(0)
    if source == "python_random":
        seed = random.seed
        fn = lambda x: x * random.random()                     # noqa: E731
    else:
        def seed(s):
            gen.bit_generator.state = np.random.default_rng(s).bit_generator.state
        fn = lambda x: x * gen.random()                        # noqa: E731
    jf = tj.jit(fn)
    # A private random source: fresh draws compiled, or eager with a warning.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", tj.JitWarning)
        for i in range(N):
            s = 0 if i < SWITCH else i        # same draws while the safety net looks
            seed(s)
            yj = jf(V(i))
            seed(s)
            ye = fn(V(i))
            assert_same(yj, ye, f"call {i}")
    if jf.cache_info()["fallbacks"]:
        assert any("runs eagerly" in str(w.message) for w in caught), caught


# ================================================================== 9. outputs and arguments

@pytest.mark.parametrize("fn", [
    lambda x: {"b": x * 2, "a": F.sum(x)},
    lambda x: None,
    lambda x: float(F.sum(x).data),
    lambda x: int(x.data.argmax()),
    lambda x: [x * 2, 3, "s"],
    lambda x: x.shape,
    lambda x: (x * 2).data,
    lambda x: x.data,
])
def test_output_structures(fn):
    check(fn, lambda i: (V(i),), max_variants=16)


def _structure_on_data(x):
    if x.data.sum() > 0:
        return (x * 2,)
    return x * 3


def test_structure_depends_on_data():
    check(_structure_on_data, lambda i: (V(i),), n=10)


def test_kwargs_and_static_string():
    def fn(x, *, scale=2.0, mode="a"):
        return x * scale if mode == "a" else x - scale
    jf = tj.jit(fn)
    for i in range(10):
        md = "a" if i % 3 else "b"
        assert_same(jf(V(i), scale=1.0 + i, mode=md), fn(V(i), scale=1.0 + i, mode=md))
    no_fallbacks(jf)


# ================================================================== 10. models, optimizers

def _twin_training(make_model, make_opt, body, n=50, dtype=np.float64):
    np.random.seed(0)
    m1 = make_model()
    np.random.seed(0)
    m2 = make_model()
    o1, o2 = make_opt().setup(m1), make_opt().setup(m2)
    js = tj.jit(lambda x, t: body(m1, o1, x, t))
    r = np.random.default_rng(1)
    rtol, atol = _tol(dtype)
    for i in range(n):
        x = r.standard_normal((8, 4)).astype(dtype)
        t = r.integers(0, 3, 8)
        st = np.random.get_state()
        lj = js(x, t)
        np.random.set_state(st)
        with tj.disable_jit():
            le = body(m2, o2, x.copy(), t.copy())
        assert_same(lj, le, f"step {i}")
        for p, q in zip(m1.params(), m2.params()):
            assert p.data.dtype == q.data.dtype
            np.testing.assert_allclose(p.data, q.data, rtol=rtol * 100, atol=atol * 100,
                                       err_msg=f"step {i}")
    no_fallbacks(js)


def _train_step(m, o, x, t):
    y = m(x)
    loss = F.softmax_cross_entropy(y, t)
    acc = F.accuracy(y, t)
    m.cleargrads()
    loss.backward()
    o.update()
    return loss, acc


@pytest.mark.parametrize("opt", [lambda: Adam(0.01), lambda: SGD(0.1),
                                 lambda: MomentumSGD(0.1), lambda: AdaGrad(0.1)])
def test_mlp_training_inside_jit_matches_eager_twin(opt):
    _twin_training(lambda: MLP((5, 3)), opt, _train_step)


def test_mlp_adam_float32_training():
    _twin_training(lambda: MLP((5, 3)), lambda: Adam(0.01), _train_step, dtype=np.float32)


class _DropNet(Model):
    def __init__(self):
        super().__init__()
        self.l1 = L.Linear(6)          # lazily initialised
        self.l2 = L.Linear(3)

    def forward(self, x):
        return self.l2(F.dropout(F.relu(self.l1(x)), 0.2))


def test_lazy_linear_with_dropout_and_adam():
    _twin_training(_DropNet, lambda: Adam(0.01), _train_step, n=20)


# ================================================================== 11. threads

def test_threads_different_shapes_concurrently():
    def fn(x, W):
        h = F.matmul(x, W)
        for _ in range(10):
            h = F.tanh(h) * 1.01
        return F.sum(h ** 2)
    jf = tj.jit(fn)
    errors, barrier = [], threading.Barrier(4)

    def work(k):
        try:
            r = np.random.default_rng(k)
            barrier.wait()
            for i in range(6):
                x = r.standard_normal((k + 1, 3))
                W = r.standard_normal((3, 2))
                Wj, We = Variable(W.copy()), Variable(W.copy())
                yj = jf(x, Wj)
                yj.backward()
                ye = fn(x, We)
                ye.backward()
                np.testing.assert_allclose(yj.data, ye.data, rtol=1e-10)
                np.testing.assert_allclose(Wj.grad.data, We.grad.data, rtol=1e-10)
        except BaseException as e:
            errors.append(e)
    ts = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors, errors
    no_fallbacks(jf)
