"""Tracer values: what the user's function holds while it is traced.

TracedArray is a view of real data (an argument, a Variable's .data, a closure array)
that reports NumPy ufuncs and functions applied to it, and Python's looks at it
(bool, float, int, item: guards), to its Trace. TracedFloat is a float argument whose
arithmetic is recorded, so a new value does not retrace. Both carry real values, so
the traced call computes its real result.
"""
import numpy as np

from tracejit import functions as F
from tracejit.core import Variable

UFUNC_PRIMS = {
    np.add: F.Add, np.subtract: F.Sub, np.multiply: F.Mul, np.true_divide: F.Div,
    np.negative: F.Neg, np.exp: F.Exp, np.log: F.Log, np.sin: F.Sin, np.cos: F.Cos,
    np.tanh: F.Tanh, np.sqrt: F.Sqrt, np.absolute: F.Abs, np.sign: F.Sign,
    np.maximum: F.Maximum, np.minimum: F.Minimum, np.greater: F.Greater,
    np.greater_equal: F.GreaterEqual, np.less: F.Less, np.less_equal: F.LessEqual,
    np.equal: F.Equal, np.not_equal: F.NotEqual, np.power: F.PowV,
}
REDUCE_PRIMS = {np.add: F.Sum, np.maximum: F.Max, np.minimum: F.Min}


class TracedArray(np.ndarray):
    """A view of real data that records what NumPy and Python do with it."""

    _tv = None          # the IR value this array is (None: derived untracked)
    _owner = None       # the Variable whose .data this is, if any
    _trace = None
    _capture = None     # a closure/global array this view stands for, captured on use

    def __array_finalize__(self, obj):
        # Views made by NumPy internals carry no IR value: using one is an escape.
        self._tv = None
        self._owner = None
        self._capture = None
        self._trace = getattr(obj, "_trace", None)

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        return self._trace.ufunc(ufunc, method, inputs, kwargs)

    def __array_function__(self, func, types, args, kwargs):
        return self._trace.array_function(func, args, kwargs)

    def __bool__(self):
        return self._trace.guard(self, "bool")

    def __float__(self):
        return self._trace.guard(self, "float")

    def __int__(self):
        return self._trace.guard(self, "int")

    def __index__(self):
        return self._trace.guard(self, "index")

    def item(self, *args):
        if args:
            return self[args].item() if len(args) > 1 else self.reshape(-1)[args[0]].item()
        return self._trace.guard(self, "float" if self.dtype.kind in "fc" else
                                 ("bool" if self.dtype.kind == "b" else "int"))

    def tolist(self):
        self._trace.escape(".tolist() of traced data")
        return self.view(np.ndarray).tolist()

    def __setitem__(self, key, value):
        self._trace.escape("item assignment into traced data")
        value = value.view(np.ndarray) if isinstance(value, np.ndarray) else value
        self.view(np.ndarray)[key] = value

    def __getitem__(self, key):
        return self._trace.record_data_op(F.get_item, self, key)

    def reshape(self, *shape):
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = shape[0]
        return self._trace.record_data_op(F.reshape, self, shape)

    def transpose(self, *axes):
        axes = axes[0] if len(axes) == 1 and isinstance(axes[0], (tuple, list)) else axes
        return self._trace.record_data_op(F.transpose, self, axes or None)

    @property
    def T(self):
        return self.transpose()

    def astype(self, dtype, **kwargs):
        return self._trace.record_data_op(F.cast, self, dtype)

    def copy(self, order="C"):
        return self._trace.ufunc(np.positive, "__call__", (self,), {})

    def mean(self, axis=None, dtype=None, out=None, keepdims=False):
        if dtype is not None or out is not None:
            self._trace.escape("mean() with dtype= or out= on traced data")
            return self.view(np.ndarray).mean(axis, dtype, out, keepdims)
        return self._trace.record_data_op(F.mean, self, axis, keepdims)

    def argmax(self, axis=None, out=None, **kw):
        return self._trace.numpy_call(np.argmax, (self,), {"axis": axis, **kw})

    def argmin(self, axis=None, out=None, **kw):
        return self._trace.numpy_call(np.argmin, (self,), {"axis": axis, **kw})

    def __repr__(self):
        self._trace.side_effect("repr() of traced data")
        return repr(np.asarray(self))

    def __str__(self):
        self._trace.side_effect("str() of traced data")
        return str(np.asarray(self))

    def __format__(self, spec):
        self._trace.side_effect("formatting traced data")
        return format(np.asarray(self) if self.ndim else np.asarray(self)[()], spec)

    def __reduce__(self):
        self._trace.escape("pickling traced data")
        return self.view(np.ndarray).__reduce__()


class TracedFloat(float):
    """A float argument: a runtime input, so a new value does not retrace."""

    __slots__ = ("_tv", "_trace")

    def _op(self, other, fn, reverse=False):
        tr = self._trace
        if isinstance(other, TracedArray) or isinstance(other, Variable):
            return NotImplemented
        if not isinstance(other, (int, float)) or isinstance(other, bool):
            return NotImplemented
        a = tr.scalar_var(self)
        b = tr.scalar_var(other) if isinstance(other, TracedFloat) else other
        out = fn(b, a) if reverse else fn(a, b)
        if not isinstance(out, Variable):
            return out
        return tr.make_float(out)

    def __add__(self, o): return self._op(o, F.add)
    def __radd__(self, o): return self._op(o, F.add, True)
    def __sub__(self, o): return self._op(o, F.sub)
    def __rsub__(self, o): return self._op(o, F.sub, True)
    def __mul__(self, o): return self._op(o, F.mul)
    def __rmul__(self, o): return self._op(o, F.mul, True)
    def __truediv__(self, o): return self._op(o, F.div)
    def __rtruediv__(self, o): return self._op(o, F.div, True)
    def __pow__(self, o): return self._op(o, lambda a, b: F.PowV()(*F._as_operands(a, b)))
    def __rpow__(self, o): return self._op(o, lambda a, b: F.PowV()(*F._as_operands(a, b)),
                                           True)
    def __neg__(self): return self._trace.make_float(F.neg(self._trace.scalar_var(self)))
    def __pos__(self): return self
    def __abs__(self): return self._trace.make_float(F.abs(self._trace.scalar_var(self)))

    def _cmp(self, o, fn):
        if not isinstance(o, (int, float)):
            return NotImplemented
        return bool(fn(self._trace.scalar_var(self), o).data)

    def __gt__(self, o): return self._cmp(o, F.greater)
    def __ge__(self, o): return self._cmp(o, F.greater_equal)
    def __lt__(self, o): return self._cmp(o, F.less)
    def __le__(self, o): return self._cmp(o, F.less_equal)
    def __eq__(self, o): return self._cmp(o, F.equal)
    def __ne__(self, o): return self._cmp(o, F.not_equal)
    __hash__ = float.__hash__

    def __bool__(self):
        return bool(self._trace.scalar_var(self).data)

    def __float__(self):
        return float(self._trace.scalar_var(self).data)

    def __int__(self):
        return int(self._trace.scalar_var(self).data)

    def __array__(self, dtype=None, copy=None):
        return np.asarray(self._trace.scalar_var(self).data, dtype=dtype)

    @property
    def __array_interface__(self):
        raise AttributeError


# -------------------------------------------------------------------- the trace
