"""A captured value the jitted function reads at any depth (attributes, dict items, list
items, mixed; through a closure, a global or an argument object), rebound from outside
between calls, is what the next call uses, as in eager: never the traced one."""
import weakref

import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")


class O:
    pass


_STORE = {}
_WEAK = weakref.WeakValueDictionary()


def _leaf(kind, k):
    if kind == "variable":
        return tj.Variable(np.full(3, float(k)))
    if kind == "parameter":
        return tj.Parameter(np.full(3, float(k)))
    if kind == "array":
        return np.full(3, float(k))
    return float(k)


def _build(steps, leaf):
    """A root and the path steps ("a" attribute, "d" dict item, "l" list item) to leaf."""
    holders = []
    for s in steps:
        holders.append(O() if s == "a" else {} if s == "d" else [None])
    for i, s in enumerate(steps):
        child = holders[i + 1] if i + 1 < len(steps) else leaf
        _put(holders[i], s, child)
    return holders


def _put(h, s, v):
    if s == "a":
        h.n = v
    elif s == "d":
        h["n"] = v
    else:
        h[0] = v


def _get(h, s):
    return h.n if s == "a" else h["n"] if s == "d" else h[0]


def _read(root, steps):
    v = root
    for s in steps:
        v = _get(v, s)
    return v


PATHS = ["a", "aa", "aaa", "aaaa", "aaaaa", "d", "dd", "ddd", "dddd", "ddddd",
         "l", "lll", "lllll", "adl", "dal", "ldad", "aldla", "adadl"]


@pytest.mark.parametrize("kind", ["variable", "parameter", "array", "float"])
@pytest.mark.parametrize("steps", PATHS)
def test_rebound_leaf_through_a_closure(steps, kind):
    holders = _build(steps, _leaf(kind, 1))
    root = holders[0]

    def fn(x):
        return F.sum(x * _read(root, steps))

    f = tj.jit(fn)
    for k in range(1, 7):
        if k > 1:
            # Rebind the leaf on odd calls, an intermediate level on even ones.
            level = (k // 2) % len(steps) if k % 2 == 0 else len(steps) - 1
            if level == len(steps) - 1:
                _put(holders[level], steps[level], _leaf(kind, k))
            else:
                fresh = _build(steps[level + 1:], _leaf(kind, k))
                _put(holders[level], steps[level], fresh[0])
                holders[level + 1:] = fresh
        x = np.random.randn(3)
        got = f(tj.Variable(x))
        want = fn(tj.Variable(x))
        np.testing.assert_allclose(got.data, want.data, rtol=1e-12)


def test_the_review_reproducer():
    cfg = O()
    cfg.b = O()
    cfg.b.c = O()
    cfg.b.c.h = tj.Variable(np.ones(3))
    f = tj.jit(lambda x: F.sum(x * cfg.b.c.h))
    for _ in range(4):
        assert float(f(tj.Variable(np.ones(3))).data) == 3.0
    cfg.b.c.h = tj.Variable(np.full(3, 4.))
    for _ in range(4):
        assert float(f(tj.Variable(np.ones(3))).data) == 12.0
    cfg.b = O()
    cfg.b.c = O()
    cfg.b.c.h = tj.Parameter(np.full(3, 2.))
    for _ in range(4):
        assert float(f(tj.Variable(np.ones(3))).data) == 6.0


@pytest.mark.parametrize("steps", ["a", "aa", "aaa", "ada"])
def test_rebound_inside_an_argument_object(steps):
    holders = _build(steps, tj.Variable(np.ones(3)))

    def fn(c, x):
        return F.sum(x * _read(c, steps))

    f = tj.jit(fn)
    for k in range(1, 6):
        _put(holders[-1], steps[-1], tj.Variable(np.full(3, float(k))))
        x = np.random.randn(3)
        np.testing.assert_allclose(f(holders[0], tj.Variable(x)).data,
                                   fn(holders[0], tj.Variable(x)).data, rtol=1e-12)


@pytest.mark.parametrize("steps", ["a" * 9, "adl" * 3 + "a", "l" * 11])
def test_a_variable_past_the_first_walk_is_guarded_along_its_path(steps):
    # Deeper than pystate's per-call walk: found by the wider one, guarded at every level.
    holders = _build(steps, tj.Variable(np.ones(3)))
    root = holders[0]

    def fn(x):
        return F.sum(x * _read(root, steps))

    f = tj.jit(fn)
    for k in range(1, 13):
        if k % 4 == 0 and k % 8:
            fresh = _build(steps[2:], tj.Variable(np.full(3, float(k))))
            _put(holders[1], steps[1], fresh[0])
            holders[2:] = fresh
        elif k % 4 == 0:
            _put(holders[-1], steps[-1], tj.Variable(np.full(3, float(k))))
        x = np.random.randn(3)
        np.testing.assert_allclose(f(tj.Variable(x)).data, fn(tj.Variable(x)).data,
                                   rtol=1e-12)
    assert f.cache_info()["hits"] > 0


def test_a_variable_past_the_depth_bound_runs_eagerly_with_a_warning():
    # (Below the bound, 6 levels of everything, then 16 more of the reads the code
    # names, and the wider search's: 16 levels compile, test_captured_state_reads.)
    steps = "a" * 40
    holders = _build(steps, tj.Variable(np.ones(3)))
    root = holders[0]
    f = tj.jit(lambda x: F.sum(x * _read(root, steps)))
    with pytest.warns(tj.JitWarning, match="does not guard"):
        for k in range(1, 5):
            _put(holders[-1], "a", tj.Variable(np.full(3, float(k))))
            assert float(f(tj.Variable(np.ones(3))).data) == 3.0 * k


def test_a_variable_behind_a_getattr_reading_a_context_variable_compiles():
    import contextvars
    cv = contextvars.ContextVar("h")

    class Proxy:
        # Its values live in a context variable (C-level state): pystate reads
        # `cv.get()` as a location (trace.opaque's module docstring), guarded as a
        # cell is; a __getattr__ reading a module-level table is followed, as a
        # helper's globals are (test_captured_state_reads).
        def __getattr__(self, name):
            return cv.get()

    p = Proxy()
    f = tj.jit(lambda x: F.sum(x * p.h))
    for k in range(1, 9):
        if k in (1, 5):           # rebound twice, compiled calls in between
            _STORE["h"] = h = tj.Variable(np.full(3, float(k)))
            cv.set(h)
        assert float(f(tj.Variable(np.ones(3))).data) == 3.0 * (1 if k < 5 else 5)
    assert f.cache_info()["hits"] > 0


def test_a_variable_behind_a_getattr_reading_weak_references_compiles(
        jit_warnings_are_errors):
    class Proxy:
        def __getattr__(self, name):
            return _WEAK[name]

    p = Proxy()
    f = tj.jit(lambda x: F.sum(x * p.h))
    for k in range(1, 9):
        if k in (1, 5):           # rebound twice, compiled calls in between
            _STORE["h"] = _WEAK["h"] = tj.Variable(np.full(3, float(k)))
        assert float(f(tj.Variable(np.ones(3))).data) == 3.0 * (1 if k < 5 else 5)
    assert f.cache_info()["hits"] > 0
