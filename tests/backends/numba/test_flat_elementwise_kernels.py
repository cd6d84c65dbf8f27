"""An elementwise group is one loop over its flattened arrays, whatever its rank.

A fused group of elementwise ops whose inputs are 0-d or of the iteration shape
(kernels.flat_elementwise) is written as a 1-d kernel over x.reshape(-1) of each array:
so the same chain over a matrix and over a vector (Adam's update of a weight and of a
bias, an unrolled loop's 2-d and 1-d gradient accumulations) is one kernel, compiled
once. The plan's flattening must give eager's values for any layout: non-contiguous
inputs (a transpose, a strided slice), 3-d, float32 with float64, a 0-d operand, empty
arrays, and groups large enough for prange.
Counts only (kernels built), never timings.
"""
import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F
import tracejit.layers as L
from tracejit import optimizers
from tracejit.backends.numba import cache as kcache
from tracejit.backends.numba import kernels as K
from tracejit.backends.numba import plan as codegen
from tracejit.testing import assert_jit_matches_eager

pytestmark = pytest.mark.usefixtures("kernel_cache_dir", "jit_warnings_are_errors")


def chain(a, b):
    # An unusual chain: no other test builds its kernel before this file counts it.
    return F.tanh(a * 1.375 - b * 0.625 + 2.125) * b


def test_matrix_and_vector_of_one_chain_share_one_kernel():
    rng = np.random.default_rng(0)

    def f(A, B, a, b):
        return chain(A, B), chain(a, b)
    built = kcache.STATS["kernels_built"]
    assert_jit_matches_eager(f, rng.standard_normal((5, 7)), rng.standard_normal((5, 7)),
                             rng.standard_normal(9), rng.standard_normal(9), backward=False)
    # one kernel for both forwards (the 2-d group flattened); before: a 2-d and a 1-d one
    assert kcache.STATS["kernels_built"] - built == 1


def test_adam_updates_of_a_weight_and_a_bias_share_their_kernel():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((6, 3))
    np.random.seed(0)
    model = L.Linear(4, in_size=3)
    opt = optimizers.Adam(alpha=0.0123).setup(model)

    def step(x):
        loss = F.sum(model(x) ** 2)
        model.cleargrads()
        loss.backward()
        opt.update()
        return loss
    jf = tj.jit(step)
    for k in range(4):
        jf(x + k)
    update = [s for s in jf.trace(x).source.split("\n# kernel\n")[1:]
              if "sqrt" in s and "for i0" in s]    # Adam's update loops: sqrt(v) + eps
    assert len(update) == 1, update


@pytest.mark.parametrize("shape", [(4, 5), (2, 3, 4), (0, 3), (3, 1), (1, 200, 200)])
def test_flattened_groups_match_eager_for_any_layout(shape):
    rng = np.random.default_rng(2)
    big = int(np.prod(shape)) >= codegen.PARALLEL_MIN

    def args(k):
        a = rng.standard_normal(shape)
        b = rng.standard_normal(shape[::-1]).T           # non-contiguous: a transpose
        c = rng.standard_normal(shape[:-1] + (2 * shape[-1],))[..., ::2]   # strided
        s = np.float64(rng.standard_normal())
        d = rng.standard_normal(shape).astype(np.float32)
        return a, b, c, s, d

    def f(a, b, c, s, d):
        y = chain(a, b) + c * s
        return y, F.exp(y * 0.5) - d, F.sum(y)
    info = assert_jit_matches_eager(f, make_args=args)
    assert info["fallbacks"] == 0
    assert big or int(np.prod(shape)) < codegen.PARALLEL_MIN


def test_which_groups_are_flat():
    """Broadcast reads, index reads and reductions keep their loops."""
    rng = np.random.default_rng(3)
    x, v = rng.standard_normal((4, 6)), rng.standard_normal(6)

    def flat_of(f, *a):
        jf = tj.jit(f)
        for _ in range(3):
            jf(*a)
        src = jf.trace(*a).source
        return ["_1d_" in s.split("def ")[1].split("(")[0]
                for s in src.split("\n# kernel\n")[1:]]
    assert flat_of(lambda x: x * 2.0 + 1.0, x) == [True]
    assert flat_of(lambda x, v: x * v + 1.0, x, v) == [False]          # broadcast
    assert flat_of(lambda x: F.sum(x * x, axis=0), x) == [False]       # reduction
    assert K.flat_elementwise.__doc__
