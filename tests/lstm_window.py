"""The book's step 60 in small, for tests of the fusion steps W7 exercises: LSTM +
Linear over a window of `steps`, backward and SGD inside the window function."""
import numpy as np

import tracejit.functions as F
import tracejit.layers as L


def lstm_window(seed, *, steps=3, hidden=3, batch=2):
    """(window(xs, ts) -> loss, the parameters it trains)."""
    np.random.seed(seed)
    rnn, fc = L.LSTM(hidden), L.Linear(1)
    x0 = np.zeros((batch, 1))
    fc(rnn(x0))
    fc(rnn(x0))                     # the second call creates the h2* weights
    rnn.reset_state()
    params = [p for layer in (rnn, fc) for p in layer.params()]

    def window(xs, ts):
        rnn.reset_state()
        loss = 0
        for i in range(steps):
            loss = loss + F.mean_squared_error(fc(rnn(xs[i])), ts[i])
        for p in params:
            p.cleargrad()
        loss.backward()
        for p in params:
            p.data -= 0.05 * p.grad.data
        return loss
    return window, params


def assert_step_matches(loss, loss_e, params, params_e):
    """A jitted window's loss, gradients and updated parameters against eager's twin."""
    assert loss.data.dtype == loss_e.data.dtype
    np.testing.assert_allclose(loss.data, loss_e.data, rtol=1e-10, atol=1e-12)
    for p, pe in zip(params, params_e):
        assert p.grad.data.dtype == pe.grad.data.dtype
        np.testing.assert_allclose(p.grad.data, pe.grad.data, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(p.data, pe.data, rtol=1e-10, atol=1e-12)
