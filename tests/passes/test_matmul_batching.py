"""passes.batch_matmuls: fewer, larger matrix products, with eager's results.

Where it rewrites (the optimized graph's op counts): a product over a contraction of
length 1 becomes a multiply; a sum of products (with other terms) becomes one product of
joined blocks; small independent products sharing an operand become one product and its
blocks; DeZero's LSTM unrolled over time steps gets all three. Where it must not: other
shapes, a product that depends on another of the group, a product read twice, a large
product, integer products. And jit against eager (values, first and second order
gradients) over generated shapes, call after call with new values and with the
captured Parameters changed between calls.
"""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import tracejit as tj
import tracejit.functions as F
import tracejit.layers as L
from tracejit import Parameter, Variable
from tracejit import optimizers
from tracejit.passes import matmul_batching, pipeline
from tracejit.testing import assert_jit_matches_eager

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")


def ops(g):
    return g.summary()["ops"]


def without_batching():
    return tuple(p for p in pipeline.PIPELINE if p is not matmul_batching.batch_matmuls)


def rnd(shape, seed, dtype=np.float64):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


# ---------------------------------------------------------------- where it rewrites

def test_a_contraction_of_length_one_is_a_multiply():
    def f(x, w):
        return F.tanh(F.matmul(x, w))
    g = tj.jit(f).trace(Variable(rnd((6, 1), 0)), Variable(rnd((1, 5), 1, np.float32)))
    assert ops(g).get("matmul", 0) == 0 and ops(g)["mul"] == 1


def test_a_float32_weight_read_by_float64_products_is_cast_once():
    # NumPy casts the float32 operand on every call; the graph casts it once.
    W = Parameter(rnd((4, 4), 0, np.float32))

    def f(h):
        for _ in range(5):
            h = F.tanh(F.matmul(h, W))
        return h
    g = tj.jit(f).trace(Variable(rnd((3, 4), 1)))
    assert ops(g)["matmul"] == 5 and ops(g)["cast"] == 1


def test_the_backward_reads_the_transpose_of_the_forwards_cast(monkeypatch):
    # A training step inside jit: the forward's h @ W and the backward's g @ W.T read
    # one cast of W (the transpose of the cast is a view), not one cast each.
    W = Parameter(rnd((4, 4), 0, np.float32))

    def step(h):
        y = h
        for _ in range(3):
            y = F.tanh(F.matmul(y, W))
        loss = F.sum(y * y)
        W.cleargrad()
        loss.backward()
        return loss
    h = Variable(rnd((3, 4), 1))
    batched = ops(tj.jit(step).trace(h))
    plain = ops(_traced_without_batching(step, monkeypatch, h))
    assert batched.get("cast", 0) == plain.get("cast", 0) + 1, (batched, plain)


def test_a_sum_of_products_is_one_product_of_joined_blocks():
    def f(a1, b1, a2, b2, a3, b3, c):
        return F.matmul(a1, b1) + c + F.matmul(a2, b2) + F.matmul(a3, b3)
    args = [Variable(rnd(s, k)) for k, s in enumerate(
        [(4, 3), (3, 5), (4, 2), (2, 5), (4, 6), (6, 5), (5,)])]
    g = tj.jit(f).trace(*args)
    assert ops(g)["matmul"] == 1 and ops(g)["concat"] == 2 and ops(g)["add"] == 1


def test_small_products_sharing_an_operand_are_one_product():
    def left(a, b1, b2, b3):
        return F.matmul(a, b1), F.tanh(F.matmul(a, b2)), F.matmul(a, b3) * 2

    def right(a1, a2, b):
        return F.matmul(a1, b), F.matmul(a2, b)
    g = tj.jit(left).trace(*[Variable(rnd(s, k)) for k, s in
                             enumerate([(3, 4), (4, 5), (4, 5), (4, 5)])])
    assert ops(g)["matmul"] == 1 and ops(g)["concat"] == 1 and ops(g)["get_item"] == 3
    g = tj.jit(right).trace(*[Variable(rnd(s, k)) for k, s in
                              enumerate([(3, 4), (3, 4), (4, 5)])])
    assert ops(g)["matmul"] == 1 and ops(g)["concat"] == 1


