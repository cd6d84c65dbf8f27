"""np.random draws inside a jitted function are fresh on every call and the same as eager's
from the same global state (np.random.randn, F.dropout's masks).

"""
import warnings
import numpy as np
import pytest
import tracejit as tj
import tracejit.functions as F
from tracejit import Variable

N_CALLS = 6          # >= 5: warm-up, trace, then at least 3 replays

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")


def test_np_random_inside_fresh_draws_same_as_eager():
    def f(x):
        return x * np.random.rand(*x.shape)

    jf = tj.jit(f)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tj.JitWarning)   # fallback is allowed here
        np.random.seed(0)
        outs_j = [jf(Variable(np.ones(4) * (i + 1))).data for i in range(N_CALLS)]
    np.random.seed(0)
    outs_e = [f(Variable(np.ones(4) * (i + 1))).data for i in range(N_CALLS)]
    for a, b in zip(outs_j, outs_e):
        np.testing.assert_allclose(a, b, rtol=1e-12)
    for a, b in zip(outs_j[1:], outs_j[:-1]):
        assert not np.allclose(a / a.max(), b / b.max())


def test_dropout_masks_match_eager_under_seed():
    def f(x, W):
        return F.sum(F.dropout(F.matmul(x, W), 0.4) ** 2)

    jf = tj.jit(f)
    r = np.random.default_rng(21)
    xs = [r.standard_normal((6, 5)) for _ in range(N_CALLS + 2)]
    Ws = [r.standard_normal((5, 7)) for _ in range(N_CALLS + 2)]
    np.random.seed(0)
    res_j = []
    for x, W in zip(xs, Ws):
        Wv = Variable(W.copy())
        y = jf(x, Wv)
        y.backward()
        res_j.append((y.data.copy(), Wv.grad.data.copy()))
    np.random.seed(0)
    res_e = []
    for x, W in zip(xs, Ws):
        Wv = Variable(W.copy())
        y = f(x, Wv)
        y.backward()
        res_e.append((y.data.copy(), Wv.grad.data.copy()))
    for (yj, gj), (ye, ge) in zip(res_j, res_e):
        np.testing.assert_allclose(yj, ye, rtol=1e-10)
        np.testing.assert_allclose(gj, ge, rtol=1e-10, atol=1e-12)
    # the same stream position afterwards
    after_j = None
    np.random.seed(0)
    for x, W in zip(xs, Ws):
        jf(x, Variable(W))
    after_j = np.random.rand()
    np.random.seed(0)
    for x, W in zip(xs, Ws):
        f(x, Variable(W))
    assert after_j == np.random.rand()
    info = jf.cache_info()
    assert info["hits"] >= 3
    assert jf.cache_info()["fallbacks"] == 0, jf.cache_info()
