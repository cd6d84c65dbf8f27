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
