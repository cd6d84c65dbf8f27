"""State a jitted function reads through objects that keep it in C (a ContextVar, a
memoized function's cache, a generator's frame, a C iterator, a queue, a random
generator): each read is guarded and compiles, or the call runs eagerly with a warning
naming the line; never the value of the traced call, silently, after the first-call
checks passed (trace.opaque)."""
import contextvars
import functools
import itertools
import queue

import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F


def _calls(jf, fn, n=9, change=None):
    """n calls of jf and fn with new values, compared; change(k) before call k (the
    first calls see one state, so a first-call check cannot tell a frozen value)."""
    for k in range(n):
        if change is not None:
            change(k)
        x = np.random.randn(3)
        got, want = jf(tj.Variable(x)), fn(tj.Variable(x))
        np.testing.assert_allclose(got.data, want.data, rtol=1e-12)


def _late(k):
    return 1.0 if k < 5 else float(k)      # the same for five calls, then new each call


# ---- re-read and guarded: compiles

@pytest.mark.usefixtures("jit_warnings_are_errors")
@pytest.mark.parametrize("how", ["rebound", "in place"])
def test_an_array_in_a_context_variable(how):
    cv = contextvars.ContextVar("w")
    cv.set(np.ones(3))

    def fn(x):
        return F.sum(x * cv.get())

    def change(k):
        if how == "rebound":
            if cv.get()[0] != _late(k):
                cv.set(np.full(3, _late(k)))
        else:
            cv.get()[...] = _late(k)

    jf = tj.jit(fn)
    _calls(jf, fn, change=change)
    assert jf.cache_info()["hits"] > 0


@pytest.mark.usefixtures("jit_warnings_are_errors")
def test_a_float_and_an_object_in_context_variables():
    lr, cfg = contextvars.ContextVar("lr"), contextvars.ContextVar("cfg", default=None)

    class Cfg:
        pass
    c = Cfg()
    cfg.set(c)

    def fn(x):
        return F.sum(x * lr.get() + cfg.get().b)

    def change(k):
        lr.set(_late(k))
        if k in (0, 7):
            c.b = np.full(3, float(k))

    jf = tj.jit(fn)
    _calls(jf, fn, change=change)
    assert jf.cache_info()["hits"] > 0


@pytest.mark.usefixtures("jit_warnings_are_errors")
@pytest.mark.parametrize("how", ["in place", "cleared", "float cleared"])
def test_a_memoized_function(how):
    source = [1.0]

    @functools.lru_cache(maxsize=None)
    def table(n):
        return source[0] if how == "float cleared" else np.full(n, source[0])

    def fn(x):
        return F.sum(x * table(3))

    def change(k):
        if how == "in place":
            table(3)[...] = _late(k)
        elif source[0] != _late(k):
            source[0] = _late(k)
            table.cache_clear()

    jf = tj.jit(fn)
    _calls(jf, fn, change=change)
    assert jf.cache_info()["hits"] > 0


# ---- cannot be re-read: eager, warned at the line

def _generator():
    i = 0
    while True:
        i += 1
        yield np.full(3, float(i))


def _floats():
    i = 0.0
    while True:
        i += 0.5
        yield i


SOURCES = {
    "generator of arrays": _generator,
    "generator of floats": _floats,
    "itertools.count": lambda: itertools.count(1.0, 0.25),
    "itertools.cycle of arrays": lambda: itertools.cycle([np.ones(3), np.full(3, 2.0)]),
    "iterator of a list": lambda: iter([np.full(3, float(i)) for i in range(40)]),
}


@pytest.mark.parametrize("source", sorted(SOURCES))
def test_an_iterator_made_outside_the_function(source, record_jit_warnings):
    def make(it):
        def fn(x):
            return F.sum(x * next(it))       # the line the warning names
        return fn

    jf, fn = tj.jit(make(SOURCES[source]())), make(SOURCES[source]())
    _calls(jf, fn)
    ws = [str(w.message) for w in record_jit_warnings]
    assert any("advances it" in m and "x * next(it)" in m for m in ws), ws


def test_a_generator_passed_as_an_argument(record_jit_warnings):
    def fn(x, it):
        return F.sum(x * next(it))

    jf, a, b = tj.jit(fn), _generator(), _generator()
    for _ in range(6):
        x = np.random.randn(3)
        np.testing.assert_allclose(jf(tj.Variable(x), a).data, fn(tj.Variable(x), b).data)
    assert any("argument it" in str(w.message) for w in record_jit_warnings)


@pytest.mark.parametrize("kind", ["SimpleQueue", "default_rng", "RandomState"])
def test_a_c_object_with_hidden_state(kind, record_jit_warnings):
    def make():
        if kind == "SimpleQueue":
            q = queue.SimpleQueue()
            for i in range(20):
                q.put(float(i))
            return lambda x: F.sum(x * q.get())
        rng = np.random.default_rng(0) if kind == "default_rng" else \
            np.random.RandomState(0)
        return lambda x: F.sum(x * rng.uniform(size=3))

    jf, fn = tj.jit(make()), make()
    _calls(jf, fn, n=6)
    ws = [str(w.message) for w in record_jit_warnings]
    assert any("its state is kept in C" in m for m in ws), ws


# ---- no false fallbacks: iterators and generators the function makes itself

W = [tj.Parameter(np.ones(3)), tj.Parameter(np.full(3, 2.0))]


def _params():
    yield from W


@pytest.mark.usefixtures("jit_warnings_are_errors")
def test_generators_and_iterators_made_in_the_call_compile():
    def fn(x):
        a = sum(F.sum(x * p) for p in _params())
        it = iter(W)
        b = F.sum(next(it) * x) + sum(F.sum(w * i) for i, w in enumerate(W))
        return a + b + F.sum(x * np.arange(3.0))

    jf = tj.jit(fn)

    def change(k):
        if k == 6:
            W[0].data[...] = 3.0                # a captured Parameter updated in place
    _calls(jf, fn, change=change)
    assert jf.cache_info()["hits"] > 0
