"""Compile time of one fused kernel against its size: picks fusion.MAX_VECMATH_OPS.

For n transcendental ops (tanh, exp, sin, sigmoid in a non-repeating order, each times
0.5) on a (3,) float64 input, the time of the slowest of three jitted calls (trace +
numba compile), each n in a fresh process and a fresh kernel cache directory:

    python benchmarks/bench_compile_bound.py [--bound 16] 8 16 32 64 128

--bound sets fusion.MAX_VECMATH_OPS for the run (a large value: one kernel per chain).
Measured on the 2-core project machine, one kernel per chain: 0.6 s (8), 1.3 s (16),
2.7 s (32), 6.2 s (64), 41 s (128); with the bound of 16: 128 ops in ~8 s (4-8 kernels).
"""
import argparse
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHILD = """
import sys, time, numpy as np
from tracejit.passes import fusion
fusion.MAX_VECMATH_OPS = int(sys.argv[2])
import tracejit as tj, tracejit.functions as F, tracejit.backends.numba as CG
ops = [F.tanh, F.exp, F.sin, F.sigmoid]
n = int(sys.argv[1])
def f(x):
    h = x
    for k in range(n):
        h = ops[(k * k + k // 3) % 4](h) * 0.5
    return F.sum(h)
jf = tj.jit(f)
ts = []
for c in range(3):
    t = time.perf_counter()
    jf(np.random.randn(3))
    ts.append(time.perf_counter() - t)
print(f"{n:5d} ops  {max(ts):7.2f} s  kernels {CG.stats()['kernels_built']}")
"""


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--bound", type=int, default=16)
    p.add_argument("sizes", nargs="*", type=int, default=[8, 16, 32, 64])
    a = p.parse_args()
    for n in a.sizes:
        with tempfile.TemporaryDirectory() as d:
            env = dict(os.environ, PYTHONPATH=ROOT, TRACEJIT_CACHE_DIR=d)
            subprocess.run([sys.executable, "-c", CHILD, str(n), str(a.bound)], env=env,
                           check=True)


if __name__ == "__main__":
    main()
