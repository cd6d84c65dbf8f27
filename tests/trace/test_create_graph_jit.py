"""A compiled call differentiates exactly what eager differentiates.

First and second order (backward(create_graph=True), then a backward of the first-order
gradients), None where eager gives None and values where eager gives values, bugs of
eager's included: a no_grad block, Variable(x.data), a `.data` read in a user backward
and softmax's stop-gradient are leaves; int Variables get eager's gradients; a call that
updates its inputs in place still supports create_graph, reading them as eager does.
"""
import numpy as np
import pytest
from hypothesis import given, strategies as st

import tracejit as tj
import tracejit.functions as F
from tracejit.testing import assert_jit_matches_eager

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")

# First and second order, tight: what every comparison with eager here checks.
SECOND_ORDER = dict(second_order=True, rtol=1e-9, atol=1e-9)


def _variables(*arrays):
    return [tj.Variable(a) for a in arrays]


def _first_and_second_order(fn, *arrays):
    """fn's gradients on Variables of the arrays: first order from backward(create_graph
    =True), then second order from the backward of the sum of their squares."""
    xs = _variables(*arrays)
    fn(*xs).backward(create_graph=True)
    gs = [x.grad for x in xs]
    for x in xs:
        x.cleargrad()
    total = None
    for g in gs:
        if g is not None:
            total = F.sum(g * g) if total is None else total + F.sum(g * g)
    if total is not None:
        total.backward()
    return gs, [x.grad for x in xs]


class CubeDetached(tj.Function):
    """Its backward reads self.inputs[0].data: detached, so eager has no second
    derivative through x (the user's bug, which gradcheck through jit must show)."""

    def forward(self, x):
        return x ** 3

    def backward(self, gy):
        x = self.inputs[0].data
        return gy * 3 * x ** 2


def test_data_read_in_a_user_backward_is_a_leaf():
    def f(x):
        return F.sum(CubeDetached()(x))

    jf = tj.jit(f)
    assert_jit_matches_eager(f, make_args=lambda i: _variables(np.random.randn(3)), calls=2,
                             jitted=jf, **SECOND_ORDER)
    g1, g2 = _first_and_second_order(jf, np.random.randn(3))
    assert g1[0] is not None and g2[0] is None          # as eager: no path through .data


def test_data_read_in_a_user_backward_with_another_path():
    def f(x):
        return F.sum(CubeDetached()(x) * x)

    assert_jit_matches_eager(f, make_args=lambda i: _variables(np.random.randn(3)), calls=2,
                             **SECOND_ORDER)


def test_no_grad_block_inside():
    def f(x, w):
        with tj.no_grad():
            c = F.sigmoid(x)
        return F.sum((w * c) ** 2)

    jf = tj.jit(f)
    assert_jit_matches_eager(
        f, make_args=lambda i: _variables(np.random.randn(3), np.random.randn(3)), calls=2,
        jitted=jf, **SECOND_ORDER)
    g1, g2 = _first_and_second_order(jf, np.random.randn(3), np.random.randn(3))
    assert g1[0] is None and g2[0] is None and g2[1] is not None


def test_no_grad_block_and_another_path():
    def f(x, w):
        with tj.no_grad():
            c = F.exp(x * w)
        return F.sum(F.tanh(x * w) * c)

    assert_jit_matches_eager(
        f, make_args=lambda i: _variables(np.random.randn(3), np.random.randn(3)), calls=2,
        **SECOND_ORDER)


def test_variable_of_data_inside_is_a_leaf():
    def f(x, w):
        h = tj.Variable(F.tanh(x * w).data)
        return F.sum(h * w * x)

    assert_jit_matches_eager(
        f, make_args=lambda i: _variables(np.random.randn(3), np.random.randn(3)), calls=2,
        **SECOND_ORDER)


def test_softmax_stop_gradient():
    def f(x):
        return F.sum(F.softmax(x) * np.arange(3.0))

    assert_jit_matches_eager(f, make_args=lambda i: _variables(np.random.randn(2, 3)),
                             calls=2, **SECOND_ORDER)


