"""A backward into a compiled call with an output gradient of another dtype or shape than
the compiled backward was made for (variant._backward_other_gy replays the region):
float64 gradients into float32 calls (also create_graph, dropout, calls that update
their inputs), an output that died, a captured Parameter updated or rebound between the
call and its backward.

Every jit test calls the jitted function at least 3 times with new values and compares
with eager: values, dtypes, gradients and the state the function updates.
"""
import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F
from tracejit import Parameter, Variable

from tracejit.testing.checks import assert_call_matches_eager

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")


def _same_run(run_j, run_e, *args, **options):
    """run_j and run_e each call one side's function and run the backward under test;
    what they return (the outputs, the arguments' .grad) and the states are compared.
    No further backward: the test's own is the one that matters."""
    return assert_call_matches_eager(run_j, run_e, *args, backward=False, atol=1e-12,
                                     **options)


def test_a_float64_gradient_with_an_output_that_died():
    def f(x):
        return F.sin(x) * 3.0, F.cos(x) * x

    def run(fn):
        def r(x):
            a, _ = fn(x)                    # the second output dies
            (F.sum(a) * Variable(np.array(2.0))).backward()
            return a, x.grad
        return r

    jf = tj.jit(f)
    for k in range(5):
        _same_run(run(jf), run(f), Variable(np.array([0.3 + k, 0.7], np.float32)))
    assert jf.cache_info()["fallbacks"] == 0


@pytest.mark.parametrize("g_dtype", [np.float32, np.float64])
def test_a_gradient_of_another_shape(g_dtype):
    def f(x):
        return F.sin(x) * 3.0

    def run(fn):
        def r(x):
            y = fn(x)
            y.grad = Variable(np.array(1.5, g_dtype))       # 0-d into a (2,) output
            y.backward()
            return y, x.grad
        return r

    jf = tj.jit(f)
    for k in range(5):
        _same_run(run(jf), run(f), Variable(np.array([0.3 + k, 0.5], np.float32)))
    assert jf.cache_info()["fallbacks"] == 0


def test_create_graph_with_a_float64_gradient_into_a_float32_call():
    def f(x):
        return F.sin(x) * x

    def run(fn):
        def r(x):
            (F.sum(fn(x)) * Variable(np.array(2.0))).backward(create_graph=True)
            g = x.grad                      # compared with its creator
            x.cleargrad()
            F.sum(g).backward()
            return g, x.grad
        return r

    jf = tj.jit(f)
    for k in range(5):
        _same_run(run(jf), run(f), Variable(np.array([0.3 + k, 0.7], np.float32)))
    assert jf.cache_info()["fallbacks"] == 0


def test_a_float64_gradient_into_a_call_that_updates_its_inputs(record_jit_warnings):
    def make():
        p = Parameter(np.array([0.5, -0.25], np.float32))

        def f(x):
            y = F.sin(x * p)
            p.data -= np.float32(0.1) * x.data
            return y
        return p, f

    pj, fj = make()
    pe, fe = make()
    jf = tj.jit(fj)
    def run(fn):
        def r(x):
            y = fn(x)
            (F.sum(y) * Variable(np.array(2.0))).backward()
            return y, x.grad
        return r

    for k in range(5):
        # The backward graph interpreted on the saved values: float64, as eager. The
        # states: p's data after the update and its gradient.
        _same_run(run(jf), run(fe), Variable(np.array([0.3 + k, 0.7], np.float32)),
                  states=(pj, pe))
        pj.cleargrad()
        pe.cleargrad()
    assert not record_jit_warnings
    assert jf.cache_info()["fallbacks"] == 0


def test_a_float64_gradient_through_a_float32_dropout_call():
    def f(x):
        return F.dropout(x, 0.5) * 2.0

    jf = tj.jit(f)
    def run(fn, k):
        def r(x):
            np.random.seed(k)
            y = fn(x)
            (F.sum(y) * Variable(np.array(1.0))).backward()
            return y, x.grad, np.random.get_state()[2]     # and where the draws ended
        return r

    for k in range(6):
        yj, gj, _ = _same_run(run(jf, k), run(f, k), Variable(np.ones(16, np.float32)))
        assert np.array_equal(gj.data != 0, yj.data != 0)


