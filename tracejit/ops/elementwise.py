"""Elementwise primitives: unary math, binary arithmetic, comparisons, where, cast.

Each class is one primitive: forward on ndarrays, backward on Variables (through
tracejit.functions, imported as F so the backward traces), and `expr`, the scalar
expression a fused kernel evaluates ({0}, {1} the operands, {name} a parameter).
"""
import numpy as np

from tracejit import functions as F
from tracejit.ops.primitive import (KERNEL_FLOATS, Elementwise, differentiable, primitive,
                                    sum_to_shape)

# ---------------------------------------------------------------- unary elementwise

@primitive
class Neg(Elementwise):
    expr = "-{0}"
    onnx_op = "Neg"

    def forward(self, x):
        return -x

    def backward(self, gy):
        return -gy


@primitive
class Exp(Elementwise):
    expr = "math.exp({0})"
    onnx_op = "Exp"
    vector_math = True

    def forward(self, x):
        return np.exp(x)

    def backward(self, gy):
        return gy * self.outputs[0]()


@primitive
class Log(Elementwise):
    expr = "math.log({0})"
    onnx_op = "Log"
    vector_math = True

    def forward(self, x):
        return np.log(x)

    def backward(self, gy):
        x, = self.inputs
        return gy / x


@primitive
class Sin(Elementwise):
    expr = "math.sin({0})"
    onnx_op = "Sin"
    vector_math = True
    checks_trig_range = True

    def forward(self, x):
        return np.sin(x)

    def backward(self, gy):
        x, = self.inputs
        return gy * F.cos(x)


@primitive
class Cos(Elementwise):
    expr = "math.cos({0})"
    onnx_op = "Cos"
    vector_math = True
    checks_trig_range = True

    def forward(self, x):
        return np.cos(x)

    def backward(self, gy):
        x, = self.inputs
        return gy * -F.sin(x)


@primitive
class Tanh(Elementwise):
    expr = "math.tanh({0})"
    onnx_op = "Tanh"
    vector_math = True

    def forward(self, x):
        return np.tanh(x)

    def backward(self, gy):
        y = self.outputs[0]()
        return gy * (1 - y * y)


@primitive
class Sqrt(Elementwise):
    expr = "math.sqrt({0})"
    onnx_op = "Sqrt"

    def forward(self, x):
        return np.sqrt(x)

    def backward(self, gy):
        y = self.outputs[0]()
        return gy / (2 * y)


@primitive
class Abs(Elementwise):
    expr = "abs({0})"
    onnx_op = "Abs"

    def forward(self, x):
        return np.abs(x)

    def backward(self, gy):
        x, = self.inputs
        return gy * F.sign(x)


@primitive
class Sign(Elementwise):
    # np.sign: nan for nan, +0.0 for both zeros (x * 0.0 gave -0.0, and 1 / that -inf).
    expr = "(1.0 if {0} > 0 else (-1.0 if {0} < 0 else ({0} if {0} != {0} else 0.0)))"
    onnx_op = "Sign"

    def forward(self, x):
        return np.sign(x)

    def backward(self, gy):
        return gy * 0


@primitive
class Sigmoid(Elementwise):
    # tanh form: no overflow for large |x|, unlike 1 / (1 + F.exp(-x)).
    expr = "math.tanh({0} * 0.5) * 0.5 + 0.5"
    onnx_op = "Sigmoid"
    vector_math = True

    def forward(self, x):
        return np.tanh(x * 0.5) * 0.5 + 0.5

    def backward(self, gy):
        y = self.outputs[0]()
        return gy * y * (1 - y)


@primitive
class ReLU(Elementwise):
    # NaN propagates, as in np.maximum(x, 0).
    expr = "({0} if not {0} <= 0 else 0.0)"
    onnx_op = "Relu"

    def forward(self, x):
        return np.maximum(x, x.dtype.type(0))

    def backward(self, gy):
        x, = self.inputs
        return gy * (x > 0)

    def epilogue_part(self, node):
        return ("relu", None)


@primitive
class LeakyReLU(Elementwise):
    params = ("slope",)
    expr = "({0} if {0} > 0 else {0} * {slope})"

    def __init__(self, slope=0.2):
        self.slope = float(slope)

    def forward(self, x):
        return np.where(x > 0, x, x * x.dtype.type(self.slope)).astype(x.dtype, copy=False)

    def to_onnx(self, b, node):
        # As a where: ONNX's LeakyRelu has no float64 kernel in ONNX Runtime.
        dt = node.out.dtype
        x = b.x(node, 0, dt)
        pos = b.op("Greater", [x, b.const(np.zeros((), dt))])
        b.bind(node, b.op("Where", [pos, x, b.op("Mul", [x, b.const(np.array(self.slope,
                                                                             dt))])]))

    def backward(self, gy):
        x, = self.inputs
        return F.where(x > 0, gy, gy * self.slope)


