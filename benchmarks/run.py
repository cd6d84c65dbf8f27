"""tracejit benchmarks: eager vs jit vs hand-written NumPy / numba (+ JAX, PyTorch).

One command (`make bench`, or `python benchmarks/run.py [--quick]`), one interleaved
run: within a workload every implementation is timed round-robin, so a slow minute
of the machine hits all columns alike. Reported: median time per call and ratios.

  W1  10-op elementwise chains, forward: memory-bound (add/mul) and transcendental
  W2  the same, forward + backward: jit(value_and_grad(f)) and the DeZero form
  W3  Goldstein-Price and Rosenbrock value + gradient on 0-d arrays (dispatch-bound)
  W4  MLP 784-256-10, batch 128, float32: forward + backward + SGD step
  W5  the data-dependent while loop (y += x until y > 100) with its gradient
  W6  CNN training step (conv-relu-pool x2, Linear, softmax CE, SGD), batch 32 MNIST size
  W7  LSTM(100) BPTT window of 30 steps on SinCurve, Adam (the book's step 60)
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

# --blas-threads N sets OpenBLAS's thread count, which it reads when NumPy loads it: so
# here, before the import. On a loaded machine a threaded GEMM waits for its partner
# threads whenever one is descheduled: the W6 CNN's products then ran 2-40x slower.
# PyTorch gets the same thread count (torch.set_num_threads, below): with its default
# (one thread per core) its W6 step ran 30-50x slower than with one thread there.
_BLAS_THREADS = None
for _i, _a in enumerate(sys.argv):
    if _a == "--blas-threads" and _i + 1 < len(sys.argv):
        _BLAS_THREADS = sys.argv[_i + 1]
    elif _a.startswith("--blas-threads="):
        _BLAS_THREADS = _a.split("=", 1)[1]
if _BLAS_THREADS is not None:
    os.environ["OPENBLAS_NUM_THREADS"] = _BLAS_THREADS

import numpy as np  # noqa: E402

# This checkout's tracejit, unless PYTHONPATH names one: benchmarks/ab.py runs this file
# with PYTHONPATH=<the other commit's tree>, and a root put first here had every A/B
# run time this checkout against itself.
_ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
if os.environ.get("PYTHONPATH"):
    sys.path.append(_ROOT)
else:
    sys.path.insert(0, _ROOT)

import numba  # noqa: E402

import tracejit as tj  # noqa: E402
import tracejit.functions as F  # noqa: E402
from tracejit import optimizers  # noqa: E402
from tracejit.models import MLP  # noqa: E402

# TRACEJIT_BENCH_NO_EXTERNAL=1: without JAX and PyTorch (bench_compile.py's processes
# import the workloads from here and time tracejit's compile alone).
_NO_EXTERNAL = os.environ.get("TRACEJIT_BENCH_NO_EXTERNAL", "") not in ("", "0")
try:
    if _NO_EXTERNAL:
        raise ImportError
    import jax
    import jax.numpy as jnp
    jax.config.update("jax_enable_x64", True)
except ImportError:
    jax = None
try:
    if _NO_EXTERNAL:
        raise ImportError
    import torch
    if _BLAS_THREADS is not None:
        torch.set_num_threads(int(_BLAS_THREADS))
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


def warm_up(impls, n):
    """n calls of each column before the timing: the jitted columns' first compile
    took n calls (eager, trace + compile, checked calls); every other column gets as
    many (JAX's and torch.compile's compiles are their first call)."""
    for fn in impls.values():
        for _ in range(n):
            fn()


def peak_step_memory(fn):
    """Bytes allocated at the peak of one call of fn above what was allocated before
    it, by tracemalloc (NumPy reports its array buffers to it; numba kernels allocate
    nothing, they write arrays the plan made with NumPy). The second traced call is the
    one measured, so what the previous call left alive was traced and its frees count."""
    import gc
    import tracemalloc
    tracemalloc.start()
    try:
        fn()
        gc.collect()
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        r = fn()
        peak = tracemalloc.get_traced_memory()[1]
        del r
    finally:
        tracemalloc.stop()
    return peak - base


def _xla_memory(compiled):
    """Temporary buffers of an XLA executable (its buffer assignment, static): the
    step's working memory beyond its arguments and results."""
    try:
        ma = compiled.memory_analysis()
        return int(ma.temp_size_in_bytes)
    except Exception:  # noqa: BLE001 - a jaxlib without memory_analysis on CPU
        return None


