"""Vectorizable math (tracejit/codegen/vecmath.py) vs NumPy ufuncs vs numba loops on libm.

For N = 4e6 float64 and float32, each function (exp, log, tanh, sin, cos, sigmoid) and a
fused chain tanh(sin(exp(0.1 x))): time of
    np        NumPy ufunc(s) into a preallocated output (sigmoid: three ufunc passes)
    np-blk    chain only: the NumPy ufuncs on 16K-element blocks (cache-resident)
    vec-blk   chain only: one vecmath loop per op over 2K-element blocks (in place)
    libm      serial numba loop calling math.<f>
    vec       serial numba loop calling vecmath (sin/cos: the fast path plus the
              out-of-range flag and a libm re-run when set, i.e. the correct version)
    vec-via-f64  float32 only: vecmath's float32-via-float64 variants (FLOAT32_VIA64)
    libm-par, vec-par, vec-blk-par   chain only: the same loops with prange (2 threads)
Interleaved repeats (each repeat runs every column once), median and min in ms.
Also: max ulp error over 1e6 random values per range (float64 against long double,
float32 against float64), NumPy's own error for comparison, and whether the vecmath
loop vectorized (ymm/zmm registers in the kernel's asm and no calls in it).

    python benchmarks/bench_vecmath.py [--reps 9] [--n 4000000] [--zmm] [--skip-accuracy]

--zmm: set NUMBA_CPU_FEATURES to the host features with -prefer-256-bit before numba is
imported (LLVM then uses 512-bit vectors on AVX-512 hosts; numba's default is 256).
"""
import argparse
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

ap = argparse.ArgumentParser()
ap.add_argument("--reps", type=int, default=9)
ap.add_argument("--n", type=int, default=4_000_000)
ap.add_argument("--zmm", action="store_true")
ap.add_argument("--skip-accuracy", action="store_true")
ARGS = ap.parse_args()
if ARGS.zmm:
    import llvmlite.binding as _ll
    os.environ["NUMBA_CPU_FEATURES"] = _ll.get_host_cpu_features().flatten() + ",-prefer-256-bit"

import numba  # noqa: E402
import numpy as np  # noqa: E402
from numba import njit, prange  # noqa: E402

from tracejit.backends.numba import vecmath as vm  # noqa: E402

OPTS = dict(error_model="numpy")
BLOCK = 16384      # NumPy blocks (np-blk)
VBLOCK = 2048      # vecmath per-op blocks (vec-blk)


def loop1(f):
    @njit(**OPTS)
    def run(a, o):
        for i in range(a.shape[0]):
            o[i] = f(a[i])
    return run


def trig_guarded(fast, slow):
    """Fast vector pass + out-of-range flag; libm pass if any element needed it."""
    @njit(**OPTS)
    def run(a, o):
        bad = False
        for i in range(a.shape[0]):
            o[i] = fast(a[i])
            bad |= vm.trig_out_of_range(a[i])
        if bad:
            for i in range(a.shape[0]):
                o[i] = slow(a[i])
    return run


def libm_fns(dt):
    f32 = dt == np.float32
    c = np.float32 if f32 else np.float64

    @njit(**OPTS)
    def sigmoid(x):
        return c(1.0) / (c(1.0) + math.exp(-x))
    return dict(exp=njit(**OPTS)(lambda x: math.exp(x)), log=njit(**OPTS)(lambda x: math.log(x)),
                tanh=njit(**OPTS)(lambda x: math.tanh(x)), sin=njit(**OPTS)(lambda x: math.sin(x)),
                cos=njit(**OPTS)(lambda x: math.cos(x)), sigmoid=sigmoid)


def np_sigmoid(a, o):
    np.negative(a, out=o)
    np.exp(o, out=o)
    o += 1
    np.divide(1, o, out=o)


NP = dict(exp=np.exp, log=np.log, tanh=np.tanh, sin=np.sin, cos=np.cos)
INPUT = dict(exp=(-10, 10), log=(0.01, 100), tanh=(-5, 5), sin=(-10, 10), cos=(-10, 10),
             sigmoid=(-10, 10))


