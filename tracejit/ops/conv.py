"""Convolution primitives (DeZero's functions_conv): im2col / col2im, conv2d, deconv2d,
the weight gradient Conv2DGradW, max pooling with its two index-carrying companions,
and average pooling. Images are NCHW; conv weights are (OC, C, KH, KW), deconv
weights (C, OC, KH, KW), as in DeZero.

Every op here is a registered primitive (tests/ops/test_functions.py property-tests
each) and one NumPy or numba call on whole arrays (a BLAS product, a strided copy, a
conv_kernels loop), so each has the MATMUL kind: under jit it runs as one call between
fused kernels, and a graph holding one keeps its kernels serial (BLAS threads and
numba's would contend).
Backward rules are written with these same ops (conv's is deconv's forward and back),
so higher-order gradients trace.

Max pooling keeps no state between forward and backward (DeZero keeps the argmax on
the Function): a compiled plan runs a fresh copy of each op, so Pooling2DGrad and
Pooling2DWithIndexes take the pooled input x and find the argmax again.
"""
import numpy as np
from numpy.lib.stride_tricks import as_strided

from tracejit import functions as F
from tracejit.core import MATMUL, ShapeDtype
from tracejit.ops.primitive import Primitive, primitive

# ---------------------------------------------------------------- sizes


def pair(x, name="size"):
    """(x, x) for an int, x for a pair of ints (DeZero's utils.pair), else ValueError."""
    if isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_)):
        return (int(x), int(x))
    if isinstance(x, (tuple, list)) and len(x) == 2 and all(
            isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))
            for v in x):
        return (int(x[0]), int(x[1]))
    raise ValueError(f"{name} must be an int or a pair of ints, got {x!r}")


def get_conv_outsize(input_size, kernel_size, stride, pad):
    return (input_size + pad * 2 - kernel_size) // stride + 1


def get_deconv_outsize(size, k, s, p):
    return s * (size - 1) + k - 2 * p


def _window(name, kernel_size, stride, pad):
    """The static (kernel, stride, pad) pairs of an op, checked once at construction."""
    k, s, p = pair(kernel_size, f"{name}: kernel_size"), pair(stride, f"{name}: stride"), \
        pair(pad, f"{name}: pad")
    if min(k) < 1 or min(s) < 1 or min(p) < 0:
        raise ValueError(f"{name}: kernel_size and stride must be >= 1 and pad >= 0, got "
                         f"kernel_size={k}, stride={s}, pad={p}")
    return k, s, p


def _out_hw(name, shape, k, s, p):
    if len(shape) != 4:
        raise ValueError(f"{name}: the input must be 4-D (N, C, H, W), got shape {shape}")
    oh = get_conv_outsize(shape[2], k[0], s[0], p[0])
    ow = get_conv_outsize(shape[3], k[1], s[1], p[1])
    if oh < 1 or ow < 1:
        raise ValueError(f"{name}: a {k[0]}x{k[1]} window with pad {p} does not fit an "
                         f"input of height x width {shape[2]}x{shape[3]} (output "
                         f"{oh}x{ow})")
    return oh, ow


def _col_shape(name, col_shape, img_shape, k, s, p, to_matrix):
    """The column shape an image of img_shape gives; ValueError if col_shape is not it."""
    oh, ow = _out_hw(name, tuple(img_shape), k, s, p)
    N, C = img_shape[:2]
    want = (N * oh * ow, C * k[0] * k[1]) if to_matrix else (N, C, k[0], k[1], oh, ow)
    if col_shape is not None and tuple(col_shape) != want:
        raise ValueError(f"{name}: columns of shape {tuple(col_shape)} do not match an "
                         f"image of shape {tuple(img_shape)} (expected {want})")
    return want


# ---------------------------------------------------------------- kernels

# The dtypes the numba kernels (conv_kernels.py) take; others run the NumPy code.
_FAST = frozenset(np.dtype(d) for d in ("f4", "f8"))
_K = None


def _fast(*arrays):
    return all(a.dtype in _FAST for a in arrays)


def _kernels():
    # conv_kernels imports numba: on first use, so `import tracejit` does not.
    global _K
    if _K is None:
        from tracejit.ops import conv_kernels
        _K = conv_kernels
    return _K


def _patches(img, k, s, p):
    """A read-only (N, C, KH, KW, OH, OW) strided view of the zero-padded image."""
    N, C, H, W = img.shape
    oh, ow = get_conv_outsize(H, k[0], s[0], p[0]), get_conv_outsize(W, k[1], s[1], p[1])
    if p != (0, 0):
        img = np.pad(img, ((0, 0), (0, 0), (p[0], p[0]), (p[1], p[1])))
    else:
        img = np.ascontiguousarray(img)
    sn, sc, sh, sw = img.strides
    return as_strided(img, (N, C, k[0], k[1], oh, ow),
                      (sn, sc, sh, sw, sh * s[0], sw * s[1]), writeable=False)


