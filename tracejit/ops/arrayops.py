"""Array primitives: reductions (sum, max, min, sum_to), movement (reshape, transpose,
broadcast_to, indexing), matmul and random draws, with their shape rules.
"""
import builtins
import re

import numpy as np

from tracejit import functions as F
from tracejit.core import (MATMUL, MOVEMENT, RANDOM, REDUCTION, ShapeDtype, Variable,
                           static_value)
from tracejit.ops.primitive import (KERNEL_FLOATS, Primitive, primitive, probe_dtype,
                                    sum_to_shape)

# ---------------------------------------------------------------- reductions

def _is_int(a):
    return isinstance(a, (int, np.integer)) and not isinstance(a, (bool, np.bool_))


def _normalize_axis(axis, ndim, name):
    axis = static_value(axis)       # int(...) as an axis: its value
    if axis is None:
        return None
    if _is_int(axis):
        axes = (axis,)
    elif isinstance(axis, (tuple, list)) and all(_is_int(a) for a in axis):
        axes = tuple(axis)
    else:
        # int(1.5) would silently reduce axis 1, tuple('a') iterate a string.
        raise TypeError(f"{name}: axis must be None, an int or a tuple of ints, got "
                        f"{axis!r} ({type(axis).__name__})")
    out = []
    for a in axes:
        a = int(a)
        if not -ndim <= a < builtins.max(ndim, 1):
            raise ValueError(f"{name}: axis {a} is out of bounds for an array of "
                             f"dimension {ndim}")
        out.append(a % ndim if ndim else 0)
    if len(set(out)) != len(out):
        raise ValueError(f"{name}: duplicate value in axis {axis!r}")
    return tuple(sorted(out))


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
    return F.reshape(gy, shape)


class Reduction(Primitive):
    """Base of the reductions a kernel computes: a subclass declares its NumPy ufunc
    (reduction_combine) and the accumulator's start (reduction_identity)."""

    kind = REDUCTION
    params = ("axis", "keepdims")

    def __init__(self, axis=None, keepdims=False):
        # axis is normalized (sorted, non-negative tuple) by the user-facing function.
        self.axis = axis
        self.keepdims = bool(keepdims)

    def shape_rule(self, x):
        shape = _reduced_shape(x.shape, self.axis, self.keepdims)
        return ShapeDtype(shape, probe_dtype(type(self), (None, False), (x.dtype,)))

    def reduced_axes(self, rank):
        """The axes of a rank-`rank` iteration space this reduces over, and per output
        axis the iteration axis it is indexed by (None: a kept size-1 axis, index 0)."""
        axes = set(range(rank)) if self.axis is None else set(self.axis)
        out_index = []
        for k in range(rank):
            if k in axes:
                if self.keepdims:
                    out_index.append(None)
            else:
                out_index.append(k)
        return axes, out_index

    def kernel_template(self, node):
        # A reduction of one element (a 0-d input) is the element itself; a sum starts
        # from +0.0 as NumPy's does: the sum of a lone -0.0 is +0.0 (0.0 + x is x for
        # every other value, nan and inf included).
        if self.reduction_combine is np.add:
            return ("(0.0 + {0})" if node.out.dtype.kind == "f" else "(0 + {0})"), {}
        return "{0}", {}

    # Export: the ONNX reduction (Sum: ReduceSum, Max: ReduceMax, Min: ReduceMin).
    onnx_reduce = None

    def to_onnx(self, b, node):
        # In the result's dtype: NumPy sums bools and small ints as int64.
        x = b.x(node, 0, node.out.dtype)
        rank = len(node.inputs[0].shape)
        axes = list(range(rank)) if self.axis is None else [a % rank for a in self.axis]
        b.bind(node, b.reduce(x, self.onnx_reduce, axes, self.keepdims))


@primitive
class Sum(Reduction):
    reduction_combine = np.add
    reduction_identity = 0.0
    onnx_reduce = "ReduceSum"

    def forward(self, x):
        return np.sum(x, axis=self.axis, keepdims=self.keepdims)

    def backward(self, gy):
        x, = self.inputs
        gy = _keepdims_grad(gy, x.shape, self.axis, self.keepdims)
        return F.broadcast_to(gy, x.shape)