def test_the_backward_sums_its_weight_gradients_over_time_steps_in_one_product():
    # h_{t+1} = tanh(h_t @ W): W's gradient is sum_t h_t^T @ g_t, one product; the
    # forward's products depend on each other and stay one per step.
    W = Parameter(rnd((5, 5), 0) * 0.5)

    def f(h):
        for _ in range(6):
            h = F.tanh(F.matmul(h, W))
        return F.sum(h * h)
    h = Variable(rnd((3, 5), 1))
    jf = tj.jit(f)
    for _ in range(3):
        jf(h).backward()
    fwd = ops(jf.trace(h))
    bwd = ops(jf.backward_graph(h))
    assert fwd["matmul"] == 6
    # 6 input gradients (one a step, each depends on the one after) and one for W.
    assert bwd["matmul"] == 7 and bwd["concat"] == 2


def _lstm_window(m, opt, xs, ts):
    def window():
        loss = 0
        for x, t in zip(xs, ts):
            loss = loss + F.mean_squared_error(m(x), t)
        m.cleargrads()
        loss.backward()
        loss.unchain_backward()
        opt.update()
        return loss
    return window


class _RNN(tj.Model):
    def __init__(self, hidden):
        super().__init__()
        self.rnn = L.LSTM(hidden)
        self.fc = L.Linear(1)

    def forward(self, x):
        return self.fc(self.rnn(x))


def _lstm_models(hidden, xs):
    made = []
    for _ in range(2):
        np.random.seed(0)
        m = _RNN(hidden)
        m(xs[0])
        m(xs[0])                   # the second call creates the h2* weights
        m.rnn.reset_state()
        made.append((m, optimizers.Adam().setup(m)))
    return made


