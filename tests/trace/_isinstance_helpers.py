"""Helpers a jitted function reaches only through this module (`helpers.is_lr(lr)`):
tests/test_isinstance_of_traced_numbers.py."""
import numbers


def is_lr(v):
    return isinstance(v, float)


def is_float_type(v):
    return type(v) is float


def is_real(v):
    return _check(v)


def _check(v):
    # A module-level helper of the helper: reached through is_real's globals.
    return isinstance(v, numbers.Real) and type(v) is not int


class Schedule:
    def scale(self, lr):
        return lr * 0.5 if isinstance(lr, float) else 0.0
