"""Property tests for every primitive in tracejit.functions.PRIMITIVES and the
user-facing composite functions: forward against NumPy, shape rules against forward,
gradients against central differences (orders 1 and 2), broadcasting, and dtypes
(float32 stays float32, also with Python scalars).

`CASES` maps each primitive name to a generator of test inputs; a test fails when a
primitive is added without one.
"""
import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import tracejit as tj
import tracejit.functions as F
from tracejit.core import ELEMENTWISE, ShapeDtype
from tracejit.testing import gradcheck
from tracejit.testing import strategies as S

FLOATS = [np.float64, np.float32]


class Case:
    """One drawn test: f on Variables, its inputs, a NumPy reference for the forward."""

    def __init__(self, f, inputs, ref, grad=True, second_order=True, gc=None, check=None):
        self.f = f
        self.inputs = inputs
        self.ref = ref
        self.grad = grad
        self.second_order = second_order
        self.gc = gc or {}
        self.check = check          # an extra assertion on (inputs, output)


def _assert_close(y, ref):
    ref = np.asarray(ref)
    assert isinstance(y, tj.Variable)
    assert isinstance(y.data, np.ndarray)
    assert y.shape == ref.shape, (y.shape, ref.shape)
    assert y.dtype == ref.dtype, (y.dtype, ref.dtype)
    if ref.dtype.kind == "f":
        tol = 1e-5 if ref.dtype == np.float32 else 1e-12
        np.testing.assert_allclose(y.data, ref, rtol=tol, atol=tol)
    else:
        np.testing.assert_array_equal(y.data, ref)


def _check_shape_rules(y):
    """Each Function in y's graph: its shape rule gives the shapes/dtypes forward gave."""
    seen, stack = set(), [y.creator]
    while stack:
        fn = stack.pop()
        if fn is None or id(fn) in seen:
            continue
        seen.add(id(fn))
        specs = [ShapeDtype(x.shape, x.dtype) for x in fn.inputs]
        rule = fn.shape_rule(*specs)
        rule = rule if isinstance(rule, tuple) else (rule,)
        outs = [ref() for ref in fn.outputs]
        for r, o in zip(rule, outs):
            if o is not None:
                assert r == ShapeDtype(o.shape, o.dtype), (type(fn).__name__, r, o.shape,
                                                           o.dtype)
        stack.extend(x.creator for x in fn.inputs)


def _wrap(inputs):
    return [tj.Variable(a) if isinstance(a, np.ndarray) and a.dtype.kind == "f" else a
            for a in inputs]


def run_case(case):
    xs = _wrap(case.inputs)
    y = case.f(*xs)
    _assert_close(y, case.ref(*case.inputs))
    _check_shape_rules(y)
    if case.check is not None:
        case.check(xs, y)
    if case.grad:
        gradcheck(case.f, *case.inputs, second_order=case.second_order, **case.gc)


# ---------------------------------------------------------------- input generators

def _shape(data, **kw):
    kw.setdefault("max_side", 3)
    return data.draw(S.shapes(**kw), label="shape")


def _array(data, shape, dtype, safe=None, elements=None):
    return data.draw(S.arrays(shape, dtype, elements=elements, safe=safe), label="array")


def unary(name, fn, ref):
    def gen(data, dtype):
        x = _array(data, _shape(data), dtype, safe=S.safe_range_for(name))
        return Case(fn, [x], ref)
    return gen


def binary(name, fn, ref):
    def gen(data, dtype):
        s0, s1 = data.draw(S.broadcastable_shapes(2, max_side=3), label="shapes")
        x0 = _array(data, s0, dtype, safe=S.safe_range_for(name, 0))
        x1 = _array(data, s1, dtype, safe=S.safe_range_for(name, 1))
        return Case(fn, [x0, x1], ref)
    return gen


def untied(fn, ref, grad=True):
    """Two broadcastable operands on interleaved grids: never equal elementwise."""
    def gen(data, dtype):
        s0, s1 = data.draw(S.broadcastable_shapes(2, max_side=3), label="shapes")
        x0 = data.draw(S.distinct_arrays(s0, dtype, offset=0.125), label="x0")
        x1 = data.draw(S.distinct_arrays(s1, dtype), label="x1")
        return Case(fn, [x0, x1], ref, grad=grad, second_order=grad)
    return gen


def tied(fn, ref):
    """Small integer values, so equal elements are common."""
    def gen(data, dtype):
        s0, s1 = data.draw(S.broadcastable_shapes(2, max_side=3), label="shapes")
        el = st.sampled_from([-1.0, 0.0, 1.0])
        return Case(fn, [_array(data, s0, dtype, elements=el),
                         _array(data, s1, dtype, elements=el)], ref, second_order=False)
    return gen


def _axis(data, ndim):
    if ndim == 0:
        return data.draw(st.sampled_from([None, ()]), label="axis")
    single = st.integers(-ndim, ndim - 1)
    many = st.lists(st.integers(0, ndim - 1), min_size=0, max_size=ndim, unique=True).map(tuple)
    return data.draw(st.one_of(st.none(), single, many), label="axis")


