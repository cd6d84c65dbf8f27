"""cache_info(): every call counted once, by where its result came from, so
calls == hits + misses + fallbacks exactly (README, Debugging), also under threads, and
for a call that raises inside the first-call check against eager; that check is still
made on a later call."""
import threading
import warnings

import numpy as np
import pytest

import tracejit as tj
from tracejit import Variable


def _close(a, b):
    np.testing.assert_allclose(np.asarray(getattr(a, "data", a)),
                               np.asarray(getattr(b, "data", b)), rtol=1e-12, atol=1e-12)


def _adds_up(info):
    assert info["calls"] == info["hits"] + info["misses"] + info["fallbacks"], info


def rosen(x, y):
    return 100 * (y - x ** 2) ** 2 + (1 - x) ** 2


@pytest.mark.usefixtures("jit_warnings_are_errors")
def test_three_calls_of_a_new_function():
    f = tj.jit(rosen)
    for k in range(3):
        x, y = Variable(np.array(0.1 * k)), Variable(np.array(-0.2))
        _close(f(x, y), rosen(x, y))
    info = f.cache_info()
    # The warm-up (eager) and the trace are misses; the third call ran compiled code.
    assert (info["calls"], info["hits"], info["misses"], info["fallbacks"]) == (3, 1, 2, 0)
    assert info["traces"] == 1 and info["variants"] == 1
    for k in range(5):
        x = Variable(np.array(0.3 + k))
        _close(f(x, y), rosen(x, y))
    info = f.cache_info()
    assert (info["calls"], info["hits"], info["misses"]) == (8, 6, 2)
    _adds_up(info)


@pytest.mark.usefixtures("jit_warnings_are_errors")
def test_guard_failures_retraces_and_new_shapes_add_up():
    def f(x):
        y = x
        while y.data.sum() < 100:
            y = y * 2 + 1
        return y

    jf = tj.jit(f)
    for k, x in enumerate([3.0, 50.0, 3.0, 7.0, 50.0, 3.0, 200.0, 50.0]):
        shape = (1,) if k % 3 else (2,)
        v = Variable(np.full(shape, x))
        _close(jf(v), f(v))
    info = jf.cache_info()
    _adds_up(info)
    assert info["calls"] == 8 and info["guard_failures"] > 0 and info["retraces"] > 0
    assert info["fallbacks"] == 0


def test_fallbacks_count_calls_not_demotions():
    def f(x):
        return x * float(np.sum(x.data.tolist()))       # .tolist(): runs eagerly

    jf = tj.jit(f)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tj.JitWarning)
        for k in range(5):
            x = Variable(np.arange(3.0) + k)
            _close(jf(x), f(x))
    info = jf.cache_info()
    # A warm-up, then the trace that found the escape and three eager calls.
    assert (info["calls"], info["misses"], info["fallbacks"], info["hits"]) == (5, 1, 4, 0)
    assert info["eager_signatures"] == 1
    _adds_up(info)


def test_a_call_that_raises_is_counted():
    def f(x):
        if x.data.sum() > 10:
            raise ValueError("too big")
        return x * 2

    jf = tj.jit(f)
    n = 0
    for x in (1.0, 2.0, 3.0, 20.0, 4.0, 30.0):
        n += 1
        try:
            jf(Variable(np.array(x)))
        except ValueError:
            pass
    info = jf.cache_info()
    assert info["calls"] == n
    _adds_up(info)


def test_nested_and_disabled_calls_are_not_calls_of_the_cache():
    inner = tj.jit(lambda x: x * 3.0)
    outer = tj.jit(lambda x: inner(x) + 1.0)
    for k in range(4):
        x = Variable(np.array(float(k)))
        _close(outer(x), x.data * 3.0 + 1.0)
    with tj.disable_jit():
        outer(Variable(np.array(1.0)))
    assert outer.cache_info()["calls"] == 4
    _adds_up(outer.cache_info())
    _adds_up(inner.cache_info())


@pytest.mark.usefixtures("jit_warnings_are_errors")
def test_counts_are_exact_under_threads():
    f = tj.jit(rosen)
    n_threads, n_calls = 8, 3000
    errors = []
    start = threading.Barrier(n_threads)

    def work(t):
        try:
            x, y = Variable(np.array(0.1 * t)), Variable(np.array(0.3))
            want = rosen(x, y).data
            start.wait()
            for _ in range(n_calls):
                got = f(x, y)
                if not np.allclose(got.data, want, rtol=1e-12):
                    errors.append((t, got.data, want))
                    return
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    old = __import__("sys").getswitchinterval()
    __import__("sys").setswitchinterval(1e-6)     # switch threads often: races show
    try:
        threads = [threading.Thread(target=work, args=(t,)) for t in range(n_threads)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    finally:
        __import__("sys").setswitchinterval(old)
    assert not errors, errors[:3]
    info = f.cache_info()
    assert info["calls"] == n_threads * n_calls, info
    _adds_up(info)
    assert info["fallbacks"] == 0 and info["hits"] >= n_threads * n_calls - 3 * n_threads


@pytest.mark.usefixtures("jit_warnings_are_errors")
def test_a_call_that_raises_during_the_first_call_check_is_counted_and_keeps_the_check():
    # The variant's first call runs eager beside it; when eager raises, the call is
    # counted (calls == hits + misses + fallbacks) and the check is still owed.
    def f(x):
        m = float(x.data.mean())
        if m > 3:
            raise ValueError("too big")
        return x * (2.0 if m > 0 else 1.0)

    jf = tj.jit(f)
    n = 0
    for d in (1.0, 1.5, 10.0, 2.0, 2.5, 20.0, -1.0, -2.0, -3.0):
        n += 1
        x = tj.Variable(np.full(3, d))
        if d > 3:
            with pytest.raises(ValueError):
                jf(x)
        else:
            np.testing.assert_allclose(jf(x).data, f(tj.Variable(np.full(3, d))).data)
        info = jf.cache_info()
        assert info["calls"] == n == info["hits"] + info["misses"] + info["fallbacks"], info
    assert all(v.checks_left == 0 for vs in jf._variants.values() for v in vs)
