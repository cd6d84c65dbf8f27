"""Kernel benchmark: 10-op elementwise chains through each backend vs hand-written code.

Chains: memory-bound (add/mul) and transcendental (tanh/sin/exp with add/mul), forward
and forward+backward (the backward written out by hand with the primitives' rules),
N = 1e3, 1e5, 4e6, float64. Columns: interpret backend, codegen (numba) backend,
hand-written NumPy, a hand-fused numba prange loop. One interleaved run (each repeat
runs every column in turn), medians; plus cold compile time and peak traced memory.

    python benchmarks/bench_kernels.py [--quick]
"""
import math
import os
import sys
import tempfile
import time
import tracemalloc

import numba
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TRACEJIT_CACHE_DIR", tempfile.mkdtemp(prefix="tj_bench_"))

import tracejit.functions as F  # noqa: E402
from tracejit import interpret  # noqa: E402
from tracejit.backends.numba import plan as codegen
from tracejit.ir import Graph, Lit, Node, Value  # noqa: E402

C = [0.9, 1.1, 0.7, 1.3, 0.5]


class B:
    def __init__(self):
        self.inputs, self.nodes = [], []

    def input(self, shape):
        v = Value(shape, np.float64)
        self.inputs.append(v)
        return v

    def op(self, fn, *ins):
        spec = fn.shape_rule(*[v.spec for v in ins])
        out = Value(spec.shape, spec.dtype)
        self.nodes.append(Node(fn, ins, [out]))
        return out


def lit(c):
    return Lit(c, np.float64)


def memory_graph(n, backward):
    """t = ((x + y) * c0 + y) * c1 ... (10 ops); backward: gx, gy for a given gy_out."""
    b = B()
    x, y = b.input((n,)), b.input((n,))
    t = x
    for c in C:
        t = b.op(F.Mul(), b.op(F.Add(), t, y), lit(c))
    outs = [t]
    if backward:
        go = b.input((n,))
        g, gy = go, None
        for c in reversed(C):
            g = b.op(F.Mul(), g, lit(c))
            gy = g if gy is None else b.op(F.Add(), gy, g)
        outs += [g, gy]
    return Graph("memory", b.inputs, b.nodes, outs)


def transc_graph(n, backward):
    """tanh, *c, sin, +y, exp, *c, tanh, +y, sin, *c (10 ops), backward by hand."""
    b = B()
    x, y = b.input((n,)), b.input((n,))
    steps = [("tanh",), ("mul", 0.9), ("sin",), ("add",), ("exp",), ("mul", 0.5), ("tanh",),
             ("add",), ("sin",), ("mul", 1.1)]
    t = x
    saved = []
    for s in steps:
        saved.append(t)
        if s[0] == "tanh":
            t = b.op(F.Tanh(), t)
        elif s[0] == "sin":
            t = b.op(F.Sin(), t)
        elif s[0] == "exp":
            t = b.op(F.Exp(), t)
        elif s[0] == "mul":
            t = b.op(F.Mul(), t, lit(s[1]))
        else:
            t = b.op(F.Add(), t, y)
        saved[-1] = (saved[-1], t)
    outs = [t]
    if backward:
        go = b.input((n,))
        g, gy = go, None
        for s, (u, v) in zip(reversed(steps), reversed(saved)):
            if s[0] == "tanh":
                g = b.op(F.Mul(), g, b.op(F.Sub(), lit(1.0), b.op(F.Mul(), v, v)))
            elif s[0] == "sin":
                g = b.op(F.Mul(), g, b.op(F.Cos(), u))
            elif s[0] == "exp":
                g = b.op(F.Mul(), g, v)
            elif s[0] == "mul":
                g = b.op(F.Mul(), g, lit(s[1]))
            else:
                gy = g if gy is None else b.op(F.Add(), gy, g)
        outs += [g, gy]
    return Graph("transc", b.inputs, b.nodes, outs)


# ---------------------------------------------------------------- hand-written columns

def np_memory(x, y, go=None):
    t = x
    for c in C:
        t = (t + y) * c
    if go is None:
        return [t]
    g, gy = go, None
    for c in reversed(C):
        g = g * c
        gy = g if gy is None else gy + g
    return [t, g, gy]


def np_transc(x, y, go=None):
    t1 = np.tanh(x)
    t2 = t1 * 0.9
    t3 = np.sin(t2)
    t4 = t3 + y
    t5 = np.exp(t4)
    t6 = t5 * 0.5
    t7 = np.tanh(t6)
    t8 = t7 + y
    t9 = np.sin(t8)
    t10 = t9 * 1.1
    if go is None:
        return [t10]
    g = go * 1.1
    g = g * np.cos(t8)
    gy = g
    g = g * (1.0 - t7 * t7)
    g = g * 0.5
    g = g * t5
    gy = gy + g
    g = g * np.cos(t2)
    g = g * 0.9
    g = g * (1.0 - t1 * t1)
    return [t10, g, gy]


@numba.njit(parallel=True, error_model="numpy")
def nb_memory(x, y, out):
    for i in numba.prange(x.shape[0]):
        t = x[i]
        yi = y[i]
        t = (t + yi) * 0.9
        t = (t + yi) * 1.1
        t = (t + yi) * 0.7
        t = (t + yi) * 1.3
        t = (t + yi) * 0.5
        out[i] = t


