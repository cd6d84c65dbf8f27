"""A fused kernel writes each of its outputs at the loop index, so every output of a
fused group (but a reduction's and a 0-d epilogue's) has the group's iteration shape
(ir.check verifies it; backends/numba/kernels.loop_kernel refuses to emit another).

A view of a captured (1, 3) Parameter (W.T.T, a reshape there and back, W[..., ::-1])
read by (3, 3) ops joined one reader's kernel while every reader was in it; a later
move (an elementwise cone sunk into the kernel that reads it) took another reader
out, and the view became an output of the (3, 3) kernel, which wrote rows 1 and 2
of the (1, 3) array: past its end, heap corruption (`munmap_chunk(): invalid
pointer`, fuzz program 9112 of a 10,000-program run). fusion._detach_escaping_loads
now takes such a view out of the group: it runs as a NumPy view the kernel reads.
"""
import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F
from tracejit.ir import Graph, Node, Value, check
from tracejit.passes.fusion import Fused
from tracejit.testing import assert_jit_matches_eager

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")

VIEWS = {
    "transpose twice": lambda W: F.transpose(F.transpose(W)),
    "reshape there and back": lambda W: F.reshape(F.reshape(W, (-1,)), W.shape),
    "reversed slice": lambda W: W[..., ::-1],
}


def _program(view_of, dtype):
    """f updates W (two backwards inside it, the second reaching W through the
    first's result) and reads the view of W before and after."""
    def make():
        rng = np.random.default_rng(4731)
        W = tj.Parameter(rng.uniform(-1.0, 1.0, (1, 3)).astype(dtype))
        W1 = tj.Parameter(rng.uniform(-1.0, 1.0, (3,)))
        W2 = tj.Parameter(np.asarray(rng.uniform(-1.0, 1.0), dtype=np.float32))

        def f(x):
            h1 = F.exp(F.tanh(x))
            view = view_of(W)
            h4 = F.tanh(h1 * view)
            loss = F.mean(h4 ** 2)
            loss.backward()
            W.data -= 0.1 * W.grad.data
            h5 = h4 + F.tanh(h1 * view)
            h8 = F.tanh(h5 * W1)
            loss2 = F.mean(F.tanh(h8 * W2) ** 2)
            loss2.backward()
            return F.tanh(F.tanh(h5 * h8))
        return f, (W, W1, W2)
    return make


@pytest.mark.parametrize("view", sorted(VIEWS))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_view_of_a_size_1_parameter_read_by_two_kernels_matches_eager(view, dtype):
    make = _program(VIEWS[view], dtype)

    def make_args(call):
        rng = np.random.default_rng(call)
        nb = 3 if call < 4 else 4           # a new batch size too
        return (tj.Variable(rng.uniform(0.5, 1.5, (nb, 3))),)
    info = assert_jit_matches_eager(make_function=make, make_args=make_args, calls=6)
    assert info["fallbacks"] == 0, info


def test_every_fused_group_of_the_program_writes_outputs_of_its_iteration_shape():
    f, _ = _program(VIEWS["transpose twice"], np.float32)()
    jf = tj.jit(f)
    for _ in range(2):                  # (traced on the second call)
        jf(tj.Variable(np.ones((3, 3))))
    g = jf.trace(tj.Variable(np.ones((3, 3))))
    fused = [n for n in g.nodes if isinstance(n.fn, Fused)]
    assert fused
    assert check(g)
    for n in fused:
        sub = {id(v): m for m in n.fn.graph.nodes for v in m.outputs}
        for v in n.outputs:
            if sub[id(v)].kind in ("elementwise", "movement") and v.shape != ():
                assert v.shape == n.fn.shape, (v, n.fn.shape)


def test_check_rejects_a_fused_group_writing_a_smaller_output():
    # A hand-built group: (3, 3) iteration, the (1, 3) transpose also an output.
    W = Value((3, 1), np.float64)
    x = Value((3, 3), np.float64)
    t = Value((1, 3), np.float64)
    y = Value((3, 3), np.float64)
    from tracejit.ops.arrayops import Transpose
    from tracejit.ops.elementwise import Mul
    nodes = [Node(Transpose(None), [W], [t]), Node(Mul(), [x, t], [y])]
    sub = Graph("group", [W, x], nodes, [t, y])
    outer = Graph("outer", [W, x], [Node(Fused(sub, (3, 3)), [W, x], [t, y])], [y])
    with pytest.raises(AssertionError, match="iteration shape"):
        check(outer)
