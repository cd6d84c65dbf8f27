"""The numba kernels behind the conv primitives (float32/float64) give exactly what the
NumPy code they replace gives (the path other dtypes still take): col2im's sums, max
pooling's values and its argmax (the first maximum in kh-major order, padding zeros
included, the first NaN wins), on the cases random data rarely hits: ties, windows of
negatives over padding, NaNs, overlapping and gapped windows, non-contiguous inputs.
"""
import zlib

import numpy as np
import pytest

from tracejit.ops import conv as C


def _pool_reference(x, gy, z, k, s, p):
    # ops/conv.py's NumPy path (patch copies, argmax, put_along_axis, col2im).
    col = C._pool_cols(x, k, s, p)
    y = col.max(axis=2)
    idx = col.argmax(axis=2)[:, :, None]
    gcol = np.zeros(col.shape, gy.dtype)
    np.put_along_axis(gcol, idx, gy[:, :, None], axis=2)
    N, Cc, _, oh, ow = col.shape
    gx = C._col2im_numpy(gcol.reshape(N, Cc, k[0], k[1], oh, ow), x.shape, k, s, p, False)
    gz = np.take_along_axis(C._pool_cols(z, k, s, p), idx, axis=2)[:, :, 0]
    return y, gx, gz


WINDOWS = [((2, 2), (2, 2), (0, 0)), ((3, 3), (1, 1), (1, 1)), ((2, 3), (3, 1), (1, 2)),
           ((3, 2), (2, 3), (2, 0)), ((1, 1), (2, 2), (0, 0))]


def _inputs(rng, dtype, kind):
    x = rng.standard_normal((2, 3, 7, 6))
    if kind == "ties":
        x = np.round(x)                           # many equal maxima in a window
    elif kind == "negative":
        x = -np.abs(x) - 0.5                      # a padding zero is every border max
    elif kind == "nan":
        x[rng.random(x.shape) < 0.15] = np.nan
    elif kind == "strided":
        x = rng.standard_normal((2, 3, 12, 7))[:, :, ::2, :]   # not contiguous
    return x.astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("kind", ["random", "ties", "negative", "nan", "strided"])
@pytest.mark.parametrize("k,s,p", WINDOWS)
def test_max_pooling_kernels_equal_numpy(dtype, kind, k, s, p):
    rng = np.random.default_rng(zlib.crc32(repr((kind, k, s, p)).encode()))
    x = _inputs(rng, dtype, kind)
    pool = C.Pooling(k, s, p)
    oshape = pool._pooled(x)
    gy = rng.standard_normal(oshape).astype(dtype)
    z = rng.standard_normal(x.shape).astype(dtype)
    y_ref, gx_ref, gz_ref = _pool_reference(x, gy, z, k, s, p)
    y = pool.forward(x)
    gx = C.Pooling2DGrad(k, s, p).forward(x, gy)
    gz = C.Pooling2DWithIndexes(k, s, p).forward(x, z)
    for got, want in ((y, y_ref), (gx, gx_ref), (gz, gz_ref)):
        assert got.dtype == want.dtype and got.shape == want.shape
        # The same argmax: the same values (NaN where NumPy has NaN); gx's sums of
        # overlapping windows may add in another order (float32 rounding only).
        tol = 1e-5 if dtype == np.float32 else 1e-12
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol, equal_nan=True)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("to_matrix", [False, True])
@pytest.mark.parametrize("k,s,p", WINDOWS)
def test_col2im_kernel_equals_numpy(dtype, to_matrix, k, s, p):
    rng = np.random.default_rng(7)
    shape = (2, 3, 7, 6)
    col_shape = C._col_shape("col2im", None, shape, k, s, p, to_matrix)
    col = rng.standard_normal(col_shape).astype(dtype)
    got = C.col2im_array(col, shape, k, s, p, to_matrix)
    want = C._col2im_numpy(col, shape, k, s, p, to_matrix)
    assert got.dtype == want.dtype and got.shape == want.shape
    tol = 1e-6 if dtype == np.float32 else 1e-13
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    # A non-contiguous (broadcast) column array, as average pooling's backward passes.
    b = np.broadcast_to(col[:1], col.shape)
    np.testing.assert_allclose(C.col2im_array(b, shape, k, s, p, to_matrix),
                               C._col2im_numpy(b, shape, k, s, p, to_matrix),
                               rtol=tol, atol=tol)


