"""f.trace(...) and f.backward_graph(...): the graph these arguments select, optimized or
as traced (the header says which), without running the function's effects; captured
values print under their Python names; to_dot() shows kernels, guards, saved values.

trace() runs no effect of the function unless its warm-up creates state a later call
needs (a lazy W, an optimizer's buffers); a Layer's per-call bookkeeping (`inputs`,
`outputs`) is not such state. After trace(), calls match eager step by step and
cache_info() counts only the calls."""
import re

import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F
import tracejit.layers as L
import tracejit.optimizers as O
from tracejit import Parameter, Variable

from tracejit.testing.checks import assert_call_matches_eager

N_CALLS = 6          # >= 5: warm-up, trace, then at least 3 replays

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")


def _close(a, b):
    np.testing.assert_allclose(np.asarray(getattr(a, "data", a)),
                               np.asarray(getattr(b, "data", b)), rtol=1e-12, atol=1e-12)


def grow(x):
    y = x
    while y.data < 100:
        y = y * 2 + 1
    return y


def _trips(graph):
    """Loop trips of grow's traced graph: the guards that saw True."""
    return sum(n.kind == "guard" and n.fn.expected for n in graph.nodes)


def test_trace_shows_the_variant_these_arguments_select():
    jf = tj.jit(grow)
    for x in (50.0, 50.5, 51.0, 3.0, 3.5, 4.0):      # variants for 1 and 5 trips
        _close(jf(Variable(np.array(x))), grow(Variable(np.array(x))))
    assert jf.cache_info()["variants"] == 2
    assert _trips(jf.trace(Variable(np.array(3.0)), optimized=False)) == 5
    assert _trips(jf.trace(Variable(np.array(50.0)), optimized=False)) == 1
    # Whichever variant ran last: the selection is by these arguments' guard outcomes.
    jf(Variable(np.array(60.0)))
    assert _trips(jf.trace(Variable(np.array(3.0)), optimized=False)) == 5
    # A trip count not traced yet (x = 20: 3 trips) is traced for the picture.
    assert _trips(jf.trace(Variable(np.array(20.0)), optimized=False)) == 3
    for x in (20.0, 21.0, 3.0, 50.0):
        _close(jf(Variable(np.array(x))), grow(Variable(np.array(x))))


def _make_step():
    W = Parameter(np.linspace(-1, 1, 6).reshape(3, 2))
    log = []

    def step(x):
        log.append(1)
        loss = F.sum(F.tanh(F.matmul(x, W)) ** 2)
        W.data -= 0.1 * W.data
        return loss
    return W, log, step


def test_trace_runs_no_effect_of_the_function():
    Wj, logj, stepj = _make_step()
    We, loge, stepe = _make_step()
    jf = tj.jit(stepj)
    x = np.linspace(0, 1, 12).reshape(4, 3)
    w0 = Wj.data.copy()
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tj.JitWarning)     # log.append: tracing only
        g = jf.trace(x)                               # cold: warm-up and trace, undone
        assert "matmul" in str(g)
        np.testing.assert_array_equal(Wj.data, w0)
        assert logj == [] and jf.cache_info()["calls"] == 0
        for k in range(4):
            xk = x + k
            _close(jf(xk), stepe(xk))
            _close(Wj, We)
            w_now = Wj.data.copy()
            jf.trace(xk)                              # warm: runs the graph's guards only
            jf.backward_graph(xk)
            np.testing.assert_array_equal(Wj.data, w_now)
    assert jf.cache_info()["calls"] == 4


def test_optimized_and_traced_graphs_and_their_headers():
    def f(x, w):
        h = F.tanh(x * w + 1.0)
        return F.sum(h * h)

    jf = tj.jit(f)
    r = np.random.default_rng(0)
    for _ in range(3):
        x, w = r.standard_normal((4, 3)), Variable(r.standard_normal((4, 3)))
        y = jf(x, w)
        ye = f(x, Variable(w.data.copy()))
        _close(y, ye)
    opt, raw = jf.trace(x, w), jf.trace(x, w, optimized=False)
    assert str(opt).splitlines()[0].endswith("# forward, optimized")
    assert str(raw).splitlines()[0].endswith("# forward, as traced")
    assert any(n.kind == "fused" for n in opt.nodes)
    assert not any(n.kind == "fused" for n in raw.nodes)
    assert opt.summary()["ops"] == raw.summary()["ops"]       # the same ops, grouped
    assert opt.summary()["kernels"] >= 1
    bwd = jf.backward_graph(x, w)
    assert str(bwd).splitlines()[0].endswith("# backward, optimized")
    assert str(jf.backward_graph(x, w, optimized=False)).splitlines()[0].endswith(
        "# backward, as traced")
    # What the forward keeps for the backward is marked on the return line.
    assert "saved for backward" in str(opt).splitlines()[-1]
    with tj.no_grad():
        assert jf.backward_graph(x, w) is None
        _close(jf(x, w), f(x, w))