def reduction(fn, ref, distinct):
    def gen(data, dtype):
        shape = _shape(data, min_dims=0)
        x = (data.draw(S.distinct_arrays(shape, dtype), label="x") if distinct
             else _array(data, shape, dtype))
        axis = _axis(data, x.ndim)
        keepdims = data.draw(st.booleans(), label="keepdims")
        return Case(lambda v: fn(v, axis=axis, keepdims=keepdims), [x],
                    lambda a: np.asarray(ref(a, axis=axis, keepdims=keepdims)))
    return gen


def gen_pow(data, dtype):
    c = data.draw(st.sampled_from([2, 3, 1, 0, -1, 0.5, 1.5, -2.5]), label="c")
    positive = not (isinstance(c, int) and c >= 0)
    safe = S.SafeRange(0.5, 3.0) if positive else S.SafeRange()
    x = _array(data, _shape(data), dtype, safe=safe)
    return Case(lambda v: v ** c, [x], lambda a: a ** c)


def gen_leaky_relu(data, dtype):
    slope = data.draw(st.sampled_from([0.0, 0.01, 0.2, 1.5]), label="slope")
    x = _array(data, _shape(data), dtype, safe=S.safe_range_for("LeakyReLU"))
    return Case(lambda v: F.leaky_relu(v, slope), [x],
                lambda a: np.where(a > 0, a, a * a.dtype.type(slope)))


def gen_clip(data, dtype):
    lo = data.draw(st.sampled_from([-1.5, -0.5, 0.0]), label="lo")
    hi = data.draw(st.sampled_from([0.25, 1.0, 1.5]), label="hi")
    el = st.floats(-2.0, 2.0).filter(lambda v: abs(v - lo) > 0.05 and abs(v - hi) > 0.05)
    x = _array(data, _shape(data), dtype, elements=el)
    return Case(lambda v: F.clip(v, lo, hi), [x], lambda a: np.clip(a, lo, hi))


def gen_cast(data, dtype):
    target = data.draw(st.sampled_from(["float64", "float32", "int64", "bool"]), label="to")
    x = _array(data, _shape(data), dtype)
    differentiable = target.startswith("float")

    def f(v):
        # F.cast skips a no-op cast; call the primitive so it is always exercised.
        return F.Cast(target)(v)

    def check(xs, y):
        y.backward()
        if not differentiable:
            assert xs[0].grad is None
        else:
            assert xs[0].grad.dtype == xs[0].dtype

    # A float32 round trip in the middle of a float64 check: a larger step keeps the
    # float32 rounding of x +- eps small against 2 * eps.
    gc = {"eps": 1e-2, "atol": 1e-4} if target == "float32" else {}
    return Case(f, [x], lambda a: a.astype(target), grad=differentiable, gc=gc, check=check)


def gen_where(data, dtype):
    sc, s0, s1 = data.draw(S.broadcastable_shapes(3, max_side=3), label="shapes")
    cond = data.draw(hnp.arrays(np.bool_, sc), label="cond")
    x0 = _array(data, s0, dtype)
    x1 = _array(data, s1, dtype)
    return Case(lambda c, a, b: F.where(c, a, b), [cond, x0, x1], np.where)


def _expanded(data, target):
    """A shape that broadcasting turns `target` into: extra leading dims, 1s expanded."""
    lead = data.draw(st.lists(st.integers(1, 3), max_size=2), label="lead")
    body = [d if d != 1 else data.draw(st.integers(1, 3), label="expand") for d in target]
    return tuple(lead) + tuple(body)


def gen_sum_to(data, dtype):
    target = _shape(data, max_dims=2)
    big = _expanded(data, target)
    x = _array(data, big, dtype)
    lead = len(big) - len(target)

    def ref(a):
        a = a.sum(axis=tuple(range(lead)))
        return a.sum(axis=tuple(i for i, d in enumerate(target) if d == 1), keepdims=True)

    return Case(lambda v: F.SumTo(target)(v), [x], ref)


def gen_broadcast_to(data, dtype):
    small = _shape(data, max_dims=2)
    big = _expanded(data, small)
    x = _array(data, small, dtype)
    return Case(lambda v: F.BroadcastTo(big)(v), [x],
                lambda a: np.array(np.broadcast_to(a, big)))


def gen_reshape(data, dtype):
    shape = _shape(data)
    size = int(np.prod(shape))
    new = data.draw(st.sampled_from([(size,), (1, size), (size, 1), shape[::-1], (-1, 1),
                                     (1, -1, 1)]), label="new_shape")
    resolved = np.zeros(shape).reshape(new).shape
    x = _array(data, shape, dtype)
    return Case(lambda v: F.Reshape(resolved)(v), [x], lambda a: a.reshape(new))


def gen_transpose(data, dtype):
    shape = _shape(data)
    axes = data.draw(st.one_of(st.none(), st.permutations(range(len(shape))).map(tuple)),
                     label="axes")
    if axes is not None and data.draw(st.booleans(), label="negative"):
        axes = tuple(a - len(shape) for a in axes)
    x = _array(data, shape, dtype)
    return Case(lambda v: F.transpose(v, axes), [x], lambda a: np.transpose(a, axes))