def report_memory(workload, mem):
    print(f"\n{workload} peak memory of a step (tracemalloc: NumPy's buffers allocated "
          f"during the call above what was allocated before it; JAX: XLA's temporaries; "
          f"PyTorch's CPU allocator is not traced: not measured)")
    for name, b in mem.items():
        val = "n/a" if b is None else f"{b / 2**20:7.2f} MB"
        print(f"  {name:<40} {val}")


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


# ------------------------------------------------------------------ W6 CNN step

def _first_compile(jitted, call, n=3):
    """Seconds of the first n calls (eager warm-up, trace + compile + the check against
    eager, the first checked compiled call), and the jit's trace/compile stats."""
    t0 = time.perf_counter()
    for _ in range(n):
        call()
    info = jitted.cache_info()
    return (f"first compiled result after {time.perf_counter() - t0:.2f} s (trace "
            f"{info['trace_seconds']:.2f} s, lowering {info['compile_seconds']:.2f} s, "
            f"the rest numba and the checks against eager); fallbacks {info['fallbacks']}")


def _np_im2col(img, k, s, p):
    # DeZero's im2col_array (to_matrix=False), verbatim in NumPy.
    N, C, H, W = img.shape
    OH, OW = (H + 2 * p - k) // s + 1, (W + 2 * p - k) // s + 1
    img = np.pad(img, ((0, 0), (0, 0), (p, p + s - 1), (p, p + s - 1)))
    col = np.ndarray((N, C, k, k, OH, OW), dtype=img.dtype)
    for j in range(k):
        for i in range(k):
            col[:, :, j, i, :, :] = img[:, :, j:j + s * OH:s, i:i + s * OW:s]
    return col


def _np_col2im(col, shape, k, s, p):
    # DeZero's col2im_array (to_matrix=False).
    N, C, H, W = shape
    OH, OW = col.shape[4:]
    img = np.zeros((N, C, H + 2 * p + s - 1, W + 2 * p + s - 1), dtype=col.dtype)
    for j in range(k):
        for i in range(k):
            img[:, :, j:j + s * OH:s, i:i + s * OW:s] += col[:, :, j, i, :, :]
    return img[:, :, p:H + p, p:W + p]