def im2col_array(img, kernel_size, stride, pad, to_matrix=True):
    """Patches of an NCHW image: (N, C, KH, KW, OH, OW), or (N*OH*OW, C*KH*KW) with
    to_matrix (DeZero's layout). Always a fresh array."""
    k, s, p = _window("im2col", kernel_size, stride, pad)
    N, C, H, W = img.shape
    oh, ow = _out_hw("im2col", img.shape, k, s, p)
    if not to_matrix and _fast(img):
        # numba: the patches written straight from the unpadded image (no np.pad copy).
        col = np.empty((N, C, k[0], k[1], oh, ow), img.dtype)
        _kernels().im2col(np.ascontiguousarray(img).reshape(-1), col.reshape(-1), N, C, H,
                          W, k[0], k[1], s[0], s[1], p[0], p[1])
        return col
    # The matrix layout (and other dtypes): one copy of a strided view of the padded
    # image. Always a fresh array: with a 1x1 window, stride 1 and no padding the view is
    # x's own buffer (read-only), and a result must neither alias an input nor be frozen.
    view = _patches(img, k, s, p)
    if to_matrix:
        col = view.transpose(0, 4, 5, 1, 2, 3).reshape(N * oh * ow, -1)
        return col if col.flags.owndata else col.copy()
    return view.copy()


def _col2im_numpy(col, img_shape, k, s, p, to_matrix):
    # The reference (dtypes the kernels do not take, and the tests): one strided add per
    # kernel offset (KH*KW adds of whole (N, C, OH, OW) slabs) into a padded image.
    N, C, H, W = img_shape
    oh, ow = _out_hw("col2im", tuple(img_shape), k, s, p)
    if to_matrix:
        col = col.reshape(N, oh, ow, C, k[0], k[1]).transpose(0, 3, 4, 5, 1, 2)
    # Room for the last window at every offset: (oh - 1) * s + k <= H + 2p.
    img = np.zeros((N, C, H + 2 * p[0], W + 2 * p[1]), dtype=col.dtype)
    for j in range(k[0]):
        j_lim = j + s[0] * oh
        for i in range(k[1]):
            i_lim = i + s[1] * ow
            img[:, :, j:j_lim:s[0], i:i_lim:s[1]] += col[:, :, j, i, :, :]
    if p == (0, 0):
        return img
    return img[:, :, p[0]:H + p[0], p[1]:W + p[1]].copy()      # fresh, not a view


def col2im_array(col, img_shape, kernel_size, stride, pad, to_matrix=True):
    """The adjoint of im2col_array: every patch element added back to its pixel."""
    k, s, p = _window("col2im", kernel_size, stride, pad)
    N, C, H, W = img_shape
    oh, ow = _out_hw("col2im", tuple(img_shape), k, s, p)
    if not _fast(col):
        return _col2im_numpy(col, img_shape, k, s, p, to_matrix)
    # numba: a scatter-add straight into the unpadded image (no padded buffer, no crop
    # copy), reading the columns in their own layout.
    col = np.ascontiguousarray(col).reshape(-1)
    if to_matrix:       # (N, OH, OW, C, KH, KW)
        ckk = C * k[0] * k[1]
        st = (oh * ow * ckk, k[0] * k[1], k[1], 1, ow * ckk, ckk)
    else:               # (N, C, KH, KW, OH, OW)
        st = (C * k[0] * k[1] * oh * ow, k[0] * k[1] * oh * ow, k[1] * oh * ow, oh * ow,
              ow, 1)
    img = np.zeros((N, C, H, W), dtype=col.dtype)
    _kernels().col2im(col, img, k[0], k[1], s[0], s[1], p[0], p[1], st)
    return img


def _conv_forward(x, W, s, p):
    OC, C, KH, KW = W.shape
    N = x.shape[0]
    _out_hw("conv2d", x.shape, (KH, KW), s, p)        # the window fits: a clear error
    if s == (1, 1) and _fast(x):
        return _conv_wide(x, W, p)
    col = im2col_array(x, (KH, KW), s, p, to_matrix=False)
    oh, ow = col.shape[4:]
    # (OC, C*KH*KW) @ (N, C*KH*KW, OH*OW): NCHW comes out directly, no transpose copy.
    # One GEMM per image, not one over (C*KH*KW, N*OH*OW): OpenBLAS runs these small
    # ones on one thread, and its threaded large GEMM was 5-40x slower on a loaded
    # machine (threads spinning for a descheduled partner).
    y = np.matmul(W.reshape(OC, -1), col.reshape(N, C * KH * KW, oh * ow))
    return y.reshape(N, OC, oh, ow)


def _conv_wide(x, W, p):
    """Stride 1: the convolution over the "wide" output grid OH x Wp (Wp the padded
    width), whose columns are contiguous runs of the padded image (conv_kernels.
    im2col_wide): a copy at memory speed instead of rows of OW elements, for
    (Wp - OW) / OW more GEMM columns, cut off at the end. Measured on the W6 CNN's
    second conv (32x16x14x14 -> 32, 3x3, pad 1; loaded machine): patches 0.07 ms
    against 0.33 ms in the (OH, OW) layout. The cut columns' products read other
    pixels and are dropped whatever they hold (a NaN there reaches no output).

    A few images at a time (_chunk), through small buffers: the padded images, the
    patches and the wide products stay in the cache, and the only large array written
    is the result. Where glibc serves large arrays by mmap, each fresh one also pays
    its page faults on the first write: convs called in a loop, 32x1x28x28 -> 16, took
    2.7-3.8 ms with whole-batch temporaries (1016 page faults a call), 0.45 ms so (no
    faults). Inside the W6 step the heap already holds such arrays (no faults there);
    the chunks still gained 5-15% on it."""
    N, OC = x.shape[0], W.shape[0]
    oh, ow = get_conv_outsize(x.shape[2], W.shape[2], 1, p[0]), \
        get_conv_outsize(x.shape[3], W.shape[3], 1, p[1])
    y = np.empty((N, OC, oh, ow), np.result_type(x, W))
    for n0, b, yw, Wp in _conv_wide_chunks(x, W, p):
        y[n0:n0 + b] = yw.reshape(b, OC, oh, Wp)[:, :, :, :ow]
    return y


