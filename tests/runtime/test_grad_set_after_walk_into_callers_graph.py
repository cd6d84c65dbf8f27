"""A .grad set after a backward inside a jitted function went on into the caller's graph.

`loss.backward()` inside f goes on past an argument with a creator into the caller's
graph and adds to the .grad of a leaf there (an argument itself, a captured Parameter);
then f clears that .grad (`x.cleargrad()`) and another backward inside it sets it
again, and f returns it. What the walk left is gone: compiled calls set that .grad
right after repeating the walk (Trace._walk_reset, the runner's late grad effects), so
nothing falls back. Each program runs eagerly and jitted on twin worlds, at least 4
calls with new values, comparing results, whether a result is the leaf's .grad object
(as eager's is), every .grad of the caller's graph (None where eager gives None).
"""
import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")


def _arr(v):
    if v is None:
        return None
    return np.asarray(v.data if isinstance(v, tj.Variable) else v)


def _same(a, b, what):
    a, b = _arr(a), _arr(b)
    assert (a is None) == (b is None), (what, a, b)
    if a is not None:
        assert a.dtype == b.dtype, (what, a.dtype, b.dtype)
        np.testing.assert_allclose(b, a, rtol=1e-12, atol=1e-14, err_msg=what)


def _twins(f, make_args, n=5, expect_fallback=False):
    """f eager and jitted on twin caller's graphs make_args(rng) -> (compare: a list of
    Variables, args); the result's first item is compared by value and by whether it
    is args[0].grad itself."""
    jf = tj.jit(f)
    for i in range(n):
        seen = []
        for fn in (f, jf):
            compare, args = make_args(np.random.default_rng(40 + i))
            out = fn(*args)
            seen.append([out[0] is args[0].grad, *out] +
                        [x.grad for x in compare] + [x.data.copy() for x in compare])
        assert seen[0][0] == seen[1][0], (i, "is the .grad object", seen[0][0], seen[1][0])
        for k, (a, b) in enumerate(zip(seen[0][1:], seen[1][1:])):
            _same(a, b, f"call {i}: {k}")
    info = jf.cache_info()
    if not expect_fallback:
        assert info["fallbacks"] == 0 and info["hits"] >= 2, info
    return jf


def test_an_argument_cleared_after_the_walk_and_set_again():
    """x0 is an argument and in the caller's graph behind u0: the walk from u0 adds to
    x0.grad; f clears it, a second backward sets it anew, f returns it: eager's x0.grad
    is that result."""
    def f(x0, u0):
        loss = F.mean(F.tanh(x0 * u0))
        loss.backward()
        x0.cleargrad()
        y = F.sum(x0 * 3.0 + x0 * x0)
        y.backward()
        g = x0.grad
        return g, loss

    def make(rng):
        x0 = tj.Variable(rng.standard_normal(4))
        u0 = F.sin(x0) * 2.0
        return [x0], (x0, u0)
    _twins(f, make)


def test_a_captured_parameter_cleared_after_the_walk():
    """W is captured and used by the caller's graph: the walk adds to W.grad, f clears
    it and sets it from a second loss, updating W from it in place after."""
    W = tj.Parameter(np.array([0.5, -1.0, 2.0]))

    def f(h):
        loss = F.sum(F.sin(h * W))
        loss.backward()
        W.cleargrad()
        loss2 = F.sum(W * W * 0.5)
        loss2.backward()
        W.data -= 0.1 * W.grad.data
        return W.grad, loss

    def make(rng):
        W.data = np.array([0.5, -1.0, 2.0]) + rng.standard_normal(3) * 0.1
        W.cleargrad()
        a = tj.Variable(rng.standard_normal(3))
        h = F.tanh(a * W)
        return [a, W], (h,)

    jf = tj.jit(f)
    for i in range(5):
        seen = []
        for fn in (f, jf):
            compare, (h,) = make(np.random.default_rng(60 + i))
            g, loss = fn(h)
            seen.append([g is W.grad, g, loss, compare[0].grad, W.grad, W.data.copy()])
        assert seen[0][0] == seen[1][0], (i, seen[0][0], seen[1][0])
        for k, (a, b) in enumerate(zip(seen[0][1:], seen[1][1:])):
            _same(a, b, f"call {i}: {k}")
    info = jf.cache_info()
    assert info["fallbacks"] == 0 and info["hits"] >= 2, info


def test_a_later_walk_that_reaches_the_cleared_grad_runs_eagerly(record_jit_warnings):
    """A second backward into the caller's graph after the reset reaches x0 again (its
    .grad, the result, would be replaced): that is refused, warned, and matches eager."""
    def f(x0, u0, u1):
        loss = F.mean(F.tanh(x0 * u0))
        loss.backward()
        x0.cleargrad()
        y = F.sum(x0 * 2.0)
        y.backward()
        g = x0.grad
        loss2 = F.mean(F.tanh(u1 * 1.5))
        loss2.backward()
        return g, loss2

    def make(rng):
        x0 = tj.Variable(rng.standard_normal(3))
        u0 = F.sin(x0) * 2.0
        u1 = F.cos(x0)
        return [x0], (x0, u0, u1)
    _twins(f, make, expect_fallback=True)
    msgs = [str(w.message) for w in record_jit_warnings]
    assert any("a later such backward changes that .grad again" in m for m in msgs), msgs


def test_a_later_walk_reaching_the_cleared_grad_only_at_call_time(record_jit_warnings):
    """When traced, the second walk does not reach x0 (u1 is not built from it), so the
    variant compiles; callers that build u1 from x0 make that walk reach it: those
    calls do not use the variant, and every call matches eager."""
    def f(x0, u0, u1):
        loss = F.mean(F.tanh(x0 * u0))
        loss.backward()
        x0.cleargrad()
        y = F.sum(x0 * 2.0)
        y.backward()
        g = x0.grad
        loss2 = F.mean(F.tanh(u1 * 1.5))
        loss2.backward()
        return g, loss2

    calls = [0]

    def make(rng):
        x0 = tj.Variable(rng.standard_normal(3))
        u0 = F.sin(x0) * 2.0
        calls[0] += 1
        base = x0 if calls[0] > 10 else tj.Variable(rng.standard_normal(3))
        u1 = F.cos(base)
        return [x0], (x0, u0, u1)
    jf = _twins(f, make, n=8, expect_fallback=True)
    assert jf.cache_info()["hits"] >= 2, jf.cache_info()
