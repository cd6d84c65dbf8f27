"""A Variable made inside a jitted function that is a leaf of eager's graph when the call
returns (`c = Variable(np.ones(3))`, a Parameter, `Variable(x.data)`, a result of
no_grad) and outlives the call -- returned alone, in a tuple, list, dict or NamedTuple,
or stored as state the function rebinds -- gets from a backward through a compiled call
the gradient eager's backward gives it: first order, with create_graph (and the second
order through it), with retain_grad, after cleargrad, and after the caller changes its
data. Compiled calls used to give it None, silently (its array was a constant of the
graph). Its class (Parameter, a create_graph seed's Constant) and name are eager's too.
"""
import collections
import gc
import weakref

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import tracejit as tj
import tracejit.functions as F
from tracejit import Parameter, Variable
from tracejit.core import Constant

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")

Pair = collections.namedtuple("Pair", "y c")


class Holder:
    c = None


HOLDER = Holder()


def direct(x):
    c = Variable(np.full(3, 0.5))
    return F.sin(x * c) + c * c, c


def in_tuple(x):
    c = Variable(np.full(3, 0.5))
    return x * c, (c, 2.0)


def in_list(x):
    c = Variable(np.full(3, 0.5))
    return [x * c, [c]]


def in_dict(x):
    c = Variable(np.full(3, 0.5))
    return {"y": F.exp(x * c), "c": c}


def in_namedtuple(x):
    c = Variable(np.full(3, 0.5))
    return Pair(x * c * c, c)


def parameter(x):
    c = Parameter(np.full(3, 0.5))
    return F.tanh(x * c), c


def named(x):
    c = Variable(np.full(3, 0.5), name="c")
    return x * c, c


def of_data(x):
    c = Variable(x.data)                 # a new leaf of the argument's array
    return x * c, c


def of_computed_data(x):
    c = Variable(x.data * 2.0)
    return F.sin(x * c), c


def of_no_grad(x):
    with tj.no_grad():
        c = F.tanh(x) * 0.5
    return F.sin(x * c), c


def unchained(x):
    c = x * 2.0
    y = F.exp(c * 0.5) * x
    c.unchain()                          # a leaf of eager's graph when f returns
    return y, c


def as_state(x):
    c = Variable(np.full(3, 0.5))
    HOLDER.c = c                         # state the function rebinds: threaded
    return F.sin(x * c)


def _leaf(name, r):
    if name == "as_state":
        return HOLDER.c
    if isinstance(r, dict):
        return r["c"]
    if isinstance(r, Pair):
        return r.c
    if name == "in_list":
        return r[1][0]
    if name == "in_tuple":
        return r[1][0]
    return r[1]


def _first(r):
    if isinstance(r, dict):
        return r["y"]
    if isinstance(r, (tuple, list)):
        return r[0]
    return r


CASES = [direct, in_tuple, in_list, in_dict, in_namedtuple, parameter, named, of_data,
         of_computed_data, of_no_grad, unchained, as_state]
MODES = ["plain", "create_graph", "retain_grad", "cleargrad_first", "data_changed"]


def _arr(v):
    return None if v is None else np.array(v.data, copy=True)


def _observe(fn, name, mode, i):
    """One call and backward as a user runs them: what the made leaf ends with."""
    HOLDER.c = None
    x = Variable(np.linspace(-1.0, 1.5, 3) + 0.25 * i)
    r = fn(x)
    c = _leaf(name, r)
    y = _first(r)
    if mode == "cleargrad_first":
        c.cleargrad()
    if mode == "data_changed":
        c.data *= 3.0                    # eager's backward reads it as it is now
    loss = F.sum(y * y)
    loss.backward(create_graph=(mode == "create_graph"),
                  retain_grad=(mode == "retain_grad"))
    out = dict(cls=type(c), name=c.name, data=_arr(c), grad=_arr(c.grad),
               xgrad=_arr(x.grad), grad_cls=None if c.grad is None else type(c.grad))
    if mode == "create_graph":
        gc_, gx = c.grad, x.grad
        x.cleargrad()
        c.cleargrad()
        F.sum(gc_ * gc_ + gx * gx).backward()
        out.update(grad2=_arr(c.grad), xgrad2=_arr(x.grad))
    return out


def _same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        if isinstance(a[k], np.ndarray) or isinstance(b[k], np.ndarray):
            assert (a[k] is None) == (b[k] is None), k
            np.testing.assert_allclose(b[k], a[k], rtol=1e-12, atol=1e-12, err_msg=k)
        else:
            assert a[k] == b[k], k


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("fn", CASES, ids=lambda f: f.__name__)
def test_a_made_leaf_gets_eagers_gradient_on_every_call(fn, mode):
    jf = tj.jit(fn)
    for i in range(5):
        want = _observe(fn, fn.__name__, mode, i)
        got = _observe(jf, fn.__name__, mode, i)
        assert want["grad"] is not None or fn is unchained and mode == "cleargrad_first"
        _same(want, got)
    assert jf.cache_info()["hits"] >= 2, jf.cache_info()


