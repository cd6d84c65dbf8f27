"""A .grad the call sets that its backward's walk into the caller's graph may or may not
add to, depending on the caller's graph at call time.

`x.grad` set inside f (`y.backward()` seeds it), then a backward from a value computed
from `x.grad` and an argument `u`: where u's creator graph reaches x, eager's walk adds to
x.grad (a new Variable: the one the call made is nobody's .grad after the call); where
it does not, x.grad stays the call's Variable, and a later backward through the call's
result adds to its .grad. A variant traced with the walk reaching x must not serve a
call whose walk does not (it linked no gradient to that Variable): it holds while the
walk reaches x, and a call where it does not is traced again. Each sequence mixes the
two kinds of caller graph over >= 5 calls, comparing with eager after the call and
after the caller's backward; no call falls back.
"""
import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")


def _f(retain):
    def f(x, u):
        x.cleargrad()
        F.reshape(x, x.shape).backward()
        g = x.grad
        loss = F.mean(F.tanh(g * u))
        loss.backward(retain_grad=retain)
        return loss
    return f


def _val(v):
    return None if v is None else np.array(v.data)


def _run(fn, call, reaches, shape):
    rng = np.random.default_rng(872 + call)
    x = tj.Variable(rng.uniform(-2, 2, shape))
    u = F.sin(x if reaches else tj.Variable(x.data * 0.75)) * 2.0
    loss = fn(x, u)
    after_call = [_val(loss), _val(x.grad), _val(x.grad.grad)]
    loss.backward()
    return after_call + [_val(x.grad), _val(x.grad.grad)]


@pytest.mark.parametrize("retain", [False, True])
@pytest.mark.parametrize("pattern", ["0110110", "1101", "0011100"])
@pytest.mark.parametrize("shape", [(1,), (3,)])
def test_grad_the_call_set_matches_eager_whether_the_walk_reaches_it(retain, pattern, shape):
    f = _f(retain)
    jf = tj.jit(f)
    for call, c in enumerate(pattern):
        want = _run(f, call, c == "1", shape)
        got = _run(jf, call, c == "1", shape)
        for k, (e, j) in enumerate(zip(want, got)):
            assert (e is None) == (j is None), (call, k, e, j)
            if e is not None:
                np.testing.assert_allclose(j, e, rtol=1e-12, atol=1e-14,
                                           err_msg=f"call {call} ({c}), entry {k}")
    assert jf.cache_info()["fallbacks"] == 0


def _f_returning_the_grad(x, x2, u):
    h = F.exp(x2)
    x.cleargrad()
    F.sum(F.tanh(x) * x).backward()
    g = x.grad
    F.mean(F.tanh(h * u)).backward()
    return g


@pytest.mark.parametrize("pattern", ["11111", "01101", "10010"])
def test_returned_grad_the_walk_adds_to_stays_the_result(pattern):
    """`g = x.grad; <a backward reaching x through u>; return g`: eager's walk makes
    x.grad a new Variable g + gx and returns g itself; compiled calls set x.grad to the
    result only where no walk replaced it (they gave x.grad g, losing gx: 1.16 for
    1.01)."""
    jf = tj.jit(_f_returning_the_grad)

    def run(fn, call, reaches):
        rng = np.random.default_rng(2156 + call)
        x = tj.Variable(rng.uniform(-0.5, 0.5, (2,)) - 1.0)
        x2 = rng.uniform(-2.0, 2.0, (2,)).astype(np.float32)
        u = F.tanh((x if reaches else tj.Variable(x.data * 0.5)) * 0.5)
        g = fn(x, x2, u)
        return [g.data.copy(), x.grad.data.copy()], g is x.grad

    for call, c in enumerate(pattern):
        want, want_same = run(_f_returning_the_grad, call, c == "1")
        got, got_same = run(jf, call, c == "1")
        assert got_same == want_same, (call, c)
        for k, (e, j) in enumerate(zip(want, got)):
            # (exp of float32 data: float32's rounding, which the kernels' exp and
            # NumPy's round apart by an ulp.)
            np.testing.assert_allclose(j, e, rtol=1e-6, atol=1e-9,
                                       err_msg=f"call {call} ({c}), entry {k}")
    assert jf.cache_info()["fallbacks"] == 0
