"""numba kernels for the convolution primitives (ops/conv.py), imported on first use so
that `import tracejit` does not import numba.

Each kernel is the direct loop of a NumPy reference in ops/conv.py (the strided-view
code there, kept for other dtypes and as the tests' reference) and gives the same
values: im2col's patches (padding zeros), col2im and the pooling gradients as
scatter-adds into a zeroed image with bounds checks for the padding (no padded
buffer, no crop copy), the max pooling argmax as NumPy's (the first maximum in
kh-major order, padding zeros included, a NaN wins). Serial loops: the conv ops are
MATMUL-kind calls between fused kernels, and BLAS's threads run beside them.

The 6 logical axes of a patch array are (n, c, kh, kw, oh, ow); col2im takes the
element strides of each in the flat buffer, so one kernel reads both layouts the ops
use: (N, C, KH, KW, OH, OW) and DeZero's matrix (N*OH*OW, C*KH*KW).

Arrays are indexed flat with unsigned (uint64) offsets: a signed index makes numba
test it for a negative (wrap-around) value on every access, which kept LLVM from
vectorizing the inner loops. Measured on the W6 CNN's second conv (32x16x14x14, 3x3,
pad 1; loaded 2-core machine): im2col 0.41 ms as NumPy's padded strided copy, 0.33 ms
here with signed indices 1.2 ms; col2im 0.27 ms against 0.91 ms with signed indices.
"""
import numba
import numpy as np
from numba import uint64 as _u

_jit = numba.njit(cache=True, nogil=True, error_model="numpy")


@numba.njit(inline="always")
def _ow_range(kw, SW, PW, W, OW):
    # The output columns ow whose input column ow*SW + kw - PW lies inside [0, W): the
    # loops over them need no bounds check (the rest reads padding).
    lo = 0 if kw >= PW else (PW - kw + SW - 1) // SW
    hi = (W - 1 + PW - kw) // SW + 1 if W - 1 + PW - kw >= 0 else 0
    return min(lo, OW), max(min(hi, OW), min(lo, OW))


@_jit
def im2col(x, col, N, C, H, W, KH, KW, SH, SW, PH, PW):
    # col (flat, N, C, KH, KW, OH, OW) = the patches of x (flat, N, C, H, W), zeros
    # where a window reads padding.
    OH = (H + 2 * PH - KH) // SH + 1
    OW = (W + 2 * PW - KW) // SW + 1
    z = col.dtype.type(0)
    uow, us = _u(OW), _u(SW)
    o = _u(0)
    for n in range(N):
        for c in range(C):
            xb = (n * C + c) * H * W
            for kh in range(KH):
                for kw in range(KW):
                    lo, hi = _ow_range(kw, SW, PW, W, OW)
                    ulo, uhi = _u(lo), _u(hi)
                    for oh in range(OH):
                        h = oh * SH + kh - PH
                        if h < 0 or h >= H:
                            for j in range(uow):
                                col[o + j] = z
                        else:
                            for j in range(ulo):
                                col[o + j] = z
                            # lo * SW + kw - PW >= 0: the first column inside the image
                            src = _u(xb + h * W + lo * SW + kw - PW)
                            d = o + ulo
                            if SW == 1:
                                for j in range(uhi - ulo):
                                    col[d + j] = x[src + j]
                            else:
                                for j in range(uhi - ulo):
                                    col[d + j] = x[src + j * us]
                            for j in range(uhi, uow):
                                col[o + j] = z
                        o += uow


@_jit
def im2col_wide(xp, col, NC, S, KH, KW, Wp, L):
    # Stride 1: xp (flat) holds NC zero-padded images of Hp x Wp, each followed by
    # KW - 1 spare elements (S = Hp * Wp + KW - 1 per image). Row (kh, kw) of an image's
    # columns, over the "wide" output grid OH x Wp (L = OH * Wp elements, of which the
    # last KW - 1 of every output row are not outputs), is one contiguous run of xp:
    # xp[kh * Wp + kw + oh * Wp + ow]. So the copy is NC * KH * KW runs of L elements,
    # not rows of OW. The extra columns read whatever lies there (the next row's
    # padding or pixels): their products are computed and cut off (conv._conv_wide).
    o = _u(0)
    uL = _u(L)
    for i in range(NC):
        b = i * S
        for kh in range(KH):
            for kw in range(KW):
                src = _u(b + kh * Wp + kw)
                for j in range(uL):
                    col[o + j] = xp[src + j]
                o += uL


