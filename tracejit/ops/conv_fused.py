"""The fused forms of a convolution's epilogue and of its gradient's prologue, the ops
passes/conv_epilogue.py puts in place of a chain of primitives (as fusion's Fused
stands for an elementwise group): created by that pass only, on graphs already
differentiated, so they have no backward and are not in the primitive registry.

ConvEpilogue: conv2d(x, W), then + bias, ReLU and the 2x2 max pooling (each
optional), in one call: the bias, the ReLU and the pooling are computed by one kernel
(conv_kernels.conv_epilogue) from each chunk of the conv's products while those are in
the cache (ops/conv.py's _conv_wide_chunks), so the conv's own output is never written,
and of the pre-activation and the ReLU's output only what other nodes read is.

PoolGradMasked: max pooling's gradient times a mask `a > 0` (ReLU's backward), and
optionally its sum over (N, H, W) (the bias's gradient), in one pass over the image.

Each keeps the nodes it replaced (`replaces`): an export inlines them back
(exporting/symbolic.py's flatten), as it does a fused group's members.

Both give eager's values: the same float operations in the same order per element
(the bias add, np.maximum's NaN rule, the first maximum of each window, gy times the
mask as a 0/1 number); only the bias gradient's sum is in another order.
"""
import numpy as np

from tracejit.core import MATMUL, Function
from tracejit.ops import conv as C

_EMPTY = {}


def _empty(dtype):
    # The kernels take an empty array for an output or operand they should skip.
    dtype = np.dtype(dtype)
    if dtype not in _EMPTY:
        _EMPTY[dtype] = np.empty(0, dtype)
    return _EMPTY[dtype]


def pools_in_kernel(window):
    """Is the (kernel, stride, pad) of a max pooling the one the kernels compute (2x2,
    stride 2, no padding: non-overlapping windows)? Other windows run Pooling's own
    code on the materialized ReLU output."""
    return window == ((2, 2), (2, 2), (0, 0))


class ConvEpilogue(Function):
    """(x, W[, bias]) -> the kept ones of (pre-activation, ReLU output), then the pooled
    image with a pool window. Without one the pass keeps the chain's last value. bias
    has OC elements (any shape, as the add broadcast it); act is the pre-activation
    when relu is False."""

    kind = MATMUL
    params = ("stride", "pad", "relu", "pool", "keep_pre", "keep_act")

    def __init__(self, stride, pad, relu, pool, keep_pre, keep_act, replaces=()):
        self.stride, self.pad = stride, pad
        self.relu, self.pool = bool(relu), pool
        self.keep_pre, self.keep_act = bool(keep_pre), bool(keep_act)
        self.replaces = tuple(replaces)


    def forward(self, x, W, bias=None):
        N, OC = x.shape[0], W.shape[0]
        oh, ow = C._out_hw("conv2d", x.shape, W.shape[2:], self.stride, self.pad)
        dt = np.result_type(x, W)
        in_kernel = self.pool is not None and pools_in_kernel(self.pool)
        # Another pooling reads the ReLU's output, written whole.
        want_act = self.keep_act or (self.pool is not None and not in_kernel)
        pre = np.empty((N, OC, oh, ow), dt) if self.keep_pre else None
        act = np.empty((N, OC, oh, ow), dt) if want_act else None
        pooled = np.empty((N, OC, oh // 2, ow // 2), dt) if in_kernel else None
        b = _empty(dt) if bias is None else np.ascontiguousarray(bias).reshape(-1)
        k = C._kernels()

        def epilogue(src, rs, n0, n):
            part = [_empty(dt) if a is None else a[n0:n0 + n].reshape(-1)
                    for a in (pre, act, pooled)]
            k.conv_epilogue(src.reshape(-1), rs, b, self.relu, *part, n, OC, oh, ow)

        if self.stride == (1, 1):
            for n0, n, yw, Wp in C._conv_wide_chunks(x, W, self.pad):
                epilogue(yw, Wp, n0, n)
        else:
            epilogue(C._conv_forward(x, W, self.stride, self.pad), ow, 0, N)
        if self.pool is not None and not in_kernel:
            pooled = C.Pooling(*self.pool).forward(act)
        outs = [a for a, kept in ((pre, self.keep_pre), (act, self.keep_act)) if kept]
        if self.pool is not None:
            outs.append(pooled)
        return tuple(outs) if len(outs) > 1 else outs[0]


class PoolGradMasked(Function):
    """(x, gy, a) -> gx = Pooling2DGrad(x, gy) * (a > 0), then, with sum_shape, gx
    summed over axes (0, 2, 3) to sum_shape (OC elements: (OC, 1, 1) or (1, OC, 1, 1))."""

    kind = MATMUL
    params = ("kernel_size", "stride", "pad", "sum_shape")

    def __init__(self, kernel_size, stride, pad, sum_shape, replaces=()):
        self.kernel_size, self.stride, self.pad = kernel_size, stride, pad
        self.sum_shape = sum_shape
        self.replaces = tuple(replaces)


    def forward(self, x, gy, a):
        window = (self.kernel_size, self.stride, self.pad)
        if pools_in_kernel(window) and C._fast(x, gy, a) and x.shape == a.shape:
            gx = np.empty(x.shape, gy.dtype)
            s = np.empty(x.shape[1], gy.dtype) if self.sum_shape is not None else \
                _empty(gy.dtype)
            C._kernels().max_pool_grad_masked(np.ascontiguousarray(x),
                                              np.ascontiguousarray(gy),
                                              np.ascontiguousarray(a), gx, s)
            if self.sum_shape is None:
                return gx
            return gx, s.reshape(self.sum_shape)
        # Other windows and dtypes: eager's ops, one after the other.
        gx = C.Pooling2DGrad(*window).forward(x, gy) * (a > 0)
        if self.sum_shape is None:
            return gx
        return gx, gx.sum(axis=(0, 2, 3)).reshape(self.sum_shape)