def chain_fns(dt):
    c = dt(0.1)
    lm = libm_fns(dt)
    v = vm.FLOAT32 if dt == np.float32 else vm.FLOAT64
    vexp, vsin, vtanh = v["exp"], v["sin_fast"], v["tanh"]
    lexp, lsin, ltanh = lm["exp"], lm["sin"], lm["tanh"]

    def np_chain(a, o):
        np.multiply(a, c, out=o)
        np.exp(o, out=o)
        np.sin(o, out=o)
        np.tanh(o, out=o)

    def np_blocked(a, o):
        for s in range(0, a.shape[0], BLOCK):
            ob = o[s:s + BLOCK]
            np.multiply(a[s:s + BLOCK], c, out=ob)
            np.exp(ob, out=ob)
            np.sin(ob, out=ob)
            np.tanh(ob, out=ob)

    @njit(**OPTS)
    def libm_chain(a, o):
        for i in range(a.shape[0]):
            o[i] = ltanh(lsin(lexp(a[i] * c)))

    @njit(**OPTS)
    def vec_chain(a, o):
        bad = False
        for i in range(a.shape[0]):
            e = vexp(a[i] * c)
            bad |= vm.trig_out_of_range(e)
            o[i] = vtanh(vsin(e))
        if bad:                                     # sin argument beyond TRIG_MAX
            for i in range(a.shape[0]):
                o[i] = ltanh(lsin(lexp(a[i] * c)))

    @njit(**OPTS)
    def vec_stages(ab, ob):
        """One vector loop per op over a block, in place in ob; returns the sin flag.
        (Blocks are slices so each loop runs from 0: an index not provably >= 0 makes
        numba's negative-index wraparound turn loads into gathers or stop vectorizing.)"""
        bad = False
        for i in range(ab.shape[0]):
            ob[i] = vexp(ab[i] * c)
        for i in range(ob.shape[0]):
            bad |= vm.trig_out_of_range(ob[i])
            ob[i] = vsin(ob[i])
        for i in range(ob.shape[0]):
            ob[i] = vtanh(ob[i])
        return bad

    @njit(**OPTS)
    def vec_blocked(a, o):
        """Per-op vector loops over cache-sized blocks: short dependency chains per loop
        instead of one long fused chain."""
        n = a.shape[0]
        bad = False
        for s in range(0, n, VBLOCK):
            bad |= vec_stages(a[s:s + VBLOCK], o[s:s + VBLOCK])
        if bad:
            for i in range(n):
                o[i] = ltanh(lsin(lexp(a[i] * c)))

    @njit(parallel=True, **OPTS)
    def vec_blocked_par(a, o):
        n = a.shape[0]
        nb = (n + VBLOCK - 1) // VBLOCK
        nbad = 0
        for b in prange(nb):
            nbad += vec_stages(a[b * VBLOCK:(b + 1) * VBLOCK], o[b * VBLOCK:(b + 1) * VBLOCK])
        if nbad:
            for i in prange(n):
                o[i] = ltanh(lsin(lexp(a[i] * c)))

    @njit(**OPTS)
    def vec_hot(a, o):                              # vec_chain's first loop alone
        for i in range(a.shape[0]):
            o[i] = vtanh(vsin(vexp(a[i] * c)))

    @njit(parallel=True, **OPTS)
    def libm_par(a, o):
        for i in prange(a.shape[0]):
            o[i] = ltanh(lsin(lexp(a[i] * c)))

    @njit(parallel=True, **OPTS)
    def vec_par(a, o):
        nbad = 0
        for i in prange(a.shape[0]):
            e = vexp(a[i] * c)
            nbad += vm.trig_out_of_range(e)
            o[i] = vtanh(vsin(e))
        if nbad:
            for i in prange(a.shape[0]):
                o[i] = ltanh(lsin(lexp(a[i] * c)))

    return {"np": np_chain, "np-blk": np_blocked, "libm": libm_chain, "vec": vec_chain,
            "vec-blk": vec_blocked, "libm-par": libm_par, "vec-par": vec_par,
            "vec-blk-par": vec_blocked_par}, vec_hot


