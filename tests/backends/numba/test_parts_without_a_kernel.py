"""A fused part of one elementwise op, or of 0-d ops only, runs as NumPy calls: no kernel.

plan._no_kernel: such a part gains nothing from a numba kernel of its own (one ufunc on
operands of one dtype and shape is one SIMD pass; 0-d ops have no loop) and each kernel
costs a numba compilation (0.05-0.1 s of CPU). It runs its members' own forwards, as
eager does, so it must give eager's values, dtypes and gradients on every call. Parts of
two or more ops, reductions, transcendental ops, index reads and a lone op on a
broadcast or mixed-dtype operand (slower in NumPy) keep their kernels. Counts only,
never timings.
"""
import re

import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F
from tracejit.testing import assert_jit_matches_eager

pytestmark = pytest.mark.usefixtures("kernel_cache_dir", "jit_warnings_are_errors")


def kernels_of(source):
    """(name, number of ops) of each loop kernel in a plan's source."""
    return [(m.group(1), int(m.group(2)))
            for m in re.finditer(r"def (k_\w+)\(.*\):\n    # (\d+) ops", source)]


def numpy_lines(source, op):
    plan = source.split("# kernel")[0]
    return [ln for ln in plan.splitlines() if re.search(rf"= _f\d+\(.*\)   # {op} ", ln)]


def program(x, w, b, W, t):
    # x * b: a multiply read only by a matmul (a part of one op); cast: one op;
    # step: Adam-like 0-d arithmetic on t; tanh + sum: a kernel
    h = F.matmul(x * b, W) + F.Cast("float64")(w)
    step = 0.1 * (1 - 0.9 ** t) / (1 - 0.999 ** t)
    return F.sum(F.tanh(h)) * step


def args(rng):
    return (tj.Variable(rng.standard_normal((6, 4))),
            tj.Parameter(rng.standard_normal((1, 5)).astype(np.float32)),
            tj.Parameter(rng.standard_normal((6, 4))),
            tj.Parameter(rng.standard_normal((4, 5))),
            tj.Variable(np.array(3.0)))


def test_one_op_and_zero_d_parts_match_eager_without_kernels():
    rng = np.random.default_rng(0)
    x, w, b, W, t = args(rng)

    def make_args(i):
        w.data = w.data + np.float32(0.25 * i)     # the captured parameter mutated
        return (tj.Variable(rng.standard_normal((6, 4))), w, b, W,
                tj.Variable(np.array(3.0 + i)))
    info = assert_jit_matches_eager(program, make_args=make_args, calls=4)
    assert info["fallbacks"] == 0
    f = tj.jit(program)
    for i in range(3):
        f(*make_args(i))
    g = f.trace(*make_args(3))
    assert numpy_lines(g.source, "mul") and numpy_lines(g.source, "cast"), g.source
    assert numpy_lines(g.source, "pow_v"), g.source        # 0.9 ** t: 0-d, NumPy
    ks = kernels_of(g.source)
    assert ks and all(n > 1 for _, n in ks), ks             # tanh + sum keeps one
    assert not any("_0d_" in name for name, _ in ks), ks
    bg = f.backward_graph(*make_args(4))
    assert all(n > 1 for _, n in kernels_of(bg.source)), bg.source


def test_lone_ops_numpy_runs_slower_and_index_reads_keep_their_kernels():
    W = np.random.default_rng(2).standard_normal((4, 3))

    def f(x, y, a, b32):
        # exp: a transcendental op; y[1] * y[0]: index reads; a * b32: an outer product
        # of float64 by float32 (NumPy's broadcasting and casting loops), read by a matmul
        return F.exp(x), y[1] * y[0] + 1.0, F.matmul(a * b32, W)

    rng = np.random.default_rng(1)

    def draw():
        return (rng.standard_normal((3, 4)), rng.standard_normal(5),
                rng.standard_normal((6, 1)), rng.standard_normal((1, 4)).astype(np.float32))
    assert_jit_matches_eager(f, *draw(), backward=False)
    j = tj.jit(f)
    for _ in range(3):
        j(*draw())
    names = [name for name, _ in kernels_of(j.trace(*draw()).source)]
    assert any(n.startswith("k_exp_") for n in names), names
    assert any("get_item" in n and "_0d_" in n for n in names), names
    assert any(n.startswith("k_mul_2d") for n in names), names
