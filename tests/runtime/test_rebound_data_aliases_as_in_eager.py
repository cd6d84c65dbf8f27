"""A Variable's .data rebound inside a jitted function to an existing buffer holds that
buffer as in eager: `W.data = x.data` is x's array itself, `W.data = x.data[:, ::-1]`
a view of it, `W.data = x.grad.data` the .grad's array (a backward's seed passed
through, which the graph reads as a constant, or a computed one), `W.data = V.data`
and `W.data = A` another capture's buffer; a write into one shows in the other. So for
a captured Variable, a captured Parameter and an argument. A rebind compiled calls
cannot rebuild (an array the function made, written in place after it is stored, and
returned) runs eagerly, warned.

Each test runs the jitted function beside the eager one on twin state, 5 calls with new
values and the captured Parameter changed in place between calls, and compares the
results, the rebound .data's values, identity and aliases (which buffers it shares and
how: tracejit.testing.fuzz.harness._aliases), and that a write through it reaches them.
"""
import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F
from tracejit.testing.fuzz.harness import _aliases

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")


def _seed_grad(x):
    F.reshape(x, x.shape).backward()        # x.grad is the seed, passed through
    return x.grad.data


def _computed_grad(x):
    F.sum(x * x).backward()
    return x.grad.data


SOURCES = {
    "argument's data": lambda x, V, A: x.data,
    "a view of it": lambda x, V, A: x.data[:, ::-1],
    "a transposed view": lambda x, V, A: x.data.T.T,
    "the seed's .grad": lambda x, V, A: _seed_grad(x),
    "a computed .grad": lambda x, V, A: _computed_grad(x),
    "a view of a .grad": lambda x, V, A: _computed_grad(x)[::-1],
    "another capture's data": lambda x, V, A: V.data,
    "a view of another capture's": lambda x, V, A: V.data[::-1],
    "a captured array": lambda x, V, A: A,
    "a computed value's": lambda x, V, A: F.tanh(x).data,
}


def _side(source, target, jit):
    W = (tj.Parameter if target == "parameter" else tj.Variable)(
        np.linspace(-1.0, 1.0, 6).reshape(3, 2), name="W")
    V = tj.Variable(np.full((3, 2), 2.0), name="V")
    A = np.arange(6.0).reshape(3, 2)

    def f(x):
        x.cleargrad()
        W.data = source(x, V, A)
        return F.sin(x) * W, x

    return (tj.jit(f) if jit else f), {"W": W, "V": V, "A": A}


def _record(fn, caps, call):
    x = tj.Variable(np.random.default_rng(call).uniform(-1.0, 1.0, (3, 2)))
    y, same = fn(x)
    W = caps["W"]
    others = {"V": caps["V"], "A": caps["A"]}
    rec = [np.array(y.data, copy=True), same is x, W.data is x.data,
           x.grad is not None and W.data is x.grad.data, W.data is caps["V"].data,
           W.data is caps["A"], _aliases(W.data, [x], others, [y]),
           np.array(W.data, copy=True)]
    if W.data.size and W.data.flags.writeable:
        W.data[...] = 7.0          # a write through it reaches what eager's reaches
        rec += [np.array(x.data, copy=True), np.array(caps["V"].data, copy=True),
                np.array(caps["A"], copy=True),
                None if x.grad is None else np.array(x.grad.data, copy=True)]
    return rec


def _same(a, b):
    assert len(a) == len(b)
    for u, v in zip(a, b):
        if isinstance(u, np.ndarray):
            np.testing.assert_allclose(v, u, rtol=1e-12)
        else:
            assert u == v


def _compare(make, record=_record, calls=5):
    (fe, ce), (fj, cj) = make(False), make(True)
    for call in range(calls):
        _same(record(fe, ce, call), record(fj, cj, call))
        for caps in (ce, cj):   # the caller changes its state between calls
            caps["V"].data *= 1.5
            caps["A"] *= 0.5
    return fj


@pytest.mark.parametrize("target", ["variable", "parameter"])
@pytest.mark.parametrize("source", sorted(SOURCES))
def test_captured_data_rebound_to_a_buffer_shares_it(source, target):
    fj = _compare(lambda jit: _side(SOURCES[source], target, jit))
    assert fj.cache_info()["hits"] >= 2


def test_an_argument_rebound_to_a_captured_buffer_shares_it():
    def make(jit):
        W = tj.Parameter(np.linspace(-1.0, 1.0, 6).reshape(3, 2), name="W")

        def f(x):
            x.data = W.data[::-1]
            return F.sin(x) * 2.0

        return (tj.jit(f) if jit else f), {"W": W}

    def record(fn, caps, call):
        x = tj.Variable(np.random.default_rng(call).uniform(-1.0, 1.0, (3, 2)))
        y = fn(x)
        W = caps["W"]
        rec = [np.array(y.data, copy=True), _aliases(x.data, [], {"W": W}, [y])]
        x.data[...] = 3.0 + call
        rec.append(np.array(W.data, copy=True))
        W.data[...] = np.linspace(-1.0, 1.0, 6).reshape(3, 2) * (call + 1)
        return rec

    (fe, ce), (fj, cj) = make(False), make(True)
    for call in range(5):
        _same(record(fe, ce, call), record(fj, cj, call))
    assert fj.cache_info()["hits"] >= 2


