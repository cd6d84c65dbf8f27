"""tracejit.jit against eager: values, gradients, caching, guards, live state, soundness.

Every test calls a jitted function well past its warm-up (1st call eager, 2nd traces,
later calls replay) with new values on each call, comparing with the eager function.
An unexpected fallback fails the test: JitWarning is an error unless a test expects it.
"""
import threading
import warnings

import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F
from tracejit import Parameter, Variable
from tracejit.models import MLP
from tracejit.optimizers import SGD, AdaGrad, Adam, MomentumSGD

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")

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


# ============================================================== 1. basics

def _graph(x, W, b):
    h = F.tanh(F.matmul(x, W) + b)
    return F.sum(h * h - 0.5 * h) / 3.0


def test_basic_variable_args_values_and_grads():
    jf = tj.jit(_graph)
    r = rng(1)
    for i in range(N_CALLS):
        xa, Wa, ba = r.standard_normal((4, 3)), r.standard_normal((3, 2)), r.standard_normal(2)
        args_j = [Variable(xa.copy()), Variable(Wa.copy()), Variable(ba.copy())]
        args_e = [Variable(xa.copy()), Variable(Wa.copy()), Variable(ba.copy())]
        yj = jf(*args_j)
        ye = _graph(*args_e)
        assert_close(yj, ye)
        yj.backward()
        ye.backward()
        for a, b in zip(args_j, args_e):
            assert_grad_close(a, b)
    info = jf.cache_info()
    assert info["variants"] == 1 and info["retraces"] == 0
    assert info["hits"] >= N_CALLS - 3, info   # the first replay may be a checked run
    no_fallbacks(jf)


def test_basic_ndarray_args_and_mixed():
    jf = tj.jit(_graph)
    r = rng(2)
    for i in range(N_CALLS):
        xa, Wa, ba = r.standard_normal((5, 3)), r.standard_normal((3, 4)), r.standard_normal(4)
        W_j, W_e = Variable(Wa.copy()), Variable(Wa.copy())
        yj = jf(xa, W_j, ba)
        ye = _graph(xa, W_e, ba)
        assert_close(yj, ye)
        yj.backward()
        ye.backward()
        assert_grad_close(W_j, W_e)
        # all-ndarray call: a Variable result that is not attached to any leaf
        yj2 = jf(xa, Wa, ba)
        assert_close(yj2, _graph(xa, Wa, ba))
    no_fallbacks(jf)


def _multi(x, y):
    s = x * y + F.sin(x)
    return s, {"a": F.sum(s), "b": [x - y, F.exp(y)]}


@pytest.mark.parametrize("form", ["tuple", "dict", "list"])
def test_output_containers(form):
    def f(x, y):
        a, rest = _multi(x, y)
        if form == "tuple":
            return a, rest["a"]
        if form == "dict":
            return rest
        return [a, rest["b"][0], rest["b"][1]]

    jf = tj.jit(f)
    r = rng(3)
    for i in range(N_CALLS):
        xa, ya = r.standard_normal((2, 3)), r.standard_normal((2, 3))
        xj, yj_ = Variable(xa.copy()), Variable(ya.copy())
        xe, ye_ = Variable(xa.copy()), Variable(ya.copy())
        oj, oe = jf(xj, yj_), f(xe, ye_)
        assert_close(oj, oe)
        # gradient of a combination of all outputs
        def total(o):
            leaves = list(o.values()) if isinstance(o, dict) else list(o)
            flat = []
            for v in leaves:
                flat.extend(v if isinstance(v, list) else [v])
            return sum(F.sum(v * (k + 1)) for k, v in enumerate(flat))
        total(oj).backward()
        total(oe).backward()
        assert_grad_close(xj, xe)
        assert_grad_close(yj_, ye_)
    no_fallbacks(jf)


def test_keyword_arguments():
    def f(x, *, scale, shift=None):
        y = F.tanh(x) * scale
        if shift is not None:
            y = y + shift
        return F.sum(y)

    jf = tj.jit(f)
    r = rng(4)
    for i in range(N_CALLS):
        xa, sa, ta = r.standard_normal(3), r.standard_normal(3), r.standard_normal(3)
        xj, xe = Variable(xa.copy()), Variable(xa.copy())
        sj, se = Variable(sa.copy()), Variable(sa.copy())
        yj = jf(xj, scale=sj, shift=ta)
        ye = f(xe, scale=se, shift=ta)
        assert_close(yj, ye)
        yj.backward()
        ye.backward()
        assert_grad_close(xj, xe)
        assert_grad_close(sj, se)
    assert jf.cache_info()["variants"] == 1
    no_fallbacks(jf)


def test_float_args_are_runtime_inputs():
    def f(x, lr):
        return F.sum(x * lr + lr ** 2)

    jf = tj.jit(f)
    r = rng(5)
    for i in range(N_CALLS + 2):
        xa = r.standard_normal(4)
        lr = float(r.uniform(0.1, 2.0))
        xj, xe = Variable(xa.copy()), Variable(xa.copy())
        yj, ye = jf(xj, lr), f(xe, lr)
        assert_close(yj, ye)
        yj.backward()
        ye.backward()
        assert_grad_close(xj, xe)
    info = jf.cache_info()
    assert info["retraces"] == 0 and info["variants"] == 1, info
    assert info["hits"] >= N_CALLS - 1, info
    no_fallbacks(jf)


def test_zero_d_array_args_are_runtime_inputs():
    def f(x, a):
        return F.sum(x * a)

    jf = tj.jit(f)
    for i in range(N_CALLS):
        xa = np.arange(3.0) + i
        a = np.array(0.5 + i)
        assert_close(jf(xa, a), f(xa, a))
    info = jf.cache_info()
    assert info["retraces"] == 0 and info["variants"] == 1, info
    no_fallbacks(jf)


def test_float_returned_and_python_float_output():
    def f(x, lr):
        return x * 2.0, lr * 3.0

    jf = tj.jit(f)
    for i in range(N_CALLS):
        lr = 0.1 * (i + 1)
        xa = np.arange(3.0) * i
        oj, oe = jf(Variable(xa), lr), f(Variable(xa), lr)
        assert_close(oj[0], oe[0])
        assert type(oj[1]) is float
        assert oj[1] == pytest.approx(oe[1], rel=1e-12)
    no_fallbacks(jf)


