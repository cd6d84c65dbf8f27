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

from compare import data_of, same

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")


def test_a_float64_gradient_with_an_output_that_died():
    def f(x):
        return F.sin(x) * 3.0, F.cos(x) * x

    jf = tj.jit(f)
    for k in range(5):
        xj = Variable(np.array([0.3 + k, 0.7], np.float32))
        xe = Variable(np.array([0.3 + k, 0.7], np.float32))
        aj, _ = jf(xj)
        ae, _ = f(xe)
        s = Variable(np.array(2.0))
        (F.sum(aj) * s).backward()
        (F.sum(ae) * s).backward()
        _same(xj.grad, xe.grad, creator=False)
    assert jf.cache_info()["fallbacks"] == 0


@pytest.mark.parametrize("g_dtype", [np.float32, np.float64])
def test_a_gradient_of_another_shape(g_dtype):
    def f(x):
        return F.sin(x) * 3.0

    jf = tj.jit(f)
    for k in range(5):
        xj = Variable(np.array([0.3 + k, 0.5], np.float32))
        xe = Variable(np.array([0.3 + k, 0.5], np.float32))
        yj, ye = jf(xj), f(xe)
        yj.grad = Variable(np.array(1.5, g_dtype))       # 0-d into a (2,) output
        ye.grad = Variable(np.array(1.5, g_dtype))
        yj.backward()
        ye.backward()
        _same(xj.grad, xe.grad, creator=False)
    assert jf.cache_info()["fallbacks"] == 0


def test_create_graph_with_a_float64_gradient_into_a_float32_call():
    def f(x):
        return F.sin(x) * x

    jf = tj.jit(f)
    for k in range(5):
        xj = Variable(np.array([0.3 + k, 0.7], np.float32))
        xe = Variable(np.array([0.3 + k, 0.7], np.float32))
        s = Variable(np.array(2.0))
        (F.sum(jf(xj)) * s).backward(create_graph=True)
        (F.sum(f(xe)) * s).backward(create_graph=True)
        gj, ge = xj.grad, xe.grad
        _same(gj, ge)
        xj.cleargrad()
        xe.cleargrad()
        F.sum(gj).backward()
        F.sum(ge).backward()
        _same(xj.grad, xe.grad, creator=False)
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
    for k in range(5):
        xj = Variable(np.array([0.3 + k, 0.7], np.float32))
        xe = Variable(np.array([0.3 + k, 0.7], np.float32))
        yj, ye = jf(xj), fe(xe)
        _same(pj, pe)
        s = Variable(np.array(2.0))
        (F.sum(yj) * s).backward()
        (F.sum(ye) * s).backward()
        # The backward graph interpreted on the saved values: float64, as eager.
        _same(xj.grad, xe.grad, creator=False)
        _same(pj.grad, pe.grad, creator=False)
        pj.cleargrad()
        pe.cleargrad()
    assert not record_jit_warnings
    assert jf.cache_info()["fallbacks"] == 0


def test_a_float64_gradient_through_a_float32_dropout_call():
    def f(x):
        return F.dropout(x, 0.5) * 2.0

    jf = tj.jit(f)
    for k in range(6):
        np.random.seed(k)
        xj = Variable(np.ones(16, np.float32))
        yj = jf(xj)
        (F.sum(yj) * Variable(np.array(1.0))).backward()
        state_j = np.random.get_state()[2]
        np.random.seed(k)
        xe = Variable(np.ones(16, np.float32))
        ye = f(xe)
        (F.sum(ye) * Variable(np.array(1.0))).backward()
        _same(yj, ye)
        _same(xj.grad, xe.grad, creator=False)
        assert np.array_equal(xj.grad.data != 0, yj.data != 0)
        assert state_j == np.random.get_state()[2]


def _update_between_call_and_backward(g_dtype, rebind=False):
    def make():
        p = Parameter(np.array([0.5, -0.25], np.float32))

        def f(x):
            return F.sin(x * p)
        return p, f

    pj, fj = make()
    pe, fe = make()
    jf = tj.jit(fj)
    for k in range(5):
        for p in (pj, pe):
            p.data = np.array([0.5, -0.25], np.float32)
            p.cleargrad()
        xj = Variable(np.array([0.3 + k, 0.7], np.float32))
        xe = Variable(np.array([0.3 + k, 0.7], np.float32))
        yj, ye = jf(xj), fe(xe)
        if rebind:
            pj.data = pj.data * 3
            pe.data = pe.data * 3
        else:
            pj.data *= 3
            pe.data *= 3
        s = Variable(np.array(1.0, g_dtype))
        (F.sum(yj) * s).backward()
        (F.sum(ye) * s).backward()
        _same(xj.grad, xe.grad, creator=False)
        _same(pj.grad, pe.grad, creator=False)
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


_data, _same = data_of, same


def test_a_float64_upstream_gradient_into_a_float32_call():
    def f(x):
        return F.sin(x) * 3.0

    jf = tj.jit(f)
    for scale in [1.0, 1.0, 1e-50, 1e300, 1e-50, 1e300]:
        xj, xe = Variable(np.array(0.3, np.float32)), Variable(np.array(0.3, np.float32))
        s = Variable(np.array(scale))
        (jf(xj) * s).backward()
        (f(xe) * s).backward()
        _same(xj.grad, xe.grad, creator=False)
