"""grad() and value_and_grad() inside a jitted function whose differentiated function
reads a Variable with a creator from before the call (an argument the caller computed,
state an earlier call left: an RNN's h).

Eager's walk (kept aside, DictGrads) goes on into the caller's graph, but what it
computes there are gradients of Variables from before the call, which grad() does not
return and which touch no .grad: compiled calls stop at the call's inputs
(Trace.backward_of) and match eager, also for the caller's backward through the
gradient (its history reaches the caller's graph through the argument) and its second
order.
"""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tracejit as tj
import tracejit.functions as F

W = tj.Parameter(np.random.default_rng(5).standard_normal(3))


H = None       # state f rebinds (an RNN's h)


def f(x, n):
    # x has a creator in the caller's graph; H one in the previous call's.
    global H
    g = tj.grad(lambda u: F.sum(F.tanh(u * x)))(n)
    h = H if H is not None else x
    v, gw = tj.value_and_grad(lambda u: F.sum(F.sin(u * h) * W))(x)
    H = F.tanh(x * W + 0.5 * h)
    return g * x + v, gw, g


def grad_of_grad(x):
    inner = tj.grad(lambda u: F.sum(F.sin(u) * x))
    return tj.grad(lambda w: F.sum(inner(w) * x))(x * 2.0)


def _levels(v):
    return None if v.grad is None else v.grad.data.copy()


def _same(a, b):
    assert (a is None) == (b is None), (a, b)
    if a is not None:
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)


def _compare(fn, make, calls, create_graph):
    global H
    jf = tj.jit(fn)
    for i in range(calls):
        W.data = W.data * 0.9 + 0.125          # the captured Parameter mutated
        sides = []
        for side, run in (("eager", fn), ("jit", jf)):
            H = states[side] if i else None     # each side's own chain
            a, args = make(i)
            W.cleargrad()
            out = run(*args)
            out = out if isinstance(out, tuple) else (out,)
            states[side] = H
            seen = [o.data.copy() for o in out] + [_levels(v) for v in (a, W)]
            loss = sum(F.sum(o * (k + 0.5)) for k, o in enumerate(out))
            loss.backward(create_graph=create_graph)
            seen += [_levels(v) for v in (a, W)] + [_levels(v) for v in args
                                                    if isinstance(v, tj.Variable)]
            if create_graph:
                gs = [v.grad for v in (a, W) if v.grad is not None]
                a.cleargrad()
                W.cleargrad()
                sum(F.sum(g * g) for g in gs).backward()
                seen += [_levels(v) for v in (a, W)]
            sides.append(seen)
        for e, j in zip(*sides):
            _same(e, j)
    return jf


states = {}


def _make(shape, scale=1.0):
    def make(i):
        rng = np.random.default_rng(10 + i)
        a = tj.Variable(scale * rng.standard_normal(shape))
        x = F.sin(a) * 2.0                     # an argument with a creator
        return a, (x, tj.Variable(rng.standard_normal(shape)))
    return make


@pytest.mark.usefixtures("jit_warnings_are_errors")
@pytest.mark.parametrize("create_graph", [False, True])
def test_grad_inside_reading_the_callers_graph_compiles(create_graph):
    jf = _compare(f, _make((2, 3)), 5, create_graph)
    info = jf.cache_info()
    assert info["fallbacks"] == 0 and info["hits"] >= 2, info


@pytest.mark.usefixtures("jit_warnings_are_errors")
def test_grad_of_grad_of_an_argument_with_a_creator_compiles():
    def make(i):
        a, (x, _) = _make((3,))(i)
        return a, (x,)
    jf = _compare(grad_of_grad, make, 4, True)
    assert jf.cache_info()["fallbacks"] == 0


@pytest.mark.usefixtures("jit_warnings_are_errors")
@settings(max_examples=4, deadline=None)
@given(rows=st.integers(1, 3), scale=st.floats(-2.0, 2.0))
def test_grad_inside_over_shapes_and_values(rows, scale):
    _compare(f, _make((rows, 3), scale), 4, False)
