"""NumPy calls on traced data that take a list or tuple of arrays are recorded as the
calls they are, and give eager's values, dtypes and types on every compiled call.

np.concatenate([a, b]), np.stack((a, b)), np.hstack, np.vstack, np.column_stack,
np.dstack and np.block used to escape (the call ran eagerly for good, with a warning):
the tracer took only arrays, Variables and constants as positional arguments. The
sequence's arrays are now the node's inputs, its shape and its Python numbers a
template the call is rebuilt from (NumpyCall.seqs); a saved graph keeps it.
"""
import numpy as np
import pytest

import tracejit as tj
from numpy_results import assert_same_result

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")

CALLS = {
    "np.concatenate(axis=0)": lambda d, e: np.concatenate([d, e * 2], axis=0),
    "np.concatenate(-1)": lambda d, e: np.concatenate((d, e, d), -1),
    "np.concatenate(axis=None)": lambda d, e: np.concatenate([d, e], axis=None),
    "np.concatenate(one)": lambda d, e: np.concatenate([d]),
    "np.stack": lambda d, e: np.stack([d, d * 2]),
    "np.stack(axis=-1)": lambda d, e: np.stack((d, e), axis=-1),
    "np.hstack": lambda d, e: np.hstack((d, e)),
    "np.vstack": lambda d, e: np.vstack([d, e, d]),
    "np.column_stack": lambda d, e: np.column_stack([d[0], e[1]]),
    "np.dstack": lambda d, e: np.dstack([d, e]),
    "np.block": lambda d, e: np.block([[d, e], [e, d]]),
    "np.block(flat)": lambda d, e: np.block([d, e]),
    # Python numbers in the list stay constants (a float32 d with a float64 list)
    "np.concatenate(numbers)": lambda d, e: np.concatenate([d[0], [0.5, 2.0], e[1]]),
    "np.hstack(number)": lambda d, e: np.hstack([d[0], 1.5]),
    "np.stack(int rows)": lambda d, e: np.stack([d[0], [1, 2, 3, 4]]),
    # the sequence beside other positional arguments and constants
    "np.concatenate(list, axis positional)": lambda d, e: np.concatenate([d, e], 1),
    "np.einsum(str, d, e)": lambda d, e: np.einsum("ij,ij->i", d, e),
}


def _f(call):
    def f(x, y):
        r = call(x.data, y.data)
        return x * 2.0, r
    return f


_same = assert_same_result


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", list(CALLS))
def test_numpy_call_of_a_sequence_compiles_and_matches_eager(name, dtype):
    f = _f(CALLS[name])
    jf = tj.jit(f)
    rng = np.random.default_rng(7)
    for call in range(5):
        a = rng.uniform(-2, 2, (3, 4)).astype(dtype)
        b = rng.uniform(-2, 2, (3, 4)).astype(dtype)
        e = f(tj.Variable(a.copy()), tj.Variable(b.copy()))
        x = tj.Variable(a.copy())
        j = jf(x, tj.Variable(b.copy()))
        _same(e[0].data, j[0].data)
        _same(e[1], j[1])
        # A fresh array, as eager's: writing it leaves the argument alone.
        assert not np.shares_memory(j[1], x.data)
        j[1][...] = 0
        np.testing.assert_array_equal(x.data, a)
    info = jf.cache_info()
    assert info["fallbacks"] == 0 and info["hits"] >= 3, info


def test_a_concatenation_feeds_later_ops_on_every_call():
    # The result used as data of a Variable the function returns (not just returned):
    # each call's values, not the first call's.
    def f(x, y):
        c = np.concatenate([x.data, y.data * 0.5], axis=-1)
        s = np.stack([x.data, y.data]).sum(0)
        return tj.Variable(c[..., ::2] + c[..., 1::2]) * x + tj.Variable(s)

    jf = tj.jit(f)
    rng = np.random.default_rng(3)
    for _ in range(4):
        a, b = rng.standard_normal((2, 6)), rng.standard_normal((2, 6))
        want = f(tj.Variable(a), tj.Variable(b)).data
        np.testing.assert_array_equal(jf(tj.Variable(a), tj.Variable(b)).data, want)
    assert jf.cache_info()["fallbacks"] == 0