def numpy_cnn_step(params, x, t, lr=0.01):
    """The W6 step as DeZero computes it, written out in NumPy: im2col + tensordot
    convolutions, im2col + argmax pooling, and their backward passes; SGD in place."""
    W1, b1, W2, b2, Wl, bl = params
    cache = []
    h = x
    for W, b in ((W1, b1), (W2, b2)):
        col = _np_im2col(h, 3, 1, 1)
        y = np.rollaxis(np.tensordot(col, W, ((1, 2, 3), (1, 2, 3))) + b, 3, 1)
        a = np.maximum(y, 0)
        N, C, H, Wd = a.shape
        pc = _np_im2col(a, 2, 2, 0).reshape(N, C, 4, H // 2, Wd // 2)
        idx = pc.argmax(axis=2)
        cache.append((h, col, y, idx, a.shape))
        h = pc.max(axis=2)
    N = x.shape[0]
    f = h.reshape(N, -1)
    logits = f @ Wl + bl
    m = logits.max(axis=1, keepdims=True)
    e = np.exp(logits - m)
    prob = e / e.sum(axis=1, keepdims=True)
    loss = -np.log(prob[np.arange(N), t]).mean()
    g = prob
    g[np.arange(N), t] -= 1
    g /= N
    grads = [None] * 6
    grads[4], grads[5] = f.T @ g, g.sum(axis=0)
    gh = (g @ Wl.T).reshape(h.shape)
    for li in (1, 0):
        hin, col, y, idx, ashape = cache[li]
        W = params[2 * li]
        Nn, C, OH, OW = gh.shape
        gcol = np.zeros((Nn * C * OH * OW * 4), dtype=gh.dtype)
        gcol[idx.ravel() + np.arange(0, idx.size * 4, 4)] = gh.ravel()
        gcol = gcol.reshape(Nn, C, OH, OW, 2, 2)
        gcol = np.swapaxes(np.swapaxes(gcol, 2, 4), 3, 5)
        ga = _np_col2im(gcol, ashape, 2, 2, 0)
        gy = ga * (y > 0)
        grads[2 * li] = np.tensordot(gy, col, ((0, 2, 3), (0, 4, 5)))
        grads[2 * li + 1] = gy.sum(axis=(0, 2, 3))
        if li:
            gc = np.rollaxis(np.tensordot(W, gy, (0, 1)), 3)
            gh = _np_col2im(gc, hin.shape, 3, 1, 1)
    for q, gq in zip(params, grads):
        q -= lr * gq
    return loss


def _cnn_forward(x, W1, b1, W2, b2, Wl, bl):
    h = F.pooling(F.relu(F.conv2d(x, W1, b1, 1, 1)), 2, 2)
    h = F.pooling(F.relu(F.conv2d(h, W2, b2, 1, 1)), 2, 2)
    return F.linear(F.reshape(h, (x.shape[0], -1)), Wl, bl)


def cnn_workload(batch=32):
    """W6: x, t, make() -> (model, optimizer), step(model, optimizer) -> loss."""
    import tracejit.layers as L
    from tracejit.models import Model

    class CNN(Model):
        def __init__(self):
            super().__init__()
            self.c1 = L.Conv2d(16, 3, pad=1)
            self.c2 = L.Conv2d(32, 3, pad=1)
            self.fc = L.Linear(10)

        def forward(self, x):
            # The layers' calls: what _cnn_forward computes from their parameters.
            h = F.pooling(F.relu(self.c1(x)), 2, 2)
            h = F.pooling(F.relu(self.c2(h)), 2, 2)
            return self.fc(F.reshape(h, (x.shape[0], -1)))

    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, 1, 28, 28)).astype(np.float32)
    t = rng.integers(0, 10, batch)

    def make():
        np.random.seed(0)
        model = CNN()
        model(x)                    # creates the lazy weights
        return model, optimizers.SGD(0.01).setup(model)

    def step(model, opt):
        loss = F.softmax_cross_entropy(model(x), t)
        model.cleargrads()
        loss.backward()
        opt.update()
        return loss
    return x, t, make, step