def test_int_and_str_args_are_static():
    def f(x, n, mode):
        y = x
        for _ in range(n):
            y = F.sin(y) + x
        if mode == "sq":
            y = y * y
        return F.sum(y)

    jf = tj.jit(f)
    r = rng(6)
    for n, mode in [(1, "sq"), (2, "sq"), (1, "id"), (2, "id")]:
        for i in range(N_CALLS):
            xa = r.standard_normal(3)
            xj, xe = Variable(xa.copy()), Variable(xa.copy())
            yj, ye = jf(xj, n, mode), f(xe, n, mode)
            assert_close(yj, ye)
            yj.backward()
            ye.backward()
            assert_grad_close(xj, xe)
    info = jf.cache_info()
    assert info["variants"] == 4, info
    assert info["retraces"] == 0
    no_fallbacks(jf)


def test_static_argnums_and_argnames():
    def f(x, k, scale=1.0):
        # `scale` static: a Python number folded into the graph; `k` static too
        return F.sum(x ** k) * scale

    jf = tj.jit(f, static_argnums=(1,), static_argnames=("scale",))
    r = rng(7)
    for scale in (1.0, 2.5):
        for i in range(N_CALLS):
            xa = r.standard_normal(3)
            xj, xe = Variable(xa.copy()), Variable(xa.copy())
            yj, ye = jf(xj, 3, scale=scale), f(xe, 3, scale=scale)
            assert_close(yj, ye)
            yj.backward()
            ye.backward()
            assert_grad_close(xj, xe)
    info = jf.cache_info()
    assert info["variants"] == 2, info     # a static float is part of the key
    no_fallbacks(jf)


def test_new_shape_new_variant():
    jf = tj.jit(lambda x: F.sum(F.tanh(x) * x))
    r = rng(8)
    for shape in [(3,), (2, 3), (3,), ()]:
        for i in range(N_CALLS):
            xa = r.standard_normal(shape)
            xj, xe = Variable(xa.copy()), Variable(xa.copy())
            yj, ye = jf(xj), F.sum(F.tanh(xe) * xe)
            assert_close(yj, ye)
            yj.backward()
            ye.backward()
            assert_grad_close(xj, xe)
    assert jf.cache_info()["variants"] == 3
    no_fallbacks(jf)


def test_trace_returns_printable_graph():
    jf = tj.jit(_graph)
    r = rng(9)
    x, W, b = r.standard_normal((2, 3)), Variable(r.standard_normal((3, 2))), r.standard_normal(2)
    g = jf.trace(x, W, b)
    text = str(g)
    assert "tanh" in text.lower()
    # still correct afterwards, on new values
    for i in range(N_CALLS):
        x, Wa, b = r.standard_normal((2, 3)), r.standard_normal((3, 2)), r.standard_normal(2)
        assert_close(jf(x, Variable(Wa), b), _graph(x, Variable(Wa), b))
    no_fallbacks(jf)


def test_arguments_not_mutated_and_results_fresh():
    def f(x, a):
        return x * 1.0, a

    jf = tj.jit(f)
    for i in range(N_CALLS):
        xa = np.arange(3.0) + i
        a = np.arange(2.0) - i
        xa0, a0 = xa.copy(), a.copy()
        x = Variable(xa)
        y, b = jf(x, a)
        np.testing.assert_array_equal(xa, xa0)
        np.testing.assert_array_equal(a, a0)
        assert not np.shares_memory(y.data, xa)
        y.data[...] = 99.0
        np.testing.assert_array_equal(xa, xa0)
        np.testing.assert_array_equal(b, a0)
    no_fallbacks(jf)


# ============================================================== 2. while loop guards

def _loop(x):
    y = x
    while y.data < 100:
        y = y + x
    return y


def test_define_by_run_while_loop():
    jf = tj.jit(_loop)
    seq = [3.0, 7.0, 3.0, 50.0, 7.0, 2.5]
    for rnd in range(4):
        before = jf.cache_info()
        for v in seq:
            xj, xe = Variable(np.array(v)), Variable(np.array(v))
            yj, ye = jf(xj), _loop(xe)
            assert_close(yj, ye)
            yj.backward()
            ye.backward()
            assert_grad_close(xj, xe)
    info = jf.cache_info()
    assert info["guard_failures"] > 0, info
    assert info["variants"] == 4, info          # one per trip count
    # by the last round every value has its variant: all hits, no new trace
    assert info["hits"] - before["hits"] == len(seq), (before, info)
    assert info["retraces"] == before["retraces"], (before, info)
    no_fallbacks(jf)


def test_while_loop_max_variants_falls_back_once():
    jf = tj.jit(_loop, max_variants=2)
    values = [3.0, 7.0, 3.0, 50.0, 7.0, 2.5, 1.5, 50.0, 3.0]
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always", tj.JitWarning)
        for v in values:
            xj, xe = Variable(np.array(v)), Variable(np.array(v))
            yj, ye = jf(xj), _loop(xe)
            assert_close(yj, ye)
            yj.backward()
            ye.backward()
            assert_grad_close(xj, xe)
    jw = [w for w in rec if issubclass(w.category, tj.JitWarning)]
    assert len(jw) == 1, [str(w.message) for w in jw]
    assert "max_variants" in str(jw[0].message)
    info = jf.cache_info()
    assert info["variants"] <= 2
    assert info["fallbacks"] >= 1


# ============================================================== 3. data-dependent branch

def _branch(x, W, b):
    h = F.tanh(F.matmul(x, W) + b)
    if h.data.mean() > 0:
        h = h * 2
    else:
        h = h - 1
    return F.sum(h ** 2)


