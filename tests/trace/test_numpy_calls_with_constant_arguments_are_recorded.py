"""NumPy calls on traced data with Python constants as arguments are recorded as the
calls they are, and give eager's values, dtypes and types on every compiled call.

np.round(d, 1), np.clip(d, lo, hi), np.cumsum(d, -1) and the like take their constants
by the parameter's name (they used to escape: the call ran eagerly for good). ndarray
.round and .clip are those calls too: NumPy's C code for d.round(1) writes into a
plain array of its own with out=, which the tracer cannot follow; it recorded only the
first multiply (x * 10 where eager gives the rounded x). A NumPy scalar's round(s, n)
is np.round's (2.675 -> 2.68 in float64), a Python float's round(v, n) Python's own
(2.675 -> 2.67), each on the call's value. An out= write into a plain array made inside
the function is an escape: the call runs eagerly, with a warning naming the line.
"""
import numpy as np
import pytest

import tracejit as tj
from numpy_results import assert_same_result

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")

CALLS = {
    "np.round": lambda d: np.round(d, 1),
    "np.around": lambda d: np.around(d, 2),
    "ndarray.round": lambda d: d.round(1),
    "ndarray.round(0)": lambda d: d.round(),
    "np.clip": lambda d: np.clip(d, -0.75, 0.75),
    "np.clip(traced bound)": lambda d: np.clip(d, d.min() * 0.5, 0.9),
    "ndarray.clip": lambda d: d.clip(-0.75, 0.75),
    "ndarray.clip(max=)": lambda d: d.clip(max=0.5),
    "np.where(c, d, 0.0)": lambda d: np.where(d > 0, d, 0.0),
    "np.where(c, 0.5, d)": lambda d: np.where(d > 0, 0.5, d),
    "np.where(c, 1.0, -1.0)": lambda d: np.where(d > 0, 1.0, -1.0),
    "np.cumsum": lambda d: np.cumsum(d, -1),
    "np.roll": lambda d: np.roll(d, 1, -1),
    "np.flip": lambda d: np.flip(d, 0),
    "np.repeat": lambda d: np.repeat(d, 2, 0),
    "np.tile": lambda d: np.tile(d, 2),
    "np.expand_dims": lambda d: np.expand_dims(d, 0),
    "np.pad": lambda d: np.pad(d, 1),
    "np.take": lambda d: np.take(d, 1),
    "np.full_like": lambda d: np.full_like(d, 3.0),
    "np.isclose": lambda d: np.isclose(d, 0.5, atol=0.25),
    "np.percentile": lambda d: np.percentile(d, 50),
    "round(numpy scalar, 2)": lambda d: round(d.max(), 2),
    "numpy scalar.round(1)": lambda d: d.sum().round(1),
    "round(float, 2)": lambda d: round(float(d.sum()), 2),
    # ufuncs with a Python constant operand (weak: float32 stays float32)
    "d // 0.3": lambda d: d // 0.3,
    "d % 0.5": lambda d: d % 0.5,
    "np.heaviside(d, 0.5)": lambda d: np.heaviside(d, 0.5),
    "np.copysign(1.0, d)": lambda d: np.copysign(1.0, d),
    "np.einsum": lambda d: np.einsum("ij,ij->i", d, d),
    # ndarray methods that are NumPy functions (their C code made untracked arrays)
    "ndarray.cumsum": lambda d: d.cumsum(),
    "ndarray.cumprod(1)": lambda d: d.cumprod(1),
    "ndarray.dot": lambda d: d.dot(d.T),
    "ndarray.argsort": lambda d: d.argsort(1),
    "ndarray.repeat": lambda d: d.repeat(2, 1),
    "ndarray.ravel": lambda d: d.ravel(),
    "ndarray.flatten": lambda d: d.flatten(),
    "ndarray.squeeze": lambda d: d[None].squeeze(0),
    "ndarray.swapaxes": lambda d: d.swapaxes(0, 1),
    "ndarray.diagonal": lambda d: d.diagonal(),
    "ndarray.trace": lambda d: d.trace(),
    "ndarray.take": lambda d: d.take(2, 1),
}


