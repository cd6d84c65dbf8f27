"""Tracer values: what the user's function holds while it is traced.

TracedArray is a view of real data (an argument, a Variable's .data, a closure array)
that reports NumPy ufuncs and functions applied to it, and Python's looks at it
(bool: guards), to its Trace. TracedScalar (TracedFloat, TracedInt, TracedBool) is a
Python number: a float argument, or float()/int()/.item() of traced data, whose
arithmetic and comparisons are recorded, so a new value does not retrace. Both carry
real values, so the traced call computes its real result.
"""
import builtins
import math
import operator
import sys

import numpy as np

from tracejit import core
from tracejit import functions as F
from tracejit.core import ScalarTracer

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
        if self._trace is not None and self.ndim == 0 and isinstance(obj, TracedArray):
            # NumPy's C code made a 0-d array from traced data for the user's code (not
            # tracejit's): np.float32(x.data.mean()) casts through one and hands out a
            # plain scalar the tracer never sees again. (A derived array of ndim > 0,
            # x.data.ravel(), is an escape where it is used: it has no IR value.)
            _leak(obj, "a NumPy scalar made from traced data by NumPy itself "
                       "(np.float32(...), np.int64(...))")

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        return self._trace.ufunc(ufunc, method, inputs, kwargs)

    def __array_function__(self, func, types, args, kwargs):
        return self._trace.array_function(func, args, kwargs)

    def __bool__(self):
        return self._trace.guard(self, "bool")

    # float() and int() must give real numbers: inside the jitted function itself they
    # are intercepted (tracing.symbolic_scalars) and give TracedScalars; elsewhere
    # (a helper it calls, math.*) the number is guarded by value.
    def __float__(self):
        return self._trace.guard(self, "float")

    def __int__(self):
        return self._trace.guard(self, "int")

    def __index__(self):
        return self._trace.guard(self, "index")

    def item(self, *args):
        if args:
            return self[args].item() if len(args) > 1 else self.reshape(-1)[args[0]].item()
        kind = self.dtype.kind
        return self._trace.to_scalar(self, float if kind == "f" else bool if kind == "b"
                                     else int if kind in "iu" else None)

    # math.floor/ceil/trunc of a 0-d array convert it with float() (NumPy defines no
    # __floor__): here float() to a traced number, whose rounding is recorded.
    def __floor__(self): return math.floor(self._as_float())
    def __ceil__(self): return math.ceil(self._as_float())

    def __trunc__(self):
        # Only a float64 NumPy scalar (a float) has math.trunc in eager: the others, and
        # arrays, raise its TypeError.
        if not self._numpy_scalar or self.dtype != np.float64:
            t = np.ndarray if not self._numpy_scalar else type(self.view(np.ndarray)[()])
            raise TypeError(f"type {t.__module__}.{t.__name__} doesn't define __trunc__ "
                            f"method")
        return math.trunc(self._as_float())

    def _as_float(self):
        if self.ndim == 0 and self.dtype.kind in "biuf":
            return self._trace.to_scalar(self, float)
        return self.__float__()          # NumPy's own error, or a guard by value

    def __round__(self, ndigits=None):
        # Eager's value here is a NumPy scalar (x.data.sum()), whose round() gives an
        # int; an ndarray has no round() (TypeError, as eager's).
        if not self._numpy_scalar:
            raise TypeError("type numpy.ndarray doesn't define __round__ method")
        kind = self.dtype.kind
        if ndigits is None and kind in "fiu":
            return round(self._trace.to_scalar(self, float if kind == "f" else int))
        if kind == "b" or kind not in "fiu":
            t = type(self.view(np.ndarray)[()])
            raise TypeError(f"type {t.__module__}.{t.__name__} doesn't define __round__ "
                            f"method")
        # A NumPy scalar's round(s, n) is np.round(s, n): NumPy's scaled rounding in the
        # scalar's dtype (round(np.float64(2.675), 2) is 2.68, where Python gives 2.67),
        # wrapping as NumPy wraps (round(np.uint8(255), -1) is 4). Recorded as that call.
        return np.round(self, ndigits)

    # ndarray.round and .clip run NumPy's C code, which writes into a plain array of
    # its own with out= where the tracer cannot follow it (x.data.round(1) gave x * 10):
    # as the np.round / np.clip calls they are, recorded.
    def round(self, decimals=0, out=None):
        return np.round(self, decimals, out=out) if out is not None else \
            np.round(self, decimals)

    def clip(self, *args, **kwargs):
        return np.clip(self, *args, **kwargs)

    def tolist(self):
        self._trace.escape(".tolist() of traced data")
        return self.view(np.ndarray).tolist()

    def __setitem__(self, key, value):
        tr = self._trace
        if tr is None or tr is not core._state.trace or getattr(tr, "abstract", False) \
                or is_internal(sys._getframe(1)):
            # Another thread's or a finished trace's data, or tracejit's own code (a
            # DeZero utility called on .data) writing it: not followed.
            if tr is not None:
                tr.escape("item assignment into traced data")
            value = value.view(np.ndarray) if isinstance(value, np.ndarray) else value
            self.view(np.ndarray)[key] = value
            return
        tr.assign_item(self, key, value)

    def __getitem__(self, key):
        key = core.static_value(key, "an index")   # x[int(...)]: NumPy's scalar, as eager
        y = self._trace.record_data_op(F.get_item, self, key)
        k = key if isinstance(key, tuple) else (key,)
        if isinstance(y, TracedArray) and y.ndim == 0 and \
                all(isinstance(i, (int, np.integer)) and not isinstance(i, bool) for i in k):
            y._numpy_scalar = True        # a[0, 1] is a NumPy scalar in eager
        return y

    def _scalar_kept(self, y):
        """A NumPy scalar's .T, .reshape(()), .astype(), .squeeze() is a NumPy scalar
        in eager (np.float64(2).T is a float64, not a 0-d array): so is y."""
        if self._numpy_scalar and isinstance(y, TracedArray) and y.ndim == 0:
            y._numpy_scalar = self._numpy_scalar
        return y

    def reshape(self, *shape):
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = shape[0]
        return self._scalar_kept(self._trace.record_data_op(F.reshape, self, shape))

    def transpose(self, *axes):
        axes = axes[0] if len(axes) == 1 and isinstance(axes[0], (tuple, list)) else axes
        return self._scalar_kept(self._trace.record_data_op(F.transpose, self,
                                                            axes or None))

    def squeeze(self, *args, **kwargs):
        return self._scalar_kept(np.squeeze(self, *args, **kwargs))

    @property
    def T(self):
        return self.transpose()

    def astype(self, dtype, **kwargs):
        return self._scalar_kept(self._trace.record_data_op(F.cast, self, dtype))

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

    # Ways the user's code (or a library it calls) can read traced data's buffer as a
    # plain array: its values would be frozen into the graph (a branch on them is
    # never guarded), so each is an escape. tracejit's own code uses them freely.

    def __copy__(self):
        return self.copy()            # copy.copy(a) is a.copy() in NumPy: recorded

    def __deepcopy__(self, memo):
        if self.dtype.kind not in "biuf":
            _leak(self, "copy.deepcopy of traced data of dtype " + str(self.dtype))
            return np.ndarray.__deepcopy__(self, memo)
        return self.copy()

    def view(self, *args, **kwargs):
        _leak(self, "a .view() of traced data")
        return np.ndarray.view(self, *args, **kwargs)

    def __array__(self, *args, **kwargs):
        _leak(self, "__array__() of traced data")
        return np.ndarray.__array__(np.ndarray.view(self, np.ndarray), *args, **kwargs)

    def tobytes(self, *args, **kwargs):
        _leak(self, ".tobytes() of traced data")
        return np.ndarray.tobytes(self, *args, **kwargs)

    def tofile(self, *args, **kwargs):
        _leak(self, ".tofile() of traced data")
        return np.ndarray.tofile(self, *args, **kwargs)

    def __dlpack__(self, *args, **kwargs):
        _leak(self, "__dlpack__ of traced data")
        return np.ndarray.__dlpack__(self, *args, **kwargs)


