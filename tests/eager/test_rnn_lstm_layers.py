"""DeZero's layers Conv2d, Deconv2d, RNN, LSTM and BatchNorm: parameter shapes, lazy
sizes and DeZero's weight draws, values against NumPy references, hidden state and
reset_state(), running averages and test mode, and jitted training steps against eager.
"""
import warnings

import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F
import tracejit.layers as L
from tracejit import optimizers
from tracejit.models import Model

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")


def sigmoid(a):
    return 1 / (1 + np.exp(-a))


# ---------------------------------------------------------------- Conv2d / Deconv2d

def test_conv2d_layer_lazy_in_channels_and_dezero_draw():
    x = np.random.default_rng(0).standard_normal((2, 3, 5, 5)).astype(np.float32)
    np.random.seed(7)
    layer = L.Conv2d(4, 3, stride=2, pad=1)
    assert layer.W.data is None and layer.b.shape == (4,)
    y = layer(x)
    np.random.seed(7)
    W = np.random.randn(4, 3, 3, 3).astype(np.float32) * np.sqrt(1 / 27)
    np.testing.assert_allclose(layer.W.data, W, rtol=1e-6)
    assert layer.W.dtype == np.float32 and layer.in_channels == 3
    np.testing.assert_allclose(y.data, F.conv2d(x, W, np.zeros(4, np.float32), 2, 1).data,
                               rtol=1e-5, atol=1e-6)
    assert y.shape == (2, 4, 3, 3) and y.dtype == np.float32
    eager = L.Conv2d(4, (3, 2), nobias=True, in_channels=3, dtype=np.float64)
    assert eager.W.shape == (4, 3, 3, 2) and eager.W.dtype == np.float64 and eager.b is None


def test_deconv2d_layer():
    x = np.random.default_rng(1).standard_normal((2, 3, 4, 4)).astype(np.float32)
    layer = L.Deconv2d(5, 3, stride=2, pad=1)
    y = layer(x)
    assert layer.W.shape == (3, 5, 3, 3)
    assert y.shape == (2, 5, 2 * 3 + 3 - 2, 2 * 3 + 3 - 2)
    np.testing.assert_allclose(y.data, F.deconv2d(x, layer.W, layer.b, 2, 1).data)


# ---------------------------------------------------------------- RNN / LSTM references

def rnn_ref(layer, xs):
    Wx, bx, Wh = layer.x2h.W.data, layer.x2h.b.data, layer.h2h.W.data
    h, out = None, []
    for x in xs:
        a = x @ Wx + bx
        h = np.tanh(a if h is None else a + h @ Wh)
        out.append(h)
    return out


def lstm_ref(layer, xs):
    lin = {k: getattr(layer, k) for k in
           ("x2f", "x2i", "x2o", "x2u", "h2f", "h2i", "h2o", "h2u")}
    h = c = None
    out = []
    for x in xs:
        g = {k: x @ lin["x2" + k].W.data + lin["x2" + k].b.data for k in "fiou"}
        if h is not None:
            g = {k: g[k] + h @ lin["h2" + k].W.data for k in "fiou"}
        f, i, o, u = sigmoid(g["f"]), sigmoid(g["i"]), sigmoid(g["o"]), np.tanh(g["u"])
        c = i * u if c is None else f * c + i * u
        h = o * np.tanh(c)
        out.append(h)
    return out


@pytest.mark.parametrize("cell, ref", [(L.RNN, rnn_ref), (L.LSTM, lstm_ref)],
                         ids=["RNN", "LSTM"])
def test_recurrent_layers_state_and_reset(cell, ref):
    rng = np.random.default_rng(2)
    xs = rng.standard_normal((4, 3, 2))
    layer = cell(5, in_size=2)
    ys = [layer(x) for x in xs]
    for y, r in zip(ys, ref(layer, xs)):
        np.testing.assert_allclose(y.data, r, rtol=1e-5, atol=1e-6)
    assert layer.h is ys[-1]
    # Gradients flow back through the whole sequence (BPTT).
    F.sum(ys[-1]).backward()
    first = layer.x2h if cell is L.RNN else layer.x2f
    assert first.W.grad is not None
    layer.reset_state()
    assert layer.h is None and getattr(layer, "c", None) is None
    np.testing.assert_allclose(layer(xs[0]).data, ref(layer, xs[:1])[0], rtol=1e-5,
                               atol=1e-6)


def test_rnn_lazy_in_size_and_hidden_to_hidden_size():
    layer = L.RNN(4)
    layer(np.ones((2, 3)))
    layer(np.ones((2, 3)))
    assert layer.x2h.W.shape == (3, 4) and layer.h2h.W.shape == (4, 4)
    # With in_size given and unlike hidden_size, h2h still maps the hidden state.
    layer = L.RNN(4, in_size=3)
    assert layer.h2h.W.shape == (4, 4)
    layer(np.ones((2, 3)))
    assert layer(np.ones((2, 3))).shape == (2, 4)


