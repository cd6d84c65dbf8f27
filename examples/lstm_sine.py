"""An LSTM that predicts a noisy sine curve one step ahead (DeZero step 60): SinCurve
through SeqDataLoader, LSTM + Linear, truncated BPTT (backward, unchain_backward and
an Adam update every bptt_length steps, the state carried into the next window), the
window compiled with @tj.jit beside the same training run eagerly; the two must agree
window for window, with no fallback.

The jitted window takes the LSTM's state (h, c) as arguments and returns the new one.
The book's loop keeps it in the layer (model.rnn.h), and a compiled call cannot rebind
that attribute to the new state (tj.jit runs such a function eagerly, with a
JitWarning saying so); passing the state through the call compiles the same
computation. The default sizes are small so that CI runs this in seconds (the cold
kernel compile dominates); --full runs the book's sizes (hidden 100, BPTT 30, 100
epochs) and plots nothing (matplotlib is not needed).

Run: python examples/lstm_sine.py [--full]
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


def make_window(model, optimizer):
    """One BPTT window: xs, ts (steps, batch, 1) and the state in; loss and state out."""
    def window(xs, ts, h, c):
        model.rnn.h, model.rnn.c = h, c
        loss = 0
        for i in range(xs.shape[0]):          # unrolled by tracing
            loss = loss + F.mean_squared_error(model(xs[i]), ts[i])
        model.cleargrads()
        loss.backward()
        loss.unchain_backward()               # the next window starts from h, c alone
        optimizer.update()
        h, c = model.rnn.h, model.rnn.c
        model.rnn.reset_state()               # the layer keeps no state between calls
        return loss, h, c
    return window


def train(epochs, hidden, bptt, batch, jit):
    train_set = SinCurve(train=True)          # draws its noise from NumPy's global stream
    loader = tj.SeqDataLoader(train_set, batch_size=batch)
    np.random.seed(0)
    model = BetterRNN(hidden, 1)
    optimizer = optimizers.Adam().setup(model)
    window = make_window(model, optimizer)
    if jit:
        window = tj.jit(window)
    losses = []
    t0 = time.perf_counter()
    for epoch in range(epochs):
        h = c = None                          # the book's model.reset_state()
        xs, ts = [], []
        total = 0.0
        for x, t in loader:
            xs.append(x)
            ts.append(t)
            if len(xs) == bptt:               # the book's `count % bptt_length == 0`
                loss, h, c = window(np.stack(xs), np.stack(ts), h, c)
                total += float(loss.data)
                xs, ts = [], []
        # The last steps of an epoch that fill no window are dropped, as in the book:
        # its `count == seqlen` (999) never holds within an epoch's 34 steps.
        losses.append(total / len(train_set))
        if epoch % max(1, epochs // 5) == 0 or epoch == epochs - 1:
            print(f"  {'jit  ' if jit else 'eager'} epoch {epoch + 1:3d}  loss "
                  f"{losses[-1]:.5f}")
    seconds = time.perf_counter() - t0
    if jit:
        info = window.cache_info()
        print(f"  jitted window: {info}")
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
    args = p.parse_args()
    # SinCurve (999 points) in batches of 30: 34 steps an epoch, three windows of 11 in
    # the small run (one window shape: compiled for h None, then for a carried h).
    epochs, hidden, bptt = (100, 100, 30) if args.full else (10, 20, 11)
    np.random.seed(0)
    model, losses, t_jit = train(epochs, hidden, bptt, 30, jit=True)
    np.random.seed(0)
    _, eager_losses, t_eager = train(epochs, hidden, bptt, 30, jit=False)
    np.testing.assert_allclose(losses, eager_losses, rtol=1e-7)
    print(f"jitted and eager training agree epoch by epoch (jit {t_jit:.2f} s including "
          f"its compile, eager {t_eager:.2f} s)")
    assert losses[-1] < 0.7 * losses[0], losses
    pred, want = predict_cosine(model)
    print(f"cosine one step ahead: mean absolute error {np.abs(pred - want).mean():.3f}")


if __name__ == "__main__":
    main()
