"""The book's training loops, compiled, equal eager's over 300 steps, with no fallback.

Truncated BPTT as step 60 writes it: the state stays in the layer (`model.rnn.h`,
`.c`), rebound by every step, `reset_state()` between sequences, and every
bptt_length steps `backward()`, `unchain_backward()` and an update. Both ways of
compiling it:
  - per step: `loss += step(x, t)` with `step` jitted, the backward outside, through
    the calls' compiled backwards (the state's graph carried from call to call);
  - per window: the window's steps, backward, unchain_backward and the update inside
    one jitted call.
For L.LSTM and L.RNN (hidden 8, batch 2), every step's loss, and after every update
the gradients and the parameters, equal eager's; so do the state left in the layer
and, in the window form, the state's gradient. (A CNN training step over 300 steps:
tests/eager/test_conv_functions.py.)
"""
import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F
import tracejit.layers as L
from tracejit import optimizers
from tracejit.datasets import SinCurve
from tracejit.models import Model

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")

STEPS = 300
BPTT = 10
SEQUENCE = 50          # reset_state() every this many steps


class SeqNet(Model):
    def __init__(self, cell, hidden):
        super().__init__()
        self.rnn = cell(hidden)
        self.fc = L.Linear(1)

    def reset_state(self):
        self.rnn.reset_state()

    def forward(self, x):
        return self.fc(self.rnn(x))


def _data():
    np.random.seed(7)
    loader = tj.SeqDataLoader(SinCurve(train=True), batch_size=2)
    pairs = []
    for x, t in loader:
        pairs.append((x, t))
        if len(pairs) == STEPS:
            break
    return pairs


def _model(cell):
    np.random.seed(0)
    model = SeqNet(cell, 8)
    return model, optimizers.Adam().setup(model)


def _snapshot(model):
    return ([p.data.copy() for p in model.params()],
            [None if p.grad is None else p.grad.data.copy() for p in model.params()])


def _state(model):
    return [None if v is None else v.data.copy() for v in
            (model.rnn.h, getattr(model.rnn, "c", None))]


def _close(a, b, what):
    assert (a is None) == (b is None), what
    if a is not None:
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-9, err_msg=what)


def per_step(cell, jit):
    """The book's loop, the step compiled: `loss += step(x, t)`, backward outside."""
    model, opt = _model(cell)

    def step(x, t):
        return F.mean_squared_error(model(x), t)
    run = tj.jit(step) if jit else step
    log = []
    loss = 0
    for n, (x, t) in enumerate(_data(), 1):
        if n % SEQUENCE == 1:
            model.reset_state()
            loss = 0
        lo = run(x, t)
        loss += lo
        log.append(("loss", float(lo.data)))
        if n % BPTT == 0:
            model.cleargrads()
            loss.backward()
            loss.unchain_backward()
            opt.update()
            assert model.rnn.h.creator is None      # cut, as eager's
            log.append(("update", float(loss.data), _snapshot(model), _state(model)))
    return log, (run.cache_info() if jit else None)


def per_window(cell, jit):
    """The window compiled: BPTT steps, backward, unchain_backward and the update."""
    model, opt = _model(cell)

    def window(xs, ts):
        loss = 0
        for i in range(xs.shape[0]):             # unrolled by tracing
            loss += F.mean_squared_error(model(xs[i]), ts[i])
        model.cleargrads()
        loss.backward()
        loss.unchain_backward()
        opt.update()
        return loss
    run = tj.jit(window) if jit else window
    data = _data()
    log = []
    for w in range(STEPS // BPTT):
        if (w * BPTT) % SEQUENCE == 0:
            model.reset_state()
        h_in = model.rnn.h
        chunk = data[w * BPTT:(w + 1) * BPTT]
        loss = run(np.stack([x for x, _ in chunk]), np.stack([t for _, t in chunk]))
        assert model.rnn.h.creator is None
        # The state the window started from is a leaf of its graph: it gets a .grad.
        gh = None if h_in is None or h_in.grad is None else h_in.grad.data.copy()
        log.append(("update", float(loss.data), _snapshot(model), _state(model), gh))
    return log, (run.cache_info() if jit else None)


def _compare(got, want):
    assert len(got) == len(want)
    for k, (g, w) in enumerate(zip(got, want)):
        assert g[0] == w[0]
        np.testing.assert_allclose(g[1], w[1], rtol=1e-6, err_msg=f"entry {k}: loss")
        if g[0] == "loss":
            continue
        (gp, gg), (wp, wg) = g[2], w[2]
        for i, (a, b) in enumerate(zip(gp + gg, wp + wg)):
            _close(a, b, f"entry {k}: parameter or gradient {i}")
        for i, (a, b) in enumerate(zip(g[3], w[3])):
            _close(a, b, f"entry {k}: state {i}")
        if len(g) > 4:
            _close(g[4], w[4], f"entry {k}: the state's gradient")


@pytest.mark.parametrize("cell", [L.LSTM, L.RNN], ids=["LSTM", "RNN"])
@pytest.mark.parametrize("form", [per_step, per_window], ids=["per_step", "per_window"])
def test_truncated_bptt_state_in_the_layer_matches_eager(form, cell):
    want, _ = form(cell, jit=False)
    got, info = form(cell, jit=True)
    _compare(got, want)
    assert info["fallbacks"] == 0, info
    # Two variants: the first step (window) after reset_state(), with h None, and the
    # ones after it; every other call after the first few is a compiled hit.
    assert info["variants"] == 2, info
    assert info["hits"] >= info["calls"] - 8, info

