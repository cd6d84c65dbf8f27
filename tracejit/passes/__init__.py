"""Graph -> Graph passes between tracing and the backends, run in the order of
pipeline.PIPELINE: simplify.py (dead code, common subexpressions, constants),
fusion.py (elementwise and reduction groups into Fused nodes), and remat.py (which
forward values a compiled backward saves or recomputes).

Every pass is a pure function returning a new Graph whose values keep their identity,
so `ir.check` and the interpreter work on every intermediate result.
"""
from tracejit.passes.fusion import FUSED, Fused, basic_index_of, fuse
from tracejit.passes.pipeline import PIPELINE, PassError, is_fused, run_pipeline
from tracejit.passes.simplify import (eliminate_common_subexpressions, eliminate_dead_code,
                                      fold_constants)

__all__ = ["Fused", "FUSED", "basic_index_of", "eliminate_dead_code",
           "eliminate_common_subexpressions", "fold_constants", "fuse", "PIPELINE",
           "run_pipeline", "PassError", "is_fused"]
