"""Item assignment into traced data (`x.data[0] = 5.0`, `x.data[x.data < 0] = 0.0`,
`W.data[1:3] = x.data[:2]`, `a[0] = 1.0` of an ndarray argument) compiles: an
AssignItem node whose result is written into the buffer as an in-place ufunc's is, so
an argument's or a captured Parameter's update is an effect of every compiled call,
and what reads the buffer later reads the update. It was an escape (the function ran
eagerly for good).
"""
import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")

WRITES = {
    "x.data[0] = 5.0": lambda d: d.__setitem__(0, 5.0),
    "x.data[mask] = 0.0": lambda d: d.__setitem__(d < 0, 0.0),
    "x.data[1:] = x.data[:-1] * 2": lambda d: d.__setitem__(slice(1, None), d[:-1] * 2),
    "x.data[1:] = x.data[:-1] (overlapping)": lambda d: d.__setitem__(slice(1, None),
                                                                     d[:-1]),
    "x.data[::2] = float(...)": lambda d: d.__setitem__(slice(None, None, 2),
                                                       float(d.sum())),
    "x.data[[0, 2]] = [1.0, 2.0]": lambda d: d.__setitem__([0, 2], [1.0, 2.0]),
    "x.data[...] = a list of traced numbers": lambda d: d.__setitem__(
        Ellipsis, [d.max(), d.min(), 0.5, float(d.mean())]),
}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", list(WRITES))
def test_a_write_into_an_arguments_data_is_an_effect_of_every_call(name, dtype):
    write = WRITES[name]

    def f(x):
        write(x.data)
        return x * 2.0, F.sum(x * x)

    jf = tj.jit(f)
    rng = np.random.default_rng(4)
    for _ in range(5):
        a = rng.normal(size=4).astype(dtype)
        xe, xj = tj.Variable(a.copy()), tj.Variable(a.copy())
        e, j = f(xe), jf(xj)
        # The caller's array is written as eager writes it, and the results read it
        # (float(d.sum()) to float tolerance: a kernel's sum is not NumPy's pairwise).
        np.testing.assert_allclose(xj.data, xe.data, rtol=1e-6)
        assert xj.data.dtype == xe.data.dtype
        np.testing.assert_allclose(j[0].data, e[0].data, rtol=1e-6)
        np.testing.assert_allclose(j[1].data, e[1].data, rtol=1e-5)
        assert j[0].dtype == e[0].dtype
        e[1].backward()
        j[1].backward()
        np.testing.assert_allclose(xj.grad.data, xe.grad.data, rtol=1e-6)
    info = jf.cache_info()
    assert info["fallbacks"] == 0 and info["hits"] >= 3, info


def test_a_write_into_an_ndarray_argument_is_the_callers():
    def f(a, x):
        a[0] = 1.0
        a[a < 0] = -1.0
        return x * tj.Variable(a * 2.0)

    jf = tj.jit(f)
    rng = np.random.default_rng(5)
    for _ in range(5):
        a, b = rng.normal(size=3), rng.normal(size=3)
        ae, aj = a.copy(), a.copy()
        e, j = f(ae, tj.Variable(b)), jf(aj, tj.Variable(b))
        np.testing.assert_array_equal(aj, ae)
        np.testing.assert_array_equal(j.data, e.data)
    assert jf.cache_info()["hits"] >= 3


def test_a_write_into_a_captured_parameter_follows_the_parameter():
    W = tj.Parameter(np.ones(4))

    def f(x):
        W.data[1:3] = x.data[:2]
        return F.sum(x * W)

    jf = tj.jit(f)
    rng = np.random.default_rng(6)
    for call in range(5):
        start = rng.normal(size=4)       # the caller changes W between calls
        a = rng.normal(size=4)
        W.data[...] = start
        xe = tj.Variable(a.copy())
        ye = f(xe)
        ye.backward()
        We, W.data[...] = W.data.copy(), start
        W.cleargrad()
        xj = tj.Variable(a.copy())
        yj = jf(xj)
        yj.backward()
        np.testing.assert_array_equal(W.data, We)
        np.testing.assert_allclose(yj.data, ye.data, rtol=1e-12)
        np.testing.assert_allclose(xj.grad.data, xe.grad.data, rtol=1e-12)
        W.cleargrad()
    assert jf.cache_info()["hits"] >= 3


def test_a_made_array_used_before_a_write_keeps_the_values_it_had():
    # y is computed from buf's zeros; the write after it changes buf, not y.
    def f(x):
        buf = np.zeros(4)
        y = x.data + buf
        buf[:] = 5.0
        buf[0] = float(x.data.max())
        return x * tj.Variable(y), buf, buf

    jf = tj.jit(f)
    rng = np.random.default_rng(7)
    for _ in range(5):
        a = rng.normal(size=4)
        e, j = f(tj.Variable(a.copy())), jf(tj.Variable(a.copy()))
        np.testing.assert_array_equal(j[0].data, e[0].data)
        np.testing.assert_array_equal(j[1], e[1])
        assert type(j[1]) is np.ndarray
        assert j[1] is j[2]          # one array in two places, as eager's
    info = jf.cache_info()
    assert info["fallbacks"] == 0 and info["hits"] >= 3, info


def test_an_index_from_a_traced_int_matches_eager():
    def f(x):
        buf = np.zeros(4)
        buf[int(x.data.argmax())] = 1.0
        return x * tj.Variable(buf)

    jf = tj.jit(f)
    rng = np.random.default_rng(8)
    for _ in range(8):
        a = rng.normal(size=4)
        np.testing.assert_array_equal(jf(tj.Variable(a.copy())).data,
                                      f(tj.Variable(a.copy())).data)


def test_an_update_through_a_slice_of_a_parameter_is_an_effect():
    # `W.data[1:3] -= lr * g` (a sparse update, an embedding's rows): the write through
    # the slice view is W.data[1:3] = the difference.
    W = tj.Parameter(np.ones(4))

    def f(x):
        W.data[1:3] -= 0.1 * x.data[:2]
        W.data[::3] *= 0.5
        return F.sum(x * W)

    jf = tj.jit(f)
    rng = np.random.default_rng(9)
    for call in range(5):
        start, a = rng.normal(size=4), rng.normal(size=4)
        W.data[...] = start
        ye = f(tj.Variable(a.copy()))
        We = W.data.copy()
        W.data[...] = start
        yj = jf(tj.Variable(a.copy()))
        np.testing.assert_allclose(W.data, We, rtol=1e-12)
        np.testing.assert_allclose(yj.data, ye.data, rtol=1e-12)
    assert jf.cache_info()["hits"] >= 3


def test_a_written_slice_returned_is_a_view_of_the_argument():
    def f(x):
        v = x.data[::2]
        v += 1.0
        return x * 2.0, v

    jf = tj.jit(f)
    rng = np.random.default_rng(10)
    for _ in range(5):
        a = rng.normal(size=4)
        xe, xj = tj.Variable(a.copy()), tj.Variable(a.copy())
        (ye, ve), (yj, vj) = f(xe), jf(xj)
        np.testing.assert_array_equal(xj.data, xe.data)
        np.testing.assert_array_equal(yj.data, ye.data)
        np.testing.assert_array_equal(vj, ve)
        assert np.shares_memory(vj, xj.data)       # eager's is a view of x's data
    assert jf.cache_info()["hits"] >= 3
