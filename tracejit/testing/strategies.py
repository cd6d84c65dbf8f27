"""Hypothesis strategies for tracejit tests (`tracejit.testing.strategies`).

Shapes, broadcastable shape tuples, arrays whose values stay where an op is smooth
(`safe_range_for`), and `programs()`: random small differentiable programs of tracejit
ops, used to test gradients and, later, the JIT against eager.
"""
import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from tracejit import functions as F

__all__ = ["shapes", "arrays", "broadcastable_shapes", "dtypes", "safe_range_for",
           "SafeRange", "distinct_arrays", "programs", "Program", "source_programs"]


class SafeRange:
    """Values in [lo, hi] with |x| >= gap: where an op is smooth and well-conditioned."""

    def __init__(self, lo=-2.0, hi=2.0, gap=0.0):
        self.lo, self.hi, self.gap = float(lo), float(hi), float(gap)

    def elements(self):
        if self.gap > 0 and self.lo < 0 < self.hi:
            return st.one_of(st.floats(self.lo, -self.gap), st.floats(self.gap, self.hi))
        lo = max(self.lo, self.gap) if self.lo >= 0 else self.lo
        return st.floats(lo, self.hi)

    def __repr__(self):
        return f"SafeRange({self.lo}, {self.hi}, gap={self.gap})"


# Kinks at 0 (abs, sign, relu), poles at 0 (division), domains (log, sqrt), overflow
# (exp). Ties of max/min are avoided by `distinct_arrays`, not by a range.
_SAFE = {
    "Log": SafeRange(0.5, 3.0),
    "Sqrt": SafeRange(0.5, 3.0),
    "PowV": SafeRange(0.5, 2.0),         # base; the exponent uses the default range
    "Exp": SafeRange(-5.0, 5.0),
    "Abs": SafeRange(-3.0, 3.0, gap=0.1),
    "Sign": SafeRange(-3.0, 3.0, gap=0.1),
    "ReLU": SafeRange(-3.0, 3.0, gap=0.1),
    "LeakyReLU": SafeRange(-3.0, 3.0, gap=0.1),
    "Div": SafeRange(-3.0, 3.0, gap=0.5),  # denominator; the numerator uses the default
}


def safe_range_for(prim_name, arg=0):
    """The SafeRange of argument `arg` of primitive `prim_name` (a PRIMITIVES key)."""
    if prim_name == "Div" and arg == 0:
        return SafeRange()
    if prim_name == "PowV" and arg == 1:
        return SafeRange()
    return _SAFE.get(prim_name, SafeRange())


def shapes(min_dims=0, max_dims=3, min_side=1, max_side=5):
    return hnp.array_shapes(min_dims=min_dims, max_dims=max_dims, min_side=min_side,
                            max_side=max_side)


def dtypes():
    return st.sampled_from([np.dtype(np.float64), np.dtype(np.float32)])


def arrays(shape, dtype=np.float64, elements=None, safe=None):
    """Arrays of `shape` (a tuple or a strategy); elements from `elements` or a SafeRange.

    Values are drawn in float64 and cast, so float32 bounds need not be representable.
    """
    if elements is None:
        elements = (safe or SafeRange()).elements()
    dtype = np.dtype(dtype)
    base = hnp.arrays(np.float64, shape, elements=elements)
    return base.map(lambda a: a.astype(dtype))


def distinct_arrays(shape, dtype=np.float64, step=0.25, offset=0.0):
    """Arrays with pairwise distinct values on a grid (spacing `step`, shifted by offset).

    Max/min have no ties, so their gradients are defined; two arrays with offsets that
    differ by step/2 never tie elementwise (maximum/minimum, comparisons).
    """
    dtype = np.dtype(dtype)

    def build(shape_):
        size = int(np.prod(shape_, dtype=np.int64))
        ints = hnp.arrays(np.int64, (size,), elements=st.integers(-4 * size - 8, 4 * size + 8),
                          unique=True)
        return ints.map(lambda a: np.asarray(a.reshape(shape_) * step + offset, dtype=dtype))

    if isinstance(shape, tuple):
        return build(shape)
    return shape.flatmap(build)


def broadcastable_shapes(n=2, min_dims=0, max_dims=3, min_side=1, max_side=4):
    """Tuples of n shapes that broadcast together (size-1 and missing leading dims)."""
    return hnp.mutually_broadcastable_shapes(
        num_shapes=n, min_dims=min_dims, max_dims=max_dims, min_side=min_side,
        max_side=max_side).map(lambda b: tuple(b.input_shapes))


