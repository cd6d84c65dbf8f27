"""The signature key (tracejit.runtime.signature): which argument changes select a new
variant and which are runtime inputs of the same one. Floats and 0-d arrays are inputs;
ints, strings and static arguments are part of the key; a new shape, dtype or grad mode
is a new variant; an unhashable non-array argument is a TypeError.
"""
import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F
from tracejit import Variable
from tracejit.testing import assert_jit_matches_eager

from tracejit.testing.checks import assert_call_matches_eager

N_CALLS = 6          # >= 5: warm-up, trace, then at least 3 replays

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")


def test_float_args_are_runtime_inputs():
    def f(x, lr):
        return F.sum(x * lr + lr ** 2)

    jf = tj.jit(f)
    r = np.random.default_rng(5)
    for i in range(N_CALLS + 2):
        xa = r.standard_normal(4)
        lr = float(r.uniform(0.1, 2.0))
        # the result, then x's gradient from a backward
        assert_call_matches_eager(jf, f, Variable(xa), lr,
                                  rtol=1e-10, atol=1e-12)
    info = jf.cache_info()
    assert info["retraces"] == 0 and info["variants"] == 1, info
    assert info["hits"] >= N_CALLS - 1, info
    assert jf.cache_info()["fallbacks"] == 0, jf.cache_info()


def test_zero_d_array_args_are_runtime_inputs():
    def f(x, a):
        return F.sum(x * a)

    jf = tj.jit(f)
    for i in range(N_CALLS):
        xa = np.arange(3.0) + i
        a = np.array(0.5 + i)
        assert_call_matches_eager(jf, f, xa, a, backward=False, rtol=1e-10, atol=1e-12)
    info = jf.cache_info()
    assert info["retraces"] == 0 and info["variants"] == 1, info
    assert jf.cache_info()["fallbacks"] == 0, jf.cache_info()


def test_int_and_str_args_are_static():
    def f(x, n, mode):
        y = x
        for _ in range(n):
            y = F.sin(y) + x
        if mode == "sq":
            y = y * y
        return F.sum(y)

    jf = tj.jit(f)
    r = np.random.default_rng(6)
    for n, mode in [(1, "sq"), (2, "sq"), (1, "id"), (2, "id")]:
        for i in range(N_CALLS):
            xa = r.standard_normal(3)
            # the result, then x's gradient from a backward
            assert_call_matches_eager(jf, f, Variable(xa), n, mode,
                                      rtol=1e-10, atol=1e-12)
    info = jf.cache_info()
    assert info["variants"] == 4, info
    assert info["retraces"] == 0
    assert jf.cache_info()["fallbacks"] == 0, jf.cache_info()


def test_static_argnums_and_argnames():
    def f(x, k, scale=1.0):
        # `scale` static: a Python number folded into the graph; `k` static too
        return F.sum(x ** k) * scale

    jf = tj.jit(f, static_argnums=(1,), static_argnames=("scale",))
    r = np.random.default_rng(7)
    for scale in (1.0, 2.5):
        for i in range(N_CALLS):
            xa = r.standard_normal(3)
            # the result, then x's gradient from a backward
            assert_call_matches_eager(jf, f, Variable(xa), 3, kwargs={"scale": scale},
                                      rtol=1e-10, atol=1e-12)
    info = jf.cache_info()
    assert info["variants"] == 2, info     # a static float is part of the key
    assert jf.cache_info()["fallbacks"] == 0, jf.cache_info()


def test_new_shape_new_variant():
    jf = tj.jit(lambda x: F.sum(F.tanh(x) * x))
    r = np.random.default_rng(8)
    for shape in [(3,), (2, 3), (3,), ()]:
        for i in range(N_CALLS):
            xa = r.standard_normal(shape)
            # the result, then x's gradient from a backward
            assert_call_matches_eager(jf, lambda x: F.sum(F.tanh(x) * x), Variable(xa),
                                      rtol=1e-10, atol=1e-12)
    assert jf.cache_info()["variants"] == 3
    assert jf.cache_info()["fallbacks"] == 0, jf.cache_info()


def test_no_grad_mode_is_separate_variant():
    jf = tj.jit(lambda x: F.sum(F.tanh(x)))
    for i in range(N_CALLS):
        xa = np.arange(3.0) - i
        with tj.no_grad():
            yj = jf(Variable(xa))
            assert yj.creator is None
        np.testing.assert_allclose(yj.data, np.tanh(xa).sum(), rtol=1e-12)
        x = Variable(xa)
        y = jf(x)
        y.backward()
        np.testing.assert_allclose(x.grad.data, 1 - np.tanh(xa) ** 2, rtol=1e-12)
    assert jf.cache_info()["variants"] == 2
    assert jf.cache_info()["fallbacks"] == 0, jf.cache_info()


def test_dropout_test_mode_is_deterministic_variant():
    def f(x):
        return F.dropout(x, 0.5) * 2.0

    jf = tj.jit(f)
    with tj.test_mode():
        for i in range(N_CALLS):
            xa = np.arange(4.0) + i
            assert_call_matches_eager(jf, f, Variable(xa), backward=False, rtol=1e-10,
                                      atol=1e-12)
    assert jf.cache_info()["fallbacks"] == 0, jf.cache_info()


def test_unhashable_nonarray_argument_raises_type_error():
    jf = tj.jit(lambda x, s: x * len(s))
    with pytest.raises(TypeError):
        jf(Variable(np.ones(2)), {1, 2})


# ---------------------------------------------------------------- which changes make a key

def _variants_after(jf, args_per_call):
    for args in args_per_call:
        jf(*args)
    return jf.cache_info()["variants"]


def test_a_new_dtype_is_a_new_key():
    f = lambda x: F.sum(F.tanh(x))
    calls = [(Variable(np.ones(3, d)),) for d in [np.float64] * 3 + [np.float32] * 3]
    assert _variants_after(tj.jit(f), calls) == 2
    assert_jit_matches_eager(f, make_args=lambda i: [Variable(
        np.linspace(-1, 1, 3).astype(np.float32 if i % 2 else np.float64) + i)], calls=4)


def test_a_variable_and_an_ndarray_argument_are_different_keys():
    f = lambda x: F.sum(F.tanh(x))
    calls = [(Variable(np.ones(3)),)] * 3 + [(np.ones(3),)] * 3
    assert _variants_after(tj.jit(f), calls) == 2


def test_the_length_of_a_tuple_argument_is_part_of_the_key():
    def f(xs):
        return sum((F.sum(x * x) for x in xs[1:]), F.sum(xs[0]))

    calls = [(tuple(Variable(np.ones(2) * k) for k in range(n)),) for n in (2, 2, 2, 3, 3, 3)]
    assert _variants_after(tj.jit(f), calls) == 2


def test_a_bool_argument_is_static():
    def f(x, flag):
        return F.sum(x * 2.0) if flag else F.sum(F.exp(x))

    jf = tj.jit(f)
    calls = [(Variable(np.ones(3)), fl) for fl in (True,) * 3 + (False,) * 3]
    assert _variants_after(jf, calls) == 2
    assert jf.cache_info()["retraces"] == 0
    assert_jit_matches_eager(f, make_args=lambda i: [Variable(np.arange(3.0) + i), i % 2 == 0],
                             calls=4)