def _update_between_call_and_backward(g_dtype, rebind=False):
    def make():
        p = Parameter(np.array([0.5, -0.25], np.float32))

        def f(x):
            return F.sin(x * p)
        return p, f

    def run(fn, p):
        def r(x):
            y = fn(x)
            if rebind:
                p.data = p.data * 3
            else:
                p.data *= 3
            (F.sum(y) * Variable(np.array(1.0, g_dtype))).backward()
            return x.grad
        return r

    pj, fj = make()
    pe, fe = make()
    jf = tj.jit(fj)
    for k in range(5):
        for p in (pj, pe):
            p.data = np.array([0.5, -0.25], np.float32)
            p.cleargrad()
        # the states: p's gradient (and data)
        _same_run(run(jf, pj), run(fe, pe), Variable(np.array([0.3 + k, 0.7], np.float32)),
                  states=(pj, pe))
    assert jf.cache_info()["fallbacks"] == 0


def test_a_captured_parameter_updated_in_place_between_call_and_backward():
    _update_between_call_and_backward(np.float32)      # the compiled backward


def test_a_captured_parameter_updated_in_place_before_a_float64_backward():
    _update_between_call_and_backward(np.float64)      # the replay


def test_a_captured_parameter_rebound_between_call_and_backward():
    _update_between_call_and_backward(np.float32, rebind=True)


def test_create_graph_through_a_dropout_call():
    def f(x):
        return F.dropout(x, 0.5) * 2.0

    jf = tj.jit(f)
    for k in range(6):
        x = Variable(np.ones(16))
        y = jf(x)
        F.sum(y).backward(create_graph=True)
        assert np.array_equal(x.grad.data != 0, y.data != 0)


def test_a_captured_parameter_rebound_before_a_float64_backward():
    _update_between_call_and_backward(np.float64, rebind=True)     # the interpret path


def test_a_float64_upstream_gradient_into_a_float32_call():
    def f(x):
        return F.sin(x) * 3.0

    jf = tj.jit(f)
    def run(fn, scale):
        def r(x):
            (fn(x) * Variable(np.array(scale))).backward()
            return x.grad
        return r

    for scale in [1.0, 1.0, 1e-50, 1e300, 1e-50, 1e300]:
        _same_run(run(jf, scale), run(f, scale), Variable(np.array(0.3, np.float32)))


# A backward from some of a call's outputs, one of whose gradients has another dtype than
# the output: a float32 result whose term is added to a float64 loss, beside an output
# nobody uses (a threaded state, a result dropped). The compiled backward adds the dead
# outputs' zeros, so a gradient's dtype is cast to eager's by a table made at trace
# time (trace.backward._grad_dtypes); the table must be made for the gradient's dtype,
# not the output's, and a backward eager's graph replayed (create_graph) is eager's
# already. x is float32, reached in float64 through the captured W by the output
# a and in float32 by b: eager's x.grad from b alone with a float64 gradient is float64.

class _SignScale(tj.Function):
    """A user Function with per-call state: its backward runs on the call's instance."""

    def forward(self, x):
        self.k = 2.0 if x.sum() > 0 else -3.0
        return x * np.float32(self.k)

    def backward(self, gy):
        return gy * np.float32(self.k)


def _mixed(ret):
    """A call with a float64 output a (a state kept on `holder`, or returned) and a
    float32 one b, b returned as given by `ret` (itself, a view, a user Function's)."""
    holder = tj.layers.Layer()
    holder.h = None
    w = Parameter(np.array([0.7, -0.4]))          # float64

    def f(x):
        a = x * w
        if holder.h is not None:
            a = a + holder.h * 0.5
        holder.h = a                   # threaded between calls: its gradient dies
        b = F.tanh(x)
        if ret == "view":
            return a, F.transpose(F.reshape(b, (1, 2)))
        if ret == "user":
            return a, _SignScale()(b)
        if ret == "state":
            return b                   # a only as the state
        return a, b
    return w, holder, f


_RETURNS = ["result", "view", "user", "state"]


def _seed(y, k):
    c = np.random.default_rng(k).uniform(-1.0, 1.0, y.shape)
    return F.sum(y * Variable(c))      # float64: b's gradient is float64


def _b_of(out):
    return out if not isinstance(out, tuple) else out[1]


def _mixed_run(ret, create_graph):
    (wj, hj, fj), (we, he, fe) = _mixed(ret), _mixed(ret)
    jf = tj.jit(fj)

    def run(fn, w, k):
        def r(x):
            out = fn(x)
            _seed(_b_of(out), k).backward(create_graph=create_graph)
            g, gw = x.grad, w.grad
            if not create_graph:
                return out, g, gw
            x.cleargrad()
            w.cleargrad()
            F.sum(g * g).backward()      # the second order, through g's history
            return out, g, gw, x.grad, w.grad
        return r

    for k in range(6):
        for w, h in ((wj, hj), (we, he)):
            w.data = np.array([0.7 + 0.1 * k, -0.4])     # the captured Parameter changed
            w.cleargrad()
            if k == 3:
                h.h = None                               # the state reset
        x = Variable(np.array([0.3 + k, -0.2 * k], np.float32))
        got = _same_run(run(jf, wj, k), run(fe, we, k), x, states=(hj, he))
        assert got[1].dtype == np.float64
    assert jf.cache_info()["fallbacks"] == 0
    assert jf.cache_info()["hits"] >= 2


