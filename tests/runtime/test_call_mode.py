"""The one thread-local call mode (core._state.mode: grad, no_grad, test, jit off) as the
hot path reads it: modes interleaved on one jitted function and across threads, restored
after an exception, inside jitted helpers called from other jitted functions and from a
user Function's backward (with and without create_graph), and through grad and
value_and_grad wrappers.

Every jit test calls the jitted function at least 3 times with new values and compares
with eager: values, dtype, shape, ndarray vs NumPy scalar, creator, gradients.
"""
import warnings
import threading

import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F
from tracejit import Variable
from tracejit.core import Config, Function
from tracejit.runtime.jitted import jit_disabled

from tracejit.testing.checks import assert_call_matches_eager

from call_modes import MODES as _MODES, run_both as _run_both

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")


def test_a_jitted_helper_in_a_user_backward_with_and_without_create_graph():
    def helper(t):
        return t * (2.0 if Config.enable_backprop else 3.0)

    jhelper = tj.jit(helper)

    class Through(Function):
        def __init__(self, fn):
            self.fn = fn

        def forward(self, x):
            return x * 1.0

        def backward(self, gy):
            return self.fn(gy)

    def through(fn, k):
        def run(x):
            # Two steps (the heap path) and one (the single-function path) alternate.
            y = Through(fn)(x) * 1.0 if k % 3 else Through(fn)(x)
            y.backward(create_graph=k % 2 == 0)
            return x.grad
        return run

    for k in range(8):
        # x.grad compared (with its creator under create_graph) as the call's result;
        # no further backward, as before
        assert_call_matches_eager(through(jhelper, k), through(helper, k),
                                  Variable(np.array(1.0 + k)), backward=False, atol=1e-12)
        assert Config.enable_backprop is True
        assert_call_matches_eager(jhelper, helper, Variable(np.array(0.5 * k)),
                                  backward=False, atol=1e-12)
    assert jhelper.cache_info()["fallbacks"] == 0


def _rosen(x, y):
    return 100 * (y - x ** 2) ** 2 + (1 - x) ** 2


def _kinked(x, y):
    z = x * y + 0.25
    if z.data > 0.5:                  # a guard inside the one 0-d kernel
        return F.tanh(z) * x
    return F.exp(z) - y


