"""A .grad the caller set before the call (an argument's, a captured Parameter's) is a
buffer from outside, like an argument's .data: what the function makes of it shares it
as in eager. `W.data = x.grad.data` is that array itself, `W.data = P.grad.data[::-1]`
a view of it; so is a returned `x.grad.data` / `x.grad.data[1:]` and ndarray state
stored from it (`S['h'] = x.grad.data`); a write through one shows in the other.
(Compiled calls stored and returned copies of it from the third call on, unwarned.)

Each test runs the jitted function beside the eager one on twin state, 5 calls, each
with a new argument and new .grads set by the caller, the captured Parameter changed in
place between calls, and compares results, gradients, the identity and aliases of the
array (tracejit.testing.fuzz.harness._aliases) and that a write through it reaches them.
"""
import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F
from tracejit.testing.fuzz.harness import _aliases

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")

SOURCES = {
    "argument's .grad": lambda x, P: x.grad.data,
    "a view of it": lambda x, P: x.grad.data[1:],
    "a captured Parameter's .grad": lambda x, P: P.grad.data,
    "a reversed view of it": lambda x, P: P.grad.data[::-1],
}


def _make(source, place, jit):
    P = tj.Parameter(np.linspace(-1.0, 1.0, 6).reshape(3, 2), name="P")
    W = tj.Variable(np.ones((3, 2)), name="W")
    S = {}

    def f(x):
        a = source(x, P)
        if place == "rebind":
            W.data = a
            b = W.data
        elif place == "state":
            S["h"] = a
            b = S["h"]
        else:
            b = a
        return F.sin(x) * P + F.sum(F.tanh(x)) * float(b.size), b

    return (tj.jit(f) if jit else f), {"P": P, "W": W}


def _record(fn, caps, call):
    rng = np.random.default_rng(call)
    x = tj.Variable(rng.uniform(-1.0, 1.0, (3, 2)))
    x.grad = tj.Variable(rng.uniform(-1.0, 1.0, (3, 2)))     # the caller's .grad
    P = caps["P"]
    P.grad = tj.Variable(rng.uniform(-1.0, 1.0, (3, 2)))
    P.data *= 1.25                                          # changed in place
    xg, Pg = x.grad, P.grad
    y, b = fn(x)
    rec = [np.array(y.data, copy=True), np.array(b, copy=True), b is xg.data, b is Pg.data,
           caps["W"].data is b, _aliases(b, [x], {"P": P}, [y])]
    b[...] = 7.0 + call            # a write through it reaches what eager's reaches
    rec += [np.array(xg.data, copy=True), np.array(Pg.data, copy=True)]
    F.sum(y * y).backward()
    rec += [np.array(x.grad.data, copy=True), np.array(P.grad.data, copy=True)]
    return rec


def _same(a, b):
    assert len(a) == len(b)
    for k, (u, v) in enumerate(zip(a, b)):
        if isinstance(u, np.ndarray):
            np.testing.assert_allclose(v, u, rtol=1e-12, err_msg=f"entry {k}")
        else:
            assert u == v, f"entry {k}"


@pytest.mark.parametrize("place", ["rebind", "state", "result"])
@pytest.mark.parametrize("source", sorted(SOURCES))
def test_a_caller_set_grad_is_shared_as_in_eager(source, place):
    (fe, ce), (fj, cj) = (_make(SOURCES[source], place, jit) for jit in (False, True))
    for call in range(5):
        _same(_record(fe, ce, call), _record(fj, cj, call))
    assert fj.cache_info()["hits"] >= 2


def test_a_caller_set_grad_updated_in_place_and_returned_as_a_view():
    """`x.grad.data *= 0.5` inside f, then a view of it returned and x.grad read by
    the graph: the view is of the caller's .grad, holding what the update left."""
    def make(jit):
        def f(x):
            x.grad.data *= 0.5
            return F.sum(F.exp(x) * x.grad), x.grad.data[::2]

        return tj.jit(f) if jit else f

    fe, fj = make(False), make(True)
    for call in range(5):
        out = []
        for fn in (fe, fj):
            rng = np.random.default_rng(call)
            x = tj.Variable(rng.uniform(-1.0, 1.0, (4, 3)))
            x.grad = tj.Variable(rng.uniform(-1.0, 1.0, (4, 3)))
            g = x.grad
            y, v = fn(x)
            same = np.shares_memory(v, g.data) and v.base is not None
            v[...] = -1.0
            out.append([np.array(y.data), same, np.array(g.data)])
        _same(*out)
    assert fj.cache_info()["hits"] >= 2


def test_a_new_variable_of_a_caller_set_grad_holds_its_array():
    """`Variable(x.grad.data)`, `Variable(P.grad.data)` returned: eager's new Variables
    hold the caller's .grad arrays themselves (compiled calls gave the traced call's
    .grad array, then a copy)."""
    def make(jit):
        P = tj.Parameter(np.linspace(-1.0, 1.0, 6).reshape(3, 2), name="P")

        def f(x):
            return F.sum(F.sin(x) * P), tj.Variable(x.grad.data), tj.Variable(P.grad.data)

        return (tj.jit(f) if jit else f), P

    (fe, Pe), (fj, Pj) = make(False), make(True)
    for call in range(5):
        out = []
        for fn, P in ((fe, Pe), (fj, Pj)):
            rng = np.random.default_rng(call)
            x = tj.Variable(rng.uniform(-1.0, 1.0, (3, 2)))
            x.grad = tj.Variable(rng.uniform(-1.0, 1.0, (3, 2)))
            P.grad = tj.Variable(rng.uniform(-1.0, 1.0, (3, 2)))
            P.data *= 1.25
            y, a, b = fn(x)
            out.append([np.array(y.data), a.data is x.grad.data, b.data is P.grad.data,
                        np.array(a.data), np.array(b.data)])
        _same(*out)
    assert fj.cache_info()["hits"] >= 2
