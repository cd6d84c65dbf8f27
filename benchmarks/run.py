"""tracejit benchmarks: eager vs jit vs hand-written NumPy / numba (+ JAX, PyTorch).

One command (`make bench`, or `python benchmarks/run.py [--quick]`), one interleaved
run: within a workload every implementation is timed round-robin, so a slow minute
of the machine hits all columns alike. Reported: median time per call and ratios.

  W1  10-op elementwise chains, forward: memory-bound (add/mul) and transcendental
  W2  the same, forward + backward: jit(value_and_grad(f)) and the DeZero form
  W3  Goldstein-Price and Rosenbrock value + gradient on 0-d arrays (dispatch-bound)
  W4  MLP 784-256-10, batch 128, float32: forward + backward + SGD step
  W5  the data-dependent while loop (y += x until y > 100) with its gradient
  +   cold compile, warm-process (disk cache) first result, new shape, peak memory
"""
import argparse
import compileall
import math
import os
import shutil
import subprocess
import sys
import textwrap
import time
import warnings

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import numba  # noqa: E402

import tracejit as tj  # noqa: E402
import tracejit.functions as F  # noqa: E402
from tracejit import optimizers  # noqa: E402
from tracejit.models import MLP  # noqa: E402

try:
    import jax
    import jax.numpy as jnp
    jax.config.update("jax_enable_x64", True)
except ImportError:
    jax = None
try:
    import torch
except ImportError:
    torch = None


def timeit(fn, min_time):
    """Seconds per call of fn: as many calls as fit in min_time (at least 3)."""
    fn()
    n, t = 0, 0.0
    t0 = time.perf_counter()
    while n < 3 or t < min_time:
        fn()
        n += 1
        t = time.perf_counter() - t0
    return t / n


def interleaved(impls, rounds, min_time):
    """{name: median seconds per call} over `rounds` round-robin passes."""
    times = {name: [] for name in impls}
    for _ in range(rounds):
        for name, fn in impls.items():
            times[name].append(timeit(fn, min_time))
    return {name: float(np.median(ts)) for name, ts in times.items()}


def fmt(sec):
    if sec >= 1e-3:
        return f"{sec * 1e3:9.2f} ms"
    return f"{sec * 1e6:9.1f} us"


def report(title, results, base, note=""):
    print(f"\n{title}" + (f"  ({note})" if note else ""))
    for name, sec in results.items():
        ratio = sec / results[base]
        print(f"  {name:<34} {fmt(sec)}   {ratio:6.2f}x {base}")


def summary_line(jitted, *args):
    try:
        s = jitted.trace(*args).summary()
        # trace() is the optimized graph: count the primitive ops inside its kernels.
        return (f"graph: {sum(s['ops'].values())} ops, kernels {s['kernels']}, numpy calls "
                f"{s['numpy_calls']}, materialized {s['materialized']}")
    except Exception as e:  # noqa: BLE001 - a benchmark reports, it does not stop
        return f"graph: n/a ({e})"


def check_no_fallback(*jitted):
    for j in jitted:
        info = j.cache_info()
        if info["fallbacks"]:
            print(f"  !! {j.__name__} fell back to eager: {info}")


# ------------------------------------------------------------------ W1/W2 chains

def chain_mem(x, y):
    # 10 elementwise ops, add/mul only: each pass over memory is the cost.
    z = x
    for _ in range(5):
        z = z * y
        z = z + x
    return z


def chain_trans(x, y):
    # 10 elementwise ops with transcendental functions: the math is the cost.
    z = F.tanh(x) if isinstance(x, tj.Variable) else np.tanh(x)
    s = F.sin if isinstance(x, tj.Variable) else np.sin
    t = F.tanh if isinstance(x, tj.Variable) else np.tanh
    e = F.exp if isinstance(x, tj.Variable) else np.exp
    z = z * y
    z = s(z)
    z = z + x
    z = e(z * 0.5)
    z = t(z)
    z = z * y
    z = s(z)
    return z + x


@numba.njit(parallel=True, fastmath=False)
def numba_chain_mem(x, y):
    out = np.empty_like(x)
    for i in numba.prange(x.size):
        z = x[i]
        xi, yi = x[i], y[i]
        for _ in range(5):
            z = z * yi + xi
        out[i] = z
    return out