class _Net:
    def __init__(self):
        self.l1 = L.Linear(4, in_size=3)


NET = _Net()
SHIFT = np.arange(4.0)


def test_captured_values_print_under_their_python_names():
    W = Parameter(np.eye(4))               # no name= given: the closure's name is used

    def f(x):
        h = F.tanh(NET.l1(x)) + SHIFT
        return F.sum(F.matmul(h, W) ** 2)

    jf = tj.jit(f)
    r = np.random.default_rng(1)
    for k in range(3):
        x = r.standard_normal((5, 3))
        W.data += 0.1
        _close(jf(x), f(x))
    text = str(jf.trace(x))
    header = text.splitlines()[0]
    for name in ("x:", "NET.l1.W:", "NET.l1.b:", "SHIFT:", "W:"):
        assert name in header, text
    # The float32 weight of the float64 product is cast once per call (passes/
    # matmul_batching), by a kernel that reads it under its name.
    cast = re.search(r"(t\d+): f64\[3, 4\] = fused\[label='cast'\] NET\.l1\.W\b", text)
    assert cast, text
    assert f"matmul x {cast.group(1)}" in text, text
    assert re.search(r"fused\[label='add_tanh'\] t\d+ NET\.l1\.b SHIFT", text), text
    dot = jf.trace(x).to_dot()
    assert '"NET.l1.W"' in dot and '"SHIFT"' in dot


def test_to_dot_draws_kernels_guards_and_saved_values():
    def f(x):
        h = F.sigmoid(x * 2.0) + 1.0
        if h.data.mean() > 1.5:
            h = h * 3.0
        return F.sum(F.exp(h))

    jf = tj.jit(f)
    r = np.random.default_rng(2)
    for _ in range(3):
        x = Variable(r.standard_normal(6))
        y = jf(x)
        _close(y, f(Variable(x.data)))
        y.backward()
    g = jf.trace(x)
    dot = g.to_dot()
    assert dot.startswith("digraph") and dot.rstrip().endswith("}")
    assert dot.count("subgraph cluster_") == sum(n.kind == "fused" for n in g.nodes) >= 1
    assert "shape=diamond, color=red" in dot and "guard bool(" in dot
    assert "saved for backward" in dot
    assert "peripheries=2" in dot                     # the result
    assert dot.count("{") == dot.count("}")


def test_trace_of_a_signature_that_runs_eagerly_says_why():
    def f(x):
        return x * float(np.sum(x.data.tolist()))     # .tolist(): an escape

    jf = tj.jit(f)
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tj.JitWarning)
        for k in range(3):
            x = Variable(np.arange(3.0) + k)
            _close(jf(x), f(x))
        with pytest.raises(RuntimeError, match="runs eagerly.*tolist"):
            jf.trace(x)


def test_arguments_of_a_transformed_function_print_under_its_names():
    def gp(x, y):
        return (x + y) ** 2 * x

    jf = tj.jit(tj.value_and_grad(gp, argnums=(0, 1)))
    vg = tj.value_and_grad(gp, argnums=(0, 1))
    for k in range(3):
        x, y = np.array(0.5 + k), np.array(-1.0 - k)
        (v, (gx, gy)), (ve, (gxe, gye)) = jf(x, y), vg(x, y)
        for a, b in ((v, ve), (gx, gxe), (gy, gye)):
            _close(a, b)
    assert str(jf.trace(x, y)).startswith("graph value_and_grad_gp(x: f64[], y: f64[]")


def test_a_cold_trace_whose_warm_up_creates_state_keeps_it_as_a_call():
    import tracejit.models as M
    import tracejit.optimizers as O

    def make():
        model = M.MLP((8, 3))                        # lazy: W is made by the first call
        opt = O.MomentumSGD(0.1).setup(model)        # its buffers too

        def step(x, t):
            loss = F.softmax_cross_entropy(model(x), t)
            model.cleargrads()
            loss.backward()
            opt.update()
            return loss
        return model, step

    mj, sj = make()
    me, se = make()
    js = tj.jit(sj)
    x, t = np.linspace(0, 1, 24).reshape(6, 4), np.array([0, 1, 2, 0, 1, 2])
    np.random.seed(5)
    js.trace(x, t)          # the warm-up (a real step, counted as one) stays: W exists
    np.random.seed(5)
    se(x, t)
    assert js.cache_info()["calls"] == 1
    for k in range(4):
        xk = x + k
        _close(js(xk, t), se(xk, t))
        for p, q in zip(mj.params(), me.params()):
            np.testing.assert_allclose(p.data, q.data, rtol=1e-5, atol=1e-6)
        if k == 1:
            js.trace(xk, t)          # warm now: no effect
            js.backward_graph(xk, t)
    info = js.cache_info()
    assert info["calls"] == 5 and info["fallbacks"] == 0


