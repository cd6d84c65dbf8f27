"""A compiled call with nothing differentiable from outside (ndarray and float
arguments, captured arrays, a captured Parameter read through .data or under no_grad)
whose results are computed from one another (`return h * 2.0, h`): eager's walk from
one result passes the other, an intermediate of its graph. So the caller's backward
with retain_grad leaves on it the cotangent through it, a .grad the caller set on it
is read (added to, then cleared without retain_grad), and with create_graph those
.grads have history. The compiled call gives every result eager's .grad, first and
second order; a result the walk does not reach keeps the .grad the caller set."""
import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")

W = np.linspace(0.5, 1.5, 4)                     # captured array, updated between calls
P = tj.Parameter(np.linspace(-1.0, 1.0, 4))      # captured, never differentiated


def direct(x):
    h = F.sin(x)
    return h * 2.0, h


def chain(x):
    # Three results, each upstream of the next; a captured array in the middle.
    a = F.sin(x) * 3.0 + W
    b = F.tanh(a) * a
    return F.sum(b * b), b, a


def parameter_data(x, s):
    # P's data is a constant of eager's graph: P gets no gradient, as nothing else.
    h = F.exp(x * s) * P.data
    return {"y": F.sum(h[1:] ** 2), "h": h}


def parameter_under_no_grad(x):
    with tj.no_grad():
        c = P * 2.0
    h = F.tanh(x) * c
    return [h, F.sum(h * h * c)]


def side_by_side(x):
    # Neither result feeds the other: the walk from one leaves the other's .grad.
    return F.sum(F.sin(x) * 2.0), F.cos(x)


FUNCS = [direct, chain, parameter_data, parameter_under_no_grad, side_by_side]


def call(g, fn, k):
    """g (fn or its jit) called on new values: (the result the walk starts from, the
    others)."""
    x = np.linspace(-1.0, 1.0, 4) + 0.3 * k
    out = g(x, 0.5 + 0.1 * k) if fn is parameter_data else g(x)
    rs = list(out.values()) if isinstance(out, dict) else list(out)
    root = next((r for r in rs if r.ndim == 0), rs[0])
    return root, [r for r in rs if r is not root]


def retain(root, others, create):
    root.backward(retain_grad=True, create_graph=create)


def plain(root, others, create):
    root.backward(create_graph=create)


def preset_retain(root, others, create):
    for r in others:
        r.grad = tj.Variable(np.full(r.shape, 0.25))
    root.backward(retain_grad=True, create_graph=create)


def preset(root, others, create):
    for r in others:
        r.grad = tj.Variable(np.full(r.shape, 0.25))
    root.backward(create_graph=create)


MODES = [retain, plain, preset_retain, preset]


def grads(root, others, create):
    rs = [root] + others
    got = [None if r.grad is None else r.grad.data.copy() for r in rs]
    if create:
        # Second order through the results' .grads that have history: it reaches the
        # seed the walk gave the root.
        hist = [r.grad for r in rs if r.grad is not None and r.grad.creator is not None]
        seed = root.grad
        if hist:
            sum(F.sum(g * g) for g in hist).backward()
        got += [len(hist), None if seed is None or seed.grad is None else seed.grad.data]
    return got


@pytest.mark.parametrize("create", [False, True], ids=["first", "create_graph"])
@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.__name__)
@pytest.mark.parametrize("fn", FUNCS, ids=lambda f: f.__name__)
def test_results_get_eagers_grads_with_no_differentiable_input(fn, mode, create):
    jf = tj.jit(fn)
    for k in range(5):
        runs = []
        for g in (fn, jf):
            root, others = call(g, fn, k)
            mode(root, others, create)
            runs.append(grads(root, others, create))
        for j, (e, c) in enumerate(zip(*runs)):
            assert (e is None) == (c is None), (k, j, e, c)
            if e is not None:
                np.testing.assert_allclose(c, e, rtol=1e-12, atol=1e-12,
                                           err_msg=f"call {k}, entry {j}")
        W[:] += 0.1
        P.data *= 1.1