def _f(call):
    def f(x):
        # (r * 1: np.flip and np.expand_dims give views of x's buffer, which a
        # compiled call returns only as a copy: an honest fallback, not this test's.)
        r = call(x.data)
        return x * 2.0, r * 1
    return f


_same = assert_same_result


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", list(CALLS))
def test_numpy_call_with_constants_compiles_and_matches_eager(name, dtype):
    f = _f(CALLS[name])
    jf = tj.jit(f)
    rng = np.random.default_rng(31)
    for call in range(5):
        # Halves among the values (x.5, x.25) where the roundings differ.
        a = (np.round(rng.uniform(-2, 2, (3, 4)) * 8) / 8 + rng.choice([0, 0.005], (3, 4)))
        a = a.astype(dtype)
        e, j = f(tj.Variable(a.copy())), jf(tj.Variable(a.copy()))
        _same(e[0].data, j[0].data)
        _same(e[1], j[1])
    info = jf.cache_info()
    assert info["fallbacks"] == 0 and info["hits"] >= 3, info


def test_ndarray_round_is_not_its_first_multiply():
    """d.round(1) was recorded as d * 10 (NumPy's C code's later rint and divide wrote
    with out= into a plain array of its own): the values of a rounding, every call."""
    def f(x):
        return x * 1.0 + x.data.round(1)
    jf = tj.jit(f)
    for call in range(4):
        a = np.random.default_rng(call).uniform(-2, 2, (5,))
        want = a + np.round(a, 1)
        np.testing.assert_array_equal(jf(tj.Variable(a.copy())).data, want)
        np.testing.assert_array_equal(f(tj.Variable(a.copy())).data, want)
    assert jf.cache_info()["fallbacks"] == 0


def _view_after_write(x):
    d = x.data * 1.0
    r = np.flip(d, 0)            # a view of d's buffer, in eager and in the trace
    d += 1.0                     # eager's r shows this write
    return tj.Variable(r * 1.0) * x


def _view_of_view_after_writes(x):
    d = x.data * 1.0
    r = np.expand_dims(d, 0)
    d *= 3.0
    s = np.squeeze(r, 0)         # a view of the view
    d += 1.0
    return tj.Variable(s + r[0]) * x


def _view_of_a_dropped_view(x):
    c = x.data * 1.0
    r = np.expand_dims(c, 0)[0]   # the expand_dims result is dropped: r outlives it
    c += 0.5
    return x * np.tanh(r)


@pytest.mark.parametrize("f", [_view_after_write, _view_of_view_after_writes,
                               _view_of_a_dropped_view])
def test_numpy_call_giving_a_view_shows_later_writes_of_its_buffer(f):
    """np.flip / np.expand_dims / np.squeeze give views: a later in-place write of the
    buffer shows in them, as in eager (the call recorded again on the new value)."""
    jf = tj.jit(f)
    for call in range(5):
        a = np.random.default_rng(call).uniform(-2, 2, (3,))
        # (tanh in a fused kernel and NumPy's: an ulp apart)
        np.testing.assert_allclose(jf(tj.Variable(a.copy())).data,
                                   f(tj.Variable(a.copy())).data, rtol=1e-14)
    assert jf.cache_info()["fallbacks"] == 0


def _write_through_view_of_argument(x):
    r = np.flip(x.data, 0)
    r *= 2.0                     # writes x.data in eager
    return x * 1.0


def _fill(x):
    e = x.data * 1.0
    e.fill(2.0)                  # C code writing the buffer, no ufunc
    return tj.Variable(e) * x


def _sort(x):
    e = x.data * 1.0
    e.sort()
    return tj.Variable(e) * x


@pytest.mark.parametrize("f,cause", [
    (_write_through_view_of_argument, "an in-place update through a view"),
    (_fill, ".fill() of traced data (in place)"),
    (_sort, ".sort() of traced data (in place)")])
def test_writes_the_tracer_cannot_follow_run_eagerly(f, cause):
    """A write through a NumPy call's view of the argument (compiled calls left x.data
    as it was), ndarray.fill and .sort (compiled: the unsorted, unfilled values): each
    call runs eagerly, warned, with eager's values and argument."""
    import warnings
    jf = tj.jit(f)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for call in range(4):
            a = np.random.default_rng(call).uniform(-2, 2, (4,))
            xe, xj = tj.Variable(a.copy()), tj.Variable(a.copy())
            np.testing.assert_array_equal(jf(xj).data, f(xe).data)
            np.testing.assert_array_equal(xj.data, xe.data)
    msgs = [str(m.message) for m in w if issubclass(m.category, tj.JitWarning)]
    assert any(cause in m for m in msgs), msgs


