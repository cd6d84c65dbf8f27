"""A create_graph backward through a compiled call that updates a buffer in place
(`W.data *= 0.9`) after reading it gives eager's first- and second-order gradients.

Eager's graph holds an operand that is such a buffer (`view = W.data`, a Constant that
aliases it; the Parameter itself) as the buffer: at backward time its Functions read
the buffer as it is then, after the update, for every use before or after it. The
values computed from it are the forward's. A create_graph replay recomputes forward
values with NumPy from the inputs at backward time: recomputing the update's Value
from the already-updated buffer applied the update twice (a steady 0.95x second-order
gradient). Each test calls the jitted function four times with new values, comparing
each call with eager; an unexpected fallback fails the test.
"""
import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")


def _capture_between(w):
    W = tj.Parameter(w)

    def f(x):
        view = W.data
        h = F.tanh(F.relu(x) * view)
        W.data *= 0.9                        # in place: view changes too
        return h + F.tanh(F.relu(x) * view)
    return f, W


def _argument_between(w):
    W = tj.Parameter(w)

    def f(x, W):
        view = W.data
        h = F.tanh(F.relu(x) * view)
        W.data *= 0.9
        return h + F.tanh(F.relu(x) * view)
    return (lambda x: f(x, W)), W, f


def _index_view(w):
    W = tj.Parameter(w)

    def f(x):
        view = W.data[...]
        h = F.tanh(F.sin(x) * view)
        W.data *= 0.9
        return h + F.tanh(F.sin(x) * view)
    return f, W


def _transpose_view(w):
    # A transposed view which the backward reads after the update: the tracer runs it
    # eagerly, updated between the uses or after both (test_transpose_view_runs_eagerly).
    W = tj.Parameter(w)

    def f(x):
        view = W.data.T
        h = F.tanh(F.sin(x) * view) * F.tanh(F.cos(x) * view)
        W.data *= 0.9
        return h
    return f, W


def _transpose_between(w):
    W = tj.Parameter(w)

    def f(x):
        view = W.data.T
        h = F.tanh(F.sin(x) * view)
        W.data *= 0.9
        return h * F.tanh(F.sin(x) * view)
    return f, W


def _update_after_both(w):
    W = tj.Parameter(w)

    def f(x):
        view = W.data
        h = F.tanh(F.relu(x) * view) + F.sin(x * view)
        W.data -= 0.1 * W.data
        return h
    return f, W


def _parameter_between(w):
    # The Parameter itself before and after its update, and a .data read after it.
    W = tj.Parameter(w)

    def f(x):
        h = F.tanh(x * W)
        W.data *= 0.9
        return h + F.tanh(x * W) * F.sin(W.data * x)
    return f, W


CASES = {"parameter_between": _parameter_between, "capture_between": _capture_between,
         "index_view": _index_view,
         "update_after_both": _update_after_both}


def _run(f, W, x0, step):
    x = tj.Variable(x0.copy())
    W.cleargrad()
    y = f(x)
    if step:
        W.data -= 0.05          # the caller's update between the call and its backward
    F.sum(y * 0.7).backward(create_graph=True)
    gx, gw = x.grad, W.grad
    x.cleargrad()
    W.cleargrad()
    loss = F.sum(gx * gx)
    if gw is not None:
        loss = loss + F.sum(gw * gx)          # a second order through W too
    loss.backward()
    grads = [gx, gw, x.grad, W.grad]
    return [None if g is None else g.data.copy() for g in grads] + [W.data.copy()]


NAMES = ("first order x", "first order W", "second order x", "second order W", "W")


def _compare(make, dtype, two_d, jit_of=tj.jit, step=False):
    rng = np.random.RandomState(1)
    w0 = (rng.randn(2, 2) if two_d else np.array(-0.7)).astype(dtype)
    fe, We = make(w0.copy())[:2]
    fj, Wj = make(w0.copy())[:2]
    fj = jit_of(fj)
    tol = (dict(rtol=1e-10, atol=1e-12) if dtype == np.float64
           else dict(rtol=2e-4, atol=1e-5))
    for call in range(5):
        x0 = (rng.rand(2, 2) + 0.2 if two_d else np.array(0.8 + 0.1 * call)).astype(dtype)
        want = _run(fe, We, x0, step)
        got = _run(fj, Wj, x0, step)
        for what, a, b in zip(NAMES, got, want):
            assert (a is None) == (b is None), (call, what)
            if a is None:
                continue
            assert a.dtype == b.dtype, (call, what)
            np.testing.assert_allclose(a, b, err_msg=f"call {call}: {what}", **tol)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("name", sorted(CASES))
def test_second_order_matches_eager(name, dtype):
    _compare(CASES[name], dtype, name == "index_view")


@pytest.mark.parametrize("name", ["capture_between", "parameter_between"])
def test_caller_updates_before_the_backward(name):
    # Eager's backward reads the buffer with the caller's update too; the values the
    # forward computed stay the forward's.
    _compare(CASES[name], np.float64, False, step=True)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_parameter_argument(dtype):
    def make(w):
        g, W, f = _argument_between(w)
        return g, W, f
    rng = np.random.RandomState(2)
    fe, We, _ = make(np.array(-0.7, dtype))
    _, Wj, f = make(np.array(-0.7, dtype))
    fj = tj.jit(f)
    tol = dict(rtol=1e-10) if dtype == np.float64 else dict(rtol=2e-4, atol=1e-5)
    for call in range(5):
        x0 = np.array(0.8 + 0.1 * call + 0.01 * rng.rand(), dtype)
        want = _run(fe, We, x0, False)
        got = _run(lambda x: fj(x, Wj), Wj, x0, False)
        for what, a, b in zip(NAMES, got, want):
            assert (a is None) == (b is None), (call, what)
            if a is None:
                continue
            assert a.dtype == b.dtype, (call, what)
            np.testing.assert_allclose(a, b, err_msg=f"call {call}: {what}", **tol)


@pytest.mark.parametrize("make", [_transpose_view, _transpose_between])
def test_transpose_view_runs_eagerly(make, recwarn):
    # Not compiled (a JitWarning names the update), and eager's answer.
    _compare(make, np.float64, True)
    assert any("in-place update" in str(w.message) for w in recwarn.list
               if issubclass(w.category, tj.JitWarning))


def _made_leaf_of_a_value_before_the_update(x):
    c = tj.Variable(x)                   # the argument's buffer itself
    h = x * c
    x += 0.5                             # in place: c.data changes, h does not
    d = tj.Variable(h.data)              # h's array: eager's h and d share it
    return h * d + F.sin(d), d


def test_a_made_leaf_of_a_value_computed_before_the_update():
    # The replay recomputed h from the updated buffer (x + 0.5)**2, where eager's h
    # (d's array) is x**2: d.grad silently wrong from the first compiled call on.
    jf = tj.jit(_made_leaf_of_a_value_before_the_update)
    for call in range(6):
        base = np.linspace(-1.0, 1.0, 3) * (1 + 0.25 * call) + 0.1 * call
        seen = []
        for fn in (_made_leaf_of_a_value_before_the_update, jf):
            x = base.copy()
            y, d = fn(x)
            F.sum(y * np.array([1.0, -2.0, 0.5])).backward(create_graph=True)
            first = d.grad.data.copy()
            F.sum(d.grad ** 2).backward()        # second order through the replay
            seen.append((y.data.copy(), first, d.grad.data.copy(), x.copy()))
        for got, want in zip(seen[1], seen[0]):
            np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    info = jf.cache_info()
    assert info["fallbacks"] == 0 and info["hits"] >= 4, info
