"""W7 with and without one of fusion's steps, interleaved in one process.

    OPENBLAS_NUM_THREADS=1 PYTHONPATH=. python benchmarks/ab_w7_sink.py [rounds]
    FLAG=JOIN_OPERAND_GROUP OPENBLAS_NUM_THREADS=1 PYTHONPATH=. python benchmarks/ab_w7_sink.py

FLAG names the module flag of tracejit.passes.fusion toggled: SINK_INTO_READER
(_sink_into_reader, the default) or JOIN_OPERAND_GROUP (_join_operand_group).

Two W7 windows (run.lstm_workload, the window(h, c) form), one compiled with
the flag off and one with it on, each warmed up and its
background compiles finished; then `rounds` rounds of 5 timed calls of each, the order
alternating, so a slow phase of a loaded machine hits both alike. Prints each side's
graph.summary() counts and the medians (wall and thread CPU time) with the on/off
ratio. ONFIRST=1 compiles the "on" side first (the creation order is a bias of its own).
"""
import importlib
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import run  # noqa: E402
import tracejit as tj  # noqa: E402
import tracejit.passes.fusion as fu  # noqa: E402
from tracejit.backends.numba import background  # noqa: E402

PER_ROUND = 5
FLAG = os.environ.get("FLAG", "SINK_INTO_READER")
# FLAG may name another module's flag: "plan.COLUMN_BLOCK_WRITES", "kernels.UNSIGNED_INDEX"
# (tracejit.backends.numba), or several, comma-separated, toggled together.
_MODULES = {"fusion": fu, "plan": importlib.import_module("tracejit.backends.numba.plan"),
            "kernels": importlib.import_module("tracejit.backends.numba.kernels")}
FLAGS = [(_MODULES[f.split(".")[0]], f.split(".")[1]) if "." in f else (fu, f)
         for f in FLAG.split(",")]


def set_flag(value):
    for mod, name in FLAGS:
        assert hasattr(mod, name), name
        setattr(mod, name, value)


def make_side(state_window, make, flag):
    set_flag(flag)
    m, o = make()
    j = tj.jit(state_window(m, o))
    st = [None, None]

    def call():
        loss, st[0], st[1] = j(*st)
        return loss
    for _ in range(4):          # W7's first compile: 4 calls (run.py)
        call()
    background.wait()
    for _ in range(3):
        call()
    s = j.trace(*st).summary()
    counts = {k: s[k] for k in ("kernels", "distinct_kernels", "numpy_calls", "materialized")}
    print("on " if flag else "off", counts, "fallbacks", j.cache_info()["fallbacks"])
    return call


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 30
    _, _, make, _, state_window = run.lstm_workload()
    order = [False, True] if os.environ.get("ONFIRST") != "1" else [True, False]
    print("toggled:", FLAG)
    calls = {flag: make_side(state_window, make, flag) for flag in order}
    wall = {False: [], True: []}
    cpu = {False: [], True: []}
    for r in range(rounds):
        for flag in ([False, True] if r % 2 == 0 else [True, False]):
            set_flag(flag)
            for _ in range(PER_ROUND):
                t0, c0 = time.perf_counter(), time.thread_time()
                calls[flag]()
                wall[flag].append(time.perf_counter() - t0)
                cpu[flag].append(time.thread_time() - c0)
    for d, label in ((wall, "wall"), (cpu, "thread cpu")):
        off, on = statistics.median(d[False]) * 1e3, statistics.median(d[True]) * 1e3
        print(f"{label}: median off {off:.2f} ms, on {on:.2f} ms, on/off {on / off:.3f} "
              f"(n={len(d[False])} each)")
    ratios = [statistics.median(cpu[True][r * PER_ROUND:(r + 1) * PER_ROUND])
              / statistics.median(cpu[False][r * PER_ROUND:(r + 1) * PER_ROUND])
              for r in range(rounds)]
    q = statistics.quantiles(ratios, n=4)
    print(f"per-round on/off (thread cpu): median {statistics.median(ratios):.3f}, "
          f"quartiles {q[0]:.3f}-{q[2]:.3f}")


if __name__ == "__main__":
    main()
