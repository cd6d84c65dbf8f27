"""State a function stores (a Variable it rebinds in a captured dict, object, list or
global, threaded through compiled calls) shares memory exactly where eager's does: a
new Variable of a .grad's array (`Variable(x.grad.data)`, also when that .grad is a
backward's seed passed through, which the graph reads as a constant) holds that .grad's
array itself, a view of it is a view of it, and a made leaf's .grad is an array of its
own even where the passes merged it with another .grad's value.

Each test runs the jitted function beside the eager one on twin state, 5 calls with new
values and a captured Parameter changed between calls, and compares results, the
stored state's values, class, identity and aliases (which buffers it shares and how,
tracejit.testing.fuzz.harness._aliases) and the gradients a backward leaves.
"""
import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F
from tracejit.testing.fuzz.harness import _aliases

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")


class Box:
    pass


HOLDERS = ["dict", "object", "list", "global"]
GLOBAL_H = None


def _holder(kind):
    """(write(v), read()) of a place the function stores its state in."""
    if kind == "dict":
        d = {"h": None}
        return (lambda v: d.__setitem__("h", v)), (lambda: d["h"])
    if kind == "list":
        L = [None]
        return (lambda v: L.__setitem__(0, v)), (lambda: L[0])
    if kind == "object":
        b = Box()
        b.h = None
        return (lambda v: setattr(b, "h", v)), (lambda: b.h)
    return None, (lambda: GLOBAL_H)


def _side(body, holder, jit):
    """One side: the function (jitted or not), its captured Parameter, and a reader of
    the state it stores. body(x, W) -> (state, results)."""
    global GLOBAL_H
    GLOBAL_H = None
    write, read = _holder(holder)
    W = tj.Parameter(np.linspace(-1.0, 1.0, 6).reshape(3, 2), name="W")
    if holder == "global":
        def f(x):
            global GLOBAL_H
            c, out = body(x, W)
            GLOBAL_H = c
            return out
    else:
        def f(x):
            c, out = body(x, W)
            write(c)
            return out
    return (tj.jit(f) if jit else f), W, read


def _record(fn, W, read, call):
    rng = np.random.default_rng(call)
    x = tj.Variable(rng.uniform(-1.0, 1.0, (3, 2)))
    out = fn(x)
    h = read()
    caps = {"W": W}
    rec = [tuple(_aliases(o, [x], caps, list(out[:k])) for k, o in enumerate(out)),
           type(h).__name__, h is x.grad, h is W, _aliases(h, [x], caps, list(out)),
           np.array(h.data, copy=True),
           None if h.grad is None else _aliases(h.grad, [x], caps, list(out))]
    loss = None
    for o in list(out) + [h]:
        if isinstance(o, tj.Variable) and o.creator is not None:
            term = F.sum(o * 0.5)
            loss = term if loss is None else loss + term
    if loss is not None:
        loss.backward()
    rec.append([None if v.grad is None else np.array(v.grad.data, copy=True)
                for v in (x, W, h)])
    W.cleargrad()
    W.data += 0.25            # the captured Parameter changes between calls
    return rec


def _assert_same(a, b):
    if isinstance(a, np.ndarray):
        np.testing.assert_allclose(b, a, rtol=1e-10, atol=1e-12)
    elif isinstance(a, (list, tuple)) and a and not isinstance(a[0], str):
        assert len(a) == len(b), (a, b)
        for p, q in zip(a, b):
            _assert_same(p, q)
    else:
        assert a == b, (a, b)


def _compare(body, holder):
    eager, jitted = _side(body, holder, False), _side(body, holder, True)
    for call in range(5):
        want = _record(*eager, call)
        got = _record(*jitted, call)
        for field, (a, b) in enumerate(zip(want, got)):
            try:
                _assert_same(a, b)
            except AssertionError as e:
                raise AssertionError(f"call {call}, field {field}: {e}") from None
    info = jitted[0].cache_info()
    assert info["fallbacks"] == 0 and info["hits"] >= 2, info


def _seed_through(x, W):
    x.cleargrad()
    F.reshape(x, x.shape).backward()      # x.grad: the seed itself, passed through
    c = tj.Variable(x.grad.data)
    return c, (F.sin(c) * W + c, x)


def _seed_through_returned(x, W):
    x.cleargrad()
    F.reshape(x, x.shape).backward()
    c = tj.Variable(x.grad.data)
    return c, (x.grad, c.data[0], F.tanh(x * W))


def _computed_grad(x, W):
    x.cleargrad()
    F.sum(x * x * W).backward()
    c = tj.Variable(x.grad.data)
    return c, (x.grad.data[::-1], F.sin(x))


@pytest.mark.parametrize("holder", HOLDERS)
def test_a_new_variable_of_a_seed_passed_through_holds_that_grads_array(holder):
    _compare(_seed_through, holder)


@pytest.mark.parametrize("holder", ["dict", "object"])
def test_the_grad_and_a_view_returned_beside_it_alias_the_stored_state(holder):
    _compare(_seed_through_returned, holder)


def test_a_new_variable_of_a_computed_grad_holds_that_grads_array():
    _compare(_computed_grad, "dict")


def _made_leaf_of_argument_data(x, W):
    x.cleargrad()
    c = tj.Variable(x.data)       # eager: x's array; x * c gives x and c equal grads
    F.sum(x * c * W).backward()   # (CSE merges the two .grad values into one)
    return c, (F.tanh(x), x)


@pytest.mark.parametrize("holder", ["dict", "list"])
def test_a_stored_made_leafs_grad_is_an_array_of_its_own(holder):
    _compare(_made_leaf_of_argument_data, holder)
