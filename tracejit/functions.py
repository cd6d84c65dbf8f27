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

import numpy as np

from tracejit.core import Config, Variable, as_array, as_variable, static_value, to_operand
# The primitives, re-exported: DeZero programs use F.Tanh, F.Sum and subclass them.
from tracejit.ops.primitive import PRIMITIVES, Elementwise, primitive  # noqa: F401
from tracejit.ops.elementwise import (  # noqa: F401
    Neg, Exp, Log, Sin, Cos, Tanh, Sqrt, Abs, Sign, Sigmoid, ReLU, LeakyReLU, Pow, Clip, Cast,
    Add, Sub, Mul, Div, PowV, Maximum, Minimum, Greater, GreaterEqual, Less, LessEqual,
    Equal, NotEqual, Where)
from tracejit.ops.arrayops import (  # noqa: F401
    Reduction, Sum, Max, Min, SumTo, Reshape, Transpose, BroadcastTo, GetItem, GetItemGrad,
    MatMul, Concat, RandomUniform, RandomSeed)
from tracejit.ops.arrayops import _normalize_axis, _resolve_reshape, _split_index, check_sum_to

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
    if isinstance(c, (int, float)) and not isinstance(c, bool):   # not a traced number
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
    shape = _shape_arg(shape, "sum_to")
    if x.shape == shape:
        return x
    check_sum_to(x.shape, shape)
    return SumTo(shape)(x)


def _shape_arg(shape, name):
    if isinstance(shape, (int, np.integer)):
        shape = (shape,)
    try:
        dims = tuple(static_value(tuple(shape)))   # int(...) as a size: its value
    except TypeError:
        dims = None
    if dims is None or not all(isinstance(d, (int, np.integer)) and
                               not isinstance(d, (bool, np.bool_)) for d in dims):
        raise TypeError(f"{name}: shape must be a tuple of ints, got {shape!r}")
    return tuple(int(d) for d in dims)


def broadcast_to(x, shape):
    x = as_variable(x)
    shape = _shape_arg(shape, "broadcast_to")
    if x.shape == shape:
        return x
    return BroadcastTo(shape)(x)


def reshape(x, shape):
    x = as_variable(x)
    shape = static_value(shape)         # int(...) as a size: its value
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


# ---------------------------------------------------------------- DeZero's *_simple functions
# The book's first versions of these functions, compositions of the primitives above
# (DeZero keeps them beside its dedicated Function classes). Their numerics are the
# book's: softmax_simple does not subtract the max, so it overflows where softmax
# does not.

def linear_simple(x, W, b=None):
    # DeZero also sets t.data = None here to free the product early; that is left out
    # because the add's backward reads its inputs' shapes.
    t = matmul(x, W)
    if b is None:
        return t
    return t + b


def sigmoid_simple(x):
    x = as_variable(x)
    return 1 / (1 + exp(-x))


def softmax_simple(x, axis=1):
    x = as_variable(x)
    y = exp(x)
    sum_y = sum(y, axis=axis, keepdims=True)
    return y / sum_y


def mean_squared_error_simple(x0, x1):
    x0, x1 = as_variable(x0), as_variable(x1)
    diff = x0 - x1
    return sum(diff ** 2) / len(diff)


def softmax_cross_entropy_simple(x, t):
    x, t = as_variable(x), as_variable(t)
    if x.ndim != 2 or t.size != x.shape[0]:
        raise ValueError(f"softmax_cross_entropy_simple: x must be (N, classes) and t "
                         f"hold N labels, got x {x.shape} and t {t.shape}")
    N = x.shape[0]
    p = softmax(x)
    p = clip(p, 1e-15, 1.0)   # log(0) would be -inf
    log_p = log(p)
    tlog_p = get_item(log_p, (np.arange(N), reshape(t, (N,))))
    return -1 * sum(tlog_p) / N


# ---------------------------------------------------------------- convolutions
# DeZero's functions module ends by importing these from functions_conv; so does this
# one (at the end: functions_conv's primitives call back into this module).
from tracejit.functions_conv import (  # noqa: E402,F401
    conv2d, deconv2d, conv2d_simple, im2col, col2im, im2col_array, col2im_array,
    pooling_simple, pooling, average_pooling, Conv2d, Deconv2d, Conv2DGradW, Pooling,
    Pooling2DGrad, Pooling2DWithIndexes, AveragePooling, Im2col, Col2im)


# ---------------------------------------------------------------- batch norm, embed_id
# Compositions of the primitives above: the gradient (through the batch mean and
# variance) is their chain rule, and under jit the normalization fuses into kernels.

