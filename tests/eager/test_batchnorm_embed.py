"""batch_norm / batch_nrom (DeZero's spelling), embed_id, and DeZero's Function classes
Linear, Softmax, LogSoftmax, MeanSquaredError, SoftmaxCrossEntropy, BatchNorm.

batch_norm against DeZero's NumPy forward (train and test mode, running averages
updated in place by DeZero's rule), gradients against central differences over drawn
shapes, and compiled training steps against eager, call after call.
"""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import tracejit as tj
import tracejit.functions as F
import tracejit.layers as L
from tracejit.testing import assert_jit_matches_eager, gradcheck

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")


def dezero_batch_norm(x, gamma, beta, mean, var, decay, eps, train):
    """DeZero's BatchNorm.forward, transcribed (x as (N*H*W, C) for 4-D)."""
    x4 = x.ndim == 4
    if x4:
        N, C, H, W = x.shape
        x = x.transpose(0, 2, 3, 1).reshape(-1, C)
    if train:
        mu, v = x.mean(axis=0), x.var(axis=0)
        xc = (x - mu) / np.sqrt(v + eps)
        m = x.size // gamma.size
        s = m - 1. if m - 1. > 1. else 1.
        mean *= decay
        mean += (1 - decay) * mu
        var *= decay
        var += (1 - decay) * (m / s) * v
    else:
        xc = (x - mean) / np.sqrt(var + eps)
    y = gamma * xc + beta
    if x4:
        y = y.reshape(N, H, W, C).transpose(0, 3, 1, 2)
    return y


@st.composite
def bn_problems(draw):
    four = draw(st.booleans(), label="4-D")
    C = draw(st.integers(1, 3), label="C")
    N = draw(st.integers(1 if four else 2, 4), label="N")
    shape = (N, C, draw(st.integers(1, 3)), draw(st.integers(1, 3))) if four else (N, C)
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 16), label="seed"))
    x = rng.standard_normal(shape) * 2 + 1
    gamma, beta = rng.standard_normal(C), rng.standard_normal(C)
    mean, var = rng.standard_normal(C), rng.uniform(0.5, 2, C)
    decay = draw(st.sampled_from([0.9, 0.5]), label="decay")
    return x, gamma, beta, mean, var, decay


@given(bn_problems(), st.booleans(), st.sampled_from([np.float64, np.float32]))
def test_batch_norm_matches_dezero(p, train, dtype):
    x, gamma, beta, mean, var, decay = [a.astype(dtype) if isinstance(a, np.ndarray) else a
                                        for a in p]
    m_ref, v_ref = mean.copy(), var.copy()
    ref = dezero_batch_norm(x, gamma, beta, m_ref, v_ref, decay, 2e-5, train)
    fn = F.batch_nrom if train else F.batch_norm
    with tj.using_config("train", train):
        y = fn(x, gamma, beta, mean, var, decay)
    tol = 1e-4 if dtype == np.float32 else 1e-10
    assert y.dtype == dtype and mean.dtype == dtype and var.dtype == dtype
    np.testing.assert_allclose(y.data, ref, rtol=tol, atol=tol)
    np.testing.assert_allclose(mean, m_ref, rtol=tol, atol=tol)
    np.testing.assert_allclose(var, v_ref, rtol=tol, atol=tol)


@given(bn_problems(), st.booleans())
def test_batch_norm_gradients(p, train):
    x, gamma, beta, mean, var, decay = p
    with tj.using_config("train", train):
        # Fresh running averages per call: the numeric gradient calls f many times.
        gradcheck(lambda a, g, b: F.batch_norm(a, g, b, mean.copy(), var.copy(), decay),
                  x, gamma, beta, second_order=True, atol=1e-5, rtol=1e-3)


def test_batch_norm_class_and_bad_shapes():
    rng = np.random.default_rng(0)
    x, g, b = rng.standard_normal((4, 3)), np.ones(3), np.zeros(3)
    m1, v1, m2, v2 = np.zeros(3), np.ones(3), np.zeros(3), np.ones(3)
    y1 = F.BatchNorm(m1, v1, 0.9, 2e-5)(x, g, b)
    y2 = F.batch_norm(x, g, b, m2, v2)
    np.testing.assert_array_equal(y1.data, y2.data)
    np.testing.assert_array_equal(m1, m2)
    with pytest.raises(ValueError, match="2-D .* or 4-D"):
        F.batch_norm(np.zeros((2, 3, 4)), g, b, m1, v1)
    with pytest.raises(ValueError, match="gamma must have shape"):
        F.batch_norm(x, np.ones(2), b, m1, v1)