def test_numpy_calls_with_constants_save_and_load(tmp_path):
    """A saved graph holds a call's constants (np.round's 1, np.where's 0.0)."""
    def f(x):
        d = tj.Variable(x).data
        return tj.Variable(np.where(d > 0.5, np.round(d, 1), 0.0)) * 2

    path = str(tmp_path / "round.tj")
    tj.export(f, np.random.rand(4, 3)).save(path)
    m = tj.load(path)
    for k in range(3):
        x = np.random.default_rng(k).random((4, 3))
        np.testing.assert_array_equal(m(x), f(x).data)


def test_out_write_into_an_array_made_inside_is_followed():
    """`buf = np.empty(n); np.multiply(x.data, 2, out=buf); buf += 1`: the later `+= 1`
    had no traced operand, which the tracer never saw (compiled, 2x where eager gives
    2x + 1), so this ran eagerly. The out= write now makes buf traced data (an array
    the function made: trace/made.py), and the `+= 1` after it is recorded."""
    def f(x):
        buf = np.empty(x.shape)
        np.multiply(x.data, 2.0, out=buf)         # the out= line
        buf += 1.0
        return tj.Variable(buf) * x
    jf = tj.jit(f)
    for call in range(4):
        a = np.random.default_rng(call).uniform(-2, 2, (3,))
        np.testing.assert_array_equal(jf(tj.Variable(a.copy())).data, (2 * a + 1) * a)
    info = jf.cache_info()
    assert info["fallbacks"] == 0 and info["hits"] >= 2, info


def _unique_count(x, t):
    return x * float(len(np.unique(t)))           # len() of the result: its shape


def _bincount_head(x, t):
    c = np.bincount(t)
    return x * tj.Variable(c[-1:].astype(np.float64))   # a read of the last bin


@pytest.mark.parametrize("f,shapes", [(_unique_count, 3), (_bincount_head, 2)])
def test_numpy_call_whose_result_shape_depends_on_the_data_is_guarded(f, shapes):
    """np.unique(t), np.bincount(t): the result's shape depends on t's values. The
    compiled call held the traced shape (len(np.unique(t)) a constant: 3 where eager
    gives 2; a kernel reading the result past its end). Its shape is guarded: a call
    with another shape runs the variant traced for it, each traced once."""
    ts = [[0, 1, 2], [2, 1, 0], [0, 0, 1], [1, 1, 1], [0, 1, 2], [0, 0, 1], [1, 1, 1],
          [2, 0, 1]]
    jf = tj.jit(f)
    for call, t in enumerate(ts):
        t = np.array(t)
        a = np.random.default_rng(call).uniform(-2, 2, (3,))
        np.testing.assert_array_equal(jf(tj.Variable(a.copy()), t).data,
                                      f(tj.Variable(a.copy()), t).data)
    info = jf.cache_info()
    assert info["fallbacks"] == 0 and info["variants"] == shapes == info["traces"], info


def test_numpy_scalar_methods_keep_the_numpy_scalar():
    """A NumPy scalar's .T, .transpose(), .reshape(()), .astype(), .squeeze() is a NumPy
    scalar in eager (np.float64(2).T is a float64); traced, they gave 0-d arrays (an
    ndarray result where eager's is a float64). .reshape(1) and .cumsum() are arrays."""
    def f(x):
        s = x.data.sum()
        return x * 1.0, [s.T, s.transpose(), s.reshape(()), s.reshape(1),
                         s.astype(np.float32), s.squeeze(), s.copy(), s.round(1),
                         s.clip(0, 1), s.cumsum(), s[()]]
    jf = tj.jit(f)
    for call in range(4):
        x = tj.Variable(np.random.default_rng(call).uniform(-2, 2, (3,)))
        for e, j in zip(f(x)[1], jf(x)[1]):
            _same(e, j)
    assert jf.cache_info()["fallbacks"] == 0
