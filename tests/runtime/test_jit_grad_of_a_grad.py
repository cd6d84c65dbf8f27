"""A .grad that a later backward in the call gives a .grad of its own (x.grad.grad).

`F.reshape(x, s).backward()` sets x.grad, a Variable with no creator: a leaf, so a
later `F.sum(x.grad * W).backward()` sets x.grad.grad, as eager does. Compiled calls
set both levels: the grad effect's .grad and, on that object, the .grad the later
backward gave it (trace.call._nested_grads), also when x.grad is returned as itself
(a seed passed through: `y = W + 0.5; y.backward(retain_grad=True)` gives W.grad =
y.grad) and when the caller's backward goes on through x.grad (a leaf of the compiled
call's graph: it adds to x.grad.grad). Where compiled calls cannot set it as eager
does (x.grad.grad with a history, or with a .grad of its own) the call runs eagerly,
warned with that cause at the backward's line.
"""
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tracejit as tj
import tracejit.functions as F
from tracejit.testing import assert_jit_matches_eager

W = tj.Parameter(np.random.default_rng(1).standard_normal(4))
V = tj.Parameter(np.random.default_rng(2).standard_normal(4))


def nested(x):
    x.cleargrad()
    F.reshape(x, x.shape).backward()
    g = x.grad
    F.sum(g * W).backward()               # sets g.grad: x.grad.grad
    return F.tanh(g * x) * 2.0            # g, a leaf, read by the result


def seed_through(x):
    V.cleargrad()
    y = (V + 0.5) - 0.25
    y.backward(retain_grad=True)          # V.grad is y.grad, the seed
    h = y.grad
    F.mean(F.tanh(h * W) ** 2).backward()  # sets h.grad: V.grad.grad
    return -h * x, V.grad


def returned_arg_grad(x):
    x.cleargrad()
    y = x - 0.25
    y.backward(retain_grad=True)          # x.grad is y.grad, the seed
    F.sum(F.sin(x.grad * W)).backward()
    return x.grad, x * 3.0


def shared_seed(x):
    W.cleargrad()
    V.cleargrad()
    (W + V).backward()                     # W.grad is V.grad, the seed
    F.sum(F.sin(W.grad * x)).backward()    # sets the shared .grad's .grad
    return x * 2.0


def _grad_levels(v):
    g = v.grad
    return (None if g is None else g.data.copy(),
            None if g is None or g.grad is None else g.grad.data.copy())


def _same(a, b):
    assert (a is None) == (b is None), (a, b)
    if a is not None:
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)


def _leaves(out):
    return out if isinstance(out, tuple) else (out,)


def _run(fn, xs, backward):
    """jit beside eager on each x (W mutated before every call): the results, x's and
    the Parameters' .grad and .grad.grad after the call, and after the caller's backward
    (from every result) when `backward`."""
    jf = tj.jit(fn)
    for i, x in enumerate(xs):
        W.data = W.data + 0.25
        sides = []
        for f in (fn, jf):
            W.cleargrad()
            V.cleargrad()
            xv = tj.Variable(x.copy())
            out = _leaves(f(xv))
            seen = [[o.data.copy() for o in out],
                    [_grad_levels(v) for v in (xv, W, V)]]
            seen.append([o is xv.grad for o in out] + [o is V.grad for o in out] +
                        [W.grad is V.grad])
            if backward:
                sum(F.sum(o * (k + 1.5)) for k, o in enumerate(out)).backward()
                seen.append([_grad_levels(v) for v in (xv, W, V)])
            sides.append(seen)
        (e_out, e_g, e_id, *e_b), (j_out, j_g, j_id, *j_b) = sides
        assert e_id == j_id, (i, e_id, j_id)
        for a, b in zip(e_out, j_out):
            _same(a, b)
        for e, j in zip(e_g + sum(e_b, []), j_g + sum(j_b, [])):
            _same(e[0], j[0])
            _same(e[1], j[1])
    return jf


