"""Traced data reaching NumPy past the tracer is never silently frozen (issue 9).

`x.data` inside a jitted function is a TracedArray (an ndarray subclass) and a reduction
of it a traced NumPy scalar; NumPy's constructors do not dispatch for a subclass, and a
view, the buffer or a NumPy scalar made by NumPy's C code is plain data the tracer does
not see: a branch on it was compiled without a guard, so after the first calls (positive
values) compiled calls gave the positive branch for negative inputs. Each entry point is
now either recorded with NumPy's semantics (np.asarray is the array itself, np.array and
copy.copy a copy, dtype=, .astype and np.float32(...) a cast) or an escape: the signature runs eagerly
with a JitWarning naming the cause and the user's line (README, "Escapes").
Signs ++++---- over the calls: a missing guard gives the wrong branch on call 5.
"""
import copy
import warnings

import numpy as np
import numpy as xp          # np.float32(...) is followed by name; xp.float32 is not
import pytest
from numpy import float32

import tracejit as tj
from tracejit.testing import assert_jit_matches_eager

SIGNS = [1, 1, 1, 1, -1, -1, -1, -1]


def values(i, shape=(3,), dtype=np.float64):
    rng = np.random.default_rng(i)
    return (SIGNS[i % len(SIGNS)] * (rng.uniform(0.1, 1.0, shape))).astype(dtype)


def run(use, dtype=np.float64):
    def f(x):
        return x * 2.0 if use(x.data) else x * -1.0

    # A fallback is the caller's to allow (jit_warnings_are_errors) or expect.
    jf = tj.jit(f)
    assert_jit_matches_eager(f, make_args=lambda i: [tj.Variable(values(i, dtype=dtype))],
                             calls=len(SIGNS) - 2, atol=1e-12, jitted=jf, allow_fallback=True)
    return jf


RECORDED = [
    lambda d: np.asarray(d).mean() > 0,
    lambda d: np.array(d).sum() > 0,
    lambda d: np.ascontiguousarray(d).max() > 0,
    lambda d: np.asarray(d, dtype=np.float32).mean() > 0,
    lambda d: np.array(d, np.float32).min() > 0,
    lambda d: np.asarray(d.mean()) > 0,
    lambda d: np.array(d.sum()) > 0,
    lambda d: copy.copy(d).sum() > 0,
    lambda d: copy.deepcopy(d).sum() > 0,
    lambda d: d.astype(np.float32).mean() > 0,
    lambda d: np.mean(np.asarray(d, dtype=np.float64)) > 0,
    lambda d: np.ascontiguousarray(d.sum())[0] > 0,
    lambda d: np.asfortranarray(d[::2]).sum() > 0,
    lambda d: np.float32(d.mean()) > 0,
    lambda d: float(np.float32(d[0])) > 0,
    lambda d: np.float64(d.astype(np.float32).sum()) * 2 > 0,
    lambda d: np.float32(float(d.mean())) > 0,
    lambda d: np.float16(d).sum() > 0,
    lambda d: np.int64(d.argmax()) == np.argmax(np.abs(d)) and d.sum() > 0,
    # Lists of traced floats where no argument is traced data: NumPy's C code read each
    # value (a guard by value: every new value retraced); the traced array now.
    lambda d: np.mean([d[0], d[1]]) > 0,
    lambda d: np.median([d.sum(), d[0], d[1]]) > 0,
    lambda d: np.polyval([d[0], 0.0], 2.0) > 0,
    lambda d: np.sum((float(d[0]), float(d[1]))) > 0,
    # np.ndarray's own methods called unbound: NumPy's C method read the traced buffer
    # past the tracer's overrides (frozen, silently); d's own method now
    lambda d: np.ndarray.item(d, 0) > 0,
    lambda d: np.ndarray.__getitem__(d, 1) > 0,
    lambda d: np.ndarray.astype(d, np.float32).sum() > 0,
    lambda d: np.ndarray.flatten(d).sum() > 0,
    lambda d: (lambda b: (np.ndarray.__setitem__(b, slice(None), d), b.sum() > 0)[1])(
        np.zeros(3)),
]