@numba.njit(parallel=True)
def numba_chain_mem_grad(x, y):
    # value of sum(chain) and its gradients, hand-differentiated: one fused pass.
    gx = np.empty_like(x)
    gy = np.empty_like(y)
    total = 0.0
    for i in numba.prange(x.size):
        xi, yi = x[i], y[i]
        z, dzdx, dzdy = xi, 1.0, 0.0
        for _ in range(5):
            dzdy = dzdy * yi + z
            dzdx = dzdx * yi + 1.0
            z = z * yi + xi
        gx[i] = dzdx
        gy[i] = dzdy
        total += z
    return total, gx, gy


@numba.njit(parallel=True)
def numba_chain_trans(x, y):
    out = np.empty_like(x)
    for i in numba.prange(x.size):
        xi, yi = x[i], y[i]
        z = math.tanh(xi) * yi
        z = math.sin(z) + xi
        z = math.tanh(math.exp(z * 0.5)) * yi
        out[i] = math.sin(z) + xi
    return out


def numpy_chain_mem_grad(x, y):
    zs = [x]
    z = x
    for _ in range(5):
        z = z * y + x
        zs.append(z)
    gz = np.ones_like(x)
    gx = np.zeros_like(x)
    gy = np.zeros_like(y)
    for k in range(5, 0, -1):
        gx += gz
        gy += gz * zs[k - 1]
        gz = gz * y
    gx += gz
    return z.sum(), gx, gy


def bench_chains(sizes, rounds, min_time, backend):
    rng = np.random.default_rng(0)
    for kind, chain in (("memory-bound add/mul", chain_mem), ("transcendental", chain_trans)):
        for n in sizes:
            x = rng.uniform(-1, 1, n)
            y = rng.uniform(-1, 1, n)
            xv, yv = tj.Variable(x), tj.Variable(y)
            fj = tj.jit(chain, backend=backend)
            impls = {
                "tracejit eager": lambda: chain(xv, yv),
                "tracejit jit": lambda: fj(x, y),
                "numpy": lambda: chain(x, y),
                "numba hand-fused prange": (lambda: numba_chain_mem(x, y)) if chain is chain_mem
                else (lambda: numba_chain_trans(x, y)),
            }
            if jax is not None:
                jf = jax.jit(_jax_chain(chain))
                xj, yj = jnp.asarray(x), jnp.asarray(y)
                impls["jax.jit"] = lambda: jf(xj, yj).block_until_ready()
            res = interleaved(impls, rounds, min_time)
            report(f"W1 {kind} forward, N={n:.0e}", res, "numba hand-fused prange",
                   summary_line(fj, x, y))
            check_no_fallback(fj)
        for n in sizes:
            x = rng.uniform(-1, 1, n)
            y = rng.uniform(-1, 1, n)

            def loss(a, b):
                return F.sum(chain(a, b))

            vg, vgj, fj, dezero_form, _ = grad_forms(loss, x, y, backend)
            impls = {
                "tracejit eager": lambda: vg(x, y),
                "tracejit jit(value_and_grad)": lambda: vgj(x, y),
                "tracejit jit, z.backward()": dezero_form,
            }
            if chain is chain_mem:
                impls["numpy by hand"] = lambda: numpy_chain_mem_grad(x, y)
                impls["numba hand-fused prange"] = lambda: numba_chain_mem_grad(x, y)
            if jax is not None:
                jvg = jax.jit(jax.value_and_grad(lambda a, b: _jax_chain(chain)(a, b).sum(),
                                                 argnums=(0, 1)))
                xj, yj = jnp.asarray(x), jnp.asarray(y)
                impls["jax.jit(value_and_grad)"] = lambda: jax.block_until_ready(jvg(xj, yj))
            base = "numba hand-fused prange" if chain is chain_mem else "tracejit eager"
            res = interleaved(impls, rounds, min_time)
            report(f"W2 {kind} forward+backward, N={n:.0e}", res, base,
                   summary_line(vgj, x, y))
            check_no_fallback(vgj, fj)


def grad_forms(f, x, y, backend):
    """A value and gradient of f(x, y) in each calling form: value_and_grad (eager and
    jitted), the jitted f, and DeZero's `z = f(x, y); z.backward()` with the jitted f
    and with f itself."""
    vg = tj.value_and_grad(f, argnums=(0, 1))
    fj = tj.jit(f, backend=backend)
    xv, yv = tj.Variable(x), tj.Variable(y)

    def dezero(g):
        def call():
            xv.cleargrad()
            yv.cleargrad()
            g(xv, yv).backward()
            return xv.grad, yv.grad
        return call
    return vg, tj.jit(vg, backend=backend), fj, dezero(fj), dezero(f)