def test_made_leaves_as_arguments_of_the_compiled_call_read_ndarrays(
        jit_warnings_are_errors):
    # No Variable argument at all: the made leaf is the call's one differentiable input.
    def f(a):
        c = Variable(np.ones(3))
        return F.sin(c * a) * c, c
    jf = tj.jit(f)
    for i in range(5):
        a = np.arange(3.0) + i
        grads = []
        for fn in (f, jf):
            y, c = fn(a)
            F.sum(y).backward()
            grads.append(c.grad.data)
        np.testing.assert_allclose(grads[1], grads[0], rtol=1e-12)


SHARED = tj.jit(direct)


@settings(max_examples=15, deadline=None)
@given(st.lists(st.floats(-2.0, 2.0), min_size=3, max_size=3),
       st.lists(st.floats(-1.0, 1.0), min_size=3, max_size=3))
def test_made_leaf_gradients_over_drawn_values_and_cotangents(xs, gs):
    # Compiled once (module-level jit), then drawn values and output cotangents.
    for _ in range(2):
        out = []
        for fn in (direct, SHARED):
            x = Variable(np.array(xs))
            y, c = fn(x)
            y.grad = Variable(np.array(gs))
            y.backward()
            out.append((c.grad.data, x.grad.data))
        np.testing.assert_allclose(out[1][0], out[0][0], rtol=1e-12, atol=1e-15)
        np.testing.assert_allclose(out[1][1], out[0][1], rtol=1e-12, atol=1e-15)


def test_a_returned_create_graph_seed_is_a_constant_as_in_eager():
    # The seed of backward(create_graph=True) is a Constant; returned after the
    # argument's .grad (which was it) is cleared, compiled calls gave a Variable (the
    # first-call check caught it: the function ran eagerly).
    def f(x):
        y = F.sum(x * 2.0)
        y.backward(create_graph=True, retain_grad=True)
        x.cleargrad()
        return y, y.grad
    jf = tj.jit(f)
    for i in range(5):
        for fn in (f, jf):
            x = Variable(np.arange(3.0) + i)
            y, seed = fn(x)
            assert type(seed) is Constant and seed.creator is None
            np.testing.assert_array_equal(seed.data, 1.0)
    assert jf.cache_info()["hits"] >= 2


def test_a_made_leaf_whose_results_die_leaves_nothing_alive():
    # The compiled call holds its made leaf as an input: dropped with its results
    # (and the leaf's gradient cleared, as an input's), reference counting frees it.
    jf = tj.jit(direct)
    for i in range(5):
        for create in (False, True):
            gc.collect()
            gc.disable()
            try:
                x = Variable(np.arange(3.0) + i)
                y, c = jf(x)
                F.sum(y).backward(create_graph=create)
                refs = [weakref.ref(o) for o in (y, c, y.creator, c.grad)]
                x.cleargrad()
                c.cleargrad()
                del y, c
                assert [r() for r in refs] == [None] * 4
            finally:
                gc.enable()


W = Parameter(np.array([0.5, -1.0, 2.0]))


def grad_then_used(x):
    # A backward inside the call sets W.grad (a new Variable, no creator), which an op
    # then reads: a leaf of eager's graph that outlives the call on W, returned or not.
    W.cleargrad()
    F.sum(F.tanh(W) * x).backward()
    g = W.grad
    return F.sin(g * x) + g * g


@pytest.mark.parametrize("mode", ["plain", "create_graph"])
def test_a_grad_set_inside_the_call_and_used_gets_eagers_gradient(mode):
    jf = tj.jit(grad_then_used)
    for i in range(5):
        seen = []
        for fn in (grad_then_used, jf):
            x = Variable(np.linspace(-1.0, 1.0, 3) + 0.2 * i)
            W.data[...] = [0.5 - 0.1 * i, -1.0, 2.0]     # a mutated capture
            y = fn(x)
            g = W.grad
            F.sum(y).backward(create_graph=(mode == "create_graph"))
            seen.append((_arr(g.grad), _arr(x.grad), g is W.grad))
            W.cleargrad()
        for a, b in zip(*seen):
            if isinstance(a, np.ndarray):
                np.testing.assert_allclose(b, a, rtol=1e-12, atol=1e-12)
            else:
                assert a == b
    assert jf.cache_info()["hits"] >= 2, jf.cache_info()


