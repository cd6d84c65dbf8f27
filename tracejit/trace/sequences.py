"""NumPy constructors given traced numbers inside Python lists and tuples, or as a
fill value: np.array([m, s]) of x.data.mean() and x.data.std(), np.array([float(a),
1.0]), np.stack([lr, 2.0]), np.full(shape, float(h.data.max())).

Why this module: NumPy's array coercion reads each item of a list through its
__array__ / __float__, so the tracer saw each traced number as a value escaping to C
and guarded it by value. The call was right, but every new input retraced until
max_variants, and the compiled code never ran (a retrace storm). Here the items are
traced arrays of eager's dtype, stacked by np.stack (a recorded NumPy call), so the
graph computes what eager's coercion computes on every call.

What is left to NumPy's coercion (each value behind a guard, as before): a cast the
graph would not reproduce exactly (float to int truncates, and NaN and overflow differ),
non-numeric dtypes, and keyword arguments these functions do not follow.
"""
import numpy as np

from tracejit.trace.made import MadeArray, holds_traced  # noqa: F401 (record uses it here)
from tracejit.trace.values import TracedArray, TracedScalar


class _NotFollowed(Exception):
    """An item this module does not record: NumPy's own coercion runs instead."""


def plain_items(a):
    """a with each traced array a plain view of its buffer and each traced number its
    value: what NumPy's coercion reads, without the guards."""
    if type(a) in (list, tuple):
        return type(a)(plain_items(x) for x in a)
    if type(a) is TracedArray:
        return a.view(np.ndarray)
    if isinstance(a, TracedScalar):
        return a._value
    return a


def _traced(tr, item, dtype):
    """item (a list or tuple, a traced array or number, or a constant) as an array of
    dtype: the traced items recorded, nested lists stacked."""
    if type(item) in (list, tuple):
        if not holds_traced(item, tr):
            return np.asarray(plain_items(item), dtype)
        return np.stack([_traced(tr, x, dtype) for x in item])
    traced = (type(item) is TracedArray or isinstance(item, TracedScalar)) and \
        item._trace is tr
    if not traced:
        return np.asarray(plain_items(item), dtype)
    if not np.can_cast(item.dtype, dtype, casting="same_kind"):
        raise _NotFollowed          # float to int, float to bool: eager's cast, by value
    if isinstance(item, TracedScalar):
        return tr._wrap(np.asarray(item._value, dtype), tr.scalar_cast_value(item, dtype))
    return item if item.dtype == dtype else item.astype(dtype)


def _same(t, eager):
    return isinstance(t, TracedArray) and t.shape == eager.shape and \
        t.dtype == eager.dtype and np.array_equal(t.view(np.ndarray), eager, equal_nan=True)


def array_of_sequence(tr, orig, seq, args, kwargs):
    """np.array / np.asarray (orig) of a list or tuple holding tr's traced values: eager's
    array, recorded. NumPy's own call (each value guarded) where this does not follow."""
    params = dict(zip(("dtype", "copy"), args))
    if len(args) > 2 or set(kwargs) - {"dtype", "copy"} or set(params) & set(kwargs):
        return orig(seq, *args, **kwargs)
    params.update(kwargs)
    eager = orig(plain_items(seq), **params)     # raises what eager raises (ragged rows)
    if type(eager) is not np.ndarray or eager.dtype.kind not in "biuf":
        return orig(seq, *args, **kwargs)
    try:
        t = _traced(tr, seq, eager.dtype)
    except _NotFollowed:
        return orig(seq, *args, **kwargs)
    # (A check, not a condition: the stacked items are eager's coercion by construction.)
    return t if _same(t, eager) else orig(seq, *args, **kwargs)


def as_stack_items(tr, seq):
    """The items of np.stack / np.concatenate / np.hstack ...'s sequence with tr's traced
    numbers as 0-d traced arrays, and nested lists holding traced values as the traced
    arrays np.asarray makes of them: these functions coerce each item on its own, so
    the call then dispatches to the tracer (TracedArray.__array_function__) with eager's
    dtypes. None: an item this does not follow."""
    out = []
    try:
        for x in seq:
            if isinstance(x, TracedScalar) and x._trace is tr:
                x = _traced(tr, x, x.dtype)
            elif type(x) in (list, tuple) and holds_traced(x, tr):
                eager = np.asarray(plain_items(x))
                if eager.dtype.kind not in "biuf":
                    return None
                x = _traced(tr, x, eager.dtype)
            out.append(x)
    except _NotFollowed:
        return None
    return type(seq)(out)


def full(tr, orig, shape, fill, args, kwargs):
    """np.full(shape, fill) with a traced fill value: eager's array, recorded as the
    fill broadcast to shape and copied (C order)."""
    params = dict(zip(("dtype", "order"), args))
    if len(args) > 2 or set(kwargs) - {"dtype", "order"} or set(params) & set(kwargs):
        return orig(shape, fill, *args, **kwargs)
    params.update(kwargs)
    eager = orig(shape, plain_items(fill), **params)
    return _filled(tr, orig, eager, fill, lambda: orig(shape, fill, *args, **kwargs))


def full_like(tr, orig, a, fill, args, kwargs):
    """np.full_like(a, fill) with a traced fill value (a plain or traced a)."""
    names = ("dtype", "order", "subok", "shape")
    params = dict(zip(names, args))
    if len(args) > len(names) or set(kwargs) - set(names) or set(params) & set(kwargs):
        return orig(a, fill, *args, **kwargs)
    params.update(kwargs)
    eager = orig(plain_items(a), plain_items(fill), **params)
    return _filled(tr, orig, eager, fill, lambda: orig(a, fill, *args, **kwargs))


def _filled(tr, orig, eager, fill, numpy_own):
    if type(eager) not in (np.ndarray, MadeArray) or eager.dtype.kind not in "biuf" or \
            not eager.flags.c_contiguous:
        return numpy_own()           # an F-ordered or subclass result: NumPy's own
    try:
        v = _traced(tr, fill, eager.dtype)
    except _NotFollowed:
        return numpy_own()
    if np.ndim(v) > eager.ndim:
        return numpy_own()
    t = np.broadcast_to(v, eager.shape).copy()
    return t if _same(t, eager) else numpy_own()
