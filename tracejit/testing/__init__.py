"""tracejit.testing: tools for testing differentiable code, yours and tracejit's own.

`gradcheck`, `assert_jit_matches_eager` (several calls, new values) and
`assert_call_matches_eager` (one call you drive yourself), in checks.py; `strategies`,
hypothesis strategies for arrays, shapes and random programs, imported lazily so
gradcheck works without hypothesis installed; `fuzz`, the differential fuzzer
(`python -m tracejit.testing.fuzz`).
"""
from tracejit.testing.checks import (assert_call_matches_eager, assert_jit_matches_eager,
                                     gradcheck)

__all__ = ["gradcheck", "assert_jit_matches_eager", "assert_call_matches_eager",
           "strategies"]


def __getattr__(name):
    # `from tracejit.testing import strategies` imports hypothesis only when asked for.
    if name == "strategies":
        import importlib
        return importlib.import_module("tracejit.testing.strategies")
    raise AttributeError(f"module 'tracejit.testing' has no attribute {name!r}")
