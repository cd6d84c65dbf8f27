"""tracejit.functions: the primitives and the functions users call (DeZero's functions).

Each primitive is one class holding everything every layer needs: the eager forward
on ndarrays, the backward written with these same functions on Variables (so it gives
eager, higher-order and, traced, compiled gradients), a shape rule, its kind and, for
elementwise ops, the scalar expression code generation emits ({0}, {1} are the
operands, {name} a static parameter). Backward rules never read `.data`: masks are
traced comparisons, so a compiled backward never freezes a value.

Composite functions (softmax, mean_squared_error, ...) are plain Python over primitives.
"""
import builtins
import functools

import numpy as np

from tracejit.core import (ELEMENTWISE, MATMUL, MOVEMENT, RANDOM, REDUCTION, Config, Function,
                           ShapeDtype, Variable, as_array, as_variable, to_operand)

PRIMITIVES = {}


def primitive(cls):
    """Register a Function subclass as a primitive (name -> class)."""
    PRIMITIVES[cls.__name__] = cls
    return cls


@functools.lru_cache(maxsize=None)
def _probe_dtype(cls, params, dtypes):
    # The result dtype NumPy gives for these input dtypes, found by running forward
    # on one-element arrays: the rule then matches eager exactly, int inputs included.
    fn = cls(*params)
    xs = [np.ones((1,), d) for d in dtypes]
    with np.errstate(all="ignore"):
        return np.asarray(fn.forward(*xs)).dtype


def _broadcast_shape(name, specs):
    try:
        return np.broadcast_shapes(*[s.shape for s in specs])
    except ValueError:
        shapes = " and ".join(f"x{i} has shape {s.shape}" for i, s in enumerate(specs))
        raise ValueError(f"{name}: operands cannot be broadcast together: {shapes}") from None


class Elementwise(Function):
    """Base of elementwise primitives: broadcasting shape rule, NumPy's dtype."""

    kind = ELEMENTWISE

    def shape_rule(self, *specs):
        shape = _broadcast_shape(type(self).__name__.lower(), specs)
        dtype = _probe_dtype(type(self), self.param_values(), tuple(s.dtype for s in specs))
        return ShapeDtype(shape, dtype)


def _sum_to_shape(gx, shape):
    if gx.shape != shape:
        return sum_to(gx, shape)
    return gx


# ---------------------------------------------------------------- unary elementwise

@primitive
class Neg(Elementwise):
    expr = "-{0}"

    def forward(self, x):
        return -x

    def backward(self, gy):
        return -gy


@primitive
class Exp(Elementwise):
    expr = "math.exp({0})"

    def forward(self, x):
        return np.exp(x)

    def backward(self, gy):
        return gy * self.outputs[0]()


@primitive
class Log(Elementwise):
    expr = "math.log({0})"

    def forward(self, x):
        return np.log(x)

    def backward(self, gy):
        x, = self.inputs
        return gy / x


@primitive
class Sin(Elementwise):
    expr = "math.sin({0})"

    def forward(self, x):
        return np.sin(x)

    def backward(self, gy):
        x, = self.inputs
        return gy * cos(x)


@primitive
class Cos(Elementwise):
    expr = "math.cos({0})"

    def forward(self, x):
        return np.cos(x)

    def backward(self, gy):
        x, = self.inputs
        return gy * -sin(x)


@primitive
class Tanh(Elementwise):
    expr = "math.tanh({0})"

    def forward(self, x):
        return np.tanh(x)

    def backward(self, gy):
        y = self.outputs[0]()
        return gy * (1 - y * y)


@primitive
class Sqrt(Elementwise):
    expr = "math.sqrt({0})"

    def forward(self, x):
        return np.sqrt(x)

    def backward(self, gy):
        y = self.outputs[0]()
        return gy / (2 * y)


@primitive
class Abs(Elementwise):
    expr = "abs({0})"

    def forward(self, x):
        return np.abs(x)

    def backward(self, gy):
        x, = self.inputs
        return gy * sign(x)