def vec_status(disp):
    """'zmm'/'ymm'/'scalar' for a compiled loop, '+call' if the kernel body calls out."""
    sig = disp.signatures[0]
    asm = disp.inspect_asm(sig)
    body = asm.split(".Lfunc_end0")[0]           # the kernel itself, not the wrapper
    calls = [ln for ln in body.splitlines() if "call" in ln.split("#")[0]]
    kind = "zmm" if "zmm" in body else "ymm" if "ymm" in body else "scalar"
    return kind + ("+call" if calls else "")


def bench(cols, a, o, reps):
    for f in cols.values():                      # compile + warm
        f(a, o)
    times = {k: [] for k in cols}
    for _ in range(reps):
        for k, f in cols.items():
            t0 = time.perf_counter()
            f(a, o)
            times[k].append(time.perf_counter() - t0)
    return {k: (1e3 * np.median(v), 1e3 * min(v)) for k, v in times.items()}


def fmt(t):
    return f"{t[0]:7.2f} ({t[1]:6.2f})"


def timing(dt, n, reps):
    rng = np.random.default_rng(0)
    f32 = dt == np.float32
    v = vm.FLOAT32 if f32 else vm.FLOAT64
    lm = libm_fns(dt)
    o = np.empty(n, dt)
    print(f"\n{np.dtype(dt).name}, N={n:.0e}: ms median (min) over {reps} interleaved reps")
    print(f"{'fn':8s} {'np':>16s} {'libm':>16s} {'vec':>16s}"
          + (f" {'vec-via-f64':>16s}" if f32 else "") + "  vec/np libm/vec  vectorized")
    for name, (lo, hi) in INPUT.items():
        a = rng.uniform(lo, hi, n).astype(dt)
        if name in ("sin", "cos"):
            vec = trig_guarded(v[name + "_fast"], lm[name])
            hot = loop1(v[name + "_fast"])         # the hot loop alone, for the asm check
            hot(a[:16], o[:16])
        else:
            vec = hot = loop1(v[name])
        npf = np_sigmoid if name == "sigmoid" else (lambda f: lambda a, o: f(a, out=o))(NP[name])
        cols = {"np": npf, "libm": loop1(lm[name]), "vec": vec}
        if f32:
            k = name + "_fast" if name in ("sin", "cos") else name
            cols["via64"] = (trig_guarded(vm.FLOAT32_VIA64[k], lm[name]) if name in ("sin", "cos")
                             else loop1(vm.FLOAT32_VIA64[k]))
        t = bench(cols, a, o, reps)
        print(f"{name:8s} {fmt(t['np'])} {fmt(t['libm'])} {fmt(t['vec'])}"
              + (f" {fmt(t['via64'])}" if f32 else "")
              + f"  {t['vec'][0] / t['np'][0]:6.2f} {t['libm'][0] / t['vec'][0]:8.2f}  {vec_status(hot)}")
    cols, hot = chain_fns(dt)
    a = rng.uniform(-10, 10, n).astype(dt)
    hot(a[:16], o[:16])
    t = bench(cols, a, o, reps)
    print(f"chain tanh(sin(exp(0.1x))), {numba.get_num_threads()} threads for -par:")
    for k, v_ in t.items():
        print(f"  {k:9s} {fmt(v_)}   x{v_[0] / t['np'][0]:.2f} of np")
    print(f"  vec chain hot loop vectorized: {vec_status(hot)}")
    m = a[:200_000]
    hi = np.longdouble if dt == np.float64 else np.float64
    exact = np.tanh(np.sin(np.exp(m.astype(hi) * hi(dt(0.1)))))
    errs = {}
    for k in ("np", "libm", "vec", "vec-blk"):
        y = np.empty_like(m)
        cols[k](m, y)
        errs[k] = vm.ulp_error(y, exact).max()
    print("  chain max ulp vs " + ("long double" if dt == np.float64 else "float64") + ": "
          + ", ".join(f"{k} {e:.2f}" for k, e in errs.items()))


