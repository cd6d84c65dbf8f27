"""Arguments and results of a jitted call as trees: leaves (arrays, Variables, floats)
inside tuples, lists and dicts, and everything else static (part of the cache key).

Used by jit.py to key calls and by variant.py to rebuild a call's results.
"""
import inspect

import numpy as np

from tracejit.core import Parameter, Variable
from tracejit.tracing import TracedArray, TracedScalar

VAR, ARR, FLT = "V", "A", "F"


def flatten_args(obj, leaves):
    """Append array-like leaves to `leaves`; return a hashable structure with statics."""
    t = type(obj)
    if t is Variable or isinstance(obj, Variable):
        leaves.append(obj)
        return VAR
    if t is np.ndarray or isinstance(obj, np.ndarray):
        leaves.append(obj)
        return ARR
    if t is float:
        leaves.append(obj)
        return FLT
    if t is tuple or t is list:
        return (t.__name__,) + tuple(flatten_args(x, leaves) for x in obj)
    if t is dict:
        keys = tuple(obj)
        return ("dict", keys) + tuple(flatten_args(obj[k], leaves) for k in keys)
    if isinstance(obj, np.generic) and obj.dtype.kind == "f":
        leaves.append(np.asarray(obj))
        return ARR
    try:
        hash(obj)
    except TypeError:
        raise TypeError(f"jit: argument of type {t.__name__} is neither an array, a Variable, "
                        f"a float nor hashable (it could not be a static argument)") from None
    return ("S", obj)


def unflatten(tree, leaves, it=None):
    it = iter(leaves) if it is None else it
    if tree in (VAR, ARR, FLT):
        return next(it)
    tag = tree[0]
    if tag == "S":
        return tree[1]
    if tag == "tuple":
        return tuple(unflatten(t, None, it) for t in tree[1:])
    if tag == "list":
        return [unflatten(t, None, it) for t in tree[1:]]
    if tag == "dict":
        return {k: unflatten(t, None, it) for k, t in zip(tree[1], tree[2:])}
    raise AssertionError(tree)


def leaf_key(x):
    if isinstance(x, Variable):
        d = x._data
        if d is None:
            raise TypeError("jit: a Variable argument has data None")
        if not isinstance(d, np.ndarray):
            raise TypeError(f"jit: a Variable argument holds a {type(d).__name__}, not a "
                            f"numpy.ndarray (set .data to np.array(...))")
        return (d.shape, d.dtype.char, isinstance(x, Parameter))
    if isinstance(x, np.ndarray):
        if x.dtype == object:
            raise TypeError("jit: object arrays are not supported")
        return (x.shape, x.dtype.char)
    return None


# ------------------------------------------------------------------ the compiled call


def flatten_result(obj, leaves):
    t = type(obj)
    if isinstance(obj, (Variable, np.ndarray, TracedScalar)):
        leaves.append(obj)
        return VAR
    if t is tuple or t is list:
        return (t.__name__,) + tuple(flatten_result(x, leaves) for x in obj)
    if t is dict:
        keys = tuple(obj)
        return ("dict", keys) + tuple(flatten_result(obj[k], leaves) for k in keys)
    leaves.append(obj)
    return VAR


def strip_tracers(obj):
    """The traced call's result with tracer types replaced by plain ones."""
    if isinstance(obj, TracedArray):
        a = np.array(obj.view(np.ndarray))
        scalar = obj._numpy_scalar
        return a if not scalar else a.item() if scalar == "python" else a[()]
    if isinstance(obj, TracedScalar):
        return obj._value
    if type(obj) in (tuple, list):
        return type(obj)(strip_tracers(x) for x in obj)
    if type(obj) is dict:
        return {k: strip_tracers(v) for k, v in obj.items()}
    return obj


def arg_names(fn, n):
    try:
        params = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        params = []
    names = []
    for i in range(n):
        names.append(params[i] if i < len(params) and params[i] not in ("args", "kwargs")
                     else f"arg{i}")
    return names


def structure_source(tree, exprs, const):
    if tree in (VAR, ARR, FLT):
        return next(exprs)
    tag = tree[0]
    if tag == "S":
        return const(tree[1])
    parts = [structure_source(t, exprs, const) for t in tree[(2 if tag == "dict" else 1):]]
    if tag == "tuple":
        return "(" + "".join(p + ", " for p in parts) + ")"
    if tag == "list":
        return "[" + ", ".join(parts) + "]"
    keys = tree[1]
    return "{" + ", ".join(f"{const(k)}: {p}" for k, p in zip(keys, parts)) + "}"