@primitive
class Sign(Elementwise):
    expr = "(1.0 if {0} > 0 else (-1.0 if {0} < 0 else {0} * 0.0))"

    def forward(self, x):
        return np.sign(x)

    def backward(self, gy):
        return gy * 0


@primitive
class Sigmoid(Elementwise):
    # tanh form: no overflow for large |x|, unlike 1 / (1 + exp(-x)).
    expr = "math.tanh({0} * 0.5) * 0.5 + 0.5"

    def forward(self, x):
        return np.tanh(x * 0.5) * 0.5 + 0.5

    def backward(self, gy):
        y = self.outputs[0]()
        return gy * y * (1 - y)


@primitive
class ReLU(Elementwise):
    # NaN propagates, as in np.maximum(x, 0).
    expr = "({0} if not {0} <= 0 else 0.0)"

    def forward(self, x):
        return np.maximum(x, x.dtype.type(0))

    def backward(self, gy):
        x, = self.inputs
        return gy * (x > 0)


@primitive
class LeakyReLU(Elementwise):
    params = ("slope",)
    expr = "({0} if {0} > 0 else {0} * {slope})"

    def __init__(self, slope=0.2):
        self.slope = float(slope)

    def forward(self, x):
        return np.where(x > 0, x, x * x.dtype.type(self.slope)).astype(x.dtype, copy=False)

    def backward(self, gy):
        x, = self.inputs
        return where(x > 0, gy, gy * self.slope)


@primitive
class Pow(Elementwise):
    """x ** c for a constant Python exponent c (a static parameter)."""

    params = ("c",)
    expr = "{0} ** {c}"

    def __init__(self, c):
        self.c = c

    def forward(self, x):
        return x ** self.c

    def backward(self, gy):
        x, = self.inputs
        c = self.c
        if c == 0:
            # Not c * x ** -1: that is 0 * inf = nan at x == 0 (and x ** 1 differentiated
            # twice reaches here).
            return gy * 0
        if c == 2:
            return gy * (2 * x)
        return gy * (c * x ** (c - 1))


@primitive
class Clip(Elementwise):
    params = ("x_min", "x_max")
    expr = "min(max({0}, {x_min}), {x_max})"

    def __init__(self, x_min, x_max):
        self.x_min = x_min
        self.x_max = x_max

    def forward(self, x):
        return np.clip(x, self.x_min, self.x_max)

    def backward(self, gy):
        x, = self.inputs
        return gy * ((x >= self.x_min) * (x <= self.x_max))


@primitive
class Cast(Elementwise):
    params = ("dtype",)
    expr = "{0}"

    def __init__(self, dtype):
        self.dtype = np.dtype(dtype).name

    def forward(self, x):
        return x.astype(self.dtype)

    def backward(self, gy):
        x, = self.inputs
        # A cast to an int or bool dtype is piecewise constant: no gradient flows back.
        if not (np.issubdtype(x.dtype, np.floating)
                and np.issubdtype(np.dtype(self.dtype), np.floating)):
            return None
        return cast(gy, x.dtype)


# ---------------------------------------------------------------- binary elementwise

@primitive
class Add(Elementwise):
    expr = "{0} + {1}"

    def forward(self, x0, x1):
        return x0 + x1

    def backward(self, gy):
        x0, x1 = self.inputs
        return _sum_to_shape(gy, x0.shape), _sum_to_shape(gy, x1.shape)


@primitive
class Sub(Elementwise):
    expr = "{0} - {1}"

    def forward(self, x0, x1):
        return x0 - x1

    def backward(self, gy):
        x0, x1 = self.inputs
        return _sum_to_shape(gy, x0.shape), _sum_to_shape(-gy, x1.shape)


@primitive
class Mul(Elementwise):
    expr = "{0} * {1}"

    def forward(self, x0, x1):
        return x0 * x1

    def backward(self, gy):
        x0, x1 = self.inputs
        gx0 = _sum_to_shape(gy * x1, x0.shape) if _differentiable(x0) else None
        gx1 = _sum_to_shape(gy * x0, x1.shape) if _differentiable(x1) else None
        return gx0, gx1


