"""numba kernels for the convolution primitives (ops/conv.py), imported on first use so
that `import tracejit` does not import numba.

Each kernel is the direct loop of a NumPy reference in ops/conv.py (the strided-view
code there, kept for other dtypes and as the tests' reference) and gives the same
values: col2im and the pooling gradients as scatter-adds into a zeroed image with
bounds checks for the padding (no padded buffer, no crop copy), the max pooling
argmax as NumPy's (the first maximum in kh-major order, padding zeros included, a NaN
wins). Serial loops: the conv ops are MATMUL-kind calls between fused kernels, and
BLAS's threads run beside them.

The 6 logical axes of a patch array are (n, c, kh, kw, oh, ow); col2im takes the
element strides of each in the flat buffer, so one kernel reads both layouts the ops
use: (N, C, KH, KW, OH, OW) and DeZero's matrix (N*OH*OW, C*KH*KW). im2col stays
NumPy's padded strided copy: a numba loop over rows of OW elements was 2x slower.
"""
import numba
import numpy as np

_jit = numba.njit(cache=True, nogil=True, error_model="numpy")


@numba.njit(inline="always")
def _ow_range(kw, SW, PW, W, OW):
    # The output columns ow whose input column ow*SW + kw - PW lies inside [0, W): the
    # loops over them need no bounds check (the rest reads padding).
    lo = 0 if kw >= PW else (PW - kw + SW - 1) // SW
    hi = (W - 1 + PW - kw) // SW + 1 if W - 1 + PW - kw >= 0 else 0
    return min(lo, OW), max(min(hi, OW), min(lo, OW))


@_jit
def col2im(col, img, KH, KW, SH, SW, PH, PW, st):
    # img[n, c, h, w] += col[n, c, kh, kw, oh, ow] where h = oh*SH + kh - PH (and w
    # alike) falls inside the image: the adjoint of im2col. img starts zeroed.
    N, C, H, W = img.shape
    OH = (H + 2 * PH - KH) // SH + 1
    OW = (W + 2 * PW - KW) // SW + 1
    s0, s1, s2, s3, s4, s5 = st
    for n in range(N):
        for c in range(C):
            for kh in range(KH):
                for kw in range(KW):
                    base = n * s0 + c * s1 + kh * s2 + kw * s3
                    lo, hi = _ow_range(kw, SW, PW, W, OW)
                    w0 = kw - PW
                    for oh in range(OH):
                        h = oh * SH + kh - PH
                        if h < 0 or h >= H:
                            continue
                        o = base + oh * s4
                        if s5 == 1:
                            for ow in range(lo, hi):
                                img[n, c, h, ow * SW + w0] += col[o + ow]
                        else:
                            for ow in range(lo, hi):
                                img[n, c, h, ow * SW + w0] += col[o + ow * s5]


@numba.njit(inline="always")
def _argmax(x, n, c, oh, ow, KH, KW, SH, SW, PH, PW):
    # The window's first maximum in kh-major order (np.argmax over im2col's rows),
    # padding counting as 0; the first NaN wins, as in NumPy's max and argmax.
    # Returns (max, h, w), h = -1 when the maximum is a padding zero.
    H, W = x.shape[2], x.shape[3]
    h0, w0 = oh * SH - PH, ow * SW - PW
    if KH == 2 and KW == 2 and h0 >= 0 and w0 >= 0 and h0 + 2 <= H and w0 + 2 <= W:
        # The common 2x2 window, unrolled (the loops below run 2x slower on it).
        a, b = x[n, c, h0, w0], x[n, c, h0, w0 + 1]
        d, e = x[n, c, h0 + 1, w0], x[n, c, h0 + 1, w0 + 1]
        best, bh, bw = a, h0, w0
        if b > best:
            best, bw = b, w0 + 1
        if d > best:
            best, bh, bw = d, h0 + 1, w0
        if e > best:
            best, bh, bw = e, h0 + 1, w0 + 1
        if not (a != a or b != b or d != d or e != e):
            return best, bh, bw
    elif h0 >= 0 and w0 >= 0 and h0 + KH <= H and w0 + KW <= W:
        # Inside the image (most windows): no bounds checks, NaN handled after.
        best = x[n, c, h0, w0]
        bh, bw = h0, w0
        nan = best != best
        for h in range(h0, h0 + KH):
            for w in range(w0, w0 + KW):
                v = x[n, c, h, w]
                if v > best:
                    best, bh, bw = v, h, w
                nan |= v != v
        if not nan:
            return best, bh, bw
    best = x.dtype.type(0)
    bh, bw = -1, -1
    for kh in range(KH):
        h = h0 + kh
        for kw in range(KW):
            w = w0 + kw
            if 0 <= h < H and 0 <= w < W:
                v, vh, vw = x[n, c, h, w], h, w
            else:
                v, vh, vw = x.dtype.type(0), -1, -1
            if (kh == 0 and kw == 0) or not v <= best:
                best, bh, bw = v, vh, vw
                if v != v:
                    return best, bh, bw
    return best, bh, bw


@_jit
def max_pool(x, y, KH, KW, SH, SW, PH, PW):
    N, C, OH, OW = y.shape
    for n in range(N):
        for c in range(C):
            for oh in range(OH):
                for ow in range(OW):
                    y[n, c, oh, ow] = _argmax(x, n, c, oh, ow, KH, KW, SH, SW, PH, PW)[0]


@_jit
def max_pool_grad(x, gy, gx, KH, KW, SH, SW, PH, PW):
    # gx (zeroed, x's shape) += gy at each window's argmax; a padding argmax drops it.
    N, C, OH, OW = gy.shape
    for n in range(N):
        for c in range(C):
            for oh in range(OH):
                for ow in range(OW):
                    _, h, w = _argmax(x, n, c, oh, ow, KH, KW, SH, SW, PH, PW)
                    if h >= 0:
                        gx[n, c, h, w] += gy[n, c, oh, ow]


@_jit
def max_pool_gather(x, z, y, KH, KW, SH, SW, PH, PW):
    # y[window] = z at x's argmax of the window (0 where that is padding).
    N, C, OH, OW = y.shape
    for n in range(N):
        for c in range(C):
            for oh in range(OH):
                for ow in range(OW):
                    _, h, w = _argmax(x, n, c, oh, ow, KH, KW, SH, SW, PH, PW)
                    y[n, c, oh, ow] = z[n, c, h, w] if h >= 0 else 0