@_jit
def col2im(col, img, KH, KW, SH, SW, PH, PW, st):
    # img[n, c, h, w] += col[n, c, kh, kw, oh, ow] where h = oh*SH + kh - PH (and w
    # alike) falls inside the image: the adjoint of im2col. img starts zeroed; col is
    # flat, its axes at the element strides st.
    N, C, H, W = img.shape
    f = img.reshape(-1)
    OH = (H + 2 * PH - KH) // SH + 1
    OW = (W + 2 * PW - KW) // SW + 1
    s0, s1, s2, s3, s4, s5 = st
    us, u5 = _u(SW), _u(s5)
    for n in range(N):
        for c in range(C):
            xb = (n * C + c) * H * W
            for kh in range(KH):
                for kw in range(KW):
                    base = n * s0 + c * s1 + kh * s2 + kw * s3
                    lo, hi = _ow_range(kw, SW, PW, W, OW)
                    cnt = _u(hi - lo)
                    for oh in range(OH):
                        h = oh * SH + kh - PH
                        if h < 0 or h >= H:
                            continue
                        dst = _u(xb + h * W + lo * SW + kw - PW)
                        o = _u(base + oh * s4 + lo * s5)
                        if SW == 1 and s5 == 1:
                            for j in range(cnt):
                                f[dst + j] += col[o + j]
                        else:
                            for j in range(cnt):
                                f[dst + j * us] += col[o + j * u5]


@numba.njit(inline="always")
def _argmax(x, b, H, W, oh, ow, KH, KW, SH, SW, PH, PW):
    # The window's first maximum in kh-major order (np.argmax over im2col's rows) in
    # the image at flat offset b (unsigned) of x, padding counting as 0; the first NaN
    # wins, as in NumPy's max and argmax. Returns (max, flat offset in the image as a
    # signed int), -1 when the maximum is a padding zero. Unsigned arithmetic stays
    # unsigned throughout (uint64 + int64 is float64 in numba's typing).
    h0, w0 = oh * SH - PH, ow * SW - PW
    one, uW = _u(1), _u(W)
    if KH == 2 and KW == 2 and h0 >= 0 and w0 >= 0 and h0 + 2 <= H and w0 + 2 <= W:
        # The common 2x2 window, unrolled (the loops below run 2x slower on it), with
        # selects, not branches: on random data a branch per element mispredicted
        # (the 32x32x14x14 gradient: 0.10 ms against 0.39 ms).
        i = _u(h0 * W + w0)
        a, bb = x[b + i], x[b + i + one]
        d, e = x[b + i + uW], x[b + i + uW + one]
        m = bb > a
        best = bb if m else a
        at = i + one if m else i
        m = d > best
        best = d if m else best
        at = i + uW if m else at
        m = e > best
        best = e if m else best
        at = i + uW + one if m else at
        if not ((a != a) | (bb != bb) | (d != d) | (e != e)):
            return best, np.int64(at)
    elif h0 >= 0 and w0 >= 0 and h0 + KH <= H and w0 + KW <= W:
        # Inside the image (most windows): no bounds checks, NaN handled after.
        i0 = _u(h0 * W + w0)
        best = x[b + i0]
        at = i0
        nan = best != best
        for kh in range(_u(KH)):
            r = i0 + kh * uW
            for kw in range(_u(KW)):
                v = x[b + r + kw]
                if v > best:
                    best, at = v, r + kw
                nan |= v != v
        if not nan:
            return best, np.int64(at)
    best = x.dtype.type(0)
    pos = np.int64(-1)
    for kh in range(KH):
        h = h0 + kh
        for kw in range(KW):
            w = w0 + kw
            if 0 <= h < H and 0 <= w < W:
                v, vp = x[b + _u(h * W + w)], np.int64(h * W + w)
            else:
                v, vp = x.dtype.type(0), np.int64(-1)
            if (kh == 0 and kw == 0) or not v <= best:
                best, pos = v, vp
                if v != v:
                    return best, pos
    return best, pos


@numba.njit(inline="always")
def _first_max4(a, b, d, e):
    # (max, position 0-3) of a 2x2 window in kh-major order, the first maximum, by
    # selects (no data-dependent branch); for windows without NaN (callers check).
    m = b > a
    best = b if m else a
    k = _u(1) if m else _u(0)
    m = d > best
    best = d if m else best
    k = _u(2) if m else k
    m = e > best
    best = e if m else best
    k = _u(3) if m else k
    return best, k


