"""A caller whose graph, or whose arguments' .grad and creators, alternate between two
kinds of call keeps one compiled variant of each kind.

What the backward inside a call does depends on the caller: whether its walk into the
caller's graph reaches a Variable whose .grad the function reads, whether an argument
is a leaf (the backward stops there) or has a creator (it goes on), whether a captured
Parameter's .grad is None or set when the call starts. Each is checked when a compiled
call starts. A variant that does not serve the call used to be dropped and traced
again: a caller alternating between the two kinds retraced on every switch and ran
compiled code on a quarter of its calls. Now the variant is kept, another variant
serves the call, and only the first call of each kind traces. Every call is compared
with eager, after the call and after the caller's own backward.
"""
import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")


def _val(v):
    return None if v is None else np.array(v.data)


def _walk_reach(fn, call, kind):
    # The walk from loss reaches x through u only where u was computed from x.
    def f(x, u):
        x.cleargrad()
        F.reshape(x, x.shape).backward()
        loss = F.mean(F.tanh(x.grad * u))
        loss.backward()
        return loss
    rng = np.random.default_rng(872 + call)
    x = tj.Variable(rng.uniform(-2, 2, 3))
    u = F.sin(x if kind else tj.Variable(x.data * 0.75)) * 2.0
    loss = fn(f)(x, u)
    out = [_val(loss), _val(x.grad)]
    loss.backward()
    return out + [_val(x.grad)]


def _leaf_or_not(fn, call, kind):
    # The backward inside stops at x where x is a leaf, goes on to a where x = a * 1.5.
    def f(x, w):
        y = F.sum(F.tanh(x * w))
        y.backward()
        return y * 2.0
    rng = np.random.default_rng(call)
    a, w = tj.Variable(rng.normal(size=3)), tj.Variable(rng.normal(size=3))
    out = fn(f)(a if kind else a * 1.5, w)
    got = [_val(out), _val(w.grad), _val(a.grad)]
    out.backward()
    return got + [_val(w.grad), _val(a.grad)]


W = tj.Parameter(np.linspace(-1.0, 1.0, 3))


def _grad_none_or_set(fn, call, kind):
    # W.grad None, or left set by the caller: the backward inside adds to it.
    def f(x):
        loss = F.sum(F.sin(x * W))
        loss.backward()
        return W.grad * 1.0
    W.cleargrad()
    if not kind:
        W.grad = tj.Variable(np.full(3, 0.5 + call))
    rng = np.random.default_rng(call)
    W.data[...] = rng.normal(size=3)
    out = fn(f)(tj.Variable(rng.normal(size=3)))
    return [_val(out), _val(W.grad)]


class _Jitted:
    """fn(f) is tj.jit(f), one per program (f is made per call: keyed by its code)."""

    def __init__(self):
        self.jf = None

    def __call__(self, f):
        if self.jf is None:
            self.jf = tj.jit(f)
        return self.jf


@pytest.mark.parametrize("program", [_walk_reach, _leaf_or_not, _grad_none_or_set],
                         ids=lambda p: p.__name__.strip("_"))
@pytest.mark.parametrize("pattern", ["0101010101010101", "1100110011001100"])
def test_an_alternating_caller_runs_compiled_code_after_one_trace_of_each_kind(
        program, pattern):
    jitted = _Jitted()
    for call, c in enumerate(pattern):
        want = program(lambda f: f, call, c == "1")
        got = program(jitted, call, c == "1")
        for k, (e, j) in enumerate(zip(want, got)):
            assert (e is None) == (j is None), (call, k, e, j)
            if e is not None:
                np.testing.assert_allclose(j, e, rtol=1e-12, atol=1e-14,
                                           err_msg=f"call {call} ({c}), entry {k}")
    info = jitted.jf.cache_info()
    assert info["fallbacks"] == 0 and info["traces"] == 2 and info["variants"] == 2, info
    # Each kind's first call traces and its second compiles (checked against eager).
    assert info["hits"] >= len(pattern) - 4, info
