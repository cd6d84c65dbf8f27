"""A user module that binds NumPy's asarray under its own name (test_numpy_constructor_aliases)."""
from numpy import asarray as bound


def positive(a):
    return bool(bound(a).sum() > 0)


def scale(d):
    return 2.0 if bound(d).sum() > 0 else -3.0