@primitive
class Div(Elementwise):
    expr = "{0} / {1}"

    def forward(self, x0, x1):
        return x0 / x1

    def backward(self, gy):
        x0, x1 = self.inputs
        gx0 = gy / x1
        gx1 = gy * (-x0 / x1 ** 2)
        return _sum_to_shape(gx0, x0.shape), _sum_to_shape(gx1, x1.shape)


@primitive
class PowV(Elementwise):
    """x0 ** x1 with a Variable exponent."""

    expr = "{0} ** {1}"

    def forward(self, x0, x1):
        return x0 ** x1

    def backward(self, gy):
        x0, x1 = self.inputs
        y = self.outputs[0]()
        gx0 = gy * x1 * x0 ** (x1 - 1)
        gx1 = gy * y * log(x0) if _differentiable(x1) else None
        return (_sum_to_shape(gx0, x0.shape),
                None if gx1 is None else _sum_to_shape(gx1, x1.shape))


@primitive
class Maximum(Elementwise):
    expr = "({0} if ({0} >= {1} or {0} != {0}) else {1})"

    def forward(self, x0, x1):
        return np.maximum(x0, x1)

    def backward(self, gy):
        x0, x1 = self.inputs
        mask = x0 >= x1
        return (_sum_to_shape(where(mask, gy, 0.0), x0.shape),
                _sum_to_shape(where(mask, 0.0, gy), x1.shape))


@primitive
class Minimum(Elementwise):
    expr = "({0} if ({0} <= {1} or {0} != {0}) else {1})"

    def forward(self, x0, x1):
        return np.minimum(x0, x1)

    def backward(self, gy):
        x0, x1 = self.inputs
        mask = x0 <= x1
        return (_sum_to_shape(where(mask, gy, 0.0), x0.shape),
                _sum_to_shape(where(mask, 0.0, gy), x1.shape))


class _Compare(Elementwise):
    """Comparisons give bool arrays and pass no gradient."""

    def backward(self, gy):
        return None, None


@primitive
class Greater(_Compare):
    expr = "{0} > {1}"

    def forward(self, x0, x1):
        return x0 > x1


@primitive
class GreaterEqual(_Compare):
    expr = "{0} >= {1}"

    def forward(self, x0, x1):
        return x0 >= x1


@primitive
class Less(_Compare):
    expr = "{0} < {1}"

    def forward(self, x0, x1):
        return x0 < x1


@primitive
class LessEqual(_Compare):
    expr = "{0} <= {1}"

    def forward(self, x0, x1):
        return x0 <= x1


@primitive
class Equal(_Compare):
    expr = "{0} == {1}"

    def forward(self, x0, x1):
        return x0 == x1


@primitive
class NotEqual(_Compare):
    expr = "{0} != {1}"

    def forward(self, x0, x1):
        return x0 != x1


@primitive
class Where(Elementwise):
    expr = "({1} if {0} else {2})"

    def forward(self, cond, x0, x1):
        return np.where(cond, x0, x1)

    def backward(self, gy):
        cond, x0, x1 = self.inputs
        return (None,
                _sum_to_shape(where(cond, gy, 0.0), x0.shape),
                _sum_to_shape(where(cond, 0.0, gy), x1.shape))


def _differentiable(x):
    return x.dtype.kind in "fc"


# ---------------------------------------------------------------- reductions

def _normalize_axis(axis, ndim, name):
    if axis is None:
        return None
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    out = []
    for a in axes:
        a = int(a)
        if not -ndim <= a < builtins.max(ndim, 1):
            raise ValueError(f"{name}: axis {a} is out of bounds for an array of "
                             f"dimension {ndim}")
        out.append(a % ndim if ndim else 0)
    return tuple(sorted(set(out)))


def _reduced_shape(shape, axis, keepdims):
    if axis is None:
        axis = tuple(range(len(shape)))
    if keepdims:
        return tuple(1 if i in axis else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axis)


def _keepdims_grad(gy, x_shape, axis, keepdims):
    """Reshape a reduction's gradient so that it broadcasts back to x's shape."""
    if keepdims or len(x_shape) == 0:
        return gy
    axes = tuple(range(len(x_shape))) if axis is None else axis
    shape = tuple(1 if i in axes else d for i, d in enumerate(x_shape))
    return reshape(gy, shape)


