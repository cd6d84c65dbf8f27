"""Ops that only the tracer creates: guards, and NumPy calls on traced `.data`.

A Guard node records what Python saw while tracing (`bool(v)`, `float(v)`, ...): when
the variant runs, the backend checks it where it stands in the graph and stops at the
first guard whose outcome differs. NumpyCall is a NumPy function applied to traced
data that has no tracejit primitive (an argmax in accuracy()): an opaque node that
runs NumPy between kernels.
"""
import numpy as np

from tracejit.core import OPAQUE, Function, ShapeDtype

GUARD = "guard"


class GuardFailure(Exception):
    """A variant met a guard whose outcome differs from the one it was traced under."""

    def __init__(self, index, outcome):
        super().__init__(index, outcome)
        self.index = index        # position among the graph's guards
        self.outcome = outcome    # what the guard saw this time


_CONVERT = {"bool": bool, "int": int, "float": float, "index": int}


class Guard(Function):
    """`conv(x) == expected` where conv is bool, int, float or index."""

    kind = GUARD
    params = ("conv", "expected")

    def __init__(self, conv, expected):
        self.conv = conv
        self.expected = expected

    def outcome(self, x):
        return _CONVERT[self.conv](x)

    def holds(self, x):
        got = self.outcome(x)
        return got == self.expected or (got != got and self.expected != self.expected)

    def forward(self, x):
        return None

    def describe(self, arg):
        return f"{self.conv}({arg}) == {self.expected!r}"

    def shape_rule(self, x):
        return ()


class NumpyCall(Function):
    """A NumPy function or ufunc method applied to traced arrays, replayed as is."""

    kind = OPAQUE
    params = ("func", "method", "kwargs")

    def __init__(self, func, method=None, kwargs=()):
        self.func = func
        self.method = method
        self.kwargs = kwargs
        self.op_name = "np." + getattr(func, "__name__", str(func)) + (
            "." + method if method and method != "__call__" else "")

    def raw(self, *xs):
        """What NumPy itself returns (a NumPy scalar for a 0-d result)."""
        f = self.func if not self.method or self.method == "__call__" else \
            getattr(self.func, self.method)
        return f(*xs, **dict(self.kwargs))

    def forward(self, *xs):
        return np.asarray(self.raw(*xs))

    def shape_rule(self, *specs):
        y = self.forward(*[np.ones(s.shape, s.dtype) for s in specs])
        return ShapeDtype(y.shape, y.dtype)


class Constant(Function):
    """A constant array captured at trace time (no inputs)."""

    kind = "constant"
    params = ()

    def __init__(self, value):
        self.value = value

    def forward(self):
        return self.value