def test_data_dependent_branch_both_outcomes():
    jf = tj.jit(_branch)
    r = rng(10)
    outcomes = []
    for i in range(10):
        sign = 1.0 if (i // 2) % 2 == 0 else -1.0
        xa = np.abs(r.standard_normal((3, 2)))
        Wa = np.abs(r.standard_normal((2, 2)))
        ba = sign * (2.0 + np.abs(r.standard_normal(2)))
        Wj, We = Variable(Wa.copy()), Variable(Wa.copy())
        bj, be = Variable(ba.copy()), Variable(ba.copy())
        yj, ye = jf(xa, Wj, bj), _branch(xa, We, be)
        outcomes.append(np.tanh(xa @ Wa + ba).mean() > 0)
        assert_close(yj, ye)
        yj.backward()
        ye.backward()
        assert_grad_close(Wj, We)
        assert_grad_close(bj, be)
    assert any(outcomes) and not all(outcomes)
    info = jf.cache_info()
    assert info["variants"] == 2, info
    assert info["guard_failures"] >= 1
    no_fallbacks(jf)


# ============================================================== 4. live captures

def test_closure_parameter_mutated_in_place_and_rebound():
    p = Parameter(np.array([1.0, 2.0, 3.0]), name="p")

    def f(x):
        return F.sum(F.tanh(x * p) + p)

    jf = tj.jit(f)
    r = rng(11)
    for i in range(N_CALLS * 2):
        xa = r.standard_normal(3)
        if i % 2:
            p.data[...] = r.standard_normal(3)          # in place
        else:
            p.data = r.standard_normal(3)                # rebind
        p.cleargrad()
        xj = Variable(xa.copy())
        yj = jf(xj)
        yj.backward()
        gj = p.grad.data.copy()
        p.cleargrad()
        xe = Variable(xa.copy())
        ye = f(xe)
        ye.backward()
        assert_close(yj, ye)
        assert_grad_close(xj, xe)
        np.testing.assert_allclose(gj, p.grad.data, rtol=1e-12)
    no_fallbacks(jf)


def test_closure_ndarray_in_variable_ops_mutated_in_place():
    c = np.array([1.0, -1.0, 0.5])

    def f(x):
        return F.sum(x * c + F.sin(Variable(c)))

    jf = tj.jit(f)
    r = rng(25)
    for i in range(N_CALLS * 2):
        if i >= 4:                 # mutate only after the variant's first (checked) calls
            c[...] = r.standard_normal(3)
        xa = r.standard_normal(3)
        xj, xe = Variable(xa.copy()), Variable(xa.copy())
        yj, ye = jf(xj), f(xe)
        assert_close(yj, ye)
        yj.backward()
        ye.backward()
        assert_grad_close(xj, xe)
    no_fallbacks(jf)


def test_closure_ndarray_numpy_op_mutated_later():
    c = np.array([1.0, -1.0, 0.5])

    def f(x):
        return F.sum(x * c + c ** 2)

    jf = tj.jit(f)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tj.JitWarning)    # a fallback would be fine
        for i in range(N_CALLS * 2):
            if i >= 4:
                c[...] = np.arange(3.0) * i
            xa = np.arange(3.0) + i
            assert_close(jf(Variable(xa)), f(Variable(xa)))


_GLOBAL_K = 2.0


def test_global_python_float_change_retraces():
    global _GLOBAL_K

    def f(x):
        return F.sum(x * _GLOBAL_K)

    jf = tj.jit(f)
    try:
        for i in range(N_CALLS * 2):
            if i >= 4:
                _GLOBAL_K = float(i)
            xa = np.arange(3.0) + i
            assert_close(jf(Variable(xa)), f(Variable(xa)))
        no_fallbacks(jf)
    finally:
        _GLOBAL_K = 2.0


def test_closure_cell_python_float_change_retraces():
    k = 2.0

    def f(x):
        return F.sum(x * k)

    def set_k(v):
        nonlocal k
        k = v

    jf = tj.jit(f)
    for i in range(N_CALLS * 2):
        if i >= 4:
            set_k(float(i))
        xa = np.arange(3.0) + i
        assert_close(jf(Variable(xa)), f(Variable(xa)))
    no_fallbacks(jf)


def test_attribute_python_float_change_retraces():
    class Cfg:
        k = None

    cfg = Cfg()
    cfg.k = 2.0

    def f(x):
        return F.sum(x * cfg.k)

    jf = tj.jit(f)
    for i in range(N_CALLS * 2):
        if i >= 4:
            cfg.k = float(i)
        xa = np.arange(3.0) + i
        xj, xe = Variable(xa.copy()), Variable(xa.copy())
        yj, ye = jf(xj), f(xe)
        assert_close(yj, ye)
        yj.backward()
        ye.backward()
        assert_grad_close(xj, xe)
    assert jf.cache_info()["retraces"] >= 1
    no_fallbacks(jf)


def test_dict_item_python_float_change():
    state = {"k": 2.0}

    def f(x):
        return F.sum(x * state["k"])

    jf = tj.jit(f)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tj.JitWarning)    # a fallback would be fine
        for i in range(N_CALLS * 2):
            if i >= 4:
                state["k"] = float(i)
            xa = np.arange(3.0) + i
            assert_close(jf(Variable(xa)), f(Variable(xa)))


def _twins(seed, sizes, dtype=np.float64, in_size=3):
    m1, m2 = MLP(sizes), MLP(sizes)
    x0 = np.zeros((2, in_size), dtype)
    np.random.seed(seed)
    m1(x0)                      # one eager forward: the lazy Linear layers initialise
    np.random.seed(seed)
    m2(x0)
    if dtype == np.float64:       # Linear defaults to float32 parameters
        for p in list(m1.params()) + list(m2.params()):
            p.data = p.data.astype(np.float64)
    for p1, p2 in zip(m1.params(), m2.params()):
        np.testing.assert_array_equal(p1.data, p2.data)
    return m1, m2


_OPTS = {
    "SGD": lambda: SGD(lr=0.1),
    "MomentumSGD": lambda: MomentumSGD(lr=0.05, momentum=0.9),
    "AdaGrad": lambda: AdaGrad(lr=0.05),
    "Adam": lambda: Adam(alpha=0.01),
}