@primitive
class Max(Reduction):
    reduction_combine = np.maximum
    reduction_identity = -np.inf
    onnx_reduce = "ReduceMax"

    def forward(self, x):
        return np.max(x, axis=self.axis, keepdims=self.keepdims)

    def backward(self, gy):
        x, = self.inputs
        # The mask compares x with its extremum taken again from x, not with the saved
        # output: compiled, the backward may recompute x (rematerialized) in another
        # kernel than the one the forward reduced it in, and a value that rounds
        # differently there would match no element of a mask against the saved y
        # (the gradient silently zero). Eager, both are the same array.
        y = type(self)(self.axis, True)(x)
        gy = _keepdims_grad(gy, x.shape, self.axis, self.keepdims)
        # Every element equal to the maximum gets the gradient (DeZero's rule).
        return F.where(F.equal(x, y), gy, 0.0)


@primitive
class Min(Max):
    reduction_combine = np.minimum
    reduction_identity = np.inf
    onnx_reduce = "ReduceMin"

    def forward(self, x):
        return np.min(x, axis=self.axis, keepdims=self.keepdims)


@primitive
class SumTo(Reduction):
    """Sum a broadcast array back to `shape` (the gradient of broadcasting)."""

    params = ("shape",)
    reduction_combine = np.add
    reduction_identity = 0.0

    def __init__(self, shape):
        self.shape = tuple(shape)

    def forward(self, x):
        return _np_sum_to(x, self.shape)

    def epilogue_part(self, node):
        return ("sum_to", self.shape)

    def to_onnx(self, b, node):
        # The axes broadcasting added or stretched, summed keeping them, then the target
        # shape (which may follow a dynamic dimension).
        x = b.x(node, 0)
        shape = b.params(node)[0]
        in_dims = b.dims(node.inputs[0])
        lead = len(in_dims) - len(shape)
        axes = list(range(lead)) + [k + lead for k, d in enumerate(shape)
                                    if d == 1 and in_dims[k + lead] != 1]
        y = b.reduce(x, "ReduceSum", axes, True)
        b.bind(node, b.op("Reshape", [y, b.shape(shape)]))

    def backward(self, gy):
        x, = self.inputs
        return F.broadcast_to(gy, x.shape)

    def shape_rule(self, x):
        check_sum_to(x.shape, self.shape)
        return ShapeDtype(self.shape, x.dtype)

    def reduced_axes(self, rank):
        # The leading axes broadcasting added, and the size-1 axes of the target.
        lead = rank - len(self.shape)
        axes = set(range(lead)) | {k + lead for k, d in enumerate(self.shape) if d == 1}
        out_index = [None if d == 1 else k + lead for k, d in enumerate(self.shape)]
        return axes, out_index


def check_sum_to(x_shape, shape):
    """Raise unless x_shape sums to shape: shape broadcasts to x_shape exactly (the
    inverse of broadcast_to). Merely broadcastable shapes ((2, 3) and (4,)... or (2, 1,
    3)) would give a result of a third shape."""
    try:
        ok = np.broadcast_shapes(shape, x_shape) == tuple(x_shape)
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(f"sum_to: cannot sum shape {tuple(x_shape)} to {tuple(shape)}")


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

