"""DeZero's convolution functions (functions_conv): im2col, col2im, conv2d, deconv2d,
max and average pooling, their *_simple versions and Function classes.

Values against naive loop references over drawn shapes, strides and paddings;
gradients (first and second order, float64 and float32) against central differences;
jit against eager over several calls with new values, with no fallback allowed.
"""
import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import tracejit as tj
import tracejit.functions as F
from tracejit import functions_conv
from tracejit.testing import assert_jit_matches_eager, gradcheck

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")

# Each example runs several first- and second-order gradient checks: fewer examples
# than the profile's default keep the file within seconds.
few = settings(max_examples=12)


# ---------------------------------------------------------------- naive references

def _outsize(h, k, s, p):
    return (h + 2 * p - k) // s + 1


def ref_im2col(x, k, s, p):
    N, C, H, W = x.shape
    xp = np.pad(x, ((0, 0), (0, 0), (p[0], p[0]), (p[1], p[1])))
    oh, ow = _outsize(H, k[0], s[0], p[0]), _outsize(W, k[1], s[1], p[1])
    col = np.zeros((N, C, k[0], k[1], oh, ow), x.dtype)
    for i in range(oh):
        for j in range(ow):
            col[:, :, :, :, i, j] = xp[:, :, i * s[0]:i * s[0] + k[0],
                                       j * s[1]:j * s[1] + k[1]]
    return col


def ref_col2im(col, shape, s, p):
    N, C, KH, KW, oh, ow = col.shape
    img = np.zeros((N, C, shape[2] + 2 * p[0], shape[3] + 2 * p[1]), col.dtype)
    for i in range(oh):
        for j in range(ow):
            img[:, :, i * s[0]:i * s[0] + KH, j * s[1]:j * s[1] + KW] += col[..., i, j]
    return img[:, :, p[0]:p[0] + shape[2], p[1]:p[1] + shape[3]]


def ref_conv(x, W, b, s, p):
    col = ref_im2col(x, W.shape[2:], s, p)
    y = np.einsum("nckluv,ockl->nouv", col, W)
    return y if b is None else y + b[None, :, None, None]


def ref_deconv(x, W, s, p, outsize):
    # Every input pixel's kernel-weighted copy added into the (padded) output.
    N, C, H, Wd = x.shape
    _, OC, KH, KW = W.shape
    col = np.einsum("nchw,cokl->noklhw", x, W)
    return ref_col2im(col, (N, OC) + tuple(outsize), s, p)


def ref_pool(x, k, s, p, op):
    col = ref_im2col(x, k, s, p)
    return op(col, axis=(2, 3))


# ---------------------------------------------------------------- drawn problems

@st.composite
def windows(draw, channels_out=False):
    """(x, kernel, stride, pad, rng) with an output of at least 1x1."""
    N = draw(st.integers(1, 2), label="N")
    C = draw(st.integers(1, 3), label="C")
    H = draw(st.integers(1, 6), label="H")
    W = draw(st.integers(1, 6), label="W")
    k = (draw(st.integers(1, 3), label="KH"), draw(st.integers(1, 3), label="KW"))
    s = (draw(st.integers(1, 3), label="SH"), draw(st.integers(1, 3), label="SW"))
    p = (draw(st.integers(0, 2), label="PH"), draw(st.integers(0, 2), label="PW"))
    assume(_outsize(H, k[0], s[0], p[0]) >= 1 and _outsize(W, k[1], s[1], p[1]) >= 1)
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 16), label="seed"))
    return rng.standard_normal((N, C, H, W)), k, s, p, rng


def _close(y, ref, dtype=np.float64):
    assert isinstance(y, tj.Variable) and y.dtype == dtype, (type(y), y.dtype)
    assert y.shape == ref.shape, (y.shape, ref.shape)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(y.data, ref, rtol=tol, atol=tol)


# ---------------------------------------------------------------- im2col / col2im

@few
@given(windows(), st.booleans())
def test_im2col_values_and_gradients(w, to_matrix):
    x, k, s, p, _ = w
    ref = ref_im2col(x, k, s, p)
    if to_matrix:
        ref = ref.transpose(0, 4, 5, 1, 2, 3).reshape(-1, x.shape[1] * k[0] * k[1])
    _close(F.im2col(x, k, s, p, to_matrix), ref)
    np.testing.assert_array_equal(F.im2col_array(x, k, s, p, to_matrix), ref)
    _close(F.im2col(x.astype(np.float32), k, s, p, to_matrix), ref, np.float32)
    gradcheck(lambda a: F.im2col(a, k, s, p, to_matrix), x, second_order=True)


