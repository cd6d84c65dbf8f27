"""A backward from some of a compiled call's outputs gives what eager's backward from
them gives: eager never walks the part of the call only the others (no gradient: a
result dropped, a state threaded to the next call) depend on, where the compiled
backward adds their zero contributions. A zero times an infinity is NaN, so an
infinite entry on that part must not reach the gradients (CompiledFunction.
_from_live_outputs; the dtypes: test_output_gradients_of_another_dtype.py).

Every jit test calls the jitted function at least 4 times with new values (an infinite
entry on some calls) and a changed captured Parameter, and compares with eager.
"""
import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F
from tracejit import Parameter, Variable

from tracejit.testing.checks import assert_call_matches_eager

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")


def _x(k, dtype=np.float64):
    # An infinite entry on calls 2 and 4 (compiled by then), finite on the others.
    first = np.inf if k in (2, 4) else 0.3 + k
    return Variable(np.array([first, -0.5 * k - 0.1], dtype))


def _make(form):
    holder = tj.layers.Layer()
    holder.h = None
    w = Parameter(np.array([0.5, -0.3]))

    def f(x):
        a = F.tanh(x * w)                 # its backward: 0 * x with a zero gradient
        b = F.tanh(w) * 2.0 + F.sin(x[1:]) * 0.0
        if form == "state":
            holder.h = a                  # threaded, never used by the loss
            return b
        if form == "state_read":
            if holder.h is not None:
                b = b + F.sum(holder.h.data) * 0.0     # read as a constant
            holder.h = a
            return b
        return a, b
    return w, holder, f


def _b(out):
    return out[1] if isinstance(out, tuple) else out


@pytest.mark.parametrize("form", ["result", "state", "state_read"])
@pytest.mark.parametrize("create_graph", [False, True])
def test_an_infinity_reaching_only_an_output_without_a_gradient(form, create_graph):
    (wj, hj, fj), (we, he, fe) = _make(form), _make(form)
    jf = tj.jit(fj)

    def run(fn, w):
        def r(x):
            out = fn(x)
            (F.sum(_b(out)) * 1.5).backward(create_graph=create_graph)
            return _b(out), w.grad, x.grad
        return r

    for k in range(6):
        for w in (wj, we):
            w.data = np.array([0.5 + 0.1 * k, -0.3])
            w.cleargrad()
        _, gw, _ = assert_call_matches_eager(run(jf, wj), run(fe, we), _x(k),
                                             backward=False, atol=1e-12, states=(hj, he))
        assert np.isfinite(gw.data).all()
    info = jf.cache_info()
    assert info["fallbacks"] == 0 and info["hits"] >= 3


def test_an_infinity_reaching_the_output_with_a_gradient_gives_eager_nan():
    """Where eager's own backward meets the infinity, its NaN is the answer."""
    (wj, _, fj), (we, _, fe) = _make("result"), _make("result")
    jf = tj.jit(fj)

    def run(fn, w):
        def r(x):
            a, b = fn(x)
            F.sum(a * 2.0).backward()      # b dies; a meets the infinity
            return a, w.grad, x.grad
        return r

    for k in range(6):
        for w in (wj, we):
            w.data = np.array([0.5 + 0.1 * k, -0.3])
            w.cleargrad()
        assert_call_matches_eager(run(jf, wj), run(fe, we), _x(k), backward=False,
                                  atol=1e-12)
    assert jf.cache_info()["fallbacks"] == 0


def test_a_float32_call_with_an_infinity_and_a_float64_gradient():
    """Both at once: a float64 gradient into the float32 output b, a dead."""
    (wj, _, fj), (we, _, fe) = _make("result"), _make("result")
    jf = tj.jit(fj)

    def run(fn, w):
        def r(x):
            a, b = fn(x)
            F.sum(b * Variable(np.array([2.0]))).backward()
            return b, w.grad, x.grad
        return r

    for k in range(6):
        for w in (wj, we):
            w.data = np.array([0.5 + 0.1 * k, -0.3])
            w.cleargrad()
        assert_call_matches_eager(run(jf, wj), run(fe, we), _x(k, np.float32),
                                  backward=False, atol=1e-12)
    assert jf.cache_info()["fallbacks"] == 0
