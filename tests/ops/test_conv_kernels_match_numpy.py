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
