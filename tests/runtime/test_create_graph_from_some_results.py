"""backward(create_graph=True) from some of a compiled call's results differentiates
what eager's does: the results nobody gave a gradient (a threaded state the loss does
not use) add nothing to the graph of the gradients, so a second-order gradient is None
where eager's is, not a Variable of zeros.
"""
import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F
from tracejit import Parameter, Variable

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")


def _second_order(fn, x, params):
    for p in params:
        p.cleargrad()
    y, _ = fn(x)
    y.backward(create_graph=True)
    gs = [g for g in [x.grad] + [p.grad for p in params] if g is not None]
    x.cleargrad()
    for p in params:
        p.cleargrad()
    loss = 0
    for g in gs:
        loss = loss + F.sum(g * g)
    if isinstance(loss, Variable):
        loss.backward()
    return [None if v.grad is None else v.grad.data.copy() for v in [x] + params]


def test_a_result_nobody_differentiates_adds_nothing():
    np.random.seed(0)
    W = Parameter(np.random.randn(4))

    def f(x):
        # max's gradient is piecewise constant: no second derivative; the other result
        # would give one.
        return F.max(x) * 2.0, F.tanh(x * W)
    jf = tj.jit(f)
    for i in range(5):
        x = Variable(np.random.randn(4))
        want = _second_order(f, Variable(x.data.copy()), [W])
        got = _second_order(jf, x, [W])
        for a, b in zip(got, want):
            assert (a is None) == (b is None), (got, want)
            if a is not None:
                np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)
        W.data += 0.1
    assert jf.cache_info()["hits"] >= 3


def test_threaded_state_nobody_differentiates():
    np.random.seed(1)
    W = Parameter(np.random.randn(3))

    class Box:
        h = None
    boxes = [Box(), Box()]
    for b in boxes:
        b.h = None

    def make(box):
        def step(x):
            box.h = F.tanh(x * W) if box.h is None else F.tanh(x * W + box.h)
            return F.max(x) * 2.0, None
        return step
    estep, jstep = make(boxes[0]), tj.jit(make(boxes[1]))
    for i in range(6):
        x = np.random.randn(3)
        want = _second_order(estep, Variable(x.copy()), [W])
        got = _second_order(jstep, Variable(x.copy()), [W])
        for a, b in zip(got, want):
            assert (a is None) == (b is None), (got, want)
            if a is not None:
                np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(boxes[1].h.data, boxes[0].h.data, rtol=1e-12)
    assert jstep.cache_info()["hits"] >= 3