def _onnx_index(b, node, x, key, rank):
    """Export: ONNX ops computing x[key] (GetItem's template; node.inputs[1:] are its
    index arrays), NumPy's rules: slices and ints as Slice (+ Squeeze); with index
    arrays, ints are 0-d index arrays too, and the indexed axes are merged into one that
    a Gather reads at the flat index (in place when they are adjacent, else first)."""
    arrays = [i for i in range(1, len(node.inputs))]
    for i in arrays:
        if node.inputs[i].dtype.kind not in "iu":
            raise b.unsupported(node, "a boolean mask index (its result's shape depends "
                                      "on the data)")
    used = sum(1 for k in key if k is not None and k is not Ellipsis)
    entries = []
    for k in key:
        if k is Ellipsis:
            entries += [_Slice((None, None, None))] * (rank - used)
        else:
            entries.append(k)
    entries += [_Slice((None, None, None))] * (rank - sum(1 for k in entries if k is not None))
    advanced = bool(arrays)
    starts, ends, axes, steps = [], [], [], []
    squeeze, new_axes, adv = [], [], []
    axis = out_axis = 0
    for k in entries:
        if k is None:
            if advanced:
                raise b.unsupported(node, "None together with index arrays")
            new_axes.append(out_axis)
            out_axis += 1
            continue
        if isinstance(k, _ArrayIndex):
            adv.append((axis, b.x(node, 1 + int(k), np.int64)))
        elif isinstance(k, _Slice):
            start, stop, step = k
            step = 1 if step is None else step
            if (start, stop, step) != (None, None, 1):
                lo, hi = (0, INT64_MAX) if step > 0 else (INT64_MAX, INT64_MIN)
                starts.append(lo if start is None else start)
                ends.append(hi if stop is None else stop)
                axes.append(axis)
                steps.append(step)
            out_axis += 1
        elif advanced:
            adv.append((axis, b.const(np.array(k, np.int64))))
        else:
            starts.append(k)
            ends.append(k + 1 if k != -1 else INT64_MAX)
            axes.append(axis)
            steps.append(1)
            squeeze.append(axis)
        axis += 1
    y = x
    if axes:
        y = b.op("Slice", [y, b.shape(starts), b.shape(ends), b.ints(axes), b.ints(steps)])
    if squeeze:
        y = b.op("Squeeze", [y, b.ints(squeeze)])
    if new_axes:
        y = b.op("Unsqueeze", [y, b.ints(new_axes)])
    if not adv:
        return y
    shape = b.op("Shape", [y])
    flat = None
    for a, idx in adv:
        dim = b.op("Gather", [shape, b.const(np.array(a, np.int64))], axis=0)
        neg = b.op("Less", [idx, b.const(np.array(0, np.int64))])
        idx = b.op("Where", [neg, b.op("Add", [idx, dim]), idx])
        flat = idx if flat is None else b.op("Add", [b.op("Mul", [flat, dim]), idx])
    first, last = adv[0][0], adv[-1][0]
    if [a for a, _ in adv] != list(range(first, last + 1)):
        # Apart: NumPy puts the indexed axes first.
        order = [a for a, _ in adv] + [a for a in range(rank) if a not in dict(adv)]
        y = b.op("Transpose", [y], perm=order)
        shape = b.op("Shape", [y])
        first, last = 0, len(adv) - 1
    pre = b.op("Slice", [shape, b.ints([0]), b.ints([first])])
    mid = b.op("ReduceProd", [b.op("Slice", [shape, b.ints([first]), b.ints([last + 1])])],
               keepdims=1)
    post = b.op("Slice", [shape, b.ints([last + 1]), b.ints([INT64_MAX])])
    y = b.op("Reshape", [y, b.op("Concat", [pre, mid, post], axis=0)])
    return b.op("Gather", [y, flat], axis=first)


INT64_MAX = np.iinfo(np.int64).max
INT64_MIN = np.iinfo(np.int64).min

_ATOM = re.compile(r"\w+")


def affine(c, step, i):
    """Index source of c + step * i (c: an index name or integer literal; i: that or
    the index source of an outer movement op of the chain, e.g. "c0 - i1")."""
    if i == "0":
        return c
    if not _ATOM.fullmatch(i):
        # A compound i (x[::-1][::-1] in one kernel: c1 - (c0 - i0)) is one operand:
        # unparenthesized, "c1 - c0 - i0" reads the wrong element.
        i = f"({i})"
    term = i if abs(step) == 1 else f"{abs(step)} * {i}"
    if c == "0":
        return term if step > 0 else f"-{term}"
    return f"{c} {'+' if step > 0 else '-'} {term}"


