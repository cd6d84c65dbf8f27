"""tracejit.functions_conv: DeZero's convolution functions (conv2d, deconv2d, pooling,
im2col, ...) and their Function classes, NCHW throughout.

The primitives are in tracejit/ops/conv.py; this module holds the functions users call
and the book's *_simple compositions. tracejit.functions re-exports all of it, as
DeZero's functions module does.
"""
from tracejit.core import as_variable
from tracejit import functions as F
from tracejit.ops.conv import (  # noqa: F401
    AveragePooling, Col2im, Conv2d, Conv2DGradW, Deconv2d, Im2col, Pooling, Pooling2DGrad,
    Pooling2DWithIndexes, col2im_array, get_conv_outsize, get_deconv_outsize, im2col_array,
    pair)


def _add_bias(y, b):
    # The bias as a separate broadcast add, not inside the conv call: under jit it fuses
    # with what follows (ReLU), and the conv primitive stays a plain product.
    if b is None:
        return y
    b = as_variable(b)
    if b.ndim != 1 or b.shape[0] != y.shape[1]:
        raise ValueError(f"bias of shape {b.shape} does not match {y.shape[1]} output "
                         f"channels")
    # b[:, None, None], a copy: F.reshape would give a view of the Parameter's buffer,
    # which the tracer will not read after an optimizer's in-place update of it.
    return y + F.get_item(b, (slice(None), None, None))


# ---------------------------------------------------------------- simple versions

def conv2d_simple(x, W, b=None, stride=1, pad=0):
    """conv2d as the book first writes it: im2col, then one matrix product."""
    x, W = as_variable(x), as_variable(W)
    N, C, H, Wd = x.shape
    OC, C, KH, KW = W.shape
    SH, SW = pair(stride, "conv2d_simple: stride")
    PH, PW = pair(pad, "conv2d_simple: pad")
    OH = get_conv_outsize(H, KH, SH, PH)
    OW = get_conv_outsize(Wd, KW, SW, PW)
    col = im2col(x, (KH, KW), stride, pad, to_matrix=True)
    Wm = F.transpose(F.reshape(W, (OC, -1)))
    t = F.linear(col, Wm, b)
    return F.transpose(F.reshape(t, (N, OH, OW, OC)), (0, 3, 1, 2))


def pooling_simple(x, kernel_size, stride=1, pad=0):
    """Max pooling as the book first writes it: im2col, then max over each row."""
    x = as_variable(x)
    N, C, H, W = x.shape
    KH, KW = pair(kernel_size, "pooling_simple: kernel_size")
    PH, PW = pair(pad, "pooling_simple: pad")
    SH, SW = pair(stride, "pooling_simple: stride")
    OH = get_conv_outsize(H, KH, SH, PH)
    OW = get_conv_outsize(W, KW, SW, PW)
    col = im2col(x, kernel_size, stride, pad, to_matrix=True)
    col = F.reshape(col, (-1, KH * KW))
    y = F.max(col, axis=1)
    return F.transpose(F.reshape(y, (N, OH, OW, C)), (0, 3, 1, 2))


# ---------------------------------------------------------------- conv2d / deconv2d

def conv2d(x, W, b=None, stride=1, pad=0):
    """x (N, C, H, W), W (OC, C, KH, KW), b (OC,) or None -> (N, OC, OH, OW)."""
    return _add_bias(Conv2d(stride, pad)(x, W), b)


def deconv2d(x, W, b=None, stride=1, pad=0, outsize=None):
    """x (N, C, H, W), W (C, OC, KH, KW), b (OC,) or None -> (N, OC, OH, OW): the
    transposed convolution. outsize (OH, OW) picks among the sizes a strided conv2d
    maps onto x's size; by default s * (H - 1) + KH - 2 * pad."""
    return _add_bias(Deconv2d(stride, pad, outsize)(x, W), b)


# ---------------------------------------------------------------- pooling

def pooling(x, kernel_size, stride=1, pad=0):
    """Max pooling of an NCHW image (zero padding, as DeZero)."""
    return Pooling(kernel_size, stride, pad)(x)


def average_pooling(x, kernel_size, stride=1, pad=0):
    return AveragePooling(kernel_size, stride, pad)(x)


# ---------------------------------------------------------------- im2col / col2im

def im2col(x, kernel_size, stride=1, pad=0, to_matrix=True):
    """Patches of an NCHW image x under each window position.

    Returns (N, C, KH, KW, OH, OW), or (N*OH*OW, C*KH*KW) when to_matrix is True
    (OH = (H + 2*pad - KH) // stride + 1, and OW alike)."""
    return Im2col(kernel_size, stride, pad, to_matrix)(x)


def col2im(x, input_shape, kernel_size, stride=1, pad=0, to_matrix=True):
    """im2col's adjoint: columns summed back into an image of input_shape."""
    return Col2im(input_shape, kernel_size, stride, pad, to_matrix)(x)
