"""NumPy constructors given traced numbers in a list, a tuple or as a fill value compile
once and give eager's arrays on every call.

np.array([x.data.mean(), x.data.std()]), np.array([float(m), 1.0]), np.stack([lr,
2.0]), np.full(shape, float(v)) and np.array([x.data[0], 2 * x.data[1]]) are NumPy's
coercion of each item: it read traced numbers through __array__, so each was guarded
by its value and every new input retraced until max_variants (the compiled code never
ran); rows of traced data it copied straight from their buffers, so the graph froze
them and only the first-call check kept the answer right (the function then ran
eagerly for good). The items are now traced arrays of eager's dtype, stacked by a
recorded np.stack (trace/sequences.py).
"""
import numpy as np
import pytest

import tracejit as tj
from numpy_results import assert_same_result


def assert_close_result(e, j, source_dtype):
    """Eager's type and dtype, its values to the tolerance of the data they came from: a
    reduction compiled into a kernel (d.mean()) may sum in another order than NumPy's
    pairwise sum (float(mean) of float32 data is a float64 within float32's ulps)."""
    assert type(j) is type(e), (type(e), type(j))
    assert np.asarray(j).dtype == np.asarray(e).dtype
    rtol = 1e-5 if source_dtype == np.float32 else 1e-12
    np.testing.assert_allclose(np.asarray(j), np.asarray(e), rtol=rtol, atol=rtol)

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")

# Each takes d (an input's data, shape (3, 4)) and gives an array.
CALLS = {
    "np.array([mean, std])": lambda d: np.array([d.mean(), d.std()]),
    "np.asarray((max, min))": lambda d: np.asarray((d.max(), d.min())),
    "np.array([float(), constant])": lambda d: np.array([float(d.mean()), 1.0]),
    "np.array([int(), float()])": lambda d: np.array([int(d.sum() > 0), float(d.max())]),
    "np.array(nested)": lambda d: np.array([[d.mean(), 0.5], [d.min(), d.max()]]),
    "np.array(rows)": lambda d: np.array([d[0], d[1] * 2]),
    "np.array(rows and constants)": lambda d: np.array([d[0], [1.0, 2.0, 3.0, 4.0]]),
    "np.array(dtype=float32)": lambda d: np.array([d.mean(), float(d.max())],
                                                  dtype=np.float32),
    "np.array(.item())": lambda d: np.array([d[0, 0].item(), d[1, 1].item()]),
    "np.array(bools)": lambda d: np.array([d.max() > 0.5, d.min() < -0.5]),
    "np.stack([float(), constant])": lambda d: np.stack([float(d.sum()), 2.0]),
    "np.concatenate([[float()], row])": lambda d: np.concatenate([[float(d.min())], d[0]]),
    "np.hstack((float(), row))": lambda d: np.hstack((float(d.mean()), d[2])),
    "np.vstack([row, [numbers]])": lambda d: np.vstack([d[0], [float(d.max())] * 4]),
    "np.full(shape, float())": lambda d: np.full((2, 3), float(d.mean())),
    "np.full(shape, mean)": lambda d: np.full(d.shape, d.mean()),
    "np.full(shape, row)": lambda d: np.full((2, 4), d[1]),
    "np.full(dtype=float32)": lambda d: np.full(3, float(d.max()), dtype=np.float32),
    "np.full_like(plain, float())": lambda d: np.full_like(np.zeros((2, 2)), float(d.sum())),
    "np.full_like(d, max)": lambda d: np.full_like(d, d.max()),
}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", list(CALLS))
def test_a_constructor_of_traced_numbers_compiles_once_and_matches_eager(name, dtype):
    call = CALLS[name]

    def f(x):
        r = call(x.data)
        # The array as data of a Variable the graph computes with, and returned.
        return x * tj.Variable(np.asarray(r, dtype=x.dtype).ravel()[:1]), r

    jf = tj.jit(f)
    rng = np.random.default_rng(3)
    for _ in range(5):
        a = rng.uniform(-2, 2, (3, 4)).astype(dtype)
        e, j = f(tj.Variable(a.copy())), jf(tj.Variable(a.copy()))
        assert_close_result(e[0].data, j[0].data, dtype)
        assert_close_result(e[1], j[1], dtype)
    info = jf.cache_info()
    # One trace: the numbers are not guarded by value (a new input used to retrace).
    assert info["traces"] == 1 and info["retraces"] == 0, info
    assert info["fallbacks"] == 0 and info["hits"] >= 3, info


def test_the_gradient_through_a_constructed_array_is_eagers():
    # The constructed array is a constant of eager's graph (plain data), so x's gradient
    # is the array itself, recomputed from each call's x.
    def f(x):
        s = np.array([x.data.mean(), float(x.data.max())], dtype=x.dtype)
        return tj.functions.sum(x * tj.Variable(s))

    jf = tj.jit(f)
    rng = np.random.default_rng(5)
    for _ in range(4):
        a = rng.normal(size=(3, 2))
        xe, xj = tj.Variable(a.copy()), tj.Variable(a.copy())
        ye, yj = f(xe), jf(xj)
        ye.backward()
        yj.backward()
        np.testing.assert_allclose(yj.data, ye.data, rtol=1e-12)
        np.testing.assert_allclose(xj.grad.data, xe.grad.data, rtol=1e-12)
    assert jf.cache_info()["retraces"] == 0


def test_a_branch_on_a_constructed_array_is_one_guard_on_its_outcome():
    def f(x):
        m = np.array([x.data.mean(), x.data.std()])
        return x * 2.0 if m[0] > m[1] else x - 1.0

    jf = tj.jit(f)
    rng = np.random.default_rng(9)
    for shift in (3.0, 3.1, -3.0, 2.9, -3.2, 3.3):
        a = rng.normal(size=(4,)) + shift
        np.testing.assert_array_equal(jf(tj.Variable(a.copy())).data,
                                      f(tj.Variable(a.copy())).data)
    assert jf.cache_info()["variants"] == 2, jf.cache_info()


def test_a_cast_the_graph_does_not_reproduce_stays_eagers():
    # float to int truncates (and NaN and overflow differ): NumPy's own coercion, each
    # value behind a guard, still eager's result.
    def f(x):
        return np.array([float(x.data.max()), 2.5], dtype=np.int64)

    jf = tj.jit(f)
    for v in (1.5, 1.7, 2.2, -0.4):
        a = np.array([v, 0.0])
        assert_same_result(f(tj.Variable(a.copy())), jf(tj.Variable(a.copy())))


def test_ragged_rows_raise_as_in_eager():
    def f(x):
        return np.array([x.data[0], x.data[0, :2]])

    a = np.ones((2, 3))
    with pytest.raises(ValueError) as e:
        f(tj.Variable(a))
    with pytest.raises(ValueError) as j:
        tj.jit(f)(tj.Variable(a))
    assert str(j.value) == str(e.value)