@st.composite
def index_keys(draw, shape, max_arrays=1):
    """A NumPy basic/advanced index for `shape`: ints, slices, index arrays, None, ..."""
    key, n_arrays = [], 0
    n_axes = draw(st.integers(1, len(shape)))
    for d in shape[:n_axes]:
        kinds = ["slice", "int", "full"] + (["array"] if n_arrays < max_arrays else [])
        kind = draw(st.sampled_from(kinds))
        if kind == "int":
            key.append(draw(st.integers(-d, d - 1)))
        elif kind == "full":
            key.append(slice(None))
        elif kind == "array":
            n_arrays += 1
            key.append(np.array(draw(st.lists(st.integers(-d, d - 1), min_size=1,
                                              max_size=4))))
        else:
            bound = st.one_of(st.none(), st.integers(-d - 1, d + 1))
            step = draw(st.sampled_from([None, 1, 2, -1, -2]))
            key.append(slice(draw(bound), draw(bound), step))
    extra = draw(st.sampled_from(["none", "newaxis", "ellipsis"]))
    if extra == "newaxis":
        key.insert(draw(st.integers(0, len(key))), None)
    elif extra == "ellipsis":
        key.append(Ellipsis)        # the drawn entries index the leading axes
    return key[0] if len(key) == 1 and draw(st.booleans()) else tuple(key)


def gen_get_item(data, dtype):
    shape = _shape(data, min_dims=1)
    key = data.draw(index_keys(shape), label="key")
    x = _array(data, shape, dtype)
    return Case(lambda v: v[key], [x], lambda a: np.asarray(a[key]))


def gen_get_item_grad(data, dtype):
    shape = _shape(data, min_dims=1)
    key = data.draw(index_keys(shape), label="key")
    template, arrays = F._split_index(key)
    out_shape = np.zeros(shape)[key].shape
    gy = _array(data, out_shape, dtype)

    def ref(g):
        gx = np.zeros(shape, g.dtype)
        np.add.at(gx, key, g)
        return gx

    return Case(lambda g: F.GetItemGrad(template, shape)(g, *arrays), [gy], ref)


def gen_matmul(data, dtype):
    b0, b1 = data.draw(S.broadcastable_shapes(2, max_dims=2, max_side=2), label="batch")
    m, k, n = (data.draw(st.integers(1, 3), label="mkn") for _ in range(3))
    x = _array(data, b0 + (m, k), dtype)
    w = _array(data, b1 + (k, n), dtype)
    return Case(lambda a, b: F.MatMul()(a, b), [x, w], np.matmul)


def gen_concat(data, dtype):
    shape = _shape(data, min_dims=1)
    axis = data.draw(st.integers(0, len(shape) - 1), label="axis")
    sizes = data.draw(st.lists(st.integers(1, 3), min_size=1, max_size=3), label="sizes")
    xs = [_array(data, shape[:axis] + (k,) + shape[axis + 1:], dtype) for k in sizes]
    return Case(lambda *vs: F.Concat(axis)(*vs), xs,
                lambda *a: np.concatenate(a, axis=axis))


def gen_random_uniform(data, dtype):
    shape = _shape(data)
    seed = data.draw(st.integers(0, 2 ** 16), label="seed")

    def f():
        np.random.seed(seed)
        return F.random_uniform(shape)

    def ref():
        np.random.seed(seed)
        return np.asarray(np.random.rand(*shape))

    def check(xs, y):
        assert y.creator is not None and y.creator.inputs == []
        y.backward()            # no inputs: nothing to do, and no error

    return Case(f, [], ref, grad=False, check=check)


def gen_random_seed(data, dtype):
    shape = _shape(data)
    seed = data.draw(st.integers(0, 2 ** 16), label="seed")

    def f():
        F.RandomSeed(seed)()          # what np.random.seed records inside a trace
        return F.random_uniform(shape)

    def ref():
        np.random.seed(seed)
        return np.asarray(np.random.rand(*shape))

    def check(xs, y):
        assert y.creator.inputs == []
        after = np.random.get_state()[1].copy()
        f()
        assert np.array_equal(np.random.get_state()[1], after)   # the same stream again

    return Case(f, [], ref, grad=False, check=check)


# ---------------------------------------------------------------- convolution (ops/conv.py)

def _conv_window(data, channels=True):
    """x's shape and a (kernel, stride, pad) whose output is at least 1x1."""
    N, C = data.draw(st.integers(1, 2), label="N"), data.draw(st.integers(1, 2), label="C")
    H, W = data.draw(st.integers(1, 5), label="H"), data.draw(st.integers(1, 5), label="W")
    k = (data.draw(st.integers(1, 3), label="KH"), data.draw(st.integers(1, 3), label="KW"))
    s = (data.draw(st.integers(1, 2), label="SH"), data.draw(st.integers(1, 2), label="SW"))
    p = (data.draw(st.integers(0, 1), label="PH"), data.draw(st.integers(0, 1), label="PW"))
    oh, ow = (H + 2 * p[0] - k[0]) // s[0] + 1, (W + 2 * p[1] - k[1]) // s[1] + 1
    assume(oh >= 1 and ow >= 1)
    return (N, C, H, W), k, s, p, (oh, ow)


def _ref_cols(x, k, s, p):
    # Naive patches (N, C, KH, KW, OH, OW) of the zero-padded image.
    N, C, H, W = x.shape
    xp = np.pad(x, ((0, 0), (0, 0), (p[0], p[0]), (p[1], p[1])))
    oh, ow = (H + 2 * p[0] - k[0]) // s[0] + 1, (W + 2 * p[1] - k[1]) // s[1] + 1
    col = np.zeros((N, C, k[0], k[1], oh, ow), x.dtype)
    for i in range(oh):
        for j in range(ow):
            col[..., i, j] = xp[:, :, i * s[0]:i * s[0] + k[0], j * s[1]:j * s[1] + k[1]]
    return col


