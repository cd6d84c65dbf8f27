"""`h.creator = None` (or h.unchain(), h.unchain_backward()) inside a jitted function,
on a Variable from outside the call (an argument, or a captured Variable, read before
or not), cuts the caller's graph there on every compiled call as eager does: a later
backward from the call's result stops at h (no gradient reaches h's inputs)."""
import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")


def _cut_by_assignment(h):
    h.creator = None
    return F.sum(h * 2.0)


def _cut_by_unchain(h):
    h.unchain()
    return F.sum(h * 2.0)


def _cut_after_use(h):
    y = F.sum(h * h)
    h.creator = None
    return y


@pytest.mark.parametrize("f", [_cut_by_assignment, _cut_by_unchain, _cut_after_use])
def test_an_argument_cut_inside_the_function(f):
    jf = tj.jit(f)
    for k in range(6):
        got = []
        for g in (f, jf):
            x = tj.Variable(np.random.default_rng(k).standard_normal(3))
            h = F.tanh(x)
            y = g(h)
            y.backward()
            got.append((h.creator is None, x.grad, h.grad.data.copy(), float(y.data)))
        (c0, gx0, gh0, y0), (c1, gx1, gh1, y1) = got
        assert c0 == c1 and (gx0 is None) == (gx1 is None), k
        np.testing.assert_allclose(gh1, gh0, rtol=1e-12)
        np.testing.assert_allclose(y1, y0, rtol=1e-12)
    assert jf.cache_info()["hits"] >= 3


@pytest.mark.parametrize("how", ["assign", "unchain"])
@pytest.mark.parametrize("read_first", [False, True])
def test_a_captured_variable_cut_inside_the_function(how, read_first):
    class State:
        pass
    state = State()

    def f(x):
        y = F.sum(x * state.h) if read_first else None
        if how == "assign":
            state.h.creator = None
        else:
            state.h.unchain()
        out = F.sum(x * state.h * 3.0)
        return out if y is None else out + y

    jf = tj.jit(f)
    # (A new state.h each call: threaded from the third call on, then compiled.)
    for k in range(10):
        got = []
        for g in (f, jf):
            # The caller's graph: the state is computed from w (truncated BPTT).
            w = tj.Variable(np.full(3, 0.5 + k))
            state.h = F.tanh(w)
            x = tj.Variable(np.random.default_rng(k).standard_normal(3))
            y = g(x)
            y.backward()
            got.append((state.h.creator is None, w.grad, x.grad.data.copy(),
                        float(y.data)))
        (c0, gw0, gx0, y0), (c1, gw1, gx1, y1) = got
        assert c0 == c1 and (gw0 is None) == (gw1 is None), k
        np.testing.assert_allclose(gx1, gx0, rtol=1e-12)
        np.testing.assert_allclose(y1, y0, rtol=1e-12)
    assert jf.cache_info()["hits"] >= 3


def test_giving_an_argument_another_creator_runs_eagerly(record_jit_warnings):
    def f(h, other):
        h.creator = other.creator
        return F.sum(h * 2.0)
    jf = tj.jit(f)
    for k in range(4):
        for g in (f, jf):
            x = tj.Variable(np.full(3, float(k)))
            h, o = F.tanh(x), F.exp(x)
            g(h, o)
            assert h.creator is o.creator
    assert any("sets .creator" in str(w.message) for w in record_jit_warnings)
