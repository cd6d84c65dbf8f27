"""Kernels compiled in the background, the plan running NumPy meanwhile (opt-in).

TRACEJIT_BACKGROUND_COMPILE=1: a plan's loop kernel that numba has not compiled yet
(not in this process, whatever the disk cache holds) is called through a `Tiered`
stand-in. Its first call submits the kernel's compilation for the argument types it
sees to one worker thread and computes the group with NumPy (the members' own
forwards, as the interpret backend runs them: eager's operations), writing the
kernel's outputs, accumulators and epilogue results exactly where the kernel would.
The first call after the compilation finished runs both, compares, and only if they
agree (the runtime checks' tolerances) puts the kernel itself in the plan's slot, so
later calls pay nothing for this; if they do not, the NumPy path stays (counted in
cache.STATS["background_mismatches"], and a RuntimeWarning). Why: numba compiles at
0.2-1 s a kernel, and a first window of an LSTM (12 distinct kernels) waited seconds
for all of them; LLVM's part of a compilation releases the GIL, so the worker overlaps
the calls. Off by default: a test counting compilations after a call would race.
"""
import os
import queue
import sys
import threading
import warnings

import numpy as np

from tracejit.backends.numba import cache as _cache
from tracejit.ir import Graph, Lit

RTOL, ATOL = 1e-5, 1e-7          # as the runtime's checks against eager

_QUEUE = None
_QUEUE_LOCK = threading.Lock()
_FUTURES = {}                    # id(dispatcher) -> _Compile (one per dispatcher)


def enabled():
    return os.environ.get("TRACEJIT_BACKGROUND_COMPILE", "") not in ("", "0")


class _Compile:
    __slots__ = ("done", "ok", "error")

    def __init__(self):
        self.done = threading.Event()
        self.ok = False
        self.error = None


def _worker():
    while True:
        disp, sig, fut = _QUEUE.get()
        try:
            disp.compile(sig)       # numba's own lock: never cache.LOCK (lowering waits)
            fut.ok = True
        except Exception as e:  # noqa: BLE001 - the NumPy path keeps running
            fut.error = e
        finally:
            fut.done.set()


def _submit(disp, args):
    global _QUEUE
    fut = _FUTURES.get(id(disp))
    if fut is not None:
        return fut
    import numba
    sig = tuple(numba.typeof(a) for a in args)
    with _QUEUE_LOCK:
        fut = _FUTURES.get(id(disp))
        if fut is not None:
            return fut
        if _QUEUE is None:
            _QUEUE = queue.Queue()
            threading.Thread(target=_worker, name="tracejit-compile", daemon=True).start()
        fut = _FUTURES[id(disp)] = _Compile()
        _QUEUE.put((disp, sig, fut))
    return fut


class Tiered:
    """A plan's kernel slot until its kernel is compiled (see the module docstring)."""

    def __init__(self, env, name, disp, spec, fused):
        self.env, self.name, self.disp = env, name, disp
        self.n_in, self.n_out = len(spec.inputs), len(spec.outputs)
        self.value_inputs = [not isinstance(v, Lit) for v in spec.inputs]
        self.n_red, self.n_epi = len(spec.reductions), len(spec.epilogue_outputs)
        sub = fused.graph
        outs = list(spec.outputs) + [n.out for n, *_ in spec.reductions] + \
            list(spec.epilogue_outputs)
        self.graph = Graph(sub.name + "_numpy", list(sub.inputs), list(sub.nodes), outs)
        # Outputs the kernel writes into a concatenation buffer at their block
        # (spec.out_blocks): the argument is the buffer, the output its block.
        self.blocks = {}
        for j, v in enumerate(spec.outputs):
            if id(v) in spec.out_blocks:
                axis, start = spec.out_blocks[id(v)]
                self.blocks[j] = (slice(None),) * axis + (slice(start, start + v.shape[axis]),)
        self._run = None
        self.fut = None

    def numpy(self, args):
        """The group with NumPy, into the kernel's output, accumulator and epilogue
        arguments (the accumulators hold their identity: the plan made them)."""
        if self._run is None:
            from tracejit.ir import interpret
            self._run = interpret.compile(self.graph)
        # the group's inputs: not the literals the kernel takes as arguments
        ins = [a for a, keep in zip(args[:self.n_in], self.value_inputs) if keep]
        for buf, y in zip(self._buffers(args), self._run(ins)):
            buf[...] = y

    def _buffers(self, args):
        """The output, accumulator and epilogue arrays the kernel writes (an output
        written at its block of a buffer: that block)."""
        bufs = list(args[self.n_in:self.n_in + self.n_out + self.n_red + self.n_epi])
        for j, idx in self.blocks.items():
            bufs[j] = bufs[j][idx]
        return bufs

    def __call__(self, *args):
        fut = self.fut
        if fut is None:
            fut = self.fut = _submit(self.disp, args)
        if not fut.done.is_set():
            self.numpy(args)
            return
        if not fut.ok:
            self.env[self.name] = self.numpy_only
            self.numpy(args)
            return
        # Compiled: both once, then the kernel alone if they agree.
        k = self.n_in + self.n_out + self.n_red + self.n_epi
        mine = [np.array(b, copy=True) for b in args[self.n_in:k]]
        self.disp(*args)
        ref = list(args[:self.n_in]) + mine + list(args[k:])
        self.numpy(ref)
        for got, want in zip(self._buffers(args), self._buffers(ref)):
            if not _close(got, want):
                _cache.STATS["background_mismatches"] = \
                    _cache.STATS.get("background_mismatches", 0) + 1
                fname, lineno = _user_frame()
                warnings.warn_explicit(f"tracejit: kernel {self.name} differs from its "
                                       f"NumPy reference; the group keeps running with "
                                       f"NumPy", RuntimeWarning, fname, lineno)
                for b, w in zip(self._buffers(args), self._buffers(ref)):
                    b[...] = w
                self.env[self.name] = self.numpy_only
                return
        self.env[self.name] = self.disp

    def numpy_only(self, *args):
        self.numpy(args)


def _close(got, want):
    got, want = np.asarray(got), np.asarray(want)
    if got.dtype.kind != "f":
        return np.array_equal(got, want)
    return bool(np.allclose(got, want, rtol=RTOL, atol=ATOL, equal_nan=True))


def wait():
    """Block until every submitted compilation finished (tests, benchmarks)."""
    for fut in list(_FUTURES.values()):
        fut.done.wait()


_PACKAGE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _user_frame():
    """(file, line) of the innermost frame outside tracejit: the user's call of the
    jitted function whose kernel disagreed (the backend sees no traced line here);
    generated runners are named "<tracejit-...>"."""
    f = sys._getframe(1)
    while f is not None and (f.f_code.co_filename.startswith("<tracejit") or
                             os.path.abspath(f.f_code.co_filename).startswith(_PACKAGE)):
        f = f.f_back
    return (f.f_code.co_filename, f.f_lineno) if f is not None else ("<tracejit>", 0)
