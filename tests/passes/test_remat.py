"""Save vs recompute for the compiled backward: the min cut of tracejit.passes.remat.

Unit tests build forward graphs by hand and say which values the backward reads; the
plan must hold the fewest bytes (and, on ties, the fewest arrays) while never
recomputing what cannot be: costly math, reductions, matmuls, anything computed from
an input the call mutates. End-to-end tests run jitted functions past warm-up with new
values, compare with eager, and read the saved bytes off the forward graph's summary.
"""

import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F
from tracejit import Parameter, Variable
from tracejit.trace import backward as traced_backward
from tracejit.passes import remat
from tracejit.ir import Lit, Value

from graph_builder import Builder

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")

N = 1000


def plan(b, needed, mutated=(), min_cut=True):
    return remat.partition(b.nodes, needed, frozenset(id(v) for v in mutated), min_cut)


def recomputed(p):
    return [n.outputs[0] for _, n in p.recompute]


def same(xs, ys):
    return [id(v) for v in xs] == [id(v) for v in ys]


def log_log_sin(xshape, yshape):
    # c = log(x); d = log(y); v = c + d; w = sin(v): log's backward reads x and y (free
    # inputs), sin's reads v.
    x, y = Value(xshape, np.float64), Value(yshape, np.float64)
    b = Builder()
    c = b.op(F.Log(), x)
    d = b.op(F.Log(), y)
    v = b.op(F.Add(), c, d)
    b.op(F.Sin(), v)
    return b, (x, y, c, d, v)


# ---------------------------------------------------------------- the cut

def test_saves_the_sum_not_its_two_costly_operands():
    b, (x, y, c, d, v) = log_log_sin((N,), (N,))
    old = plan(b, [v, x, y], min_cut=False)
    assert same(old.saved, [c, d]) and same(recomputed(old), [v])
    new = plan(b, [v, x, y])
    assert same(new.saved, [v]) and new.recompute == []
    assert new.saved_bytes == N * 8 < old.saved_bytes


def test_broadcast_value_is_recomputed_from_its_small_operands():
    # Here v is N x 50 while c, d hold N + 50 elements: saving v would cost 50x more.
    b, (x, y, c, d, v) = log_log_sin((N, 1), (1, 50))
    p = plan(b, [v, x, y])
    assert same(p.saved, [c, d]) and same(recomputed(p), [v])
    assert p.saved_bytes == (N + 50) * 8


def test_big_value_from_small_inputs_is_never_saved():
    x, y = Value((N, 1), np.float64), Value((1, 50), np.float64)
    b = Builder()
    s = b.op(F.Exp(), x)                  # costly: the forward computes it
    big = b.op(F.Mul(), s, y)
    big2 = b.op(F.Add(), big, y)
    p = plan(b, [big2, big])
    assert same(p.saved, [s]) and same(recomputed(p), [big, big2])
    assert p.saved_bytes == N * 8


def test_equal_bytes_prefer_fewer_arrays():
    # Two float32 arrays or one float64 array of the same length: the same bytes.
    x, y = Value((N,), np.float32), Value((N,), np.float32)
    b = Builder()
    a = b.op(F.Exp(), x)
    c = b.op(F.Exp(), y)
    v = b.op(F.Add(), b.op(F.Cast("float64"), a), b.op(F.Cast("float64"), c))
    assert same(plan(b, [v], min_cut=False).saved, [a, c])
    p = plan(b, [v])
    assert same(p.saved, [v]) and p.saved_bytes == N * 8


def test_ties_recompute_less():
    x = Value((N,), np.float64)
    b = Builder()
    a = b.op(F.Exp(), x)
    w = b.op(F.Mul(), a, Lit(2.0, np.float64))
    p = plan(b, [w])
    assert same(p.saved, [w]) and p.recompute == []


def test_cheap_values_from_inputs_cost_nothing():
    x, y = Value((N,), np.float64), Value((N,), np.float64)
    b = Builder()
    z = x
    for _ in range(5):
        z = b.op(F.Add(), b.op(F.Mul(), z, y), x)
    p = plan(b, [n.outputs[0] for n in b.nodes])
    assert p.saved == [] and len(p.recompute) == 10


def test_nonelementwise_and_costly_values_are_saved():
    x, W = Value((8, 4), np.float64), Value((4, 3), np.float64)
    b = Builder()
    h = b.op(F.MatMul(), x, W)
    t = b.op(F.Tanh(), h)
    s = b.op(F.Sum(None, False), t)
    p = plan(b, [h, t, s])
    assert same(p.saved, [h, t, s]) and p.recompute == []


def test_values_from_a_mutated_input_are_saved():
    # The call updates x in place: by the backward, its buffer holds the new value.
    x, y = Value((N,), np.float64), Value((N,), np.float64)
    b = Builder()
    c = b.op(F.Mul(), x, Lit(2.0, np.float64))
    d = b.op(F.Add(), c, y)
    e = b.op(F.Mul(), y, y)                 # untainted: still recomputed
    assert plan(b, [d, e]).saved == []
    p = plan(b, [d, e, x], mutated=[x])
    assert same(p.saved, [d]) and same(recomputed(p), [e])


