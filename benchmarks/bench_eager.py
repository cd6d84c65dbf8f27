"""Eager tracejit against hand-written NumPy: dispatch cost, large arrays, backward scaling.

    python benchmarks/bench_eager.py

Cases:
  small  0-d Goldstein-Price, forward and forward+backward (dispatch-bound: every op
         pays Function.__call__ and Variable overhead on a one-element array)
  large  a 10-op add/mul chain on 4e6-element float64 arrays, forward and
         forward+backward (NumPy backward written by hand)
  chain  backward of a 1,000- and a 10,000-node chain; the 10k/1k time ratio should
         stay near 10 (linear), far below 15

Measurements are interleaved (round-robin over the variants of a case, then the
median of the repeats), so drift in machine load hits every variant alike.
Prints a table only; asserts nothing.
"""
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tracejit as tj  # noqa: E402
import tracejit.functions as F  # noqa: E402


def measure(variants, repeats, number=1):
    """Median seconds per call of each variant, measured round-robin."""
    times = {name: [] for name in variants}
    for _ in range(repeats):
        for name, fn in variants.items():
            t0 = time.perf_counter()
            for _ in range(number):
                fn()
            times[name].append((time.perf_counter() - t0) / number)
    return {name: statistics.median(ts) for name, ts in times.items()}


# ---------------------------------------------------------------- small: Goldstein-Price

def goldstein_price(x, y):
    """Works on Variables and on ndarrays alike."""
    a = x + y + 1
    p = 19 - 14 * x + 3 * x ** 2 - 14 * y + 6 * x * y + 3 * y ** 2
    b = 2 * x - 3 * y
    q = 18 - 32 * x + 12 * x ** 2 + 48 * y - 36 * x * y + 27 * y ** 2
    return (1 + a ** 2 * p) * (30 + b ** 2 * q)


def goldstein_price_grad_numpy(x, y):
    """Forward and hand-derived gradient with NumPy."""
    a = x + y + 1
    p = 19 - 14 * x + 3 * x ** 2 - 14 * y + 6 * x * y + 3 * y ** 2
    b = 2 * x - 3 * y
    q = 18 - 32 * x + 12 * x ** 2 + 48 * y - 36 * x * y + 27 * y ** 2
    A = 1 + a ** 2 * p
    B = 30 + b ** 2 * q
    dp = -14 + 6 * x + 6 * y                       # dp/dx == dp/dy
    dA_dx = 2 * a * p + a ** 2 * dp
    dA_dy = dA_dx
    dB_dx = 4 * b * q + b ** 2 * (-32 + 24 * x - 36 * y)
    dB_dy = -6 * b * q + b ** 2 * (48 - 36 * x + 54 * y)
    return A * B, dA_dx * B + A * dB_dx, dA_dy * B + A * dB_dy


def bench_small(rows):
    x0, y0 = np.array(1.0), np.array(1.0)

    def tj_forward():
        return goldstein_price(tj.Variable(x0), tj.Variable(y0))

    def tj_backward():
        x, y = tj.Variable(x0), tj.Variable(y0)
        z = goldstein_price(x, y)
        z.backward()
        return x.grad, y.grad

    x, y = tj.Variable(x0), tj.Variable(y0)
    goldstein_price(x, y).backward()
    _, gx, gy = goldstein_price_grad_numpy(x0, y0)
    err = max(abs(float(x.grad.data - gx)), abs(float(y.grad.data - gy)))

    t = measure({"tj": tj_forward, "np": lambda: goldstein_price(x0, y0)}, repeats=15,
                number=200)
    rows.append(("small 0-d Goldstein-Price forward", t["tj"], t["np"], ""))
    t = measure({"tj": tj_backward, "np": lambda: goldstein_price_grad_numpy(x0, y0)},
                repeats=15, number=100)
    rows.append(("small 0-d Goldstein-Price fwd+bwd", t["tj"], t["np"],
                 f"grad |diff| {err:.1e}"))


