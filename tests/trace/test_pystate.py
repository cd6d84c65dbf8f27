"""Captured Python state (tracejit.trace.pystate): a jitted function reads closures,
globals, attributes and dict items; a change to any of them between calls is seen by the
next call (a captured Parameter or array mutated in place or rebound, a captured float
changed: a retrace), and a trace that mutates Python objects runs eagerly.
"""
import warnings

import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F
import tracejit.layers as L
from tracejit import Parameter, Variable
from tracejit.testing import assert_jit_matches_eager

from tracejit.testing.checks import assert_call_matches_eager

N_CALLS = 6          # >= 5: warm-up, trace, then at least 3 replays

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")



def _same_call(jf, f, *args):
    """One call of jf and f on copies of args compared (no backward, as before)."""
    return assert_call_matches_eager(jf, f, *args, backward=False, rtol=1e-10, atol=1e-12)

def test_closure_parameter_mutated_in_place_and_rebound():
    p = Parameter(np.array([1.0, 2.0, 3.0]), name="p")

    def f(x):
        return F.sum(F.tanh(x * p) + p)

    jf = tj.jit(f)
    r = np.random.default_rng(11)
    for i in range(N_CALLS * 2):
        xa = r.standard_normal(3)
        if i % 2:
            p.data[...] = r.standard_normal(3)          # in place
        else:
            p.data = r.standard_normal(3)                # rebind
        # the result, then x's and p's gradients (p's cleared before each side's call)
        assert_call_matches_eager(jf, f, Variable(xa), captures={"p": p}, rtol=1e-12,
                                  atol=1e-12)
    assert jf.cache_info()["fallbacks"] == 0, jf.cache_info()


def test_closure_ndarray_in_variable_ops_mutated_in_place():
    c = np.array([1.0, -1.0, 0.5])

    def f(x):
        return F.sum(x * c + F.sin(Variable(c)))

    jf = tj.jit(f)
    r = np.random.default_rng(25)
    for i in range(N_CALLS * 2):
        if i >= 4:                 # mutate only after the variant's first (checked) calls
            c[...] = r.standard_normal(3)
        xa = r.standard_normal(3)
        assert_call_matches_eager(jf, f, Variable(xa), rtol=1e-10, atol=1e-12)
    assert jf.cache_info()["fallbacks"] == 0, jf.cache_info()


def test_closure_ndarray_numpy_op_mutated_later():
    c = np.array([1.0, -1.0, 0.5])

    def f(x):
        return F.sum(x * c + c ** 2)

    jf = tj.jit(f)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tj.JitWarning)    # a fallback would be fine
        for i in range(N_CALLS * 2):
            if i >= 4:
                c[...] = np.arange(3.0) * i
            xa = np.arange(3.0) + i
            _same_call(jf, f, Variable(xa))


_GLOBAL_K = 2.0


def test_global_python_float_change_retraces():
    global _GLOBAL_K

    def f(x):
        return F.sum(x * _GLOBAL_K)

    jf = tj.jit(f)
    try:
        for i in range(N_CALLS * 2):
            if i >= 4:
                _GLOBAL_K = float(i)
            xa = np.arange(3.0) + i
            _same_call(jf, f, Variable(xa))
        assert jf.cache_info()["fallbacks"] == 0, jf.cache_info()
    finally:
        _GLOBAL_K = 2.0


def test_closure_cell_python_float_change_retraces():
    k = 2.0

    def f(x):
        return F.sum(x * k)

    def set_k(v):
        nonlocal k
        k = v

    jf = tj.jit(f)
    for i in range(N_CALLS * 2):
        if i >= 4:
            set_k(float(i))
        xa = np.arange(3.0) + i
        _same_call(jf, f, Variable(xa))
    assert jf.cache_info()["fallbacks"] == 0, jf.cache_info()


def test_attribute_python_float_change_retraces():
    class Cfg:
        k = None

    cfg = Cfg()
    cfg.k = 2.0

    def f(x):
        return F.sum(x * cfg.k)

    jf = tj.jit(f)
    for i in range(N_CALLS * 2):
        if i >= 4:
            cfg.k = float(i)
        xa = np.arange(3.0) + i
        assert_call_matches_eager(jf, f, Variable(xa), rtol=1e-10, atol=1e-12)
    assert jf.cache_info()["retraces"] >= 1
    assert jf.cache_info()["fallbacks"] == 0, jf.cache_info()