def _strided_patches(x, k, s, p):
    # ops/conv.py's NumPy path: a copy of a strided view of the padded image.
    return C._patches(x, k, s, p).copy()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("kind", ["random", "nan", "strided"])
@pytest.mark.parametrize("k,s,p", WINDOWS + [((3, 3), (1, 1), (2, 2)), ((3, 1), (1, 2), (0, 1))])
def test_im2col_kernel_equals_numpy(dtype, kind, k, s, p):
    rng = np.random.default_rng(zlib.crc32(repr(("im2col", kind, k, s, p)).encode()))
    x = _inputs(rng, dtype, kind)
    got = C.im2col_array(x, k, s, p, to_matrix=False)
    want = _strided_patches(x, k, s, p)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)      # a copy: bit for bit, NaN included


def _conv_reference(x, W, s, p):
    # The (OH, OW) layout path, float64 sums (the wide path's cut columns are the
    # difference under test).
    col = _strided_patches(x.astype(np.float64), W.shape[2:], s, p)
    return np.einsum("nckluv,ockl->nouv", col, W.astype(np.float64))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape,k,p", [((2, 3, 7, 6), (3, 3), (1, 1)),
                                       ((1, 1, 5, 9), (2, 3), (0, 2)),
                                       ((3, 2, 4, 4), (1, 1), (0, 0)),
                                       ((2, 2, 3, 8), (3, 1), (2, 0))])
def test_wide_stride1_conv_equals_the_patch_product(dtype, shape, k, p):
    # Stride 1 runs over the wide OH x Wp grid (conv._conv_wide): the same values, and
    # a NaN or inf pixel reaches exactly the outputs whose windows hold it (the cut
    # columns read other pixels: none of their products may leak into an output).
    rng = np.random.default_rng(zlib.crc32(repr((shape, k, p)).encode()))
    x = rng.standard_normal(shape).astype(dtype)
    W = rng.standard_normal((4, shape[1]) + k).astype(dtype)
    for bad in (None, np.nan, np.inf):
        if bad is not None:
            x[rng.random(shape) < 0.1] = bad
        with np.errstate(invalid="ignore"):          # inf - inf: NaN, as wanted
            got = C.Conv2d(1, p).forward(x, W)
            want = _conv_reference(x, W, (1, 1), p)
        assert got.dtype == np.dtype(dtype) and got.shape == want.shape
        tol = 1e-5 if dtype == np.float32 else 1e-12
        np.testing.assert_allclose(got, want.astype(dtype), rtol=tol, atol=tol, equal_nan=True)
        assert (np.isnan(got) == np.isnan(want)).all() and (np.isinf(got) == np.isinf(want)).all()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("C_in,OC", [(1, 16), (16, 4), (3, 3)])
@pytest.mark.parametrize("k,s,p", WINDOWS)
def test_weight_gradient_layouts_equal_the_patch_product(dtype, C_in, OC, k, s, p):
    # Conv2DGradW takes gy @ col^T or (col @ gy^T)^T by the shapes: both are the sum
    # over images and output pixels of gy * patches.
    rng = np.random.default_rng(zlib.crc32(repr((C_in, OC, k, s, p)).encode()))
    x = rng.standard_normal((3, C_in, 7, 6)).astype(dtype)
    oh, ow = C._out_hw("conv2d", x.shape, k, s, p)
    gy = rng.standard_normal((3, OC, oh, ow)).astype(dtype)
    got = C.Conv2DGradW(k, s, p).forward(x, gy)
    want = np.einsum("nckluv,nouv->ockl", _strided_patches(x.astype(np.float64), k, s, p),
                     gy.astype(np.float64))
    assert got.dtype == np.dtype(dtype) and got.shape == want.shape and \
        got.flags.c_contiguous
    tol = 1e-4 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