@few
@given(windows(), st.booleans())
def test_col2im_values_and_gradients(w, to_matrix):
    x, k, s, p, rng = w
    col = rng.standard_normal(ref_im2col(x, k, s, p).shape)
    ref = ref_col2im(col, x.shape, s, p)
    if to_matrix:
        # Contiguous: gradcheck's numeric gradient reads a transposed array wrong.
        col = np.ascontiguousarray(
            col.transpose(0, 4, 5, 1, 2, 3).reshape(-1, x.shape[1] * k[0] * k[1]))
    _close(F.col2im(col, x.shape, k, s, p, to_matrix), ref)
    np.testing.assert_allclose(F.col2im_array(col, x.shape, k, s, p, to_matrix), ref,
                               rtol=1e-12, atol=1e-12)
    gradcheck(lambda c: F.col2im(c, x.shape, k, s, p, to_matrix), col, second_order=True)


# ---------------------------------------------------------------- conv2d / deconv2d

@few
@given(windows(), st.integers(1, 3), st.booleans())
def test_conv2d_values_and_gradients(w, OC, bias):
    x, k, s, p, rng = w
    W = rng.standard_normal((OC, x.shape[1]) + k)
    b = rng.standard_normal(OC) if bias else None
    ref = ref_conv(x, W, b, s, p)
    _close(F.conv2d(x, W, b, s, p), ref)
    _close(F.conv2d_simple(x, W, b, s, p), ref)
    _close(F.conv2d(x.astype(np.float32), W.astype(np.float32),
                    None if b is None else b.astype(np.float32), s, p), ref, np.float32)
    if bias:
        gradcheck(lambda a, v, c: F.conv2d(a, v, c, s, p), x, W, b, second_order=True)
    else:
        gradcheck(lambda a, v: F.conv2d(a, v, None, s, p), x, W, second_order=True)
    gradcheck(lambda a, v: F.conv2d_simple(a, v, None, s, p), x, W)


@few
@given(windows(), st.integers(1, 3), st.booleans(), st.booleans())
def test_deconv2d_values_and_gradients(w, OC, bias, explicit):
    img, k, s, p, rng = w
    # deconv2d maps conv2d's output size back onto its input size: x is a conv2d
    # output, outsize (when given) the image size, which a stride > 1 leaves open.
    oh, ow = _outsize(img.shape[2], k[0], s[0], p[0]), _outsize(img.shape[3], k[1], s[1],
                                                                  p[1])
    x = rng.standard_normal((img.shape[0], img.shape[1], oh, ow))
    outsize = img.shape[2:] if explicit else (s[0] * (oh - 1) + k[0] - 2 * p[0],
                                              s[1] * (ow - 1) + k[1] - 2 * p[1])
    assume(min(outsize) >= 1)
    W = rng.standard_normal((x.shape[1], OC) + k)
    b = rng.standard_normal(OC) if bias else None
    arg = outsize if explicit else None
    ref = ref_deconv(x, W, s, p, outsize)
    if bias:
        ref = ref + b[None, :, None, None]
    _close(F.deconv2d(x, W, b, s, p, arg), ref)
    gradcheck(lambda a, v: F.deconv2d(a, v, None, s, p, arg), x, W, second_order=True)
    if bias:
        gradcheck(lambda c: F.deconv2d(x, W, c, s, p, arg), b)


@few
@given(windows(), st.integers(1, 3))
def test_conv2d_grad_w_is_the_weight_gradient(w, OC):
    x, k, s, p, rng = w
    W = rng.standard_normal((OC, x.shape[1]) + k)
    gy = rng.standard_normal(ref_conv(x, W, None, s, p).shape)
    gW = F.Conv2DGradW(k, s, p)(x, gy)
    # <gy, conv(x, W)> is linear in W: its gradient is Conv2DGradW(x, gy).
    ref = np.einsum("nouv,nckluv->ockl", gy, ref_im2col(x, k, s, p))
    _close(gW, ref)
    gradcheck(lambda a, g: F.Conv2DGradW(k, s, p)(a, g), x, gy, second_order=True)


# ---------------------------------------------------------------- pooling