# ---------------------------------------------------------------- random programs

# Unary ops that are smooth everywhere and keep values bounded or tame. Guarded forms
# (log(x*x+1), sqrt(x*x+1), exp(tanh(x))) stay inside their domains for any input.
_UNARY = {
    "tanh": lambda a: F.tanh(a),
    "sin": lambda a: F.sin(a),
    "cos": lambda a: F.cos(a),
    "sigmoid": lambda a: F.sigmoid(a),
    "neg": lambda a: -a,
    "scale": lambda a: a * 0.5,
    "square": lambda a: a ** 2,
    "exp_tanh": lambda a: F.exp(F.tanh(a)),
    "log_1p_sq": lambda a: F.log(a * a + 1),
    "sqrt_1p_sq": lambda a: F.sqrt(a * a + 1),
    "rsub": lambda a: 1.0 - a,
}

_BINARY = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "div_1p_sq": lambda a, b: a / (b * b + 1),
    "tanh_mul": lambda a, b: F.tanh(a * b),
}


class Program:
    """A straight-line program of tracejit ops; calling it replays the ops.

    `steps` is a list of (op, operand indices, static arguments); value k is input k
    for k < n_inputs, else the result of step k - n_inputs. The result is the last value.
    """

    def __init__(self, n_inputs, steps):
        self.n_inputs = n_inputs
        self.steps = steps
        self.__name__ = "program"

    def __call__(self, *xs):
        vals = list(xs)
        for op, operands, static in self.steps:
            args = [vals[k] for k in operands]
            vals.append(_apply(op, args, static))
        return vals[-1]

    def __repr__(self):
        names = [f"x{k}" for k in range(self.n_inputs)]
        lines = [f"def program({', '.join(names)}):"]
        for j, (op, operands, static) in enumerate(self.steps):
            name = f"t{j}"
            extra = f", {static!r}" if static is not None else ""
            lines.append(f"    {name} = {op}({', '.join(names[k] for k in operands)}{extra})")
            names.append(name)
        lines.append(f"    return {names[-1]}")
        return "\n".join(lines)


def _apply(op, args, static):
    if op in _UNARY:
        return _UNARY[op](*args)
    if op in _BINARY:
        return _BINARY[op](*args)
    a = args[0]
    if op == "sum":
        axis, keepdims = static
        return F.sum(a, axis=axis, keepdims=keepdims)
    if op == "mean":
        axis, keepdims = static
        return F.mean(a, axis=axis, keepdims=keepdims)
    if op == "reshape":
        return F.reshape(a, static)
    if op == "transpose":
        return F.transpose(a, static)
    if op == "matmul":
        return F.matmul(a, args[1])
    if op == "matmul_t":
        return F.matmul(a, F.transpose(args[1]))
    raise ValueError(f"unknown program op {op}")


def _broadcasts(s0, s1):
    try:
        np.broadcast_shapes(s0, s1)
        return True
    except ValueError:
        return False


# How an op scales a bound on |value|, so programs() can refuse ops that would blow up.
_UNARY_BOUND = {
    "tanh": lambda b: 1.0, "sin": lambda b: 1.0, "cos": lambda b: 1.0,
    "sigmoid": lambda b: 1.0, "neg": lambda b: b, "scale": lambda b: b / 2,
    "square": lambda b: b * b, "exp_tanh": lambda b: np.e,
    "log_1p_sq": lambda b: np.log1p(b * b), "sqrt_1p_sq": lambda b: np.sqrt(b * b + 1),
    "rsub": lambda b: b + 1,
}
_BINARY_BOUND = {
    "add": lambda a, b: a + b, "sub": lambda a, b: a + b, "mul": lambda a, b: a * b,
    "div_1p_sq": lambda a, b: a, "tanh_mul": lambda a, b: 1.0,
}
_MAX_BOUND = 1e3


