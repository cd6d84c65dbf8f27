"""Compiles finish: size-1 extents, broadcast operands and long chains of transcendental
ops never make numba/LLVM run away.

The mechanism this guards against: a value that does not change in a kernel's innermost
loop (every load of a (1,) group read at a constant index, or an (n, 1) operand's chain
broadcast along the inner axis) left inside that loop made LLVM's loop vectorizer take
time exponential in the chain's length (F.sum(F.sin(F.sigmoid(F.exp(F.tanh(x))))) on a
(1,) input: > 14 minutes). Kernels now read non-broadcast size-1 axes at the loop index
(the source of a (1,) group is that of a (3,) one) and compute each value in the
innermost loop whose index it reads. A group holds at most fusion.MAX_VECMATH_OPS
transcendental ops, so a long chain is several small compiles.
"""
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tracejit as tj
import tracejit.functions as F
from tracejit import passes
from tracejit.passes import fusion
from tracejit.backends.numba import plan as codegen

from graph_builder import Builder

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors", "kernel_cache_dir")

# The checkout whose tracejit this process imported (the test file sits folders deeper).
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(tj.__file__)))


def _chain_graph(shape, ops, bshape=None):
    b = Builder()
    x = b.input(shape)
    h = x if bshape is None else b.op(F.BroadcastTo(bshape), x)
    for op in ops:
        h = b.op(op(), h)
    return b.graph(b.op(F.Sum(None, False), h))


def _kernel_bodies(source):
    return [s for s in source.split("# kernel\n")[1:]]


def test_size_one_group_has_the_source_of_a_longer_one():
    ops = [F.Tanh, F.Exp, F.Sigmoid, F.Sin]
    sources = []
    for shape in [(1,), (3,)]:
        g = _chain_graph(shape, ops)
        codegen.compile(g)
        sources.append(_kernel_bodies(g.source))
    assert sources[0] == sources[1]
    assert "a0[0]" not in sources[0][0]


def test_broadcast_operand_chain_is_computed_outside_the_inner_loop():
    g = _chain_graph((3, 1), [F.Tanh, F.Exp, F.Tanh], bshape=(3, 4))
    run = codegen.compile(g)
    src = _kernel_bodies(g.source)[0]
    lines = src.splitlines()
    inner = next(i for i, s in enumerate(lines) if "for i1 in" in s)
    first_tanh = next(i for i, s in enumerate(lines) if "vm.tanh64(" in s)
    assert first_tanh < inner, src       # tanh(x[i0, 0]) once per row, not per element
    x = np.random.default_rng(0).standard_normal((3, 1))
    ref = np.sum(np.broadcast_to(np.tanh(np.exp(np.tanh(x))), (3, 4)))
    np.testing.assert_allclose(run([x])[0], ref, rtol=1e-13)


def test_the_reported_size_one_compile_finishes():
    # In a subprocess: if the mechanism comes back, this fails on a timeout instead of
    # hanging the suite.
    code = textwrap.dedent("""
        import numpy as np, tracejit as tj, tracejit.functions as F
        def f(x): return F.sum(F.sin(F.sigmoid(F.exp(F.tanh(x)))))
        jf = tj.jit(f)
        for i in range(3):
            xv = np.random.randn(1)
            a, b = tj.Variable(xv.copy()), tj.Variable(xv.copy())
            ya, yb = f(a), jf(b)
            ya.backward(); yb.backward()
            assert np.allclose(ya.data, yb.data) and np.allclose(a.grad.data, b.grad.data)
        assert jf.cache_info()["fallbacks"] == 0, jf.cache_info()
        print("ok")
    """)
    env = dict(os.environ, PYTHONPATH=ROOT)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=180)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr[-2000:]


def test_long_chain_is_split_into_bounded_kernels():
    ops = [F.Tanh, F.Sin, F.Exp, F.Cos, F.Sigmoid]
    g = _chain_graph((3,), [ops[(k * k + k // 3) % 5] for k in range(3 * fusion.MAX_VECMATH_OPS)])
    fused = passes.run_pipeline(g)
    groups = [n for n in fused.nodes if n.kind == fusion.FUSED]
    assert len(groups) >= 3
    for n in groups:
        count = sum(m.fn.vector_math for m in n.fn.graph.nodes)   # vecmath calls
        assert count <= fusion.MAX_VECMATH_OPS


def test_group_bound_counts_cheap_ops_too():
    b = Builder()
    h = b.input((3,))
    for k in range(fusion.MAX_GROUP_OPS + 10):
        h = b.op(F.Mul(), h, h) if k % 2 else b.op(F.Neg(), h)
    fused = passes.run_pipeline(b.graph(h))
    for n in fused.nodes:
        if n.kind == fusion.FUSED:
            assert len(n.fn.graph.nodes) <= fusion.MAX_GROUP_OPS


# Chains of ops with bounded outputs (exp of a tanh): well conditioned in float32 too.
_OPS = {"tanh": F.tanh, "sin": F.sin, "cos": F.cos, "sigmoid": F.sigmoid,
        "exp_tanh": lambda h: F.exp(F.tanh(h))}


@st.composite
def _programs(draw):
    rank = draw(st.integers(0, 3))
    xs = tuple(draw(st.sampled_from([1, 1, 2, 3])) for _ in range(rank))
    # y: x's shape with some axes 1 and some leading axes dropped (broadcasting)
    ys = tuple(d if draw(st.booleans()) else 1 for d in xs)
    ys = ys[draw(st.integers(0, rank)):]
    chain = draw(st.lists(st.sampled_from(sorted(_OPS)), min_size=1, max_size=6))
    mode = draw(st.sampled_from(["sum", "mul", "bcast", "axis", "none"]))
    dtype = draw(st.sampled_from([np.float64, np.float32]))
    return xs, ys, chain, mode, dtype


@settings(max_examples=12)
@given(_programs())
def test_chains_on_shapes_with_ones_compile_and_match_eager(prog):
    xs, ys, chain, mode, dtype = prog

    def f(x, y):
        h = x
        if mode == "bcast" and xs:
            h = F.broadcast_to(x, tuple(d + 1 if d == 1 else d for d in xs))
        for name in chain:
            h = _OPS[name](h)
        if mode == "mul":
            h = h * y
        if mode == "axis" and xs:
            return F.sum(h, axis=len(xs) - 1)
        return h if mode == "none" else F.sum(h)

    jf = tj.jit(f)
    rng = np.random.default_rng(len(chain))
    tol = 1e-4 if dtype == np.float32 else 1e-10
    for call in range(4):
        xv = np.asarray(rng.standard_normal(xs), dtype)
        yv = np.asarray(rng.standard_normal(ys), dtype)
        res = []
        for fn in (f, jf):
            x, y = tj.Variable(xv.copy()), tj.Variable(yv.copy())
            out = fn(x, y)
            F.sum(out * 2.0).backward()
            res.append((out.data, x.grad.data, y.grad))
        (o0, g0, h0), (o1, g1, h1) = res
        assert o0.dtype == o1.dtype and o0.shape == o1.shape
        assert g0.dtype == g1.dtype and g0.shape == g1.shape
        np.testing.assert_allclose(o1, o0, rtol=tol, atol=tol)
        np.testing.assert_allclose(g1, g0, rtol=tol, atol=tol)
        assert (h0 is None) == (h1 is None)
        if h0 is not None:
            np.testing.assert_allclose(h1.data, h0.data, rtol=tol, atol=tol)