# ---------------------------------------------------------------- jit: BPTT windows

class SeqNet(Model):
    def __init__(self, cell):
        super().__init__()
        self.rnn = cell(6)
        self.fc = L.Linear(1)

    def reset_state(self):
        self.rnn.reset_state()

    def forward(self, x):
        return self.fc(self.rnn(x))


def _seq_model(cell):
    np.random.seed(0)
    m = SeqNet(cell)
    # Two steps create every lazy weight (RNN's h2h on the second) with the same draws.
    m(np.zeros((2, 1)))
    m(np.zeros((2, 1)))
    m.reset_state()
    return m, optimizers.SGD(0.05).setup(m)


def _window_step(m, opt, reset):
    def step(xs, ts):
        if reset:
            m.reset_state()
        loss = 0
        for i in range(xs.shape[0]):        # unrolled by tracing
            loss = loss + F.mean_squared_error(m(xs[i]), ts[i])
        m.cleargrads()
        loss.backward()
        loss.unchain_backward()
        opt.update()
        if reset:
            m.reset_state()
        return loss
    return step


@pytest.mark.parametrize("cell", [L.RNN, L.LSTM], ids=["RNN", "LSTM"])
def test_recurrent_window_step_jit_matches_eager(cell):
    """A BPTT window (state reset at its start and end), backward and SGD, compiled:
    no fallback, every call's loss and parameters equal eager's."""
    (me, oe), (mj, oj) = _seq_model(cell), _seq_model(cell)
    estep, jstep = _window_step(me, oe, True), tj.jit(_window_step(mj, oj, True))
    rng = np.random.default_rng(3)
    for _ in range(5):
        xs, ts = rng.standard_normal((3, 2, 1)), rng.standard_normal((3, 2, 1))
        np.testing.assert_allclose(jstep(xs, ts).data, estep(xs, ts).data, rtol=1e-9)
        for pe, pj in zip(me.params(), mj.params()):
            np.testing.assert_allclose(pj.data, pe.data, rtol=1e-9, atol=1e-12)
    info = jstep.cache_info()
    assert info["fallbacks"] == 0 and info["traces"] == 1


@pytest.mark.parametrize("cell", [L.RNN, L.LSTM], ids=["RNN", "LSTM"])
def test_recurrent_state_carried_between_calls_matches_eager(cell):
    """Truncated BPTT as the book writes it: the state carries from one window into the
    next (unchain_backward between), reset_state every few windows: the state is
    threaded through the compiled calls, no fallback; every call equals eager, state
    included."""
    (me, oe), (mj, oj) = _seq_model(cell), _seq_model(cell)
    estep, jstep = _window_step(me, oe, False), tj.jit(_window_step(mj, oj, False))
    rng = np.random.default_rng(4)
    with warnings.catch_warnings():
        warnings.simplefilter("error", tj.JitWarning)
        for k in range(6):
            if k % 3 == 0:
                me.reset_state()
                mj.reset_state()
            xs, ts = rng.standard_normal((3, 2, 1)), rng.standard_normal((3, 2, 1))
            np.testing.assert_allclose(jstep(xs, ts).data, estep(xs, ts).data, rtol=1e-9)
            np.testing.assert_allclose(mj.rnn.h.data, me.rnn.h.data, rtol=1e-9)
            for pe, pj in zip(me.params(), mj.params()):
                np.testing.assert_allclose(pj.data, pe.data, rtol=1e-9, atol=1e-12)
    assert jstep.cache_info()["fallbacks"] == 0


# ---------------------------------------------------------------- BatchNorm layer

def test_batch_norm_layer_running_averages_and_test_mode(tmp_path):
    rng = np.random.default_rng(5)
    layer = L.BatchNorm()
    x = (rng.standard_normal((8, 3)) * 3 + 2).astype(np.float32)
    y = layer(x)
    assert layer.avg_mean.dtype == np.float32 and layer.gamma.shape == (3,)
    np.testing.assert_allclose(y.data.mean(axis=0), 0, atol=1e-5)
    np.testing.assert_allclose(layer.avg_mean.data, 0.1 * x.mean(axis=0), rtol=1e-5)
    np.testing.assert_allclose(layer.avg_var.data, 0.9 + 0.1 * x.var(axis=0, ddof=1),
                               rtol=1e-5)
    mean, var = layer.avg_mean.data.copy(), layer.avg_var.data.copy()
    with tj.test_mode():
        yt = layer(x)
    np.testing.assert_array_equal(layer.avg_mean.data, mean)      # not updated
    np.testing.assert_allclose(yt.data, (x - mean) / np.sqrt(var + 2e-5), rtol=1e-5)
    # The running averages are saved with the weights.
    path = str(tmp_path / "bn.npz")
    layer.save_weights(path)
    other = L.BatchNorm()
    other._init_params(x)
    other.load_weights(path)
    np.testing.assert_array_equal(other.avg_var.data, var)