def _leaking_property(name, what):
    getter = getattr(np.ndarray, name).__get__

    def get(self):
        _leak(self, what)
        return getter(self)
    return property(get)


for _name, _what in (("base", ".base of traced data (its buffer)"),
                     ("data", ".data (the buffer) of traced data"),
                     ("ctypes", ".ctypes of traced data"),
                     ("flat", ".flat of traced data"),
                     ("__array_interface__", "__array_interface__ of traced data"),
                     ("__array_struct__", "__array_struct__ of traced data")):
    setattr(TracedArray, _name, _leaking_property(_name, _what))


def _in_place_method(name):
    method = getattr(np.ndarray, name)

    def run(self, *args, **kwargs):
        if name != "byteswap" or kwargs.get("inplace", args[0] if args else False):
            _leak(self, f".{name}() of traced data (in place)")
        return method(self, *args, **kwargs)
    run.__name__ = name
    return run


# ndarray methods whose C code writes the buffer itself, with no ufunc the tracer sees
# (`e.fill(2.0)`, `e.sort()` of a traced value left the graph's value as it was): each
# is an escape.
for _name in ("fill", "sort", "partition", "put", "resize", "setfield", "byteswap"):
    setattr(TracedArray, _name, _in_place_method(_name))


def _as_numpy_function(name):
    function = getattr(np, name)

    def run(self, *args, **kwargs):
        return function(self, *args, **kwargs)
    run.__name__ = name
    return run


