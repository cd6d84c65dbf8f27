"""Whole programs through the numba backend: values and gradients equal eager, call
after call, with no fallback (a JitWarning fails the test)."""
import warnings

import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F
from tracejit import optimizers
from tracejit.models import MLP


@pytest.fixture(autouse=True)
def jit_warnings_are_errors():
    with warnings.catch_warnings():
        warnings.simplefilter("error", tj.JitWarning)
        yield


@pytest.mark.parametrize("opt_cls", [optimizers.SGD, optimizers.MomentumSGD,
                                     optimizers.AdaGrad, optimizers.Adam])
def test_mlp_training_step_numba_matches_eager(opt_cls):
    # Regression: fusion once produced a cyclic schedule on this graph (Adam's update
    # reads values from several groups), and the step fell back to interpret.
    rng = np.random.default_rng(0)
    x = rng.standard_normal((16, 8)).astype(np.float32)
    t = rng.integers(0, 10, 16)

    def make():
        np.random.seed(0)
        model = MLP((12, 10), activation=F.relu)
        model(x)
        return model, opt_cls().setup(model)

    def step(model, opt, x, t):
        loss = F.softmax_cross_entropy(model(x), t)
        model.cleargrads()
        loss.backward()
        opt.update()
        return loss

    mj, oj = make()
    me, oe = make()
    jstep = tj.jit(lambda x, t: step(mj, oj, x, t), backend="numba")
    for i in range(8):
        xi = x + np.float32(0.1 * i)
        lj = jstep(xi, t)
        le = step(me, oe, xi, t)
        np.testing.assert_allclose(lj.data, le.data, rtol=1e-5)
        for p, q in zip(mj.params(), me.params()):
            np.testing.assert_allclose(p.data, q.data, rtol=1e-5, atol=1e-6)
    info = jstep.cache_info()
    assert info["fallbacks"] == 0 and info["variants"] == 1, info


def test_goldstein_price_dezero_form_numba():
    def gp(x, y):
        return (1 + (x + y + 1) ** 2 * (19 - 14 * x + 3 * x ** 2 - 14 * y + 6 * x * y
                                        + 3 * y ** 2)) \
            * (30 + (2 * x - 3 * y) ** 2 * (18 - 32 * x + 12 * x ** 2 + 48 * y - 36 * x * y
                                            + 27 * y ** 2))
    fj = tj.jit(gp, backend="numba")
    rng = np.random.default_rng(1)
    for _ in range(6):
        a, b = rng.uniform(-1, 1, 2)
        xj, yj = tj.Variable(np.array(a)), tj.Variable(np.array(b))
        xe, ye = tj.Variable(np.array(a)), tj.Variable(np.array(b))
        zj = fj(xj, yj)
        zj.backward()
        ze = gp(xe, ye)
        ze.backward()
        np.testing.assert_allclose(zj.data, ze.data, rtol=1e-12)
        np.testing.assert_allclose([xj.grad.data, yj.grad.data], [xe.grad.data, ye.grad.data],
                                   rtol=1e-10)
    assert fj.trace(xj, yj).summary()["kernels"] == 1
    assert fj.cache_info()["fallbacks"] == 0