@primitive
class Reshape(Primitive):
    kind = MOVEMENT
    params = ("shape",)

    def __init__(self, shape):
        self.shape = tuple(int(d) for d in shape)

    def forward(self, x):
        return x.reshape(self.shape)

    def to_onnx(self, b, node):
        b.bind(node, b.op("Reshape", [b.x(node, 0), b.shape(b.params(node)[0])],
                          allowzero=1))

    def backward(self, gy):
        x, = self.inputs
        return F.reshape(gy, x.shape)

    def shape_rule(self, x):
        return ShapeDtype(_resolve_reshape(x.shape, self.shape), x.dtype)

    def index_foldable(self, node):
        # Only adding or dropping size-1 axes is a renaming of the loop indices.
        a = [d for d in node.inputs[0].shape if d != 1]
        b = [d for d in node.out.shape if d != 1]
        return a == b

    def index_read(self, node, out_idx, const, src):
        u = node.inputs[0]
        P = [k for k, d in enumerate(node.out.shape) if d != 1]
        Q = [k for k, d in enumerate(u.shape) if d != 1]
        idx = ["0"] * len(u.shape)
        for pk, qk in zip(P, Q):
            idx[qk] = out_idx[pk]
        return idx, []


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
class Transpose(Primitive):
    kind = MOVEMENT
    params = ("axes",)

    def __init__(self, axes=None):
        self.axes = None if axes is None else tuple(int(a) for a in axes)

    def forward(self, x):
        return np.transpose(x, self.axes)

    def to_onnx(self, b, node):
        rank = len(node.inputs[0].shape)
        if rank == 0:
            # A 0-d transpose is the value itself (an empty perm has no attribute type).
            b.bind(node, b.op("Identity", [b.x(node, 0)]))
            return
        perm = list(range(rank))[::-1] if self.axes is None else [a % rank for a in self.axes]
        b.bind(node, b.op("Transpose", [b.x(node, 0)], perm=perm))

    def backward(self, gy):
        if self.axes is None:
            return F.transpose(gy)
        inv_axes = tuple(np.argsort([ax % len(self.axes) for ax in self.axes]))
        return F.transpose(gy, inv_axes)

    def shape_rule(self, x):
        axes = self.axes if self.axes is not None else tuple(reversed(range(x.ndim)))
        if sorted(a % builtins.max(x.ndim, 1) for a in axes) != list(range(x.ndim)):
            raise ValueError(f"transpose: axes {self.axes} do not match an array of "
                             f"shape {x.shape}")
        return ShapeDtype(tuple(x.shape[a] for a in axes), x.dtype)

    def index_foldable(self, node):
        return True

    def permutes_axes(self, node):
        q = len(node.inputs[0].shape)
        return (tuple(reversed(range(q))) if self.axes is None
                else tuple(a % q for a in self.axes))

    def index_read(self, node, out_idx, const, src):
        q = len(node.inputs[0].shape)
        axes = self.axes if self.axes is not None else tuple(reversed(range(q)))
        idx = ["0"] * q
        for k, a in enumerate(axes):
            idx[a] = out_idx[k]
        return idx, []


@primitive
class BroadcastTo(Primitive):
    kind = MOVEMENT
    params = ("shape",)

    def __init__(self, shape):
        self.shape = tuple(int(d) for d in shape)

    def forward(self, x):
        # A fresh array, not a read-only view: results must be writable.
        return np.array(np.broadcast_to(x, self.shape))

    def to_onnx(self, b, node):
        b.bind(node, b.op("Expand", [b.x(node, 0), b.shape(b.params(node)[0])]))

    def backward(self, gy):
        x, = self.inputs
        return sum_to_shape(gy, x.shape)

    def shape_rule(self, x):
        try:
            shape = np.broadcast_shapes(x.shape, self.shape)
        except ValueError:
            shape = None
        if shape != self.shape:
            raise ValueError(f"broadcast_to: cannot broadcast shape {x.shape} to {self.shape}")
        return ShapeDtype(self.shape, x.dtype)

    def index_foldable(self, node):
        return True

    def index_read(self, node, out_idx, const, src):
        # An input axis of size 1 against a longer output axis is read at 0.
        u, out = node.inputs[0], node.out
        q, p = len(u.shape), len(out.shape)
        return [("0" if u.shape[k] == 1 and out.shape[k + p - q] != 1
                 else out_idx[k + p - q]) for k in range(q)], []


class _Slice(tuple):
    """A hashable stand-in for a slice object inside a static index key."""

    def as_slice(self):
        return slice(*self)


class _ArrayIndex(int):
    """Marks the position of an index array (an input of GetItem, not a parameter)."""


class _MaskIndex(tuple):
    """(position, count): a boolean mask index (an input of GetItem) with `count` True
    entries. The result's shape depends on the count, so it is part of the key (a
    traced mask's count is guarded: a mask with another count is another graph)."""

    def __int__(self):
        return self[0]