class Reduction(Function):
    kind = REDUCTION
    params = ("axis", "keepdims")

    def __init__(self, axis=None, keepdims=False):
        # axis is normalized (sorted, non-negative tuple) by the user-facing function.
        self.axis = axis
        self.keepdims = bool(keepdims)

    def shape_rule(self, x):
        shape = _reduced_shape(x.shape, self.axis, self.keepdims)
        return ShapeDtype(shape, _probe_dtype(type(self), (None, False), (x.dtype,)))


@primitive
class Sum(Reduction):
    def forward(self, x):
        return np.sum(x, axis=self.axis, keepdims=self.keepdims)

    def backward(self, gy):
        x, = self.inputs
        gy = _keepdims_grad(gy, x.shape, self.axis, self.keepdims)
        return broadcast_to(gy, x.shape)


@primitive
class Max(Reduction):
    def forward(self, x):
        return np.max(x, axis=self.axis, keepdims=self.keepdims)

    def backward(self, gy):
        x, = self.inputs
        y = self.outputs[0]()
        y = _keepdims_grad(y, x.shape, self.axis, self.keepdims)
        gy = _keepdims_grad(gy, x.shape, self.axis, self.keepdims)
        # Every element equal to the maximum gets the gradient (DeZero's rule).
        return where(equal(x, y), gy, 0.0)


@primitive
class Min(Max):
    def forward(self, x):
        return np.min(x, axis=self.axis, keepdims=self.keepdims)


@primitive
class SumTo(Function):
    """Sum a broadcast array back to `shape` (the gradient of broadcasting)."""

    kind = REDUCTION
    params = ("shape",)

    def __init__(self, shape):
        self.shape = tuple(shape)

    def forward(self, x):
        return _np_sum_to(x, self.shape)

    def backward(self, gy):
        x, = self.inputs
        return broadcast_to(gy, x.shape)

    def shape_rule(self, x):
        try:
            np.broadcast_shapes(self.shape, x.shape)
        except ValueError:
            raise ValueError(f"sum_to: cannot sum shape {x.shape} to {self.shape}") from None
        return ShapeDtype(self.shape, x.dtype)


def _np_sum_to(x, shape):
    ndim = len(shape)
    lead = x.ndim - ndim
    lead_axis = tuple(range(lead))
    axis = tuple(i + lead for i, sx in enumerate(shape) if sx == 1)
    y = x.sum(lead_axis + axis, keepdims=True)
    if lead > 0:
        y = y.squeeze(lead_axis)
    return y


# ---------------------------------------------------------------- movement

@primitive
class Reshape(Function):
    kind = MOVEMENT
    params = ("shape",)

    def __init__(self, shape):
        self.shape = tuple(int(d) for d in shape)

    def forward(self, x):
        return x.reshape(self.shape)

    def backward(self, gy):
        x, = self.inputs
        return reshape(gy, x.shape)

    def shape_rule(self, x):
        return ShapeDtype(_resolve_reshape(x.shape, self.shape), x.dtype)


