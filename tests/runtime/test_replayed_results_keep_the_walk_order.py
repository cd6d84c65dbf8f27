"""A backward with retain_grad=True and create_graph=True through a compiled call
replays the call on Variables and makes its results the replay's own (their creator
becomes the replay's Function, as eager's results have theirs). Functions the caller
made of a result before that (`gy * y` in the backward of `y * y`, `x.grad + gx` when
the call returned x.grad) must still come after the result's creator in a later walk:
each result has eager's generation (the call's own plus its depth in it), not the
call's + 1. A second-order backward through the gradients then gives eager's values."""
import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F
from tracejit import Parameter, Variable

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")

W = Parameter(np.array([0.5, -0.3, 0.8]), name="W")


def deep(x):
    return F.exp(F.sin(F.tanh(x * 0.7)))


def two_results(x):
    h = F.tanh(x * W)
    return F.exp(F.sin(h)) * 0.5, F.sin(h * h)


def returns_its_grad(x):
    # x.grad from a create_graph backward inside: the caller's walk adds to it
    # (`x.grad + gx`) before it reaches the call.
    h = F.tanh(x * 0.7)
    F.sum(h * h).backward(create_graph=True)
    return F.exp(h), x.grad, x


def square_loss(rs, x):
    return sum(F.sum(r * r * (k + 1.0)) for k, r in enumerate(rs))


def linear_loss_with_x(rs, x):
    # Linear in the results: only x.grad (a result here) gets a Function made of it.
    return sum(F.sum(r * (k + 2.0)) for k, r in enumerate(rs)) + F.sum(x * 3.0)


CASES = [(deep, square_loss), (two_results, square_loss),
         (returns_its_grad, square_loss), (returns_its_grad, linear_loss_with_x)]


def run(fn, loss_of, v):
    x = Variable(v.copy())
    out = fn(x)
    rs = list(out) if isinstance(out, tuple) else [out]
    loss_of(rs, x).backward(retain_grad=True, create_graph=True)
    g1, w1 = x.grad, W.grad
    x.cleargrad()
    W.cleargrad()
    F.sum(g1 * g1).backward()
    got = [g1.data.copy(), x.grad.data.copy(), None if w1 is None else w1.data.copy(),
           None if W.grad is None else W.grad.data.copy()]
    W.cleargrad()
    return got


# (Whether a stale generation reorders the walk depends on the graph's depths: a 0-d
# input's F.sum is one node less.)
@pytest.mark.parametrize("shape", [(), (3,)])
@pytest.mark.parametrize("fn,loss_of", CASES, ids=lambda c: getattr(c, "__name__", ""))
def test_second_order_after_a_retaining_create_graph_walk(fn, loss_of, shape):
    jf = tj.jit(fn)
    rng = np.random.default_rng(7)
    W.data = np.array([0.5, -0.3, 0.8])
    for call in range(6):
        v = rng.uniform(-1.0, 1.0, shape)
        want = run(fn, loss_of, v)
        got = run(jf, loss_of, v)
        for k, (g, e) in enumerate(zip(got, want)):
            assert (g is None) == (e is None), (call, k)
            if e is not None:
                np.testing.assert_allclose(g, e, rtol=1e-10, atol=1e-12,
                                           err_msg=f"call {call}, gradient {k}")
        W.data = W.data + 0.1            # a mutated captured Parameter
    assert jf.cache_info()["hits"] >= 3


def test_results_have_eager_generations():
    jf = tj.jit(deep)
    for call in range(4):
        v = np.array([0.1, 0.2, 0.3]) * (call + 1)
        y, ye = jf(Variable(v)), deep(Variable(v))
        assert y.generation == ye.generation