@pytest.mark.parametrize("ret", _RETURNS)
def test_a_float64_gradient_into_a_float32_output_beside_an_output_that_died(ret):
    _mixed_run(ret, create_graph=False)


@pytest.mark.parametrize("ret", _RETURNS)
def test_create_graph_with_a_float64_gradient_beside_an_output_that_died(ret):
    _mixed_run(ret, create_graph=True)


@pytest.mark.parametrize("create_graph", [False, True])
def test_a_float64_gradient_into_a_float32_output_beside_one_that_lives(create_graph):
    """Every output's gradient given (no zeros added): the backward graph interpreted,
    or replayed on Variables, promotes as eager's; a's gradient float32 (a's term
    scaled by a float32 Variable), b's float64."""
    def make():
        w = Parameter(np.array([0.7, -0.4]))

        def f(x):
            return x * w, F.tanh(x)
        return w, f

    (wj, fj), (we, fe) = make(), make()
    jf = tj.jit(fj)

    def run(fn, w, k):
        def r(x):
            a, b = fn(x)
            loss = _seed(b, k) + F.sum(a * Variable(np.float32(1.5) * np.ones(2, np.float32)))
            loss.backward(create_graph=create_graph)
            g, gw = x.grad, w.grad
            if not create_graph:
                return a, b, g, gw
            x.cleargrad()
            w.cleargrad()
            F.sum(g * g).backward()
            return a, b, g, gw, x.grad, w.grad
        return r

    for k in range(5):
        for w in (wj, we):
            w.data = np.array([0.7 + 0.1 * k, -0.4])
            w.cleargrad()
        _same_run(run(jf, wj, k), run(fe, we, k),
                  Variable(np.array([0.3 + k, -0.2 * k], np.float32)))
    assert jf.cache_info()["fallbacks"] == 0


@pytest.mark.parametrize("g_dtype", [np.float32, np.float64, np.float16])
def test_a_gradient_of_another_dtype_and_shape_beside_an_output_that_died(g_dtype):
    """A 0-d gradient of each dtype (float16: no row made for it, eager's graph
    replayed) into b, a dead: eager's dtypes and shapes."""
    w, _, fj = _mixed("result")
    _, _, fe = _mixed("result")
    jf = tj.jit(fj)

    def run(fn):
        def r(x):
            a, b = fn(x)
            b.grad = Variable(np.array(1.5, g_dtype))
            b.backward()
            return b, x.grad
        return r

    for k in range(5):
        _same_run(run(jf), run(fe), Variable(np.array([0.3 + k, -0.2 * k], np.float32)))
    assert jf.cache_info()["fallbacks"] == 0


@pytest.mark.parametrize("create_graph", [False, True])
def test_a_float32_gradient_into_a_float64_output_beside_an_output_that_died(create_graph):
    """The narrower way: a float32 .grad the caller set on a float64 output, whose Add
    passes it on unpromoted, so eager's x.grad is float32; the dead output's float64
    zeros would promote the compiled one."""
    def make():
        w = Parameter(np.array([0.7, -0.4]))

        def f(x):
            return x + 1.0, F.sin(x) * w
        return w, f

    (wj, fj), (we, fe) = make(), make()
    jf = tj.jit(fj)

    def run(fn, w):
        def r(x):
            a, _ = fn(x)                   # the second output dies
            a.grad = Variable(np.array([1.5, -0.5], np.float32))
            a.backward(create_graph=create_graph)
            g = x.grad
            if not create_graph:
                return a, g, w.grad
            x.cleargrad()
            F.sum(g * g).backward()
            return a, g, w.grad, x.grad
        return r

    for k in range(5):
        for w in (wj, we):
            w.data = np.array([0.7 + 0.1 * k, -0.4])
            w.cleargrad()
        got = _same_run(run(jf, wj), run(fe, we), Variable(np.array([0.3 + k, -0.2 * k])))
        assert got[1].dtype == np.float32
    assert jf.cache_info()["fallbacks"] == 0