def _data(dtype):
    r = rng(13)
    x = r.standard_normal((16, 3)).astype(dtype)
    t = (np.sin(x.sum(axis=1, keepdims=True)) ).astype(dtype)
    return x, t


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("opt_name", list(_OPTS))
def test_mlp_training_step_update_inside(opt_name, dtype):
    m_j, m_e = _twins(0, (8, 1), dtype)
    o_j, o_e = _OPTS[opt_name]().setup(m_j), _OPTS[opt_name]().setup(m_e)
    x, t = _data(dtype)

    def make_step(model, opt):
        def step(x, t):
            y = model(x)
            loss = F.mean_squared_error(y, t)
            model.cleargrads()
            loss.backward()
            opt.update()
            return loss
        return step

    step_e = make_step(m_e, o_e)
    step_j = tj.jit(make_step(m_j, o_j))
    r = rng(14)
    for i in range(100):
        idx = r.permutation(16)[:8]
        lj = step_j(x[idx], t[idx])
        le = step_e(x[idx], t[idx])
        rtol = 1e-5 if dtype == np.float32 else 1e-6
        np.testing.assert_allclose(lj.data, le.data, rtol=rtol, atol=1e-7)
        assert lj.dtype == le.dtype
    rtol, atol = (1e-5, 1e-6) if dtype == np.float32 else (1e-6, 1e-6)
    for p1, p2 in zip(m_j.params(), m_e.params()):
        assert p1.data.dtype == p2.data.dtype == dtype
        np.testing.assert_allclose(p1.data, p2.data, rtol=rtol, atol=atol)
    info = step_j.cache_info()
    assert info["hits"] >= 95, info
    no_fallbacks(step_j)


@pytest.mark.parametrize("opt_name", list(_OPTS))
def test_mlp_training_step_update_outside(opt_name):
    m_j, m_e = _twins(1, (6, 1))
    o_j, o_e = _OPTS[opt_name]().setup(m_j), _OPTS[opt_name]().setup(m_e)
    x, t = _data(np.float64)

    def make_loss(model):
        def loss_fn(x, t):
            return F.mean_squared_error(model(x), t)
        return loss_fn

    loss_e = make_loss(m_e)
    jstep = tj.jit(make_loss(m_j))
    r = rng(15)
    for i in range(100):
        idx = r.permutation(16)[:8]
        lj = jstep(x[idx], t[idx])
        m_j.cleargrads()
        lj.backward()
        o_j.update()
        le = loss_e(x[idx], t[idx])
        m_e.cleargrads()
        le.backward()
        o_e.update()
        np.testing.assert_allclose(lj.data, le.data, rtol=1e-6, atol=1e-9)
        for p1, p2 in zip(m_j.params(), m_e.params()):
            np.testing.assert_allclose(p1.grad.data, p2.grad.data, rtol=1e-6, atol=1e-9)
    for p1, p2 in zip(m_j.params(), m_e.params()):
        np.testing.assert_allclose(p1.data, p2.data, rtol=1e-6, atol=1e-6)
    no_fallbacks(jstep)


def test_jit_method_of_model():
    m_j, m_e = _twins(2, (5, 2))

    class Net:
        def __init__(self, m):
            self.m = m

        @tj.jit
        def loss(self, x):
            return F.sum(self.m(x) ** 2)

    net = Net(m_j)
    r = rng(16)
    for i in range(N_CALLS):
        xa = r.standard_normal((4, 3))
        m_j.cleargrads()
        m_e.cleargrads()
        lj = net.loss(xa)
        le = F.sum(m_e(xa) ** 2)
        assert_close(lj, le)
        lj.backward()
        le.backward()
        for p1, p2 in zip(m_j.params(), m_e.params()):
            assert_grad_close(p1, p2)
        # mutate the params the same way in both
        for p1, p2 in zip(m_j.params(), m_e.params()):
            d = r.standard_normal(p1.shape) * 0.1
            p1.data += d
            p2.data += d


# ============================================================== 5. backward

def test_backward_through_region_and_mixed_eager():
    def f(x, y):
        return F.tanh(x) * y + x ** 2

    jf = tj.jit(f)
    r = rng(17)
    for i in range(N_CALLS):
        xa, ya = r.standard_normal((2, 3)), r.standard_normal((2, 3))
        xj, yj = Variable(xa.copy()), Variable(ya.copy())
        xe, ye = Variable(xa.copy()), Variable(ya.copy())
        zj = F.sum(jf(xj * 2, F.sin(yj)) + xj)      # eager before and after
        ze = F.sum(f(xe * 2, F.sin(ye)) + xe)
        assert_close(zj, ze)
        zj.backward()
        ze.backward()
        assert_grad_close(xj, xe)
        assert_grad_close(yj, ye)
    no_fallbacks(jf)


def test_backward_nonscalar_output_direct():
    def f(x, y):
        return x * y + F.exp(x)

    jf = tj.jit(f)
    r = rng(18)
    for i in range(N_CALLS):
        xa, ya = r.standard_normal(3), r.standard_normal(3)
        xj, yj = Variable(xa.copy()), Variable(ya.copy())
        xe, ye = Variable(xa.copy()), Variable(ya.copy())
        zj, ze = jf(xj, yj), f(xe, ye)
        assert_close(zj, ze)
        zj.backward()
        ze.backward()
        assert_grad_close(xj, xe)
        assert_grad_close(yj, ye)
    no_fallbacks(jf)


def test_no_grad_mode_is_separate_variant():
    jf = tj.jit(lambda x: F.sum(F.tanh(x)))
    for i in range(N_CALLS):
        xa = np.arange(3.0) - i
        with tj.no_grad():
            yj = jf(Variable(xa))
            assert yj.creator is None
        np.testing.assert_allclose(yj.data, np.tanh(xa).sum(), rtol=1e-12)
        x = Variable(xa)
        y = jf(x)
        y.backward()
        np.testing.assert_allclose(x.grad.data, 1 - np.tanh(xa) ** 2, rtol=1e-12)
    assert jf.cache_info()["variants"] == 2
    no_fallbacks(jf)