@numba.njit(parallel=True, error_model="numpy")
def nb_memory_bwd(x, y, go, out, gx, gy):
    for i in numba.prange(x.shape[0]):
        t = x[i]
        yi = y[i]
        t = (t + yi) * 0.9
        t = (t + yi) * 1.1
        t = (t + yi) * 0.7
        t = (t + yi) * 1.3
        t = (t + yi) * 0.5
        out[i] = t
        g = go[i] * 0.5
        s = g
        g = g * 1.3
        s += g
        g = g * 0.7
        s += g
        g = g * 1.1
        s += g
        g = g * 0.9
        s += g
        gx[i] = g
        gy[i] = s


@numba.njit(parallel=True, error_model="numpy")
def nb_transc(x, y, out):
    for i in numba.prange(x.shape[0]):
        yi = y[i]
        t = math.sin(math.tanh(math.exp(math.sin(math.tanh(x[i]) * 0.9) + yi) * 0.5) + yi)
        out[i] = t * 1.1


@numba.njit(parallel=True, error_model="numpy")
def nb_transc_bwd(x, y, go, out, gx, gy):
    for i in numba.prange(x.shape[0]):
        yi = y[i]
        t1 = math.tanh(x[i])
        t2 = t1 * 0.9
        t4 = math.sin(t2) + yi
        t5 = math.exp(t4)
        t7 = math.tanh(t5 * 0.5)
        t8 = t7 + yi
        out[i] = math.sin(t8) * 1.1
        g = go[i] * 1.1 * math.cos(t8)
        s = g
        g = g * (1.0 - t7 * t7) * 0.5 * t5
        s += g
        gx[i] = g * math.cos(t2) * 0.9 * (1.0 - t1 * t1)
        gy[i] = s


def nb_column(kind, backward):
    if kind == "memory":
        if backward:
            def f(x, y, go):
                out, gx, gy = np.empty_like(x), np.empty_like(x), np.empty_like(x)
                nb_memory_bwd(x, y, go, out, gx, gy)
                return [out, gx, gy]
            return f

        def f(x, y):
            out = np.empty_like(x)
            nb_memory(x, y, out)
            return [out]
        return f
    if backward:
        def f(x, y, go):
            out, gx, gy = np.empty_like(x), np.empty_like(x), np.empty_like(x)
            nb_transc_bwd(x, y, go, out, gx, gy)
            return [out, gx, gy]
        return f

    def f(x, y):
        out = np.empty_like(x)
        nb_transc(x, y, out)
        return [out]
    return f


def peak_bytes(f, args):
    tracemalloc.start()
    tracemalloc.reset_peak()
    f(*args)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak


def main(quick=False):
    sizes = [1000, 100_000] if quick else [1000, 100_000, 4_000_000]
    print(f"numba {numba.__version__}, numpy {np.__version__}, "
          f"threading layer {numba.config.THREADING_LAYER}, cores {os.cpu_count()}")
    print(f"{'case':<22}{'N':>9}{'interp ms':>11}{'codegen ms':>12}{'numpy ms':>10}"
          f"{'numba ms':>10}{'cg/numba':>10}{'cg/numpy':>10}{'kern':>6}{'peakMB cg/np':>14}")
    for kind, build in (("memory", memory_graph), ("transc", transc_graph)):
        for backward in (False, True):
            for n in sizes:
                g = build(n, backward)
                rng = np.random.default_rng(0)
                args = [rng.standard_normal(n) * 0.5 for _ in g.inputs]
                t0 = time.perf_counter()
                cg = codegen.compile(g)
                cg(args)
                cold = time.perf_counter() - t0
                it = interpret.compile(g)
                npf = np_memory if kind == "memory" else np_transc
                nbf = nb_column(kind, backward)
                nbf(*args)
                cols = {"interp": lambda: it(args), "codegen": lambda: cg(args),
                        "numpy": lambda: npf(*args), "numba": lambda: nbf(*args)}
                ref = npf(*args)
                for got in cols["codegen"](), cols["interp"]():
                    for a, w in zip(got, ref):
                        np.testing.assert_allclose(a, w, rtol=1e-9, atol=1e-12)
                reps = 30 if n <= 100_000 else 7
                inner = max(1, 20000 // n) if n < 100_000 else 1
                times = {k: [] for k in cols}
                for _ in range(reps):
                    for k, f in cols.items():
                        t = time.perf_counter()
                        for _ in range(inner):
                            f()
                        times[k].append((time.perf_counter() - t) / inner)
                med = {k: float(np.median(v)) * 1e3 for k, v in times.items()}
                pk = ""
                if n >= 4_000_000:
                    pk = f"{peak_bytes(cg, [args]) / 1e6:.0f}/" \
                         f"{peak_bytes(npf, args) / 1e6:.0f}"
                name = f"{kind}{'+bwd' if backward else ''}"
                print(f"{name:<22}{n:>9}{med['interp']:>11.3f}{med['codegen']:>12.3f}"
                      f"{med['numpy']:>10.3f}{med['numba']:>10.3f}"
                      f"{med['codegen'] / med['numba']:>10.2f}"
                      f"{med['codegen'] / med['numpy']:>10.2f}{g.notes['kernels']:>6}"
                      f"{pk:>14}   cold {cold * 1e3:.0f} ms")
    sys.stdout.flush()


if __name__ == "__main__":
    main(quick="--quick" in sys.argv)
