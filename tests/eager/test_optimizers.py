"""Optimizers and hooks: one and two steps against hand-written NumPy updates."""
import math

import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F
from tracejit import optimizers as O
from tracejit.core import Parameter
from tracejit.datasets import Spiral
from tracejit.models import MLP

P0 = np.array([[1.0, -2.0], [0.5, 3.0]])
GRADS = [np.array([[0.1, -0.2], [0.3, 0.4]]), np.array([[-0.5, 0.25], [0.0, 1.0]])]


class OneParam(tj.Layer):
    def __init__(self):
        super().__init__()
        self.p = Parameter(P0.copy(), name="p")
        self.unused = Parameter(np.ones(3), name="unused")   # grad None: never updated


def run(optimizer, steps):
    """Apply `steps` updates with GRADS; check updates were in place; return p's data."""
    model = OneParam()
    optimizer.setup(model)
    data = model.p.data
    for g in GRADS[:steps]:
        model.p.grad = tj.Variable(g.copy())
        optimizer.update()
    # The JIT records `param.data -= ...` as an in-place write: the array must be the same.
    assert model.p.data is data
    np.testing.assert_array_equal(model.unused.data, np.ones(3))
    return model.p.data


def test_sgd():
    np.testing.assert_allclose(run(O.SGD(lr=0.1), 1), P0 - 0.1 * GRADS[0])
    np.testing.assert_allclose(run(O.SGD(lr=0.1), 2), P0 - 0.1 * (GRADS[0] + GRADS[1]))


def test_sgd_default_lr():
    assert O.SGD().lr == 0.01


def test_momentum_sgd():
    lr, mom = 0.1, 0.9
    v1 = -lr * GRADS[0]
    v2 = mom * v1 - lr * GRADS[1]
    np.testing.assert_allclose(run(O.MomentumSGD(lr, mom), 1), P0 + v1)
    np.testing.assert_allclose(run(O.MomentumSGD(lr, mom), 2), P0 + v1 + v2)


def test_adagrad():
    lr, eps = 0.5, 1e-8
    h1 = GRADS[0] ** 2
    p1 = P0 - lr * GRADS[0] / (np.sqrt(h1) + eps)
    h2 = h1 + GRADS[1] ** 2
    p2 = p1 - lr * GRADS[1] / (np.sqrt(h2) + eps)
    np.testing.assert_allclose(run(O.AdaGrad(lr), 1), p1)
    np.testing.assert_allclose(run(O.AdaGrad(lr), 2), p2)


def test_adam():
    alpha, b1, b2, eps = 0.01, 0.9, 0.999, 1e-8
    m = np.zeros_like(P0)
    v = np.zeros_like(P0)
    p = P0.copy()
    expected = []
    for t, g in enumerate(GRADS, start=1):
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        # DeZero's form: bias correction folded into the step size.
        lr = alpha * math.sqrt(1 - b2 ** t) / (1 - b1 ** t)
        p = p - lr * m / (np.sqrt(v) + eps)
        expected.append(p)
    np.testing.assert_allclose(run(O.Adam(alpha), 1), expected[0], rtol=1e-12)
    opt = O.Adam(alpha)
    np.testing.assert_allclose(run(opt, 2), expected[1], rtol=1e-12)
    assert opt.t == 2


def test_adam_first_step_is_alpha_times_sign():
    # With bias correction, step 1 moves every element by ~alpha in the gradient's sign.
    p = run(O.Adam(alpha=0.01), 1)
    np.testing.assert_allclose(P0 - p, 0.01 * np.sign(GRADS[0]), rtol=1e-5)


def test_adadelta():
    rho, eps = 0.95, 1e-6
    msg = (1 - rho) * GRADS[0] ** 2
    dx = np.sqrt(eps / (msg + eps)) * GRADS[0]
    np.testing.assert_allclose(run(O.AdaDelta(rho, eps), 1), P0 - dx)


def test_state_is_keyed_by_parameter():
    model = MLP((3, 2))
    model(np.ones((1, 2), np.float32))
    opt = O.MomentumSGD().setup(model)
    F.sum(model(np.ones((1, 2), np.float32))).backward()
    opt.update()
    assert set(opt.vs) == {id(p) for p in model.params()}


def test_weight_decay_hook():
    rate, lr = 0.1, 0.5
    opt = O.SGD(lr)
    opt.add_hook(O.WeightDecay(rate))
    np.testing.assert_allclose(run(opt, 1), P0 - lr * (GRADS[0] + rate * P0))


def test_clip_grad_hook_scales_large_gradients_only():
    norm = np.sqrt((GRADS[0] ** 2).sum())          # 0.5477
    opt = O.SGD(1.0)
    opt.add_hook(O.ClipGrad(max_norm=0.1))
    expected = P0 - GRADS[0] * 0.1 / (norm + 1e-6)
    np.testing.assert_allclose(run(opt, 1), expected)
    opt = O.SGD(1.0)
    opt.add_hook(O.ClipGrad(max_norm=10.0))         # norm below the limit: untouched
    np.testing.assert_allclose(run(opt, 1), P0 - GRADS[0])


def test_freeze_param_hook():
    model = OneParam()
    opt = O.SGD(1.0).setup(model)
    opt.add_hook(O.FreezeParam(model.p))
    model.p.grad = tj.Variable(GRADS[0])
    opt.update()
    np.testing.assert_array_equal(model.p.data, P0)


def test_hooks_see_only_params_with_grads():
    seen = []
    model = OneParam()
    opt = O.SGD().setup(model)
    opt.add_hook(lambda params: seen.append([p.name for p in params]))
    model.p.grad = tj.Variable(GRADS[0])
    opt.update()
    assert seen == [["p"]]


def test_base_optimizer_requires_update_one():
    model = OneParam()
    model.p.grad = tj.Variable(GRADS[0])
    with pytest.raises(NotImplementedError):
        O.Optimizer().setup(model).update()


@pytest.mark.parametrize("make_opt", [lambda: O.SGD(1.0), lambda: O.MomentumSGD(0.3),
                                      lambda: O.AdaGrad(0.3), lambda: O.Adam(0.05),
                                      lambda: O.AdaDelta()],
                         ids=["SGD", "MomentumSGD", "AdaGrad", "Adam", "AdaDelta"])
def test_training_on_spiral_decreases_loss(make_opt):
    train_set = Spiral()                       # seeds NumPy (1984)
    model = MLP((10, 3))
    opt = make_opt().setup(model)
    x, t = train_set.data, train_set.label
    losses = []
    for _ in range(30):
        loss = F.softmax_cross_entropy(model(x), t)
        model.cleargrads()
        loss.backward()
        opt.update()
        losses.append(float(loss.data))
    assert losses[-1] < losses[0] - 0.01, losses
    assert np.isfinite(losses).all()
