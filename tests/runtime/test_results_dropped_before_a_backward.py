"""A result another result is computed from is an intermediate of eager's graph: that
graph keeps it alive after the caller drops its own reference (`S['h'] = None`, `del h`,
the state rebound), and a later backward from the other result adds the .grad it holds
(retained by a backward inside the function, or set by the caller) to the gradient
flowing on. A compiled call's creator holds such a result as long as eager's graph
would, and no longer: after the results are gone, reference counting alone frees the
call. Each test calls the jitted function at least four times with new values, a
captured Parameter changed between calls, compared with eager; an unexpected fallback
fails the test."""
import gc
import weakref

import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F
from tracejit import Parameter, Variable

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")

W0 = np.array([[0.5, -0.3], [0.2, 0.8], [-0.6, 0.1]])


def close(a, b):
    assert (a is None) == (b is None), (a, b)
    if a is not None:
        np.testing.assert_allclose(b.data, a.data, rtol=1e-12, atol=1e-12)


def before_backward(h, mode):
    """What the caller does to the stored result h before dropping it."""
    if mode == "scale":
        h.grad = h.grad * 3.0
    elif mode == "clear":
        h.cleargrad()
    elif mode == "set":
        h.grad = Variable(np.full(h.shape, 0.7))


def compare(fn, W, calls, use):
    """fn and jit(fn) on the same values, `calls` times, W changed between calls:
    use(g, x) calls g, drops what it drops, and runs the caller's backward."""
    jf = tj.jit(fn)
    for call in range(calls):
        v = np.random.default_rng(call).uniform(-1.0, 1.0, (4, 3))
        runs = []
        for g in (fn, jf):
            W.data = W0 + 0.1 * call
            W.cleargrad()
            x = Variable(v.copy())
            use(g, x)
            runs.append((x.grad, W.grad))
        for a, b in zip(*runs):
            close(a, b)
    assert jf.cache_info()["hits"] >= 2


@pytest.mark.parametrize("mode", ["drop", "scale", "set", "clear", "rebind"])
def test_stored_result_with_a_retained_grad_dropped(mode):
    W = Parameter(W0.copy())
    S = {"h": None}

    def f(x):
        h = F.tanh(F.matmul(x, W))
        F.sum(h * h).backward(retain_grad=True)
        S["h"] = h
        return F.sum(h * 2.0)

    def use(g, x):
        y = g(x)
        before_backward(S["h"], mode)
        S["h"] = Variable(np.ones(2)) if mode == "rebind" else None
        y.backward()

    compare(f, W, 5, use)


def test_stored_result_the_caller_gives_a_grad_then_drops():
    # No backward inside: the .grad is the caller's, set on the stored result.
    W = Parameter(W0.copy())

    class Model:
        h = None

    m = Model()

    def f(x):
        m.h = F.tanh(F.matmul(x, W))
        return F.sum(F.exp(m.h) * 0.5)

    def use(g, x):
        y = g(x)
        before_backward(m.h, "set")
        m.h = None
        y.backward()

    compare(f, W, 5, use)


@pytest.mark.parametrize("mode", ["drop", "scale"])
def test_returned_result_deleted_before_the_backward(mode):
    W = Parameter(W0.copy())

    def f(x):
        h = F.tanh(F.matmul(x, W))
        F.sum(h * h).backward(retain_grad=True)
        return F.sum(h * 2.0), h

    def use(g, x):
        y, h = g(x)
        before_backward(h, mode)
        del h
        y.backward()

    compare(f, W, 5, use)


def test_a_chain_of_stored_results_all_dropped():
    # h2 is computed from h1, the loss from both: each holds a retained .grad.
    W = Parameter(W0.copy())
    S = {"h1": None, "h2": None}

    def f(x):
        h1 = F.sin(F.matmul(x, W))
        h2 = F.tanh(h1 * 1.5)
        F.sum(h2 * h1).backward(retain_grad=True)
        S["h1"], S["h2"] = h1, h2
        return F.sum(h2 * 2.0) + F.sum(h1)

    def use(g, x):
        y = g(x)
        S["h1"] = S["h2"] = None
        y.backward()

    compare(f, W, 5, use)


@pytest.fixture
def no_gc():
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@pytest.mark.parametrize("how", ["del", "unchain"])
def test_the_held_result_lives_as_long_as_in_eager(no_gc, how):
    # Dropped by the caller, h lives while the loss does (its graph holds h), and dies
    # with it, or when the loss is unchained: with no reference cycle left behind.
    W = Parameter(W0.copy())
    S = {"h": None}

    def f(x):
        h = F.tanh(F.matmul(x, W))
        F.sum(h * h).backward(retain_grad=True)
        S["h"] = h
        return F.sum(h * 2.0)

    jf = tj.jit(f)
    for call in range(5):
        v = np.random.default_rng(call).uniform(-1.0, 1.0, (4, 3))
        W.data = W0 + 0.1 * call
        seen = []
        for g in (f, jf):
            W.cleargrad()
            y = g(Variable(v.copy()))
            h, creator = weakref.ref(S["h"]), weakref.ref(y.creator)
            S["h"] = None
            y.backward()
            alive_with_loss = h() is not None
            if how == "del":
                del y
            else:
                y.unchain_backward()
            # (An unchained loss keeps a creator, eager's and a replay's: not checked.)
            seen.append((alive_with_loss, h() is None, how == "unchain" or creator() is None))
        assert seen == [(True, True, True)] * 2, seen
    assert jf.cache_info()["hits"] >= 2
