"""A function runs a backward with create_graph=True through a user Function with
per-call state (an opaque node of the compiled graph) and returns the gradient; the
caller walks from it with retain_grad=True and create_graph=True, then takes a
second-order backward through the gradients. Eager's graph of that gradient is the
Functions the user's backward made, each keeping its .grad, which the second walk adds
to. Two things must hold, on the tracing call and on compiled ones:
- the replay that makes the results its own gives their new creators generations
  below the Functions the caller made of them before (an opaque node replays as
  several eager Functions, more than its depth in the graph), so the second walk
  visits them in eager's order;
- the tracing call's result, made by one opaque Function (UserGrad), is walked as the
  user's backward's own graph, so its intermediates keep their .grads as eager's."""
import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F
from tracejit import Parameter, Variable

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")

W = Parameter(np.array([0.5, -0.3, 0.8]), name="W")


class SignedCube(tj.Function):
    # Per-call state: its backward is one opaque node of the compiled graph.
    def forward(self, x):
        self.k = 3.0 if x.sum() > 0 else 2.0
        return x ** 3

    def backward(self, gy):
        x, = self.inputs
        return gy * self.k * x * x * 1.0


class LoopedBackward(tj.Function):
    # Its backward's depth (eager's generations) depends on the call's data.
    def forward(self, x):
        self.n = 1 if x.sum() > 0 else 4
        return np.sin(x)

    def backward(self, gy):
        x, = self.inputs
        r = gy * F.cos(x)
        for _ in range(self.n):
            r = r * 1.5
        return r


def cube_grad(x):
    F.sum(SignedCube()(x * W)).backward(create_graph=True)
    return x.grad, W.grad, x


def looped_grad_and_value(x):
    h = LoopedBackward()(x)
    F.sum(h * h).backward(create_graph=True)
    return x.grad, F.exp(h)


def run(fn, v, square):
    x = Variable(v.copy())
    W.cleargrad()
    rs = fn(x)
    x.cleargrad()
    loss = sum(F.sum(r * r * (k + 1.0)) if square else F.sum(r * (k + 2.0))
               for k, r in enumerate(rs) if r is not x)
    W.cleargrad()
    loss.backward(retain_grad=True, create_graph=True)
    g1, w1, r_grad = x.grad, W.grad, rs[0].grad
    x.cleargrad()
    W.cleargrad()
    F.sum(g1 * g1).backward()
    return [g1.data.copy(), x.grad.data.copy(), r_grad.data.copy(),
            None if w1 is None else w1.data.copy(),
            None if W.grad is None else W.grad.data.copy()]


@pytest.mark.parametrize("shape", [(1,), (3,)])
@pytest.mark.parametrize("square", [True, False], ids=["squared", "linear"])
@pytest.mark.parametrize("fn", [cube_grad, looped_grad_and_value],
                         ids=lambda f: f.__name__)
def test_second_order_after_a_retaining_walk_through_a_user_backward(fn, square, shape):
    jf = tj.jit(fn)
    rng = np.random.default_rng(3)
    W.data = np.array([0.5, -0.3, 0.8])
    for call in range(6):
        # The sign flips the user Function's state (and its backward's depth).
        v = rng.uniform(0.2, 1.0, shape) * (1.0 if call % 3 else -1.0)
        want = run(fn, v, square)
        got = run(jf, v, square)
        for k, (g, e) in enumerate(zip(got, want)):
            assert (g is None) == (e is None), (call, k)
            if e is not None:
                np.testing.assert_allclose(g, e, rtol=1e-10, atol=1e-12,
                                           err_msg=f"call {call}, gradient {k}")
        W.data = W.data + 0.1            # a mutated captured Parameter
    assert jf.cache_info()["hits"] >= 3


def walks_its_grad_inside(x):
    # A retain_grad walk inside f through x.grad, made by the user's backward: eager
    # keeps a .grad on each Variable that backward made, which the caller's walk adds
    # to. Compiled calls do not hold them: the function runs eagerly, and says why.
    F.sum(SignedCube()(x)).backward(create_graph=True)
    g = x.grad
    F.sum(g * W).backward(retain_grad=True)
    return g, W.grad, x


def test_a_retaining_walk_inside_through_a_user_backward_runs_eagerly():
    import warnings
    jf = tj.jit(walks_its_grad_inside)
    rng = np.random.default_rng(5)
    W.data = np.array([0.5, -0.3, 0.8])
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always", tj.JitWarning)
        for call in range(4):
            v = rng.uniform(0.2, 1.0, (3,)) * (1.0 if call % 2 else -1.0)
            want = run(walks_its_grad_inside, v, square=True)
            got = run(jf, v, square=True)
            for k, (g, e) in enumerate(zip(got, want)):
                assert (g is None) == (e is None), (call, k)
                if e is not None:
                    np.testing.assert_allclose(g, e, rtol=1e-10, atol=1e-12,
                                               err_msg=f"call {call}, gradient {k}")
            W.data = W.data + 0.1
    msgs = [str(w.message) for w in seen if issubclass(w.category, tj.JitWarning)]
    assert len(msgs) == 1, msgs
    assert "retain_grad=True inside the function passes through a gradient a user " \
        "Function with per-call state (SignedCube)" in msgs[0]
    assert "F.sum(g * W).backward(retain_grad=True)" in msgs[0]      # the user's line
    assert jf.cache_info()["fallbacks"] >= 2