def test_a_rebind_of_a_rebound_variable_and_the_results_on_it():
    """`W.data = x.grad.data` (the seed) then `V.data = W.data[::-1]`, and a result that
    is a view of W's new array: all on the .grad's array, also on the traced call."""
    def make(jit):
        W = tj.Variable(np.ones((3, 2)), name="W")
        V = tj.Variable(np.ones((3, 2)), name="V")

        def f(x):
            x.cleargrad()
            W.data = _seed_grad(x)
            V.data = W.data[::-1]
            return F.sin(x), W.data.T

        return (tj.jit(f) if jit else f), {"W": W, "V": V}

    def record(fn, caps, call):
        x = tj.Variable(np.random.default_rng(call).uniform(-1.0, 1.0, (3, 2)))
        y, t = fn(x)
        W, V = caps["W"], caps["V"]
        rec = [np.array(y.data, copy=True), W.data is x.grad.data,
               _aliases(V.data, [x], {"W": W}, [y, t]), _aliases(t, [x], {"V": V}, [y])]
        x.grad.data[...] = 5.0 + call
        rec += [np.array(V.data, copy=True), np.array(t, copy=True)]
        return rec

    (fe, ce), (fj, cj) = make(False), make(True)
    for call in range(5):
        _same(record(fe, ce, call), record(fj, cj, call))
    assert fj.cache_info()["hits"] >= 2


@pytest.mark.parametrize("made", [True, False], ids=["made", "computed"])
def test_an_array_the_function_stores_and_returns_is_one_object(made):
    """`a = np.ones(...) * 2.0` (or `x.data * 2.0`), `W.data = a`, `return ..., a`: the
    result is W.data itself on every call, compiled too (a computed one came back as
    another array than W.data, silently; a made one ran eagerly)."""
    def make(jit):
        W = tj.Variable(np.ones((3, 2)), name="W")

        def f(x):
            a = np.ones((3, 2)) * 2.0 if made else x.data * 2.0
            W.data = a
            return F.sin(x), a

        return (tj.jit(f) if jit else f), W

    (fe, We), (fj, Wj) = make(False), make(True)
    for call in range(5):
        x = tj.Variable(np.random.default_rng(call).uniform(-1.0, 1.0, (3, 2)))
        (ye, ae), (yj, aj) = fe(x), fj(x)
        assert (ae is We.data) and (aj is Wj.data), call
        np.testing.assert_allclose(yj.data, ye.data)
        np.testing.assert_array_equal(aj, ae)
    assert fj.cache_info()["hits"] >= 2


def test_a_rebind_it_cannot_rebuild_runs_eagerly(record_jit_warnings):
    """The array the function made, stored, then written in place and returned:
    compiled calls would store the value before the write. Eager's result is W.data
    itself, on the traced call too."""
    def make(jit):
        W = tj.Variable(np.ones((3, 2)), name="W")

        def f(x):
            a = np.ones((3, 2)) * 2.0
            W.data = a
            a += x.data
            return F.sin(x), a

        return (tj.jit(f) if jit else f), W

    (fe, We), (fj, Wj) = make(False), make(True)
    for call in range(4):
        x = tj.Variable(np.random.default_rng(call).uniform(-1.0, 1.0, (3, 2)))
        (ye, ae), (yj, aj) = fe(x), fj(x)
        assert (ae is We.data) and (aj is Wj.data), call
        np.testing.assert_allclose(yj.data, ye.data)
        np.testing.assert_array_equal(Wj.data, We.data)
    assert any("W.data = ...` stores a view" in str(w.message)
               for w in record_jit_warnings)


def test_a_rebound_variable_returned_beside_the_buffer_it_holds():
    """`W.data = x.grad.data; return W, x.grad.data`: the second result is the first's
    .data, compiled too (the first-call check read eager's W.data after the compiled
    run had rebound it, and reported a false identity difference)."""
    def make(jit):
        W = tj.Variable(np.ones((3, 2)), name="W")

        def f(x):
            x.cleargrad()
            W.data = _computed_grad(x)
            return W, x.grad.data

        return (tj.jit(f) if jit else f), W

    (fe, _), (fj, _) = make(False), make(True)
    for call in range(5):
        x = tj.Variable(np.random.default_rng(call).uniform(-1.0, 1.0, (3, 2)))
        (We, ge), (Wj, gj) = fe(x), fj(x)
        assert (ge is We.data) and (gj is Wj.data), call
        np.testing.assert_allclose(gj, ge)
    assert fj.cache_info()["hits"] >= 2