def _ref_uncols(col, shape, s, p):
    N, C, KH, KW, oh, ow = col.shape
    img = np.zeros((N, C, shape[2] + 2 * p[0], shape[3] + 2 * p[1]), col.dtype)
    for i in range(oh):
        for j in range(ow):
            img[:, :, i * s[0]:i * s[0] + KH, j * s[1]:j * s[1] + KW] += col[..., i, j]
    return img[:, :, p[0]:p[0] + shape[2], p[1]:p[1] + shape[3]]


def _as_matrix(col):
    N, C, KH, KW, oh, ow = col.shape
    return col.transpose(0, 4, 5, 1, 2, 3).reshape(N * oh * ow, -1)


def gen_im2col(data, dtype):
    shape, k, s, p, _ = _conv_window(data)
    tm = data.draw(st.booleans(), label="to_matrix")
    x = _array(data, shape, dtype)
    return Case(lambda a: F.Im2col(k, s, p, tm)(a), [x],
                lambda a: _as_matrix(_ref_cols(a, k, s, p)) if tm else _ref_cols(a, k, s, p))


def gen_col2im(data, dtype):
    shape, k, s, p, (oh, ow) = _conv_window(data)
    tm = data.draw(st.booleans(), label="to_matrix")
    col6 = (shape[0], shape[1]) + k + (oh, ow)
    col = _array(data, col6, dtype)
    if tm:
        # Contiguous: gradcheck perturbs a non-contiguous input through a reshape copy
        # (its numeric gradient came out 0; reported).
        col = np.ascontiguousarray(_as_matrix(col))

    def ref(c):
        if tm:
            c = c.reshape(shape[0], oh, ow, shape[1], k[0], k[1]).transpose(0, 3, 4, 5, 1, 2)
        return _ref_uncols(c, shape, s, p)
    return Case(lambda c: F.Col2im(shape, k, s, p, tm)(c), [col], ref)


def gen_conv2d(data, dtype):
    shape, k, s, p, _ = _conv_window(data)
    OC = data.draw(st.integers(1, 2), label="OC")
    x = _array(data, shape, dtype)
    W = _array(data, (OC, shape[1]) + k, dtype)
    return Case(lambda a, b: F.Conv2d(s, p)(a, b), [x, W],
                lambda a, b: np.einsum("nckluv,ockl->nouv", _ref_cols(a, k, s, p), b))


def gen_deconv2d(data, dtype):
    # x is the conv2d output's size; the deconv maps it back onto the input's size.
    shape, k, s, p, (oh, ow) = _conv_window(data)
    OC = data.draw(st.integers(1, 2), label="OC")
    x = _array(data, (shape[0], OC, oh, ow), dtype)
    W = _array(data, (OC, shape[1]) + k, dtype)

    def ref(a, b):
        col = np.einsum("nchw,cokl->noklhw", a, b)
        return _ref_uncols(col, shape, s, p)
    return Case(lambda a, b: F.Deconv2d(s, p, shape[2:])(a, b), [x, W], ref)


def gen_conv2d_grad_w(data, dtype):
    shape, k, s, p, (oh, ow) = _conv_window(data)
    OC = data.draw(st.integers(1, 2), label="OC")
    x = _array(data, shape, dtype)
    gy = _array(data, (shape[0], OC, oh, ow), dtype)
    return Case(lambda a, g: F.Conv2DGradW(k, s, p)(a, g), [x, gy],
                lambda a, g: np.einsum("nckluv,nouv->ockl", _ref_cols(a, k, s, p), g))


def _pool_inputs(data, dtype):
    # Distinct values off the grid's zero: no ties within a window, nor with padding.
    shape, k, s, p, out = _conv_window(data)
    x = data.draw(S.distinct_arrays(shape, dtype, offset=0.125), label="x")
    return x, k, s, p, out


def _ref_argmax_pool(x, z, k, s, p):
    # z at x's window argmax (padding counts as 0 in the max and gives 0).
    cx = _ref_cols(x, k, s, p)
    cz = _ref_cols(z, k, s, p)
    N, C = x.shape[:2]
    oh, ow = cx.shape[4:]
    cx, cz = cx.reshape(N, C, -1, oh, ow), cz.reshape(N, C, -1, oh, ow)
    idx = cx.argmax(axis=2)[:, :, None]
    return np.take_along_axis(cz, idx, axis=2)[:, :, 0]


def gen_pooling(data, dtype):
    x, k, s, p, _ = _pool_inputs(data, dtype)
    return Case(lambda a: F.Pooling(k, s, p)(a), [x],
                lambda a: _ref_cols(a, k, s, p).max(axis=(2, 3)))


def gen_pooling2d_grad(data, dtype):
    # Linear in gy; x (closed over, constant) picks where each gy goes.
    x, k, s, p, out = _pool_inputs(data, dtype)
    gy = _array(data, x.shape[:2] + out, dtype)

    def ref(g):
        cx = _ref_cols(x, k, s, p)
        N, C = x.shape[:2]
        flat = cx.reshape(N, C, -1, *out)
        hot = flat == flat.max(axis=2, keepdims=True)
        return _ref_uncols((hot * g[:, :, None]).reshape(cx.shape), x.shape, s, p)
    return Case(lambda g: F.Pooling2DGrad(k, s, p)(x, g), [gy], ref)