def _deconv_reference(x, W, shape, s, p):
    # Every column added back to its pixel: the loops of DeZero's col2im, float64.
    col = np.einsum("nchw,cokl->noklhw", x.astype(np.float64), W.astype(np.float64))
    N, C, KH, KW, oh, ow = col.shape
    img = np.zeros((N, C, shape[2] + 2 * p[0], shape[3] + 2 * p[1]))
    for i in range(oh):
        for j in range(ow):
            img[:, :, i * s[0]:i * s[0] + KH, j * s[1]:j * s[1] + KW] += col[..., i, j]
    return img[:, :, p[0]:p[0] + shape[2], p[1]:p[1] + shape[3]]


@pytest.mark.parametrize("chunk_bytes", [1, 5000, 1 << 18])
@pytest.mark.parametrize("k,s,p", [((3, 3), (1, 1), (1, 1)), ((2, 3), (2, 1), (1, 0))])
def test_conv_ops_run_in_chunks_of_images_with_the_same_values(monkeypatch, chunk_bytes,
                                                               k, s, p):
    # conv2d, deconv2d and the weight gradient run a few images at a time through small
    # buffers (conv._chunk): one image per chunk, a last chunk of fewer, or all at once
    # give the same values.
    monkeypatch.setattr(C, "_CHUNK_BYTES", chunk_bytes)
    rng = np.random.default_rng(11)
    x = rng.standard_normal((7, 3, 8, 7)).astype(np.float32)
    W = rng.standard_normal((5, 3) + k).astype(np.float32)
    oh, ow = C._out_hw("conv2d", x.shape, k, s, p)
    gy = rng.standard_normal((7, 5, oh, ow)).astype(np.float32)
    y = C.Conv2d(s, p).forward(x, W)
    np.testing.assert_allclose(y, _conv_reference(x, W, s, p), rtol=1e-5, atol=1e-5)
    gx = C.Deconv2d(s, p, x.shape[2:]).forward(gy, W)
    np.testing.assert_allclose(gx, _deconv_reference(gy, W, x.shape, s, p), rtol=1e-5,
                               atol=1e-5)
    gW = C.Conv2DGradW(k, s, p).forward(x, gy)
    want = np.einsum("nckluv,nouv->ockl", _strided_patches(x.astype(np.float64), k, s, p),
                     gy.astype(np.float64))
    np.testing.assert_allclose(gW, want, rtol=1e-4, atol=1e-4)
    for got in (y, gx, gW):
        assert got.dtype == np.float32 and got.flags.c_contiguous


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("C_in,OC", [(1, 16), (16, 4)])
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_weight_gradient_sees_only_the_windows_pixels(dtype, C_in, OC, bad):
    # A NaN or inf pixel reaches exactly the weights whose windows cover it, in both
    # GEMM layouts (a faster path that sums over extra, padding-like columns must hold
    # zeros there: 0 * inf is NaN). Pixels at the right edge, where the wide grid of
    # _conv_wide has its extra columns.
    rng = np.random.default_rng(zlib.crc32(repr((C_in, OC, str(bad))).encode()))
    x = rng.standard_normal((3, C_in, 6, 5)).astype(dtype)
    x[0, 0, 2, 4] = bad                       # the last column: read by extra columns
    x[1, -1, 0, 0] = bad
    gy = rng.standard_normal((3, OC, 6, 5)).astype(dtype)
    with np.errstate(invalid="ignore"):
        got = C.Conv2DGradW((3, 3), 1, 1).forward(x, gy)
        want = np.einsum("nckluv,nouv->ockl",
                         _strided_patches(x.astype(np.float64), (3, 3), (1, 1), (1, 1)),
                         gy.astype(np.float64))
    assert (np.isnan(got) == np.isnan(want)).all()
    assert (np.isinf(got) == np.isinf(want)).all()
    fin = np.isfinite(want)
    tol = 1e-4 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(got[fin], want[fin], rtol=tol, atol=tol)