def test_int_and_bool_variables_get_eagers_gradients():
    def add_int(x, w):
        return F.sum((x + w) ** 2)

    def add_bool(b, w):
        return F.sum(w * 2.0 + b)

    def mul_int(x, w):          # Mul's backward gives an int input None
        return F.sum(x * w)

    assert_jit_matches_eager(
        add_int, make_args=lambda i: _variables(np.arange(3) + i, np.random.randn(3)),
        calls=2, **SECOND_ORDER)
    assert_jit_matches_eager(
        add_bool, make_args=lambda i: _variables(np.arange(3) > i % 3, np.random.randn(3)),
        calls=2, rtol=1e-9, atol=1e-9)
    assert_jit_matches_eager(
        mul_int, make_args=lambda i: _variables(np.arange(3) + i, np.random.randn(3)),
        calls=2, **SECOND_ORDER)


def test_create_graph_after_an_in_place_update_of_a_captured_parameter():
    P = tj.Parameter(np.random.randn(3))

    def f(x):
        y = F.sum(F.tanh(x * P) ** 2)
        P.data -= 0.1 * x.data
        return y

    assert_jit_matches_eager(f, make_args=lambda i: _variables(np.random.randn(3)), calls=2,
                             params=[P], **SECOND_ORDER)


def test_create_graph_after_an_in_place_update_of_an_argument():
    def f(x, w):
        y = F.sum(F.sin(x * w) * w)
        w.data *= 0.5
        return y

    assert_jit_matches_eager(
        f, make_args=lambda i: _variables(np.random.randn(3), np.random.randn(3)), calls=2,
        **SECOND_ORDER)


def test_create_graph_after_a_rebind_of_a_captured_parameter():
    P = tj.Parameter(np.random.randn(3))

    def f(x):
        y = F.sum(F.exp(x * P) * P)
        P.data = P.data - 0.1 * x.data
        return y

    assert_jit_matches_eager(f, make_args=lambda i: _variables(np.random.randn(3)), calls=2,
                             params=[P], **SECOND_ORDER)


def test_create_graph_after_an_in_place_update_of_an_ndarray_argument():
    def f(x, a):
        y = F.sum(F.tanh(x * a) * x)
        a += 1.0
        return y

    jf = tj.jit(f)
    for i in range(4):
        xv, av = np.random.randn(3), np.random.randn(3)
        results = []
        for fn in (f, jf):
            x, a = tj.Variable(xv.copy()), av.copy()
            y = fn(x, a)
            y.backward(create_graph=True)
            g = x.grad
            x.cleargrad()
            F.sum(g * g).backward()
            results.append((g.data, x.grad.data, a))
        for got, want in zip(results[1], results[0]):
            np.testing.assert_allclose(got, want, rtol=1e-10)


def test_replacing_an_intermediates_data_refuses_create_graph_clearly():
    def f(x):
        h = F.tanh(x)
        h.data = h.data * 2.0
        return F.sum(h * x)

    jf = tj.jit(f)
    for i in range(4):
        xv = np.random.randn(3)
        grads = []
        for fn in (f, jf):
            x = tj.Variable(xv.copy())
            fn(x).backward()
            grads.append(x.grad.data)
        np.testing.assert_allclose(grads[1], grads[0])     # plain backward: as eager
    y = jf(tj.Variable(np.random.randn(3)))
    with pytest.raises(RuntimeError, match=r"replaced \(\.data = \.\.\.\)"):
        y.backward(create_graph=True)


def test_a_grad_set_since_the_trace_is_accumulated_into():
    # Traced with P.grad None, backward() inside starts it afresh; a later call that
    # finds it set must accumulate, as eager does (the variant is retraced).
    P = tj.Parameter(np.array([0.5]))

    def f(x):
        F.sum(x * P).backward()
        g = P.grad * 1.0
        P.cleargrad()
        return g

    jf = tj.jit(f)
    for i in range(6):
        outs = []
        for fn in (f, jf):
            if i >= 3:
                P.grad = tj.Variable(np.array([10.0]))
            outs.append(fn(tj.Variable(np.array([float(i)]))).data)
        np.testing.assert_allclose(outs[1], outs[0])