def test_taint_spreads_through_every_later_node():
    x, y = Value((N,), np.float64), Value((N,), np.float64)
    b = Builder()
    c = b.op(F.Exp(), x)
    s = b.op(F.Sum(None, False), c)
    d = b.op(F.Mul(), s, y)                 # computed from x through a reduction
    p = plan(b, [d], mutated=[x])
    assert same(p.saved, [d]) and p.recompute == []


def test_zero_d_graph_recomputes_all_elementwise():
    b, (x, y, c, d, v) = log_log_sin((), ())
    p = plan(b, [v, x, y])
    assert p.saved == [] and same(recomputed(p), [c, d, v])
    xs = Value((3,), np.float64)
    b = Builder()
    s = b.op(F.Sum(None, False), xs)
    e = b.op(F.Exp(), s)
    p = plan(b, [e])
    assert same(p.saved, [s]) and same(recomputed(p), [e])


def test_zero_d_graph_keeps_the_taint():
    x, y = Value((), np.float64), Value((), np.float64)
    b = Builder()
    c = b.op(F.Log(), x)
    d = b.op(F.Add(), c, y)
    p = plan(b, [d], mutated=[x])
    assert same(p.saved, [d]) and p.recompute == []


def test_deep_chain_needs_no_recursion():
    x = Value((N,), np.float64)
    b = Builder()
    z = b.op(F.Exp(), x)
    for _ in range(3000):
        z = b.op(F.Mul(), z, Lit(1.0, np.float64))
    muls = [n.outputs[0] for n in b.nodes[1:]]
    p = plan(b, muls)
    assert same(p.saved, muls[:1]) and same(recomputed(p), muls[1:])


# ---------------------------------------------------------------- argument snapshots
# An argument the caller may change before the backward is read, for recomputation, only
# as a copy the forward saves: a vertex of the argument's size, weighed by the cut.

def test_a_copy_of_a_small_argument_replaces_a_big_saved_value():
    x, y = Value((N, 1), np.float64), Value((1, 50), np.float64)
    b = Builder()
    s = b.op(F.Exp(), x)
    big = b.op(F.Mul(), s, y)
    p = remat.partition(b.nodes, [big], snapshot=[x, y])
    assert same(p.saved, [y, s]) and same(recomputed(p), [big])
    assert p.saved_bytes == (50 + N) * 8


def test_a_value_smaller_than_its_argument_is_saved_instead_of_a_copy():
    # v = x.sum(axis=1) * 2 needs x (N x 50) to be recomputed: saving v (N) is cheaper.
    x = Value((N, 50), np.float64)
    b = Builder()
    r = b.op(F.Sum(axis=(1,), keepdims=False), x)
    v = b.op(F.Mul(), r, Lit(2.0, np.float64))
    w1 = b.op(F.Mul(), x, Lit(3.0, np.float64))   # N x 50 each, recomputable from x
    w2 = b.op(F.Mul(), x, Lit(4.0, np.float64))
    p = remat.partition(b.nodes, [v, w1, w2], snapshot=[x])
    # One copy of x costs half of saving w1 and w2; v is still cheaper saved.
    assert same(p.saved, [x, v]) and same(recomputed(p), [w1, w2])
    assert same(remat.partition(b.nodes, [v], snapshot=[x]).saved, [v])


def test_without_snapshots_inputs_are_read_for_free():
    b, (x, y, c, d, v) = log_log_sin((N, 1), (1, 50))
    assert plan(b, [v, x, y]).saved_bytes == (N + 50) * 8
    # With x and y snapshots, recomputing v still needs only c and d (logs are saved).
    p = remat.partition(b.nodes, [v], snapshot=[x, y])
    assert same(p.saved, [c, d]) and same(recomputed(p), [v])


def test_zero_d_graphs_recompute_everything_from_copies():
    b, (x, y, c, d, v) = log_log_sin((), ())
    p = remat.partition(b.nodes, [v], snapshot=[x, y])
    assert same(p.saved, [x, y]) and same(recomputed(p), [c, d, v])


# ---------------------------------------------------------------- end to end


@pytest.fixture
def old_rule(monkeypatch):
    """trace_backward with the rule before the cut: everything recomputable recomputed."""
    def rule(fwd_nodes, needed, mutated=frozenset(), snapshot=()):
        return remat.partition(fwd_nodes, needed, mutated, min_cut=False,
                               snapshot=snapshot).recompute_map()
    monkeypatch.setattr(traced_backward, "recompute_rule", rule)


