"""The numba backend: plans (plan.py) call fused kernels (kernels.py, with inlined
vector math from vecmath.py), built once per process and cached on disk (cache.py)."""
from tracejit.backends.numba.plan import NUMPY_MATH_MIN, compile, optimize, stats

__all__ = ["NUMPY_MATH_MIN", "compile", "optimize", "stats"]