_OPS = {
    "tanh": lambda a, b: F.tanh(a) * b,
    "nograd": lambda a, b: _nograd(a) * b,
    "detach": lambda a, b: tj.Variable(a.data) * b,
    "softmax": lambda a, b: F.softmax(a * b),
    "user": lambda a, b: CubeDetached()(a) * b,
    "mul": lambda a, b: a * b,
    "exp": lambda a, b: F.exp(a * 0.3) + b,
}


def _nograd(a):
    with tj.no_grad():
        return F.sigmoid(a)


@given(st.lists(st.tuples(st.sampled_from(sorted(_OPS)), st.integers(0, 5),
                          st.integers(0, 5)), min_size=1, max_size=5))
def test_random_programs_differentiate_as_eager(program):
    def f(x, w):
        vals = [x, w]
        for op, i, j in program:
            vals.append(_OPS[op](vals[i % len(vals)], vals[j % len(vals)]))
        return F.sum(vals[-1] * vals[-1])

    assert_jit_matches_eager(
        f, make_args=lambda i: _variables(np.random.randn(2, 3), np.random.randn(2, 3)),
        calls=1, second_order=True, rtol=1e-8, atol=1e-8)


def test_an_output_without_history_in_eager_has_none_compiled():
    def under_no_grad(x):
        with tj.no_grad():
            a = x * 2.0
        return a, F.sum(x * x)

    def detached(x):
        return tj.Variable(F.tanh(x).data), F.sum(x * x)

    for f in (under_no_grad, detached):
        jf = tj.jit(f)
        for i in range(4):
            xv = np.random.randn(3)
            seen = []
            for fn in (f, jf):
                x = tj.Variable(xv.copy())
                a, b = fn(x)
                F.sum(a * 3.0).backward()       # a is a leaf: x gets nothing
                grad_after_a = x.grad
                b.backward()                    # ... and a keeps its own gradient
                seen.append((a.creator is None, grad_after_a is None, a.grad.data.copy(),
                             x.grad.data.copy()))
            (ce, ne, ae, xe), (cj, nj, aj, xj) = seen
            assert (cj, nj) == (ce, ne) == (True, True)
            np.testing.assert_allclose(aj, ae)
            np.testing.assert_allclose(xj, xe)


def test_max_mask_of_a_create_graph_replay():
    # The replay recomputes x / (x*x + 1) with NumPy; the compiled max of it may differ
    # by rounding, so mixing the call's saved max with the replay's values lost the
    # gradient of a column (the mask x == max was all False there).
    def f(x, w):
        v = x / (x * x + 1.0)
        return F.sum((F.exp(F.max(v, axis=0) * x * 0.3) + w) ** 2)

    for seed in range(3):
        rng = np.random.default_rng(seed)
        assert_jit_matches_eager(
            f, make_args=lambda i: _variables(rng.standard_normal((4, 5)),
                                              rng.standard_normal((4, 5))),
            calls=4, second_order=True, rtol=1e-8, atol=1e-8)


def test_backward_from_one_output_gives_eagers_dtype():
    # s (float32) reaches output a through float64 and output b through a float32 cast:
    # eager's backward from b alone gives s a float32 gradient; the compiled backward
    # also adds a's zero contribution, which promoted it to float64.
    def f(s, x):
        return x * s, F.cast(s, np.float64) * 2.0

    jf = tj.jit(f)
    for i in range(5):
        sv, xv = np.asarray(np.random.randn(), np.float32), np.random.randn(3)
        for which in (0, 1):
            grads = []
            for fn in (f, jf):
                s, x = tj.Variable(sv.copy()), tj.Variable(xv.copy())
                outs = fn(s, x)
                F.sum(outs[which]).backward()
                grads.append((s.grad.data, None if x.grad is None else x.grad.data))
            (se, xe), (sj, xj) = grads
            assert sj.dtype == se.dtype, (which, sj.dtype, se.dtype)
            np.testing.assert_allclose(sj, se, rtol=1e-6)
            assert (xj is None) == (xe is None)
