"""Tracer values: what the user's function holds while it is traced.

TracedArray is a view of real data (an argument, a Variable's .data, a closure array)
that reports NumPy ufuncs and functions applied to it, and Python's looks at it
(bool, float, int, item: guards), to its Trace. TracedFloat is a float argument whose
arithmetic is recorded, so a new value does not retrace. Both carry real values, so
the traced call computes its real result.
"""
import math

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
    _numpy_scalar = False   # eager NumPy would have returned a scalar here (a.sum())

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
        y = self._trace.record_data_op(F.get_item, self, key)
        k = key if isinstance(key, tuple) else (key,)
        if isinstance(y, TracedArray) and y.ndim == 0 and \
                all(isinstance(i, (int, np.integer)) and not isinstance(i, bool) for i in k):
            y._numpy_scalar = True        # a[0, 1] is a NumPy scalar in eager
        return y

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
        y = self._trace.record_data_op(F.mean, self, axis, keepdims)
        if isinstance(y, TracedArray) and y.ndim == 0:
            y._numpy_scalar = True        # as ndarray.mean() returns
        return y

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


def _augmented(name):
    binary = getattr(np.ndarray, f"__{name}__")
    inplace = getattr(np.ndarray, f"__i{name}__")

    def method(self, other):
        if self._numpy_scalar:
            # Eager NumPy gave an immutable scalar here: `s += 1` makes a new one and
            # leaves other names for the old one alone.
            return binary(self, other)
        return inplace(self, other)
    method.__name__ = f"__i{name}__"
    return method


for _name in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "matmul", "and",
              "or", "xor", "lshift", "rshift"):
    setattr(TracedArray, f"__i{_name}__", _augmented(_name))


class TracedFloat:
    """A float argument: a runtime input, so a new value does not retrace.

    Not a float subclass on purpose: math.sqrt, round, //, % and str() then go
    through __float__ (or the methods below), which record a guard on the value, so
    a use the tracer cannot record retraces on a new value instead of freezing it.
    """

    __slots__ = ("_value", "_tv", "_trace")

    def __init__(self, value, tv=None, trace=None):
        self._value = float(value)
        self._tv = tv
        self._trace = trace

    # ---- recorded arithmetic

    def _op(self, other, fn, reverse=False):
        tr = self._trace
        if isinstance(other, TracedFloat):
            b = tr.scalar_var(other)
        elif isinstance(other, (int, float)) and not isinstance(other, bool):
            b = other
        else:
            return NotImplemented     # Variables and arrays take it from here
        a = tr.scalar_var(self)
        out = fn(b, a) if reverse else fn(a, b)
        return tr.make_float(out) if isinstance(out, Variable) else out

    def __add__(self, o): return self._op(o, F.add)
    def __radd__(self, o): return self._op(o, F.add, True)
    def __sub__(self, o): return self._op(o, F.sub)
    def __rsub__(self, o): return self._op(o, F.sub, True)
    def __mul__(self, o): return self._op(o, F.mul)
    def __rmul__(self, o): return self._op(o, F.mul, True)
    def __truediv__(self, o): return self._op(o, F.div)
    def __rtruediv__(self, o): return self._op(o, F.div, True)
    def __pow__(self, o): return self._op(o, _powv)
    def __rpow__(self, o): return self._op(o, _powv, True)
    def __neg__(self): return self._trace.make_float(F.neg(self._trace.scalar_var(self)))
    def __pos__(self): return self
    def __abs__(self): return self._trace.make_float(F.abs(self._trace.scalar_var(self)))

    def _cmp(self, o, fn):
        if isinstance(o, TracedFloat):
            o = self._trace.scalar_var(o)
        elif not isinstance(o, (int, float)):
            return NotImplemented
        return bool(fn(self._trace.scalar_var(self), o).data)

    def __gt__(self, o): return self._cmp(o, F.greater)
    def __ge__(self, o): return self._cmp(o, F.greater_equal)
    def __lt__(self, o): return self._cmp(o, F.less)
    def __le__(self, o): return self._cmp(o, F.less_equal)
    def __eq__(self, o): return self._cmp(o, F.equal)
    def __ne__(self, o): return self._cmp(o, F.not_equal)

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        # np.sqrt(lr), array * lr: the float as a traced 0-d value of the other
        # operands' float dtype (a Python float is weak in NumPy 2).
        arrays = [x for x in inputs if isinstance(x, np.ndarray) and x.dtype.kind == "f"]
        like = np.result_type(*arrays) if arrays else np.float64
        tr = self._trace
        ins = tuple(tr.scalar_input(x, like).data if isinstance(x, TracedFloat) else x
                    for x in inputs)
        return tr.ufunc(ufunc, method, ins, kwargs)

    # ---- everything else sees the value, behind a guard on it

    def _seen(self):
        return float(self._trace.scalar_var(self).data)   # a float guard, then the value

    def __float__(self): return self._seen()
    def __bool__(self): return bool(self._trace.scalar_var(self).data)
    def __int__(self): return int(self._seen())
    def __trunc__(self): return int(self._seen())
    def __round__(self, n=None): return round(self._seen(), n)
    def __floor__(self): return math.floor(self._seen())
    def __ceil__(self): return math.ceil(self._seen())
    def __floordiv__(self, o): return self._seen() // _value_of(o)
    def __rfloordiv__(self, o): return _value_of(o) // self._seen()
    def __mod__(self, o): return self._seen() % _value_of(o)
    def __rmod__(self, o): return _value_of(o) % self._seen()
    def __divmod__(self, o): return divmod(self._seen(), _value_of(o))
    def __rdivmod__(self, o): return divmod(_value_of(o), self._seen())
    def __hash__(self): return hash(self._seen())
    def __repr__(self): return repr(self._seen())
    def __str__(self): return str(self._seen())
    def __format__(self, spec): return format(self._seen(), spec)

    def __array__(self, dtype=None, copy=None):
        return np.asarray(self._seen(), dtype=dtype)

    def is_integer(self):
        return self._seen().is_integer()

    @property
    def real(self):
        return self

    @property
    def imag(self):
        return 0.0


def _value_of(o):
    return o._seen() if isinstance(o, TracedFloat) else o


def _powv(a, b):
    return F.PowV()(*F._as_operands(a, b))


# -------------------------------------------------------------------- the trace