def _conv_wide_chunks(x, W, p):
    """_conv_wide's chunks: (n0, b, the wide products of images n0:n0 + b as (b, OC,
    OH * Wp), Wp), each valid until the next is asked for (one buffer): a consumer
    (the copy into y, or conv_fused's epilogue) reads it while it is in the cache."""
    OC, C, KH, KW = W.shape
    N, _, H, Wd = x.shape
    Hp, Wp = H + 2 * p[0], Wd + 2 * p[1]
    oh = Hp - KH + 1
    S = Hp * Wp + KW - 1            # each image padded, then KW - 1 spare elements
    L = oh * Wp
    Wm = W.reshape(OC, -1)
    dt = np.result_type(x, W)
    B = _chunk(N, (C * S + C * KH * KW * L + OC * L) * x.itemsize)
    col = np.empty((B, C * KH * KW, L), x.dtype)
    yw = np.empty((B, OC, L), dt)
    for n0 in range(0, N, B):
        b = min(B, N - n0)
        xp = np.zeros((b * C, S), x.dtype)
        it = xp.itemsize
        as_strided(xp, (b, C, Hp, Wp), (C * S * it, S * it, Wp * it, it))[
            :, :, p[0]:p[0] + H, p[1]:p[1] + Wd] = x[n0:n0 + b]
        c = col[:b]
        _kernels().im2col_wide(xp.reshape(-1), c.reshape(-1), b * C, S, KH, KW, Wp, L)
        np.matmul(Wm, c, out=yw[:b])
        yield n0, b, yw[:b], Wp


# Bytes of scratch per chunk of images (_conv_wide, _patch_chunks, _deconv_forward):
# half a core's L2 (1 MB on the project machine). 256 KB, 1 MB and 4 MB measured alike
# on W6 within the noise; fewer, larger chunks cost less Python per call.
_CHUNK_BYTES = 1 << 19