def test_the_lstm_training_window_matches_eager_with_fewer_products(monkeypatch):
    # The book's step 60 at a small size: float32 weights, a float64 input of one
    # feature (the x2* products are multiplies), the state carried across windows.
    T, B, H = 5, 3, 4
    xs = [rnd((B, 1), k) for k in range(T)]
    ts = [rnd((B, 1), 100 + k) for k in range(T)]
    (me, oe), (mj, oj) = _lstm_models(H, xs)
    eager = _lstm_window(me, oe, xs, ts)
    jitted = tj.jit(_lstm_window(mj, oj, xs, ts))
    for call in range(6):
        if call == 3:              # the captured Parameters change between calls
            for m in (me, mj):
                m.rnn.h2f.W.data = m.rnn.h2f.W.data * 0.5
                m.fc.W.data[...] += 0.25
        le, lj = eager(), jitted()
        np.testing.assert_allclose(lj.data, le.data, rtol=1e-6)
        for pe, pj in zip(me.params(), mj.params()):
            np.testing.assert_allclose(pj.data, pe.data, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(mj.rnn.h.data, me.rnn.h.data, rtol=1e-6, atol=1e-9)
    assert jitted.cache_info()["fallbacks"] == 0
    batched = ops(jitted.trace())
    plain = ops(_traced_without_batching(_lstm_window(mj, oj, xs, ts), monkeypatch))
    # The x2* products are multiplies, the weight gradients one product per weight
    # matrix, the h2* input gradients one per step.
    assert plain["matmul"] > 14 * T and batched["matmul"] <= 7 * T + 6, (plain, batched)


def _traced_without_batching(f, monkeypatch, *args):
    with monkeypatch.context() as mp:
        mp.setattr(pipeline, "PIPELINE", without_batching())
        return tj.jit(f).trace(*args)


# ---------------------------------------------------------------- where it must not

def test_products_of_other_shapes_or_dependent_ones_stay_apart():
    def shapes(a, b1, b2):
        return F.matmul(a, b1), F.matmul(a, b2)

    def dependent(a, b):
        y = F.matmul(a, b)
        return y, F.matmul(a, F.tanh(y))

    def read_twice(a1, b1, a2, b2):
        y = F.matmul(a1, b1)
        return y + F.matmul(a2, b2), y

    g = tj.jit(shapes).trace(*[Variable(rnd(s, k)) for k, s in
                               enumerate([(3, 4), (4, 5), (4, 6)])])
    assert ops(g)["matmul"] == 2 and "concat" not in ops(g)
    g = tj.jit(dependent).trace(Variable(rnd((3, 3), 0)), Variable(rnd((3, 3), 1)))
    assert ops(g)["matmul"] == 2 and "concat" not in ops(g)
    g = tj.jit(read_twice).trace(*[Variable(rnd(s, k)) for k, s in
                                   enumerate([(3, 4), (4, 5), (3, 2), (2, 5)])])
    assert ops(g)["matmul"] == 2 and "concat" not in ops(g)


def test_large_products_sharing_an_operand_stay_apart():
    # Above SMALL_PRODUCT the BLAS call's dispatch is not the cost (module docstring).
    def f(a, b1, b2):
        return F.matmul(a, b1), F.matmul(a, b2)
    n = 128                                 # 128**3 multiply-adds > SMALL_PRODUCT
    assert n ** 3 > matmul_batching.SMALL_PRODUCT
    g = tj.jit(f).trace(*[Variable(rnd((n, n), k)) for k in range(3)])
    assert ops(g)["matmul"] == 2 and "concat" not in ops(g)


def test_integer_and_batched_products_are_left_alone():
    def f(a, b, c, d):
        return F.matmul(a, b) + F.matmul(c, d)
    ints = [np.arange(12).reshape(s) for s in [(3, 4), (4, 3), (3, 4), (4, 3)]]
    g = tj.jit(f).trace(*ints)
    assert ops(g)["matmul"] == 2
    stacked = [Variable(rnd(s, k)) for k, s in enumerate([(2, 3, 4), (2, 4, 3)] * 2)]
    g = tj.jit(f).trace(*stacked)
    assert ops(g)["matmul"] == 2


# ---------------------------------------------------------------- jit against eager

def _sum_of_products_case(data, dtype, wdtype=None):
    wdtype = wdtype or dtype
    m = data.draw(st.integers(1, 4), label="m")
    n = data.draw(st.integers(1, 4), label="n")
    ks = data.draw(st.lists(st.integers(1, 4), min_size=2, max_size=4), label="ks")
    bias = data.draw(st.booleans(), label="bias")
    Ws = [Parameter(rnd((k, n), 10 + i, wdtype)) for i, k in enumerate(ks)]
    b = Parameter(rnd((n,), 99, wdtype))

    def f(*As):
        y = F.matmul(As[0], Ws[0])
        if bias:
            y = y + b
        for a, w in zip(As[1:], Ws[1:]):
            y = y + F.matmul(a, w)
        return F.tanh(y)

    def make_args(call):
        for i, w in enumerate(Ws):      # the captured weights change between calls
            w.data = rnd(w.shape, 1000 * call + i, wdtype)
        return [Variable(rnd((m, k), 50 * call + i, dtype)) for i, k in enumerate(ks)]
    return f, make_args, Ws + [b]


def _shared_operand_case(data, dtype):
    m, k, n = (data.draw(st.integers(1, 5), label=s) for s in "mkn")
    count = data.draw(st.integers(2, 4), label="count")
    side = data.draw(st.sampled_from(["left", "right"]), label="side")
    Ws = [Parameter(rnd((k, n) if side == "left" else (m, k), 10 + i, dtype))
          for i in range(count)]

    def f(a):
        y = 0
        for i, w in enumerate(Ws):
            o = F.matmul(a, w) if side == "left" else F.matmul(w, a)
            y = y + F.sum(F.sin(o)) * (i + 1)
        return y

    def make_args(call):
        for i, w in enumerate(Ws):
            w.data = rnd(w.shape, 1000 * call + i, dtype)
        return [Variable(rnd((m, k) if side == "left" else (k, n), 7 + call, dtype))]
    return f, make_args, Ws


@settings(max_examples=12, deadline=None)
@given(data=st.data())
@pytest.mark.parametrize("case", [_sum_of_products_case, _shared_operand_case])
def test_jit_matches_eager_over_generated_shapes(case, data):
    f, make_args, params = case(data, np.float64)
    assert_jit_matches_eager(f, make_args=make_args, params=params, calls=4,
                             second_order=True, backend="interpret")


def _value_and_two_orders(f, Ws, arrays, ct):
    """f's value, gradients and second-order gradients (of the sum of the squared
    gradients) with respect to Ws and the arguments, as arrays."""
    xs = [Variable(a) for a in arrays]
    leaves = list(Ws) + xs
    for v in leaves:
        v.cleargrad()
    y = f(*xs)
    F.sum(y * ct).backward(create_graph=True)
    g1 = [v.grad for v in leaves]
    s = sum(F.sum(g * g) for g in g1)
    for v in leaves:
        v.cleargrad()
    s.backward()
    return [y.data] + [g.data for g in g1] + [v.grad.data for v in leaves]


@settings(max_examples=6, deadline=None)
@given(data=st.data())
@pytest.mark.parametrize("wdtype", [np.float32, np.float64])
def test_float32_sums_of_products_are_as_close_to_float64_as_eager(wdtype, data):
    # float32 (weights float32 or float64): the joined product sums in another order
    # than eager's separate products, so the runtime checks' criterion is the test's:
    # within RTOL/ATOL of eager, or (float32) as close to the float64 twin as eager's
    # own rounding allows (runtime/checking.py array_difference with the twin).
    from tracejit.runtime.checking import array_difference
    m = data.draw(st.integers(1, 4), label="m")
    n = data.draw(st.integers(1, 4), label="n")
    ks = data.draw(st.lists(st.integers(1, 4), min_size=2, max_size=4), label="ks")

    def make(dtype, wd):
        Ws = [Parameter(rnd((k, n), i, wd)) for i, k in enumerate(ks)]

        def f(*As):
            y = F.matmul(As[0], Ws[0])
            for a, w in zip(As[1:], Ws[1:]):
                y = y + F.matmul(a, w)
            return F.tanh(y)
        return f, Ws
    f_e, W_e = make(np.float32, wdtype)
    f_j, W_j = make(np.float32, wdtype)
    f_t, W_t = make(np.float64, np.float64)
    jf = tj.jit(f_j, backend="interpret")
    for call in range(6):
        for side in (W_e, W_j, W_t):    # the captured weights change between calls
            for i, w in enumerate(side):
                w.data = rnd(w.shape, 1000 * call + i, wdtype).astype(w.dtype)
        arrays = [rnd((m, k), 50 * call + i, np.float32) for i, k in enumerate(ks)]
        ct = rnd((m, n), 7 + call, np.float32)
        e = _value_and_two_orders(f_e, W_e, arrays, ct)
        j = _value_and_two_orders(jf, W_j, arrays, ct)
        t = _value_and_two_orders(f_t, W_t, [a.astype(np.float64) for a in arrays],
                                  ct.astype(np.float64))
        for k, (ek, jk, tk) in enumerate(zip(e, j, t)):
            d = array_difference(ek, jk, f"call {call} leaf {k}", scaled=k > 0, ref=tk)
            assert d is None, d
    assert jf.cache_info()["fallbacks"] == 0


def test_lstm_over_time_steps_matches_eager_numba_second_order(monkeypatch):
    # The LSTM layer unrolled, its gradients of first and second order, with the
    # numba backend; the weights change between calls.
    T, B, H = 4, 3, 3
    lstm = L.LSTM(H, in_size=2)
    lstm(Variable(rnd((B, 2), 0)))
    lstm(Variable(rnd((B, 2), 1)))
    lstm.reset_state()
    params = list(lstm.params())

    def f(*xs):
        loss = 0
        for x in xs:
            loss = loss + F.sum(lstm(x) ** 2)
        lstm.reset_state()
        return loss

    def make_args(call):
        for i, p in enumerate(params):
            p.data = rnd(p.shape, 500 * call + i, p.dtype) * 0.5
        return [Variable(rnd((B, 2), 20 * call + t)) for t in range(T)]
    assert_jit_matches_eager(f, make_args=make_args, params=params, calls=4,
                             second_order=True)
    args = make_args(0)
    batched = ops(tj.jit(f).trace(*args))
    plain = ops(_traced_without_batching(f, monkeypatch, *args))
    # Each gate's x @ Wx + b + h @ Wh (float32 weights and bias, float64 x) is one
    # product a step after the first; the first step's three used x-only products are
    # one (their operands, casts of the weights each made at its product, are made
    # before the joined product: _hoistable).
    assert batched["matmul"] == 1 + 4 * (T - 1) < plain["matmul"] * 0.6, (plain, batched)


def test_an_lstm_steps_gate_products_are_one_product_with_the_casts_made_first():
    # W7's forward: h @ W_f, h @ W_i, h @ W_o, h @ W_u, (30, 100) @ (100, 100) each (3e5
    # multiply-adds), float32 weights cast where each product stands: one product
    # h @ [W_f W_i W_o W_u] (one BLAS call, 62 against 67 us for the four; the kernel
    # reads its column blocks), the four casts made before it.
    rng = np.random.default_rng(7)
    Ws = [Parameter((rng.standard_normal((100, 100)) * 0.1).astype(np.float32))
          for _ in range(4)]

    def f(h):
        f_, i_, o_, u_ = (F.matmul(h, W) for W in Ws)
        return F.sigmoid(f_) * F.tanh(u_) + F.sigmoid(i_) * F.sigmoid(o_)
    info = assert_jit_matches_eager(f, make_args=lambda k: (rnd((30, 100), 10 + k),),
                                    params=Ws, calls=4)
    assert info["fallbacks"] == 0
    g = tj.jit(f).trace(Variable(rnd((30, 100), 0)))
    counts = ops(g)
    assert counts["cast"] == 4 and counts["concat"] == 1, counts
    assert [tuple(v.shape) for n in g.nodes if n.name == "matmul"
            for v in n.inputs[1:]] == [(100, 400)], counts


# ---------------------------------------------------------------- joins of computed blocks

def _gate_sums(rows, steps=3, gates=3):
    """sum_t tanh(h_t)^T @ sin(g_it) for each gate i (an LSTM's gate weight gradients
    over a window), and the arguments: h_t (rows, 4), g_it (rows, 2). The blocks are
    computed first, as the backward computes a step's gate gradients before the sums
    (rewrite 3b does not move a reader of a gate's product after the others)."""
    def f(*xs):
        hs = [F.transpose(F.tanh(h)) for h in xs[:steps]]
        gs = [F.sin(g) for g in xs[steps:]]
        ys = []
        for i in range(gates):
            terms = [F.matmul(h, gs[t * gates + i]) for t, h in enumerate(hs)]
            y = terms[0]
            for term in terms[1:]:
                y = y + term
            ys.append(y * (1.0 / (steps * rows)))
        out = ys[0]
        for y in ys[1:]:
            out = out * y
        return out
    args = [rnd((rows, 4), k) for k in range(steps)] + \
        [rnd((rows, 2), 10 + k) for k in range(steps * gates)]
    return f, args


def test_transposes_of_computed_values_are_joined_as_the_transpose_of_their_join():
    # tanh(h_1 s)^T @ g_1 + tanh(h_2 s)^T @ g_2: [tanh(h_1 s); tanh(h_2 s)]^T @ [g_1; g_2],
    # the tanh results (kernels') joined, not their transposes (NumPy views, copied).
    # (Transposed weights, which _invariants holds, stay joined as they are.)
    def f(h1, h2, g1, g2, s):
        return (F.matmul(F.transpose(F.tanh(h1 * s)), g1)
                + F.matmul(F.transpose(F.tanh(h2 * s)), g2))
    args = [Variable(rnd((5, 4), 0)), Variable(rnd((6, 4), 1)),
            Variable(rnd((5, 3), 2)), Variable(rnd((6, 3), 3)), Variable(np.array(0.5))]
    g = tj.jit(f).trace(*args)
    producer = g.producers()
    joins = [n for n in g.nodes if n.fn.__class__.__name__ == "Concat"]
    assert ops(g)["matmul"] == 1 and len(joins) == 2, ops(g)
    assert not any(producer[id(v)].fn.__class__.__name__ == "Transpose"
                   for n in joins for v in n.inputs if id(v) in producer)
    assert_jit_matches_eager(f, *args, calls=4)


def test_two_sums_over_the_same_steps_share_their_join():
    # y1 adds its products first to last, y2 last to first: both join a_1, a_2, a_3 in
    # the graph's order, one concatenation.
    def f(a1, a2, a3, b, c):
        a = [F.tanh(a1), F.tanh(a2), F.tanh(a3)]
        y1 = F.matmul(a[0], b[0:4]) + F.matmul(a[1], b[4:8]) + F.matmul(a[2], b[8:12])
        y2 = F.matmul(a[2], c[8:12]) + F.matmul(a[1], c[4:8]) + F.matmul(a[0], c[0:4])
        return y1 * y2
    args = [Variable(rnd((3, 4), k)) for k in range(3)] + \
        [Variable(rnd((12, 5), 3)), Variable(rnd((12, 5), 4))]
    g = tj.jit(f).trace(*args)
    assert ops(g)["matmul"] == 2 and ops(g)["concat"] == 3, ops(g)
    assert_jit_matches_eager(f, *args, calls=4)


@pytest.mark.parametrize("rows, products", [(86, 1), (3, 3)])
def test_the_gates_weight_gradient_products_join_over_long_contractions(rows, products):
    # 3 steps x 86 rows = 258 >= JOIN_MIN_CONTRACTION: the three gates' products are
    # one, over the per-step joins of the gates' blocks; 3 x 3 rows stay three.
    assert (3 * rows >= matmul_batching.JOIN_MIN_CONTRACTION) == (products == 1)
    f, arrays = _gate_sums(rows)
    K = np.ones((rows, 2))

    def g(*xs):
        return f(*xs[:3], *[x * K for x in xs[3:]])   # K: a captured array

    def make_args(i):
        K[...] = 1.0 + 0.125 * i                       # mutated between calls
        return [Variable(a + 0.1 * i) for a in arrays]
    traced = tj.jit(g).trace(*make_args(0))
    assert ops(traced)["matmul"] == products, ops(traced)
    info = assert_jit_matches_eager(g, make_args=make_args, calls=4)
    assert info["fallbacks"] == 0