@pytest.mark.usefixtures("jit_warnings_are_errors")
@pytest.mark.parametrize("use", RECORDED, ids=[
    "asarray", "array", "ascontiguousarray", "asarray-dtype", "array-dtype",
    "asarray-of-scalar", "array-of-scalar", "copy.copy", "copy.deepcopy", "astype",
    "mean-of-asarray", "ascontiguousarray-0d", "asfortranarray-strided", "np.float32",
    "float-of-np.float32", "np.float64-of-float32", "np.float32-of-float", "np.float16-array",
    "np.int64-of-int", "np.mean-of-a-list", "np.median-of-a-list", "np.polyval-of-a-list",
    "np.sum-of-a-tuple-of-floats", "np.ndarray.item", "np.ndarray.__getitem__",
    "np.ndarray.astype", "np.ndarray.flatten", "np.ndarray.__setitem__-of-a-made-array"])
def test_numpy_constructors_of_traced_data_are_recorded(use):
    jf = run(use)
    info = jf.cache_info()
    assert info["hits"] >= 4 and info["variants"] == 2, info


ESCAPES = [
    (lambda d: xp.float32(d.mean()) > 0, "NumPy scalar made from traced data"),
    (lambda d: np.int64(d.sum() * 10) > 0, "np.int64(...) of traced float64 data"),
    (lambda d: float(float32(d[0])) > 0, "NumPy scalar made from traced data"),
    (lambda d: d.view(np.ndarray).sum() > 0, ".view() of traced data"),
    (lambda d: (d.base if d.base is not None else d).sum() > 0, ".base of traced data"),
    (lambda d: np.frombuffer(d.tobytes()).sum() > 0, ".tobytes() of traced data"),
    (lambda d: np.frombuffer(d).sum() > 0, "np.frombuffer(...) of traced data"),
    (lambda d: np.frombuffer(memoryview(d)).sum() > 0, "memoryview() of traced data"),
    (lambda d: np.frombuffer(bytes(d)).sum() > 0, "bytes() of traced data"),
    (lambda d: np.frombuffer(d.data).sum() > 0, ".data (the buffer) of traced data"),
    (lambda d: d.__array_interface__["shape"] == (3,) and d.sum() > 0,
     "__array_interface__ of traced data"),
    (lambda d: d.ctypes.data != 0 and d.sum() > 0, ".ctypes of traced data"),
    (lambda d: np.fromiter(d.flat, float).sum() > 0, ".flat of traced data"),
    (lambda d: d.__array__().sum() > 0, "__array__() of traced data"),
    # (d.ravel() was one: it is np.ravel now, recorded; ndarray.compress's C code is not)
    (lambda d: d.compress([True, False, True]).sum() > 0, "an array derived from traced data"),
    (lambda d: xp.float32(d).sum() > 0, "an array derived from traced data"),
    # NumPy's C iterators read the buffer (a sum over np.nditer was frozen, silently)
    (lambda d: sum(float(v) for v in np.nditer(d)) > 0, "np.nditer(...) of traced data"),
    (lambda d: sum(float(a) for a, _ in np.broadcast(d, 1.0)) > 0,
     "np.broadcast(...) of traced data"),
    (lambda d: sum(float(v) for v in np.nested_iters(d.reshape(-1, 1), [[0], [1]])[1]) > 0,
     "np.nested_iters(...) of traced data"),
    # (np.interp does not coerce a list of traced arrays first: frozen, silently)
    (lambda d: np.interp(0.5, [0.0, 1.0], [d[0], d[1]]) > 0, "np.interp applied to traced"),
    # (the tracer raised its own AttributeError on the None np.add.at gives)
    (lambda d: [np.add.at(b, np.argmax(d) * 0, 1.0) for b in [np.zeros(3)]] and
     d.sum() > 0, "np.add.at(...) with traced data writes in place"),
    (lambda d: np.ndarray.view(d, np.ndarray).sum() > 0, ".view() of traced data"),
    (lambda d: np.ndarray.__array__(d).sum() > 0, "__array__() of traced data"),
    (lambda d: sum(np.ndarray.tolist(d)) > 0, ".tolist() of traced data"),
]