def _chunk(N, per_image):
    return max(1, min(N, _CHUNK_BYTES // max(1, per_image)))


def _deconv_forward(x, W, s, p, outsize):
    C, OC, KH, KW = W.shape
    N, _, H, Wd = x.shape
    # (OC*KH*KW, C) @ (N, C, H*W): the columns conv2d would have read, then summed back.
    # W's transpose copied (small): a contiguous operand for each per-image GEMM.
    Wt = np.ascontiguousarray(W.reshape(C, -1).T)
    xr = x.reshape(N, C, H * Wd)
    if not _fast(x, W):
        gcol = np.matmul(Wt, xr).reshape(N, OC, KH, KW, H, Wd)
        return col2im_array(gcol, (N, OC) + outsize, (KH, KW), s, p, to_matrix=False)
    # A few images at a time through one small buffer of columns (see _conv_wide),
    # each chunk summed into its images by the col2im kernel.
    # The kernel reads the columns at the output image's conv geometry: it must be x's.
    if _out_hw("deconv2d", (N, OC) + tuple(outsize), (KH, KW), s, p) != (H, Wd):
        raise ValueError(f"deconv2d: outsize {tuple(outsize)} does not match x's height x "
                         f"width {(H, Wd)}")
    dt = np.result_type(x, W)
    img = np.zeros((N, OC) + tuple(outsize), dt)
    B = _chunk(N, OC * KH * KW * H * Wd * np.dtype(dt).itemsize)
    gcol = np.empty((B, OC * KH * KW, H * Wd), dt)
    st = (OC * KH * KW * H * Wd, KH * KW * H * Wd, KW * H * Wd, H * Wd, Wd, 1)
    for n0 in range(0, N, B):
        b = min(B, N - n0)
        g = gcol[:b]
        np.matmul(Wt, xr[n0:n0 + b], out=g)
        _kernels().col2im(g.reshape(-1), img[n0:n0 + b], KH, KW, s[0], s[1], p[0], p[1],
                          st)
    return img


def _grad_w_forward(x, gy, k, s, p):
    N, C = x.shape[:2]
    OC = gy.shape[1]
    oh, ow = _out_hw("conv2d", x.shape, k, s, p)
    ckk, L = C * k[0] * k[1], oh * ow
    # Per-image GEMMs on the patches in im2col's own layout, then a sum over N: one
    # (C*KH*KW, N*OH*OW) GEMM is threaded OpenBLAS (see _conv_forward), tensordot was
    # 100x slower. OpenBLAS is slow on a transposed (L, C*KH*KW) operand when C*KH*KW
    # is large: there gW^T = col @ gy^T with gy^T copied (small). Measured, loaded
    # machine, on the W6 CNN's convs: 32x16x14x14 -> 32 (C*KH*KW 144): 0.59 ms against
    # 1.17 ms for gy @ col^T; 32x1x28x28 -> 16 (C*KH*KW 9): 0.26 ms against 0.08 ms.
    gy = gy.reshape(N, OC, L)
    t = ckk >= 2 * OC
    if not _fast(x):
        chunks = [(0, N, im2col_array(x, k, s, p, to_matrix=False).reshape(N, ckk, L))]
    else:
        chunks = _patch_chunks(np.ascontiguousarray(x), k, s, p, ckk, L)
    gW = None
    for n0, n1, col in chunks:
        if t:           # gy^T of these images, a small copy
            part = np.matmul(col, np.ascontiguousarray(gy[n0:n1].transpose(0, 2, 1)))
        else:
            part = np.matmul(gy[n0:n1], col.transpose(0, 2, 1))
        part = part.sum(axis=0)
        gW = part if gW is None else gW + part
    if gW is None:                      # N = 0
        gW = np.zeros((ckk, OC) if t else (OC, ckk), np.result_type(x, gy))
    return np.ascontiguousarray(gW.T if t else gW).reshape(OC, C, k[0], k[1])


def _patch_chunks(x, k, s, p, ckk, L):
    """(n0, n1, patches of images n0:n1 as (n1 - n0, C*KH*KW, OH*OW)), a few images at a
    time into one reused buffer of about _CHUNK_BYTES: the GEMM reads patches that
    are still in the cache, and a step does not hold all of them at once."""
    N, C, H, W = x.shape
    B = _chunk(N, ckk * L * x.itemsize)
    buf = np.empty((B, ckk, L), x.dtype)
    flat = x.reshape(-1)
    per = C * H * W
    for n0 in range(0, N, B):
        b = min(B, N - n0)
        col = buf[:b]
        _kernels().im2col(flat[n0 * per:(n0 + b) * per], col.reshape(-1), b, C, H, W,
                          k[0], k[1], s[0], s[1], p[0], p[1])
        yield n0, n0 + b, col


# ---------------------------------------------------------------- shape checks

def _check_conv(name, x, W, b=None):
    if x.ndim != 4:
        raise ValueError(f"{name}: x must be 4-D (N, C, H, W), got shape {x.shape}")
    if W.ndim != 4:
        raise ValueError(f"{name}: W must be 4-D, got shape {W.shape}")
    if b is not None and b.shape != (W.shape[0 if name == "conv2d" else 1],):
        raise ValueError(f"{name}: b must have shape ({W.shape[0 if name == 'conv2d' else 1]},)"
                         f", got {b.shape}")


def _dtype(*specs):
    return np.result_type(*[s.dtype for s in specs])


def _with_bias(y, b):
    # DeZero adds b in forward; here only in the Function form called with a bias.
    if b is not None:
        y += b.reshape(1, -1, 1, 1)
    return y


class _ConvBase(Primitive):
    kind = MATMUL

    def __call__(self, x, W, b=None):
        # DeZero's Conv2d(...)(x, W, None): a bias of None is no input at all.
        return super().__call__(x, W) if b is None else super().__call__(x, W, b)


# ---------------------------------------------------------------- primitives

@primitive
class Conv2d(_ConvBase):
    """y[n, o] = sum_c,kh,kw x_pad[n, c, oh*s + kh, ow*s + kw] W[o, c, kh, kw] (+ b[o])."""

    params = ("stride", "pad")

    def __init__(self, stride=1, pad=0):
        _, self.stride, self.pad = _window("conv2d", 1, stride, pad)

    def forward(self, x, W, b=None):
        if x.ndim != 4 or W.ndim != 4 or x.shape[1] != W.shape[1]:
            self.shape_rule(*[ShapeDtype(a.shape, a.dtype) for a in (x, W)])
        y = _conv_forward(x, W, self.stride, self.pad)
        return _with_bias(y.astype(np.result_type(x, W, *(() if b is None else (b,))),
                                   copy=False), b)

    def to_onnx(self, b, node):
        dt = node.out.dtype
        ins = [b.x(node, i, dt) for i in range(len(node.inputs))]
        b.bind(node, b.op("Conv", ins, strides=list(self.stride), pads=list(self.pad) * 2))

    def epilogue_part(self, node):
        return ("conv", (self.stride, self.pad)) if len(node.inputs) == 2 else None

    def backward(self, gy):
        x, W, *b = self.inputs
        gx = F.deconv2d(gy, W, stride=self.stride, pad=self.pad, outsize=x.shape[2:])
        gW = Conv2DGradW(W.shape[2:], self.stride, self.pad)(x, gy)
        if b:
            return gx, gW, F.sum(gy, axis=(0, 2, 3))
        return gx, gW

    def shape_rule(self, x, W, b=None):
        _check_conv("conv2d", x, W, b)
        if x.ndim != 4 or x.shape[1] != W.shape[1]:
            raise ValueError(f"conv2d: x of shape {x.shape} (N, C, H, W) does not match W "
                             f"of shape {W.shape} (OC, C, KH, KW): C differs")
        oh, ow = _out_hw("conv2d", x.shape, W.shape[2:], self.stride, self.pad)
        dtype = _dtype(x, W) if b is None else _dtype(x, W, b)
        return ShapeDtype((x.shape[0], W.shape[0], oh, ow), dtype)


@primitive
class Deconv2d(_ConvBase):
    """The transposed convolution: conv2d's gradient with respect to its input."""

    params = ("stride", "pad", "outsize")

    def __init__(self, stride=1, pad=0, outsize=None):
        _, self.stride, self.pad = _window("deconv2d", 1, stride, pad)
        if outsize is not None and not isinstance(outsize, (int, np.integer)):
            outsize = tuple(outsize)
        self.outsize = None if outsize is None else pair(outsize, "deconv2d: outsize")

    def _outsize(self, x_shape, W_shape):
        if self.outsize is not None:
            return self.outsize
        return (get_deconv_outsize(x_shape[2], W_shape[2], self.stride[0], self.pad[0]),
                get_deconv_outsize(x_shape[3], W_shape[3], self.stride[1], self.pad[1]))

    def forward(self, x, W, b=None):
        self.shape_rule(*[ShapeDtype(a.shape, a.dtype) for a in (x, W)])
        y = _deconv_forward(x, W, self.stride, self.pad, self._outsize(x.shape, W.shape))
        return _with_bias(y.astype(np.result_type(x, W, *(() if b is None else (b,))),
                                   copy=False), b)

    def to_onnx(self, b, node):
        # ConvTranspose gives s * (in - 1) + k - 2p; a larger outsize is output padding.
        dt = node.out.dtype
        x, W = node.inputs[0].shape, node.inputs[1].shape
        natural = [get_deconv_outsize(x[2 + i], W[2 + i], self.stride[i], self.pad[i])
                   for i in range(2)]
        extra = [o - n for o, n in zip(self._outsize(x, W), natural)]
        if min(extra) < 0 or any(e >= s for e, s in zip(extra, self.stride)):
            raise b.unsupported(node, f"outsize {self.outsize} is no ConvTranspose size")
        ins = [b.x(node, i, dt) for i in range(len(node.inputs))]
        b.bind(node, b.op("ConvTranspose", ins, strides=list(self.stride),
                          pads=list(self.pad) * 2, output_padding=extra))

    def backward(self, gy):
        x, W, *b = self.inputs
        gx = F.conv2d(gy, W, stride=self.stride, pad=self.pad)
        gW = Conv2DGradW(W.shape[2:], self.stride, self.pad)(gy, x)
        if b:
            return gx, gW, F.sum(gy, axis=(0, 2, 3))
        return gx, gW

    def shape_rule(self, x, W, b=None):
        _check_conv("deconv2d", x, W, b)
        if x.ndim != 4 or x.shape[1] != W.shape[0]:
            raise ValueError(f"deconv2d: x of shape {x.shape} (N, C, H, W) does not match W "
                             f"of shape {W.shape} (C, OC, KH, KW): C differs")
        oh, ow = self._outsize(x.shape, W.shape)
        if oh < 1 or ow < 1:
            raise ValueError(f"deconv2d: the output size {oh}x{ow} is empty")
        # The output must be an image the matching conv2d maps back onto x's size.
        back = _out_hw("deconv2d", (1, 1, oh, ow), W.shape[2:], self.stride, self.pad)
        if back != tuple(x.shape[2:]):
            raise ValueError(f"deconv2d: outsize {(oh, ow)} does not match x's height x "
                             f"width {x.shape[2:]} (conv2d of an {oh}x{ow} image with "
                             f"this kernel, stride and pad gives {back[0]}x{back[1]})")
        dtype = _dtype(x, W) if b is None else _dtype(x, W, b)
        return ShapeDtype((x.shape[0], W.shape[1], oh, ow), dtype)


@primitive
class Conv2DGradW(Primitive):
    """conv2d's weight gradient from its input x and output gradient gy.

    Conv2DGradW(conv) takes the window from a Conv2d or Deconv2d call as DeZero's
    does; Conv2DGradW(kernel_size, stride, pad) gives it directly."""

    kind = MATMUL
    params = ("kernel_size", "stride", "pad")

    def __init__(self, kernel_size, stride=1, pad=0):
        if isinstance(kernel_size, (Conv2d, Deconv2d)):
            conv = kernel_size
            kernel_size, stride, pad = conv.inputs[1].shape[2:], conv.stride, conv.pad
        if not isinstance(kernel_size, (int, np.integer)):
            kernel_size = tuple(kernel_size)
        self.kernel_size, self.stride, self.pad = _window("conv2d", kernel_size, stride, pad)

    def forward(self, x, gy):
        self.shape_rule(ShapeDtype(x.shape, x.dtype), ShapeDtype(gy.shape, gy.dtype))
        gW = _grad_w_forward(x, gy, self.kernel_size, self.stride, self.pad)
        return gW.astype(np.result_type(x, gy), copy=False)

    def to_onnx(self, b, node):
        # gW[o, c] = sum over n and output pixels of gy[n, o] * x_pad[n, c] shifted: a
        # Conv of x (C, N, H, W) with gy (O, N, OH, OW) as kernel, dilated by the stride,
        # cut to the kernel size and transposed to (O, C, KH, KW).
        dt = node.out.dtype
        x = b.op("Transpose", [b.x(node, 0, dt)], perm=[1, 0, 2, 3])
        gy = b.op("Transpose", [b.x(node, 1, dt)], perm=[1, 0, 2, 3])
        y = b.op("Conv", [x, gy], dilations=list(self.stride), pads=list(self.pad) * 2)
        kh, kw = self.kernel_size
        y = b.op("Slice", [y, b.ints([0, 0]), b.ints([kh, kw]), b.ints([2, 3])])
        b.bind(node, b.op("Transpose", [y], perm=[1, 0, 2, 3]))

    def backward(self, ggW):
        x, gy = self.inputs
        gx = F.deconv2d(gy, ggW, stride=self.stride, pad=self.pad, outsize=x.shape[2:])
        ggy = F.conv2d(x, ggW, stride=self.stride, pad=self.pad)
        return gx, ggy

    def shape_rule(self, x, gy):
        oh, ow = _out_hw("conv2d", x.shape, self.kernel_size, self.stride, self.pad)
        if gy.ndim != 4 or gy.shape[0] != x.shape[0] or gy.shape[2:] != (oh, ow):
            raise ValueError(f"conv2d: the output gradient's shape {gy.shape} does not match "
                             f"the output of an input of shape {x.shape} "
                             f"(N={x.shape[0]}, OH x OW = {oh}x{ow})")
        return ShapeDtype((gy.shape[1], x.shape[1]) + self.kernel_size, _dtype(x, gy))


# ---------------------------------------------------------------- pooling

def _onnx_windows(b, hw, k, s, p):
    """Export: where each window element of an (H, W) image padded by p reads, as flat
    positions in the padded image: (an int64 constant of K * L positions, K = KH * KW
    window-major as im2col orders them, L = OH * OW, the padded (Hp, Wp))."""
    (h, w), (kh, kw), (sh, sw), (ph, pw) = hw, k, s, p
    oh, ow = get_conv_outsize(h, kh, sh, ph), get_conv_outsize(w, kw, sw, pw)
    hp, wp = h + 2 * ph, w + 2 * pw
    i = (np.arange(kh)[:, None, None, None] + sh * np.arange(oh)[None, None, :, None])
    j = (np.arange(kw)[None, :, None, None] + sw * np.arange(ow)[None, None, None, :])
    table = (i * wp + j).reshape(kh * kw, oh * ow).astype(np.int64)
    return b.const(table.reshape(-1)), table.shape, (hp, wp)


def _onnx_padded_rows(b, x, p):
    # x (N, C, H, W) zero-padded and flattened to (N, C, Hp * Wp).
    if any(p):
        x = b.op("Pad", [x, b.ints([0, 0, p[0], p[1], 0, 0, p[0], p[1]])])
    return b.op("Reshape", [x, b.ints([0, 0, -1])])


def _onnx_scatter_image(b, node, values, positions, chw, p, padded):
    """values (N, C, M) added at flat `positions` (N, C, M) of zeros (N, C, Hp * Wp),
    then the padding cut: the image (N, C, H, W)."""
    shape = b.op("Concat", [b.op("Slice", [b.op("Shape", [values]), b.ints([0]),
                                           b.ints([2])]),
                            b.ints([padded[0] * padded[1]])], axis=0)
    zeros = b.op("Expand", [b.const(np.zeros((), node.out.dtype)), shape])
    out = b.op("ScatterElements", [zeros, positions, values], axis=2, reduction="add")
    out = b.op("Reshape", [out, b.ints([0, 0, padded[0], padded[1]])])
    c, h, w = chw
    return b.op("Slice", [out, b.ints([p[0], p[1]]), b.ints([p[0] + h, p[1] + w]),
                          b.ints([2, 3])])


def _pool_cols(x, k, s, p):
    N, C = x.shape[:2]
    col = im2col_array(x, k, s, p, to_matrix=False)
    return col.reshape(N, C, k[0] * k[1], col.shape[4], col.shape[5])


class _Window(Primitive):
    kind = MATMUL
    params = ("kernel_size", "stride", "pad")

    def __init__(self, kernel_size, stride=1, pad=0):
        if isinstance(kernel_size, _Window):        # DeZero: Pooling2DGrad(pooling_fn)
            src = kernel_size
            kernel_size, stride, pad = src.kernel_size, src.stride, src.pad
        self.kernel_size, self.stride, self.pad = _window(
            type(self).__name__.lower(), kernel_size, stride, pad)

    def _kernel_args(self):
        return self.kernel_size + self.stride + self.pad

    def _pooled(self, x):
        oh, ow = _out_hw(type(self).__name__.lower(), x.shape, self.kernel_size, self.stride,
                         self.pad)
        return x.shape[:2] + (oh, ow)


@primitive
class Pooling(_Window):
    """Max pooling; padding is zeros, as in DeZero (a window of negatives over the
    border pools to 0). The gradient goes to the first maximum of each window."""

    def forward(self, x):
        shape = self._pooled(x)
        if _fast(x):
            # numba: the max of each window read in place (no 4x patch copy).
            y = np.empty(shape, x.dtype)
            _kernels().max_pool(np.ascontiguousarray(x), y, *self._kernel_args())
            return y
        return _pool_cols(x, self.kernel_size, self.stride, self.pad).max(axis=2)

    def backward(self, gy):
        x, = self.inputs
        return Pooling2DGrad(self.kernel_size, self.stride, self.pad)(x, gy)

    def shape_rule(self, x):
        return ShapeDtype(self._pooled(x), x.dtype)

    def epilogue_part(self, node):
        return ("max_pool", (self.kernel_size, self.stride, self.pad))

    def to_onnx(self, b, node):
        # DeZero pads with zeros, which take part in the max (MaxPool's pads are -inf).
        x = b.x(node, 0)
        if any(self.pad):
            ph, pw = self.pad
            x = b.op("Pad", [x, b.ints([0, 0, ph, pw, 0, 0, ph, pw])])
        b.bind(node, b.op("MaxPool", [x], kernel_shape=list(self.kernel_size),
                          strides=list(self.stride)))


class _WithPooledInput(_Window):
    """Called as (x, gy), x the pooled input; built from a called Pooling (DeZero's
    Pooling2DGrad(pooling_fn)), also as (gy) alone: x is that call's input."""

    def __init__(self, kernel_size, stride=1, pad=0):
        super().__init__(kernel_size, stride, pad)
        inputs = getattr(kernel_size, "inputs", None) if isinstance(kernel_size, _Window) \
            else None
        self._x = inputs[0] if inputs else None

    def __call__(self, *xs):
        if len(xs) == 1 and self._x is not None:
            xs = (self._x,) + xs
        return super().__call__(*xs)


@primitive
class Pooling2DGrad(_WithPooledInput):
    """Max pooling's input gradient: gy scattered to each window's argmax in x."""

    def forward(self, x, gy):
        self.shape_rule(ShapeDtype(x.shape, x.dtype), ShapeDtype(gy.shape, gy.dtype))
        if _fast(x, gy):
            # numba: each window's argmax found in x and gy added there, in one pass
            # (not a patch copy, argmax, put_along_axis and col2im).
            gx = np.empty(x.shape, gy.dtype)        # every element written
            _kernels().max_pool_grad(np.ascontiguousarray(x), np.ascontiguousarray(gy), gx,
                                     *self._kernel_args())
            return gx
        k = self.kernel_size
        col = _pool_cols(x, k, self.stride, self.pad)
        idx = col.argmax(axis=2)[:, :, None]
        gcol = np.zeros(col.shape, dtype=gy.dtype)
        np.put_along_axis(gcol, idx, gy[:, :, None], axis=2)
        N, C, _, oh, ow = col.shape
        return col2im_array(gcol.reshape(N, C, k[0], k[1], oh, ow), x.shape, k, self.stride,
                            self.pad, to_matrix=False)

    def to_onnx(self, b, node):
        # Each window's first maximum (ArgMax picks the first, as NumPy's argmax), the
        # padded position it reads, gy added there.
        dt = node.out.dtype
        table, (K, L), padded = _onnx_windows(b, node.inputs[0].shape[2:],
                                              self.kernel_size, self.stride, self.pad)
        rows = _onnx_padded_rows(b, b.x(node, 0), self.pad)
        cols = b.op("Reshape", [b.op("Gather", [rows, table], axis=2), b.ints([0, 0, K, L])])
        first = b.op("ArgMax", [cols], axis=2, keepdims=0)            # (N, C, L)
        at = b.op("Add", [b.op("Mul", [first, b.const(np.array(L, np.int64))]),
                          b.const(np.arange(L, dtype=np.int64))])
        where = b.op("Gather", [table, at], axis=0)
        gy = b.op("Reshape", [b.x(node, 1, dt), b.ints([0, 0, -1])])
        b.bind(node, _onnx_scatter_image(b, node, gy, where, node.out.shape[1:], self.pad,
                                         padded))

    def epilogue_part(self, node):
        if len(node.inputs) != 2:
            return None
        return ("max_pool_grad", (self.kernel_size, self.stride, self.pad))

    def backward(self, ggx):
        x, _ = self.inputs
        # Piecewise linear in gy, constant in x (away from ties).
        return None, Pooling2DWithIndexes(self.kernel_size, self.stride, self.pad)(x, ggx)

    def shape_rule(self, x, gy):
        if gy.shape != self._pooled(x):
            raise ValueError(f"pooling: the output gradient's shape {gy.shape} does not "
                             f"match the pooled shape {self._pooled(x)}")
        return ShapeDtype(x.shape, gy.dtype)


@primitive
class Pooling2DWithIndexes(_WithPooledInput):
    """z pooled at the positions where x has its window maxima (z has x's shape)."""

    def forward(self, x, z):
        self.shape_rule(ShapeDtype(x.shape, x.dtype), ShapeDtype(z.shape, z.dtype))
        if _fast(x, z):
            y = np.empty(self._pooled(x), z.dtype)
            _kernels().max_pool_gather(np.ascontiguousarray(x), np.ascontiguousarray(z), y,
                                       *self._kernel_args())
            return y
        k, s, p = self.kernel_size, self.stride, self.pad
        idx = _pool_cols(x, k, s, p).argmax(axis=2)[:, :, None]
        return np.take_along_axis(_pool_cols(z, k, s, p), idx, axis=2)[:, :, 0]

    def to_onnx(self, b, node):
        # The windows of x and of z read through the same position table; each window's
        # first maximum in x (ArgMax, as NumPy's argmax) picks z's element there.
        dt = node.out.dtype
        table, (K, L), _ = _onnx_windows(b, node.inputs[0].shape[2:], self.kernel_size,
                                         self.stride, self.pad)

        def windows(i, dtype=None):
            rows = _onnx_padded_rows(b, b.x(node, i, dtype), self.pad)
            return b.op("Reshape", [b.op("Gather", [rows, table], axis=2),
                                    b.ints([0, 0, K, L])])
        first = b.op("ArgMax", [windows(0)], axis=2, keepdims=1)      # (N, C, 1, L)
        y = b.op("GatherElements", [windows(1, dt), first], axis=2)
        b.bind(node, b.op("Reshape", [y, b.ints([0, 0] + list(node.out.shape[2:]))]))

    def backward(self, gy):
        x, _ = self.inputs
        return None, Pooling2DGrad(self.kernel_size, self.stride, self.pad)(x, gy)

    def shape_rule(self, x, z):
        if z.shape != x.shape:
            raise ValueError(f"pooling: the array to pool ({z.shape}) must have the shape "
                             f"of the pooled input ({x.shape})")
        return ShapeDtype(self._pooled(x), z.dtype)


@primitive
class AveragePooling(_Window):
    """The mean of each window (padding zeros count, as in DeZero)."""

    def forward(self, x):
        self._pooled(x)
        y = _pool_cols(x, self.kernel_size, self.stride, self.pad).mean(axis=2)
        return y.astype(x.dtype, copy=False) if x.dtype.kind == "f" else y

    def to_onnx(self, b, node):
        # The padding zeros count in each window's mean, as in DeZero.
        b.bind(node, b.op("AveragePool", [b.x(node, 0, node.out.dtype)],
                          kernel_shape=list(self.kernel_size), strides=list(self.stride),
                          pads=list(self.pad) * 2, count_include_pad=1))

    def backward(self, gy):
        x, = self.inputs
        k = self.kernel_size
        N, C, oh, ow = gy.shape
        g = F.reshape(gy / (k[0] * k[1]), (N, C, 1, 1, oh, ow))
        gcol = F.broadcast_to(g, (N, C, k[0], k[1], oh, ow))
        return Col2im(x.shape, k, self.stride, self.pad, False)(gcol)

    def shape_rule(self, x):
        dtype = x.dtype if x.dtype.kind == "f" else np.dtype(np.float64)
        return ShapeDtype(self._pooled(x), dtype)


# ---------------------------------------------------------------- im2col / col2im

@primitive
class Im2col(Primitive):
    kind = MATMUL
    params = ("kernel_size", "stride", "pad", "to_matrix")

    def __init__(self, kernel_size, stride=1, pad=0, to_matrix=True):
        self.kernel_size, self.stride, self.pad = _window("im2col", kernel_size, stride, pad)
        self.to_matrix = bool(to_matrix)

    def forward(self, x):
        return im2col_array(x, self.kernel_size, self.stride, self.pad, self.to_matrix)

    def to_onnx(self, b, node):
        n, c, h, w = node.inputs[0].shape
        (kh, kw), (sh, sw), (ph, pw) = self.kernel_size, self.stride, self.pad
        oh, ow = get_conv_outsize(h, kh, sh, ph), get_conv_outsize(w, kw, sw, pw)
        table, _, _ = _onnx_windows(b, (h, w), self.kernel_size, self.stride, self.pad)
        rows = _onnx_padded_rows(b, b.x(node, 0), self.pad)
        col = b.op("Reshape", [b.op("Gather", [rows, table], axis=2),
                               b.ints([0, 0, kh, kw, oh, ow])])
        if self.to_matrix:
            col = b.op("Transpose", [col], perm=[0, 4, 5, 1, 2, 3])
            col = b.op("Reshape", [col, b.ints([-1, c * kh * kw])])
        b.bind(node, col)

    def backward(self, gy):
        x, = self.inputs
        return Col2im(x.shape, self.kernel_size, self.stride, self.pad, self.to_matrix)(gy)

    def shape_rule(self, x):
        shape = _col_shape("im2col", None, x.shape, self.kernel_size, self.stride, self.pad,
                           self.to_matrix)
        return ShapeDtype(shape, x.dtype)


@primitive
class Col2im(Primitive):
    kind = MATMUL
    params = ("input_shape", "kernel_size", "stride", "pad", "to_matrix")

    def __init__(self, input_shape, kernel_size, stride=1, pad=0, to_matrix=True):
        self.input_shape = tuple(int(d) for d in input_shape)
        if len(self.input_shape) != 4:
            raise ValueError(f"col2im: input_shape must be (N, C, H, W), got {input_shape}")
        self.kernel_size, self.stride, self.pad = _window("col2im", kernel_size, stride, pad)
        self.to_matrix = bool(to_matrix)

    def forward(self, x):
        self.shape_rule(ShapeDtype(x.shape, x.dtype))
        return col2im_array(x, self.input_shape, self.kernel_size, self.stride, self.pad,
                            self.to_matrix)

    def to_onnx(self, b, node):
        # Each window element added at the padded position it reads (im2col's inverse).
        c, h, w = node.out.shape[1:]
        (kh, kw), (sh, sw), (ph, pw) = self.kernel_size, self.stride, self.pad
        oh, ow = get_conv_outsize(h, kh, sh, ph), get_conv_outsize(w, kw, sw, pw)
        table, (K, L), padded = _onnx_windows(b, (h, w), self.kernel_size, self.stride,
                                              self.pad)
        col = b.x(node, 0, node.out.dtype)
        if self.to_matrix:
            col = b.op("Reshape", [col, b.ints([-1, oh, ow, c, kh, kw])])
            col = b.op("Transpose", [col], perm=[0, 3, 4, 5, 1, 2])
        col = b.op("Reshape", [col, b.ints([0, c, K * L])] if self.to_matrix else
                   [col, b.ints([0, 0, -1])])
        where = b.op("Expand", [table, b.op("Shape", [col])])
        b.bind(node, _onnx_scatter_image(b, node, col, where, (c, h, w), self.pad, padded))

    def backward(self, gy):
        return Im2col(self.kernel_size, self.stride, self.pad, self.to_matrix)(gy)

    def shape_rule(self, x):
        _col_shape("col2im", x.shape, self.input_shape, self.kernel_size, self.stride,
                   self.pad, self.to_matrix)
        return ShapeDtype(self.input_shape, x.dtype)