def gen_pooling2d_with_indexes(data, dtype):
    x, k, s, p, _ = _pool_inputs(data, dtype)
    z = _array(data, x.shape, dtype)
    return Case(lambda c: F.Pooling2DWithIndexes(k, s, p)(x, c), [z],
                lambda c: _ref_argmax_pool(x, c, k, s, p))


def gen_average_pooling(data, dtype):
    shape, k, s, p, _ = _conv_window(data)
    x = _array(data, shape, dtype)
    return Case(lambda a: F.AveragePooling(k, s, p)(a), [x],
                lambda a: _ref_cols(a, k, s, p).mean(axis=(2, 3)))


CASES = {
    "Neg": unary("Neg", F.neg, np.negative),
    "Exp": unary("Exp", F.exp, np.exp),
    "Log": unary("Log", F.log, np.log),
    "Sin": unary("Sin", F.sin, np.sin),
    "Cos": unary("Cos", F.cos, np.cos),
    "Tanh": unary("Tanh", F.tanh, np.tanh),
    "Sqrt": unary("Sqrt", F.sqrt, np.sqrt),
    "Abs": unary("Abs", F.abs, np.abs),
    "Sign": unary("Sign", F.sign, np.sign),
    "Sigmoid": unary("Sigmoid", F.sigmoid, lambda a: 1 / (1 + np.exp(-a))),
    "ReLU": unary("ReLU", F.relu, lambda a: np.maximum(a, a.dtype.type(0))),
    "LeakyReLU": gen_leaky_relu,
    "Pow": gen_pow,
    "Clip": gen_clip,
    "Cast": gen_cast,
    "Add": binary("Add", lambda a, b: a + b, np.add),
    "Sub": binary("Sub", lambda a, b: a - b, np.subtract),
    "Mul": binary("Mul", lambda a, b: a * b, np.multiply),
    "Div": binary("Div", lambda a, b: a / b, np.divide),
    "PowV": binary("PowV", lambda a, b: a ** b, np.power),
    "Maximum": untied(F.maximum, np.maximum),
    "Minimum": untied(F.minimum, np.minimum),
    "Greater": untied(lambda a, b: a > b, np.greater),
    "GreaterEqual": untied(lambda a, b: a >= b, np.greater_equal),
    "Less": untied(lambda a, b: a < b, np.less),
    "LessEqual": untied(lambda a, b: a <= b, np.less_equal),
    "Equal": tied(F.equal, np.equal),
    "NotEqual": tied(F.not_equal, np.not_equal),
    "Where": gen_where,
    "Sum": reduction(F.sum, np.sum, distinct=False),
    "Max": reduction(F.max, np.max, distinct=True),
    "Min": reduction(F.min, np.min, distinct=True),
    "SumTo": gen_sum_to,
    "Reshape": gen_reshape,
    "Transpose": gen_transpose,
    "BroadcastTo": gen_broadcast_to,
    "GetItem": gen_get_item,
    "GetItemGrad": gen_get_item_grad,
    "MatMul": gen_matmul,
    "Concat": gen_concat,
    "RandomUniform": gen_random_uniform,
    "RandomSeed": gen_random_seed,
    "Im2col": gen_im2col,
    "Col2im": gen_col2im,
    "Conv2d": gen_conv2d,
    "Deconv2d": gen_deconv2d,
    "Conv2DGradW": gen_conv2d_grad_w,
    "Pooling": gen_pooling,
    "Pooling2DGrad": gen_pooling2d_grad,
    "Pooling2DWithIndexes": gen_pooling2d_with_indexes,
    "AveragePooling": gen_average_pooling,
}


# ---------------------------------------------------------------- the registry

def test_every_primitive_has_a_property_test():
    missing = sorted(set(F.PRIMITIVES) - set(CASES))
    stale = sorted(set(CASES) - set(F.PRIMITIVES))
    assert not missing, f"primitives without a property test in CASES: {missing}"
    assert not stale, f"CASES entries for primitives that no longer exist: {stale}"


@pytest.mark.parametrize("name", sorted(F.PRIMITIVES))
def test_elementwise_primitive_has_expr(name):
    cls = F.PRIMITIVES[name]
    if cls.kind != ELEMENTWISE:
        assert cls.kind in ("reduction", "movement", "matmul", "random", "opaque")
        return
    assert isinstance(cls.expr, str) and cls.expr, f"{name} is elementwise but has no expr"
    # The expression formats with operand names and the static parameters it names.
    text = cls.expr.format("a", "b", "c", **{p: 1.5 for p in cls.params})
    assert "{" not in text


# ---------------------------------------------------------------- every primitive

@pytest.mark.parametrize("name", sorted(CASES))
@given(data=st.data())
def test_primitive_properties(name, data):
    """Forward vs NumPy, shape rule vs forward, gradients (orders 1, 2), in f64 and f32."""
    dtype = data.draw(st.sampled_from(FLOATS), label="dtype")
    run_case(CASES[name](data, dtype))


# ---------------------------------------------------------------- dtypes

