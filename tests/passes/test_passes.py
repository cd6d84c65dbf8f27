"""Passes keep graphs valid (ir.check) and results unchanged (interpret backend)."""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import tracejit.functions as F
from tracejit import passes
from tracejit.ir import interpret
from tracejit.ir import Lit, check
from tracejit.ops.trace_only import GuardFailure

from graph_builder import Builder


def run(g, args):
    with np.errstate(all="ignore"):
        return interpret.compile(g)(args)


def assert_same(xs, ys):
    assert len(xs) == len(ys)
    for x, y in zip(xs, ys):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_dead_code_keeps_outputs_guards_and_draws():
    b = Builder()
    x = b.input((3,))
    dead = b.op(F.Exp(), x)
    b.op(F.Sin(), dead)
    r = b.op(F.RandomUniform((3,)))              # unused draw: must stay
    s = b.op(F.Sum(None, False), x)
    b.guard(b.op(F.Greater(), s, Lit(-1.0, np.float64)))
    y = b.op(F.Tanh(), x)
    g = b.graph(y)
    g2 = passes.eliminate_dead_code(g)
    assert check(g2)
    names = [n.name for n in g2.nodes]
    assert "exp" not in names and "sin" not in names
    assert "random_uniform" in names and "sum" in names and len(g2.guards) == 1
    assert r is g2.nodes[0].out


def test_cse_merges_pure_nodes_only():
    b = Builder()
    x = b.input((4,))
    a1 = b.op(F.Mul(), x, Lit(2.0, np.float64))
    a2 = b.op(F.Mul(), x, Lit(2.0, np.float64))
    a3 = b.op(F.Mul(), x, Lit(-0.0, np.float64))   # -0.0 != 0.0 for CSE
    a4 = b.op(F.Mul(), x, Lit(0.0, np.float64))
    r1 = b.op(F.RandomUniform((4,)))
    r2 = b.op(F.RandomUniform((4,)))
    y = b.op(F.Add(), b.op(F.Add(), a1, a2), b.op(F.Add(), a3, a4))
    g = b.graph(y, r1, r2)
    g2 = passes.eliminate_dead_code(passes.eliminate_common_subexpressions(g))
    assert check(g2)
    assert sum(n.name == "mul" for n in g2.nodes) == 3
    assert sum(n.name == "random_uniform" for n in g2.nodes) == 2
    xs = [np.arange(4.0)]
    np.random.seed(0)
    want = run(g, xs)
    np.random.seed(0)
    assert_same(run(g2, xs), want)


def test_fold_constants_keeps_numpy_results():
    b = Builder()
    x = b.input(())
    c = b.op(F.Div(), Lit(0.0, np.float64), Lit(0.0, np.float64))       # nan
    d = b.op(F.Exp(), Lit(1000.0, np.float64))                            # inf
    e = b.op(F.Mul(), Lit(3.0, np.float32), Lit(0.1, np.float32))        # float32 math
    k = b.op(F.Greater(), Lit(1.0, np.float64), Lit(0.0, np.float64))
    b.guard(k)                                                            # read by a guard
    y = b.op(F.Add(), b.op(F.Add(), x, c), d)
    g = b.graph(y, d, e)
    g2 = passes.fold_constants(g)
    assert check(g2)
    assert [n.name for n in g2.nodes].count("greater") == 1
    assert isinstance(g2.outputs[1], Lit) and g2.outputs[1].value == np.inf
    assert g2.outputs[2].dtype == np.float32 and g2.outputs[2].value == np.float32(3) * \
        np.float32(0.1)
    got, want = run(g2, [np.array(1.0)]), run(g, [np.array(1.0)])
    for a, w in zip(got, want):
        np.testing.assert_array_equal(a, w)


def test_fuse_chain_and_reduction_into_one_group():
    b = Builder()
    a, c = b.input((5, 3)), b.input((5, 3))
    d = b.op(F.Sub(), a, c)
    s = b.op(F.Sum(None, False), b.op(F.Pow(2), d))
    g = b.graph(s)
    g2 = passes.fuse(g)
    assert check(g2)
    assert [n.kind for n in g2.nodes] == ["fused"]
    assert "fused" in str(g2)
    xs = [np.random.rand(5, 3), np.random.rand(5, 3)]
    np.testing.assert_allclose(run(g2, xs)[0], run(g, xs)[0])


