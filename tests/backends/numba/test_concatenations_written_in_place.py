"""A concatenation's blocks written in place by the kernels that make them (plan._plan_joins).

The numba plan allocates a concatenation's result at its start and has each kernel that
makes one of its operands write it into its block of the result (a view), so the
concatenation copies only the blocks no kernel wrote: a view of an input (a
transpose), a graph input, an operand joined twice or by an earlier concatenation, a
graph output (results are arrays of their own), a flat kernel's block that is not
C-contiguous (its reshape(-1) would be a copy). Blocks of blocks (a concatenation of
concatenations) are views of views. Each case: the numba backend against the
interpret backend over 4 calls with new values, and the plan's source says which
blocks were written in place.
"""
import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F
from tracejit.backends.numba import plan as codegen
from tracejit.ir import interpret
from tracejit.ops.arrayops import Concat, Transpose
from tracejit.testing import assert_jit_matches_eager

from graph_builder import Builder

pytestmark = pytest.mark.usefixtures("kernel_cache_dir", "jit_warnings_are_errors")

IN_PLACE = "written in place: a block"
COPIED = "a block not written in place"


def _run_both(g, shapes, calls=4):
    """The numba plan of g against the interpret backend on `calls` sets of inputs;
    returns the plan's source."""
    run = codegen.compile(g)
    ref = interpret.compile(g)
    rng = np.random.default_rng(0)
    for _ in range(calls):
        xs = [rng.standard_normal(s) for s in shapes]
        got, want = run(list(xs)), ref(list(xs))
        assert len(got) == len(want)
        for a, b in zip(got, want):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
            assert a.shape == b.shape and a.dtype == b.dtype
    return run.source


def _gate(b, x, r, op):
    """op(x * r): a 2-D kernel (r broadcasts over the rows, so the kernel is not flat)."""
    return b.op(op, b.op(F.Mul(), x, r))


def test_blocks_side_by_side_are_written_by_their_kernels():
    b = Builder()
    x, y, r = b.input((3, 4)), b.input((3, 5)), b.input((1, 4))
    r5 = b.input((1, 5))
    c = b.op(Concat(1), _gate(b, x, r, F.Tanh()), _gate(b, y, r5, F.Sin()))
    src = _run_both(b.graph(b.op(F.Exp(), c)), [(3, 4), (3, 5), (1, 4), (1, 5)])
    assert src.count(IN_PLACE) == 2 and COPIED not in src, src


def test_stacked_blocks_and_blocks_of_blocks_are_views_of_one_buffer():
    # [[t1 t2]; [t3 t4]]: the rows are concatenations, blocks of the outer one.
    b = Builder()
    x, r = b.input((3, 4)), b.input((1, 4))
    ts = [_gate(b, b.op(F.Mul(), x, b.input((1, 4))), r, op)
          for op in (F.Tanh(), F.Sin(), F.Cos(), F.Exp())]
    rows = [b.op(Concat(1), ts[0], ts[1]), b.op(Concat(1), ts[2], ts[3])]
    c = b.op(Concat(0), *rows)
    src = _run_both(b.graph(c, b.op(F.Sum(None, False), rows[0])),
                    [(3, 4), (1, 4)] + [(1, 4)] * 4)
    assert src.count(IN_PLACE) == 4 and COPIED not in src, src
    assert src.count("a block of a concatenation") == 6, src    # 4 blocks, 2 rows


def test_views_inputs_outputs_and_repeated_operands_are_copied_in():
    b = Builder()
    x, y, r = b.input((4, 4)), b.input((4, 4)), b.input((1, 4))
    t = _gate(b, x, r, F.Tanh())
    u = _gate(b, y, r, F.Sin())                       # also a graph output
    w = _gate(b, x, r, F.Cos())
    c = b.op(Concat(1), t, b.op(Transpose(None), y), x, u, w, w)
    d = b.op(Concat(0), t, w)                  # t: claimed by c; w: c reads it twice
    src = _run_both(b.graph(b.op(F.Exp(), c), u, d), [(4, 4), (4, 4), (1, 4)])
    # t is written in place in c, w in d; the transpose, the input x, the output u and
    # the repeated w are copied into c, t into d.
    assert src.count(IN_PLACE) == 2 and src.count(COPIED) == 6, src


def test_a_results_array_is_its_own():
    # A concatenation that is a graph output owns its buffer, and an operand that is a
    # graph output is not a view of it.
    b = Builder()
    x, r = b.input((3, 4)), b.input((1, 4))
    t, u = _gate(b, x, r, F.Tanh()), _gate(b, x, r, F.Sin())
    g = b.graph(b.op(Concat(0), t, u), u)
    run = codegen.compile(g)
    c, u_out = run([np.ones((3, 4)), np.ones((1, 4))])
    assert not np.shares_memory(c, u_out)
    assert c.base is None and u_out.base is None