def _jax_chain(chain):
    if chain is chain_mem:
        return chain_mem

    def trans(x, y):
        z = jnp.tanh(x) * y
        z = jnp.sin(z) + x
        z = jnp.tanh(jnp.exp(z * 0.5)) * y
        return jnp.sin(z) + x
    return trans


# ------------------------------------------------------------------ W3 0-d functions

def goldstein_price(x, y):
    return (1 + (x + y + 1) ** 2 * (19 - 14 * x + 3 * x ** 2 - 14 * y + 6 * x * y + 3 * y ** 2)) \
        * (30 + (2 * x - 3 * y) ** 2 * (18 - 32 * x + 12 * x ** 2 + 48 * y - 36 * x * y
                                        + 27 * y ** 2))


def rosenbrock(x, y):
    return 100 * (y - x ** 2) ** 2 + (1 - x) ** 2


def bench_scalar(rounds, min_time, backend):
    for name, f in (("Goldstein-Price", goldstein_price), ("Rosenbrock", rosenbrock)):
        x, y = np.array(0.3), np.array(-0.2)
        vg, vgj, fj, dezero_form, eager_form = grad_forms(f, x, y, backend)
        impls = {
            "tracejit eager (z.backward())": eager_form,
            "tracejit jit(value_and_grad)": lambda: vgj(x, y),
            "tracejit jit, z.backward()": dezero_form,
        }
        if jax is not None:
            jvg = jax.jit(jax.value_and_grad(f, argnums=(0, 1)))
            impls["jax.jit(value_and_grad)"] = lambda: jax.block_until_ready(
                jvg(0.3, -0.2))
        if torch is not None:
            def torch_form():
                a = torch.tensor(0.3, dtype=torch.float64, requires_grad=True)
                b = torch.tensor(-0.2, dtype=torch.float64, requires_grad=True)
                f(a, b).backward()
                return a.grad, b.grad
            impls["torch eager"] = torch_form
        res = interleaved(impls, rounds, min_time)
        report(f"W3 {name} value+gradient, 0-d", res, "tracejit jit(value_and_grad)",
               summary_line(vgj, x, y))
        check_no_fallback(vgj, fj)


# ------------------------------------------------------------------ W4 MLP step

def bench_mlp(rounds, min_time, backend, batch=128):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, 784)).astype(np.float32)
    t = rng.integers(0, 10, batch)

    def make():
        np.random.seed(0)
        model = MLP((256, 10), activation=F.relu)
        model(x)
        return model, optimizers.SGD(0.01).setup(model)

    def step(model, opt):
        loss = F.softmax_cross_entropy(model(x), t)
        model.cleargrads()
        loss.backward()
        opt.update()
        return loss

    m_e, o_e = make()
    m_j, o_j = make()
    step_j = tj.jit(lambda: step(m_j, o_j), backend=backend)
    W1, b1 = m_e.l0.W.data.copy(), m_e.l0.b.data.copy()
    W2, b2 = m_e.l1.W.data.copy(), m_e.l1.b.data.copy()

    def numpy_step():
        h = x @ W1 + b1
        a = np.maximum(h, 0)
        logits = a @ W2 + b2
        m = logits.max(axis=1, keepdims=True)
        e = np.exp(logits - m)
        p = e / e.sum(axis=1, keepdims=True)
        loss = -np.log(p[np.arange(batch), t]).mean()
        g = p
        g[np.arange(batch), t] -= 1
        g /= batch
        gW2 = a.T @ g
        gb2 = g.sum(axis=0)
        ga = g @ W2.T
        ga *= h > 0
        gW1 = x.T @ ga
        gb1 = ga.sum(axis=0)
        W1[...] -= 0.01 * gW1
        b1[...] -= 0.01 * gb1
        W2[...] -= 0.01 * gW2
        b2[...] -= 0.01 * gb2
        return loss

    impls = {
        "tracejit eager": lambda: step(m_e, o_e),
        "tracejit jit (step inside)": step_j,
        "numpy by hand": numpy_step,
    }
    if torch is not None:
        tm = torch.nn.Sequential(torch.nn.Linear(784, 256), torch.nn.ReLU(),
                                 torch.nn.Linear(256, 10))
        topt = torch.optim.SGD(tm.parameters(), lr=0.01)
        tx, tt = torch.from_numpy(x), torch.from_numpy(t)

        def torch_step():
            topt.zero_grad()
            loss = torch.nn.functional.cross_entropy(tm(tx), tt)
            loss.backward()
            topt.step()
            return loss
        impls["torch eager"] = torch_step
    res = interleaved(impls, rounds, min_time)
    report("W4 MLP 784-256-10 step, batch 128, float32", res, "numpy by hand",
           summary_line(step_j))
    check_no_fallback(step_j)