@primitive
class Pow(Elementwise):
    """x ** c for a constant Python exponent c (a static parameter)."""

    params = ("c",)
    expr = "{0} ** {c}"

    def __init__(self, c):
        self.c = c

    def forward(self, x):
        return x ** self.c

    def to_onnx(self, b, node):
        dt = node.out.dtype
        b.bind(node, b.op("Pow", [b.x(node, 0, dt), b.const(np.array(self.c, dt))]))

    def cheap_to_recompute(self):
        # x ** 2 is a multiply; x ** 0.3 is libm's pow.
        return float(self.c).is_integer()

    def kernel_template(self, node):
        # The exponents with an exact cheaper form (as NumPy's own fast paths).
        c = self.c
        if c == 2:
            return "({0} * {0})", {}
        if c == 1:
            return "({0})", {}
        if c == 0.5:
            return "math.sqrt({0})", {}
        if c == -1:
            return "(1.0 / {0})", {}
        return "({0} ** {c})", {"c": float(c)}

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
    # NumPy's clip propagates NaN; min(max(nan, lo), hi) alone would give lo.
    expr = "({0} if {0} != {0} else min(max({0}, {x_min}), {x_max}))"

    def __init__(self, x_min, x_max):
        self.x_min = x_min
        self.x_max = x_max

    def forward(self, x):
        return np.clip(x, self.x_min, self.x_max)

    def to_onnx(self, b, node):
        dt = node.out.dtype
        bounds = ["" if c is None else b.const(np.array(c, dt))
                  for c in (self.x_min, self.x_max)]
        b.bind(node, b.op("Clip", [b.x(node, 0, dt)] + bounds))

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

    def to_onnx(self, b, node):
        b.bind(node, b.x(node, 0, node.out.dtype))

    def fuses_for(self, in_dtypes, out_dtype):
        if out_dtype == np.bool_:
            return True
        # To float from float or bool only: int inputs stay a NumPy cast.
        return out_dtype in KERNEL_FLOATS and all(d in KERNEL_FLOATS or d == np.bool_
                                                  for d in in_dtypes)

    def kernel_template(self, node):
        out = node.out.dtype
        return ("({0} != 0)" if out == np.bool_ else f"np.{out.name}({{0}})"), {}

    def backward(self, gy):
        x, = self.inputs
        # A cast to an int or bool dtype is piecewise constant: no gradient flows back.
        if not (np.issubdtype(x.dtype, np.floating)
                and np.issubdtype(np.dtype(self.dtype), np.floating)):
            return None
        return F.cast(gy, x.dtype)


# ---------------------------------------------------------------- binary elementwise

@primitive
class Add(Elementwise):
    expr = "{0} + {1}"
    onnx_op = "Add"
    sums_operands = True

    def forward(self, x0, x1):
        return x0 + x1

    def epilogue_part(self, node):
        return ("add", None)

    def backward(self, gy):
        x0, x1 = self.inputs
        return sum_to_shape(gy, x0.shape), sum_to_shape(gy, x1.shape)


@primitive
class Sub(Elementwise):
    expr = "{0} - {1}"
    onnx_op = "Sub"

    def forward(self, x0, x1):
        return x0 - x1

    def backward(self, gy):
        x0, x1 = self.inputs
        return sum_to_shape(gy, x0.shape), sum_to_shape(-gy, x1.shape)


@primitive
class Mul(Elementwise):
    expr = "{0} * {1}"
    onnx_op = "Mul"

    def forward(self, x0, x1):
        return x0 * x1

    def epilogue_part(self, node):
        return ("mul", None)

    def backward(self, gy):
        x0, x1 = self.inputs
        gx0 = sum_to_shape(gy * x1, x0.shape) if differentiable(x0) else None
        gx1 = sum_to_shape(gy * x0, x1.shape) if differentiable(x1) else None
        return gx0, gx1


@primitive
class Div(Elementwise):
    expr = "{0} / {1}"
    onnx_op = "Div"

    def forward(self, x0, x1):
        return x0 / x1

    def backward(self, gy):
        x0, x1 = self.inputs
        gx0 = gy / x1
        gx1 = gy * (-x0 / x1 ** 2)
        return sum_to_shape(gx0, x0.shape), sum_to_shape(gx1, x1.shape)


