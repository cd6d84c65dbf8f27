"""Graph -> Graph passes between tracing and the backends, run by the JIT before any
backend (pipeline.optimize) in the order of pipeline.PIPELINE: simplify.py (dead code,
common subexpressions, constants), matmul_batching.py (fewer, larger matrix products),
conv_epilogue.py (a conv's bias, ReLU and max pooling in one call, and the mirror in
its gradient) and fusion.py (elementwise and reduction groups into Fused nodes). remat.py chooses, while the backward is traced, which forward values a
compiled backward saves or recomputes.

Every pass is a pure function returning a new Graph whose values keep their identity,
so `ir.check` and the interpreter work on every intermediate result.
"""
from tracejit.passes.conv_epilogue import fuse_conv_epilogues
from tracejit.passes.fusion import FUSED, Fused, fuse
from tracejit.passes.matmul_batching import batch_matmuls
from tracejit.passes.pipeline import PIPELINE, PassError, is_fused, optimize, run_pipeline
from tracejit.passes.simplify import (eliminate_common_subexpressions, eliminate_dead_code,
                                      fold_constants)

__all__ = ["Fused", "FUSED", "batch_matmuls", "fuse_conv_epilogues", "eliminate_dead_code",
           "eliminate_common_subexpressions", "fold_constants", "fuse", "PIPELINE",
           "run_pipeline", "PassError", "is_fused", "optimize"]