def test_embed_id_rows_and_gradient():
    rng = np.random.default_rng(1)
    W = rng.standard_normal((5, 3))
    ids = np.array([[0, 4], [4, 2]])
    y = F.embed_id(ids, W)
    np.testing.assert_array_equal(y.data, W[ids])
    # A repeated id gets the sum of its rows' gradients.
    gradcheck(lambda w: F.embed_id(ids, w), W, second_order=True)
    layer = L.EmbedID(5, 3)
    assert layer.W.shape == (5, 3)
    np.testing.assert_array_equal(layer(ids).data, layer.W.data[ids])


# ---------------------------------------------------------------- Function classes

RNG = np.random.default_rng(2)
X = RNG.standard_normal((4, 3))
T = np.array([0, 2, 1, 1])


@pytest.mark.parametrize("make, args, ref", [
    (lambda: F.Linear(), (X, RNG.standard_normal((3, 2)), RNG.standard_normal(2)),
     lambda x, W, b: x @ W + b),
    (lambda: F.Linear(), (X, RNG.standard_normal((3, 2)), None), lambda x, W, b: x @ W),
    (lambda: F.Softmax(), (X,), lambda x: F.softmax(x).data),
    (lambda: F.Softmax(0), (X,), lambda x: F.softmax(x, 0).data),
    (lambda: F.LogSoftmax(0), (X,), lambda x: F.log_softmax(x, 0).data),
    (lambda: F.MeanSquaredError(), (X, X[::-1] * 0.5),
     lambda a, b: ((a - b) ** 2).sum() / len(a)),
    (lambda: F.SoftmaxCrossEntropy(), (X, T), lambda x, t: F.softmax_cross_entropy(x, t).data),
], ids=["Linear", "Linear-nobias", "Softmax", "Softmax-0", "LogSoftmax-0", "MSE", "SCE"])
def test_function_classes(make, args, ref):
    y = make()(*args)
    np.testing.assert_allclose(y.data, ref(*args), rtol=1e-12, atol=1e-12)
    f32 = [a.astype(np.float32) if isinstance(a, np.ndarray) and a.dtype.kind == "f" else a
           for a in args]
    assert make()(*f32).dtype == np.float32
    # jit=True: the class under jit too (values, gradients, no fallback).
    gradcheck(lambda *xs: make()(*xs), *[a for a in args], second_order=True, jit=True)


# ---------------------------------------------------------------- jit

@pytest.mark.parametrize("four", [False, True], ids=["2-D", "4-D"])
def test_batch_norm_training_step_jit_matches_eager(four):
    """Train-mode steps update avg_mean / avg_var in place (and SGD the rest): compiled,
    every call equals eager, running averages included; then test mode, compiled."""
    from tracejit.models import Sequential
    rng = np.random.default_rng(6)
    shape = (4, 2, 4, 4) if four else (6, 3)

    def make():
        np.random.seed(5)
        first = L.Conv2d(3, 3, pad=1) if four else L.Linear(4)
        m = Sequential(first, L.BatchNorm(), F.relu, F.flatten, L.Linear(2))
        m(np.ones(shape, np.float32))      # lazy parameters created, same draws
        return m

    def step_of(m):
        def step(x, t):
            loss = F.softmax_cross_entropy(m(x), t)
            m.cleargrads()
            loss.backward()
            for p in m.params():
                if p.grad is not None:
                    p.data -= 0.1 * p.grad.data
            return loss
        return step

    me, mj = make(), make()
    estep, jstep = step_of(me), tj.jit(step_of(mj))
    for _ in range(4):
        x = rng.standard_normal(shape).astype(np.float32)
        t = rng.integers(0, 2, shape[0])
        np.testing.assert_allclose(jstep(x, t).data, estep(x, t).data, rtol=1e-5)
        for pe, pj in zip(me.params(), mj.params()):
            np.testing.assert_allclose(pj.data, pe.data, rtol=1e-5, atol=1e-6)
    assert jstep.cache_info()["fallbacks"] == 0
    with tj.test_mode():
        before = [p.data.copy() for p in mj.params()]
        assert_jit_matches_eager(lambda x: mj(x), rng.standard_normal(shape).astype(np.float32),
                                 rtol=1e-5, atol=1e-6)
        for b, p in zip(before, mj.params()):
            np.testing.assert_array_equal(b, p.data)      # test mode updates nothing
