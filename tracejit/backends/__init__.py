"""Backends lower an optimized Graph to something that runs; numba/ is the compiler
(the reference interpreter is tracejit.ir.interpret)."""
