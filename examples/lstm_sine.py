"""An LSTM that predicts a noisy sine curve one step ahead (DeZero step 60): SinCurve
through SeqDataLoader, LSTM + Linear, truncated BPTT (backward, unchain_backward and
an Adam update every bptt_length steps), the state kept in the layer (model.rnn.h,
.c) as the book keeps it, trained jitted beside the same training run eagerly; the two
must agree epoch for epoch, with no fallback.

Two ways to jit the book's loop, both run:
  - step: the loop as the book writes it, its body `loss += step(x, t)` a jitted call
    (the backward every bptt_length steps runs outside, through the calls' compiled
    backwards and the state carried from one call to the next);
  - window: a jitted call per BPTT window, the time steps unrolled by tracing, with
    backward, unchain_backward and the update inside.
Either way tj.jit threads the state the layer rebinds (read when a call starts,
written back after it): the first call after reset_state(), with h None, is a variant
of its own. The default sizes are small so that CI runs this in seconds (the cold
kernel compile dominates); --full runs the book's sizes (hidden 100, BPTT 30, 100
epochs) and plots nothing (matplotlib is not needed).

Run: python examples/lstm_sine.py [--full] [--form step|window|both]
"""
import argparse
import time

import numpy as np

import tracejit as tj
import tracejit.functions as F
import tracejit.layers as L
from tracejit import optimizers
from tracejit.datasets import SinCurve
from tracejit.models import Model


class BetterRNN(Model):
    def __init__(self, hidden_size, out_size):
        super().__init__()
        self.rnn = L.LSTM(hidden_size)
        self.fc = L.Linear(out_size)

    def reset_state(self):
        self.rnn.reset_state()

    def forward(self, x):
        return self.fc(self.rnn(x))


def train_per_step(model, optimizer, loader, epochs, bptt, jit, seqlen):
    """The book's loop; only `step` is new (and jitted)."""
    def step(x, t):
        return F.mean_squared_error(model(x), t)
    if jit:
        step = tj.jit(step)
    losses = []
    for epoch in range(epochs):
        model.reset_state()
        loss, count = 0, 0
        for x, t in loader:
            loss += step(x, t)
            count += 1
            if count % bptt == 0 or count == seqlen:
                model.cleargrads()
                loss.backward()
                loss.unchain_backward()
                optimizer.update()
        losses.append(float(loss.data) / count)
    return losses, step


def train_per_window(model, optimizer, loader, epochs, bptt, jit):
    """The same training, a jitted call per window of bptt steps."""
    def window(xs, ts):
        loss = 0
        for i in range(xs.shape[0]):          # unrolled by tracing
            loss += F.mean_squared_error(model(xs[i]), ts[i])
        model.cleargrads()
        loss.backward()
        loss.unchain_backward()
        optimizer.update()
        return loss
    if jit:
        window = tj.jit(window)
    losses = []
    for epoch in range(epochs):
        model.reset_state()
        total, count, xs, ts = 0.0, 0, [], []
        for x, t in loader:
            xs.append(x)
            ts.append(t)
            count += 1
            if len(xs) == bptt:
                total += float(window(np.stack(xs), np.stack(ts)).data)
                xs, ts = [], []
        # The last steps of an epoch that fill no window are dropped (the book computes
        # their loss but never backpropagates it: its `count == seqlen` never holds
        # within an epoch's 34 steps).
        losses.append(total / count)
    return losses, window


def train(form, epochs, hidden, bptt, batch, jit):
    train_set = SinCurve(train=True)          # draws its noise from NumPy's global stream
    loader = tj.SeqDataLoader(train_set, batch_size=batch)
    np.random.seed(0)
    model = BetterRNN(hidden, 1)
    optimizer = optimizers.Adam().setup(model)
    t0 = time.perf_counter()
    if form == "step":
        losses, fn = train_per_step(model, optimizer, loader, epochs, bptt, jit,
                                    len(train_set))
    else:
        losses, fn = train_per_window(model, optimizer, loader, epochs, bptt, jit)
    seconds = time.perf_counter() - t0
    for epoch in sorted({0, epochs // 2, epochs - 1}):
        print(f"  {form:6s} {'jit  ' if jit else 'eager'} epoch {epoch + 1:3d}  loss "
              f"{losses[epoch]:.5f}")
    if jit:
        info = fn.cache_info()
        print(f"  jitted {form}: {info}")
        assert info["fallbacks"] == 0, info
    return model, losses, seconds


def predict_cosine(model, n=200):
    # The test set is a cosine: feed it one value at a time, state carried.
    test = SinCurve(train=False)
    model.reset_state()
    pred = []
    with tj.no_grad():
        for x in test.data[:n]:
            pred.append(model(x.reshape(1, 1)).data.item())
    return np.array(pred), test.label[:n, 0]


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--full", action="store_true",
                   help="the book's sizes: hidden 100, BPTT 30, batch 30, 100 epochs")
    p.add_argument("--form", choices=("step", "window", "both"), default="both")
    args = p.parse_args()
    # SinCurve (999 points) in batches of 30: 34 steps an epoch, three windows of 11 in
    # the small run.
    epochs, hidden, bptt = (100, 100, 30) if args.full else (10, 20, 11)
    for form in (("step", "window") if args.form == "both" else (args.form,)):
        np.random.seed(0)
        model, losses, t_jit = train(form, epochs, hidden, bptt, 30, jit=True)
        np.random.seed(0)
        _, eager_losses, t_eager = train(form, epochs, hidden, bptt, 30, jit=False)
        np.testing.assert_allclose(losses, eager_losses, rtol=1e-7)
        print(f"{form}: jitted and eager training agree epoch by epoch (jit {t_jit:.2f} s "
              f"including its compile, eager {t_eager:.2f} s)")
        assert losses[-1] < 0.7 * losses[0], losses
        pred, want = predict_cosine(model)
        print(f"{form}: cosine one step ahead: mean absolute error "
              f"{np.abs(pred - want).mean():.3f}")


if __name__ == "__main__":
    main()