def run_and_compare(f, make_args, calls=5):
    """jit(f) against f on new values each call; the forward graph of the variant."""
    jf = tj.jit(f)
    for i in range(calls):
        args = make_args(i)
        xj = [Variable(a.copy()) for a in args]
        xe = [Variable(a.copy()) for a in args]
        yj, ye = jf(*xj), f(*xe)
        # Kernels' exp/sin are within an ulp of NumPy's, not bit-equal: sin(exp(x) * y)
        # near a root of sin differs in the last bits of its (tiny) value, hence atol.
        np.testing.assert_allclose(yj.data, ye.data, rtol=1e-12, atol=1e-13)
        gy = np.random.default_rng(i).standard_normal(ye.shape)
        F.sum(yj * gy).backward()
        F.sum(ye * gy).backward()
        for a, e in zip(xj, xe):
            np.testing.assert_allclose(a.grad.data, e.grad.data, rtol=1e-10, atol=1e-12)
    assert jf.cache_info()["fallbacks"] == 0, jf.cache_info()
    return jf.trace(*[Variable(a) for a in make_args(calls)])


def positive(*shapes):
    def make(i):
        r = np.random.default_rng(100 + i)
        return [r.uniform(0.5, 2.0, s) for s in shapes]
    return make


def saved_bytes(g):
    return g.summary()["saved_for_backward_bytes"]


def log_log_sin_fn(x, y):
    return F.sin(F.log(x) + F.log(y))


def two_matmuls(x, W1, W2):
    # The backward of v ** 2 reads v; the matmuls' backwards read only inputs.
    v = F.matmul(x, W1) + F.matmul(x, W2)
    return F.sum(v ** 2 + v)


# name: (function, argument shapes, bytes the cut saves, bytes the rule saved)
BEATS_RULE = {
    "log_log_sin": (log_log_sin_fn, ((N,), (N,)), N * 8, 2 * N * 8),
    "two_matmuls": (two_matmuls, ((64, 32), (32, 48), (32, 48)), 64 * 48 * 8,
                    2 * 64 * 48 * 8),
}


@pytest.mark.parametrize("name", sorted(BEATS_RULE))
def test_jit_saves_fewer_bytes_than_the_rule(name):
    f, shapes, cut_bytes, _ = BEATS_RULE[name]
    g = run_and_compare(f, positive(*shapes))
    assert saved_bytes(g) == cut_bytes
    assert g.summary()["recomputed_instead_bytes"] == 0


@pytest.mark.parametrize("name", sorted(BEATS_RULE))
def test_jit_rule_before_the_cut(name, old_rule):
    f, shapes, _, rule_bytes = BEATS_RULE[name]
    g = run_and_compare(f, positive(*shapes), calls=3)
    assert saved_bytes(g) == rule_bytes


def test_jit_broadcast_recomputes_the_big_value():
    g = run_and_compare(lambda x, y: F.sin(F.exp(x) * y), positive((N, 1), (1, 40)))
    # exp(x), and a copy of the argument y it is recomputed with (the caller may change
    # y before the backward): 40 values, not the N * 40 of the product.
    assert saved_bytes(g) == N * 8 + 40 * 8
    assert g.summary()["recomputed_instead_bytes"] == N * 40 * 8


def test_jit_dead_backward_reads_are_not_saved():
    # The gradient of the literal 0.5 reads sin(x); nothing uses it, so nothing saves it.
    g = run_and_compare(lambda x: F.sin(F.exp(F.sin(x) * 0.5)), positive((N,)))
    assert saved_bytes(g) == N * 8


def test_jit_zero_d_recomputes_everything():
    g = run_and_compare(log_log_sin_fn, positive((), ()))
    # Nothing but copies of the two arguments, which everything is recomputed from.
    assert saved_bytes(g) == 2 * 8
    assert g.summary()["recomputed_instead_bytes"] == 3 * 8


def test_jit_mutated_capture_is_not_recomputed_from():
    p = Parameter(np.linspace(0.5, 1.5, N))

    def f(x):
        y = F.sin(x * p + 1.0)
        p.data -= 0.01          # after use: the backward must not recompute x * p + 1
        return y

    p0 = p.data.copy()
    jf = tj.jit(f)
    for i in range(5):
        xa = np.random.default_rng(i).standard_normal(N)
        start = p.data.copy()
        xj = Variable(xa.copy())
        yj = jf(xj)
        F.sum(yj).backward()
        gj = xj.grad.data
        p.data[...] = start
        xe = Variable(xa.copy())
        ye = f(xe)
        F.sum(ye).backward()
        np.testing.assert_allclose(yj.data, ye.data, rtol=1e-12)
        np.testing.assert_allclose(gj, xe.grad.data, rtol=1e-12)
    assert jf.cache_info()["fallbacks"] == 0
    p.data[...] = p0
    # Saved: x * p + 1. p's new data the backward reads from p when it runs, as eager's
    # backward does (the caller may change it again after the call).
    g = jf.trace(Variable(np.ones(N)))
    assert saved_bytes(g) == N * 8 and g.summary()["recomputed_instead_bytes"] == 0