def _mask_count(k):
    """The number of True entries of a boolean mask index: a Python int (guarded by
    value while tracing, where the mask is traced data)."""
    data = k.data if isinstance(k, Variable) else k
    return int(np.count_nonzero(data))


def _split_index(key, count_masks=True):
    """Split an index into a hashable template and the index arrays it uses.
    count_masks: a boolean mask is a _MaskIndex with its count (the result's shape
    depends on it: x[mask]), else an _ArrayIndex like an index array (an assignment's
    shape is the target's, whatever the count)."""
    key = static_value(key, "an index")
    if not isinstance(key, tuple):
        key = (key,)
    template, arrays = [], []
    for k in key:
        if isinstance(k, slice):
            template.append(_Slice((k.start, k.stop, k.step)))
        elif isinstance(k, Variable) or isinstance(k, (np.ndarray, list)):
            # An ndarray (a traced argument's too) is kept as it is: np.asarray would
            # hand a traced array's buffer to NumPy behind the tracer's back.
            k = k if isinstance(k, (Variable, np.ndarray)) else np.asarray(k)
            if k.dtype == np.bool_ and count_masks:
                template.append(_MaskIndex((len(arrays), _mask_count(k))))
            else:
                template.append(_ArrayIndex(len(arrays)))
            arrays.append(k)
        elif k is None or k is Ellipsis or isinstance(k, (int, np.integer)):
            template.append(int(k) if isinstance(k, np.integer) else k)
        else:
            raise TypeError(f"get_item: unsupported index {k!r}")
    return tuple(template), arrays


def _join_index(template, arrays):
    out = []
    for k in template:
        if isinstance(k, (_ArrayIndex, _MaskIndex)):
            out.append(arrays[int(k)])
        elif isinstance(k, _Slice):
            out.append(k.as_slice())
        else:
            out.append(k)
    return tuple(out)


def _plan_fits(plan, part):
    """The basic-index plan, if the shape it selects is `part` (else None)."""
    if plan is None:
        return None
    shape = [None] * len(part)
    for e in plan:
        if e[0] == "slice":
            if e[2] >= len(part):
                return None
            shape[e[2]] = e[5]
        elif e[0] == "new":
            if e[1] >= len(part):
                return None
            shape[e[1]] = 1
    return plan if tuple(shape) == tuple(part) else None