def test_a_flat_kernels_strided_block_is_copied_and_a_contiguous_one_written():
    # x * y on (3, 4) arrays is a flat kernel (reshape(-1) of every array): its block
    # side by side is strided (copied in), stacked it is contiguous (written in place).
    for axis, in_place in ((1, 0), (0, 2)):
        b = Builder()
        x, y = b.input((3, 4)), b.input((3, 4))
        c = b.op(Concat(axis), b.op(F.Mul(), x, y), b.op(F.Add(), y, y))
        src = _run_both(b.graph(b.op(F.Exp(), c)), [(3, 4), (3, 4)])
        assert src.count(IN_PLACE) == in_place, (axis, src)
        # no block in place: the concatenation is one call into its buffer
        assert ("np.concatenate" in src) == (in_place == 0), src


def _gates_program(hs, gs):
    """sum_t h_t^T @ g_it for two gates, every operand computed: what the LSTM's
    weight gradients are, the blocks joined in place."""
    ys = []
    for i in range(2):
        terms = [F.matmul(F.transpose(F.tanh(h)), F.sin(g * (i + 1.0)))
                 for h, g in zip(hs, gs)]
        y = terms[0]
        for t in terms[1:]:
            y = y + t
        ys.append(y)
    return ys[0] * ys[1]


def test_jit_of_joined_blocks_matches_eager():
    # Arrays in, no gradient: nothing is saved for a backward (a saved value is a graph
    # output, copied in), so the kernels write the joined operands in place.
    rng = np.random.default_rng(1)
    K = rng.standard_normal((5, 3))

    def f(a, b):
        hs = [a * (k + 1.0) for k in range(3)]
        gs = [F.matmul(b, K) * (k - 1.0) for k in range(3)]
        return _gates_program(hs, gs)

    def make_args(i):
        K[...] += 0.25 * i                              # the captured array changes
        return rng.standard_normal((6, 4)), rng.standard_normal((6, 5))
    info = assert_jit_matches_eager(f, make_args=make_args, calls=5, backward=False)
    assert info["fallbacks"] == 0
    jf = tj.jit(f)
    for i in range(3):
        jf(*make_args(i))
    src = jf.trace(*make_args(3)).source
    assert IN_PLACE in src, src


BUFFER_WRITE = "np.uint64(s0 + i1)] = "


def test_strided_blocks_are_written_through_their_buffer():
    # Side-by-side blocks of a (3, 9) buffer are strided views: the kernel takes the
    # buffer and writes row i0 at columns start + i1 (unsigned: no wraparound select,
    # so the stores vectorize), the start an argument, so both blocks' kernels are
    # one source when their groups are (here: tanh and sin, two sources).
    b = Builder()
    x, y, r = b.input((3, 4)), b.input((3, 5)), b.input((1, 4))
    r5 = b.input((1, 5))
    c = b.op(Concat(1), _gate(b, x, r, F.Tanh()), _gate(b, y, r5, F.Sin()))
    src = _run_both(b.graph(b.op(F.Exp(), c)), [(3, 4), (3, 5), (1, 4), (1, 5)])
    kernels = src.split("\n# kernel\n")[1:]
    assert sum(BUFFER_WRITE in k for k in kernels) == 2, src
    # Rows of length 1 are contiguous blocks: their views, as before.
    b = Builder()
    x, y, r = b.input((1, 4)), b.input((1, 5)), b.input((1, 4))
    c = b.op(Concat(1), _gate(b, x, r, F.Tanh()), _gate(b, y, b.input((1, 5)), F.Sin()))
    src = _run_both(b.graph(b.op(F.Exp(), c)), [(1, 4), (1, 5), (1, 4), (1, 5)])
    assert BUFFER_WRITE not in src and src.count(IN_PLACE) == 2, src


def test_jit_of_a_sum_of_products_of_kernel_outputs_matches_eager():
    # tanh(a * r) @ W1 + sin(b * q) @ W2 is one product [tanh(a * r) sin(b * q)] @ [W1; W2]
    # (passes/matmul_batching.py, rewrite 2): the two kernels (2-D: r and q broadcast
    # over the rows) write their column blocks of the (6, 9) operand through the buffer.
    rng = np.random.default_rng(2)

    def f(a, b, r, q, W1, W2):
        return F.matmul(F.tanh(a * r), W1) + F.matmul(F.sin(b * q), W2)

    def make_args(i):
        return (rng.standard_normal((6, 4)), rng.standard_normal((6, 5)),
                rng.standard_normal((1, 4)), rng.standard_normal((1, 5)),
                rng.standard_normal((4, 3)), rng.standard_normal((5, 3)))
    info = assert_jit_matches_eager(f, make_args=make_args, calls=4, backward=False)
    assert info["fallbacks"] == 0
    jf = tj.jit(f)
    for i in range(3):
        args = make_args(i)
        got = jf(*args)
        np.testing.assert_allclose(got.data, np.tanh(args[0] * args[2]) @ args[4]
                                   + np.sin(args[1] * args[3]) @ args[5], rtol=1e-12)
    src = jf.trace(*make_args(3)).source
    assert src.split("\n# kernel\n")[0].count(IN_PLACE) == 2, src
    assert sum(BUFFER_WRITE in k for k in src.split("\n# kernel\n")[1:]) == 2, src