def test_create_graph_second_derivative():
    def f(x):
        return F.tanh(x) * x

    jf = tj.jit(f)
    for v in [0.3, -0.7, 1.2, 0.05, -2.0, 0.9]:
        xj, xe = Variable(np.array(v)), Variable(np.array(v))
        yj, ye = jf(xj), f(xe)
        assert_close(yj, ye)
        yj.backward(create_graph=True)
        ye.backward(create_graph=True)
        assert_close(xj.grad, xe.grad)
        gj, ge = xj.grad, xe.grad
        xj.cleargrad()
        xe.cleargrad()
        gj.backward()
        ge.backward()
        assert_close(xj.grad, xe.grad)
    no_fallbacks(jf)


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
    r = rng(19)
    for i in range(N_CALLS):
        a, b = np.array(r.uniform(-1.5, 1.5)), np.array(r.uniform(-1.5, 1.5))
        vj, (gj0, gj1) = jvg(a, b)
        ve, (ge0, ge1) = vg(a, b)
        assert_close(vj, ve, rtol=1e-10)
        assert_close(gj0, ge0, rtol=1e-10)
        assert_close(gj1, ge1, rtol=1e-10)
        # Variables too: the user's Variables keep no .grad
        x0, x1 = Variable(a.copy()), Variable(b.copy())
        vj2, gj2 = jvg(x0, x1)
        assert x0.grad is None and x1.grad is None
        assert_close(vj2, ve, rtol=1e-10)
        assert_close(gj2[0], ge0, rtol=1e-10)
    no_fallbacks(jvg)


def test_jit_grad_of_grad():
    f = lambda x: F.sum(F.sin(x) * x)
    g2 = tj.grad(lambda x: F.sum(tj.grad(f)(x)))
    jg2 = tj.jit(g2)
    r = rng(20)
    for i in range(N_CALLS):
        xa = r.standard_normal(3)
        assert_close(jg2(xa), g2(xa))
    no_fallbacks(jg2)


# ============================================================== 6. soundness

def test_tolist_falls_back_with_warning_naming_cause_and_line():
    def f(x):
        vals = x.data.tolist()  # USER-LINE-TOLIST
        return x * float(sum(vals))

    jf = tj.jit(f)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always", tj.JitWarning)
        for i in range(N_CALLS):
            xa = np.arange(3.0) * (i + 1)
            xj, xe = Variable(xa.copy()), Variable(xa.copy())
            yj, ye = jf(xj), f(xe)
            assert_close(yj, ye)
            F.sum(yj).backward()
            F.sum(ye).backward()
            assert_grad_close(xj, xe)
    jw = [str(w.message) for w in rec if issubclass(w.category, tj.JitWarning)]
    assert len(jw) == 1, jw
    assert "tolist" in jw[0] and "USER-LINE-TOLIST" in jw[0]
    assert jf.cache_info()["fallbacks"] >= 1


def test_item_assignment_falls_back():
    def f(x):
        d = (x * 2).data
        d[0] = 5.0  # USER-LINE-SETITEM
        return F.sum(Variable(d) * x)

    jf = tj.jit(f)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always", tj.JitWarning)
        for i in range(N_CALLS):
            xa = np.arange(3.0) + i
            assert_close(jf(Variable(xa.copy())), f(Variable(xa.copy())))
    jw = [str(w.message) for w in rec if issubclass(w.category, tj.JitWarning)]
    assert len(jw) == 1, jw
    assert "assignment" in jw[0] and "USER-LINE-SETITEM" in jw[0]


def test_np_random_inside_fresh_draws_same_as_eager():
    def f(x):
        return x * np.random.rand(*x.shape)

    jf = tj.jit(f)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tj.JitWarning)   # fallback is allowed here
        np.random.seed(0)
        outs_j = [jf(Variable(np.ones(4) * (i + 1))).data for i in range(N_CALLS)]
    np.random.seed(0)
    outs_e = [f(Variable(np.ones(4) * (i + 1))).data for i in range(N_CALLS)]
    for a, b in zip(outs_j, outs_e):
        np.testing.assert_allclose(a, b, rtol=1e-12)
    for a, b in zip(outs_j[1:], outs_j[:-1]):
        assert not np.allclose(a / a.max(), b / b.max())


def test_dropout_masks_match_eager_under_seed():
    def f(x, W):
        return F.sum(F.dropout(F.matmul(x, W), 0.4) ** 2)

    jf = tj.jit(f)
    r = rng(21)
    xs = [r.standard_normal((6, 5)) for _ in range(N_CALLS + 2)]
    Ws = [r.standard_normal((5, 7)) for _ in range(N_CALLS + 2)]
    np.random.seed(0)
    res_j = []
    for x, W in zip(xs, Ws):
        Wv = Variable(W.copy())
        y = jf(x, Wv)
        y.backward()
        res_j.append((y.data.copy(), Wv.grad.data.copy()))
    np.random.seed(0)
    res_e = []
    for x, W in zip(xs, Ws):
        Wv = Variable(W.copy())
        y = f(x, Wv)
        y.backward()
        res_e.append((y.data.copy(), Wv.grad.data.copy()))
    for (yj, gj), (ye, ge) in zip(res_j, res_e):
        np.testing.assert_allclose(yj, ye, rtol=1e-10)
        np.testing.assert_allclose(gj, ge, rtol=1e-10, atol=1e-12)
    # the same stream position afterwards
    after_j = None
    np.random.seed(0)
    for x, W in zip(xs, Ws):
        jf(x, Variable(W))
    after_j = np.random.rand()
    np.random.seed(0)
    for x, W in zip(xs, Ws):
        f(x, Variable(W))
    assert after_j == np.random.rand()
    info = jf.cache_info()
    assert info["hits"] >= 3
    no_fallbacks(jf)


def test_dropout_test_mode_is_deterministic_variant():
    def f(x):
        return F.dropout(x, 0.5) * 2.0

    jf = tj.jit(f)
    with tj.test_mode():
        for i in range(N_CALLS):
            xa = np.arange(4.0) + i
            assert_close(jf(Variable(xa)), f(Variable(xa)))
    no_fallbacks(jf)


def test_print_inside_warns_runs_only_while_tracing(capsys):
    def f(x):
        print(f"x is {x.data}")
        return x * 2

    jf = tj.jit(f)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always", tj.JitWarning)
        for i in range(N_CALLS):
            xa = np.arange(3.0) + i
            xj, xe = Variable(xa.copy()), Variable(xa.copy())
            yj = jf(xj)
            assert_close(yj, f(xe))
            F.sum(yj).backward()
            F.sum(f(xe)).backward()
            assert_grad_close(xj, xe)
    jw = [str(w.message) for w in rec if issubclass(w.category, tj.JitWarning)]
    assert len(jw) == 1, jw
    assert "only while tracing" in jw[0]
    assert "print" in jw[0] or "format" in jw[0]
    no_fallbacks(jf)