# ------------------------------------------------------------------ W5 while loop

def grow(x):
    y = x
    while y.data < 100:
        y = y + x
    return y


def bench_while(rounds, min_time, backend):
    xs = [np.array(v) for v in (3.0, 7.0, 11.0)]
    gj = tj.jit(grow, backend=backend)
    state = {"i": 0}

    def run(f):
        def call():
            x = tj.Variable(xs[state["i"] % 3])
            state["i"] += 1
            y = f(x)
            y.backward()
            return x.grad
        return call

    impls = {"tracejit eager": run(grow), "tracejit jit": run(gj)}
    if jax is not None:
        jg = jax.jit(jax.value_and_grad(lambda x, n: x * (n + 1)), static_argnums=1)

        def jax_call():
            v = float(xs[state["i"] % 3])
            state["i"] += 1
            n = math.ceil(100 / v) - 1   # the trip count, specialized by hand
            return jax.block_until_ready(jg(v, n))
        impls["jax.jit (hand trip count)"] = jax_call
    res = interleaved(impls, rounds, min_time)
    report("W5 while loop with gradient, x in (3, 7, 11)", res, "tracejit jit")
    check_no_fallback(gj)


# ------------------------------------------------------------------ latency and memory

_LATENCY = textwrap.dedent("""
    import time, sys
    if sys.argv[2] == "hide-scipy":
        sys.modules["scipy"] = None      # as after `pip install tracejit`: no SciPy
    t0 = time.perf_counter()
    import numpy as np, tracejit as tj, tracejit.functions as F
    def loss(x, y):
        z = x
        for _ in range(5):
            z = z * y
            z = z + x
        return F.sum(z)
    f = tj.jit(tj.value_and_grad(loss, argnums=(0, 1)), backend=sys.argv[1])
    x, y = np.random.rand(1000), np.random.rand(1000)
    t_import = time.perf_counter()
    f(x, y)                      # warm-up: eager
    f(x, y)                      # trace, compile, the perturbation check
    f(x, y)                      # first compiled call (checked against eager)
    t_first = time.perf_counter()
    f(x, y)                      # the first unchecked call (builds the signature matcher)
    t_hit0 = time.perf_counter()
    f(x, y)
    t_hit = time.perf_counter()
    x2, y2 = np.random.rand(1500), np.random.rand(1500)
    f(x2, y2); f(x2, y2); f(x2, y2)
    t_shape = time.perf_counter()
    print(f"{t_import - t0:.3f} {t_first - t_import:.3f} {t_hit - t_hit0:.6f} "
          f"{t_shape - t_hit:.3f}")
""")

_MEMORY = textwrap.dedent("""
    import gc, os, sys, threading, time
    import numpy as np, tracejit as tj, tracejit.functions as F
    sys.path.insert(0, sys.argv[2])
    from run import chain_mem, numpy_chain_mem_grad
    page = os.sysconf("SC_PAGE_SIZE")
    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * page
    n = 4_000_000
    x, y = np.random.rand(n), np.random.rand(n)
    vg = tj.jit(tj.value_and_grad(lambda a, b: F.sum(chain_mem(a, b)), argnums=(0, 1)),
                backend=sys.argv[1])
    fn = (lambda: vg(x, y)) if sys.argv[3] == "jit" else (lambda: numpy_chain_mem_grad(x, y))
    for _ in range(3):
        r = fn()
    del r
    gc.collect()
    base = rss()
    peak = [base]
    done = [False]
    def sample():
        while not done[0]:
            peak[0] = max(peak[0], rss())
            time.sleep(0.0002)
    t = threading.Thread(target=sample)
    t.start()
    for _ in range(5):
        r = fn()
        time.sleep(0.005)   # the sampler sees the results alive, not only the temporaries
        del r
    done[0] = True
    t.join()
    print(f"{(peak[0] - base) / 2**20:.0f}")
""")