@primitive
class GetItem(Primitive):
    """x[key]: slices and ints are the static `key`; index arrays are inputs."""

    kind = MOVEMENT
    params = ("key",)

    def __init__(self, key):
        self.key = key

    def forward(self, x, *indices):
        y = x[_join_index(self.key, indices)]
        return np.array(y) if not isinstance(y, np.ndarray) or y.base is not None else y

    def to_onnx(self, b, node):
        x = b.x(node, 0)
        b.bind(node, _onnx_index(b, node, x, b.params(node)[0], len(node.inputs[0].shape)))

    def backward(self, gy):
        x, *indices = self.inputs
        gx = GetItemGrad(self.key, x.shape)(gy, *indices)
        return (gx,) + (None,) * len(indices)

    def shape_rule(self, x, *indices):
        probe = np.empty(x.shape, dtype=np.bool_)
        idx = [np.zeros(s.shape, s.dtype) for s in indices]
        for k in self.key:
            if isinstance(k, _MaskIndex):      # a mask of its count: the result's shape
                idx[k[0]].reshape(-1)[:k[1]] = True
        try:
            shape = probe[_join_index(self.key, idx)].shape
        except IndexError as e:
            raise IndexError(f"get_item: {e} (array of shape {x.shape})") from None
        return ShapeDtype(shape, x.dtype)

    def basic_index_plan(self, node):
        """basic_index of x[key] for `node`, checked against its shapes (None: not
        foldable)."""
        return _plan_fits(GetItem.basic_index(self.key, node.inputs[0].shape),
                          node.out.shape)

    def index_foldable(self, node):
        return self.basic_index_plan(node) is not None

    def index_read(self, node, out_idx, const, src):
        # x[key] is an affine read: start + step * i per sliced axis, ints fixed.
        # Ints and nonzero starts are kernel arguments even where they do not depend on
        # the shape (shape_free): xs[0], xs[1], ... of an unrolled loop then share one
        # kernel instead of compiling one each. Steps stay in the source. A zero start
        # is a literal only on a whole axis: the first block of a concatenation
        # (x[:, 0:100] of W7's joined (900, 400) product) then shares the kernel of the
        # other blocks (x[:, 100:200]: start s0), one numba compile fewer.
        idx = []
        in_shape = node.inputs[0].shape
        for e in self.basic_index_plan(node):
            if e[0] == "slice":
                _, ia, oa, start, step, length, static = e
                what = f"start of the slice of {src} axis {ia} (step {step})"
                whole = static == 0 and step == 1 and length == in_shape[ia]
                c = "0" if whole else const(start, what, shape_free=static is not None)
                idx.append(affine(c, step, out_idx[oa]))
            elif e[0] == "int":
                idx.append(const(e[2], f"index into {src} axis {e[1]}",
                                 shape_free=e[3] is not None))
        return idx, []

    @classmethod
    def block(cls, axis, start, stop):
        """x[:, ..., start:stop] on `axis` (a block of a Concat's result)."""
        full = _Slice((None, None, None))
        return cls((full,) * axis + (_Slice((int(start), int(stop), None)),))

    def view_index(self, node):
        # Basic indexing is a NumPy view (no copy).
        return _join_index(self.key, ()) if self.basic_index_plan(node) is not None else None

    @staticmethod
    def basic_index(key, in_shape):
        """`key` as index arithmetic against `in_shape`, or None if it is not basic.

        The code generator's hook for folding x[key] (and its gradient) into a kernel's
        index arithmetic. Basic indexing only: ints, slices, None and one Ellipsis, all
        constants; index arrays, bools and out-of-range ints give None (the node stays
        a NumPy call, which raises NumPy's own error). Ellipsis is expanded and missing
        trailing axes become full slices. One entry per key position, in order:
          ("slice", in_axis, out_axis, start, step, length, static)
          ("int", in_axis, index, static)
          ("new", out_axis)                                   None: a size-1 axis
        start, step, length: slice.indices() resolved; index in [0, dim). Steps never
        depend on the shape; `static` is the start / index as a shape-independent
        constant where there is one (a start >= 0 or omitted with a positive step: a
        start beyond the axis only happens with length 0, where nothing is read; an
        index >= 0), else None (negative starts and indices, negative steps).
        """
        if not isinstance(key, tuple):
            return None
        for k in key:
            if isinstance(k, (_ArrayIndex, _MaskIndex)) or isinstance(k, (bool, np.bool_)):
                return None
            if isinstance(k, _Slice):
                if len(k) != 3 or not all(
                        b is None or (isinstance(b, (int, np.integer))
                                      and not isinstance(b, (bool, np.bool_))) for b in k):
                    return None
            elif not (k is None or k is Ellipsis or isinstance(k, (int, np.integer))):
                return None
        if sum(k is Ellipsis for k in key) > 1:
            return None
        used = sum(1 for k in key if k is not None and k is not Ellipsis)
        q = len(in_shape)
        if used > q:
            return None
        full = _Slice((None, None, None))
        if any(k is Ellipsis for k in key):
            e = next(i for i, k in enumerate(key) if k is Ellipsis)
            key = key[:e] + (full,) * (q - used) + key[e + 1:]
        else:
            key = key + (full,) * (q - used)
        out, ia, oa = [], 0, 0
        for k in key:
            if k is None:
                out.append(("new", oa))
                oa += 1
            elif isinstance(k, _Slice):
                if k[2] == 0:
                    return None
                start, stop, step = k.as_slice().indices(in_shape[ia])
                static = None
                if step > 0 and (k[0] is None or k[0] >= 0):
                    static = 0 if k[0] is None else int(k[0])
                out.append(("slice", ia, oa, start, step, len(range(start, stop, step)),
                            static))
                ia += 1
                oa += 1
            else:
                d = in_shape[ia]
                i = int(k)
                if not -d <= i < d:
                    return None
                out.append(("int", ia, i % d, i if i >= 0 else None))
                ia += 1
        return tuple(out)


