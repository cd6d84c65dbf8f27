"""The one-frame hot runner (variant.build_runner with a key) tests its signature on every
call: argument forms (Variable, ndarray, float, 0-d of every dtype) and aliasing that
switch between calls, a captured 0-d Parameter replaced or changed in dtype or shape,
guard misses in both grad modes, and a bad argument that must not demote the variant.

Every jit test calls the jitted function at least 3 times with new values and compares
with eager: values, dtype, shape, ndarray vs NumPy scalar, creator, gradients.
"""

import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F
from tracejit import Parameter, Variable

from tracejit.testing.checks import assert_call_matches_eager

from call_modes import run_both as _run_both

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")


def test_argument_forms_switch_between_calls():
    def f(x, y=0.5):
        return x * 2.0 + y

    jf = tj.jit(f)
    forms = [
        lambda k: (Variable(np.array(1.5 + k)),),
        lambda k: (Variable(np.array(1.5 + k)), 0.25 * k),                # one more arg
        lambda k: (1.5 + k,),                                            # Python float
        lambda k: (np.array(1.5 + k),),                                  # 0-d ndarray
        lambda k: (Variable(np.array(1.5 + k, np.float32)),),
        lambda k: (Variable(np.array(1.5 + k, np.float32)), 2.0),
        lambda k: (Parameter(np.array(1.5 + k)),),
        lambda k: (Variable(np.array([1.5 + k, 2.0])),),
        lambda k: (Variable(np.array(k + 1, np.int64)),),
        lambda k: (Variable(np.array(k % 2 == 0)),),
        lambda k: (np.array(1.5 + k, np.float32),),
    ]
    for rnd in range(3):
        for i, make in enumerate(forms):
            for k in range(3):
                _run_both(jf, f, lambda: make(10 * rnd + k), "grad")
            assert_call_matches_eager(jf, f, *make(rnd)[:1], kwargs={"y": np.array(0.75)},
                                      creators="with float arguments", atol=1e-12)
    assert jf.cache_info()["fallbacks"] == 0


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.int64, np.int32, np.bool_])
def test_0d_inputs_of_every_dtype_mixed_with_python_floats(dtype):
    def f(x, s):
        z = x * s + 1.0
        if z.data > 1.5:
            return F.sin(z), z * 2.0
        return z, F.cos(z) * s

    jf = tj.jit(f)
    rng = np.random.default_rng(3)
    for k in range(10):
        xv = rng.integers(0, 3)
        s = float(rng.uniform(-1, 1))

        def make():
            return Variable(np.asarray(xv, dtype) if dtype != np.bool_ else
                            np.asarray(bool(xv % 2))), s
        _run_both(jf, f, make, ["grad", "no_grad"][k % 2])
    assert jf.cache_info()["fallbacks"] == 0


def test_aliasing_switches_between_calls():
    def f(a, b):
        return a * b + a

    def g(a, b):
        a += 1.0
        return a * b

    jf, jg = tj.jit(f), tj.jit(g)
    for k in range(12):
        form = k % 3

        def make():
            x, y = Variable(np.array(0.5 + k)), Variable(np.array(2.0))
            return (x, y) if form == 0 else (x, x) if form == 1 else (x, x.data)
        _run_both(jf, f, make, "grad")

        def make_arrays():
            x, y = np.array(0.5 + k), np.array(2.0)
            return (x, y) if form != 1 else (x, x)
        assert_call_matches_eager(jg, g, *make_arrays(), atol=1e-12)   # and a after it
    assert jf.cache_info()["fallbacks"] == 0 and jg.cache_info()["fallbacks"] == 0


def test_captured_0d_parameter_changes_dtype_shape_or_is_replaced():
    class Holder:
        pass

    h = Holder()
    h.p = Parameter(np.array(2.0))
    q = Parameter(np.array(0.5))

    def f(x):
        return x * h.p + q * x

    jf = tj.jit(f)
    changes = {3: lambda: setattr(q, "data", np.array(3, np.int64)),
               6: lambda: setattr(q, "data", np.array(True)),
               9: lambda: setattr(q, "data", np.array(1.5, np.float32)),
               12: lambda: setattr(h, "p", Parameter(np.array(-1.0))),
               15: lambda: setattr(q, "data", np.array([0.5, 1.0])),
               18: lambda: setattr(h, "p", Parameter(np.array(4, np.int32))),
               21: lambda: setattr(q, "data", np.array(0.25))}
    for k in range(24):
        if k in changes:
            changes[k]()
        # captures: both grads cleared before each side's call, and compared after
        assert_call_matches_eager(jf, f, Variable(np.array(1.0 + k)),
                                  captures={"q": q, "p": h.p}, atol=1e-12)
    assert jf.cache_info()["fallbacks"] == 0


def test_guard_misses_on_the_hot_runner_in_both_grad_modes():
    def f(x):
        y = x
        while y.data < 10.0:
            y = y * 2.0 + 0.5
        return y

    jf = tj.jit(f)
    starts = [3.0, 3.5, 1.0, 9.0, 2.5, 0.7, 9.5, 3.25, 1.1] * 2
    for k, s in enumerate(starts):
        _run_both(jf, f, lambda: (Variable(np.array(s)),), ["grad", "no_grad"][k % 2])
    info = jf.cache_info()
    assert info["fallbacks"] == 0 and info["guard_failures"] > 0


def test_a_bad_argument_does_not_demote_the_hot_variant():
    def f(x):
        return x * 2.0

    jf = tj.jit(f)
    for k in range(4):
        _run_both(jf, f, lambda: (Variable(np.array(1.0 + k)),), "grad")
    bad = Variable(np.array(0.0))
    bad.data = [5.0]                    # not an ndarray: eager raises AttributeError
    with pytest.raises(AttributeError):
        f(bad)
    with pytest.raises(TypeError, match="holds a list, not a numpy.ndarray"):
        jf(bad)                         # said in the user's terms
    for k in range(3):
        _run_both(jf, f, lambda: (Variable(np.array(7.0 + k)),), "grad")
    info = jf.cache_info()
    assert info["fallbacks"] == 0 and info["variants"] == 1
