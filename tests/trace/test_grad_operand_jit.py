"""A `.grad` Variable used as a differentiable operand gets its own gradient, as in eager.

`F.sum(F.exp(x) * x.grad)`: eager's backward gives the Variable that `x.grad` was at the
call a gradient (`exp(x)`), as it gives any operand. The compiled backward gives it to
the `.grad` Variable the call read, found through its owner at call time (an argument's,
a captured Parameter's), not the traced call's object. Each function is called at least
three times after its trace with new values and new `.grad` objects (a mutated captured
Parameter where there is one), and compared with eager on values and every gradient.
"""
import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F
from tracejit import Parameter, Variable

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")

CALLS = 5


def close(a, b):
    if a is None or b is None:
        assert a is None and b is None, (a, b)
        return
    a = a.data if isinstance(a, Variable) else a
    b = b.data if isinstance(b, Variable) else b
    assert a.dtype == b.dtype and a.shape == b.shape
    np.testing.assert_allclose(b, a, rtol=1e-9, atol=1e-12)


def test_argument_grad_operand_gets_gradient():
    def f(x):
        return F.sum(F.exp(x) * x.grad)

    jf = tj.jit(f)
    rng = np.random.default_rng(1)
    for _ in range(CALLS):
        xv, bv = rng.standard_normal(3), rng.standard_normal(3)
        got = []
        for fn in (f, jf):
            b = Variable(bv.copy())
            x = Variable(xv.copy())
            x.grad = b
            y = fn(x)
            y.backward()
            got.append((y, b.grad, x.grad))
        (ye, be, xe), (yc, bc, xc) = got
        close(ye, yc)
        assert bc is not None
        close(be, bc)
        close(np.exp(xv), bc.data)
        close(xe, xc)
    assert jf.cache_info()["hits"] >= 3


def test_captured_parameter_grad_operand_gets_gradient():
    W = Parameter(np.ones(3), name="W")

    def f(x):
        return F.sum(W.grad * x) + F.sum(W * x)

    jf = tj.jit(f)
    rng = np.random.default_rng(2)
    for _ in range(CALLS):
        xv, gv, wv = rng.standard_normal(3), rng.standard_normal(3), rng.standard_normal(3)
        got = []
        for fn in (f, jf):
            W.data[...] = wv          # the captured Parameter, mutated in place
            W.grad = Variable(gv.copy())
            wg = W.grad
            x = Variable(xv.copy())
            y = fn(x)
            y.backward()
            got.append((y, wg.grad, x.grad, W.grad))
        (ye, ge, xe, We), (yc, gc, xc, Wc) = got
        close(ye, yc)
        assert gc is not None
        close(ge, gc)
        close(xv, gc.data)
        close(xe, xc)
        close(We, Wc)
    assert jf.cache_info()["hits"] >= 3


def test_same_grad_object_accumulates_across_calls():
    # The same .grad Variable read by every call: its gradient accumulates, as eager's.
    W = Parameter(np.ones(2), name="W")
    W.grad = Variable(np.full(2, 0.5))
    W2 = Parameter(np.ones(2), name="W2")
    W2.grad = Variable(np.full(2, 0.5))

    def make(P):
        return lambda x: F.sum(F.tanh(P.grad * x))

    f, jf = make(W), tj.jit(make(W2))
    rng = np.random.default_rng(3)
    for _ in range(CALLS):
        xv = rng.standard_normal(2)
        xe, xc = Variable(xv.copy()), Variable(xv.copy())
        f(xe).backward()
        jf(xc).backward()
        close(W.grad.grad, W2.grad.grad)
        close(xe.grad, xc.grad)
    assert jf.cache_info()["hits"] >= 3


def test_grad_operand_create_graph():
    W = Parameter(np.ones(3), name="W")

    def f(x):
        return F.sum(W.grad * x * x)

    jf = tj.jit(f)
    rng = np.random.default_rng(4)
    for _ in range(CALLS):
        xv, gv = rng.standard_normal(3), rng.standard_normal(3)
        got = []
        for fn in (f, jf):
            W.grad = Variable(gv.copy())
            wg = W.grad
            x = Variable(xv.copy())
            fn(x).backward(create_graph=True)
            gwg = wg.grad                    # x * x, a function of x
            x.cleargrad()
            F.sum(gwg * gwg).backward()      # d/dx sum(x^4) = 4 x^3
            got.append((gwg, x.grad))
        close(got[0][0], got[1][0])
        close(got[0][1], got[1][1])
        close(4 * xv ** 3, got[1][1].data)


def test_grad_operand_backward_from_other_output():
    # A backward from an output that does not reach the .grad leaves its gradient None.
    W = Parameter(np.ones(3), name="W")

    def f(x):
        return F.sum(W.grad * x), F.sum(x * x)

    jf = tj.jit(f)
    rng = np.random.default_rng(5)
    for _ in range(CALLS):
        xv, gv = rng.standard_normal(3), rng.standard_normal(3)
        got = []
        for fn in (f, jf):
            W.grad = Variable(gv.copy())
            wg = W.grad
            x = Variable(xv.copy())
            a, b = fn(x)
            b.backward()
            got.append((wg.grad, x.grad))
        assert got[0][0] is None and got[1][0] is None
        close(got[0][1], got[1][1])
    assert jf.cache_info()["hits"] >= 3


def test_grad_operand_cleared_inside_the_call():
    # The function clears the .grad after using it: the gradient still goes to the
    # Variable it read, not to whatever the owner's .grad is after the call.
    W = Parameter(np.ones(3), name="W")

    def f(x):
        y = F.sum(F.sin(W.grad * x))
        W.cleargrad()
        return y

    jf = tj.jit(f)
    rng = np.random.default_rng(6)
    for _ in range(CALLS):
        xv, gv = rng.standard_normal(3), rng.standard_normal(3)
        got = []
        for fn in (f, jf):
            W.grad = Variable(gv.copy())
            wg = W.grad
            x = Variable(xv.copy())
            y = fn(x)
            assert W.grad is None
            y.backward()
            got.append((y, wg.grad, x.grad, W.grad))
        (ye, ge, xe, We), (yc, gc, xc, Wc) = got
        close(ye, yc)
        close(ge, gc)
        assert gc is not None
        close(xe, xc)
        assert We is None and Wc is None
    assert jf.cache_info()["hits"] >= 3


def test_grad_operand_with_graph_history_reaches_its_owner():
    # W.grad from backward(create_graph=True) is a function of W: a backward through
    # the call goes on through W.grad's graph into W, as eager's does.
    W = Parameter(np.ones(3), name="W")
    W2 = Parameter(np.ones(3), name="W2")

    def make(P):
        return lambda x: F.sum(F.exp(P.grad * x))

    f, jf = make(W), tj.jit(make(W2))
    rng = np.random.default_rng(7)
    for _ in range(CALLS):
        wv, xv = rng.standard_normal(3), rng.standard_normal(3)
        got = []
        for P, fn in ((W, f), (W2, jf)):
            P.data[...] = wv                # the captured Parameter, mutated in place
            P.cleargrad()
            F.sum(P ** 3).backward(create_graph=True)
            x = Variable(xv.copy())
            y = fn(x)
            y.backward()
            got.append((y, x.grad, P.grad))
        for e, c in zip(*got):
            close(e, c)
    assert jf.cache_info()["hits"] >= 3
