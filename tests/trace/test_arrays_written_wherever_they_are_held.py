"""An ndarray the function writes in place (or computes on with plain NumPy) is
written by compiled calls, wherever the function reaches it from: a default argument
(`def f(x, buf=BUF)`), a keyword-only default, a functools.partial's keyword, a tuple's
or namedtuple's item (the tuple, held at a writable place, is rebuilt with the traced
view in it while the trace runs). Where no view can stand in for it (a partial's
positional argument), its writes are seen after the trace and the function runs
eagerly, with a warning naming the array: never a compiled call that skips the write
(each of these used to skip it silently, 0 fallbacks).

Every case runs twice from fresh state, eagerly and jitted, called 4 times with new
values; the results and the arrays it writes are compared after each call.
"""
import collections
import functools
import warnings

import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F

Pair = collections.namedtuple("Pair", "w k")


def _default():
    def f(x, buf=np.zeros(3)):
        buf[...] = buf * 0.5 + x
        return F.tanh(tj.Variable(x) * buf)
    return f, lambda: f.__defaults__[0]


def _default_read_and_updated():
    def f(x, W=np.ones(3)):
        W += 0.5
        return tj.Variable(x) * W
    return f, lambda: f.__defaults__[0]


def _kwonly_default():
    def f(x, *, buf=np.zeros(3)):
        buf[1:] = x[:-1] * 3.0
        return tj.Variable(x) * 2.0 + buf
    return f, lambda: f.__kwdefaults__["buf"]


def _partial_keyword():
    def step(x, buf):
        buf[...] = x * 3.0
        return tj.Variable(x) * 2.0
    f = functools.partial(step, buf=np.zeros(3))
    return f, lambda: f.keywords["buf"]


def _tuple_item():
    T = (np.zeros(3), 1)

    def f(x):
        T[0][...] = x * 3.0
        return tj.Variable(x) * 2.0
    return f, lambda: T[0]


def _namedtuple_field():
    p = Pair(np.zeros(3), 2)

    def f(x):
        p.w[:2] += x[:2]
        return tj.Variable(x) * p.w
    return f, lambda: p.w


def _tuple_in_a_dict():
    d = {"a": (np.zeros(3),)}

    def f(x):
        d["a"][0][...] = x * 3.0
        return tj.Variable(x) * 2.0
    return f, lambda: d["a"][0]


def _partial_positional():
    def step(buf, x):
        buf[...] = x * 3.0
        return tj.Variable(x) * 2.0
    f = functools.partial(step, np.zeros(3))
    return f, lambda: f.args[0]


def _tuple_item_computed_on_and_returned_as_a_view():
    # Plain NumPy on it (no traced operand) was unseen: `T[0] * 0.5` frozen at the
    # traced call's values, `T[0].T` returned as a copy (fuzz program 891 of seed 77).
    T = (np.zeros(3), "config")

    def f(x):
        T[0][...] = T[0] * 0.5 + x
        return tj.Variable(x) * (T[0] * 2.0), T[0].T
    return f, lambda: T[0]


# A tuple held at a writable place (a global, a cell, a dict's item) holds a rebuilt
# tuple with the traced view while the trace runs.
COMPILED = [_default, _default_read_and_updated, _kwonly_default, _partial_keyword,
            _tuple_item, _namedtuple_field, _tuple_in_a_dict,
            _tuple_item_computed_on_and_returned_as_a_view]
REFUSED = {_partial_positional: "partial argument 0"}


def _compare(make):
    f, held = make()
    g, held_g = make()
    jg = tj.jit(g)
    rng = np.random.default_rng(0)
    for _ in range(4):
        x = rng.standard_normal(3)
        want, got = f(x), jg(x)
        if isinstance(want, tuple):             # (a result, a view of the held array)
            want, view = want
            got, view_g = got
            assert np.shares_memory(view, held()) and np.shares_memory(view_g, held_g())
            np.testing.assert_array_equal(view_g, view)
        np.testing.assert_allclose(got.data, want.data, rtol=1e-12)
        np.testing.assert_array_equal(held_g(), held())
    return jg.cache_info()


@pytest.mark.parametrize("make", COMPILED, ids=lambda m: m.__name__.strip("_"))
def test_a_written_array_is_written_by_compiled_calls(make):
    with warnings.catch_warnings():
        warnings.simplefilter("error", tj.JitWarning)
        info = _compare(make)
    assert info["fallbacks"] == 0 and info["hits"] >= 2


@pytest.mark.parametrize("make", sorted(REFUSED, key=lambda m: m.__name__),
                         ids=lambda m: m.__name__.strip("_"))
def test_a_written_array_no_view_can_replace_runs_eagerly_naming_it(make):
    with pytest.warns(tj.JitWarning, match=REFUSED[make] + ".*cannot put a traced view"):
        info = _compare(make)
    assert info["hits"] == 0 and info["fallbacks"] >= 3


def test_arrays_only_read_there_still_compile_and_follow_changes():
    T = (np.ones(3),)
    bound = np.ones(3)

    def step(W, x):
        return tj.Variable(x) * W + T[0]
    jf = tj.jit(functools.partial(step, bound))
    rng = np.random.default_rng(1)
    with warnings.catch_warnings():
        warnings.simplefilter("error", tj.JitWarning)
        for i in range(4):
            x = rng.standard_normal(3)
            bound[...] = i + 1.0           # changed between calls, outside
            T[0][...] = -i
            np.testing.assert_allclose(jf(x).data, x * (i + 1.0) - i)
    assert jf.cache_info()["hits"] >= 2
