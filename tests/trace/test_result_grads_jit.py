"""A result made inside a compiled call keeps the `.grad` eager's backward left on it.

`loss.backward(retain_grad=True)` inside the function keeps the gradients of the
intermediates, and the function may return them (`return loss, y`): the caller reads
`y.grad` and `loss.grad` as eager gives them (set, not None; this call's values, fresh
arrays; the same object where the function returns the gradient too). Each test calls
the jitted function at least four times with new values (and a mutated captured
Parameter) and compares each call with eager; an unexpected fallback fails the test.
"""
import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F
from tracejit import Parameter, Variable

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")


def close(a, b):
    if a is None or b is None:
        assert a is None and b is None
        return
    a = a.data if isinstance(a, Variable) else a
    b = b.data if isinstance(b, Variable) else b
    assert a.dtype == b.dtype and a.shape == b.shape
    tol = 1e-5 if a.dtype == np.float32 else 1e-9
    np.testing.assert_allclose(a, b, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_retain_grad_intermediates_returned(dtype):
    W = Parameter(np.random.RandomState(0).randn(3, 2).astype(dtype))

    def step(x):
        y = F.matmul(x, W)
        z = F.tanh(y)
        loss = F.sum(z * z)
        loss.backward(retain_grad=True)
        return loss, y, z

    f = tj.jit(step)
    rng = np.random.RandomState(1)
    for i in range(6):
        x = rng.randn(4, 3).astype(dtype)
        W.cleargrad()
        e = step(x)
        ge = W.grad
        W.cleargrad()
        j = f(x)
        close(W.grad, ge)
        for a, b in zip(e, j):
            close(a, b)
            close(a.grad, b.grad)
        # The seed is this call's own array: changing it changes no other call's.
        j[0].grad.data[...] = 7.0
        W.data += 0.1
    assert f.cache_info()["hits"] >= 3


def test_plain_backward_leaves_results_without_grad():
    def step(x):
        y = F.exp(x)
        loss = F.sum(y)
        loss.backward()
        return loss, y

    f = tj.jit(step)
    for i in range(5):
        x = Variable(np.random.randn(3))
        xj = Variable(x.data.copy())
        e, j = step(x), f(xj)
        close(x.grad, xj.grad)
        for a, b in zip(e, j):
            close(a.grad, b.grad)


def test_returned_gradient_is_the_results_grad():
    def step(x):
        y = F.sin(x) * 2.0
        loss = F.sum(y * y)
        loss.backward(retain_grad=True)
        return y, y.grad, loss

    f = tj.jit(step)
    for i in range(5):
        v = np.random.randn(4)
        e = step(Variable(v.copy()))
        j = f(Variable(v.copy()))
        assert (e[0].grad is e[1]) and (j[0].grad is j[1])
        for a, b in zip(e, j):
            close(a, b)
            close(a.grad, b.grad)


def test_changing_the_traced_calls_seed_changes_no_later_call():
    # `loss = x + 1.0` gives x.grad backward's seed itself; the traced call's seed array
    # was read by the graph as a capture, so scaling x.grad in place (as ClipGrad does)
    # changed every later call's gradient.
    def step(x):
        loss = x + 1.0
        loss.backward(retain_grad=True)
        return loss

    f = tj.jit(step)
    for i in range(5):
        v = np.array(np.random.randn())
        xe, xj = Variable(v.copy()), Variable(v.copy())
        e, j = step(xe), f(xj)
        close(e, j)
        close(xe.grad, xj.grad)
        close(e.grad, j.grad)
        xj.grad.data *= 0.5
        j.grad.data *= 3.0
    assert f.cache_info()["hits"] >= 3


def _second_order(step, x):
    loss = step(x)
    loss = loss[0] if isinstance(loss, tuple) else loss
    gx = x.grad
    has_creator = gx.creator is not None
    x.cleargrad()
    F.sum(gx * gx).backward()
    return loss, gx, has_creator, x.grad


@pytest.mark.parametrize("returned", ["none", "result_grad"])
def test_create_graph_grad_not_returned_runs_eagerly(returned):
    # backward(create_graph=True) in the call gives x.grad (and a retained result's
    # .grad) graph history; compiled calls set them as plain Variables, so a backward
    # through them outside reached nothing (x.grad None): silently wrong second order.
    # Not returned, such a .grad makes the call run eagerly, warned.
    def step(x):
        y = F.tanh(x) * 2.0
        loss = F.sum(y * y * y)
        loss.backward(create_graph=True, retain_grad=(returned == "result_grad"))
        return (loss, y) if returned == "result_grad" else loss

    f = tj.jit(step)
    with pytest.warns(tj.JitWarning, match="create_graph=True"):
        for i in range(2):         # the first call runs eagerly, the second traces
            f(Variable(np.random.randn(3)))
    for i in range(4):
        v = np.random.randn(3)
        e = _second_order(step, Variable(v.copy()))
        j = _second_order(f, Variable(v.copy()))
        assert e[2] and j[2]
        for a, b in zip(e[:2] + e[3:], j[:2] + j[3:]):
            close(a, b)


def test_create_graph_grad_returned_compiles():
    def step(x):
        loss = F.sum(F.tanh(x) ** 3)
        loss.backward(create_graph=True)
        return loss, x.grad

    f = tj.jit(step)
    for i in range(5):
        v = np.random.randn(3)
        e = _second_order(step, Variable(v.copy()))
        j = _second_order(f, Variable(v.copy()))
        assert e[2] and j[2]
        for a, b in zip(e[:2] + e[3:], j[:2] + j[3:]):
            close(a, b)
    assert f.cache_info()["hits"] >= 3


def test_create_graph_seed_of_a_returned_loss_is_a_constant():
    # backward(create_graph=True)'s seed is a Constant (it stores no gradient): the
    # loss returned keeps it as eager's does, a Constant of this call's ones.
    def step(x):
        loss = F.sum(F.tanh(x) ** 3)
        loss.backward(create_graph=True, retain_grad=True)
        return loss, x.grad

    f = tj.jit(step)
    for i in range(5):
        v = np.random.randn(3)
        e, j = step(Variable(v.copy())), f(Variable(v.copy()))
        assert type(e[0].grad) is type(j[0].grad) is tj.core.Constant
        for a, b in zip(e, j):
            close(a, b)
            close(a.grad, b.grad)
    assert f.cache_info()["hits"] >= 3


def test_a_later_backward_adds_to_the_retained_grad():
    # A backward outside through a result whose .grad the call retained starts from
    # that .grad plus the new cotangent (DeZero's accumulation), in eager; with the
    # retained .grad lost, x.grad and P.grad were off.
    P = Parameter(np.random.RandomState(0).randn(3))

    def step(x):
        y = F.tanh(x * P)
        loss = F.sum(y * y)
        loss.backward(retain_grad=True)
        return loss, y

    f = tj.jit(step)
    rng = np.random.RandomState(2)
    for i in range(5):
        v = rng.randn(3)
        got = []
        for g in (step, f):
            x = Variable(v.copy())
            P.cleargrad()
            loss, y = g(x)
            F.sum(y * 3.0).backward()
            got.append((x.grad, P.grad))
        for a, b in zip(*got):
            close(a, b)
        P.data -= 0.1
    assert f.cache_info()["hits"] >= 3


@pytest.mark.parametrize("grad_mode", [True, False])
def test_retained_grads_of_a_call_on_ndarrays(grad_mode):
    # Nothing differentiable from outside, no effects: the runner's smallest form.
    def step(x):
        v = Variable(x)
        y = F.tanh(v)
        loss = F.sum(y * y)
        loss.backward(retain_grad=True)
        return loss, y, v.grad

    f = tj.jit(step)
    with tj.using_config("enable_backprop", grad_mode):
        for i in range(5):
            x = np.random.randn(3)
            e, j = step(x.copy()), f(x.copy())
            for a, b in zip(e, j):
                close(a, b)
                if a is not None:
                    close(a.grad, b.grad)
    assert f.cache_info()["hits"] >= 3