def backward_inside(x):
    # A backward inside the call gives the made leaf its .grad before it is returned;
    # the caller's backward then adds to it, as eager's does.
    c = Variable(np.full(3, 0.5))
    F.sum(F.tanh(x * c)).backward()
    return F.sin(x * c), c


@pytest.mark.parametrize("mode", ["plain", "create_graph"])
def test_a_made_leaf_keeps_the_grad_a_backward_inside_the_call_gave_it(mode):
    jf = tj.jit(backward_inside)
    for i in range(5):
        seen = []
        for fn in (backward_inside, jf):
            x = Variable(np.linspace(-1.0, 1.0, 3) + 0.2 * i)
            y, c = fn(x)
            inside = _arr(c.grad)
            F.sum(y).backward(create_graph=(mode == "create_graph"))
            seen.append((inside, _arr(c.grad), _arr(x.grad)))
        for a, b in zip(*seen):
            np.testing.assert_allclose(b, a, rtol=1e-12, atol=1e-12)
    assert jf.cache_info()["hits"] >= 2, jf.cache_info()


def grad_also_returned(x):
    # The made leaf's .grad is also a result: one object in both places.
    c = Variable(np.full(3, 0.5))
    F.sum(F.tanh(x * c)).backward()
    return c.grad, c, F.sin(x * c)


def grad_shared_with_the_argument(x):
    # Add gives both operands one gradient object: c.grad is x.grad, in eager.
    c = Variable(np.full(3, 0.5))            # (of x's shape: no sum_to between)
    F.sum(F.tanh(c + x)).backward()
    return F.sin(x * c), c


def grad_of_a_seed(x):
    # The made leaf is backward's own seed (y.grad after retain_grad), its .grad the
    # argument's (the second backward's Add).
    h = x * 2.0
    y = h + 1.0
    F.sum(y).backward(retain_grad=True)
    c = y.grad
    F.sum(F.tanh(c + x)).backward()
    return F.sin(x * c), c


W = Parameter(np.array([0.3, -0.6, 0.9]))


def grad_of_a_returned_grad(x):
    # The made leaf's .grad is the .grad of a computed .grad the call returns (g =
    # W.grad, then Add gives c and g one gradient: c.grad is W.grad.grad; fuzz programs
    # 1809 and 2519).
    W.cleargrad()
    F.sum(F.tanh(W) * W).backward()
    g = W.grad
    c = Variable(np.full(3, 0.5))
    F.sum(F.tanh(c + g)).backward()
    return F.sin(x * c * g), c, g


@pytest.mark.parametrize("fn", [grad_also_returned, grad_shared_with_the_argument,
                                grad_of_a_seed, grad_of_a_returned_grad])
@pytest.mark.parametrize("mode", ["plain", "create_graph"])
def test_a_made_leafs_grad_that_is_another_object_of_the_call_stays_that_object(fn, mode):
    # Compiled calls gave the made leaf no .grad where its .grad was a result or
    # another Variable's .grad, and the first-call check ran them eagerly (fuzz
    # program 3247 of a 10,000-program run): now the runner sets that object.
    jf = tj.jit(fn)
    for i in range(5):
        seen = []
        for f in (fn, jf):
            x = Variable(np.linspace(-1.0, 1.0, 3) + 0.2 * i)
            W.data = np.array([0.3, -0.6, 0.9]) * (1.0 + 0.5 * i)  # (captured, changed)
            out = f(x)
            c = out[1]
            same = tuple(c.grad is o for o in (x.grad,) + tuple(out)) + \
                tuple(c.grad is o.grad for o in out)
            inside = _arr(c.grad)
            F.sum(out[-1] if fn is grad_also_returned else out[0]).backward(
                create_graph=(mode == "create_graph"))
            seen.append((same, inside, _arr(c.grad), _arr(x.grad)))
        assert seen[0][0] == seen[1][0], seen
        for a, b in zip(seen[0][1:], seen[1][1:]):
            np.testing.assert_allclose(b, a, rtol=1e-12, atol=1e-12)
    info = jf.cache_info()
    assert info["fallbacks"] == 0 and info["hits"] >= 3, info


def test_the_first_call_check_compares_the_gradients_of_made_leaves():
    # The check against eager differentiates both runs' results: a made leaf the
    # compiled run leaves out of its graph (as compiled calls did) is a difference.
    from tracejit.runtime.checking import gradient_difference
    x = Variable(np.array([0.5, 1.0, 2.0]))
    expected = direct(x)
    y, c = direct(x)
    detached = (y, Variable(c.data.copy()))
    assert gradient_difference(expected, direct(x), [("argument x", x)]) is None
    diff = gradient_difference(expected, detached, [("argument x", x)])
    assert diff is not None and "a leaf the call made" in diff, diff