def bench_latency(backend):
    import tempfile
    print("\nLatency (separate processes): a 10-op forward+backward, from a cold and a warm "
          "kernel cache")
    cache = tempfile.mkdtemp(prefix="tracejit_bench_cache_")
    # As after `pip install`: tracejit copied into a site directory with its bytecode
    # compiled (pip compiles on install). This sandbox sets PYTHONDONTWRITEBYTECODE, so
    # the source tree has no .pyc and every process would compile tracejit (0.1-0.2 s).
    # (A PYTHONPYCACHEPREFIX would also do that, but it hides the .pyc files numba
    # installed with itself: numba's modules imported at its first compile were then
    # compiled from source in the cold process, about 0.5 s that no install pays.)
    site = os.path.join(cache, "site")
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    shutil.copytree(os.path.join(here, "tracejit"), os.path.join(site, "tracejit"),
                    ignore=shutil.ignore_patterns("__pycache__"))
    compileall.compile_dir(site, quiet=1)
    env = dict(os.environ, PYTHONPATH=site)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    import importlib.util
    scipy = "hide-scipy" if importlib.util.find_spec("scipy") is not None else "as-is"
    if scipy == "hide-scipy":
        print("  (SciPy is installed here only for the JAX column; numba imports it at its "
              "first compile, +0.2-0.3 s.\n   It is hidden in these processes, as after "
              "`pip install tracejit`, which does not bring it.)")
    firsts = {"cold cache": [], "warm disk cache": []}
    for run in range(3):              # each run: a new kernel cache, then the same again
        env["TRACEJIT_CACHE_DIR"] = os.path.join(cache, f"kernels{run}")
        for label in ("cold cache", "warm disk cache"):
            t0 = time.perf_counter()
            out = subprocess.run([sys.executable, "-c", _LATENCY, backend, scipy], env=env,
                                 capture_output=True, text=True)
            wall = time.perf_counter() - t0
            if out.returncode:
                print(f"  {label}: failed: {out.stderr.strip().splitlines()[-1:]}")
                continue
            imp, first, hit, new_shape = map(float, out.stdout.split())
            firsts[label].append(imp + first)
            print(f"  {label:<16} first compiled result {imp + first:5.2f} s after start "
                  f"(import {imp:5.3f} s; eager warm-up, trace + compile + check, first "
                  f"compiled call {first:5.3f} s); process wall {wall:5.2f} s; a hit "
                  f"{hit * 1e6:5.1f} us; a new shape's 3 calls {new_shape * 1e3:4.1f} ms")
    for label, ts in firsts.items():
        if ts:
            print(f"  {label}: first compiled result, median of {len(ts)} processes "
                  f"{float(np.median(ts)):5.2f} s (min {min(ts):4.2f}, max {max(ts):4.2f})")
    print("\nPeak extra memory during forward+backward (RSS sampled every 0.2 ms), 10-op "
          "chain, N=4e6 float64: inputs 64 MB; the two gradients themselves are 64 MB")
    here = os.path.dirname(os.path.abspath(__file__))
    for which in ("numpy", "jit"):
        # A fixed mmap threshold: glibc otherwise keeps freed large blocks in its heap
        # and RSS would not fall back between calls.
        out = subprocess.run([sys.executable, "-c", _MEMORY, backend, here, which],
                             env=dict(os.environ, PYTHONPATH=os.path.dirname(here),
                                      MALLOC_MMAP_THRESHOLD_="131072"),
                             capture_output=True, text=True)
        val = out.stdout.strip() if not out.returncode else "failed"
        print(f"  {which:<6} {val} MB")


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="small sizes, few rounds")
    p.add_argument("--only", default="W1W2W3W4W5L", help="e.g. W3W5")
    p.add_argument("--backend", default="auto")
    args = p.parse_args()
    warnings.simplefilter("always", tj.JitWarning)
    rounds, min_time = (3, 0.02) if args.quick else (5, 0.2)
    sizes = (1000, 100_000) if args.quick else (1000, 100_000, 4_000_000)
    print(f"tracejit benchmarks: numpy {np.__version__}, numba {numba.__version__}, "
          f"{os.cpu_count()} cores, backend={args.backend}"
          + (f", jax {jax.__version__}" if jax else "")
          + (f", torch {torch.__version__}" if torch else ""))
    if "W1" in args.only or "W2" in args.only:
        bench_chains(sizes, rounds, min_time, args.backend)
    if "W3" in args.only:
        bench_scalar(rounds, min_time, args.backend)
    if "W4" in args.only:
        bench_mlp(rounds, min_time, args.backend)
    if "W5" in args.only:
        bench_while(rounds, min_time, args.backend)
    if "L" in args.only:
        bench_latency(args.backend)


if __name__ == "__main__":
    main()