def batch_norm(x, gamma, beta, mean, var, decay=0.9, eps=2e-5):
    """Batch normalization over axis 0 of a 2-D x, or axes (0, 2, 3) of an NCHW x.

    In train mode (Config.train) x is normalized with its own mean and (biased)
    variance, and the running averages `mean` and `var` (ndarrays of shape (C,)) are
    updated in place: mean = decay * mean + (1 - decay) * batch mean, and var alike
    with the unbiased batch variance (DeZero's rule). In test mode (tj.test_mode())
    they normalize x and are left unchanged."""
    x, gamma, beta = as_variable(x), as_variable(gamma), as_variable(beta)
    if x.ndim not in (2, 4):
        raise ValueError(f"batch_norm: x must be 2-D (N, C) or 4-D (N, C, H, W), got "
                         f"shape {x.shape}")
    C = x.shape[1]
    for name, a in (("gamma", gamma), ("beta", beta), ("mean", mean), ("var", var)):
        if tuple(a.shape) != (C,):
            raise ValueError(f"batch_norm: {name} must have shape ({C},) for x of shape "
                             f"{x.shape}, got {tuple(a.shape)}")
    axes = (0,) if x.ndim == 2 else (0, 2, 3)

    def per_channel(a):
        # (C,) against (N, C, H, W): a[:, None, None], a copy, where a reshape would be
        # a view of the Parameter's buffer, which the tracer refuses to read after the
        # optimizer's in-place update of that buffer (its backward is recorded later).
        a = as_variable(a)
        return a if x.ndim == 2 else get_item(a, (slice(None), None, None))
    if Config.train:
        # (`mean` is DeZero's name for the running mean argument, so no F.mean here.)
        m = x.size // C
        mu = sum(x, axis=axes, keepdims=True) / m
        xc = x - mu
        v = sum(xc * xc, axis=axes, keepdims=True) / m
        xhat = xc / sqrt(v + eps)
        adjust = m / builtins.max(m - 1.0, 1.0)     # unbiased estimate of the variance
        # In place, as DeZero: the caller's arrays (a BatchNorm layer's avg_mean.data)
        # are the running state. Under jit these writes are recorded and replayed.
        mean *= decay
        mean += (1 - decay) * reshape(mu, (C,)).data
        var *= decay
        var += (1 - decay) * adjust * reshape(v, (C,)).data
    else:
        xhat = (x - per_channel(mean)) / sqrt(per_channel(var) + eps)
    return per_channel(gamma) * xhat + per_channel(beta)


batch_nrom = batch_norm     # DeZero's name (sic)


def embed_id(x, W):
    """Rows of W picked by the integer ids x: W[x] (shape x.shape + (W.shape[1],))."""
    return get_item(as_variable(W), x)


# ---------------------------------------------------------------- DeZero's Function classes
# DeZero computes these in dedicated Functions; tracejit's functions above compose
# primitives instead (which is what jit fuses). The classes exist for programs that
# name them (F.Linear()(x, W, b), subclasses): a NumPy forward as DeZero's, and a
# backward in tracejit functions that recomputes what it needs from the inputs (never
# from self.outputs, which may be dead), so higher-order gradients work.

from tracejit.core import Function  # noqa: E402 (this section is appended)


def _call_dropping_none(fn, xs):
    # DeZero passes b=None to Linear; a None input is no input here.
    return Function.__call__(fn, *[x for x in xs if x is not None])


class Linear(Function):
    """y = x @ W (+ b)."""

    def __call__(self, x, W, b=None):
        return _call_dropping_none(self, (x, W, b))

    def forward(self, x, W, b=None):
        y = x.dot(W)
        return y if b is None else y + b

    def backward(self, gy):
        x, W, *b = self.inputs
        gx = matmul(gy, transpose(W))
        gW = matmul(transpose(x), gy)
        return (gx, gW, sum_to(gy, b[0].shape)) if b else (gx, gW)


class Softmax(Function):
    # Declared: a graph node is rebuilt from its params (a copy without axis would
    # take the default).
    params = ("axis",)

    def __init__(self, axis=1):
        self.axis = axis

    def forward(self, x):
        y = np.exp(x - x.max(axis=self.axis, keepdims=True))
        return y / y.sum(axis=self.axis, keepdims=True)

    def backward(self, gy):
        x, = self.inputs
        y = softmax(x, self.axis)
        gx = y * gy
        return gx - y * sum(gx, axis=self.axis, keepdims=True)


class LogSoftmax(Function):
    # Declared: a graph node is rebuilt from its params (a copy without axis would
    # take the default).
    params = ("axis",)

    def __init__(self, axis=1):
        self.axis = axis

    def forward(self, x):
        m = x.max(axis=self.axis, keepdims=True)
        return x - m - np.log(np.exp(x - m).sum(axis=self.axis, keepdims=True))

    def backward(self, gy):
        x, = self.inputs
        return gy - softmax(x, self.axis) * sum(gy, axis=self.axis, keepdims=True)


class MeanSquaredError(Function):
    def forward(self, x0, x1):
        diff = x0 - x1
        return (diff ** 2).sum() / len(diff)

    def backward(self, gy):
        x0, x1 = self.inputs
        diff = x0 - x1
        gx0 = gy * diff * (2.0 / len(diff))
        return gx0, -gx0


class SoftmaxCrossEntropy(Function):
    """The mean over rows of -log softmax(x)[row, t[row]]; t holds integer labels."""

    def forward(self, x, t):
        N = x.shape[0]
        m = x.max(axis=1, keepdims=True)
        log_p = x - m - np.log(np.exp(x - m).sum(axis=1, keepdims=True))
        return -log_p[np.arange(N), t.ravel()].sum() / x.dtype.type(N)

    def backward(self, gy):
        x, t = self.inputs
        N, classes = x.shape
        onehot = cast(equal(reshape(t, (N, 1)), np.arange(classes)[None, :]), x.dtype)
        return (softmax(x) - onehot) * (gy / N), None


class BatchNorm(Function):
    """DeZero's BatchNorm(mean, var, decay, eps)(x, gamma, beta): batch_norm, with
    the running averages `mean` and `var` (ndarrays) updated in place in train mode."""

    def __init__(self, mean, var, decay=0.9, eps=2e-5):
        self.avg_mean = mean
        self.avg_var = var
        self.decay = decay
        self.eps = eps

    def __call__(self, x, gamma, beta):
        # The composition, not a NumPy forward: its chain rule is the gradient, and
        # under jit the running-average updates are recorded as in-place writes.
        return batch_norm(x, gamma, beta, self.avg_mean, self.avg_var, self.decay,
                          self.eps)