@primitive
class PowV(Elementwise):
    """x0 ** x1 with a Variable exponent."""

    expr = "{0} ** {1}"
    onnx_op = "Pow"

    def forward(self, x0, x1):
        return x0 ** x1

    def cheap_to_recompute(self):
        return False           # libm's pow

    def kernel_template(self, node):
        if all(d == 1 for d in node.inputs[1].shape):
            # NumPy's power with a one-element exponent of 0.5 is sqrt (its scalar fast
            # path): (-inf) ** 0.5 is nan there, inf from C's pow, and -0.0 keeps its sign.
            return "(math.sqrt({0}) if {1} == 0.5 else {0} ** {1})", {}
        return self.expr, {}

    def backward(self, gy):
        x0, x1 = self.inputs
        y = self.outputs[0]()
        gx0 = gy * x1 * x0 ** (x1 - 1)
        gx1 = gy * y * F.log(x0) if differentiable(x1) else None
        return (sum_to_shape(gx0, x0.shape),
                None if gx1 is None else sum_to_shape(gx1, x1.shape))


@primitive
class Maximum(Elementwise):
    # Ties give x1, as np.maximum does: maximum(-0.0, 0.0) is 0.0, maximum(0.0, -0.0) -0.0.
    expr = "({0} if ({0} > {1} or {0} != {0}) else {1})"
    onnx_op = "Max"

    def forward(self, x0, x1):
        return np.maximum(x0, x1)

    def backward(self, gy):
        x0, x1 = self.inputs
        mask = x0 >= x1
        return (sum_to_shape(F.where(mask, gy, 0.0), x0.shape),
                sum_to_shape(F.where(mask, 0.0, gy), x1.shape))


@primitive
class Minimum(Elementwise):
    # Ties give x1, as np.minimum does (the sign of a zero result).
    expr = "({0} if ({0} < {1} or {0} != {0}) else {1})"
    onnx_op = "Min"

    def forward(self, x0, x1):
        return np.minimum(x0, x1)

    def backward(self, gy):
        x0, x1 = self.inputs
        mask = x0 <= x1
        return (sum_to_shape(F.where(mask, gy, 0.0), x0.shape),
                sum_to_shape(F.where(mask, 0.0, gy), x1.shape))


class _Compare(Elementwise):
    """Comparisons give bool arrays and pass no gradient."""

    def backward(self, gy):
        return None, None

    def fuses_for(self, in_dtypes, out_dtype):
        return True            # a bool result: a kernel writes it as NumPy's bool

    def to_onnx(self, b, node):
        # Compared in the dtype NumPy promotes the operands to: a literal is a weak
        # Python number (int64 t > 0.5 compares in float64, float32 x > 0.1 in float32).
        b.elementwise(node, self.onnx_op, np.result_type(
            *[v.value.item() if b.is_lit(v) else v.dtype for v in node.inputs]))


@primitive
class Greater(_Compare):
    expr = "{0} > {1}"
    onnx_op = "Greater"

    def forward(self, x0, x1):
        return x0 > x1

    def epilogue_part(self, node):
        # ReLU's mask: x > 0 against a literal zero (the IR's Lit carries a value; ops
        # sit below the IR and do not import it).
        c = getattr(node.inputs[1], "value", None)
        if c is not None and c == 0:
            return ("positive", None)
        return None


@primitive
class GreaterEqual(_Compare):
    expr = "{0} >= {1}"
    onnx_op = "GreaterOrEqual"

    def forward(self, x0, x1):
        return x0 >= x1


@primitive
class Less(_Compare):
    expr = "{0} < {1}"
    onnx_op = "Less"

    def forward(self, x0, x1):
        return x0 < x1


@primitive
class LessEqual(_Compare):
    expr = "{0} <= {1}"
    onnx_op = "LessOrEqual"

    def forward(self, x0, x1):
        return x0 <= x1


@primitive
class Equal(_Compare):
    expr = "{0} == {1}"
    onnx_op = "Equal"

    def forward(self, x0, x1):
        return x0 == x1


@primitive
class NotEqual(_Compare):
    expr = "{0} != {1}"

    def forward(self, x0, x1):
        return x0 != x1

    def to_onnx(self, b, node):
        super().to_onnx(b, node)        # Equal, then Not: ONNX has no NotEqual
        b.bind(node, b.op("Not", [b.names[id(node.out)]]))

    onnx_op = "Equal"


@primitive
class Where(Elementwise):
    expr = "({1} if {0} else {2})"

    def forward(self, cond, x0, x1):
        return np.where(cond, x0, x1)

    def to_onnx(self, b, node):
        dt = node.out.dtype
        b.bind(node, b.op("Where", [b.x(node, 0, np.bool_), b.x(node, 1, dt),
                                    b.x(node, 2, dt)]))

    def fuses_for(self, in_dtypes, out_dtype):
        if out_dtype == np.bool_:
            return all(d == np.bool_ for d in in_dtypes)
        return super().fuses_for(in_dtypes, out_dtype)

    def backward(self, gy):
        cond, x0, x1 = self.inputs
        return (None,
                sum_to_shape(F.where(cond, gy, 0.0), x0.shape),
                sum_to_shape(F.where(cond, 0.0, gy), x1.shape))