@few
@given(windows())
def test_pooling_values_and_gradients(w):
    x, k, s, p, _ = w
    ref = ref_pool(x, k, s, p, np.max)
    _close(F.pooling(x, k, s, p), ref)
    _close(F.pooling_simple(x, k, s, p), ref)
    _close(F.pooling(x.astype(np.float32), k, s, p), ref, np.float32)
    # Continuous random data: no two elements of a window tie, so the max is smooth.
    gradcheck(lambda a: F.pooling(a, k, s, p), x, second_order=True)
    gradcheck(lambda a: F.pooling_simple(a, k, s, p), x)


@few
@given(windows())
def test_pooling_grad_classes(w):
    x, k, s, p, rng = w
    gy = rng.standard_normal(ref_pool(x, k, s, p, np.max).shape)
    gx = F.Pooling2DGrad(k, s, p)(x, gy)
    # The gradient pooling's backward gives, computed by a loop over windows.
    col = ref_im2col(x, k, s, p)
    N, C, KH, KW, oh, ow = col.shape
    flat = col.reshape(N, C, KH * KW, oh, ow)
    gcol = np.zeros_like(flat)
    np.put_along_axis(gcol, flat.argmax(2)[:, :, None], gy[:, :, None], axis=2)
    _close(gx, ref_col2im(gcol.reshape(col.shape), x.shape, s, p))
    z = rng.standard_normal(x.shape)
    got = F.Pooling2DWithIndexes(k, s, p)(x, z)
    zcol = ref_im2col(z, k, s, p).reshape(flat.shape)
    _close(got, np.take_along_axis(zcol, flat.argmax(2)[:, :, None], 2)[:, :, 0])
    gradcheck(lambda g: F.Pooling2DGrad(k, s, p)(x, g), gy, second_order=True)
    gradcheck(lambda v: F.Pooling2DWithIndexes(k, s, p)(x, v), z, second_order=True)


@few
@given(windows())
def test_average_pooling_values_and_gradients(w):
    x, k, s, p, _ = w
    _close(F.average_pooling(x, k, s, p), ref_pool(x, k, s, p, np.mean))
    _close(F.average_pooling(x.astype(np.float32), k, s, p),
           ref_pool(x, k, s, p, np.mean), np.float32)
    gradcheck(lambda a: F.average_pooling(a, k, s, p), x, second_order=True)


# ---------------------------------------------------------------- DeZero's class forms

def test_dezero_class_forms():
    rng = np.random.default_rng(1)
    x = tj.Variable(rng.standard_normal((2, 3, 5, 5)))
    W = tj.Variable(rng.standard_normal((4, 3, 3, 3)))
    conv = F.Conv2d(2, 1)
    y = conv(x, W, None)                       # DeZero passes b=None explicitly
    np.testing.assert_allclose(y.data, ref_conv(x.data, W.data, None, (2, 2), (1, 1)))
    gy = rng.standard_normal(y.shape)
    # Conv2DGradW(conv) reads the window from a called Conv2d, as DeZero's does.
    np.testing.assert_allclose(F.Conv2DGradW(conv)(x, gy).data,
                               F.Conv2DGradW((3, 3), 2, 1)(x, gy).data)
    pool = F.Pooling(2, 2, 0)
    pool(x)
    assert F.Pooling2DGrad(pool).kernel_size == (2, 2)
    assert F.Pooling2DWithIndexes(pool).stride == (2, 2)
    # DeZero's call forms: Pooling2DGrad(pool)(gy), Pooling2DWithIndexes(pool)(z).
    gp = rng.standard_normal((2, 3, 2, 2))
    np.testing.assert_array_equal(F.Pooling2DGrad(pool)(gp).data,
                                  F.Pooling2DGrad(2, 2, 0)(x, gp).data)
    np.testing.assert_array_equal(F.Pooling2DWithIndexes(pool)(x).data, pool(x).data)
    assert functions_conv.conv2d is F.conv2d
    # The bias as the Function's third input, DeZero's form: values and gradients.
    b = rng.standard_normal(4)
    np.testing.assert_allclose(F.Conv2d(2, 1)(x, W, b).data, F.conv2d(x, W, b, 2, 1).data)
    gradcheck(lambda a, v, c: F.Conv2d(2, 1)(a, v, c), x, W, b, second_order=True,
              jit=True)
    Wd, bd = rng.standard_normal((3, 2, 3, 3)), rng.standard_normal(2)
    np.testing.assert_allclose(F.Deconv2d(2, 1)(x[:, :3], Wd, bd).data,
                               F.deconv2d(x[:, :3], Wd, bd, 2, 1).data)
    gradcheck(lambda a, v, c: F.Deconv2d(2, 1, (7, 8))(a, v, c), x.data[:, :3, :4, :4], Wd, bd,
              jit=True)
    for name in ["conv2d", "deconv2d", "conv2d_simple", "pooling", "pooling_simple",
                 "average_pooling", "im2col", "col2im", "im2col_array", "col2im_array",
                 "Conv2d", "Deconv2d", "Conv2DGradW", "Pooling", "Pooling2DGrad",
                 "Pooling2DWithIndexes", "AveragePooling", "Im2col", "Col2im"]:
        assert hasattr(functions_conv, name), name