@pytest.mark.parametrize("fn", [_rosen, _kinked], ids=["rosen", "guarded"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_modes_interleaved_on_the_0d_hot_runner(fn, dtype):
    jf = tj.jit(fn)
    order = ["grad", "grad", "grad", "no_grad", "no_grad", "no_grad", "grad", "test",
             "test", "test", "off", "grad", "no_grad+test", "no_grad+test", "no_grad+test",
             "off+no_grad", "no_grad", "grad", "test", "grad"]
    for k, mode in enumerate(order):
        xa, ya = 0.13 * k - 0.6, 0.9 - 0.07 * k

        def make():
            return Variable(np.array(xa, dtype)), Variable(np.array(ya, dtype))
        _run_both(jf, fn, make, mode)
    info = jf.cache_info()
    assert info["fallbacks"] == 0 and info["hits"] > 0


def test_an_exception_inside_mode_blocks_restores_the_mode_the_hot_path_reads():
    jf = tj.jit(_rosen)

    def make(k):
        return Variable(np.array(0.1 * k)), Variable(np.array(0.4))
    for k in range(4):
        _run_both(jf, _rosen, lambda: make(k), "grad")
    for k, block in enumerate([tj.no_grad, tj.test_mode, tj.disable_jit,
                               lambda: tj.using_config("enable_backprop", False)] * 2):
        with pytest.raises(KeyError):
            with block():
                jf(*make(k))
                raise KeyError("inside")
        assert Config.enable_backprop is True and Config.train is True
        assert not jit_disabled()
        y = _run_both(jf, _rosen, lambda: make(k + 5), "grad")
        assert type(y.creator).__name__ == "CompiledFunction"
    assert jf.cache_info()["fallbacks"] == 0


def test_threads_in_different_modes_share_one_jitted_function():
    f = _kinked
    jf = tj.jit(f)
    errors = []
    barrier = threading.Barrier(4)

    def worker(mode):
        try:
            barrier.wait()
            for k in range(40):
                xa = 0.05 * k - 0.5

                def make():
                    return Variable(np.array(xa)), Variable(np.array(0.8))
                _run_both(jf, f, make, mode)
        except Exception as e:  # noqa: BLE001 - reported in the main thread
            errors.append((mode, repr(e)))

    with warnings.catch_warnings():
        warnings.simplefilter("error", tj.JitWarning)
        threads = [threading.Thread(target=worker, args=(m,))
                   for m in ("grad", "no_grad", "test", "off")]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not errors, errors[:3]
    assert jf.cache_info()["fallbacks"] == 0


def test_jitted_helpers_called_inside_another_jitted_function():
    inner_e = _rosen
    inner = tj.jit(inner_e)

    def outer(x, y):
        z = inner(x, y)
        if z.data > 5.0:
            return inner(y, z * 0.01) * 2.0
        return z - inner(y, x)

    def outer_e(x, y):
        z = inner_e(x, y)
        if z.data > 5.0:
            return inner_e(y, z * 0.01) * 2.0
        return z - inner_e(y, x)

    jo = tj.jit(outer)
    for k in range(12):
        xa = 0.15 * k - 0.3
        mode = ["grad", "no_grad", "grad", "test"][k % 4]

        def make():
            return Variable(np.array(xa)), Variable(np.array(0.6))
        if k % 3 == 0:
            _run_both(inner, inner_e, make, mode)    # keeps inner's hot entry moving
        _run_both(jo, outer_e, make, mode)
    assert jo.cache_info()["fallbacks"] == 0 and inner.cache_info()["fallbacks"] == 0


def test_value_and_grad_and_grad_wrappers_across_modes():
    def loss(x, y):
        z = _rosen(x, y)
        return z * 1.0 if Config.train else z * 0.5

    for wrap in (lambda f: tj.value_and_grad(f, argnums=(0, 1)), tj.grad):
        fn = wrap(loss)
        jf = tj.jit(fn)
        for k in range(12):
            mode = ["grad", "no_grad", "test", "grad", "off", "no_grad+test"][k % 6]
            xa = 0.1 * k - 0.4

            def make():
                return Variable(np.array(xa)), Variable(np.array(0.3))
            assert_call_matches_eager(jf, fn, *make(), context=_MODES[mode], backward=False,
                                      atol=1e-12)
        assert jf.cache_info()["fallbacks"] == 0


def _assert_grad_is_2(x):
    # a known value, not a comparison with eager: a 0-d float64 gradient of 2
    g = x.grad
    assert type(g) is Variable and type(g.data) is np.ndarray, (type(g), type(g.data))
    assert g.dtype == np.float64 and g.shape == (), (g.dtype, g.shape)
    np.testing.assert_allclose(g.data, 2.0, rtol=1e-6, atol=1e-12)


class _ScaleWithNoGrad(Function):
    """A user Function whose backward switches grad mode itself (any Config setter,
    tj.no_grad, tj.disable_jit or a jitted call that traces has the same effect)."""

    def forward(self, x):
        return x * 2.0

    def backward(self, gy):
        with tj.no_grad():
            return gy * 2.0


def test_grad_mode_after_a_backward_whose_function_used_no_grad():
    def loss(x):
        return F.sin(x) * x

    jloss = tj.jit(loss)
    for k in range(4):                  # evaluation: the hot entry is the no-grad one
        _run_both(jloss, loss, lambda: (Variable(np.array(0.1 * k)),), "no_grad")
    for k in range(3):
        x = Variable(np.array(1.0 + k))
        _ScaleWithNoGrad()(x).backward()
        _assert_grad_is_2(x)
        assert Config.enable_backprop is True
        _run_both(jloss, loss, lambda: (Variable(np.array(0.5 + k)),), "grad")
    assert jloss.cache_info()["fallbacks"] == 0


def test_a_jitted_helper_in_a_user_backward_sees_the_backward_grad_mode():
    def helper(t):
        return t * (2.0 if Config.enable_backprop else 3.0)

    jhelper = tj.jit(helper)
    for k in range(4):                  # the hot entry: grad mode
        _run_both(jhelper, helper, lambda: (Variable(np.array(1.0 + k)),), "grad")

    class Through(Function):
        def __init__(self, fn):
            self.fn = fn

        def forward(self, x):
            return x * 1.0

        def backward(self, gy):
            return self.fn(gy)

    def through(fn):
        def run(x):
            Through(fn)(x).backward()
            return x.grad
        return run

    for k in range(3):
        assert_call_matches_eager(through(jhelper), through(helper),
                                  Variable(np.array(1.0 + k)), backward=False, atol=1e-12)
    assert jhelper.cache_info()["fallbacks"] == 0


def test_a_jitted_helper_traced_in_a_user_backward_leaves_grad_mode_intact():
    def helper(t):
        return t * 2.0

    jhelper = tj.jit(helper)

    class Double(Function):
        def forward(self, x):
            return x * 2.0

        def backward(self, gy):
            return jhelper(gy)

    for k in range(4):
        x = Variable(np.array(1.0 + k))
        Double()(x).backward()
        _assert_grad_is_2(x)
    for k in range(3):
        _run_both(jhelper, helper, lambda: (Variable(np.array(3.0 + k)),), "grad")
    assert jhelper.cache_info()["fallbacks"] == 0


def test_an_unhashable_config_value_still_works_eagerly():
    f = tj.jit(lambda x: F.dropout(x, 0.5) * 2.0)
    try:
        for k in range(3):
            x = Variable(np.arange(3.0) + k)
            with tj.using_config("train", np.array(False)):
                with tj.disable_jit():
                    assert_call_matches_eager(f, lambda x: F.dropout(x, 0.5) * 2.0, x,
                                              backward=False, atol=1e-12)
    finally:
        Config.train = True         # the failed setter left the array in place