@numba.njit(inline="always")
def _pool22(x, y, gy, gx, mode):
    # The 2x2 window at stride 2 without padding (the CNNs' pooling), as one loop with
    # no bounds checks and no branch on the data: mode 0 pools x into y, mode 1 adds
    # gy at each window's argmax into gx. A window holding a NaN goes to _argmax (NaN
    # wins, as in NumPy). The 32x32x14x14 gradient: 0.10 ms against 0.30 ms by _argmax.
    N, C, H, W = x.shape
    OH, OW = H // 2, W // 2
    xf = x.reshape(-1)
    yf = y.reshape(-1) if mode == 0 else gy.reshape(-1)
    gxf = gx.reshape(-1)
    z = gx.dtype.type(0)
    uW, one, two = _u(W), _u(1), _u(2)
    o = _u(0)
    for nc in range(N * C):
        b = _u(nc * H * W)
        for oh in range(_u(OH)):
            r = b + two * oh * uW
            for ow in range(_u(OW)):
                i = r + two * ow
                a, bb, d, e = xf[i], xf[i + one], xf[i + uW], xf[i + uW + one]
                best, k = _first_max4(a, bb, d, e)
                at = i + (k >> one) * uW + (k & one)
                if (a != a) | (bb != bb) | (d != d) | (e != e):
                    best, pos = _argmax(xf, b, H, W, np.int64(oh), np.int64(ow), 2, 2, 2,
                                        2, 0, 0)
                    at = b + _u(pos)
                if mode == 0:
                    yf[o] = best
                else:
                    # Windows do not overlap: all four written, gy at the argmax (no
                    # zeroed buffer to allocate and read back).
                    gxf[i] = z
                    gxf[i + one] = z
                    gxf[i + uW] = z
                    gxf[i + uW + one] = z
                    gxf[at] = yf[o]
                o += one
        if mode == 1:
            # An odd H or W: the last row / column is in no window.
            if H % 2:
                for w in range(_u(W)):
                    gxf[b + _u(H - 1) * uW + w] = z
            if W % 2:
                for h in range(_u(H)):
                    gxf[b + h * uW + _u(W - 1)] = z


@_jit
def max_pool(x, y, KH, KW, SH, SW, PH, PW):
    if KH == 2 and KW == 2 and SH == 2 and SW == 2 and PH == 0 and PW == 0:
        _pool22(x, y, y, y, 0)
        return
    N, C, OH, OW = y.shape
    H, W = x.shape[2], x.shape[3]
    xf, yf = x.reshape(-1), y.reshape(-1)
    o, one = _u(0), _u(1)
    for nc in range(N * C):
        b = _u(nc * H * W)
        for oh in range(OH):
            for ow in range(OW):
                yf[o] = _argmax(xf, b, H, W, oh, ow, KH, KW, SH, SW, PH, PW)[0]
                o += one


@_jit
def max_pool_grad(x, gy, gx, KH, KW, SH, SW, PH, PW):
    # gx (x's shape, any contents) = the sum of gy at each window's argmax; a padding
    # argmax drops it.
    if KH == 2 and KW == 2 and SH == 2 and SW == 2 and PH == 0 and PW == 0:
        _pool22(x, gy, gy, gx, 1)
        return
    N, C, OH, OW = gy.shape
    H, W = x.shape[2], x.shape[3]
    xf, gf, gxf = x.reshape(-1), gy.reshape(-1), gx.reshape(-1)
    gxf[:] = 0
    o, one = _u(0), _u(1)
    for nc in range(N * C):
        b = _u(nc * H * W)
        for oh in range(OH):
            for ow in range(OW):
                at = _argmax(xf, b, H, W, oh, ow, KH, KW, SH, SW, PH, PW)[1]
                if at >= 0:
                    gxf[b + _u(at)] += gf[o]
                o += one


@_jit
def max_pool_gather(x, z, y, KH, KW, SH, SW, PH, PW):
    # y[window] = z at x's argmax of the window (0 where that is padding).
    N, C, OH, OW = y.shape
    H, W = x.shape[2], x.shape[3]
    xf, zf, yf = x.reshape(-1), z.reshape(-1), y.reshape(-1)
    o, one = _u(0), _u(1)
    for nc in range(N * C):
        b = _u(nc * H * W)
        for oh in range(OH):
            for ow in range(OW):
                at = _argmax(xf, b, H, W, oh, ow, KH, KW, SH, SW, PH, PW)[1]
                yf[o] = zf[b + _u(at)] if at >= 0 else 0
                o += one


@numba.njit(inline="always")
def _bias_relu(v, bias, relu, z):
    # The pre-activation's ReLU (NaN propagates, as ReLU's expr and np.maximum(x, 0)).
    a = v + bias
    return a, ((a if not a <= 0 else z) if relu else a)