@pytest.mark.parametrize("to_matrix", [True, False])
def test_results_are_fresh_writable_arrays(to_matrix):
    # A 1x1 window at stride 1 without padding: the patches are x itself, viewed.
    x = np.arange(6.).reshape(1, 1, 2, 3)
    for y in [F.im2col(x, 1, 1, 0, to_matrix), F.col2im(F.im2col(x, 1).data, x.shape, 1),
              F.conv2d(x, np.ones((1, 1, 1, 1))), F.pooling(x, 1), F.average_pooling(x, 1),
              F.deconv2d(x, np.ones((1, 1, 1, 1)))]:
        assert y.data.flags.writeable and not np.shares_memory(y.data, x)
        y.data += 1
    np.testing.assert_array_equal(x, np.arange(6.).reshape(1, 1, 2, 3))


def test_conv2d_backward_twice_and_shape_rules():
    # eval_shape runs the shape rules only: they must give forward's shapes and dtypes.
    x = np.zeros((2, 3, 7, 6), np.float32)
    W = np.zeros((5, 3, 3, 2), np.float32)
    spec = tj.eval_shape(lambda a, v: F.pooling(F.conv2d(a, v, None, 2, 1), 2, 1), x, W)
    y = F.pooling(F.conv2d(x, W, None, 2, 1), 2, 1)
    assert (spec.shape, spec.dtype) == (y.shape, y.dtype)


@pytest.mark.parametrize("call, message", [
    (lambda: F.conv2d(np.zeros((1, 3, 4, 4)), np.zeros((2, 2, 3, 3))), "C differs"),
    (lambda: F.conv2d(np.zeros((3, 4, 4)), np.zeros((2, 3, 3, 3))), "4-D"),
    (lambda: F.conv2d(np.zeros((1, 3, 2, 2)), np.zeros((2, 3, 3, 3))), "does not fit"),
    (lambda: F.conv2d(np.zeros((1, 3, 4, 4)), np.zeros((2, 3, 3, 3)), np.zeros(3)),
     "bias"),
    (lambda: F.conv2d(np.zeros((1, 3, 4, 4)), np.zeros((2, 3, 3, 3)), stride=0), "stride"),
    (lambda: F.pooling(np.zeros((1, 3, 4, 4)), (2, 2, 2)), "kernel_size"),
    (lambda: F.deconv2d(np.zeros((1, 3, 4, 4)), np.zeros((3, 2, 3, 3)), outsize=(9, 9)),
     "outsize"),
    (lambda: F.col2im(np.zeros((3, 4)), (1, 1, 4, 4), 2), "do not match"),
])
def test_bad_input_gets_a_clear_value_error(call, message):
    with pytest.raises(ValueError, match=message):
        call()


# ---------------------------------------------------------------- jit vs eager

JIT_CASES = [  # (x shape, OC, kernel, stride, pad)
    ((2, 3, 6, 6), 4, 3, 1, 1),
    ((1, 2, 7, 5), 3, (3, 2), (2, 1), (1, 0)),
    ((2, 1, 5, 5), 2, 2, 2, 0),
]