def test_dict_item_python_float_change():
    state = {"k": 2.0}

    def f(x):
        return F.sum(x * state["k"])

    jf = tj.jit(f)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tj.JitWarning)    # a fallback would be fine
        for i in range(N_CALLS * 2):
            if i >= 4:
                state["k"] = float(i)
            xa = np.arange(3.0) + i
            _same_call(jf, f, Variable(xa))


def test_python_attribute_mutation_falls_back():
    class Counter:
        def __init__(self):
            self.t = 0

    c_j, c_e = Counter(), Counter()

    def make(c):
        def f(x):
            c.t += 1
            return x * c.t
        return f

    fe = make(c_e)
    jf = tj.jit(make(c_j))
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always", tj.JitWarning)
        for i in range(N_CALLS):
            xa = np.arange(3.0) + i
            _same_call(jf, fe, Variable(xa))
            assert c_j.t == c_e.t
    jw = [str(w.message) for w in rec if issubclass(w.category, tj.JitWarning)]
    assert len(jw) == 1, jw
    assert "Counter.t" in jw[0]
    assert jf.cache_info()["fallbacks"] >= 1


def test_captured_parameter_changes_shape():
    p = Parameter(np.ones(3), name="p")
    g = lambda x: F.sum(x * p)
    jf = tj.jit(g)
    r = np.random.default_rng(30)
    for i in range(N_CALLS * 2):
        if i == N_CALLS:
            p.data = r.standard_normal((2, 3))
        else:
            p.data = r.standard_normal(p.shape)
        xa = r.standard_normal(3)
        # the result, then p's gradient (and x's)
        assert_call_matches_eager(jf, g, Variable(xa), captures={"p": p}, rtol=1e-12,
                                  atol=1e-12)
    assert jf.cache_info()["fallbacks"] == 0, jf.cache_info()


# ---------------------------------------------------------------- which changes are seen
# Each case changes captured state in make_args, before both sides of a call run, so
# every call compares jit with eager on the state as it is then.

def test_an_element_of_a_captured_list_changed_is_seen():
    cfg = [0.5, 2]

    def f(x):
        return F.sum(F.tanh(x) * cfg[0]) * cfg[1]

    def make(i):
        if i == 3:
            cfg[0] = 1.5            # a float in a list
        if i == 4:
            cfg[1] = 3              # an int in a list
        return [Variable(np.linspace(-1.0, 1.0, 3) + 0.1 * i)]

    info = assert_jit_matches_eager(f, make_args=make, calls=5)
    assert info["retraces"] >= 1, info


def test_a_parameter_replaced_on_a_captured_layer_is_read_and_gets_the_gradient():
    lin = L.Linear(2, in_size=3)

    def f(x):
        return F.sum(F.tanh(lin(x)))

    def make(i):
        if i == 3:
            lin.W = Parameter(np.full((3, 2), 0.25), name="W")
        return [Variable(np.linspace(-1.0, 1.0, 3).reshape(1, 3) * (i + 1))]

    jf = tj.jit(f)
    assert_jit_matches_eager(f, make_args=make, calls=5, jitted=jf)
    assert lin.W.data[0, 0] == 0.25
    grads = []
    for fn in (jf, f):
        lin.cleargrads()
        fn(Variable(np.ones((1, 3)))).backward()
        grads.append(lin.W.grad.data.copy())
    np.testing.assert_allclose(grads[0], grads[1], rtol=1e-12)


def test_a_captured_array_rebound_to_a_new_shape_makes_a_new_variant():
    captured = {"A": np.ones(3)}

    def f(x):
        return F.sum(x * captured["A"])

    def make(i):
        if i == 3:
            captured["A"] = np.full(4, 2.0)
        return [Variable(np.arange(len(captured["A"]), dtype=np.float64) + i)]

    info = assert_jit_matches_eager(f, make_args=make, calls=5)
    assert info["variants"] == 2, info