def test_python_attribute_mutation_falls_back():
    class Counter:
        def __init__(self):
            self.t = 0

    c_j, c_e = Counter(), Counter()

    def make(c):
        def f(x):
            c.t += 1
            return x * c.t
        return f

    fe = make(c_e)
    jf = tj.jit(make(c_j))
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always", tj.JitWarning)
        for i in range(N_CALLS):
            xa = np.arange(3.0) + i
            assert_close(jf(Variable(xa)), fe(Variable(xa)))
            assert c_j.t == c_e.t
    jw = [str(w.message) for w in rec if issubclass(w.category, tj.JitWarning)]
    assert len(jw) == 1, jw
    assert "Counter.t" in jw[0]
    assert jf.cache_info()["fallbacks"] >= 1


def test_exception_inside_propagates():
    def f(x, n):
        y = F.tanh(x)
        if y.data.sum() > 100:
            raise RuntimeError("too big")
        if n == 0:
            raise KeyError("n is zero")
        return y

    jf = tj.jit(f)
    for i in range(N_CALLS):
        xa = np.arange(3.0) + i
        assert_close(jf(Variable(xa), 1), f(Variable(xa), 1))
    for i in range(3):
        with pytest.raises(KeyError, match="n is zero"):
            jf(Variable(np.arange(3.0)), 0)
    g = lambda x: f(x, 1) if x.data.sum() < 10 else (_ for _ in ()).throw(
        ValueError("big sum"))
    jg = tj.jit(g)
    for i in range(N_CALLS):
        with pytest.raises(ValueError, match="big sum"):
            jg(Variable(np.full(3, 10.0 + i)))
        assert_close(jg(Variable(np.full(3, 0.5 * i))), g(Variable(np.full(3, 0.5 * i))))
    no_fallbacks(jf)


def test_exception_midway_after_warm_and_trace():
    def f(x):
        y = x * 2
        if float(y.data[0]) > 50:
            raise ArithmeticError("over 50")
        return y

    jf = tj.jit(f)
    for v in [1.0, 2.0, 20.0, 3.0, 4.0, 5.0]:
        with pytest.raises(ArithmeticError, match="over 50"):
            jf(Variable(np.array([v + 100])))
        assert_close(jf(Variable(np.array([v]))), f(Variable(np.array([v]))))


def test_bad_input_non_broadcastable_raises_value_error():
    def f(x, y):
        return x + y

    jf = tj.jit(f)
    for i in range(N_CALLS):
        assert_close(jf(Variable(np.ones(3) * i), Variable(np.ones(3))),
                     f(Variable(np.ones(3) * i), Variable(np.ones(3))))
    for i in range(3):
        with pytest.raises(ValueError) as e_j:
            jf(Variable(np.ones(3)), Variable(np.ones(4)))
        with pytest.raises(ValueError) as e_e:
            f(Variable(np.ones(3)), Variable(np.ones(4)))
        assert "(3,)" in str(e_j.value) and "(4,)" in str(e_j.value)
        assert type(e_j.value) is type(e_e.value)
    no_fallbacks(jf)


def test_unhashable_nonarray_argument_raises_type_error():
    jf = tj.jit(lambda x, s: x * len(s))
    with pytest.raises(TypeError):
        jf(Variable(np.ones(2)), {1, 2})


def test_jit_keeps_no_argument_alive():
    import gc
    import weakref

    jf = tj.jit(lambda x: F.sum(F.tanh(x) * 2))
    refs = []
    for i in range(N_CALLS):
        x = Variable(np.arange(3.0) + i)
        y = jf(x)
        y.backward()
        refs.append(weakref.ref(x))
        del x, y
    gc.collect()
    assert [r() is None for r in refs] == [True] * N_CALLS
    no_fallbacks(jf)


@pytest.mark.parametrize("kind", ["ndarray", "variable"])
def test_inplace_write_into_argument_replayed(kind):
    if kind == "ndarray":
        def f(x, a):
            a += 1.0
            return x * a
    else:
        def f(x, a):
            a.data += 1.0
            return x * a

    jf = tj.jit(f)
    for i in range(N_CALLS):
        aj, ae = np.arange(3.0) + i, np.arange(3.0) + i
        if kind == "variable":
            aj, ae = Variable(aj), Variable(ae)
        xa = np.linspace(-1, 1, 3) * i
        yj, ye = jf(Variable(xa), aj), f(Variable(xa), ae)
        assert_close(yj, ye)
        np.testing.assert_array_equal(_arr(aj), _arr(ae))
    no_fallbacks(jf)


@pytest.mark.parametrize("form", ["identity", "noop_reshape"])
def test_returned_argument_gets_gradient(form):
    if form == "identity":
        f = lambda x, y: (x, y * 2)
    else:
        f = lambda x, y: (F.reshape(x, x.shape), y * 2)
    jf = tj.jit(f)
    r = rng(34)
    for i in range(N_CALLS):
        xa, ya = r.standard_normal(3), r.standard_normal(3)
        xj, yj_ = Variable(xa.copy()), Variable(ya.copy())
        xe, ye_ = Variable(xa.copy()), Variable(ya.copy())
        (aj, bj), (ae, be) = jf(xj, yj_), f(xe, ye_)
        assert_close((aj, bj), (ae, be))
        F.sum(aj * bj).backward()
        F.sum(ae * be).backward()
        assert_grad_close(xj, xe)
        assert_grad_close(yj_, ye_)
    no_fallbacks(jf)


def test_nested_jit():
    inner = tj.jit(lambda x: F.sin(x) * x)

    def outer(x):
        return F.sum(inner(x) + x)

    def eager(x):
        return F.sum(F.sin(x) * x + x)

    jo = tj.jit(outer)
    r = rng(26)
    for i in range(N_CALLS):
        xa = r.standard_normal(3)
        xj, xe = Variable(xa.copy()), Variable(xa.copy())
        yj, ye = jo(xj), eager(xe)
        assert_close(yj, ye)
        yj.backward()
        ye.backward()
        assert_grad_close(xj, xe)
    no_fallbacks(jo)


