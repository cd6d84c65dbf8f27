"""ONNX Runtime on exported graphs vs the jitted call (informative, issue 12).

  W1  the 10-op elementwise chains of run.py, forward, N = 1e6 float64
  W3  Goldstein-Price value + gradient on 0-d arrays (dispatch-bound)
  W4  MLP 784-256-10, batch 128, float32: loss and the four gradients (the optimizer's
      in-place update is no part of a model: export refuses effects)

Median of `--rounds` timed blocks per implementation, interleaved. Needs
`pip install 'tracejit[onnx]'`. Run: python benchmarks/bench_export_onnx.py [--quick]
"""
import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import onnxruntime as ort  # noqa: E402

import tracejit as tj  # noqa: E402
import tracejit.functions as F  # noqa: E402
from tracejit.models import MLP  # noqa: E402

from run import chain_mem, chain_trans, goldstein_price  # noqa: E402


def session(ex):
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    return ort.InferenceSession(ex.to_onnx().SerializeToString(), opts,
                                providers=["CPUExecutionProvider"])


def timed(fns, rounds, min_time):
    """name -> median seconds per call, the implementations interleaved per round."""
    times = {k: [] for k in fns}
    for f in fns.values():
        f()                                    # warm: compiles, session set-up
    for _ in range(rounds):
        for k, f in fns.items():
            n, t0 = 0, time.perf_counter()
            while True:
                f()
                n += 1
                dt = time.perf_counter() - t0
                if dt >= min_time:
                    break
            times[k].append(dt / n)
    return {k: float(np.median(v)) for k, v in times.items()}


def report(title, res):
    base = res["tracejit jit"]
    print(title)
    for k, v in res.items():
        print(f"  {k:<24} {v * 1e6:10.1f} us   {v / base:5.2f}x")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true")
    a = p.parse_args()
    rounds, min_time = (3, 0.05) if a.quick else (7, 0.2)
    rng = np.random.default_rng(0)

    n = 10 ** 5 if a.quick else 10 ** 6
    x, y = rng.random(n), rng.random(n)
    for name, chain in (("add/mul", chain_mem), ("transcendental", chain_trans)):
        def f(x, y, chain=chain):
            return chain(tj.Variable(x), tj.Variable(y))
        ex = tj.export(f, x, y, dynamic={"x": {0: "n"}, "y": {0: "n"}})
        s, jf = session(ex), tj.jit(f)
        report(f"W1 {name} chain forward, N={n:.0e}", timed({
            "tracejit jit": lambda: jf(x, y),
            "onnxruntime": lambda: s.run(None, {"x": x, "y": y}),
        }, rounds, min_time))

    vg = tj.value_and_grad(goldstein_price, argnums=(0, 1))
    x0, y0 = np.array(0.3), np.array(-0.2)
    s, jf = session(tj.export(vg, x0, y0)), tj.jit(vg)
    report("W3 Goldstein-Price value+gradient, 0-d", timed({
        "tracejit jit": lambda: jf(x0, y0),
        "onnxruntime": lambda: s.run(None, {"x": x0, "y": y0}),
    }, rounds, min_time))

    xb = rng.standard_normal((128, 784)).astype(np.float32)
    t = rng.integers(0, 10, 128)
    np.random.seed(0)
    model = MLP((256, 10), activation=F.relu)

    def grads(x, t):
        loss = F.softmax_cross_entropy(model(x), t)
        model.cleargrads()
        loss.backward()
        return loss

    model(xb)
    s, jf = session(tj.export(grads, xb, t)), tj.jit(grads)
    report("W4 MLP 784-256-10 loss + gradients, batch 128, float32", timed({
        "tracejit jit": lambda: jf(xb, t),
        "onnxruntime": lambda: s.run(None, {"x": xb, "t": t}),
    }, rounds, min_time))


if __name__ == "__main__":
    main()
