"""The primitive registry and the base of elementwise primitives.

A primitive is a Function subclass registered here: its eager forward, its backward
(written with tracejit.functions, so it traces), its shape rule, its kind and, for
elementwise ops, the scalar expression code generation emits. The primitives live in
elementwise.py and arrayops.py; tracejit.functions re-exports them with the functions
users call.

What the passes and the backends need to know about an op beyond that, its *facets*,
is declared on its class too (defaults on Primitive, overridden where an op differs):
no pass or backend tests an op's name, so a new op is one class.
"""
import functools

import numpy as np

from tracejit.core import ELEMENTWISE, Function, ShapeDtype

PRIMITIVES = {}


def primitive(cls):
    """Register a Function subclass as a primitive (name -> class)."""
    PRIMITIVES[cls.__name__] = cls
    return cls


@functools.lru_cache(maxsize=None)
def probe_dtype(cls, params, dtypes):
    # The result dtype NumPy gives for these input dtypes, found by running forward
    # on one-element arrays: the rule then matches eager exactly, int inputs included.
    fn = cls(*params)
    xs = [np.ones((1,), d) for d in dtypes]
    with np.errstate(all="ignore"):
        return np.asarray(fn.forward(*xs)).dtype


def broadcast_shape(name, specs):
    try:
        return np.broadcast_shapes(*[s.shape for s in specs])
    except ValueError:
        shapes = " and ".join(f"x{i} has shape {s.shape}" for i, s in enumerate(specs))
        raise ValueError(f"{name}: operands cannot be broadcast together: {shapes}") from None


# The float dtypes a fused kernel computes in (float16 and longdouble stay NumPy calls).
KERNEL_FLOATS = frozenset(np.dtype(d) for d in ("f4", "f8"))