@_jit
def conv_epilogue(src, rs, bias, relu, pre, act, pooled, N, OC, OH, OW):
    # src (flat): N * OC images of OH rows of rs elements, the first OW of each row the
    # conv's output (rs > OW: conv._conv_wide's wide grid). Per element a = src + bias[c]
    # (bias empty: none) and r = ReLU(a) (relu) are written to pre / act (flat, N, OC,
    # OH, OW) where those are not empty; pooled (not empty: the 2x2, stride 2 max
    # pooling of r, as _pool22) is computed from registers, so r need not be written.
    has_b, keep_a, keep_r, pool = bias.size > 0, pre.size > 0, act.size > 0, \
        pooled.size > 0
    z = src.dtype.type(0)
    urs, uOW, one = _u(rs), _u(OW), _u(1)
    o = _u(0)
    for n in range(N):
        for c in range(OC):
            b = bias[c] if has_b else z
            base = _u((n * OC + c) * OH * rs)
            if keep_a or keep_r:
                for h in range(_u(OH)):
                    s = base + h * urs
                    for w in range(uOW):
                        a, r = _bias_relu(src[s + w], b, relu, z)
                        if keep_a:
                            pre[o + w] = a
                        if keep_r:
                            act[o + w] = r
                    o += uOW
            if pool:
                # Output positions computed, not counted: the loop over ow has no carried
                # index, so LLVM can vectorize it (the NaN rule as selects).
                OH2, OW2 = _u(OH // 2), _u(OW // 2)
                q = _u((n * OC + c)) * OH2 * OW2
                for oh in range(OH2):
                    s = base + _u(2) * oh * urs
                    d = q + oh * OW2
                    for ow in range(OW2):
                        i = s + _u(2) * ow
                        va = _bias_relu(src[i], b, relu, z)[1]
                        vb = _bias_relu(src[i + one], b, relu, z)[1]
                        vd = _bias_relu(src[i + urs], b, relu, z)[1]
                        ve = _bias_relu(src[i + urs + one], b, relu, z)[1]
                        best = _first_max4(va, vb, vd, ve)[0]
                        # NaN wins, the first in kh-major order (NumPy's max).
                        best = ve if ve != ve else best
                        best = vd if vd != vd else best
                        best = vb if vb != vb else best
                        best = va if va != va else best
                        pooled[d + ow] = best


@_jit
def max_pool_grad_masked(x, gy, a, gx, s):
    # The 2x2, stride 2 max pooling's gradient (as _pool22 mode 1) times the mask a > 0
    # (ReLU's backward), in one pass: gx[argmax] = gy * (a[argmax] > 0), zeros
    # elsewhere (0 * mask). s (shape (C,), empty: not wanted) gets the sum of gx over
    # n, h, w (the bias's gradient), accumulated in float64.
    N, C, H, W = x.shape
    OH, OW = H // 2, W // 2
    xf, gf, af, gxf = x.reshape(-1), gy.reshape(-1), a.reshape(-1), gx.reshape(-1)
    z = gx.dtype.type(0)
    want = s.size > 0
    acc = np.zeros(C, np.float64)
    uW, one, two = _u(W), _u(1), _u(2)
    o = _u(0)
    for nc in range(N * C):
        b = _u(nc * H * W)
        tot = 0.0
        for oh in range(_u(OH)):
            r = b + two * oh * uW
            for ow in range(_u(OW)):
                i = r + two * ow
                va, vb, vd, ve = xf[i], xf[i + one], xf[i + uW], xf[i + uW + one]
                k = _first_max4(va, vb, vd, ve)[1]
                at = i + (k >> one) * uW + (k & one)
                if (va != va) | (vb != vb) | (vd != vd) | (ve != ve):
                    pos = _argmax(xf, b, H, W, np.int64(oh), np.int64(ow), 2, 2, 2, 2,
                                  0, 0)[1]
                    at = b + _u(pos)
                gxf[i] = z
                gxf[i + one] = z
                gxf[i + uW] = z
                gxf[i + uW + one] = z
                g = gf[o] * (gx.dtype.type(1) if af[at] > 0 else z)
                gxf[at] = g
                tot += g
                o += one
        if H % 2:
            for w in range(_u(W)):
                gxf[b + _u(H - 1) * uW + w] = z
        if W % 2:
            for h in range(_u(H)):
                gxf[b + h * uW + _u(W - 1)] = z
        acc[nc % C] += tot
    if want:
        for c in range(C):
            s[c] = acc[c]