def _resolve_reshape(in_shape, shape):
    size = int(np.prod(in_shape, dtype=np.int64))
    if shape.count(-1) > 1:
        raise ValueError(f"reshape: can only specify one unknown dimension, got {shape}")
    known = int(np.prod([d for d in shape if d != -1], dtype=np.int64))
    if -1 in shape:
        if known == 0 or size % known:
            raise ValueError(f"reshape: cannot reshape array of shape {in_shape} "
                             f"(size {size}) into shape {shape}")
        shape = tuple(size // known if d == -1 else d for d in shape)
    elif known != size:
        raise ValueError(f"reshape: cannot reshape array of shape {in_shape} (size {size}) "
                         f"into shape {shape} (size {known})")
    return tuple(shape)


@primitive
class Transpose(Function):
    kind = MOVEMENT
    params = ("axes",)

    def __init__(self, axes=None):
        self.axes = None if axes is None else tuple(int(a) for a in axes)

    def forward(self, x):
        return np.transpose(x, self.axes)

    def backward(self, gy):
        if self.axes is None:
            return transpose(gy)
        inv_axes = tuple(np.argsort([ax % len(self.axes) for ax in self.axes]))
        return transpose(gy, inv_axes)

    def shape_rule(self, x):
        axes = self.axes if self.axes is not None else tuple(reversed(range(x.ndim)))
        if sorted(a % builtins.max(x.ndim, 1) for a in axes) != list(range(x.ndim)):
            raise ValueError(f"transpose: axes {self.axes} do not match an array of "
                             f"shape {x.shape}")
        return ShapeDtype(tuple(x.shape[a] for a in axes), x.dtype)


@primitive
class BroadcastTo(Function):
    kind = MOVEMENT
    params = ("shape",)

    def __init__(self, shape):
        self.shape = tuple(int(d) for d in shape)

    def forward(self, x):
        # A fresh array, not a read-only view: results must be writable.
        return np.array(np.broadcast_to(x, self.shape))

    def backward(self, gy):
        x, = self.inputs
        return _sum_to_shape(gy, x.shape)

    def shape_rule(self, x):
        try:
            shape = np.broadcast_shapes(x.shape, self.shape)
        except ValueError:
            shape = None
        if shape != self.shape:
            raise ValueError(f"broadcast_to: cannot broadcast shape {x.shape} to {self.shape}")
        return ShapeDtype(self.shape, x.dtype)


class _Slice(tuple):
    """A hashable stand-in for a slice object inside a static index key."""

    def as_slice(self):
        return slice(*self)


class _ArrayIndex(int):
    """Marks the position of an index array (an input of GetItem, not a parameter)."""


def _split_index(key):
    """Split an index into a hashable template and the index arrays it uses."""
    if not isinstance(key, tuple):
        key = (key,)
    template, arrays = [], []
    for k in key:
        if isinstance(k, slice):
            template.append(_Slice((k.start, k.stop, k.step)))
        elif isinstance(k, Variable) or isinstance(k, (np.ndarray, list)):
            template.append(_ArrayIndex(len(arrays)))
            arrays.append(k if isinstance(k, Variable) else np.asarray(k))
        elif k is None or k is Ellipsis or isinstance(k, (int, np.integer)):
            template.append(int(k) if isinstance(k, np.integer) else k)
        else:
            raise TypeError(f"get_item: unsupported index {k!r}")
    return tuple(template), arrays


def _join_index(template, arrays):
    out = []
    for k in template:
        if isinstance(k, _Slice):
            out.append(k.as_slice())
        elif isinstance(k, _ArrayIndex):
            out.append(arrays[int(k)])
        else:
            out.append(k)
    return tuple(out)


@primitive
class GetItem(Function):
    """x[key]: slices and ints are the static `key`; index arrays are inputs."""

    kind = MOVEMENT
    params = ("key",)

    def __init__(self, key):
        self.key = key

    def forward(self, x, *indices):
        y = x[_join_index(self.key, indices)]
        return np.array(y) if not isinstance(y, np.ndarray) or y.base is not None else y

    def backward(self, gy):
        x, *indices = self.inputs
        gx = GetItemGrad(self.key, x.shape)(gy, *indices)
        return (gx,) + (None,) * len(indices)

    def shape_rule(self, x, *indices):
        probe = np.empty(x.shape, dtype=np.bool_)
        idx = [np.zeros(s.shape, s.dtype) for s in indices]
        try:
            shape = probe[_join_index(self.key, idx)].shape
        except IndexError as e:
            raise IndexError(f"get_item: {e} (array of shape {x.shape})") from None
        return ShapeDtype(shape, x.dtype)


@primitive
class GetItemGrad(Function):
    """Scatter-add gy into zeros of x's shape (the gradient of GetItem)."""

    kind = MOVEMENT
    params = ("key", "in_shape")

    def __init__(self, key, in_shape):
        self.key = key
        self.in_shape = tuple(in_shape)

    def forward(self, gy, *indices):
        gx = np.zeros(self.in_shape, dtype=gy.dtype)
        np.add.at(gx, _join_index(self.key, indices), gy)
        return gx

    def backward(self, ggx):
        _, *indices = self.inputs
        return (GetItem(self.key)(ggx, *indices),) + (None,) * len(indices)

    def shape_rule(self, gy, *indices):
        return ShapeDtype(self.in_shape, gy.dtype)


# ---------------------------------------------------------------- matmul

@primitive
class MatMul(Function):
    """Matrix product over the last two axes (both operands at least 2-D)."""

    kind = MATMUL
    op_name = "matmul"

    def forward(self, x, W):
        return np.matmul(x, W)

    def backward(self, gy):
        x, W = self.inputs
        gx = matmul(gy, _swap_last(W))
        gW = matmul(_swap_last(x), gy)
        return _sum_to_shape(gx, x.shape), _sum_to_shape(gW, W.shape)

    def shape_rule(self, x, W):
        if x.ndim < 1 or W.ndim < 1 or x.shape[-1] != W.shape[-2 if W.ndim > 1 else 0]:
            raise ValueError(f"matmul: shapes {x.shape} and {W.shape} are not aligned: "
                             f"x's last dimension must equal W's "
                             f"{'second-to-last' if W.ndim > 1 else 'only'} dimension")
        try:
            batch = np.broadcast_shapes(x.shape[:-2], W.shape[:-2])
        except ValueError:
            raise ValueError(f"matmul: batch dimensions of {x.shape} and {W.shape} "
                             f"do not broadcast") from None
        dtype = np.result_type(x.dtype, W.dtype)
        return ShapeDtype(batch + (x.shape[-2], W.shape[-1]), dtype)


def _swap_last(x):
    axes = list(range(x.ndim))
    axes[-1], axes[-2] = axes[-2], axes[-1]
    return transpose(x, axes)


# ---------------------------------------------------------------- random

@primitive
class RandomUniform(Function):
    """Uniform [0, 1) draws from NumPy's global stream: impure, never merged or folded."""

    kind = RANDOM
    params = ("shape",)

    def __init__(self, shape):
        self.shape = tuple(shape)

    def forward(self):
        return np.asarray(np.random.rand(*self.shape))

    def backward(self, gy):
        return ()

    def shape_rule(self):
        return ShapeDtype(self.shape, np.float64)


# ================================================================ user-facing functions

def _as_operands(x0, x1):
    if isinstance(x0, Variable):
        return x0, to_operand(x1, x0)
    if isinstance(x1, Variable):
        return to_operand(x0, x1), x1
    x0 = as_variable(x0) if isinstance(x0, np.ndarray) else x0
    x1 = as_variable(x1) if isinstance(x1, np.ndarray) else x1
    if isinstance(x0, Variable):
        return x0, to_operand(x1, x0)
    if isinstance(x1, Variable):
        return to_operand(x0, x1), x1
    raise TypeError(f"expected a Variable or ndarray operand, got {type(x0).__name__} "
                    f"and {type(x1).__name__}")


def add(x0, x1):
    return Add()(*_as_operands(x0, x1))


def sub(x0, x1):
    return Sub()(*_as_operands(x0, x1))


def rsub(x0, x1):
    return Sub()(*reversed(_as_operands(x0, x1)))


def mul(x0, x1):
    return Mul()(*_as_operands(x0, x1))


def div(x0, x1):
    return Div()(*_as_operands(x0, x1))


def rdiv(x0, x1):
    return Div()(*reversed(_as_operands(x0, x1)))


def neg(x):
    return Neg()(x)


def pow(x, c):
    if isinstance(c, (int, float)) and not hasattr(c, "_tv") and not isinstance(c, bool):
        return Pow(c)(x)
    return PowV()(*_as_operands(x, c))


def rpow(x, c):
    return PowV()(*reversed(_as_operands(x, c)))


def exp(x):
    return Exp()(x)


def log(x):
    return Log()(x)


def sin(x):
    return Sin()(x)


def cos(x):
    return Cos()(x)


def tanh(x):
    return Tanh()(x)


def sqrt(x):
    return Sqrt()(x)


def abs(x):
    return Abs()(x)


def sign(x):
    return Sign()(x)


def square(x):
    return Pow(2)(x)


def sigmoid(x):
    return Sigmoid()(x)


def relu(x):
    return ReLU()(x)


def leaky_relu(x, slope=0.2):
    return LeakyReLU(slope)(x)


def clip(x, x_min, x_max):
    return Clip(x_min, x_max)(x)


def cast(x, dtype):
    x = as_variable(x)
    if x.dtype == np.dtype(dtype):
        return x
    return Cast(dtype)(x)


def maximum(x0, x1):
    return Maximum()(*_as_operands(x0, x1))


def minimum(x0, x1):
    return Minimum()(*_as_operands(x0, x1))


def greater(x0, x1):
    return Greater()(*_as_operands(x0, x1))


def greater_equal(x0, x1):
    return GreaterEqual()(*_as_operands(x0, x1))


def less(x0, x1):
    return Less()(*_as_operands(x0, x1))


def less_equal(x0, x1):
    return LessEqual()(*_as_operands(x0, x1))


def equal(x0, x1):
    return Equal()(*_as_operands(x0, x1))


def not_equal(x0, x1):
    return NotEqual()(*_as_operands(x0, x1))


def where(condition, x0, x1):
    """np.where on Variables: gradients flow to x0 and x1, not to the condition."""
    condition = as_variable(condition)
    if not isinstance(x0, (Variable, np.ndarray)) and not isinstance(x1, (Variable, np.ndarray)):
        raise TypeError("where: at least one of x0, x1 must be a Variable or ndarray")
    if isinstance(x0, (Variable, np.ndarray)):
        x0 = as_variable(x0)
        x1 = to_operand(x1, x0)
    else:
        x1 = as_variable(x1)
        x0 = to_operand(x0, x1)
    if condition.dtype != np.bool_:
        condition = Cast("bool")(condition)
    return Where()(condition, x0, x1)


def sum(x, axis=None, keepdims=False):
    x = as_variable(x)
    return Sum(_normalize_axis(axis, x.ndim, "sum"), keepdims)(x)


def max(x, axis=None, keepdims=False):
    x = as_variable(x)
    return Max(_normalize_axis(axis, x.ndim, "max"), keepdims)(x)


def min(x, axis=None, keepdims=False):
    x = as_variable(x)
    return Min(_normalize_axis(axis, x.ndim, "min"), keepdims)(x)


def sum_to(x, shape):
    x = as_variable(x)
    shape = tuple(shape)
    if x.shape == shape:
        return x
    return SumTo(shape)(x)


def broadcast_to(x, shape):
    x = as_variable(x)
    shape = tuple(shape)
    if x.shape == shape:
        return x
    return BroadcastTo(shape)(x)


def reshape(x, shape):
    x = as_variable(x)
    if isinstance(shape, (int, np.integer)):
        shape = (shape,)
    shape = _resolve_reshape(x.shape, tuple(int(d) for d in shape))
    if x.shape == shape:
        return x
    return Reshape(shape)(x)


def transpose(x, axes=None):
    x = as_variable(x)
    if axes is not None:
        axes = tuple(int(a) % x.ndim for a in axes)
    return Transpose(axes)(x)


def expand_dims(x, axis):
    x = as_variable(x)
    shape = list(x.shape)
    shape.insert(axis if axis >= 0 else len(shape) + 1 + axis, 1)
    return reshape(x, tuple(shape))


def flatten(x):
    x = as_variable(x)
    return reshape(x, (x.shape[0], -1))


def get_item(x, slices):
    x = as_variable(x)
    template, arrays = _split_index(slices)
    return GetItem(template)(x, *arrays)


def matmul(x, W):
    x, W = as_variable(x), as_variable(W)
    if x.ndim == 1 or W.ndim == 1:
        # Vectors as 1-row / 1-column matrices, then drop the added axis (np.matmul's rule).
        xm = reshape(x, (1,) + x.shape) if x.ndim == 1 else x
        Wm = reshape(W, W.shape + (1,)) if W.ndim == 1 else W
        y = MatMul()(xm, Wm)
        shape = y.shape[:-2] + ((y.shape[-2],) if x.ndim > 1 else ()) \
            + ((y.shape[-1],) if W.ndim > 1 else ())
        return reshape(y, shape)
    return MatMul()(x, W)


dot = matmul


def linear(x, W, b=None):
    y = matmul(x, W)
    if b is None:
        return y
    return y + b


def mean(x, axis=None, keepdims=False):
    x = as_variable(x)
    y = sum(x, axis, keepdims)
    n = x.size // builtins.max(y.size, 1) if x.size else 0
    return y / (n if n else float("nan"))


def average(x, axis=None, keepdims=False):
    return mean(x, axis, keepdims)


def _stop_gradient(x):
    # A copy with no history. While tracing, x.data is the traced value, so the
    # copy is a graph value too, not a frozen constant.
    return Variable(x.data)


def softmax(x, axis=1):
    x = as_variable(x)
    m = _stop_gradient(max(x, axis=axis, keepdims=True))
    y = exp(x - m)
    return y / sum(y, axis=axis, keepdims=True)


def log_softmax(x, axis=1):
    x = as_variable(x)
    m = _stop_gradient(max(x, axis=axis, keepdims=True))
    z = x - m
    return z - log(sum(exp(z), axis=axis, keepdims=True))


def mean_squared_error(x0, x1):
    diff = sub(x0, x1)
    return sum(diff ** 2) / len(diff)


def softmax_cross_entropy(x, t):
    x = as_variable(x)
    t = as_variable(t)
    if x.ndim != 2 or t.size != x.shape[0]:
        raise ValueError(f"softmax_cross_entropy: x must be (N, classes) and t hold N "
                         f"labels, got x {x.shape} and t {t.shape}")
    N = x.shape[0]
    log_p = log_softmax(x)
    tlog_p = get_item(log_p, (np.arange(N), reshape(t, (N,))))
    return -sum(tlog_p) / N


def sigmoid_cross_entropy(x, t):
    x, t = as_variable(x), as_variable(t)
    if x.ndim != t.ndim:
        t = reshape(t, x.shape)
    N = len(x)
    p = sigmoid(x)
    p = clip(p, 1e-15, 1.0)
    tlog_p = t * log(p) + (1 - t) * log(1 - p)
    return -1 * sum(tlog_p) / N


def binary_cross_entropy(p, t):
    p, t = as_variable(p), as_variable(t)
    if p.ndim != t.ndim:
        t = reshape(t, p.shape)
    N = len(t)
    p = clip(p, 1e-15, 0.999)
    tlog_p = t * log(p) + (1 - t) * log(1 - p)
    return -1 * sum(tlog_p) / N


def accuracy(y, t):
    """Fraction of rows whose argmax equals the label (not differentiable)."""
    y, t = as_variable(y), as_variable(t)
    pred = y.data.argmax(axis=1).reshape(t.shape)
    result = (pred == t.data).mean()
    # as_array, not np.asarray: under jit `result` is traced data, which np.asarray
    # would strip of its tracking.
    return Variable(as_array(result))


def random_uniform(shape):
    return RandomUniform(shape)()


def dropout(x, dropout_ratio=0.5):
    x = as_variable(x)
    if Config.train:
        mask = random_uniform(x.shape) > dropout_ratio
        scale = 1.0 - dropout_ratio
        return x * mask / scale
    return x


# ---------------------------------------------------------------- Variable operators

def _setup_variable():
    V = Variable
    V.__add__ = add
    V.__radd__ = add
    V.__sub__ = sub
    V.__rsub__ = rsub
    V.__mul__ = mul
    V.__rmul__ = mul
    V.__truediv__ = div
    V.__rtruediv__ = rdiv
    V.__neg__ = neg
    V.__pow__ = pow
    V.__rpow__ = rpow
    V.__gt__ = greater
    V.__ge__ = greater_equal
    V.__lt__ = less
    V.__le__ = less_equal
    V.__abs__ = abs
    V.__getitem__ = get_item
    V.__matmul__ = matmul
    V.__rmatmul__ = lambda x, y: matmul(y, x)


_setup_variable()
