"""A whole training step under jit (an MLP, every optimizer, the update inside or outside the
jitted function, float64 and float32): parameters after each step equal eager's.
"""
import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F
from tracejit.optimizers import SGD, AdaGrad, Adam, MomentumSGD

from twin_models import twins as _twins


pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")


_OPTS = {
    "SGD": lambda: SGD(lr=0.1),
    "MomentumSGD": lambda: MomentumSGD(lr=0.05, momentum=0.9),
    "AdaGrad": lambda: AdaGrad(lr=0.05),
    "Adam": lambda: Adam(alpha=0.01),
}


def _data(dtype):
    r = np.random.default_rng(13)
    x = r.standard_normal((16, 3)).astype(dtype)
    t = (np.sin(x.sum(axis=1, keepdims=True)) ).astype(dtype)
    return x, t


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("opt_name", list(_OPTS))
def test_mlp_training_step_update_inside(opt_name, dtype):
    m_j, m_e = _twins(0, (8, 1), dtype)
    o_j, o_e = _OPTS[opt_name]().setup(m_j), _OPTS[opt_name]().setup(m_e)
    x, t = _data(dtype)

    def make_step(model, opt):
        def step(x, t):
            y = model(x)
            loss = F.mean_squared_error(y, t)
            model.cleargrads()
            loss.backward()
            opt.update()
            return loss
        return step

    step_e = make_step(m_e, o_e)
    step_j = tj.jit(make_step(m_j, o_j))
    r = np.random.default_rng(14)
    for i in range(100):
        idx = r.permutation(16)[:8]
        lj = step_j(x[idx], t[idx])
        le = step_e(x[idx], t[idx])
        rtol = 1e-5 if dtype == np.float32 else 1e-6
        np.testing.assert_allclose(lj.data, le.data, rtol=rtol, atol=1e-7)
        assert lj.dtype == le.dtype
    rtol, atol = (1e-5, 1e-6) if dtype == np.float32 else (1e-6, 1e-6)
    for p1, p2 in zip(m_j.params(), m_e.params()):
        assert p1.data.dtype == p2.data.dtype == dtype
        np.testing.assert_allclose(p1.data, p2.data, rtol=rtol, atol=atol)
    info = step_j.cache_info()
    assert info["hits"] >= 95, info
    assert step_j.cache_info()["fallbacks"] == 0, step_j.cache_info()


@pytest.mark.parametrize("opt_name", list(_OPTS))
def test_mlp_training_step_update_outside(opt_name):
    m_j, m_e = _twins(1, (6, 1))
    o_j, o_e = _OPTS[opt_name]().setup(m_j), _OPTS[opt_name]().setup(m_e)
    x, t = _data(np.float64)

    def make_loss(model):
        def loss_fn(x, t):
            return F.mean_squared_error(model(x), t)
        return loss_fn

    loss_e = make_loss(m_e)
    jstep = tj.jit(make_loss(m_j))
    r = np.random.default_rng(15)
    for i in range(100):
        idx = r.permutation(16)[:8]
        lj = jstep(x[idx], t[idx])
        m_j.cleargrads()
        lj.backward()
        o_j.update()
        le = loss_e(x[idx], t[idx])
        m_e.cleargrads()
        le.backward()
        o_e.update()
        np.testing.assert_allclose(lj.data, le.data, rtol=1e-6, atol=1e-9)
        for p1, p2 in zip(m_j.params(), m_e.params()):
            np.testing.assert_allclose(p1.grad.data, p2.grad.data, rtol=1e-6, atol=1e-9)
    for p1, p2 in zip(m_j.params(), m_e.params()):
        np.testing.assert_allclose(p1.data, p2.data, rtol=1e-6, atol=1e-6)
    assert jstep.cache_info()["fallbacks"] == 0, jstep.cache_info()