def test_fuse_keeps_guard_and_random_order():
    b = Builder()
    x = b.input((4,))
    t = b.op(F.Tanh(), x)
    m = b.op(F.Max(None, False), t)
    b.guard(b.op(F.Greater(), m, Lit(0.0, np.float64)))
    r = b.op(F.RandomUniform((4,)))
    y = b.op(F.Mul(), b.op(F.Add(), t, r), x)
    g = b.graph(y)
    g2 = passes.run_pipeline(g)
    assert check(g2)
    kinds = [n.kind for n in g2.nodes]
    assert kinds.index("guard") < kinds.index("random")
    xs = [np.linspace(-1, 1, 4)]
    np.random.seed(1)
    want = run(g, xs)
    np.random.seed(1)
    np.testing.assert_allclose(run(g2, xs)[0], want[0])
    with pytest.raises(GuardFailure) as e:
        run(g2, [-np.ones(4)])
    assert e.value.index == 0


def test_fuse_movement_loads_and_materialized_intermediates():
    b = Builder()
    x, w = b.input((3, 4)), b.input((4,))
    xt = b.op(F.Transpose(None), x)                      # (4, 3)
    wb = b.op(F.Reshape((4, 1)), w)
    h = b.op(F.Tanh(), b.op(F.Add(), xt, wb))
    mm = b.op(F.MatMul(), h, x)                          # h is used outside the group
    y = b.op(F.Mul(), h, Lit(2.0, np.float64))
    g = b.graph(y, mm)
    g2 = passes.run_pipeline(g)
    assert check(g2)
    fused = [n for n in g2.nodes if n.kind == "fused"]
    assert len(fused) == 1 and any(v is h for v in fused[0].outputs)
    assert not any(n.name in ("transpose", "reshape") for n in g2.nodes)
    xs = [np.random.rand(3, 4), np.random.rand(4)]
    for got, want in zip(run(g2, xs), run(g, xs)):
        np.testing.assert_allclose(got, want)


_UNARY = [F.Neg, F.Exp, F.Sin, F.Tanh, F.Abs, F.Sigmoid, F.ReLU, lambda: F.Pow(2)]
_BINARY = [F.Add, F.Sub, F.Mul, F.Maximum, F.Minimum]


@st.composite
def random_programs(draw):
    """A random DAG of elementwise ops and reductions over broadcastable inputs."""
    b = Builder()
    shapes = [(3, 4), (3, 1), (1, 4), (), (4,)]
    vals = [b.input(draw(st.sampled_from(shapes))) for _ in range(3)]
    for _ in range(draw(st.integers(2, 12))):
        kind = draw(st.sampled_from(["u", "b", "b", "r", "l"]))
        x = draw(st.sampled_from(vals))
        if kind == "u":
            vals.append(b.op(draw(st.sampled_from(_UNARY))(), x))
        elif kind == "l":
            vals.append(b.op(F.Mul(), x, Lit(draw(st.sampled_from([0.5, -2.0])), np.float64)))
        elif kind == "b":
            y = draw(st.sampled_from(vals))
            vals.append(b.op(draw(st.sampled_from(_BINARY))(), x, y))
        elif x.shape:
            vals.append(b.op(draw(st.sampled_from([F.Sum, F.Max]))(
                draw(st.sampled_from([None, (0,)])), draw(st.booleans())), x))
    outs = draw(st.lists(st.sampled_from(vals[3:] or vals), min_size=1, max_size=3))
    return b.graph(*outs)


@given(random_programs(), st.integers(0, 2 ** 31 - 1))
def test_pipeline_keeps_check_and_results(g, seed):
    rng = np.random.default_rng(seed)
    xs = [rng.standard_normal(v.shape) for v in g.inputs]
    want = run(g, xs)
    for p in passes.PIPELINE:
        g = p(g)
        assert check(g)
        got = run(g, xs)
        for a, w in zip(got, want):
            np.testing.assert_allclose(a, w, rtol=1e-12, atol=1e-12)


def test_run_pipeline_dump_and_errors(capsys):
    b = Builder()
    x = b.input((2,))
    g = b.graph(b.op(F.Exp(), x))
    g2 = passes.run_pipeline(g, dump="fuse")
    assert "# after fuse" in capsys.readouterr().err
    assert set(g2.notes["pass_seconds"]) >= {"fuse", "eliminate_dead_code"}

    def broken(g):
        raise RuntimeError("boom")

    with pytest.raises(passes.PassError, match="pass broken failed"):
        passes.run_pipeline(g, passes=(broken,))
