"""unchain_backward() through the outputs of compiled calls cuts what eager's cuts.

Eager's walk unchains every Variable that is an input of a Function it reaches: inside a
compiled call too, so a result of the call that the call itself uses (`return loss, h`
where loss comes from h) loses its creator as eager's does, and a backward through it
later (truncated BPTT: the state h carried into the next window) reaches nothing of the
call. A call reached only through some of its outputs keeps the others chained, and
where those come from Variables eager cut, a backward from them stops where eager's
does. Each test runs the same program eagerly and jitted, the state and parameters
updated between calls, and compares gradients (None where eager gives None).
"""
import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")


def _grad(p):
    return None if p.grad is None else p.grad.data.copy()


def _same_grads(a, b):
    assert (a is None) == (b is None), (a, b)
    if a is not None:
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)


def _bptt(jit, windows=5, steps=3):
    """State passed through the call and returned; loss summed over a window, backward,
    unchain_backward, an update: the carried h must not reach the previous window."""
    np.random.seed(0)
    W = tj.Parameter(np.random.randn(3, 3) * 0.5)

    def step(x, h):
        h = F.tanh(F.matmul(h, W) + x)
        return F.sum(h), h
    if jit:
        step = tj.jit(step)
    h = tj.Variable(np.zeros((2, 3)))
    out = []
    for w in range(windows):
        loss = 0
        for i in range(steps):
            lo, h = step(np.full((2, 3), 0.1 * (w + i)), h)
            loss += lo
        W.cleargrad()
        loss.backward()
        loss.unchain_backward()
        out.append((float(loss.data), _grad(W), h.creator is None))
        W.data -= 0.1 * W.grad.data
    return out, (step.cache_info() if jit else None)


def test_carried_state_is_cut_like_eager():
    eager, _ = _bptt(False)
    got, info = _bptt(True)
    assert info["hits"] >= 10 and info["fallbacks"] == 0, info
    for (le, ge, ce), (lj, gj, cj) in zip(eager, got):
        np.testing.assert_allclose(lj, le, rtol=1e-12)
        _same_grads(gj, ge)
        assert ce and cj          # the carried state has no creator after the cut


def _two_results(kind):
    W = tj.Parameter(np.random.randn(3, 3))
    V = tj.Parameter(np.random.randn(3, 3))

    def f(x):
        h = F.matmul(x, W)
        if kind == "returned":          # h itself returned: loss comes from it
            return F.sum(F.tanh(h)), h
        if kind == "shared":            # b comes from h, which a's cut cuts
            return F.sum(F.tanh(h)), F.sum(h * 2.0)
        return F.sum(F.tanh(h)), F.sum(F.matmul(x, V))   # independent
    return f, W, V


@pytest.mark.parametrize("kind", ["returned", "shared", "independent"])
def test_call_reached_through_one_result(kind):
    """`a, b = f(x)`; a cut reaching the call through a (`(a * 1).unchain_backward()`);
    then `b.backward()`: the gradients eager's graph, cut so, gives."""
    np.random.seed(1)
    f, W, V = _two_results(kind)
    jf = tj.jit(f)
    for i in range(5):
        x = np.random.randn(2, 3)
        got = []
        for fn in (f, jf):
            W.cleargrad()
            V.cleargrad()
            a, b = fn(x)
            (a * 1.0).unchain_backward()
            assert a.creator is None
            b.backward()
            got.append((_grad(W), _grad(V), b.creator is None))
        (we, ve, ce), (wj, vj, cj) = got
        _same_grads(wj, we)
        _same_grads(vj, ve)
        assert ce == cj
        W.data += 0.1         # the captured Parameters change between calls
        V.data -= 0.1
    assert jf.cache_info()["hits"] >= 3


def test_root_result_used_inside_the_call():
    """unchain_backward on a call's own result: the results it comes from are unchained
    (the call's eager graph takes its place, holding them)."""
    np.random.seed(2)
    W = tj.Parameter(np.random.randn(3, 3))

    def f(x):
        h = F.matmul(x, W)
        return F.sum(F.tanh(h)), h
    jf = tj.jit(f)
    for i in range(5):
        x = np.random.randn(2, 3)
        got = []
        for fn in (f, jf):
            W.cleargrad()
            y, h = fn(x)
            y.unchain_backward()
            h.backward()
            y.backward()
            got.append((_grad(W), h.creator is None, y.creator is None))
        assert got[0][1:] == got[1][1:]
        _same_grads(got[1][0], got[0][0])
        W.data *= 1.1
    assert jf.cache_info()["hits"] >= 3


def test_calls_that_draw_random_numbers_cut_without_a_replay():
    """A cut that unchains every result of a call needs no replay of it: a call that
    draws (dropout) is cut too, its draws untouched."""
    def run(jit):
        np.random.seed(3)
        W = tj.Parameter(np.random.randn(3, 3) * 0.5)

        def step(x, h):
            h = F.dropout(F.tanh(F.matmul(h, W) + x), 0.3)
            return F.sum(h), h
        if jit:
            step = tj.jit(step)
        h = tj.Variable(np.zeros((2, 3)))
        out = []
        for w in range(5):
            np.random.seed(100 + w)
            loss = 0
            for i in range(3):
                lo, h = step(np.full((2, 3), 0.1 * (w + i)), h)
                loss += lo
            W.cleargrad()
            loss.backward()
            loss.unchain_backward()
            out.append((float(loss.data), _grad(W), h.creator is None))
            W.data -= 0.1 * W.grad.data
        return out
    for (le, ge, ce), (lj, gj, cj) in zip(run(False), run(True)):
        np.testing.assert_allclose(lj, le, rtol=1e-12)
        _same_grads(gj, ge)
        assert ce and cj
