"""Compile cost of W6 (CNN step) and W7 (LSTM window): cold and warm disk cache.

Each measurement is a fresh process that builds the workload of benchmarks/run.py and
makes the calls of its first compile (eager warm-up, trace + compile + the check
against eager, the checked compiled calls: 3 for W6, 4 for W7), reporting wall and
CPU seconds of those calls:

    python benchmarks/bench_compile.py [--only W6W7] [--repeat 3] [--kernels]

  cold       a new kernel cache (TRACEJIT_CACHE_DIR); numba's cache of tracejit's
             vecmath functions as it is (compiled once per install, like numba's own)
  cold+vm    also a new NUMBA_CACHE_DIR: vecmath compiled too (the first program ever)
  warm       the cold run's kernel cache again
  background TRACEJIT_BACKGROUND_COMPILE=1, cold kernel cache: the first result's time;
             "all compiled" is when the worker finished the last kernel

--kernels prints numba's compilations of the first cold process, slowest first (wall
and the compiling thread's CPU; a kernel's time includes the vecmath functions it
compiles). numba's compilations during the workload's set-up (its eager calls, which
compile the ops' own numba kernels, e.g. W6's im2col) are not counted: the times are
those of the calls of the first compile. CPU time is the number to compare on a loaded machine; wall is printed
with the load average.
"""
import argparse
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))

CHILD = r"""
import json, os, sys, threading, time
sys.path.insert(0, sys.argv[1])
import tracejit
which, want_kernels = sys.argv[2], sys.argv[3] == "1"
import numpy as np
from numba.core import dispatcher as _d
COMP, depth = [], threading.local()
_orig = _d.Dispatcher.compile
def compile_timed(self, sig):
    d = getattr(depth, "d", 0)
    if self.overloads.get(tuple(sig) if not hasattr(sig, "args") else sig.args) is not None:
        return _orig(self, sig)
    depth.d = d + 1
    t0, c0 = time.perf_counter(), time.thread_time()
    try:
        return _orig(self, sig)
    finally:
        depth.d = d
        COMP.append((self.py_func.__name__, d, time.perf_counter() - t0,
                     time.thread_time() - c0))
_d.Dispatcher.compile = compile_timed
import run
import tracejit as tj
from tracejit.backends.numba import plan
if which == "W6":
    x, t, make, step = run.cnn_workload()
    m, o = make()
    j = tj.jit(lambda: step(m, o))
    call, n = j, 3
else:
    xs, ts, make, book_window, state_window = run.lstm_workload()
    m, o = make()
    j = tj.jit(state_window(m, o))
    st = [None, None]
    def call():
        loss, st[0], st[1] = j(*st)
    n = 4
del COMP[:]             # the workload's set-up (eager calls: the ops' own numba kernels)
t0, c0 = time.perf_counter(), time.process_time()
for _ in range(n):
    call()
wall, cpu = time.perf_counter() - t0, time.process_time() - c0
from tracejit.backends.numba import background
background.wait()
wall_all, cpu_all = time.perf_counter() - t0, time.process_time() - c0
info = j.cache_info()
print(json.dumps(dict(tree=os.path.dirname(os.path.dirname(tracejit.__file__)), wall=wall, cpu=cpu, wall_all=wall_all, cpu_all=cpu_all,
                      trace=info["trace_seconds"], lowering=info["compile_seconds"],
                      fallbacks=info["fallbacks"], stats=plan.stats(),
                      numba=sum(c[3] for c in COMP if c[1] == 0),
                      kernels=sorted(COMP, key=lambda c: -c[3]) if want_kernels else [])))
"""


def run_child(which, env, kernels=False):
    # cwd: not this checkout, whose tracejit `python -c` would import before
    # PYTHONPATH's ('' is first on sys.path): an A/B run would time one tree twice.
    out = subprocess.run([sys.executable, "-c", CHILD, HERE, which, "1" if kernels else "0"],
                         env=env, capture_output=True, text=True, cwd=tempfile.gettempdir())
    if out.returncode:
        raise SystemExit(f"{which}: {out.stderr.strip()[-2000:]}")
    import json
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", default="W6W7")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--kernels", action="store_true")
    p.add_argument("--modes", default="cold,cold+vm,warm,background")
    args = p.parse_args()
    root = os.path.dirname(HERE)
    base = dict(os.environ, TRACEJIT_BENCH_NO_EXTERNAL="1", OPENBLAS_NUM_THREADS="1")
    base.setdefault("PYTHONPATH", root)
    base.pop("TRACEJIT_BACKGROUND_COMPILE", None)
    modes = args.modes.split(",")
    print(f"load average at start: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} "
          f"{os.getloadavg()[2]:.2f} ({os.cpu_count()} cores)")
    for which in ("W6", "W7"):
        if which not in args.only:
            continue
        rows = {m: [] for m in modes}
        for r in range(args.repeat):
            tmp = tempfile.mkdtemp(prefix="tracejit_compile_bench_")
            for mode in modes:
                env = dict(base)
                env["TRACEJIT_CACHE_DIR"] = os.path.join(tmp, "kernels")
                if mode == "cold+vm":
                    env["TRACEJIT_CACHE_DIR"] = os.path.join(tmp, "kernels_vm")
                    env["NUMBA_CACHE_DIR"] = os.path.join(tmp, "numba")
                if mode == "background":
                    env["TRACEJIT_CACHE_DIR"] = os.path.join(tmp, "kernels_bg")
                    env["TRACEJIT_BACKGROUND_COMPILE"] = "1"
                res = run_child(which, env, kernels=args.kernels and r == 0 and
                                mode == "cold")
                rows[mode].append(res)
                if res["kernels"]:
                    print(f"\n{which} numba compilations, first cold process (name, "
                          f"nesting depth, wall s, CPU s of the compiling thread):")
                    for name, d, w, c in res["kernels"]:
                        if w > 0.005:
                            print(f"  {'  ' * d}{c:6.3f} s CPU {w:6.3f} s wall  {name}")
        print(f"\n{which} (tracejit from {rows[modes[0]][0]['tree']}) first compiled result, "
              f"{args.repeat} processes each "
              f"(median; min-max), load average now {os.getloadavg()[0]:.2f}:")
        for mode, rs in rows.items():
            def med(k):
                v = sorted(x[k] for x in rs)
                return f"{v[len(v) // 2]:5.2f} s ({v[0]:.2f}-{v[-1]:.2f})"
            st = rs[0]["stats"]
            extra = (f"; all compiled {med('wall_all')} wall, {med('cpu_all')} CPU"
                     if mode == "background" else "")
            print(f"  {mode:<10} wall {med('wall')}, CPU {med('cpu')}; trace "
                  f"{med('trace')}, lowering {med('lowering')}, numba "
                  f"{med('numba')}{extra}; kernels built {st['kernels_built']}, "
                  f"compilations {st['numba_compilations']}, fallbacks "
                  f"{rs[0]['fallbacks']}")


if __name__ == "__main__":
    main()