class Primitive(Function):
    """Base of the primitives: the facets fusion, remat and the backends read, with
    the defaults of an op that has none of them."""

    # Elementwise: its expr calls libm (math.exp, ...), which a kernel replaces with
    # tracejit's inlined vector math (backends/numba/vecmath.py). Such an op counts
    # against fusion.MAX_VECMATH_OPS (compile time), and a large float32 group holding
    # one runs as NumPy ufuncs on blocks (NumPy's float32 SIMD math is as fast).
    vector_math = False
    # Elementwise: vecmath's fast sin / cos are exact only for |x| <= vm.TRIG_MAX: the
    # kernel counts arguments beyond it and reruns its loops with libm.
    checks_trig_range = False
    # Reduction: the NumPy ufunc that folds a value into the accumulator (np.add,
    # np.maximum, np.minimum), None for an op a kernel does not reduce, and the value
    # the accumulator starts from. `reduction_combine.identity is None`: reducing zero
    # elements raises, as NumPy's does.
    reduction_combine = None
    reduction_identity = None
    # Export (tracejit/export/onnx.py): the standard ONNX operator an elementwise op is,
    # its operands cast to the result's dtype; None: the op's to_onnx lowers it, or it
    # has no ONNX form (export then names it).
    onnx_op = None
    # Elementwise: the output is the sum of the operands (x0 + x1), so a chain of them
    # is one sum whose terms the matmul batching may regroup (passes/matmul_batching.py).
    sums_operands = False

    def matrix_operands(self, node):
        """Matmul: (A, B) when `node` is a plain 2-D product A @ B of float operands,
        which the batching pass may split into and join from blocks
        (A @ [B1 B2] = [A@B1 A@B2], [A1 A2] @ [B1; B2] = A1@B1 + A2@B2); else None."""
        return None

    def operand_dtype(self, node):
        """Matmul: the dtype NumPy computes `node`'s product in when an operand has
        another one (it casts that operand on every call), or None."""
        return None

    def elementwise_form(self, node):
        """Matmul: an elementwise op whose broadcast result over `node`'s inputs is
        exactly `node`'s result (a product over a contraction of length 1), else None."""
        return None

    def to_onnx(self, b, node):
        """Export: emit `node` as ONNX ops through the builder `b` (b.x(node, i, dtype)
        its operands, b.op(type, inputs, **attrs), b.bind(node, name), b.shape(dims)
        for shapes that may follow a dynamic dimension). Default: onnx_op."""
        if self.onnx_op is None:
            raise b.unsupported(node)
        b.elementwise(node, self.onnx_op)

    def cheap_to_recompute(self):
        """Elementwise: is recomputing the value in the backward's kernel cheaper than
        a store and a load of it (remat)? The vector math ops are not."""
        return not self.vector_math

    def fuses_for(self, in_dtypes, out_dtype):
        """Elementwise: can a fused kernel compute this op from operands of `in_dtypes`
        (each a kernel dtype: float32/64, bool, int32/64) into `out_dtype`? Float
        results only, by default: integer results (NumPy's wrap-around and division
        rules) stay NumPy calls."""
        return out_dtype in KERNEL_FLOATS

    def kernel_template(self, node):
        """The scalar source a kernel computes for `node`: (template, params), the
        template formatting with operand sources {0}, {1}, ... and the names in params;
        the backend types float literals and numeric params to the kernel's dtype."""
        return self.expr, dict(zip(self.params, node.params))

    def index_foldable(self, node):
        """Movement: is `node` pure index arithmetic on its one input (foldable into
        the kernel that reads it)?"""
        return False

    def index_read(self, node, out_idx, const, src):
        """Movement, index_foldable: where `node`'s element at `out_idx` (index source
        strings, one per output axis) comes from: (input index sources, conditions).
        An element whose conditions do not all hold is 0. `const(value, what)` makes a
        shape-dependent constant a kernel argument, `const(value, what, shape_free=True)`
        one that is not (an int index: as an argument, x[0] and x[1] share a kernel);
        `src` names the array read."""
        raise NotImplementedError(f"{type(self).__name__} is no index read")

    def epilogue_part(self, node):
        """Conv epilogues (passes/conv_epilogue.py): what `node` is in a convolution's
        epilogue (conv -> + bias -> ReLU -> max pooling) or in its gradient's prologue
        (max pooling's gradient -> times ReLU's mask -> the bias's sum), as (role,
        static value), or None: ("conv", (stride, pad)), ("add", None), ("relu", None),
        ("max_pool", window), ("max_pool_grad", window), ("positive", None) for x > 0,
        ("mul", None), ("sum_to", shape); window is (kernel, stride, pad)."""
        return None

    def view_index(self, node):
        """Movement: the index whose NumPy view of the input `node` reads (x[1:]), or
        None when the result is no view."""
        return None

    def permutes_axes(self, node):
        """Movement: the permutation (a tuple, one source axis per result axis) when
        `node`'s result is its one input with the axes permuted (a transpose); else
        None."""
        return None

    def joins_operands(self, node):
        """Movement: the axis along which `node`'s result is its operands laid side by
        side (a concatenation), so a backend may have the operands' producers write
        into the result's blocks directly instead of copying them there; else None."""
        return None


class Elementwise(Primitive):
    """Base of elementwise primitives: broadcasting shape rule, NumPy's dtype."""

    kind = ELEMENTWISE

    def shape_rule(self, *specs):
        shape = broadcast_shape(type(self).__name__.lower(), specs)
        dtype = probe_dtype(type(self), self.param_values(), tuple(s.dtype for s in specs))
        return ShapeDtype(shape, dtype)


def sum_to_shape(gx, shape):
    """A backward rule's gradient gx brought to its input's shape: summed over the axes
    the forward broadcast. A gx smaller than the shape (an output gradient the user set
    with another shape, `y.grad = Variable(np.array(1.5))` into a (2,) output) stands for
    the same value everywhere: broadcast. DeZero returns it unchanged, so the input's
    gradient took its shape."""
    if gx.shape != shape:
        from tracejit.functions import broadcast_to, sum_to
        if len(gx.shape) <= len(shape) and np.broadcast_shapes(gx.shape, shape) == shape:
            return broadcast_to(gx, shape)
        return sum_to(gx, shape)
    return gx

def differentiable(x):
    return x.dtype.kind in "fc"
