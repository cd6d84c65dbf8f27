"""Groups that differ from another group of the plan only by a literal of a 0-d
epilogue, or by missing additions of inputs, run that group's kernel (one numba
compile for both), with values bitwise eager's.

  - an unrolled loop's `loss = 0` then `loss = loss + mse(...)`: the first step's loss
    kernel (mse + 0.0) and the later steps' (loss + mse) are one source once the 0-d
    epilogue's literals are kernel arguments (kernels._lift_epilogue_literals);
  - the last step of an unrolled backward has no gradient flowing from a next step:
    its group is the other steps' without those adds, and runs their kernel with -0.0
    for the missing addends (plan._plan_widened), x + -0.0 being x bitwise (-0.0
    included, which + 0.0 would turn into +0.0).
"""
import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F
from tracejit.backends.numba import kernels as K
from tracejit.backends.numba import plan as codegen
from tracejit.testing import assert_jit_matches_eager

from test_kernel_sharing import B, _training_window, kernels

pytestmark = pytest.mark.usefixtures("kernel_cache_dir", "jit_warnings_are_errors")


def _same(got, want):
    """Eager's values (vecmath's tanh may differ in the last bit from NumPy's), and
    its zeros' signs and NaNs exactly."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=0)
    assert np.array_equal(np.signbit(got), np.signbit(want)), (got, want)


def _loss_loop(xs, ts, w):
    loss = 0
    for i in range(xs.shape[0]):
        loss = loss + F.mean_squared_error(F.tanh(xs[i] * w), ts[i])
    return loss


def test_the_first_steps_loss_shares_the_later_steps_kernel(monkeypatch):
    rng = np.random.default_rng(11)

    def args(k=0):
        return (rng.standard_normal((4, 3, 5)), rng.standard_normal((4, 3, 5)),
                tj.Variable(rng.standard_normal(5)))
    info = assert_jit_matches_eager(_loss_loop, make_args=args, calls=3)
    assert info["fallbacks"] == 0
    counts = {}
    for lift in (False, True):
        monkeypatch.setattr(K, "LIFT_EPILOGUE_LITERALS", lift, raising=False)
        jf = tj.jit(_loss_loop)
        for _ in range(3):
            xs, ts, w = args()
            _same(jf(xs, ts, w).data, _loss_loop(xs, ts, w).data)
        counts[lift] = kernels(jf.trace(xs, ts, w).source)
    # one kernel for the 4 steps' losses, where `mse + 0.0` had its own
    assert len(counts[True][0]) == len(counts[False][0]) - 1, counts
    assert counts[True][1] == counts[False][1]


def _chains(a, b, c, d, e):
    # two chains adding an input, one that does not: split_group's three parts
    return [F.tanh(a + b) * 3.0, F.tanh(c + d) * 3.0, F.tanh(e) * 3.0]


def test_a_group_without_an_add_runs_the_kernel_with_it_given_minus_zero(monkeypatch):
    rng = np.random.default_rng(12)

    def args(k=0):
        xs = [rng.standard_normal((3, 4)) for _ in range(5)]
        xs[4][0, :2] = -0.0          # tanh(-0.0) * 3 is -0.0: an added +0.0 would flip it
        xs[4][1, 0] = np.nan
        return xs
    info = assert_jit_matches_eager(_chains, make_args=args, calls=3)
    assert info["fallbacks"] == 0
    counts = {}
    for widen in (False, True):
        monkeypatch.setattr(codegen, "WIDEN_MISSING_ADDENDS", widen, raising=False)
        jf = tj.jit(_chains)
        for _ in range(3):
            xs = args()
            for got, want in zip(jf(*xs), _chains(*xs)):
                _same(got.data, want.data)
        counts[widen] = kernels(jf.trace(*xs).source)
    assert len(counts[False][0]) == 2 and len(counts[True][0]) == 1, counts
    assert counts[True][1] == counts[False][1] == 3
    assert "_negzero" in jf.trace(*xs).source


def test_the_last_step_of_an_lstm_training_window_runs_the_general_gate_kernel(
        monkeypatch):
    # The book's window (LSTM layer, Adam, backward inside), W7's form: the last step's
    # gate-gradient group lacks the dh and dc flowing back from a next step.
    n = 4
    rng = np.random.default_rng(13)
    counts = {}
    for widen in (False, True):
        monkeypatch.setattr(codegen, "WIDEN_MISSING_ADDENDS", widen, raising=False)
        make = _training_window(n)
        m_e, w_e = make()
        m_j, w_j = make()
        w_j = tj.jit(w_j)
        se = sj = (None, None)
        for k in range(4):
            xs, ts = rng.standard_normal((n, B, 1)), rng.standard_normal((n, B, 1))
            le, *se = w_e(xs, ts, *se)
            lj, *sj = w_j(xs, ts, *sj)
            np.testing.assert_allclose(lj.data, le.data, rtol=1e-9, atol=1e-12)
            for a, b in zip(sj, se):
                np.testing.assert_allclose(a.data, b.data, rtol=1e-9, atol=1e-12)
            for p, q in zip(m_j.params(), m_e.params()):
                np.testing.assert_allclose(p.data, q.data, rtol=1e-9, atol=1e-12)
        assert w_j.cache_info()["fallbacks"] == 0
        src = w_j.trace(xs, ts, *sj).source
        counts[widen] = kernels(src)
    assert "_negzero" in src
    assert len(counts[True][0]) == len(counts[False][0]) - 1, \
        (len(counts[True][0]), len(counts[False][0]))
    assert counts[True][1] == counts[False][1]