def test_gradient_accumulates_across_compiled_calls():
    f = lambda x: F.sum(F.tanh(x))
    jf = tj.jit(f)
    r = rng(27)
    for i in range(N_CALLS):
        xa = r.standard_normal(3)
        xj, xe = Variable(xa.copy()), Variable(xa.copy())
        (jf(xj) + jf(xj * 3)).backward()
        (f(xe) + f(xe * 3)).backward()
        assert_grad_close(xj, xe)
        jf(xj).backward()
        f(xe).backward()
        assert_grad_close(xj, xe)
    no_fallbacks(jf)


def test_retain_grad_on_compiled_output():
    g = lambda x: F.tanh(x) * 3
    jf = tj.jit(g)
    r = rng(28)
    for i in range(N_CALLS):
        xa = r.standard_normal(3)
        xj, xe = Variable(xa.copy()), Variable(xa.copy())
        yj, ye = jf(xj), g(xe)
        F.sum(yj * yj).backward(retain_grad=True)
        F.sum(ye * ye).backward(retain_grad=True)
        assert_grad_close(yj, ye)
        assert_grad_close(xj, xe)
    no_fallbacks(jf)


def test_int_dtype_arrays_correct():
    f = lambda x: x * 2 + 1
    jf = tj.jit(f)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tj.JitWarning)   # ints may run eagerly, with a warning
        for i in range(N_CALLS):
            a = np.arange(3) + i
            yj, ye = jf(Variable(a)), f(Variable(a))
            assert_close(yj, ye)


def test_check_mode_agrees():
    g = lambda x, s: F.tanh(x) * s
    jf = tj.jit(g, check=True)
    r = rng(29)
    for i in range(N_CALLS):
        xa, s = r.standard_normal(3), float(r.uniform(0.5, 2))
        xj, xe = Variable(xa.copy()), Variable(xa.copy())
        yj, ye = jf(xj, s), g(xe, s)
        assert_close(yj, ye)
        F.sum(yj).backward()
        F.sum(ye).backward()
        assert_grad_close(xj, xe)
    assert jf.cache_info()["hits"] >= 1
    no_fallbacks(jf)


def test_captured_parameter_changes_shape():
    p = Parameter(np.ones(3), name="p")
    g = lambda x: F.sum(x * p)
    jf = tj.jit(g)
    r = rng(30)
    for i in range(N_CALLS * 2):
        if i == N_CALLS:
            p.data = r.standard_normal((2, 3))
        else:
            p.data = r.standard_normal(p.shape)
        xa = r.standard_normal(3)
        p.cleargrad()
        yj = jf(Variable(xa))
        yj.backward()
        gj = p.grad.data.copy()
        p.cleargrad()
        ye = g(Variable(xa))
        ye.backward()
        assert_close(yj, ye)
        np.testing.assert_allclose(gj, p.grad.data, rtol=1e-12)
    no_fallbacks(jf)


def test_non_array_outputs_are_constants():
    jf = tj.jit(lambda x, n: (x * 2, n, None, "s"))
    for i in range(N_CALLS):
        out = jf(Variable(np.arange(2.0) + i), 3)
        assert out[1:] == (3, None, "s")
        np.testing.assert_array_equal(out[0].data, (np.arange(2.0) + i) * 2)
    no_fallbacks(jf)


def test_mask_from_data_comparison():
    def f(x):
        mask = x.data > 0
        return F.sum(x * Variable(mask.astype(x.dtype)) + F.relu(-x) * 0.5)

    jf = tj.jit(f)
    r = rng(31)
    for i in range(N_CALLS):
        xa = r.standard_normal(5)
        xj, xe = Variable(xa.copy()), Variable(xa.copy())
        yj, ye = jf(xj), f(xe)
        assert_close(yj, ye)
        yj.backward()
        ye.backward()
        assert_grad_close(xj, xe)
    no_fallbacks(jf)


def test_softmax_cross_entropy_with_int_labels():
    jf = tj.jit(F.softmax_cross_entropy)
    r = rng(32)
    for i in range(N_CALLS):
        xa, t = r.standard_normal((4, 3)), r.integers(0, 3, 4)
        xj, xe = Variable(xa.copy()), Variable(xa.copy())
        yj, ye = jf(xj, t), F.softmax_cross_entropy(xe, t)
        assert_close(yj, ye)
        yj.backward()
        ye.backward()
        assert_grad_close(xj, xe)
    no_fallbacks(jf)


def test_accuracy_compiles():
    jf = tj.jit(F.accuracy)
    r = rng(33)
    for i in range(N_CALLS):
        xa, t = r.standard_normal((6, 3)), r.integers(0, 3, 6)
        assert_close(jf(xa, t), F.accuracy(xa, t))
    no_fallbacks(jf)


# ============================================================== 7. disabling

def _printing(x):
    print("CALLED", float(x.data.sum()))
    return x * 3


def test_disable_jit_runs_plain_python(capsys):
    jf = tj.jit(_printing)
    with tj.disable_jit():
        for i in range(N_CALLS):
            y = jf(Variable(np.arange(2.0) + i))
            np.testing.assert_allclose(y.data, (np.arange(2.0) + i) * 3)
    out = capsys.readouterr().out
    assert out.count("CALLED") == N_CALLS
    assert jf.cache_info()["variants"] == 0


def test_eager_method_runs_plain_python(capsys):
    jf = tj.jit(_printing)
    for i in range(N_CALLS):
        y = jf.eager(Variable(np.arange(2.0) + i))
        np.testing.assert_allclose(y.data, (np.arange(2.0) + i) * 3)
    assert capsys.readouterr().out.count("CALLED") == N_CALLS
    assert jf.cache_info()["variants"] == 0


@tj.jit
def _module_level_jitted(x):
    print("CALLED")
    return x * 3


def test_env_disable_after_decoration(monkeypatch, capsys):
    monkeypatch.setenv("TRACEJIT_DISABLE", "1")
    for i in range(N_CALLS):
        y = _module_level_jitted(Variable(np.arange(2.0) + i))
        np.testing.assert_allclose(y.data, (np.arange(2.0) + i) * 3)
    assert capsys.readouterr().out.count("CALLED") == N_CALLS
    assert _module_level_jitted.cache_info()["variants"] == 0