@pytest.mark.parametrize("op", ["+", "-", "*", "/", "**"])
@pytest.mark.parametrize("scalar", [2, 2.5, True])
def test_float32_with_python_scalar_stays_float32(op, scalar):
    x = tj.Variable(np.array([0.5, 1.5, 2.0], np.float32))
    a = x.data
    for y, ref in [(eval(f"x {op} scalar"), eval(f"a {op} scalar")),
                   (eval(f"scalar {op} x"), eval(f"scalar {op} a"))]:
        assert ref.dtype == np.float32
        assert y.dtype == np.float32
        np.testing.assert_allclose(y.data, ref, rtol=1e-6)


@pytest.mark.parametrize("op", ["+", "-", "*", "/"])
def test_numpy_scalar_operands_promote_like_numpy(op):
    x = tj.Variable(np.array([0.5, 1.5], np.float32))
    for s in [np.float32(2.0), np.float64(2.0)]:
        y = eval(f"x {op} s")
        assert y.dtype == eval(f"x.data {op} s").dtype


@given(data=st.data())
def test_float32_gradients_stay_float32(data):
    f, xs = data.draw(S.programs(dtype=np.float32), label="program")
    vs = [tj.Variable(x) for x in xs]
    y = f(*vs)
    assert y.dtype == np.float32
    F.sum(y).backward()
    for v in vs:
        assert v.grad is None or v.grad.dtype == np.float32


def test_float32_mixed_functions_stay_float32():
    x = tj.Variable(np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3))
    for y in [F.maximum(x, 0.0), F.minimum(0.0, x), F.where(x > 0, x, 0.0), F.clip(x, -0.5, 0.5),
              F.mean(x), F.softmax(x), F.log_softmax(x), F.leaky_relu(x, 0.3),
              F.sigmoid(x), F.dropout(x, 0.3), F.mean_squared_error(x, x * 2), (x * x) ** 0.5]:
        assert y.dtype == np.float32, y


# ---------------------------------------------------------------- broadcasting

@given(shapes=S.broadcastable_shapes(2, max_side=4))
def test_broadcast_gradients_sum_to_input_shape(shapes):
    s0, s1 = shapes
    x0 = tj.Variable(np.ones(s0))
    x1 = tj.Variable(np.full(s1, 2.0))
    y = x0 * x1 + x0 - x1 / 4
    y.backward()
    out = np.broadcast_shapes(s0, s1)
    n0 = int(np.prod(out)) // max(int(np.prod(s0)), 1)
    n1 = int(np.prod(out)) // max(int(np.prod(s1)), 1)
    assert x0.grad.shape == s0 and x1.grad.shape == s1
    np.testing.assert_allclose(x0.grad.data, np.full(s0, n0 * 3.0))
    np.testing.assert_allclose(x1.grad.data, np.full(s1, n1 * 0.75))


@pytest.mark.parametrize("fn", [F.add, F.sub, F.mul, F.div, F.maximum, F.where])
def test_broadcast_mismatch_names_shapes(fn):
    a, b = tj.Variable(np.ones((2, 3))), tj.Variable(np.ones((4,)))
    with pytest.raises(ValueError, match=r"\(2, 3\).*\(4,\)"):
        if fn is F.where:
            fn(np.ones((2, 3), bool), a, b)
        else:
            fn(a, b)


# ---------------------------------------------------------------- composites

def _log_softmax_ref(a, axis):
    m = a.max(axis=axis, keepdims=True)
    z = a - m
    return z - np.log(np.exp(z).sum(axis=axis, keepdims=True))


@given(data=st.data())
def test_softmax_and_log_softmax(data):
    dtype = data.draw(st.sampled_from(FLOATS))
    x = _array(data, _shape(data, min_dims=2, max_dims=3), dtype, safe=S.SafeRange(-4, 4))
    axis = data.draw(st.integers(-x.ndim, x.ndim - 1))
    ls = F.log_softmax(x, axis=axis)
    sm = F.softmax(x, axis=axis)
    ref = _log_softmax_ref(x, axis)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    assert ls.dtype == dtype and sm.dtype == dtype
    np.testing.assert_allclose(ls.data, ref, rtol=tol, atol=tol)
    np.testing.assert_allclose(sm.data, np.exp(ref), rtol=tol, atol=tol)
    np.testing.assert_allclose(sm.data.sum(axis=axis), 1.0, rtol=tol * 10)
    gradcheck(lambda v: F.softmax(v, axis=axis), x, second_order=True)
    gradcheck(lambda v: F.log_softmax(v, axis=axis), x, second_order=True)


def test_softmax_large_logits_do_not_overflow():
    x = tj.Variable(np.array([[1000.0, 0.0, -1000.0]]))
    np.testing.assert_allclose(F.softmax(x).data, [[1.0, 0.0, 0.0]])
    assert np.isfinite(F.log_softmax(x).data).all()


@given(data=st.data())
def test_mean_squared_error(data):
    dtype = data.draw(st.sampled_from(FLOATS))
    shape = _shape(data, min_dims=1)
    x0, x1 = _array(data, shape, dtype), _array(data, shape, dtype)
    y = F.mean_squared_error(x0, x1)
    _assert_close(y, np.asarray(((x0 - x1) ** 2).sum() / len(x0)))
    gradcheck(F.mean_squared_error, x0, x1, second_order=True)


