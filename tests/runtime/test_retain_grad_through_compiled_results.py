"""A result a compiled call returns that another of its results depends on (`return
loss, h`) is an intermediate of eager's graph: a backward from outside the call with
retain_grad=True leaves on it the whole cotangent through it (plus the caller's own
seed on it), and without retain_grad clears it. The compiled call gives each result
the same .grad as eager, first order and with create_graph (second order through
h.grad), whichever way the results are returned. With create_graph every call's
intermediates keep their gradients as eager's do (a later backward through x.grad's
graph adds to them and passes the sums on), results feeding each other or not."""
import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")


def direct(x):
    h = x * 2.0
    return F.sum(h * h), h


def as_list(x):
    h = F.tanh(x)
    return [F.sum(F.exp(h) * x), h]


def as_dict(x):
    h = x * x + 1.0
    return {"y": F.sum(F.sin(h)), "h": h}


def through_view(x):
    h = F.exp(x * 0.5)
    return F.sum(h[1:] ** 2), h


def chain(x):
    # Three results, each upstream of the next.
    a = x * 3.0
    b = F.tanh(a) * a
    return F.sum(b * b), b, a


def one_result(x):
    # No result feeds another: only create_graph's second order sees the
    # intermediates' retained gradients.
    h = F.tanh(x * x)
    return F.sum(F.exp(h) * x)


def side_by_side(x):
    return F.sum(F.sin(x) * 2.0), F.cos(x * x)


FUNCS = [direct, as_list, as_dict, through_view, chain, one_result, side_by_side]


def results(out):
    if isinstance(out, tj.Variable):
        return [out]
    if isinstance(out, dict):
        return [out["y"], out["h"]]
    return list(out)


def backward_y(rs, create):
    rs[0].backward(retain_grad=True, create_graph=create)


def backward_both_retain(rs, create):
    (rs[0] + sum(F.sum(r) for r in rs[1:])).backward(retain_grad=True, create_graph=create)


def backward_both(rs, create):
    (rs[0] + sum(F.sum(r) for r in rs[1:])).backward(create_graph=create)


def preset_retain(rs, create):
    for r in rs[1:]:
        r.grad = tj.Variable(np.full(r.shape, 0.25))
    rs[0].backward(retain_grad=True, create_graph=create)


def preset(rs, create):
    for r in rs[1:]:
        r.grad = tj.Variable(np.full(r.shape, 0.25))
    rs[0].backward(create_graph=create)


MODES = [backward_y, backward_both_retain, backward_both, preset_retain, preset]


def grads(x, rs, create):
    got = [None if v.grad is None else v.grad.data.copy() for v in [x] + rs]
    if create:
        # Second order through the results' gradients.
        gs = [v.grad for v in [x] + rs]
        x.cleargrad()
        total = None
        for r in [x] + rs:
            g = gs.pop(0)
            if g is not None and g.creator is not None:
                t = F.sum(g * g)
                total = t if total is None else total + t
        if total is not None:
            total.backward()
        got.append(None if x.grad is None else x.grad.data.copy())
    return got


@pytest.mark.parametrize("create", [False, True], ids=["first", "create_graph"])
@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.__name__)
@pytest.mark.parametrize("fn", FUNCS, ids=lambda f: f.__name__)
def test_results_feeding_results_get_eagers_grads(fn, mode, create):
    # (side_by_side with a preset .grad: a result the backward does not reach keeps
    # it, and the compiled backward does not read it, as eager never walks its part.)
    jf = tj.jit(fn)
    rng = np.random.default_rng(0)
    for _ in range(5):
        data = rng.uniform(-1.0, 1.0, 4)
        runs = []
        for g in (fn, jf):
            x = tj.Variable(data.copy())
            rs = results(g(x))
            mode(rs, create)
            runs.append(grads(x, rs, create))
        for k, (e, c) in enumerate(zip(*runs)):
            assert (e is None) == (c is None), (k, e, c)
            if e is not None:
                np.testing.assert_allclose(c, e, rtol=1e-12, atol=1e-12, err_msg=str(k))


def _data(v):
    return None if v is None else v.data.copy()


@pytest.mark.parametrize("returned", ["made_leaf", "intermediate", "nothing_else"])
def test_walks_through_a_call_again_add_to_its_intermediates_as_eager(returned):
    """State carries each call's graph into the next (an RNN's h), and the caller's
    backward with retain_grad=True walks through every earlier call again: eager's
    intermediates keep their .grads and each walk adds to them (DeZero's semantics).
    With a made leaf `c = Variable(h3.data)` returned, h3's Value was also that result's
    slot, so the call did not keep h3's .grad: from the second walk through a compiled
    call W0's gradient fell short of eager's (54.64 for 54.99; fuzz seed 19 program 870,
    silently wrong)."""
    def make():
        S = {"W0": tj.Parameter(np.array([0.5, -0.3])),
             "W1": tj.Parameter(np.array([0.7, 0.2])), "H": None}

        def f(x1):
            h3 = x1 * S["W0"]
            c = tj.Variable(h3.data)
            h10 = h3 * c if returned == "made_leaf" else h3 * h3
            p = S["H"]
            h12 = F.tanh(h10 * 0.5) if p is None else F.tanh(h10 * 0.5 + p * S["W1"])
            S["H"] = h12
            return (h12, c) if returned == "made_leaf" else \
                (h12, h3) if returned == "intermediate" else (h12,)
        return S, f

    runs = []
    for jitted in (False, True):
        S, f = make()
        fn = tj.jit(f) if jitted else f
        got = []
        for call in range(7):
            x = np.array([1.0 + 0.1 * call, -0.5 + 0.2 * call])
            S["W0"].cleargrad()
            r = fn(tj.Variable(x))
            loss = F.sum(r[0]) + (F.sum(r[1] * 2.0) if len(r) > 1 else 0.0)
            loss.backward(retain_grad=True)
            got.append([_data(S["W0"].grad), _data(S["W1"].grad), _data(r[0].grad)] +
                       ([_data(r[1].grad)] if len(r) > 1 else []))
        runs.append((got, fn))
    for call, (e, j) in enumerate(zip(runs[0][0], runs[1][0])):
        for k, (a, b) in enumerate(zip(e, j)):
            assert (a is None) == (b is None), (call, k, a, b)
            if a is not None:
                np.testing.assert_allclose(b, a, rtol=1e-10,
                                           err_msg=f"call {call}, entry {k}")
    info = runs[1][1].cache_info()
    assert info["fallbacks"] == 0 and info["hits"] >= 4, info
