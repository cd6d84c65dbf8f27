"""The hot call path: the last signature's matcher, the last variant, the generated
backward, and the Python state a transformed function reads. Each test interleaves what
could confuse a cache of the last call (new shapes, dtypes, grad mode, guard outcomes,
rebound globals) and compares every call with eager."""
import warnings

import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F
from tracejit import Variable

SCALE = 2.0


@pytest.fixture(autouse=True)
def jit_warnings_are_errors():
    with warnings.catch_warnings():
        warnings.simplefilter("error", tj.JitWarning)
        yield


def _close(a, b):
    np.testing.assert_allclose(np.asarray(a.data if isinstance(a, Variable) else a),
                               np.asarray(b.data if isinstance(b, Variable) else b),
                               rtol=1e-12, atol=1e-12)


def _vg_close(got, want):
    _close(got[0], want[0])
    for g, w in zip(got[1], want[1]):
        _close(g, w)


def rosen(x, y):
    return 100 * (y - x ** 2) ** 2 + (1 - x) ** 2


def test_signature_changes_between_calls_never_reuse_the_last_variant():
    vg = tj.value_and_grad(lambda x, y: F.sum(rosen(x, y)), argnums=(0, 1))
    f = tj.jit(vg)
    rng = np.random.default_rng(0)
    shapes = [(), (), (3,), (), (3,), (2, 3), (2, 3), (), (3,)]
    for dtype in (np.float64, np.float32):
        for shape in shapes * 2:
            x = rng.standard_normal(shape).astype(dtype)
            y = rng.standard_normal(shape).astype(dtype)
            got, want = f(x, y), vg(x, y)
            assert got[0].data.dtype == want[0].data.dtype == dtype
            assert got[0].shape == want[0].shape
            np.testing.assert_allclose(got[0].data, want[0].data, rtol=1e-5)
            for g, w in zip(got[1], want[1]):
                np.testing.assert_allclose(g.data, w.data, rtol=1e-5)
    info = f.cache_info()
    assert info["fallbacks"] == 0 and info["hits"] > 0


def test_grad_mode_is_part_of_the_hot_signature():
    f = tj.jit(rosen)
    x, y = Variable(np.array(0.3)), Variable(np.array(-0.2))
    for i in range(8):
        x.data = np.array(0.1 * i)
        x.cleargrad()
        y.cleargrad()
        if i % 3 == 2:
            with tj.no_grad():
                z = f(x, y)
            assert z.creator is None
            _close(z, rosen(x, y))
            continue
        z = f(x, y)
        z.backward()
        gx, gy = x.grad.data.copy(), y.grad.data.copy()
        x.cleargrad()
        y.cleargrad()
        rosen(x, y).backward()
        _close(gx, x.grad)
        _close(gy, y.grad)
    assert f.cache_info()["fallbacks"] == 0


def test_guard_failure_on_the_hot_variant_finds_the_sibling_variant():
    def grow(x):
        y = x
        while y.data < 100:
            y = y * 2 + 1
        return y

    f = tj.jit(tj.value_and_grad(grow))
    g = tj.value_and_grad(grow)
    xs = [3.0, 7.0, 11.0, 3.5, 7.5, 11.5, 3.25, 60.0, 7.25] * 2
    for x in xs:
        _close(f(np.array(x))[0], g(np.array(x))[0])
        _close(f(np.array(x))[1], g(np.array(x))[1])
    info = f.cache_info()
    assert info["fallbacks"] == 0 and info["guard_failures"] > 0
    assert info["variants"] == 3          # trip counts 5, 4 and 1


def test_a_variable_whose_data_is_none_misses_the_hot_path_cleanly():
    f = tj.jit(lambda x: x * 2)
    x = Variable(np.arange(3.0))
    for k in range(4):
        x.data = np.arange(3.0) + k
        _close(f(x), x.data * 2)
    x.data = None
    with pytest.raises(Exception):
        f(x)
    x.data = np.arange(3.0) + 10
    _close(f(x), x.data * 2)