def bench_cnn(rounds, min_time, backend, batch=32):
    x, t, make, step = cnn_workload(batch)
    m_e, o_e = make()
    m_j, o_j = make()
    step_j = tj.jit(lambda: step(m_j, o_j), backend=backend)
    init = [m_e.c1.W.data, m_e.c1.b.data, m_e.c2.W.data, m_e.c2.b.data, m_e.fc.W.data,
            m_e.fc.b.data]
    ps_np = [a.copy() for a in init]
    ps_vg = [a.copy() for a in init]

    def loss_fn(W1, b1, W2, b2, Wl, bl):
        return F.softmax_cross_entropy(_cnn_forward(x, W1, b1, W2, b2, Wl, bl), t)

    vg = tj.value_and_grad(loss_fn, argnums=tuple(range(6)))
    vgj = tj.jit(vg, backend=backend)

    def vg_step(f):
        def call():
            loss, gs = f(*ps_vg)
            for q, gq in zip(ps_vg, gs):
                q -= 0.01 * gq.data
            return loss
        return call

    # The hand-written step computes what tracejit does (a check, not a benchmark).
    ref = [a.copy() for a in init]
    l_np = numpy_cnn_step(ref, x, t)
    l_tj = step(*make())
    if not np.allclose(l_np, l_tj.data, rtol=1e-4):
        print(f"  !! the NumPy-by-hand CNN step's loss {l_np} differs from tracejit's "
              f"{float(l_tj.data)}")
    print("\nW6 compile cost: jit(step), " + _first_compile(step_j, step_j))
    print("W6 compile cost: jit(value_and_grad), " + _first_compile(vgj, vg_step(vgj)))

    impls = {
        "tracejit eager": lambda: step(m_e, o_e),
        "tracejit jit (step inside)": step_j,
        "tracejit jit(value_and_grad) + SGD": vg_step(vgj),
        "numpy im2col by hand (DeZero's)": lambda: numpy_cnn_step(ps_np, x, t),
    }
    if torch is not None:
        tm = torch.nn.Sequential(
            torch.nn.Conv2d(1, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
            torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
            torch.nn.Flatten(), torch.nn.Linear(32 * 7 * 7, 10))
        topt = torch.optim.SGD(tm.parameters(), lr=0.01)
        tx, tt = torch.from_numpy(x), torch.from_numpy(t)

        def torch_step(model):
            def call():
                topt.zero_grad()
                loss = torch.nn.functional.cross_entropy(model(tx), tt)
                loss.backward()
                topt.step()
                return loss
            return call
        impls["torch eager"] = torch_step(tm)
        try:
            tc = torch_step(torch.compile(tm))
            t0 = time.perf_counter()
            tc()
            print(f"W6 compile cost: torch.compile, first step {time.perf_counter() - t0:.1f} s")
            impls["torch.compile"] = tc
        except Exception as e:  # noqa: BLE001 - a benchmark reports, it does not stop
            print(f"  torch.compile unavailable: {e}")
    if jax is not None:
        def jax_loss(ps, xj, tj_):
            def conv(h, W, b):
                y = jax.lax.conv_general_dilated(h, W, (1, 1), ((1, 1), (1, 1)))
                return y + b[None, :, None, None]

            def pool(h):
                return jax.lax.reduce_window(h, -jnp.inf, jax.lax.max, (1, 1, 2, 2),
                                             (1, 1, 2, 2), "VALID")
            W1, b1, W2, b2, Wl, bl = ps
            h = pool(jax.nn.relu(conv(xj, W1, b1)))
            h = pool(jax.nn.relu(conv(h, W2, b2)))
            logits = h.reshape(h.shape[0], -1) @ Wl + bl
            lp = jax.nn.log_softmax(logits)
            return -lp[jnp.arange(lp.shape[0]), tj_].mean()

        @jax.jit
        def jax_step(ps, xj, tj_):
            loss, gs = jax.value_and_grad(jax_loss)(ps, xj, tj_)
            return loss, [q - 0.01 * gq for q, gq in zip(ps, gs)]

        jstate = {"ps": [jnp.asarray(a) for a in init]}
        xj, tj_ = jnp.asarray(x), jnp.asarray(t)
        t0 = time.perf_counter()
        jcompiled = jax_step.lower(jstate["ps"], xj, tj_).compile()

        def jax_call():      # the executable compiled above (jax_step would compile again)
            loss, jstate["ps"] = jcompiled(jstate["ps"], xj, tj_)
            return jax.block_until_ready(loss)
        jax_call()
        print(f"W6 compile cost: jax.jit, first step {time.perf_counter() - t0:.1f} s")
        impls["jax.jit(value_and_grad)"] = jax_call
    warm_up(impls, 3)        # every column: as many calls as jit's first compile took
    res = interleaved(impls, rounds, min_time)
    report(f"W6 CNN step, batch {batch}x1x28x28 float32: conv16-relu-pool-conv32-relu-pool-"
           f"linear10, softmax CE, SGD", res, "tracejit eager", summary_line(step_j))
    check_no_fallback(step_j, vgj)
    mem = {name: peak_step_memory(impls[name]) for name in
           ("tracejit eager", "tracejit jit (step inside)",
            "tracejit jit(value_and_grad) + SGD", "numpy im2col by hand (DeZero's)")}
    if jax is not None:
        mem["jax.jit (XLA's buffer assignment)"] = _xla_memory(jcompiled)
    report_memory("W6", mem)


# ------------------------------------------------------------------ W7 LSTM window

def lstm_workload(hidden=100, bptt=30, batch=30):
    """The book's step 60: SinCurve through SeqDataLoader, LSTM(100) + Linear(1), a
    BPTT window of 30 steps, Adam; the state carries from one window to the next.
    Returns xs, ts, make() -> (model, optimizer), and the window's two forms."""
    import tracejit.layers as L
    from tracejit.datasets import SinCurve
    from tracejit.models import Model

    class BetterRNN(Model):
        def __init__(self):
            super().__init__()
            self.rnn = L.LSTM(hidden)
            self.fc = L.Linear(1)

        def reset_state(self):
            self.rnn.reset_state()

        def forward(self, x):
            return self.fc(self.rnn(x))

    np.random.seed(0)
    loader = tj.SeqDataLoader(SinCurve(train=True), batch_size=batch)
    data = list(loader)[:bptt]
    xs = np.stack([b[0] for b in data])      # (bptt, batch, 1)
    ts = np.stack([b[1] for b in data])

    def make():
        np.random.seed(0)
        m = BetterRNN()
        m(xs[0])
        m(xs[0])                # the second call creates the h2* weights
        m.reset_state()
        return m, optimizers.Adam().setup(m)

    def book_window(m, opt):
        # The book's loop body over one window, state left in m.rnn (h, c).
        def window():
            loss = 0
            for i in range(bptt):
                loss = loss + F.mean_squared_error(m(xs[i]), ts[i])
            m.cleargrads()
            loss.backward()
            loss.unchain_backward()
            opt.update()
            return loss
        return window

    def state_window(m, opt):
        # The same window with the state as argument and result: m.rnn holds it only
        # during the call, so no Python attribute is rebound across calls (the form
        # needed before jit threaded the state left in m.rnn; kept to compare).
        def window(h, c):
            m.rnn.h, m.rnn.c = h, c
            loss = 0
            for i in range(bptt):
                loss = loss + F.mean_squared_error(m(xs[i]), ts[i])
            m.cleargrads()
            loss.backward()
            loss.unchain_backward()
            opt.update()
            h, c = m.rnn.h, m.rnn.c
            m.rnn.reset_state()
            return loss, h, c
        return window
    return xs, ts, make, book_window, state_window


def bench_lstm(rounds, min_time, backend, hidden=100, bptt=30, batch=30,
               torch_compile=False):
    """W7 (lstm_workload), the state carried from one window to the next."""
    xs, ts, make, book_window, state_window = lstm_workload(hidden, bptt, batch)
    m_e, o_e = make()
    m_b, o_b = make()
    m_j, o_j = make()
    eager = book_window(m_e, o_e)
    book_j = tj.jit(book_window(m_b, o_b), backend=backend)
    win_j = tj.jit(state_window(m_j, o_j), backend=backend)
    state = {"h": None, "c": None}

    def state_call():
        loss, state["h"], state["c"] = win_j(state["h"], state["c"])
        return loss
    print("\nW7 compile cost: jit(window(h, c)), " + _first_compile(win_j, state_call, 4))
    # The book's window threads m.rnn.h, .c: its first trace finds them rebound, and
    # the call after it warms up the threading variant (4 calls, as window(h, c)).
    print("W7 compile cost: jit(book's window, state in m.rnn), "
          + _first_compile(book_j, book_j, 4))
    impls = {
        "tracejit eager (book's loop)": eager,
        "tracejit jit(window(h, c))": state_call,
        "tracejit jit(book's window)": book_j,
    }
    if torch is not None:
        tl, tf = torch.nn.LSTMCell(1, hidden, dtype=torch.float64), \
            torch.nn.Linear(hidden, 1, dtype=torch.float64)
        topt = torch.optim.Adam(list(tl.parameters()) + list(tf.parameters()))
        txs, tts = torch.from_numpy(xs), torch.from_numpy(ts)
        tstate = {"hc": None}

        def torch_window():
            hc = tstate["hc"]
            loss = 0
            for i in range(bptt):
                hc = tl(txs[i], hc)
                loss = loss + torch.nn.functional.mse_loss(tf(hc[0]), tts[i])
            topt.zero_grad()
            loss.backward()
            topt.step()
            tstate["hc"] = (hc[0].detach(), hc[1].detach())
            return loss
        impls["torch eager"] = torch_window
        if torch_compile:
            # The window's forward and loss compiled (backward by AOTAutograd), Adam's
            # step eager as in the column above. Opt-in: it compiles for minutes.
            def torch_loss(hc, txs, tts):
                loss = 0
                for i in range(bptt):
                    hc = tl(txs[i], hc)
                    loss = loss + torch.nn.functional.mse_loss(tf(hc[0]), tts[i])
                return loss, hc
            tc_loss = torch.compile(torch_loss)
            tcstate = {"hc": (torch.zeros(batch, hidden, dtype=torch.float64),
                              torch.zeros(batch, hidden, dtype=torch.float64))}

            def torch_compiled_window():
                loss, hc = tc_loss(tcstate["hc"], txs, tts)
                topt.zero_grad()
                loss.backward()
                topt.step()
                tcstate["hc"] = (hc[0].detach(), hc[1].detach())
                return loss
            t0 = time.perf_counter()
            c0 = time.process_time()
            torch_compiled_window()
            print(f"W7 compile cost: torch.compile, first window "
                  f"{time.perf_counter() - t0:.1f} s ({time.process_time() - c0:.1f} s CPU)")
            impls["torch.compile (forward + loss)"] = torch_compiled_window
    if jax is not None:
        jax_call, jax_mem = _jax_lstm(xs, ts, hidden, bptt, batch)
        impls["jax.jit(value_and_grad), lax.scan"] = jax_call
    warm_up(impls, 4)        # every column: as many calls as jit's first compile took
    res = interleaved(impls, rounds, min_time)
    report(f"W7 LSTM({hidden}) + Linear(1) BPTT window of {bptt} steps, batch {batch}, "
           f"Adam (the book's step 60)", res, "tracejit eager (book's loop)",
           summary_line(win_j, state["h"], state["c"]))
    check_no_fallback(win_j, book_j)
    mem = {name: peak_step_memory(impls[name]) for name in
           ("tracejit eager (book's loop)", "tracejit jit(window(h, c))",
            "tracejit jit(book's window)")}
    if jax is not None:
        mem["jax.jit (XLA's buffer assignment)"] = jax_mem
    report_memory("W7", mem)


def _jax_lstm(xs, ts, hidden, bptt, batch):
    """W7 in JAX: the window's 30 cells as jax.lax.scan, one jax.jit of value_and_grad
    and Adam's update; the state (h, c) and Adam's moments carried between calls.
    float64 throughout (as the torch column; tracejit's parameters are float32 as
    DeZero makes them, its activations float64 from the float64 data). The four gates
    in one (4 * hidden) product, as torch.nn.LSTMCell; h starts at zeros, which is
    DeZero's first step (no h2* term) with zero gradients for h2*."""
    rng = np.random.default_rng(0)
    H = hidden
    ps = {"Wx": rng.standard_normal((1, 4 * H)) * np.sqrt(1.0),
          "Wh": rng.standard_normal((H, 4 * H)) * np.sqrt(1.0 / H),
          "b": np.zeros(4 * H), "Wl": rng.standard_normal((H, 1)) * np.sqrt(1.0 / H),
          "bl": np.zeros(1)}
    ps = {k: jnp.asarray(v) for k, v in ps.items()}

    def loss_fn(ps, h, c, xs, ts):
        def cell(carry, xt):
            h, c = carry
            x, t = xt
            z = x @ ps["Wx"] + h @ ps["Wh"] + ps["b"]
            f, i, o, u = jnp.split(z, 4, axis=1)
            f, i, o, u = jax.nn.sigmoid(f), jax.nn.sigmoid(i), jax.nn.sigmoid(o), jnp.tanh(u)
            c = f * c + i * u
            h = o * jnp.tanh(c)
            y = h @ ps["Wl"] + ps["bl"]
            return (h, c), jnp.sum((y - t) ** 2) / y.shape[0]
        (h, c), losses = jax.lax.scan(cell, (h, c), (xs, ts))
        return jnp.sum(losses), (h, c)

    b1, b2, alpha, eps = 0.9, 0.999, 0.001, 1e-8

    @jax.jit
    def step(ps, m, v, t, h, c, xs, ts):
        (loss, (h, c)), g = jax.value_and_grad(loss_fn, has_aux=True)(ps, h, c, xs, ts)
        t = t + 1
        lr = alpha * jnp.sqrt(1 - b2 ** t) / (1 - b1 ** t)
        m = jax.tree_util.tree_map(lambda m, g: m + (1 - b1) * (g - m), m, g)
        v = jax.tree_util.tree_map(lambda v, g: v + (1 - b2) * (g * g - v), v, g)
        ps = jax.tree_util.tree_map(lambda p, m, v: p - lr * m / (jnp.sqrt(v) + eps),
                                    ps, m, v)
        return loss, ps, m, v, t, h, c

    zeros = jax.tree_util.tree_map(jnp.zeros_like, ps)
    st = {"ps": ps, "m": zeros, "v": zeros, "t": jnp.zeros((), jnp.float64),
          "h": jnp.zeros((batch, H)), "c": jnp.zeros((batch, H))}
    xj, tj_ = jnp.asarray(xs), jnp.asarray(ts)
    args = (st["ps"], st["m"], st["v"], st["t"], st["h"], st["c"], xj, tj_)
    t0 = time.perf_counter()
    c0 = time.process_time()
    compiled = step.lower(*args).compile()
    mem = _xla_memory(compiled)

    def call():          # the executable compiled above (a call of step would compile again)
        loss, st["ps"], st["m"], st["v"], st["t"], st["h"], st["c"] = compiled(
            st["ps"], st["m"], st["v"], st["t"], st["h"], st["c"], xj, tj_)
        return jax.block_until_ready(loss)
    call()
    print(f"W7 compile cost: jax.jit, first window {time.perf_counter() - t0:.1f} s "
          f"({time.process_time() - c0:.1f} s CPU)")
    return call, mem


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
            # cwd: `python -c` puts '' first on sys.path, so from the checkout's root
            # the processes imported its tracejit (no bytecode) instead of the copy.
            out = subprocess.run([sys.executable, "-c", _LATENCY, backend, scipy], env=env,
                                 capture_output=True, text=True, cwd=cache)
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
    p.add_argument("--only", default="W1W2W3W4W5W6W7L", help="e.g. W3W5")
    p.add_argument("--backend", default="auto")
    p.add_argument("--blas-threads", default=None,
                   help="OpenBLAS threads (OPENBLAS_NUM_THREADS) and PyTorch's, e.g. 1 on a "
                   "loaded machine")
    p.add_argument("--w7-torch-compile", action="store_true",
                   help="add W7's torch.compile column (its compile takes minutes)")
    args = p.parse_args()
    warnings.simplefilter("always", tj.JitWarning)
    rounds, min_time = (3, 0.02) if args.quick else (5, 0.2)
    sizes = (1000, 100_000) if args.quick else (1000, 100_000, 4_000_000)
    print(f"tracejit benchmarks: numpy {np.__version__}, numba {numba.__version__}, "
          f"{os.cpu_count()} cores, backend={args.backend}, OPENBLAS_NUM_THREADS="
          f"{os.environ.get('OPENBLAS_NUM_THREADS', 'unset')}"
          + (f", jax {jax.__version__}" if jax else "")
          + (f", torch {torch.__version__} ({torch.get_num_threads()} threads)" if torch else ""))
    if "W1" in args.only or "W2" in args.only:
        bench_chains(sizes, rounds, min_time, args.backend)
    if "W3" in args.only:
        bench_scalar(rounds, min_time, args.backend)
    if "W4" in args.only:
        bench_mlp(rounds, min_time, args.backend)
    if "W5" in args.only:
        bench_while(rounds, min_time, args.backend)
    if "W6" in args.only:
        bench_cnn(rounds, min_time, args.backend)
    if "W7" in args.only:
        bench_lstm(rounds, min_time, args.backend, torch_compile=args.w7_torch_compile)
    if "L" in args.only:
        bench_latency(args.backend)


if __name__ == "__main__":
    main()