@pytest.mark.parametrize("shape, OC, k, s, p", JIT_CASES)
def test_conv_functions_jit_match_eager(shape, OC, k, s, p):
    rng = np.random.default_rng(2)
    x = tj.Variable(rng.standard_normal(shape))
    kk = k if isinstance(k, tuple) else (k, k)
    W = tj.Variable(rng.standard_normal((OC, shape[1]) + kk))
    b = tj.Variable(rng.standard_normal(OC))
    Wd = tj.Variable(rng.standard_normal((OC, shape[1]) + kk))

    def f(x, W, b, Wd):
        y = F.relu(F.conv2d(x, W, b, s, p))
        m = F.pooling(y, 2, 1, 1)
        a = F.average_pooling(y, 2, 1)
        d = F.deconv2d(y, Wd, None, s, p, outsize=shape[2:])
        c = F.col2im(F.im2col(x, k, s, p), shape, k, s, p)
        return F.sum(m * m) + F.sum(a) + F.sum(d * x) + F.sum(c * c)

    assert_jit_matches_eager(f, x, W, b, Wd, rtol=1e-7, atol=1e-9)


def test_cnn_training_step_jit_matches_eager():
    """conv-ReLU-pool-Linear-softmax cross-entropy, backward, SGD: compiled, no fallback,
    with parameters updated in place call after call, equal to eager's."""
    import tracejit.layers as L

    def make():
        np.random.seed(3)
        W = tj.Parameter(np.random.randn(4, 1, 3, 3).astype(np.float32) * 0.3)
        b = tj.Parameter(np.zeros(4, np.float32))
        fc = L.Linear(3, in_size=4 * 3 * 3)
        params = [W, b] + list(fc.params())

        def step(x, t):
            h = F.pooling(F.relu(F.conv2d(x, W, b, 1, 1)), 2, 2)
            loss = F.softmax_cross_entropy(fc(F.reshape(h, (x.shape[0], -1))), t)
            for q in params:
                q.cleargrad()
            loss.backward()
            for q in params:
                q.data -= 0.1 * q.grad.data
            return loss
        return step, params

    rng = np.random.default_rng(4)
    (estep, eparams), (jstep, jparams) = make(), make()
    jstep = tj.jit(jstep)
    for _ in range(5):
        x = rng.standard_normal((4, 1, 6, 6)).astype(np.float32)
        t = rng.integers(0, 3, 4)
        le, lj = estep(x, t), jstep(x, t)
        np.testing.assert_allclose(lj.data, le.data, rtol=1e-5, atol=1e-6)
        for pe, pj in zip(eparams, jparams):
            np.testing.assert_allclose(pj.data, pe.data, rtol=1e-5, atol=1e-6)
    assert jstep.cache_info()["fallbacks"] == 0


def test_two_conv_layer_cnn_trains_like_eager_for_300_steps():
    """The W6 benchmark's network at small sizes (conv-ReLU-pool twice, Linear, softmax
    cross-entropy, SGD; float32): its conv paths are the fast ones (stride 1 over the
    wide grid, both weight-gradient layouts, the 2x2 pooling loop). Compiled, no
    fallback, a new batch each step, parameters equal to eager's after 300 steps."""
    import tracejit.layers as L
    from tracejit import optimizers
    from tracejit.models import Model

    class CNN(Model):
        def __init__(self):
            super().__init__()
            self.c1 = L.Conv2d(8, 3, pad=1)
            self.c2 = L.Conv2d(16, 3, pad=1)
            self.fc = L.Linear(3)

        def forward(self, x):
            h = F.pooling(F.relu(self.c1(x)), 2, 2)
            h = F.pooling(F.relu(self.c2(h)), 2, 2)
            return self.fc(F.reshape(h, (x.shape[0], -1)))

    rng = np.random.default_rng(5)
    xs = rng.standard_normal((300, 4, 1, 10, 10)).astype(np.float32)
    ts = rng.integers(0, 3, (300, 4))

    def make():
        np.random.seed(6)
        model = CNN()
        model(xs[0])
        opt = optimizers.SGD(0.05).setup(model)

        def step(x, t):
            loss = F.softmax_cross_entropy(model(x), t)
            model.cleargrads()
            loss.backward()
            opt.update()
            return loss
        return model, step

    (me, estep), (mj, jstep) = make(), make()
    jstep = tj.jit(jstep)
    for i in range(300):
        le, lj = estep(xs[i], ts[i]), jstep(xs[i], ts[i])
        np.testing.assert_allclose(lj.data, le.data, rtol=1e-4, atol=1e-5)
    for pe, pj in zip(me.params(), mj.params()):
        assert pj.data.dtype == np.float32
        np.testing.assert_allclose(pj.data, pe.data, rtol=1e-4, atol=1e-5)
    assert jstep.cache_info()["fallbacks"] == 0