# ---------------------------------------------------------------- large: a 10-op chain

N_LARGE = 4_000_000


def chain(x, a):
    """10 elementwise ops: five rounds of y = y * a + x."""
    y = x
    for _ in range(5):
        y = y * a
        y = y + x
    return y


def chain_grad_numpy(x, a):
    """Forward, then the gradient of sum(chain(x, a)) by hand, keeping what backward needs."""
    ys = [x]
    y = x
    for _ in range(5):
        ys.append(y)                # the input of this round's multiply
        y = y * a
        y = y + x
    g = np.ones_like(y)
    gx = np.zeros_like(x)
    ga = np.zeros_like(a)
    for k in range(5, 0, -1):
        gx += g                     # y = t + x
        ga += g * ys[k]             # t = y_prev * a
        g = g * a
    gx += g                         # the chain's first y is x
    return y, gx, ga


def bench_large(rows):
    rng = np.random.default_rng(0)
    x0 = rng.uniform(-1, 1, N_LARGE)
    a0 = rng.uniform(-1, 1, N_LARGE)

    def tj_backward():
        x, a = tj.Variable(x0), tj.Variable(a0)
        F.sum(chain(x, a)).backward()
        return x.grad, a.grad

    x, a = tj.Variable(x0), tj.Variable(a0)
    F.sum(chain(x, a)).backward()
    _, gx, ga = chain_grad_numpy(x0, a0)
    err = max(float(np.max(np.abs(x.grad.data - gx))), float(np.max(np.abs(a.grad.data - ga))))
    del x, a

    t = measure({"tj": lambda: chain(tj.Variable(x0), tj.Variable(a0)),
                 "np": lambda: chain(x0, a0)}, repeats=5)
    rows.append(("large 4e6 10-op chain forward", t["tj"], t["np"], ""))
    t = measure({"tj": tj_backward, "np": lambda: chain_grad_numpy(x0, a0)}, repeats=5)
    rows.append(("large 4e6 10-op chain fwd+bwd", t["tj"], t["np"], f"grad |diff| {err:.1e}"))


# ---------------------------------------------------------------- backward scaling

def bench_chain_backward(rows):
    def build(n):
        x = tj.Variable(np.array(1.0))
        y = x
        for _ in range(n):
            y = y * 1.0001 + 0.5
        return y

    graphs = {}

    def runner(n):
        def run():
            graphs[n].backward()
        return run

    times = {1000: [], 10000: []}
    for _ in range(5):
        for n in times:
            graphs[n] = build(n)              # building is not timed
            t0 = time.perf_counter()
            runner(n)()
            times[n].append(time.perf_counter() - t0)
            graphs[n] = None
    t1k, t10k = statistics.median(times[1000]), statistics.median(times[10000])
    rows.append(("backward 1,000-node chain", t1k, None, ""))
    rows.append(("backward 10,000-node chain", t10k, None,
                 f"10k/1k ratio {t10k / t1k:.1f} (linear: 10)"))


def fmt(seconds):
    if seconds is None:
        return "-"
    if seconds < 1e-3:
        return f"{seconds * 1e6:9.1f} us"
    if seconds < 1:
        return f"{seconds * 1e3:9.2f} ms"
    return f"{seconds:9.3f} s "


def main():
    start = time.perf_counter()
    rows = []
    bench_small(rows)
    bench_large(rows)
    bench_chain_backward(rows)
    print(f"tracejit {tj.__version__} eager vs NumPy (median of interleaved repeats)")
    print(f"{'case':38s} {'tracejit':>12s} {'numpy':>12s} {'ratio':>8s}  note")
    for name, t_tj, t_np, note in rows:
        ratio = f"{t_tj / t_np:7.1f}x" if t_np else "-"
        print(f"{name:38s} {fmt(t_tj):>12s} {fmt(t_np):>12s} {ratio:>8s}  {note}")
    print(f"total benchmark time {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