def test_rebinding_a_global_the_wrapped_function_reads_retraces():
    global SCALE

    def loss(x):
        return F.sum(x * SCALE) ** 2

    f = tj.jit(tj.value_and_grad(loss))
    x = np.arange(1.0, 4.0)
    try:
        for s in (2.0, 2.0, 2.0, 3.0, 3.0, 5.0, 2.0):
            SCALE = s
            x = x + 0.5
            want = tj.value_and_grad(loss)(x)
            _vg_close(f(x), want)
    finally:
        SCALE = 2.0
    assert f.cache_info()["fallbacks"] == 0


def test_grad_wrappers_do_not_put_library_internals_in_the_guarded_state():
    def loss(x, y):
        return rosen(x, y)

    f = tj.jit(tj.grad(loss, argnums=(0, 1)))
    x, y = np.array(0.5), np.array(1.5)
    for _ in range(4):
        f(x, y)
    v = next(iter(f._variants.values()))[0]
    labels = [loc.label for loc, _, _ in v.state]
    assert labels == ["rosen"], labels      # the user's helper, not argnums or backprop


def test_closure_array_of_the_wrapped_function_stays_live():
    w = np.array([1.0, 2.0, 3.0])

    def loss(x):
        return F.sum((x * w) ** 2)

    f = tj.jit(tj.grad(loss))
    x = np.array([0.5, -1.0, 2.0])
    for k in range(6):
        w[...] = k + 1.0           # mutated in place: read at every call
        _close(f(x), tj.grad(loss)(x))
    assert f.cache_info()["fallbacks"] == 0


def test_generated_backward_handles_unused_outputs_and_repeated_backward():
    def two(x):
        return x * 3, F.sin(x)

    f = tj.jit(two)
    for k in range(5):
        xa = Variable(np.linspace(0, 1, 4) + k)
        xb = Variable(xa.data.copy())
        a, _ = f(xa)           # the second output is dropped: its gradient is zeros
        F.sum(a * a).backward()
        a2, _ = two(xb)
        F.sum(a2 * a2).backward()
        _close(xa.grad, xb.grad)
        b, c = f(xa)
        (F.sum(b) + F.sum(c)).backward()
        b2, c2 = two(xb)
        (F.sum(b2) + F.sum(c2)).backward()
        _close(xa.grad, xb.grad)
    assert f.cache_info()["fallbacks"] == 0


def test_retain_grad_keeps_the_output_gradient():
    f = tj.jit(rosen)
    for k in range(5):
        x, y = Variable(np.array(0.1 * k)), Variable(np.array(0.3))
        z = f(x, y)
        z.backward(retain_grad=True)
        assert z.grad is not None and float(z.grad.data) == 1.0
        z2 = f(x, y)
        z2.backward()
        assert z2.grad is None


class _Cfg:
    shift = 0.5                  # a class attribute, read through the instance


CFG = _Cfg()
TABLE = {"k": 2.0}
ITEMS = [1.0, 3.0]


def test_every_kind_of_python_location_is_rechecked_on_the_hot_path():
    scale = 1.5

    def f(x, bias=0.25):
        return x * scale + TABLE["k"] * ITEMS[1] + CFG.shift + bias

    jf = tj.jit(f)
    x = np.arange(3.0)

    def check():
        for _ in range(3):
            _close(jf(x), f(x))

    check()
    scale = 4.0                                   # closure cell
    check()
    TABLE["k"] = -1.0                             # dict item
    check()
    ITEMS[1] = 7.0                                # list item
    check()
    _Cfg.shift = 0.125                            # class attribute
    check()
    CFG.shift = 9.0                               # instance attribute shadows it
    check()
    f.__defaults__ = (1.0,)                       # default argument
    check()
    del CFG.shift
    _Cfg.shift = 0.5
    TABLE["k"], ITEMS[1] = 2.0, 3.0
    check()
    assert jf.cache_info()["fallbacks"] == 0 and jf.cache_info()["retraces"] >= 7
