"""A user module that binds the names float and int to NumPy types (a module global
shadows the builtin): tests/test_symbolic_scalars_edge_cases.py calls these."""
import numpy as np

float = np.float32      # noqa: A001 - the shadowing is the point
int = np.int32          # noqa: A001


def mean_as_float32(x):
    return float(x.data.mean()), x * 2.0


def sum_as_int32(x):
    return int(x.data.sum() * 10.0), x * 1.0


def helper(x):
    return float(x.data.sum())


def calls_helper(x):
    return helper(x), x * 1.0
