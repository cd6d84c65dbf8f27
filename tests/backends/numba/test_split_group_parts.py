"""A fused group split into parts (plan.split_group) runs each part after what it reads.

Horizontal fusion puts unrelated chains of one iteration shape into one group; the plan
splits it again. A part may read only the group's inputs and the values earlier parts
export: a loop-invariant chain (a broadcast of a 0-d value, the backward's seed) is
copied into each part that reads it, and an invariant value no part reads (a group
output such as broadcast(s) * t) is a part of its own with the chain it reads.
No graph the tracer records may make the backend fail (a KeyError at lowering fell
back to the interpret backend with a warning).
"""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import tracejit as tj
import tracejit.functions as F
from tracejit.backends.numba import plan as codegen
from tracejit.ir import Graph, Node, check, interpret
from tracejit.passes import fusion
from tracejit.testing import assert_jit_matches_eager

from graph_builder import Builder

pytestmark = pytest.mark.usefixtures("kernel_cache_dir", "jit_warnings_are_errors")

N = 3


def _program(x, s, t, w, W):
    b = F.broadcast_to(F.reshape(s, (1,)), x.shape)       # invariant: read by two chains
    # b * t: invariant too, and read by no other member (a group output)
    return b * t, F.sum(b * x) * t, w * 2.0 - W


def test_an_invariant_output_beside_split_chains_matches_eager():
    rng = np.random.default_rng(0)
    W = tj.Parameter(rng.standard_normal(N))

    def make_args(i):
        W.data = W.data + 0.5 * i                            # the captured weight mutated
        return (tj.Variable(rng.standard_normal(N)), tj.Variable(np.array(rng.normal())),
                tj.Variable(np.array(rng.normal())), tj.Variable(rng.standard_normal(N)), W)
    info = assert_jit_matches_eager(_program, make_args=make_args, calls=4)
    assert info["fallbacks"] == 0
    f = tj.jit(_program)
    for i in range(3):
        f(*make_args(i))
    assert f.trace(*make_args(3)).source.count("# kernel") >= 2   # the group was split


def _random_group(draw):
    """A Fused node of iteration shape (N,): invariant chains (reshape + broadcast of a
    0-d input, and elementwise ops on those and 0-d inputs), chains on (N,) inputs,
    reductions to 0-d and 0-d epilogue ops; a random subset of values as outputs."""
    b = Builder()
    zero = [b.input(()) for _ in range(2)]
    full = [b.input((N,)) for _ in range(2)]
    epi = []
    for _ in range(draw(st.integers(2, 10))):
        kind = draw(st.sampled_from(["bcast", "binary", "binary", "sum", "epi"]))
        if kind == "bcast":
            s = draw(st.sampled_from(zero))
            full.append(b.op(F.BroadcastTo((N,)), b.op(F.Reshape((1,)), s)))
        elif kind == "binary":
            x = draw(st.sampled_from(full))
            y = draw(st.sampled_from(full + zero))
            op = draw(st.sampled_from([F.Mul, F.Add, F.Sub]))
            full.append(b.op(op(), *draw(st.permutations([x, y]))))
        elif kind == "sum":
            epi.append(b.op(F.Sum(), draw(st.sampled_from(full[2:] or full))))
        elif epi:
            epi.append(b.op(F.Mul(), draw(st.sampled_from(epi)),
                            draw(st.sampled_from(epi + zero))))
    # Outputs: any value but the (1,) reshapes, which a kernel of iteration shape (N,)
    # cannot write (fusion never makes one an output: ir.check says why).
    produced = [v for n in b.nodes for v in n.outputs if v.shape != (1,)]
    outs = draw(st.lists(st.sampled_from(produced), min_size=1, unique_by=id))
    g = Graph("grp", b.inputs, b.nodes, outs)
    return Node(fusion.Fused(g, (N,)), g.inputs, g.outputs), g


@given(st.data())
def test_split_parts_read_only_inputs_and_earlier_parts(data):
    node, g = _random_group(data.draw)
    parts = codegen.split_group(node)
    plan = Graph("plan", g.inputs, parts, g.outputs)
    check(plan)                  # each part reads only defined values; outputs defined
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal(v.shape) for v in g.inputs]
    for got, want in zip(interpret.compile(plan)(xs), interpret.compile(g)(xs)):
        np.testing.assert_array_equal(got, want)