@primitive
class GetItemGrad(Primitive):
    """Scatter-add gy into zeros of x's shape (the gradient of GetItem)."""

    kind = MOVEMENT
    params = ("key", "in_shape")

    def __init__(self, key, in_shape):
        self.key = key
        self.in_shape = tuple(in_shape)

    def forward(self, gy, *indices):
        gx = np.zeros(self.in_shape, dtype=gy.dtype)
        if not indices and GetItem.basic_index(self.key, self.in_shape) is not None:
            # A basic index never selects an element twice: the scatter-add is a plain
            # assignment (5x faster than np.add.at on 4e6 float64).
            gx[_join_index(self.key, ())] = gy
        else:
            np.add.at(gx, _join_index(self.key, indices), gy)
        return gx

    def to_onnx(self, b, node):
        # Where each element of gy goes: x[key] of x = the flat positions of in_shape;
        # then a scatter-add of gy into zeros (ONNX's ScatterElements, reduction add).
        key, in_shape = b.params(node)
        shape = b.shape(in_shape)
        count = b.op("ReduceProd", [shape], keepdims=0)
        pos = b.op("Range", [b.const(np.array(0, np.int64)), count,
                             b.const(np.array(1, np.int64))])
        pos = b.op("Reshape", [pos, shape])
        where = _onnx_index(b, node, pos, key, len(in_shape))
        flat = b.ints([-1])
        zeros = b.op("Expand", [b.const(np.zeros(1, node.out.dtype)),
                                b.op("Reshape", [count, flat])])
        gy = b.x(node, 0, node.out.dtype)
        out = b.op("ScatterElements", [zeros, b.op("Reshape", [where, flat]),
                                       b.op("Reshape", [gy, flat])], axis=0, reduction="add")
        b.bind(node, b.op("Reshape", [out, shape]))

    def backward(self, ggx):
        _, *indices = self.inputs
        return (GetItem(self.key)(ggx, *indices),) + (None,) * len(indices)

    def shape_rule(self, gy, *indices):
        return ShapeDtype(self.in_shape, gy.dtype)

    def basic_index_plan(self, node):
        """basic_index of the [key] this writes gy into zeros of in_shape at, checked
        against the node's shapes (None: not foldable). A basic index never selects an
        element twice, so the scatter-add is a masked read."""
        if node.out.shape != self.in_shape:
            return None
        return _plan_fits(GetItem.basic_index(self.key, self.in_shape), node.inputs[0].shape)

    def index_foldable(self, node):
        return self.basic_index_plan(node) is not None

    def index_read(self, node, out_idx, const, src):
        # zeros with gy at [key]: element j of a sliced axis reads gy at (j - start) /
        # step where that is a whole index in range, and is 0 elsewhere.
        idx, conds = [], []
        for e in self.basic_index_plan(node):
            if e[0] == "slice":
                _, ia, oa, start, step, _, static = e
                what = f"start of the slice {src} fills, axis {ia} (step {step})"
                c = "0" if static == 0 else const(start, what, shape_free=static is not None)
                m = const(e[5], f"length of the slice {src} fills, axis {ia}")
                j = out_idx[ia]
                d = affine(j, -1, c) if step > 0 else affine(c, -1, j)
                if abs(step) == 1:
                    conds.append(f"0 <= {d} < {m}")
                    idx.append(d)
                else:
                    a = abs(step)
                    conds.append(f"({d}) % {a} == 0 and 0 <= {d} < {a} * {m}")
                    idx.append(f"({d}) // {a}")
            elif e[0] == "int":
                c = const(e[2], f"index {src} fills on axis {e[1]} (zeros elsewhere)",
                          shape_free=e[3] is not None)
                conds.append(f"{out_idx[e[1]]} == {c}")
            else:
                idx.append("0")
        return idx, conds


# ---------------------------------------------------------------- concat