def test_trace_puts_back_nested_parameters_and_optimizer_buffers():
    import tracejit.models as M
    import tracejit.optimizers as O

    class Block(M.Model):
        def __init__(self):
            super().__init__()
            self.l1 = L.Linear(3, in_size=4)

    class Net(M.Model):
        def __init__(self):
            super().__init__()
            self.enc = Block()                       # net.enc.l1.W: three levels down
            self.l2 = L.Linear(2, in_size=3)

        def forward(self, x):
            return self.l2(F.tanh(self.enc.l1(x)))

    def make():
        np.random.seed(3)
        net = Net()
        opt = O.MomentumSGD(0.1).setup(net)

        def step(x):
            loss = F.sum(net(x) ** 2)
            net.cleargrads()
            loss.backward()
            opt.update()
            return loss
        return net, opt, step

    nj, oj, sj = make()
    ne, oe, se = make()
    js = tj.jit(sj)
    for k in range(5):
        x = np.linspace(-1, 1, 20).reshape(5, 4) * (k + 1)
        _close(js(x), se(x))
        params = [p.data.copy() for p in nj.params()]
        bufs = {i: b.data.copy() for i, b in oj.vs.items()}
        js.trace(x * 0.5)
        js.trace(x * 0.5, optimized=False)
        for a, p in zip(params, nj.params()):
            np.testing.assert_array_equal(a, p.data)
        for i, b in oj.vs.items():
            np.testing.assert_array_equal(bufs[i], b.data)
        for p, q in zip(nj.params(), ne.params()):
            np.testing.assert_allclose(p.data, q.data, rtol=1e-5, atol=1e-6)
    assert js.cache_info()["fallbacks"] == 0


def _graph(x, W, b):
    h = F.tanh(F.matmul(x, W) + b)
    return F.sum(h * h - 0.5 * h) / 3.0


def test_trace_returns_printable_graph():
    jf = tj.jit(_graph)
    r = np.random.default_rng(9)
    x, W, b = r.standard_normal((2, 3)), Variable(r.standard_normal((3, 2))), r.standard_normal(2)
    g = jf.trace(x, W, b)
    text = str(g)
    assert "tanh" in text.lower()
    # still correct afterwards, on new values
    for i in range(N_CALLS):
        x, Wa, b = r.standard_normal((2, 3)), r.standard_normal((3, 2)), r.standard_normal(2)
        assert_call_matches_eager(jf, _graph, x, Variable(Wa), b, backward=False,
                                  rtol=1e-10, atol=1e-12)
    assert jf.cache_info()["fallbacks"] == 0, jf.cache_info()


def _make(opt_cls, **kw):
    np.random.seed(0)
    model = L.Linear(2, in_size=3)           # W exists before any call
    opt = opt_cls(**kw).setup(model)          # plain SGD: no buffers to create

    def step(x):
        loss = F.sum(model(x) ** 2)
        model.cleargrads()
        loss.backward()
        opt.update()
        return loss
    return model, step


def test_trace_before_the_first_call_of_a_model_step_applies_no_step():
    mj, sj = _make(O.SGD, lr=0.1)
    me, se = _make(O.SGD, lr=0.1)
    js = tj.jit(sj)
    xs = [np.random.default_rng(k).standard_normal((4, 3)) for k in range(5)]
    W0, b0 = mj.W.data.copy(), mj.b.data.copy()
    js.trace(xs[0])
    np.testing.assert_array_equal(mj.W.data, W0)
    np.testing.assert_array_equal(mj.b.data, b0)
    assert mj.W.grad is None
    assert js.cache_info()["calls"] == 0
    for k, x in enumerate(xs):
        np.testing.assert_allclose(js(x).data, se(x).data, rtol=1e-6)
        np.testing.assert_allclose(mj.W.data, me.W.data, rtol=1e-6)
        if k == 2:
            js.trace(x * 0.5)
    info = js.cache_info()
    assert info["calls"] == 5 and info["fallbacks"] == 0
    assert info["hits"] == info["calls"] - info["misses"]