@pytest.mark.parametrize("use,cause", ESCAPES, ids=[
    "xp.float32", "np.int64-of-float", "from-numpy-import-float32", "view", "base", "tobytes",
    "frombuffer", "memoryview", "bytes", "data", "array_interface", "ctypes", "flat",
    "__array__", "compress", "xp.float32-of-array", "nditer", "broadcast", "nested_iters",
    "interp-of-a-list", "ufunc.at", "np.ndarray.view", "np.ndarray.__array__",
    "np.ndarray.tolist"])
def test_traced_data_read_past_the_tracer_is_an_escape(use, cause):
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always", tj.JitWarning)
        jf = run(use)
    msgs = [m for m in w if issubclass(m.category, tj.JitWarning)]
    assert len(msgs) == 1, [str(m.message) for m in msgs]
    text = str(msgs[0].message)
    assert "runs eagerly" in text and cause in text, text
    assert msgs[0].lineno == use.__code__.co_firstlineno, (msgs[0].lineno, text)
    assert jf.cache_info()["hits"] == 0, jf.cache_info()


@pytest.mark.usefixtures("jit_warnings_are_errors")
def test_np_asarray_of_traced_data_is_the_array_itself():
    # Eager: np.asarray(x.data) is x.data; an in-place update through it updates x.
    def f(x):
        a = np.asarray(x.data)
        a *= 2.0
        return x * 1.0 if x.data.sum() > 0 else x * -1.0

    jf = tj.jit(f)
    # also compares x's data after each call, updated in place through the alias
    assert_jit_matches_eager(f, make_args=lambda i: [tj.Variable(values(i))],
                             calls=len(SIGNS) - 2, atol=1e-12, jitted=jf)
    assert jf.cache_info()["hits"] >= 4, jf.cache_info()


@pytest.mark.usefixtures("jit_warnings_are_errors")
def test_np_isscalar_of_traced_numbers_is_as_eager():
    def f(x, lr):
        m = x.data.mean()
        flags = (np.isscalar(m), np.isscalar(lr), np.isscalar(float(m)), np.isscalar(x.data))
        assert flags == (True, True, True, False), flags
        return x * lr if m > 0 else x * -lr

    jf = tj.jit(f)
    assert_jit_matches_eager(f, make_args=lambda i: [tj.Variable(values(i)), 0.5 + i],
                             calls=len(SIGNS) - 2, atol=1e-12, jitted=jf)
    assert jf.cache_info()["hits"] >= 4, jf.cache_info()


@pytest.mark.usefixtures("jit_warnings_are_errors")
def test_tracejits_own_reads_of_traced_buffers_are_not_escapes():
    # float32 data, reductions, indexing, reshape and a cast: all recorded by tracejit,
    # which reads the buffers itself (views, np.asarray) without that being an escape.
    def f(x):
        d = x.data
        m = d.reshape(-1)[1:].mean() + d.astype(np.float64).sum()
        return x * 2.0 if m > 0 else x * -1.0

    jf = tj.jit(f)
    assert_jit_matches_eager(
        f, make_args=lambda i: [tj.Variable(values(i, (2, 3), np.float32))],
        calls=len(SIGNS) - 2, atol=1e-12, jitted=jf)
    assert jf.cache_info()["hits"] >= 4, jf.cache_info()


@pytest.mark.usefixtures("jit_warnings_are_errors")
def test_np_float32_of_traced_data_is_a_traced_numpy_scalar():
    # What eager returns: a np.float32 (type, value), and arithmetic on it in float32.
    def f(x, lr):
        m = np.float32(x.data.mean())
        k = np.float64(lr) * 2
        assert type(m) is np.float32 and isinstance(m, np.floating), type(m)
        return x * k if m > 0 else x * -k, m, m * np.float32(3.0), np.float32(lr)

    jf = tj.jit(f)
    # exact: the NumPy scalars are eager's values, and x * k is one rounding either way
    assert_jit_matches_eager(f, make_args=lambda i: [tj.Variable(values(i)), 0.25 * i],
                             calls=len(SIGNS) - 2, rtol=0, atol=0, jitted=jf)
    assert jf.cache_info()["hits"] >= 4, jf.cache_info()
