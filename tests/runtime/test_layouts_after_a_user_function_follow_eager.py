"""A user Function keeping per-call state (`self.k = ...` in forward) runs as the
user's code once per call, so the reference run that finds eager's memory order of the
results (runtime.variant.eager_layouts) skipped every graph holding one, and the
results came out in the kernels' C order. F.tanh(F.transpose(h, (1, 0, 2)) * 0.5) of
such a Function's output h is laid out in eager as the transposed operand (NumPy's
order='K'), so `lay.data.reshape(-1)` copies there; compiled, it was a view of the C
ordered result: a write through one result showed in the other in compiled calls only.
The reference run now stands in for the user's node with arrays laid out as an
elementwise op of its operands (`x * self.k`)."""
import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F
from tracejit.core import Variable

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")


class SignScale(tj.Function):
    def forward(self, x):
        self.k = 2.0 if x.sum() > 0 else -3.0
        return x * self.k

    def backward(self, gy):
        return gy * self.k


def transposed_tanh(x):
    h = SignScale()(x)
    lay = F.tanh(F.transpose(h, (1, 0, 2)) * 0.5)
    return lay, lay.data.reshape(-1), lay.data.T


def _check(fn, xs):
    jf = tj.jit(fn)
    for i, a in enumerate(xs):
        xj, xe = Variable(a.copy()), Variable(a.copy())
        rj, re = jf(xj), fn(xe)
        aj = [r.data if isinstance(r, Variable) else r for r in rj]
        ae = [r.data if isinstance(r, Variable) else r for r in re]
        for p, q in zip(aj, ae):
            np.testing.assert_allclose(p, q, rtol=1e-12)
            assert p.strides == q.strides, i
        for m in range(len(ae)):
            for n in range(m + 1, len(ae)):
                assert np.shares_memory(aj[m], aj[n]) == np.shares_memory(ae[m], ae[n]), \
                    (i, m, n)
        # A write through the flat result: the others show it where eager's do.
        aj[1][0] = -7.0
        ae[1][0] = -7.0
        np.testing.assert_allclose(aj[0], ae[0], rtol=1e-12)
        np.testing.assert_allclose(aj[2], ae[2], rtol=1e-12)
    assert jf.cache_info()["hits"] >= 3


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_a_transposed_result_of_a_user_function_is_laid_out_as_eager(sign):
    rng = np.random.default_rng(3)
    _check(transposed_tanh, [rng.uniform(0.5, 1.5, (3, 4, 2)) * sign for _ in range(5)])


def test_f_reshape_of_a_transposed_result_of_a_user_function_copies_as_eager():
    rng = np.random.default_rng(4)

    def sin_of_moved(x):
        lay = F.sin(F.transpose(SignScale()(x), (2, 0, 1)) + 1.0)
        return lay, F.reshape(lay, (-1,)), F.transpose(lay)

    _check(sin_of_moved, [rng.uniform(0.5, 1.5, (3, 4, 2)) for _ in range(5)])


class ContiguousScale(tj.Function):
    # Its output is C order whatever its input's layout: not as an elementwise op.
    def forward(self, x):
        self.k = 2.0 if x.sum() > 0 else -3.0
        return np.ascontiguousarray(x * self.k)

    def backward(self, gy):
        return gy * self.k


def test_a_user_function_laying_its_output_out_otherwise_keeps_that_layout():
    # The stand-in follows the layout the forward gave when traced (C order here, where
    # an elementwise op of the transposed input is not).
    rng = np.random.default_rng(5)

    def tanh_of_contiguous(x):
        lay = F.tanh(ContiguousScale()(F.transpose(x, (1, 0, 2))) * 0.5)
        moved = F.sin(F.transpose(lay, (2, 0, 1)))      # K order of the C-ordered lay
        return lay, lay.data.reshape(-1), lay.data.T, moved, moved.data.reshape(-1)

    _check(tanh_of_contiguous, [rng.uniform(0.5, 1.5, (3, 4, 2)) for _ in range(5)])
