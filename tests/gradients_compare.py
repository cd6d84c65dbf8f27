"""Gradients of a jitted call against eager's, first and second order, None-ness included."""
import numpy as np

import tracejit as tj
import tracejit.functions as F


def _grads(variables):
    return [None if v.grad is None else v.grad.data.copy() for v in variables]


def _assert_same(got, want, what, rtol):
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert (g is None) == (w is None), f"{what}[{i}]: jit {g}, eager {w}"
        if w is not None:
            assert g.dtype == w.dtype and g.shape == w.shape, (what, i, g.dtype, w.dtype)
            np.testing.assert_allclose(g, w, rtol=rtol, atol=rtol, err_msg=f"{what}[{i}]")


def run_once(fn, arrays, params=(), create_graph=True):
    """Call fn on fresh Variables, backward (create_graph), then the backward of the sum
    of squares of the first-order gradients: (value, first-order, second-order grads)."""
    xs = [tj.Variable(a.copy()) for a in arrays]
    for p in params:
        p.cleargrad()
    y = fn(*xs)
    y.backward(create_graph=create_graph)
    leaves = xs + list(params)
    g1 = _grads(leaves)
    g2 = None
    if create_graph:
        gs = [v.grad for v in leaves]
        for v in leaves:
            v.cleargrad()
        total = None
        for g in gs:
            if g is not None and g.dtype.kind == "f":
                t = F.sum(g * g)
                total = t if total is None else total + t
        if total is not None:
            total.backward()
        g2 = _grads(leaves)
    return y.data.copy(), g1, g2


def assert_matches_eager(f, make_arrays, calls=4, params=(), create_graph=True, rtol=1e-9):
    """Call f and jit(f) `calls` times on new values from make_arrays(i), from the same
    Parameter state, and compare values and gradients (first and second order)."""
    jf = tj.jit(f)
    for i in range(calls):
        arrays = make_arrays(i)
        start = [p.data.copy() for p in params]
        results = []
        for fn in (f, jf):
            for p, d in zip(params, start):
                p.data = d.copy()
            results.append(run_once(fn, arrays, params, create_graph) +
                           ([p.data.copy() for p in params],))
        (ve, g1e, g2e, pe), (vj, g1j, g2j, pj) = results
        np.testing.assert_allclose(vj, ve, rtol=rtol, atol=rtol)
        _assert_same(g1j, g1e, f"call {i} first-order grad", rtol)
        if create_graph:
            _assert_same(g2j, g2e, f"call {i} second-order grad", rtol)
        _assert_same(pj, pe, f"call {i} parameter", rtol)
    return jf