@pytest.mark.usefixtures("jit_warnings_are_errors")
@pytest.mark.parametrize("backward", [False, True])
@pytest.mark.parametrize("fn", [nested, seed_through, returned_arg_grad, shared_seed])
def test_a_grad_of_a_grad_compiles_as_eager_sets_it(fn, backward):
    rng = np.random.default_rng(0)
    jf = _run(fn, [rng.standard_normal((2, 4)) for _ in range(5)], backward)
    info = jf.cache_info()
    assert info["fallbacks"] == 0 and info["hits"] >= 3, info


@pytest.mark.usefixtures("jit_warnings_are_errors")
@settings(max_examples=4, deadline=None)
@given(rows=st.integers(1, 3), scale=st.floats(-3.0, 3.0))
def test_a_grad_of_a_grad_over_shapes_and_values(rows, scale):
    rng = np.random.default_rng(rows)
    _run(nested, [scale * rng.standard_normal((rows, 4)) for _ in range(4)], True)


def with_history(x):
    x.cleargrad()
    F.reshape(x, x.shape).backward()
    g = x.grad
    F.sum(g * W).backward(create_graph=True)   # g.grad = W * ones: a history
    return F.tanh(g * x)


def three_levels(x):
    x.cleargrad()
    F.reshape(x, x.shape).backward()
    g = x.grad
    F.reshape(g, g.shape).backward()            # g.grad: a leaf too
    gg = g.grad
    F.sum(gg * W).backward()                    # sets x.grad.grad.grad
    return F.tanh(g * x)


def read_after(x):
    x.cleargrad()
    F.reshape(x, x.shape).backward()
    g = x.grad
    F.sum(g * W).backward()
    return F.tanh(g.grad * x)      # the caller's backward gives x.grad.grad a .grad


@pytest.mark.parametrize("fn, why, line", [
    (with_history, "it has a history", r"F\.sum\(g \* W\)\.backward"),
    (three_levels, "it has a .grad of its own", r"F\.reshape\(g, g\.shape\)"),
    (read_after, "an op reads it", r"F\.sum\(g \* W\)\.backward")])
def test_a_grad_of_a_grad_compiled_calls_cannot_set_runs_eagerly(fn, why, line,
                                                                 record_jit_warnings):
    rng = np.random.default_rng(3)
    jf = tj.jit(fn)
    for _ in range(4):
        W.data = W.data + 0.25
        x = rng.standard_normal((2, 4))
        xe, xj = tj.Variable(x), tj.Variable(x)
        e, j = fn(xe), jf(xj)
        np.testing.assert_array_equal(j.data, e.data)
        assert (xj.grad.grad is None) == (xe.grad.grad is None)
        np.testing.assert_array_equal(xj.grad.grad.data, xe.grad.grad.data)
        gge, ggj = xe.grad.grad, xj.grad.grad
        F.sum(e).backward()
        F.sum(j).backward()
        assert (ggj.grad is None) == (gge.grad is None)
        if gge.grad is not None:
            np.testing.assert_array_equal(ggj.grad.data, gge.grad.data)
    msgs = [str(w.message) for w in record_jit_warnings]
    assert len(msgs) == 1, msgs
    assert re.search(r"sets the \.grad of a \.grad .* cannot set as eager does \(" +
                     re.escape(why) + r".* at test_jit_grad_of_a_grad\.py:\d+  " + line,
                     msgs[0]), msgs
    assert jf.cache_info()["variants"] == 0


def one_level(x):
    x.cleargrad()
    F.sum(x * W).backward()
    return F.tanh(x.grad) * 2.0


@pytest.mark.usefixtures("jit_warnings_are_errors")
def test_one_level_of_grad_still_compiles():
    rng = np.random.default_rng(2)

    def make_args(i):
        W.data = W.data - 0.125 * i
        return (tj.Variable(rng.standard_normal((2, 4))),)
    info = assert_jit_matches_eager(one_level, make_args=make_args, calls=4)
    assert info["fallbacks"] == 0