def test_env_disable(monkeypatch, capsys):
    monkeypatch.setenv("TRACEJIT_DISABLE", "1")
    jf = tj.jit(_printing)
    for i in range(N_CALLS):
        y = jf(Variable(np.arange(2.0) + i))
        np.testing.assert_allclose(y.data, (np.arange(2.0) + i) * 3)
    assert capsys.readouterr().out.count("CALLED") == N_CALLS
    assert jf.cache_info()["variants"] == 0


# ============================================================== 8. float32

def test_float32_stays_float32():
    def f(x, w):
        return F.tanh(x * 2.0) + w * 0.5 - 1, F.sum(x * w) / 3.0

    jf = tj.jit(f)
    r = rng(22)
    for i in range(N_CALLS):
        xa = r.standard_normal(4).astype(np.float32)
        wa = r.standard_normal(4).astype(np.float32)
        xj, wj = Variable(xa.copy()), Variable(wa.copy())
        xe, we = Variable(xa.copy()), Variable(wa.copy())
        (aj, bj), (ae, be) = jf(xj, wj), f(xe, we)
        assert aj.dtype == np.float32 and bj.dtype == np.float32
        assert_close((aj, bj), (ae, be), rtol=1e-6, atol=1e-7)
        (F.sum(aj) + bj).backward()
        (F.sum(ae) + be).backward()
        assert xj.grad.dtype == np.float32 and wj.grad.dtype == np.float32
        assert_grad_close(xj, xe, rtol=1e-6, atol=1e-7)
        assert_grad_close(wj, we, rtol=1e-6, atol=1e-7)
    no_fallbacks(jf)


def test_float32_times_runtime_float_arg():
    def f(x, s):
        return x * s

    jf = tj.jit(f)
    for i in range(N_CALLS):
        xa = (np.arange(3) + i).astype(np.float32)
        s = 0.1 * (i + 1)
        yj, ye = jf(Variable(xa), s), f(Variable(xa), s)
        assert yj.dtype == ye.dtype == np.float32
        assert_close(yj, ye, rtol=1e-6)
    no_fallbacks(jf)


# ============================================================== 9. random programs

from hypothesis import given, settings, strategies as st, HealthCheck  # noqa: E402
from tracejit.testing import strategies as tjst  # noqa: E402


@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck),
          derandomize=True, database=None)
@given(data=st.data(), dtype=st.sampled_from([np.float64, np.float32]))
def test_random_programs_jit_matches_eager(data, dtype):
    prog, inputs = data.draw(tjst.programs(dtype=dtype))
    jf = tj.jit(prog)
    rtol, atol = (1e-9, 1e-11) if dtype == np.float64 else (2e-4, 1e-5)
    shapes = [a.shape for a in inputs]
    r = np.random.default_rng(len(shapes))
    for call in range(N_CALLS):
        if call == 0:
            arrays = inputs
        else:
            arrays = [r.uniform(-2, 2, s).astype(dtype) for s in shapes]
        xj = [Variable(a.copy()) for a in arrays]
        xe = [Variable(a.copy()) for a in arrays]
        yj, ye = jf(*xj), prog(*xe)
        assert_close(yj, ye, rtol, atol)
        F.sum(yj * 1.5).backward()
        F.sum(ye * 1.5).backward()
        for a, b in zip(xj, xe):
            assert_grad_close(a, b, rtol, atol)
    info = jf.cache_info()
    assert info["variants"] == 1 and info["hits"] >= N_CALLS - 3, info
    no_fallbacks(jf)


# ============================================================== 10. eval_shape

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


# ============================================================== 11. gradcheck jit=True

def test_gradcheck_with_jit():
    from tracejit.testing import gradcheck
    r = rng(23)
    f = lambda x, y: F.tanh(F.matmul(x, y)) * 2 + F.sum(x)
    assert gradcheck(f, r.standard_normal((3, 4)), r.standard_normal((4, 2)), jit=True)


# ============================================================== 12. threads

def f_threads(x, W):
    # A longer chain: tracing takes long enough for the threads to overlap.
    h = F.matmul(x, W)
    for _ in range(40):
        h = F.tanh(h) * 1.01 + 0.01
    return F.sum(h ** 2)


def test_threads_correct_results():
    """4 threads, one cold jitted function: every call gets eager's value and gradient."""
    try:
        for rep in range(3):
            _run_threads(tj.jit(f_threads), rep)
            assert tj.Config.enable_backprop is True
    finally:
        tj.Config.enable_backprop = True     # a failure must not leak into other tests


def test_threads_cold_cache_compiles_once():
    for rep in range(5):
        jf = tj.jit(f_threads)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                _run_threads(jf, rep, check=False)
            finally:
                tj.Config.enable_backprop = True
        info = jf.cache_info()
        assert info["variants"] == 1, info


def _run_threads(jf, seed, check=True):
    f = f_threads
    r = rng(100 + seed)
    n_threads, n_calls = 4, 6
    inputs = [[(r.standard_normal((3, 4)), r.standard_normal((4, 2))) for _ in range(n_calls)]
              for _ in range(n_threads)]
    results = [[None] * n_calls for _ in range(n_threads)]
    errors = []
    barrier = threading.Barrier(n_threads)

    def work(k):
        try:
            barrier.wait()
            for i, (x, W) in enumerate(inputs[k]):
                Wv = Variable(W.copy())
                y = jf(x, Wv)
                y.backward()
                results[k][i] = (y.data.copy(),
                                 None if Wv.grad is None else Wv.grad.data.copy())
        except BaseException as e:       # pragma: no cover - reported below
            errors.append(e)

    ts = [threading.Thread(target=work, args=(k,)) for k in range(n_threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if not check:
        return
    assert not errors, errors
    assert tj.Config.enable_backprop is True
    for k in range(n_threads):
        for i, (x, W) in enumerate(inputs[k]):
            Wv = Variable(W.copy())
            y = f(x, Wv)
            y.backward()
            np.testing.assert_allclose(results[k][i][0], y.data, rtol=1e-10)
            assert results[k][i][1] is not None, f"thread {k} call {i}: no gradient"
            np.testing.assert_allclose(results[k][i][1], Wv.grad.data, rtol=1e-10)
    no_fallbacks(jf)
