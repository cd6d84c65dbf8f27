"""No reference cycles: after backward (also create_graph=True, also twice) and `del` of
the outputs, with the inputs' grads cleared, reference counting alone frees the whole
graph (every Function, every intermediate Variable, every gradient), eager and jit.
gc is disabled while each case runs, so a cycle shows as a live weak reference."""
import gc
import weakref

import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F
from tracejit import Parameter, Variable

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")


@pytest.fixture
def no_gc():
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _graph_refs(*roots):
    """Weak references to every Function and Variable reachable from roots (creators,
    their inputs, and gradients with their own graphs)."""
    refs, seen = [], set()
    stack = list(roots)
    while stack:
        o = stack.pop()
        if o is None or id(o) in seen:
            continue
        seen.add(id(o))
        refs.append(weakref.ref(o))
        if isinstance(o, Variable):
            stack.append(o.creator)
            stack.append(o._grad)
        else:
            stack.extend(getattr(o, "inputs", None) or [])
            stack.extend(r() for r in getattr(o, "outputs", None) or [])
    return refs


def mlp(x, W, b, c):
    h = F.tanh(F.matmul(x, W) + b) * 2.0
    return F.sum(h ** 2) + F.sum(F.sin(x) * c) + 1.0


def _case(fn, order, rng):
    x = Variable(rng.standard_normal((4, 3)))
    W = Parameter(rng.standard_normal((3, 2)))
    b = Parameter(rng.standard_normal(2))
    c = rng.standard_normal((4, 3))                # a plain ndarray operand
    leaves = (x, W, b)
    y = fn(x, W, b, c)
    y.backward(create_graph=order > 0)
    if order > 1:
        gx = x.grad
        for v in leaves:
            v.cleargrad()
        z = F.sum(gx ** 2)
        del gx
        z.backward(create_graph=True)
        refs = _graph_refs(y, z) + _graph_refs(*[v.grad for v in leaves])
        del z
    else:
        refs = _graph_refs(y) + _graph_refs(*[v.grad for v in leaves])
    values = [v.data.copy() for v in leaves]
    del y
    for v in leaves:
        v.cleargrad()
    leaf_ids = {id(v) for v in leaves}
    alive = [type(r()).__name__ for r in refs if r() is not None and id(r()) not in leaf_ids]
    return alive, values


@pytest.mark.parametrize("order", [0, 1, 2], ids=["backward", "create_graph", "twice"])
def test_eager_graph_is_freed_by_refcounting(no_gc, order):
    rng = np.random.default_rng(order)
    for _ in range(3):
        alive, _ = _case(mlp, order, rng)
        assert alive == [], alive


@pytest.mark.parametrize("order", [0, 1, 2], ids=["backward", "create_graph", "twice"])
def test_jit_graph_is_freed_by_refcounting(no_gc, order):
    jf = tj.jit(mlp)
    rng = np.random.default_rng(10 + order)
    for k in range(5):      # warm-up, trace, checked call, compiled calls
        alive, _ = _case(jf, order, rng)
        assert alive == [], (k, alive)
    info = jf.cache_info()
    assert info["fallbacks"] == 0 and info["hits"] >= 2


def test_jit_results_match_eager_while_freed(no_gc):
    jf = tj.jit(mlp)
    for k in range(4):
        rng_j, rng_e = np.random.default_rng(k), np.random.default_rng(k)
        x = Variable(rng_j.standard_normal((4, 3)))
        xe = Variable(x.data.copy())
        W = Parameter(rng_e.standard_normal((3, 2)))
        b = Parameter(rng_e.standard_normal(2))
        c = rng_e.standard_normal((4, 3))
        yj, ye = jf(x, W, b, c), mlp(xe, W, b, c)
        np.testing.assert_allclose(yj.data, ye.data, rtol=1e-12)
        yj.backward(create_graph=True)
        gj = x.grad.data.copy()
        W.cleargrad()
        b.cleargrad()
        ye.backward(create_graph=True)
        np.testing.assert_allclose(gj, xe.grad.data, rtol=1e-12)
        probe = weakref.ref(yj.creator)
        del yj, ye
        x.cleargrad()
        xe.cleargrad()
        W.cleargrad()
        b.cleargrad()
        assert probe() is None


def test_a_trace_does_not_outlive_its_call(no_gc):
    # The traced call's own graph (Variables the function made while recording) must
    # not be kept by the Trace through a cycle.
    jf = tj.jit(lambda x: F.sum(F.exp(x) * 3.0))
    probes = []
    for k in range(3):
        x = Variable(np.linspace(0, 1, 5) + k)
        y = jf(x)
        probes.append(weakref.ref(y.creator) if y.creator is not None else None)
        y.backward()
        del y
        x.cleargrad()
    assert all(p is None or p() is None for p in probes)
