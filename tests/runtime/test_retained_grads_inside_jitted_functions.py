"""A backward inside a jitted function with retain_grad=True leaves .grads on the
Variables the function made. Eager's later backward through the call's graph adds into
those .grads (`x.grad = x.grad + gx`) and propagates the sum, so a retained .grad on an
intermediate changes every gradient upstream. Compiled calls give eager's results: a
result's retained .grad (which the caller's backward starts from) and one on an
intermediate that such a backward passes through (held as the call left it: the
caller reaches eager's intermediates through the results' creators, a compiled call's
results have the call as their creator) both compile.
"""
import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F


def _close(a, b):
    if a is None or b is None:
        assert a is None and b is None, (a, b)
        return
    a = a.data if isinstance(a, tj.Variable) else a
    b = b.data if isinstance(b, tj.Variable) else b
    assert a.dtype == b.dtype and a.shape == b.shape
    np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


def _values(n, seed):
    rng = np.random.default_rng(seed)
    return [rng.normal(size=(3,)) for _ in range(n)]


# --- an intermediate's retained .grad, passed through by the caller's backward -------

def f_intermediate(x):
    h = F.sin(x)
    F.sum(h * 2.0).backward(retain_grad=True)      # h.grad stays set
    return F.cos(h)


def f_intermediate_two(x, w):
    h = F.tanh(x * w)
    k = F.exp(h) * w
    F.sum(k * k).backward(retain_grad=True)        # h.grad and k.grad stay set
    return F.sin(k) + h


def _caller_plain(fn, args):
    y = fn(*args)
    F.sum(y * y).backward()
    return y


def _caller_create_graph(fn, args):
    y = fn(*args)
    F.sum(y * y).backward(create_graph=True)
    gx = args[0].grad
    args[0].cleargrad()
    F.sum(gx * gx).backward()
    return y


def _caller_two_backwards(fn, args):
    y = fn(*args)
    F.sum(y).backward()
    F.sum(y * 3.0).backward()
    return y


@pytest.mark.usefixtures("jit_warnings_are_errors")
@pytest.mark.parametrize("caller", [_caller_plain, _caller_create_graph,
                                    _caller_two_backwards])
@pytest.mark.parametrize("fn,n", [(f_intermediate, 1), (f_intermediate_two, 2)])
def test_retained_intermediate_grad_matches_eager(fn, n, caller):
    jf = tj.jit(fn)
    for call, vals in enumerate([_values(n, s) for s in range(5)]):
        ea = [tj.Variable(v.copy()) for v in vals]
        ja = [tj.Variable(v.copy()) for v in vals]
        ey = caller(fn, ea)
        jy = caller(jf, ja)
        _close(ey, jy)
        _close(ey.grad, jy.grad)
        for a, b in zip(ea, ja):
            _close(a.grad, b.grad)
    assert jf.cache_info()["hits"] >= 3


@pytest.mark.usefixtures("jit_warnings_are_errors")
def test_retained_intermediate_is_held_as_the_call_left_it():
    """Eager's caller can reach the intermediate (through the result's creator, as
    DeZero lets it) and change or clear its .grad before the backward; a compiled
    call's result has the call as its creator, whose inputs are the call's own, so
    the intermediate is out of reach and its .grad is the one the call left."""
    def f(x):
        h = F.sin(x)
        F.sum(h * 2.0).backward(retain_grad=True)
        return F.cos(h) * 1.0
    jf = tj.jit(f)
    for call in range(5):
        v = _values(1, call)[0]
        grads = []
        for fn in (f, jf):
            x = tj.Variable(v.copy())
            y = fn(x)
            F.sum(y).backward(retain_grad=True)
            grads.append((y, x.grad))
        (ey, ex), (jy, jx) = grads
        _close(ey, jy)
        _close(ex, jx)
        if call >= 2:
            assert list(jy.creator.inputs) == [x]
    assert jf.cache_info()["hits"] >= 3


# --- a result's retained .grad: compiled, the caller's backward starts from it --------

def f_result(x):
    y = x * 3.0
    F.sum(F.sin(y) * y).backward(retain_grad=True)  # y.grad stays set, y is returned
    return y


def f_seed_returned(x):
    y = x * 3.0
    y.backward(retain_grad=True)                   # y.grad is the seed
    return y.grad, y


@pytest.mark.usefixtures("jit_warnings_are_errors")
@pytest.mark.parametrize("two", [False, True])
def test_result_retained_grad_seeds_the_callers_backward(two):
    jf = tj.jit(f_result)
    for v in _values(1, 3) + _values(1, 4) + _values(1, 5) + _values(1, 6) + _values(1, 8):
        outs = []
        for fn in (f_result, jf):
            x = tj.Variable(v.copy())
            y = fn(x)
            g_inside = y.grad.data.copy()
            x.cleargrad()
            F.sum(F.exp(y)).backward(retain_grad=two)
            if two:
                y.grad = y.grad * 0.5
                F.sum(y).backward()
            outs.append((y, x.grad, y.grad, g_inside))
        (ey, exg, eyg, eg), (jy, jxg, jyg, jg) = outs
        _close(ey, jy)
        _close(exg, jxg)
        _close(eyg, jyg)
        np.testing.assert_allclose(eg, jg)


@pytest.mark.usefixtures("jit_warnings_are_errors")
def test_returned_seed_is_the_results_grad():
    jf = tj.jit(f_seed_returned)
    for k in range(5):
        for fn in (f_seed_returned, jf):
            x = tj.Variable(np.full((2, 2), float(k + 1)))
            g, y = fn(x)
            assert g is y.grad
            assert np.shares_memory(g.data, y.grad.data)
            np.testing.assert_array_equal(g.data, np.ones((2, 2)))
            np.testing.assert_array_equal(x.grad.data, np.full((2, 2), 3.0))
            F.sum(y * y).backward(retain_grad=True)
            # The caller's backward starts from the retained seed and adds to it (a
            # new .grad object: DeZero's `y.grad + gy`); the returned seed is unchanged.
            np.testing.assert_allclose(y.grad.data, 1.0 + 2.0 * y.data)
            np.testing.assert_array_equal(g.data, np.ones((2, 2)))
            np.testing.assert_allclose(x.grad.data, 3.0 + 3.0 * (1.0 + 2.0 * y.data))
    assert jf.cache_info()["hits"] >= 2
