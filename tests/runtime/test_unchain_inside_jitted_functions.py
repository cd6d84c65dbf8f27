"""unchain_backward() (and unchain()) called inside a jitted function cuts what eager's does.

Eager's walk from the Variable unchained goes on through the arguments and captured
Variables it reaches into the caller's graph: every compiled call cuts the caller's
Variables the same way (their creators None, so a backward outside afterwards stops
where eager's stops). Inside the call, the Variables it cut are leaves for the compiled
backward and for a create_graph replay alike. Each program runs eagerly and jitted on
the same caller graph (x -> m = x * W0 -> h = tanh(m) -> the call), at least 4 calls
with new values and the captured Parameters changed, comparing the caller's creators,
first- and second-order gradients (None where eager gives None).
"""
import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")


def _grad(p):
    return None if p.grad is None else p.grad.data.copy()


def _same(a, b):
    assert (a is None) == (b is None), (a, b)
    if a is not None:
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


W = tj.Parameter(np.random.RandomState(0).randn(3))
V = tj.Parameter(np.random.RandomState(1).randn(3))


def reproducer_1(h, g):
    y = F.sum(F.tanh(h) * 2.0)
    y.unchain_backward()
    return y


def reproducer_2(h, g):
    a = h * 2.0
    F.tanh(a).unchain_backward()
    return F.sum(F.sin(a) * W)


def argument_itself(h, g):
    h.unchain_backward()            # h keeps its creator; m (and x's part) cut
    return F.sum(F.sin(h) * W)


def argument_unchain(h, g):
    h.unchain()
    return F.sum(F.sin(h) * W) + F.sum(g * V)


def two_arguments(h, g):
    c = h * g
    F.cos(c).unchain_backward()     # c, h, g and everything before them cut
    return F.sum(F.sin(c) * W) + F.sum(g * V)


def one_of_two(h, g):
    c = h * W
    F.exp(c).unchain_backward()     # h cut, g untouched
    return F.sum(F.sin(c) * g)


def in_a_loop(h, g):
    s = 0
    for i in range(3):
        h = F.tanh(h * W + g)
        s = s + F.sum(h)
        if i == 1:
            h.unchain_backward()
    return s


def cut_then_backward(h, g):
    a = h * W
    F.sin(a).unchain_backward()     # h cut: the backward below stops at it, as eager's
    loss = F.sum(a * a)             # (not g: eager's backward would go on into its graph)
    loss.backward()
    return loss + F.sum(g * 2.0)


def after_the_cut_only(h, g):
    y = F.sum(h * W)                # y's graph keeps h; the cut is of a later value
    F.sin(g).unchain_backward()
    return y + F.sum(F.sin(g) * V)


PROGRAMS = [reproducer_1, reproducer_2, argument_itself, argument_unchain, two_arguments,
            one_of_two, in_a_loop, cut_then_backward, after_the_cut_only]


def _run(fn, seed, create_graph):
    rs = np.random.RandomState(seed)
    W0 = tj.Parameter(rs.randn(3))
    x = tj.Variable(rs.randn(3))
    xg = tj.Variable(rs.randn(3))
    m = x * W0
    h = F.tanh(m)
    g = F.sin(xg * W0)
    for p in (W, V, W0, x, xg):
        p.cleargrad()
    out = fn(h, g)
    creators = tuple(v.creator is None for v in (m, h, g))
    # A backward outside the call, through the call and the caller's graph.
    loss = out * 1.0 + F.sum(h * h) + F.sum(g)
    loss.backward(create_graph=create_graph)
    first = [_grad(p) for p in (W, V, W0, x, xg)]
    second = None
    if create_graph:
        gs = [p.grad for p in (W, V, W0, x, xg) if p.grad is not None]
        for p in (W, V, W0, x, xg):
            p.cleargrad()
        total = sum(F.sum(gv * gv) for gv in gs)
        if isinstance(total, tj.Variable) and total.creator is not None:
            total.backward()
        second = [_grad(p) for p in (W, V, W0, x, xg)]
    return float(out.data), creators, first, second


@pytest.mark.parametrize("create_graph", [False, True], ids=["first", "create_graph"])
@pytest.mark.parametrize("fn", PROGRAMS, ids=lambda f: f.__name__)
def test_compiled_calls_cut_what_eager_cuts(fn, create_graph):
    jf = tj.jit(fn)
    for i in range(5):
        e = _run(fn, i, create_graph)
        j = _run(jf, i, create_graph)
        np.testing.assert_allclose(j[0], e[0], rtol=1e-12)
        assert j[1] == e[1], (i, "creators None (m, h, g)", e[1], j[1])
        for a, b in zip(j[2], e[2]):
            _same(a, b)
        if create_graph:
            for a, b in zip(j[3], e[3]):
                _same(a, b)
        W.data = W.data * 1.1 + 0.05        # captured Parameters change between calls
        V.data = V.data - 0.1
    info = jf.cache_info()
    assert info["hits"] >= 2 and info["fallbacks"] == 0, info


def test_a_backward_inside_then_a_cut():
    """backward inside the function, then unchain_backward reaching the argument: with
    a leaf argument the backward stops at it and compiled calls cut after it (nothing to
    cut); with a chained one eager's backward goes on into the caller's graph, and so
    does the compiled call's (after its graph ran, before it repeats the cut), giving x
    eager's gradient and leaving h cut."""
    def f(h):
        y = F.sum(h * W)
        y.backward()
        y.unchain_backward()
        return y
    jf = tj.jit(f)
    for i in range(5):
        got = []
        for fn in (f, jf):
            h = tj.Variable(np.random.RandomState(i).randn(3))
            W.cleargrad()
            fn(h)
            got.append((_grad(h), _grad(W)))
        for a, b in zip(*got):
            _same(a, b)
        W.data = W.data + 0.1
    assert jf.cache_info()["hits"] >= 2
    for i in range(5):
        got = []
        x_data = np.random.RandomState(10 + i).randn(3)
        for fn in (f, jf):
            x = tj.Variable(x_data.copy())
            h = x * 2.0
            W.cleargrad()
            fn(h)
            assert h.creator is None and _grad(x) is not None     # eager's: backward, cut
            got.append((_grad(x), _grad(h), _grad(W)))
        for a, b in zip(*got):
            _same(a, b)
    info = jf.cache_info()
    assert info["fallbacks"] == 0 and info["hits"] >= 4, info
