"""The backward of a compiled call (tracejit.trace.backward): through a compiled region
mixed with eager ops, from a non-scalar output, create_graph second derivatives, a
returned argument's gradient, gradients accumulated across calls, retain_grad.
"""
import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F
from tracejit import Variable

from tracejit.testing.checks import assert_call_matches_eager

N_CALLS = 6          # >= 5: warm-up, trace, then at least 3 replays

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")


def _same_run(run, jf, f, *args):
    """run(fn, *args) calls fn and runs the backward under test, returning what is
    compared (results, gradients); the jitted side's run beside eager's, on copies."""
    return assert_call_matches_eager(lambda *a: run(jf, *a), lambda *a: run(f, *a), *args,
                                     backward=False, rtol=1e-10, atol=1e-12)


def test_backward_through_region_and_mixed_eager():
    def f(x, y):
        return F.tanh(x) * y + x ** 2

    def run(fn, x, y):
        z = F.sum(fn(x * 2, F.sin(y)) + x)      # eager before and after
        z.backward()
        return z, x.grad, y.grad

    jf = tj.jit(f)
    r = np.random.default_rng(17)
    for i in range(N_CALLS):
        xa, ya = r.standard_normal((2, 3)), r.standard_normal((2, 3))
        _same_run(run, jf, f, Variable(xa), Variable(ya))
    assert jf.cache_info()["fallbacks"] == 0, jf.cache_info()


def test_backward_nonscalar_output_direct():
    def f(x, y):
        return x * y + F.exp(x)

    def run(fn, x, y):
        z = fn(x, y)
        z.backward()
        return z, x.grad, y.grad

    jf = tj.jit(f)
    r = np.random.default_rng(18)
    for i in range(N_CALLS):
        xa, ya = r.standard_normal(3), r.standard_normal(3)
        _same_run(run, jf, f, Variable(xa), Variable(ya))
    assert jf.cache_info()["fallbacks"] == 0, jf.cache_info()


def test_create_graph_second_derivative():
    def f(x):
        return F.tanh(x) * x

    def run(fn, x):
        y = fn(x)
        y.backward(create_graph=True)
        g = x.grad
        x.cleargrad()
        g.backward()
        return y, g, x.grad

    jf = tj.jit(f)
    for v in [0.3, -0.7, 1.2, 0.05, -2.0, 0.9]:
        _same_run(run, jf, f, Variable(np.array(v)))
    assert jf.cache_info()["fallbacks"] == 0, jf.cache_info()


@pytest.mark.parametrize("form", ["identity", "noop_reshape"])
def test_returned_argument_gets_gradient(form):
    if form == "identity":
        f = lambda x, y: (x, y * 2)
    else:
        f = lambda x, y: (F.reshape(x, x.shape), y * 2)
    def run(fn, x, y):
        a, b = fn(x, y)
        F.sum(a * b).backward()
        return (a, b), x.grad, y.grad

    jf = tj.jit(f)
    r = np.random.default_rng(34)
    for i in range(N_CALLS):
        xa, ya = r.standard_normal(3), r.standard_normal(3)
        _same_run(run, jf, f, Variable(xa), Variable(ya))
    assert jf.cache_info()["fallbacks"] == 0, jf.cache_info()


def test_gradient_accumulates_across_compiled_calls():
    f = lambda x: F.sum(F.tanh(x))
    jf = tj.jit(f)
    r = np.random.default_rng(27)

    def run(fn, x):
        (fn(x) + fn(x * 3)).backward()
        g = x.grad                  # the accumulation rebinds x.grad: g keeps its value
        fn(x).backward()
        return g, x.grad

    for i in range(N_CALLS):
        _same_run(run, jf, f, Variable(r.standard_normal(3)))
    assert jf.cache_info()["fallbacks"] == 0, jf.cache_info()


def test_retain_grad_on_compiled_output():
    g = lambda x: F.tanh(x) * 3
    jf = tj.jit(g)
    r = np.random.default_rng(28)

    def run(fn, x):
        y = fn(x)
        F.sum(y * y).backward(retain_grad=True)
        return y, y.grad, x.grad

    for i in range(N_CALLS):
        _same_run(run, jf, g, Variable(r.standard_normal(3)))
    assert jf.cache_info()["fallbacks"] == 0, jf.cache_info()