@given(data=st.data())
def test_softmax_cross_entropy(data):
    dtype = data.draw(st.sampled_from(FLOATS))
    n, c = data.draw(st.integers(1, 4)), data.draw(st.integers(1, 4))
    x = _array(data, (n, c), dtype, safe=S.SafeRange(-4, 4))
    t = data.draw(hnp.arrays(np.int64, (n,), elements=st.integers(0, c - 1)))
    ref = -_log_softmax_ref(x.astype(np.float64), 1)[np.arange(n), t].mean()
    y = F.softmax_cross_entropy(x, t)
    assert y.dtype == dtype and y.shape == ()
    np.testing.assert_allclose(y.data, ref, rtol=1e-5 if dtype == np.float32 else 1e-12)
    gradcheck(F.softmax_cross_entropy, x, t, second_order=True)
    gradcheck(F.softmax_cross_entropy, x, tj.Variable(t.reshape(n, 1)))


def test_softmax_cross_entropy_shape_error():
    with pytest.raises(ValueError, match=r"\(3, 2\).*\(4,\)"):
        F.softmax_cross_entropy(np.zeros((3, 2)), np.zeros(4, np.int64))


@given(data=st.data())
def test_sigmoid_cross_entropy(data):
    dtype = data.draw(st.sampled_from(FLOATS))
    shape = _shape(data, min_dims=1, max_dims=2)
    x = _array(data, shape, dtype, safe=S.SafeRange(-3, 3))
    # Int labels promote a float32 x to float64, as in NumPy; float labels keep its dtype.
    t_dtype = data.draw(st.sampled_from([np.int64, dtype]))
    t = data.draw(hnp.arrays(np.int64, shape, elements=st.integers(0, 1))).astype(t_dtype)
    p = 1 / (1 + np.exp(-x.astype(np.float64)))
    ref = -(t * np.log(p) + (1 - t) * np.log(1 - p)).sum() / len(x)
    y = F.sigmoid_cross_entropy(x, t)
    assert y.shape == () and y.dtype == np.result_type(x, t)
    np.testing.assert_allclose(y.data, ref, rtol=1e-4 if dtype == np.float32 else 1e-10)
    gradcheck(lambda v: F.sigmoid_cross_entropy(v, t), x, second_order=True,
              check_dtype=t.dtype == dtype)


@given(data=st.data())
def test_binary_cross_entropy(data):
    dtype = data.draw(st.sampled_from(FLOATS))
    shape = _shape(data, min_dims=1, max_dims=2)
    p = _array(data, shape, dtype, safe=S.SafeRange(0.05, 0.95))
    t_dtype = data.draw(st.sampled_from([np.int64, dtype]))
    t = data.draw(hnp.arrays(np.int64, shape, elements=st.integers(0, 1))).astype(t_dtype)
    p64 = p.astype(np.float64)
    ref = -(t * np.log(p64) + (1 - t) * np.log(1 - p64)).sum() / len(p)
    y = F.binary_cross_entropy(p, t)
    assert y.shape == () and y.dtype == np.result_type(p, t)
    np.testing.assert_allclose(y.data, ref, rtol=1e-4 if dtype == np.float32 else 1e-10)
    gradcheck(lambda v: F.binary_cross_entropy(v, t), p, second_order=True,
              check_dtype=t.dtype == dtype)


@given(data=st.data())
def test_accuracy(data):
    n, c = data.draw(st.integers(1, 6)), data.draw(st.integers(1, 4))
    y = data.draw(S.distinct_arrays((n, c)))
    t = data.draw(hnp.arrays(np.int64, (n,), elements=st.integers(0, c - 1)))
    acc = F.accuracy(tj.Variable(y), t)
    assert isinstance(acc, tj.Variable) and acc.shape == ()
    assert float(acc.data) == pytest.approx((y.argmax(axis=1) == t).mean())


@given(data=st.data())
def test_mean_and_average(data):
    dtype = data.draw(st.sampled_from(FLOATS))
    x = _array(data, _shape(data, min_dims=1), dtype)
    axis = _axis(data, x.ndim)
    keepdims = data.draw(st.booleans())
    for fn in (F.mean, F.average):
        _assert_close(fn(x, axis=axis, keepdims=keepdims),
                      np.asarray(np.mean(x, axis=axis, keepdims=keepdims)))
    gradcheck(lambda v: F.mean(v, axis=axis, keepdims=keepdims), x, second_order=True)
    _assert_close(tj.Variable(x).mean(axis, keepdims), np.asarray(x.mean(axis, keepdims=keepdims)))


@given(data=st.data())
def test_linear(data):
    dtype = data.draw(st.sampled_from(FLOATS))
    n, i, o = (data.draw(st.integers(1, 4)) for _ in range(3))
    x, W = _array(data, (n, i), dtype), _array(data, (i, o), dtype)
    b = data.draw(st.one_of(st.none(), S.arrays((o,), dtype)))
    ref = x @ W + (0 if b is None else b)
    _assert_close(F.linear(x, W, b), ref.astype(dtype))
    if b is None:
        gradcheck(lambda a, w: F.linear(a, w), x, W, second_order=True)
    else:
        gradcheck(F.linear, x, W, b, second_order=True)


