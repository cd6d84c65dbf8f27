"""A backward inside the function with retain_grad=True leaves a .grad on the
intermediates of its loss (h below), which the function goes on using: the caller's
backward from the results passes through h, and eager's walk adds h's retained .grad
to the gradient flowing on. Compiled calls hold such a .grad as the call left it (the
caller cannot reach h: a compiled call's results have the call as their creator) and
their backward adds it where eager's does: plain and create_graph, with the caller's
retain_grad, a second backward, and a later call on the branch where the backward
inside does not run. With create_graph=True inside, the retained .grad has history,
which the caller's second-order backward differentiates as eager's does. Each test
calls the jitted function at least four times with new values, the captured Parameter
changed between calls, compared with eager; an unexpected fallback fails the test."""
import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F
from tracejit import Parameter, Variable

W = Parameter(np.array([[0.5, -0.3], [0.2, 0.8], [-0.6, 0.1]]))


def inner_plain(x):
    h = F.tanh(x @ W)
    F.sum(h * h).backward(retain_grad=True)         # h.grad stays on h
    return F.sum(h * 2.0)


def inner_branch(x):
    h = F.tanh(x @ W)
    if x.data.sum() > 0:                            # a variant with no backward inside
        F.sum(h * h).backward(retain_grad=True)
    return F.sum(F.exp(h))


def inner_create_graph(x):
    # h.grad = cos(h): history through h to x and W, which a second-order backward
    # through the caller's x.grad differentiates. (The .grads with history the call
    # leaves outside are returned: those compile.)
    h = x @ W
    F.sin(h).backward(retain_grad=True, create_graph=True)
    return F.sum(h * 2.0), W.grad, x.grad


def inner_create_graph_loss_returned(x):
    h = x @ W
    loss = F.sin(h)
    loss.backward(retain_grad=True, create_graph=True)
    return F.sum(h * 2.0) + F.sum(loss), W.grad, x.grad, loss


def _call(fn, v, create, retain, twice):
    W.cleargrad()
    x = Variable(v.copy())
    out = fn(x)
    y = out[0] if isinstance(out, tuple) else out
    for _ in range(2 if twice else 1):
        y.backward(create_graph=create, retain_grad=retain)
    got = [x.grad.data.copy(), W.grad.data.copy(), None if y.grad is None else
           y.grad.data.copy()]
    if create:
        gx, gw = x.grad, W.grad
        x.cleargrad()
        W.cleargrad()
        F.sum(gx * gx + 0.0).backward()
        F.sum(gw * gw).backward()
        got += [x.grad.data.copy(), W.grad.data.copy()]
    return got, out


@pytest.mark.usefixtures("jit_warnings_are_errors")
@pytest.mark.parametrize("create", [False, True], ids=["plain", "create_graph"])
@pytest.mark.parametrize("retain", [False, True], ids=["", "retain"])
@pytest.mark.parametrize("twice", [False, True], ids=["once", "twice"])
@pytest.mark.parametrize("fn", [inner_plain, inner_branch, inner_create_graph,
                                inner_create_graph_loss_returned], ids=lambda f: f.__name__)
def test_walk_through_an_intermediate_with_a_retained_grad(fn, create, retain, twice):
    jf = tj.jit(fn)
    rng = np.random.default_rng(7)
    W.data = np.array([[0.5, -0.3], [0.2, 0.8], [-0.6, 0.1]])
    for call in range(8):
        # Branch sides: +, +, -, +, -, +, +, - (inner_branch: two variants).
        sign = 1.0 if call in (0, 1, 3, 5, 6) else -1.0
        v = rng.uniform(0.1, 0.9, (4, 3)) * sign
        runs = [_call(g, v, create, retain, twice) for g in (fn, jf)]
        (e, e_out), (j, j_out) = runs
        for a, b in zip(e, j):
            assert (a is None) == (b is None)
            if a is not None:
                np.testing.assert_allclose(b, a, rtol=1e-10, atol=1e-12)
        W.data = W.data * 1.1
    assert jf.cache_info()["hits"] >= 3
    assert jf.cache_info()["fallbacks"] == 0


@pytest.mark.usefixtures("jit_warnings_are_errors")
def test_held_grad_is_the_calls_own():
    # Two calls' results alive at once: each walk adds its own call's retained .grad.
    jf = tj.jit(inner_plain)
    rng = np.random.default_rng(3)
    for _ in range(4):
        vs = [rng.uniform(-1.0, 1.0, (4, 3)) for _ in range(2)]
        grads = []
        for g in (inner_plain, jf):
            xs = [Variable(v.copy()) for v in vs]
            ys = [g(x) for x in xs]
            for y in reversed(ys):
                y.backward()
            grads.append([x.grad.data.copy() for x in xs])
        for a, b in zip(*grads):
            np.testing.assert_allclose(b, a, rtol=1e-12, atol=1e-12)
        W.data = W.data - 0.05


def test_a_retained_grad_on_a_view_of_an_updated_buffer_runs_eagerly(record_jit_warnings):
    # r1 = reshape(view of P) before `P.data -= ...`: eager's r1 sees both states of the
    # buffer, the graph holds two Values; a .grad held there runs eagerly, warned.
    P = Parameter(np.array(0.6))
    Q = Parameter(np.array(-0.4))

    def f(x):
        view = F.reshape(P, (-1,))
        h = F.tanh(x * F.reshape(view, P.shape))
        P.cleargrad()
        F.mean(h ** 2).backward()
        P.data -= 0.1 * P.grad.data
        k = F.tanh((h + F.tanh(x * F.reshape(view, P.shape))) * Q)
        Q.cleargrad()
        F.sum(F.sin(k * k) + k).backward(retain_grad=True)
        return F.exp(k)

    jf = tj.jit(f)
    for call in range(4):
        v = np.array([0.3 + 0.2 * call, -0.5])
        got = []
        for g in (f, jf):
            P.data, Q.data = np.array(0.6), np.array(-0.4)
            x = Variable(v.copy())
            F.sum(g(x)).backward()
            got.append((x.grad.data.copy(), P.grad.data.copy(), Q.grad.data.copy()))
        for a, b in zip(*got):
            np.testing.assert_allclose(b, a, rtol=1e-12, atol=1e-12)
    msgs = [str(w.message) for w in record_jit_warnings]
    assert msgs and all("view of a buffer the function updates in place" in m
                        for m in msgs), msgs