def test_a_traced_number_in_the_list_is_guarded():
    # float(d.max()) in the list: its value, behind a guard; a new value retraces.
    def f(x):
        m = float(x.data.max())
        return tj.Variable(np.hstack([x.data, m])) * 1.0

    jf = tj.jit(f)
    for k in range(4):
        a = np.arange(3.0) + k
        np.testing.assert_array_equal(jf(tj.Variable(a)).data, f(tj.Variable(a)).data)
    assert jf.cache_info()["fallbacks"] == 0


def test_a_saved_graph_with_a_concatenation_loads_and_runs(tmp_path):
    def f(x):
        d = tj.Variable(x).data
        return tj.Variable(np.concatenate([d, d * 2, [[0.5, 1.5]]], axis=0)) * 2

    path = str(tmp_path / "cat.tj")
    ex = tj.export(f, np.random.rand(3, 2))
    assert "np.concatenate" in str(ex)
    ex.save(path)
    m = tj.load(path)
    for _ in range(3):
        x = np.random.rand(3, 2)
        np.testing.assert_array_equal(m(x), f(x).data)
    # ONNX has no form of it yet: a clear refusal naming the call.
    with pytest.raises(tj.ExportError, match="np.concatenate"):
        ex.to_onnx()


# Calls giving several arrays (they escaped too): one node per result.
SEVERAL = {
    "np.divmod": lambda d: np.divmod(d, 0.3),
    "np.modf": lambda d: np.modf(d),
    "np.divmod(0-d)": lambda d: np.divmod(d[1, 2], 0.7),
    # data-dependent shapes: a guard on each result's shape (same count of positives)
    "np.nonzero": lambda d: np.nonzero(d > 0),
    "np.where(c)": lambda d: np.where(d > 0),
}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", list(SEVERAL))
def test_numpy_call_with_several_results_compiles_and_matches_eager(name, dtype):
    call = SEVERAL[name]

    def f(x):
        return x * 2.0, call(x.data)

    jf = tj.jit(f)
    rng = np.random.default_rng(5)
    signs = np.sign(rng.uniform(-1, 1, (3, 4)))
    for _ in range(5):
        a = (signs * rng.uniform(0.1, 2, (3, 4))).astype(dtype)
        e, j = f(tj.Variable(a.copy())), jf(tj.Variable(a.copy()))
        _same(e[0].data, j[0].data)
        assert type(j[1]) is type(e[1]) and len(j[1]) == len(e[1])
        for p, q in zip(e[1], j[1]):
            _same(p, q)
    info = jf.cache_info()
    assert info["fallbacks"] == 0 and info["hits"] >= 3, info


def test_a_nonzero_of_a_new_count_retraces_not_stale():
    # np.nonzero's result shape depends on the data: a call with another count of
    # nonzeros gives its own indices (the shape guard), never the first call's.
    def f(x):
        return tj.Variable(x.data[np.nonzero(x.data > 0)] * 1.0)

    jf = tj.jit(f)
    for k in range(5):
        a = np.arange(6.0) - k
        np.testing.assert_array_equal(jf(tj.Variable(a)).data, f(tj.Variable(a)).data)
    assert jf.cache_info()["fallbacks"] == 0


def test_a_saved_graph_with_several_results_loads_and_runs(tmp_path):
    def f(x):
        frac, whole = np.modf(tj.Variable(x).data * 3)
        return tj.Variable(np.stack((frac, whole * 0.5)).sum(0))

    path = str(tmp_path / "modf.tj")
    tj.export(f, np.random.rand(4)).save(path)
    m = tj.load(path)
    for _ in range(3):
        x = np.random.rand(4)
        np.testing.assert_array_equal(m(x), f(x).data)