MATMUL_SHAPES = [((3,), (3,)), ((3,), (3, 2)), ((2, 3), (3,)), ((4, 2, 3), (3,)),
                 ((3,), (4, 3, 2)), ((4, 2, 3), (3, 5)), ((2, 3), (4, 3, 5)),
                 ((4, 1, 2, 3), (5, 3, 2)), ((1, 1), (1, 1))]


@pytest.mark.parametrize("s0,s1", MATMUL_SHAPES, ids=str)
@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: d.__name__)
def test_matmul_vectors_and_batches(s0, s1, dtype):
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal(s0).astype(dtype), rng.standard_normal(s1).astype(dtype)
    for y in (F.matmul(a, b), tj.Variable(a) @ b, a @ tj.Variable(b), F.dot(a, b)):
        _assert_close(y, np.matmul(a, b))
    gradcheck(F.matmul, a, b, second_order=True)


def test_matmul_mismatch_names_both_shapes():
    with pytest.raises(ValueError, match=r"\(2, 3\).*\(4, 5\)"):
        F.matmul(np.ones((2, 3)), np.ones((4, 5)))


@given(data=st.data())
def test_get_item_with_two_index_arrays(data):
    shape = _shape(data, min_dims=2)
    n = data.draw(st.integers(1, 4))
    i0 = data.draw(hnp.arrays(np.int64, (n,), elements=st.integers(0, shape[0] - 1)))
    i1 = data.draw(hnp.arrays(np.int64, (n,), elements=st.integers(-shape[-1], shape[-1] - 1)))
    x = _array(data, shape, np.float64)
    key = (i0, slice(None), i1) if len(shape) == 3 else (i0, i1)   # i1 indexes the last axis
    _assert_close(F.get_item(x, key), x[key])
    gradcheck(lambda v: v[key], x, second_order=True)
    # An index Variable is an input, not a constant, and gets no gradient.
    iv = tj.Variable(i0)
    y = F.get_item(tj.Variable(x), (iv,))
    _assert_close(y, x[i0])
    y.backward()
    assert iv.grad is None


def test_get_item_boolean_mask():
    x = np.arange(6.0).reshape(2, 3)
    mask = x > 2.5
    _assert_close(F.get_item(x, mask), x[mask])
    gradcheck(lambda v: v[mask], x)


@given(data=st.data())
def test_expand_dims_and_flatten(data):
    dtype = data.draw(st.sampled_from(FLOATS))
    x = _array(data, _shape(data, min_dims=1), dtype)
    axis = data.draw(st.integers(-x.ndim - 1, x.ndim))
    _assert_close(F.expand_dims(x, axis), np.expand_dims(x, axis))
    _assert_close(F.flatten(x), x.reshape(len(x), -1))
    gradcheck(lambda v: F.expand_dims(v, axis), x)
    gradcheck(F.flatten, x)


@given(data=st.data())
def test_dropout_train_and_test_mode(data):
    dtype = data.draw(st.sampled_from(FLOATS))
    x = _array(data, _shape(data), dtype)
    ratio = data.draw(st.sampled_from([0.0, 0.2, 0.5, 0.9]))
    seed = data.draw(st.integers(0, 2 ** 16))
    np.random.seed(seed)
    y = F.dropout(x, ratio)
    np.random.seed(seed)
    mask = np.random.rand(*x.shape) > ratio
    ref = x * mask / dtype(1.0 - ratio)
    assert y.dtype == dtype
    np.testing.assert_allclose(y.data, ref, rtol=1e-6)

    def f(v):
        np.random.seed(seed)        # the same mask on every evaluation
        return F.dropout(v, ratio)

    gradcheck(f, x, second_order=True)
    with tj.test_mode():
        state = np.random.get_state()[1].copy()
        y = F.dropout(x, ratio)
        assert np.array_equal(np.random.get_state()[1], state), "test mode drew numbers"
    np.testing.assert_array_equal(y.data, x)


def test_maximum_minimum_where_with_scalars():
    x = np.array([-1.0, 0.5, 2.0])
    _assert_close(F.maximum(x, 0.0), np.maximum(x, 0.0))
    _assert_close(F.minimum(1.0, x), np.minimum(1.0, x))
    _assert_close(F.where(x > 0, x, -1.0), np.where(x > 0, x, -1.0))
    _assert_close(F.where(x > 0, 3.0, x), np.where(x > 0, 3.0, x))
    gradcheck(lambda v: F.maximum(v, 0.0) + F.where(v > 0, 3.0, v), x, second_order=True)


def test_max_min_ties_share_gradient():
    # DeZero's rule: every element equal to the maximum receives the gradient.
    x = tj.Variable(np.array([1.0, 3.0, 3.0, 2.0]))
    F.max(x).backward()
    np.testing.assert_array_equal(x.grad.data, [0, 1, 1, 0])
    x = tj.Variable(np.array([[1.0, 0.0], [0.0, 2.0]]))
    F.min(x, axis=1).backward()
    np.testing.assert_array_equal(x.grad.data, [[0, 1], [1, 0]])


# ---------------------------------------------------------------- programs

@given(prog=S.programs())
def test_random_programs_gradcheck(prog):
    f, xs = prog
    y = f(*[tj.Variable(x) for x in xs])
    assert np.all(np.isfinite(y.data))
    gradcheck(f, *xs, second_order=True)