# ndarray methods that are NumPy functions of the array (d.cumsum(0) is np.cumsum(d,
# 0)), whose C code skips __array_function__ and made an untracked array (an escape
# where it was used): as the function, which is recorded.
for _name in ("cumsum", "cumprod", "dot", "argsort", "repeat", "ravel",
              "swapaxes", "diagonal", "take", "searchsorted", "trace",
              "nonzero"):
    setattr(TracedArray, _name, _as_numpy_function(_name))


def _flatten(self, order="C"):
    return np.ravel(self, order).copy()     # a copy, as ndarray.flatten's


TracedArray.flatten = _flatten


def is_internal(frame):
    """Is this frame tracejit's own code (which reads traced buffers knowingly)?"""
    name = frame.f_globals.get("__name__", "")
    return name == "tracejit" or name.startswith("tracejit.")


def _leak(a, what, depth=1):
    """Traced data a read as a plain buffer by the code `depth` frames above the
    caller: an escape, unless that code is tracejit's or a is not this trace's."""
    tr = a._trace
    if tr is None or tr is not core._state.trace or getattr(tr, "abstract", False):
        return
    if not is_internal(sys._getframe(depth + 1)):
        tr.escape(what)


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


class TracedScalar(ScalarTracer):
    """A Python number the traced function holds: a float argument, or what `float()`,
    `int()` and `.item()` gave for traced data, and what arithmetic and comparisons on
    those gave. Recorded like arrays, so a new value does not retrace.

    Not a float/int subclass on purpose: math.sqrt, round, str() and hash() then go
    through __float__ (or the methods below), which guard the value (Trace.freeze), so
    a use the tracer cannot record retraces on a new value instead of freezing it.
    Each operation first computes what Python gives (raising what Python raises), then
    records the graph op, which must reproduce it; a comparison gives a TracedBool
    whose truth (`if`, `and`, `not`) is one guard on the outcome.
    """

    __slots__ = ("_value", "_tv", "_trace")
    pytype = float

    def __new__(cls, value=0, tv=None, trace=None):
        if trace is None:
            # Made by the user's code, not a trace (`type(m)(total)` in a library such
            # as statistics, where type() is not redirected): the plain number, as eager.
            return cls.pytype(value)
        return super().__new__(cls)

    def __init__(self, value, tv=None, trace=None):
        self._value = self.pytype(value)
        self._tv = tv
        self._trace = trace

    @property
    def dtype(self):
        return _PY_DTYPES[self.pytype]

    # ---- recorded arithmetic and comparisons

    def _bin(self, other, name, reverse=False):
        if not is_python_number(other):
            return NotImplemented     # Variables and arrays take it from here
        tr = self._trace
        if tr is None or tr is not core._state.trace:
            # Kept past its trace (stored on an object), or seen by another thread's
            # trace: the plain number it was.
            a, b = (other, self._value) if reverse else (self._value, other)
            return _PY_OPS[name](python_value(a), python_value(b))
        if isinstance(other, TracedScalar) and other._trace is not tr:
            other = other._value
        a, b = (other, self) if reverse else (self, other)
        return tr.scalar_binary(name, a, b)

    def __add__(self, o): return self._bin(o, "add")
    def __radd__(self, o): return self._bin(o, "add", True)
    def __sub__(self, o): return self._bin(o, "sub")
    def __rsub__(self, o): return self._bin(o, "sub", True)
    def __mul__(self, o): return self._bin(o, "mul")
    def __rmul__(self, o): return self._bin(o, "mul", True)
    def __truediv__(self, o): return self._bin(o, "truediv")
    def __rtruediv__(self, o): return self._bin(o, "truediv", True)
    def __floordiv__(self, o): return self._bin(o, "floordiv")
    def __rfloordiv__(self, o): return self._bin(o, "floordiv", True)
    def __mod__(self, o): return self._bin(o, "mod")
    def __rmod__(self, o): return self._bin(o, "mod", True)
    def __pow__(self, o, mod=None):
        return self._bin(o, "pow") if mod is None else pow(self._seen(), o, mod)
    def __rpow__(self, o): return self._bin(o, "pow", True)
    def __and__(self, o): return self._bin(o, "and")
    def __rand__(self, o): return self._bin(o, "and", True)
    def __or__(self, o): return self._bin(o, "or")
    def __ror__(self, o): return self._bin(o, "or", True)
    def __xor__(self, o): return self._bin(o, "xor")
    def __rxor__(self, o): return self._bin(o, "xor", True)
    def __gt__(self, o): return self._bin(o, "gt")
    def __ge__(self, o): return self._bin(o, "ge")
    def __lt__(self, o): return self._bin(o, "lt")
    def __le__(self, o): return self._bin(o, "le")
    def __eq__(self, o): return self._bin(o, "eq")
    def __ne__(self, o): return self._bin(o, "ne")

    def __divmod__(self, o):
        return (self // o, self % o) if is_python_number(o) else NotImplemented

    def __rdivmod__(self, o):
        return (o // self, o % self) if is_python_number(o) else NotImplemented

    def _unary(self, name):
        tr = self._trace
        if tr is None or tr is not core._state.trace:
            return _PY_UNARY[name](self._value)
        return tr.scalar_unary(name, self)

    def __neg__(self): return self._unary("neg")
    def __pos__(self): return self._unary("pos")
    def __abs__(self): return self._unary("abs")

    def __bool__(self):
        tr = self._trace
        if tr is None or tr is not core._state.trace:
            return bool(self._value)
        return tr.scalar_truth(self)

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        # np.sqrt(lr), array * lr: the number as a traced 0-d value of the other
        # operands' dtype (a Python scalar is weak in NumPy 2).
        arrays = [x for x in inputs if isinstance(x, (np.ndarray, np.generic))]
        like = np.result_type(*arrays) if arrays else None
        tr = self._trace
        ins = tuple(tr.scalar_input(x, like).data if isinstance(x, TracedScalar) else x
                    for x in inputs)
        return tr.ufunc(ufunc, method, ins, kwargs)

    # ---- everything else sees the value, behind a guard on it

    def _seen(self, what="a use the tracer cannot follow"):
        tr = self._trace
        if tr is None or tr is not core._state.trace:
            return self._value
        return tr.freeze(self, what)

    def __float__(self): return float(self._seen("float() by a C function (math.*)"))
    def __int__(self): return int(self._seen("int() by a C function"))
    # round(), math.floor/ceil/trunc give ints recorded like int()'s (not the value
    # behind a guard: `range(math.floor(v))` would retrace for every v).
    def __trunc__(self): return self._rounded("trunc")
    def __round__(self, n=None): return self._rounded("round", n)
    def __floor__(self): return self._rounded("floor")
    def __ceil__(self): return self._rounded("ceil")

    def _rounded(self, name, ndigits=None):
        tr = self._trace
        if tr is None or tr is not core._state.trace:
            return python_rounding(name, self._value, ndigits)
        return tr.scalar_rounding(name, self, ndigits)

    def __hash__(self): return hash(self._seen("hash() (a dict key or set member)"))
    def __repr__(self): return repr(self._seen("repr()"))
    def __str__(self): return str(self._seen("str()"))
    def __format__(self, spec): return format(self._seen("string formatting"), spec)
    def __complex__(self): return complex(self._seen("complex()"))

    def __array__(self, dtype=None, copy=None):
        return np.asarray(self._seen("conversion to an array (np.asarray)"), dtype=dtype)

    def is_integer(self):
        return float(self._seen("is_integer()")).is_integer()

    # The rest of float's and int's methods: what the value's own method gives, behind
    # a guard on the value (statistics, fractions and the user call them by name).
    def as_integer_ratio(self):
        return self._seen("as_integer_ratio()").as_integer_ratio()

    def __copy__(self):
        return self          # a number: copy.copy(5.0) is 5.0 itself

    def __deepcopy__(self, memo):
        return self

    def __reduce__(self):
        # Pickled as the plain number it is (never the trace it belongs to).
        return (self.pytype, (self._seen("pickling"),))

    def conjugate(self):
        return self

    @property
    def real(self):
        return self

    @property
    def imag(self):
        return self.pytype(0)


class TracedFloat(TracedScalar):
    """A Python float: a float argument, float(traced), or arithmetic giving a float."""

    __slots__ = ()
    pytype = float

    def hex(self):
        return self._seen("hex()").hex()


class TracedInt(TracedScalar):
    """A Python int: int(traced), .item() of integer data, arithmetic giving an int."""

    __slots__ = ()
    pytype = int

    def __index__(self):
        # A trip count (range), an index or a shape: the value shapes the graph.
        return int(self._seen("use as an index, shape or trip count"))

    def __invert__(self):
        return self._unary("invert")

    def __lshift__(self, o): return int(self) << o
    def __rshift__(self, o): return int(self) >> o
    def __rlshift__(self, o): return o << int(self)
    def __rrshift__(self, o): return o >> int(self)

    def bit_length(self):
        return self._seen("bit_length()").bit_length()

    def bit_count(self):
        return int(self._seen("bit_count()")).bit_count()

    def to_bytes(self, *args, **kwargs):
        return self._seen("to_bytes()").to_bytes(*args, **kwargs)

    @property
    def numerator(self):
        return self

    @property
    def denominator(self):
        return 1


class TracedBool(TracedInt):
    """A Python bool: a comparison of Python numbers, or .item() of bool data."""

    __slots__ = ()
    pytype = bool


_PY_DTYPES = {float: np.dtype(np.float64), int: np.dtype(np.int64), bool: np.dtype(bool)}
_PY_OPS = {"add": operator.add, "sub": operator.sub, "mul": operator.mul,
           "truediv": operator.truediv, "floordiv": operator.floordiv, "mod": operator.mod,
           "pow": operator.pow, "and": operator.and_, "or": operator.or_,
           "xor": operator.xor, "gt": operator.gt, "ge": operator.ge, "lt": operator.lt,
           "le": operator.le, "eq": operator.eq, "ne": operator.ne}
_PY_UNARY = {"neg": operator.neg, "pos": operator.pos, "abs": builtins.abs,
             "invert": operator.invert}
SCALAR_TYPES = {float: TracedFloat, int: TracedInt, bool: TracedBool}


def python_rounding(name, value, ndigits=None):
    """What round(value[, ndigits]), math.floor/ceil/trunc(value) give in Python."""
    if name == "round":
        return round(value) if ndigits is None else round(value, ndigits)
    return getattr(math, name)(value)


def python_round_to(x, ndigits):
    """Python's round(float, ndigits) of a 0-d array: the exact decimal rounding (a
    NumpyCall replays it on each call's value)."""
    return np.float64(round(float(x), ndigits))


def is_python_number(x):
    return type(x) in (bool, int, float) or isinstance(x, TracedScalar)


def python_value(x):
    return x._value if isinstance(x, TracedScalar) else x


# -------------------------------------------------------------------- the trace
