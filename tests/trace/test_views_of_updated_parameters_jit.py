"""Views of captured Parameters (F.reshape, F.transpose, indexing, `W.data.T`, `W.data`
itself) taken before an in-place update of a Parameter, in a training step.

In eager such a view's data is the Parameter's buffer: after `W.data -= ...` it shows the
new values, in the forward's later uses and in the backward of an op that read it (a
backward after the call, from the returned loss). The trace rebuilds the view from the
buffer's new value at the update, so the step compiles and matches eager: values,
updated Parameters, first- and second-order gradients, call after call with the
Parameters changed by the step itself. An update of another Parameter leaves the view
as it was (the case that used to run eagerly).
"""
import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F
from tracejit.testing import assert_jit_matches_eager

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")

W = tj.Parameter(np.linspace(0.5, 1.5, 6).reshape(2, 3))
V = tj.Parameter(np.full((2, 3), 2.0))


def sgd_step_on_views(x):
    # The view of W is read by Mul's backward; V's update is another buffer's.
    y = F.sum(F.reshape(W, (1, 6)) * V.reshape(1, 6) * x.reshape(1, 6))
    W.cleargrad()
    V.cleargrad()
    y.backward()
    for p in (W, V):
        p.data -= 0.1 * p.grad.data
    return y


def view_read_by_a_later_backward(x):
    r = F.transpose(W)
    y = F.sum(r * x.T)           # Mul's backward (after the call) reads r: updated W
    W.data -= 0.1 * x.data.sum()
    return y


def view_used_after_the_update(x):
    r = F.reshape(W, (6,))
    W.data *= 0.5
    return F.sum(r * x.reshape(6)) + F.sum(W)


def view_of_a_view(x):
    r = F.flatten(F.reshape(F.transpose(W), (1, 6)))
    W.data += 1.0
    return F.sum(F.exp(r) * x.T.reshape(1, 6))


def indexing_views(x):
    r = W[0]
    r2 = W[:, ::-1]
    W.data -= 0.1
    return F.sum(r * x[1]) + F.sum(r2 * x)


def data_reads(x):
    d = W.data.T                  # a NumPy view of the buffer
    e = W.data                    # the buffer itself
    W.data -= 0.1 * x.data.sum()
    return F.sum(d.T * x) + F.sum(e * x), W


def two_updates(x):
    r = F.reshape(W, (6,))
    W.data *= 0.5
    a = F.sum(r * x.reshape(6))   # the view after the first update
    W.data -= 1.0
    return a * F.sum(r ** 2)      # ... and after the second


def float32_parameter_view(x):
    r = F.reshape(P32, (6,))
    P32.data -= 0.5 * x.data.sum()     # float64 product, cast into the float32 buffer
    return F.sum(r * F.reshape(x, (6,)))


P32 = tj.Parameter(np.ones((2, 3), np.float32))

STEPS = [sgd_step_on_views, view_read_by_a_later_backward, view_used_after_the_update,
         view_of_a_view, indexing_views, data_reads, two_updates]


@pytest.mark.parametrize("f", STEPS)
@pytest.mark.parametrize("second_order", [False, True])
def test_a_view_of_an_updated_parameter_compiles_and_matches(f, second_order):
    x = tj.Variable(np.arange(6.0).reshape(2, 3) / 6.0)
    info = assert_jit_matches_eager(f, x, params=[W, V], second_order=second_order)
    assert info["hits"] >= 3


def test_a_view_of_a_float32_parameter_updated_from_float64():
    x = tj.Variable(np.ones((2, 3), np.float32))
    info = assert_jit_matches_eager(float32_parameter_view, x, params=[P32], rtol=1e-5)
    assert info["hits"] >= 3


def test_the_repro_step_compiles(record_jit_warnings):
    Wl = tj.Parameter(np.ones(3))
    Vl = tj.Parameter(np.full(3, 2.0))

    def step(x):
        y = F.sum(F.reshape(Wl, (1, 3)) * Vl * x)
        Wl.cleargrad()
        Vl.cleargrad()
        y.backward()
        for p in (Wl, Vl):
            p.data -= 0.1 * p.grad.data
        return y

    js = tj.jit(step)
    got = [float(js(np.ones((2, 3))).data) for _ in range(5)]
    assert not record_jit_warnings
    assert js.cache_info()["hits"] == 3
    Wl.data[...] = 1.0
    Vl.data[...] = 2.0
    want = [float(step(np.ones((2, 3))).data) for _ in range(5)]
    np.testing.assert_allclose(got, want, rtol=1e-12)
