"""The backward of a compiled call (tracejit.trace.backward): through a compiled region
mixed with eager ops, from a non-scalar output, create_graph second derivatives, a
returned argument's gradient, gradients accumulated across calls, retain_grad.
"""
import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F
from tracejit import Variable

from results_close import assert_close, assert_grad_close

N_CALLS = 6          # >= 5: warm-up, trace, then at least 3 replays

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")


def test_backward_through_region_and_mixed_eager():
    def f(x, y):
        return F.tanh(x) * y + x ** 2

    jf = tj.jit(f)
    r = np.random.default_rng(17)
    for i in range(N_CALLS):
        xa, ya = r.standard_normal((2, 3)), r.standard_normal((2, 3))
        xj, yj = Variable(xa.copy()), Variable(ya.copy())
        xe, ye = Variable(xa.copy()), Variable(ya.copy())
        zj = F.sum(jf(xj * 2, F.sin(yj)) + xj)      # eager before and after
        ze = F.sum(f(xe * 2, F.sin(ye)) + xe)
        assert_close(zj, ze)
        zj.backward()
        ze.backward()
        assert_grad_close(xj, xe)
        assert_grad_close(yj, ye)
    assert jf.cache_info()["fallbacks"] == 0, jf.cache_info()


def test_backward_nonscalar_output_direct():
    def f(x, y):
        return x * y + F.exp(x)

    jf = tj.jit(f)
    r = np.random.default_rng(18)
    for i in range(N_CALLS):
        xa, ya = r.standard_normal(3), r.standard_normal(3)
        xj, yj = Variable(xa.copy()), Variable(ya.copy())
        xe, ye = Variable(xa.copy()), Variable(ya.copy())
        zj, ze = jf(xj, yj), f(xe, ye)
        assert_close(zj, ze)
        zj.backward()
        ze.backward()
        assert_grad_close(xj, xe)
        assert_grad_close(yj, ye)
    assert jf.cache_info()["fallbacks"] == 0, jf.cache_info()


def test_create_graph_second_derivative():
    def f(x):
        return F.tanh(x) * x

    jf = tj.jit(f)
    for v in [0.3, -0.7, 1.2, 0.05, -2.0, 0.9]:
        xj, xe = Variable(np.array(v)), Variable(np.array(v))
        yj, ye = jf(xj), f(xe)
        assert_close(yj, ye)
        yj.backward(create_graph=True)
        ye.backward(create_graph=True)
        assert_close(xj.grad, xe.grad)
        gj, ge = xj.grad, xe.grad
        xj.cleargrad()
        xe.cleargrad()
        gj.backward()
        ge.backward()
        assert_close(xj.grad, xe.grad)
    assert jf.cache_info()["fallbacks"] == 0, jf.cache_info()


@pytest.mark.parametrize("form", ["identity", "noop_reshape"])
def test_returned_argument_gets_gradient(form):
    if form == "identity":
        f = lambda x, y: (x, y * 2)
    else:
        f = lambda x, y: (F.reshape(x, x.shape), y * 2)
    jf = tj.jit(f)
    r = np.random.default_rng(34)
    for i in range(N_CALLS):
        xa, ya = r.standard_normal(3), r.standard_normal(3)
        xj, yj_ = Variable(xa.copy()), Variable(ya.copy())
        xe, ye_ = Variable(xa.copy()), Variable(ya.copy())
        (aj, bj), (ae, be) = jf(xj, yj_), f(xe, ye_)
        assert_close((aj, bj), (ae, be))
        F.sum(aj * bj).backward()
        F.sum(ae * be).backward()
        assert_grad_close(xj, xe)
        assert_grad_close(yj_, ye_)
    assert jf.cache_info()["fallbacks"] == 0, jf.cache_info()


def test_gradient_accumulates_across_compiled_calls():
    f = lambda x: F.sum(F.tanh(x))
    jf = tj.jit(f)
    r = np.random.default_rng(27)
    for i in range(N_CALLS):
        xa = r.standard_normal(3)
        xj, xe = Variable(xa.copy()), Variable(xa.copy())
        (jf(xj) + jf(xj * 3)).backward()
        (f(xe) + f(xe * 3)).backward()
        assert_grad_close(xj, xe)
        jf(xj).backward()
        f(xe).backward()
        assert_grad_close(xj, xe)
    assert jf.cache_info()["fallbacks"] == 0, jf.cache_info()


def test_retain_grad_on_compiled_output():
    g = lambda x: F.tanh(x) * 3
    jf = tj.jit(g)
    r = np.random.default_rng(28)
    for i in range(N_CALLS):
        xa = r.standard_normal(3)
        xj, xe = Variable(xa.copy()), Variable(xa.copy())
        yj, ye = jf(xj), g(xe)
        F.sum(yj * yj).backward(retain_grad=True)
        F.sum(ye * ye).backward(retain_grad=True)
        assert_grad_close(yj, ye)
        assert_grad_close(xj, xe)
    assert jf.cache_info()["fallbacks"] == 0, jf.cache_info()
