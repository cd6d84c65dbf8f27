"""The pipeline: the passes every traced graph goes through, in order, by name.

The JIT runs it (`optimize`) on every graph before handing it to a backend, the
interpret backend included: backends only lower the optimized graph. run_pipeline
times each pass (g.notes["pass_seconds"]), names the pass in errors and prints the
graph after a pass on request (TRACEJIT_DUMP=<pass name> or all).
"""
import os
import sys
import time

from tracejit.passes.conv_epilogue import fuse_conv_epilogues
from tracejit.passes.fusion import FUSED, fuse
from tracejit.passes.matmul_batching import batch_matmuls
from tracejit.passes.simplify import (eliminate_common_subexpressions, eliminate_dead_code,
                                      fold_constants)


# ---------------------------------------------------------------- pipeline

# batch_matmuls after CSE: the transposed weights every time step reads are one value
# by then, so their concatenation is made once per call. fuse_conv_epilogues before
# fuse: fuse would put the bias add and the ReLU into a kernel of their own.
PIPELINE = (eliminate_dead_code, fold_constants, eliminate_common_subexpressions,
            eliminate_dead_code, batch_matmuls, fuse_conv_epilogues, fuse)


class PassError(Exception):
    pass


def run_pipeline(g, dump=None, passes=None, timings=None):
    """Run the passes in order; time each, name the pass in errors, dump on request.

    `dump` is a pass name (TRACEJIT_DUMP=fuse) or "all": the graph is printed to
    stderr after that pass. Timings (seconds per pass) go to g.notes["pass_seconds"].
    """
    if dump is None:
        dump = os.environ.get("TRACEJIT_DUMP")
    times = {}
    for p in (PIPELINE if passes is None else passes):
        name = p.__name__
        t0 = time.perf_counter()
        try:
            g = p(g)
        except Exception as e:
            raise PassError(f"pass {name} failed on graph {g.name}: "
                            f"{type(e).__name__}: {e}") from e
        times[name] = times.get(name, 0.0) + time.perf_counter() - t0
        if dump and (dump == name or dump == "all"):
            print(f"# after {name}\n{g}", file=sys.stderr)
    g.notes["pass_seconds"] = {k: round(v, 6) for k, v in times.items()}
    g.optimized = True
    if timings is not None:
        timings.update(times)
    return g


def is_fused(g):
    return any(n.kind == FUSED for n in g.nodes)


def optimize(g):
    """g after PIPELINE. A graph the pipeline returned, or one already fused, is
    returned as is: the JIT optimizes before the backend, and a backend's compile
    optimizes what its direct callers hand it, so each graph goes through once."""
    return g if g.optimized or is_fused(g) else run_pipeline(g)