@st.composite
def programs(draw, min_inputs=1, max_inputs=3, max_steps=6, dtype=np.float64, max_side=4,
             min_side=1):
    """(f, [input arrays]): a random differentiable, well-conditioned program and its inputs.

    f is a Program (a plain callable of tracejit ops; its repr prints the code). Inputs
    have broadcastable shapes with values in [-2, 2]; binary ops only pair values whose
    shapes broadcast; reductions, reshape, transpose and matmul appear where shapes allow.
    min_side=0 allows empty dimensions. A bound on every value's magnitude is tracked and ops that would push it past 1e3
    are not drawn, so central differences stay accurate.
    """
    n = draw(st.integers(min_inputs, max_inputs))
    in_shapes = draw(broadcastable_shapes(n, max_dims=3, min_side=min_side,
                                          max_side=max_side))
    shapes_ = list(in_shapes)
    bounds = [2.0] * n
    steps = []
    n_steps = draw(st.integers(1, max_steps))
    for _ in range(n_steps):
        # Prefer recent values so that ops chain instead of all reading the inputs.
        k = draw(st.integers(max(0, len(shapes_) - 3), len(shapes_) - 1))
        shape, bound = shapes_[k], bounds[k]
        kinds = ["unary", "binary"]
        if len(shape) > 0:
            kinds += ["reduce", "reshape"]
        if len(shape) >= 2:
            kinds += ["transpose"]
        if len(shape) in (1, 2):
            kinds += ["matmul"]
        kind = draw(st.sampled_from(kinds))
        if kind == "unary":
            ops = [o for o in sorted(_UNARY) if _UNARY_BOUND[o](bound) <= _MAX_BOUND]
            op = draw(st.sampled_from(ops))
            steps.append((op, (k,), None))
            shapes_.append(shape)
            bounds.append(_UNARY_BOUND[op](bound))
        elif kind == "binary":
            partners = [j for j, s in enumerate(shapes_) if _broadcasts(shape, s)]
            j = draw(st.sampled_from(partners))
            ops = [o for o in sorted(_BINARY)
                   if _BINARY_BOUND[o](bound, bounds[j]) <= _MAX_BOUND]
            op = draw(st.sampled_from(ops))
            operands = (k, j) if draw(st.booleans()) else (j, k)
            steps.append((op, operands, None))
            shapes_.append(np.broadcast_shapes(shape, shapes_[j]))
            bounds.append(_BINARY_BOUND[op](bounds[operands[0]], bounds[operands[1]]))
        elif kind == "reduce":
            axis = draw(st.one_of(st.none(), st.integers(-len(shape), len(shape) - 1)))
            keepdims = draw(st.booleans())
            out_shape = tuple(np.sum(np.zeros(shape), axis=axis, keepdims=keepdims).shape)
            factor = int(np.prod(shape)) // max(int(np.prod(out_shape)), 1)
            op = draw(st.sampled_from(["sum", "mean"] if bound * factor <= _MAX_BOUND
                                      else ["mean"]))
            steps.append((op, (k,), (axis, keepdims)))
            shapes_.append(out_shape)
            bounds.append(bound * factor if op == "sum" else bound)
        elif kind == "reshape":
            size = int(np.prod(shape))
            new = draw(st.sampled_from([(size,), (1, size), (size, 1), shape[::-1], (-1,)]))
            steps.append(("reshape", (k,), new))
            shapes_.append(np.zeros(shape).reshape(new).shape)
            bounds.append(bound)
        elif kind == "transpose":
            perm = tuple(draw(st.permutations(range(len(shape)))))
            steps.append(("transpose", (k,), perm))
            shapes_.append(tuple(shape[p] for p in perm))
            bounds.append(bound)
        else:  # matmul: a vector dot for equal 1-D shapes, a @ b.T for equal 2-D shapes
            partners = [j for j, s in enumerate(shapes_)
                        if s == shape and bound * bounds[j] * shape[-1] <= _MAX_BOUND]
            if not partners:
                steps.append(("tanh", (k,), None))
                shapes_.append(shape)
                bounds.append(1.0)
                continue
            j = draw(st.sampled_from(partners))
            steps.append(("matmul" if len(shape) == 1 else "matmul_t", (k, j), None))
            shapes_.append(() if len(shape) == 1 else (shape[0], shape[0]))
            bounds.append(bound * bounds[j] * shape[-1])
    inputs = [draw(arrays(s, dtype=dtype, elements=st.floats(-2.0, 2.0))) for s in in_shapes]
    return Program(n, steps), inputs


def source_programs(**kwargs):
    """Random DeZero-style programs as Python source text, for jit vs eager fuzzing:
    control flow on data, captured state, in-place updates, user Functions, ... (see
    tracejit/fuzz_gen.py; `python -m tracejit.testing.fuzz` runs them)."""
    from tracejit.testing.fuzz.programs import source_programs as strategy
    return strategy(**kwargs)