@primitive
class Concat(Primitive):
    """np.concatenate(xs, axis): operands of one dtype and rank, equal off `axis`.

    Made by passes/matmul_batching.py (the blocks of a batched product), not by user
    code. A new array (never a view of an operand); not index arithmetic, so it stays
    a NumPy call."""

    kind = MOVEMENT
    params = ("axis",)

    def __init__(self, axis):
        self.axis = int(axis)

    def forward(self, *xs):
        return np.concatenate(xs, axis=self.axis)

    def joins_operands(self, node):
        return self.axis

    def to_onnx(self, b, node):
        b.bind(node, b.op("Concat", [b.x(node, i) for i in range(len(node.inputs))],
                          axis=self.axis))

    def backward(self, gy):
        gxs, start = [], 0
        for x in self.inputs:
            stop = start + x.shape[self.axis]
            gxs.append(F.get_item(gy, (slice(None),) * self.axis + (slice(start, stop),)))
            start = stop
        return tuple(gxs)

    def shape_rule(self, *xs):
        if not xs:
            raise ValueError("concat: needs at least one operand")
        rank, a = xs[0].ndim, self.axis
        if not 0 <= a < rank:
            raise ValueError(f"concat: axis {a} is out of bounds for rank {rank}")
        for x in xs:
            if (x.ndim != rank or x.dtype != xs[0].dtype
                    or x.shape[:a] + x.shape[a + 1:] != xs[0].shape[:a] + xs[0].shape[a + 1:]):
                raise ValueError(f"concat: operands {[(s.shape, str(s.dtype)) for s in xs]} "
                                 f"do not join on axis {a} (one dtype, equal off the axis)")
        shape = list(xs[0].shape)
        shape[a] = builtins.sum(x.shape[a] for x in xs)
        return ShapeDtype(tuple(shape), xs[0].dtype)


# ---------------------------------------------------------------- matmul

@primitive
class MatMul(Primitive):
    """Matrix product over the last two axes (both operands at least 2-D)."""

    kind = MATMUL
    op_name = "matmul"

    def forward(self, x, W):
        return np.matmul(x, W)

    def to_onnx(self, b, node):
        dt = node.out.dtype
        b.bind(node, b.op("MatMul", [b.x(node, 0, dt), b.x(node, 1, dt)]))

    def backward(self, gy):
        x, W = self.inputs
        gx = F.matmul(gy, _swap_last(W))
        gW = F.matmul(_swap_last(x), gy)
        return sum_to_shape(gx, x.shape), sum_to_shape(gW, W.shape)

    def matrix_operands(self, node):
        # float32/64 operands (mixed: NumPy casts to the result's dtype before the
        # product, so a block of a joined operand is cast to the same values).
        x, W = node.inputs
        if x.ndim == 2 and W.ndim == 2 and {x.dtype, W.dtype} <= KERNEL_FLOATS:
            return x, W
        return None

    def operand_dtype(self, node):
        # float32 @ float64: NumPy's matmul casts the float32 operand to float64 (exact)
        # on every call, before BLAS; a weight read by every time step is cast 30 times.
        x, W = node.inputs
        dt = node.out.dtype
        if {x.dtype, W.dtype} <= KERNEL_FLOATS and x.dtype != W.dtype:
            return dt
        return None

    def elementwise_form(self, node):
        # A contraction of length 1 has one term per output: (.., M, 1) @ (.., 1, N)
        # is the broadcast product (.., M, 1) * (.., 1, N) (matmul broadcasts batch
        # axes as elementwise ops do), with no sum to round; as a multiply it fuses
        # into the kernel that reads it instead of a BLAS call (a (30, 1) @ (1, 100)
        # costs NumPy's matmul ~8 us, the LSTM's input projections 150 of them a step).
        # (passes/matmul_batching adds + 0.0 after it: BLAS adds the product to +0.0.)
        x, W = node.inputs
        if (x.ndim >= 2 and W.ndim >= 2 and x.shape[-1] == 1
                and {x.dtype, W.dtype} <= KERNEL_FLOATS):
            from tracejit.ops.elementwise import Mul
            return Mul()
        return None

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
    return F.transpose(x, axes)


# ---------------------------------------------------------------- random

@primitive
class RandomUniform(Primitive):
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


_NUMPY_SEED = np.random.seed    # bound at import, before any trace swaps it


@primitive
class RandomSeed(Primitive):
    """np.random.seed(seed) inside a traced function: an effect on NumPy's global
    stream, ordered with the draws around it (impure, like RandomUniform), so a compiled
    call reseeds where eager does and the draws after it match eager's. Its output is
    a dummy 0-d value nothing reads (a node needs one for the plan to call it)."""

    kind = RANDOM
    params = ("seed",)

    def __init__(self, seed):
        self.seed = seed

    def forward(self):
        _NUMPY_SEED(self.seed)      # NumPy's own, not the tracer's stand-in (tracing.py)
        return np.zeros(())

    def backward(self, gy):
        return ()

    def shape_rule(self):
        return ShapeDtype((), np.float64)