def accuracy():
    rng = np.random.default_rng(1)

    def logu(lo, hi, n, signed=False):
        x = np.exp(rng.uniform(np.log(lo), np.log(hi), n))
        return x * rng.choice([-1.0, 1.0], n) if signed else x

    n = 10**6
    ranges = {
        "exp": [("u[-745,709.7]", rng.uniform(-745.1, 709.7, n)), ("u[-1,1]", rng.uniform(-1, 1, n)),
                ("subnormal out", rng.uniform(-745.1, -708.4, n))],
        "log": [("logu[5e-324,1e308]", logu(5e-324, 1e308, n)), ("u[0.5,2]", rng.uniform(0.5, 2, n))],
        "tanh": [("u[-20,20]", rng.uniform(-20, 20, n)), ("+-logu[1e-12,40]", logu(1e-12, 40, n, True))],
        "sigmoid": [("u[-750,750]", rng.uniform(-750, 750, n)), ("u[-40,40]", rng.uniform(-40, 40, n))],
        "sin": [("u[-10,10]", rng.uniform(-10, 10, n)), ("+-logu[1e-12,1.6e6]", logu(1e-12, 1.6e6, n, True)),
                ("u[1.6e6,1e300] libm", logu(1.7e6, 1e300, n, True))],
        "cos": [("u[-10,10]", rng.uniform(-10, 10, n)), ("+-logu[1e-12,1.6e6]", logu(1e-12, 1.6e6, n, True)),
                ("u[1.6e6,1e300] libm", logu(1.7e6, 1e300, n, True))],
    }
    ref_fn = dict(NP, sigmoid=lambda x: 1 / (1 + np.exp(-x)))
    print("\nmax ulp error (float64 vs long double, float32 vs float64), 1e6 values per range")
    print(f"{'fn':8s} {'range':22s} {'vec f64':>8s} {'np f64':>8s} {'vec f32':>8s} {'np f32':>8s}"
          f" {'via64 f32':>9s}")
    for name, rs in ranges.items():
        for label, x in rs:
            row = []
            for dt, tab, hi in ((np.float64, vm.FLOAT64, np.longdouble), (np.float32, vm.FLOAT32, np.float64)):
                with np.errstate(all="ignore"):
                    a = x.astype(dt)
                    o = np.empty_like(a)
                    if name in ("sin", "cos"):
                        trig_guarded(tab[name + "_fast"], libm_fns(dt)[name])(a, o)
                    else:
                        loop1(tab[name])(a, o)
                    ref = ref_fn[name](a.astype(hi))
                    npv = ref_fn[name](a) if name != "sigmoid" else np.where(
                        a >= 0, 1 / (1 + np.exp(-a)), np.exp(a) / (1 + np.exp(a)))
                    row += [vm.ulp_error(o, ref).max(), vm.ulp_error(npv, ref).max()]
                    if dt == np.float32:
                        k = name + "_fast" if name in ("sin", "cos") else name
                        if name in ("sin", "cos"):
                            trig_guarded(vm.FLOAT32_VIA64[k], libm_fns(dt)[name])(a, o)
                        else:
                            loop1(vm.FLOAT32_VIA64[k])(a, o)
                        row.append(vm.ulp_error(o, ref).max())
            print(f"{name:8s} {label:22s} " + " ".join(f"{e:8.3g}" for e in row))
    print("(np sigmoid = the stable two-branch NumPy formula; sin/cos 'libm' rows go through"
          " the out-of-range re-run)")


if __name__ == "__main__":
    print(f"numba {numba.__version__}, numpy {np.__version__}, "
          f"NUMBA_CPU_FEATURES {'host,-prefer-256-bit' if ARGS.zmm else 'default'}")
    for dt in (np.float64, np.float32):
        timing(dt, ARGS.n, ARGS.reps)
    if not ARGS.skip_accuracy:
        accuracy()
