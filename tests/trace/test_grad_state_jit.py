"""A Variable's `.grad` is state a compiled call reads and writes, as eager does.

Whether an argument's or a captured Variable's `.grad` is None when the call starts
decides what backward does (set it, or add to it), and the function may read it: a
compiled call gives what eager gives whatever `.grad` each call finds (None, set, of
another dtype), reads this call's `.grad` (not the traced call's), and returns the
`.grad` object eager returns. Each test calls the jitted function at least three times
after its trace with new values (and new or cleared gradients) and compares each call
with eager; an unexpected fallback fails the test.
"""
import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F
from tracejit import Parameter, Variable

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")


def loss_backward(x):
    loss = F.sum(x * x)
    loss.backward()
    return loss


def close(a, b):
    if a is None or b is None:
        assert a is None and b is None
        return
    a = a.data if isinstance(a, Variable) else a
    b = b.data if isinstance(b, Variable) else b
    assert a.dtype == b.dtype and a.shape == b.shape
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-12)


def grad_of(spec, rng, shape):
    if spec is None:
        return None
    dtype, gshape = spec
    return Variable(rng.normal(size=gshape or shape).astype(dtype))


@pytest.mark.parametrize("grads", [
    # three calls on fresh x, then with x.grad set (the reported case)
    [None, None, None, None, (np.float64, None), (np.float64, None), (np.float64, None)],
    # alternating: a variant each, never one for the other
    [None, (np.float64, None)] * 4,
    # a float32 .grad on a float64 x, and one that broadcasts
    [None, None, None, (np.float32, None), (np.float32, None), (np.float32, None),
     (np.float64, (1,)), (np.float64, (1,)), (np.float64, (1,))],
])
def test_backward_adds_to_an_argument_grad_that_is_set(grads):
    rng = np.random.default_rng(0)
    jf = tj.jit(loss_backward)
    for spec in grads:
        a = rng.normal(size=3)
        g = grad_of(spec, rng, (3,))
        xe, xj = Variable(a.copy()), Variable(a.copy())
        if g is not None:
            xe.grad, xj.grad = Variable(g.data.copy()), Variable(g.data.copy())
        close(loss_backward(xe), jf(xj))
        close(xe.grad, xj.grad)
    info = jf.cache_info()
    assert info["hits"] >= 3, info


def test_reads_this_calls_argument_grad():
    f = lambda x: F.exp(x) * x.grad       # noqa: E731
    jf = tj.jit(f)
    rng = np.random.default_rng(1)
    for _ in range(6):
        a, b = rng.normal(size=3), rng.normal(size=3)
        xe, xj = Variable(a.copy()), Variable(a.copy())
        xe.grad, xj.grad = Variable(b.copy()), Variable(b.copy())
        close(f(xe), jf(xj))
    assert jf.cache_info()["hits"] >= 3


def test_reads_this_calls_argument_grad_in_a_backward():
    def f(x, w):
        y = F.sum(F.exp(x) * x.grad * w)
        y.backward()
        return y

    jf = tj.jit(f)
    rng = np.random.default_rng(2)
    for _ in range(6):
        a, b, c = rng.normal(size=(3, 3))
        xe, xj = Variable(a.copy()), Variable(a.copy())
        be, bj = Variable(b.copy()), Variable(b.copy())
        xe.grad, xj.grad = be, bj
        we, wj = Parameter(c.copy()), Parameter(c.copy())
        close(f(xe, we), jf(xj, wj))
        close(xe.grad, xj.grad)
        close(we.grad, wj.grad)
        # The .grad read is an operand: backward gives it a gradient (this call's one).
        close(be.grad, bj.grad)
        assert be.grad is not None
    assert jf.cache_info()["hits"] >= 3


def test_a_returned_grad_of_an_unused_capture_is_its_grad_now():
    Q = Variable(np.ones(2))
    Q.grad = Variable(np.zeros(2))
    f = lambda x: (F.exp(x), Q.grad)      # noqa: E731
    jf = tj.jit(f)
    rng = np.random.default_rng(3)
    for i in range(6):
        Q.grad = Variable(np.full(2, float(i)))     # same values as before: a new object
        a = rng.normal(size=2)
        ye, ge = f(Variable(a))
        yj, gj = jf(Variable(a))
        close(ye, yj)
        assert ge is Q.grad and gj is Q.grad
    assert jf.cache_info()["hits"] >= 3


def make_step(W):
    def step(x):
        loss = F.sum(W * x)
        loss.backward()
        W.data -= 0.1 * W.grad.data
        return loss
    return step


@pytest.mark.parametrize("clear_every", [0, 1, 2, 3])
def test_a_captured_parameter_grad_none_or_set(clear_every):
    """A training step without cleargrads() (gradients accumulate, as in eager), with it
    before every call, or only every 2nd / 3rd call."""
    rng = np.random.default_rng(4)
    w = rng.normal(size=3)
    We, Wj = Parameter(w.copy()), Parameter(w.copy())
    eager, jf = make_step(We), tj.jit(make_step(Wj))
    for i in range(9):
        if clear_every and i % clear_every == 0:
            We.cleargrad()
            Wj.cleargrad()
        a = rng.normal(size=3)
        close(eager(Variable(a)), jf(Variable(a)))
        close(We.grad, Wj.grad)
        close(We, Wj)
    assert jf.cache_info()["hits"] >= (3 if clear_every in (0, 1) else 1)


def test_a_captured_parameter_grad_of_another_dtype():
    rng = np.random.default_rng(5)
    w = rng.normal(size=3)
    We, Wj = Parameter(w.copy()), Parameter(w.copy())
    eager, jf = make_step(We), tj.jit(make_step(Wj))
    for i in range(8):
        if i == 4:
            g = rng.normal(size=3).astype(np.float32)
            We.grad, Wj.grad = Variable(g.copy()), Variable(g.copy())
        a = rng.normal(size=3)
        close(eager(Variable(a)), jf(Variable(a)))
        close(We.grad, Wj.grad)
        close(We, Wj)
    assert jf.cache_info()["hits"] >= 3
