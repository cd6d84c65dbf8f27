"""A .grad already set when a backward reaches it: DeZero's walk adds its gradient to it
(`x.grad = x.grad + gx`) and passes the sum on, and never reads a .grad where it does
not pass. Through compiled calls the same happens: a result kept as state whose call's
intermediates kept their gradients (a caller's backward with retain_grad=True), the
same loss differentiated twice, an intermediate a backward inside the function left a
.grad on behind a returned loss, a result the caller set a .grad on that the backward
does not reach. Each test calls the jitted function at least four times with new
values, a captured Parameter changed between calls, compared with eager; an
unexpected fallback fails the test."""
import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F
from tracejit import Parameter, Variable

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")


def close(a, b):
    assert (a is None) == (b is None), (a, b)
    if a is not None:
        np.testing.assert_allclose(b.data, a.data, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("retain", [True, False])
def test_state_threaded_through_calls_after_retaining_backwards(retain):
    # h of one call is the next call's input: each backward walks back into every
    # earlier call, whose intermediates hold what the earlier backwards retained.
    W = Parameter(np.array([0.3, -0.2]))
    state = {}

    def step(x):
        h = F.tanh(x * 0.5 + state["h"] * W)
        state["h"] = h
        return h ** 2

    jf = tj.jit(step)
    rng = np.random.default_rng(0)
    xs = [rng.uniform(-1.0, 1.0, 2) for _ in range(6)]
    runs = []
    for g in (step, jf):
        W.data = np.array([0.3, -0.2])
        state["h"] = Variable(np.array([0.1, 0.2]))
        got = []
        for x in xs:
            W.cleargrad()
            y = g(Variable(x.copy()))
            F.sum(y * 1.5).backward(retain_grad=retain)
            got.append((W.grad, state["h"].grad))
            W.data = W.data * 0.9
        runs.append(got)
    for e, j in zip(*runs):
        for a, b in zip(e, j):
            close(a, b)
    assert jf.cache_info()["hits"] >= 3


def test_the_same_loss_twice():
    # The second backward starts from the loss's retained seed and adds, at every
    # intermediate, the gradient the first one left there.
    W = Parameter(np.array([0.5, -1.0, 2.0]))

    def loss_of(x):
        return F.sum(F.exp(F.sin(x * W)) * x)

    jf = tj.jit(loss_of)
    for call in range(5):
        v = np.random.default_rng(call).uniform(-1.0, 1.0, 3)
        runs = []
        for g in (loss_of, jf):
            W.cleargrad()
            x = Variable(v.copy())
            loss = g(x)
            loss.backward(retain_grad=True)
            loss.backward()
            runs.append((x.grad, W.grad, loss.grad))
        for a, b in zip(*runs):
            close(a, b)
        W.data += 0.1
    assert jf.cache_info()["hits"] >= 3


@pytest.mark.parametrize("create", [False, True], ids=["plain", "create_graph"])
def test_intermediate_held_by_an_inner_backward_behind_a_returned_loss(create):
    # y.backward(retain_grad=True) inside leaves a .grad on t (= x + 0.5) as well as
    # on y; the caller's backward from y passes t and adds t's .grad.
    W = Parameter(np.array([1.5, -0.5, 0.25]))

    def f(x):
        t = x + 0.5
        y = t * W
        y.backward(retain_grad=True)
        return F.sin(x), y

    jf = tj.jit(f)
    for call in range(5):
        v = np.random.default_rng(10 + call).uniform(-1.0, 1.0, 3)
        runs = []
        for g in (f, jf):
            W.cleargrad()
            x = Variable(v.copy())
            h, y = g(x)
            (F.sum(h) + F.sum(y * 3.0)).backward(create_graph=create)
            got = [x.grad.data.copy(), W.grad.data.copy()]
            if create:
                gx = x.grad
                x.cleargrad()
                F.sum(gx * gx).backward()
                got.append(x.grad.data.copy())
            runs.append(got)
        for a, b in zip(*runs):
            np.testing.assert_allclose(b, a, rtol=1e-12, atol=1e-12)
        W.data *= 1.1
    assert jf.cache_info()["hits"] >= 3


def test_preset_grad_on_a_result_the_backward_does_not_reach():
    # Eager's walk from y never enters z's part of the call: z's .grad is not read
    # (x gets nothing from it) and stays as the caller set it.
    W = Parameter(np.array([0.7, 0.2, -0.4]))

    def f(x):
        return F.sum(F.sin(x * W)), F.cos(x * x)

    jf = tj.jit(f)
    for call in range(5):
        v = np.random.default_rng(20 + call).uniform(-1.0, 1.0, 3)
        runs = []
        for g in (f, jf):
            W.cleargrad()
            x = Variable(v.copy())
            y, z = g(x)
            z.grad = Variable(np.full(3, 0.25))
            y.backward()
            runs.append((x.grad, W.grad, z.grad))
        for a, b in zip(*runs):
            close(a, b)
        W.data -= 0.05
    assert jf.cache_info()["hits"] >= 3
