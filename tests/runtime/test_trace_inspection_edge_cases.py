"""f.trace(...) at its edges (issue 9, item 4): trace() runs no effect of the function
unless its warm-up creates state a later call needs (a lazy W, an optimizer's
buffers); a Layer's per-call bookkeeping (`inputs`, `outputs`) is not such state. After
trace(), calls match eager step by step and cache_info() counts only the calls."""
import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F
import tracejit.layers as L
import tracejit.optimizers as O

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")


def _make(opt_cls, **kw):
    np.random.seed(0)
    model = L.Linear(2, in_size=3)           # W exists before any call
    opt = opt_cls(**kw).setup(model)          # plain SGD: no buffers to create

    def step(x):
        loss = F.sum(model(x) ** 2)
        model.cleargrads()
        loss.backward()
        opt.update()
        return loss
    return model, step


def test_trace_before_the_first_call_of_a_model_step_applies_no_step():
    mj, sj = _make(O.SGD, lr=0.1)
    me, se = _make(O.SGD, lr=0.1)
    js = tj.jit(sj)
    xs = [np.random.default_rng(k).standard_normal((4, 3)) for k in range(5)]
    W0, b0 = mj.W.data.copy(), mj.b.data.copy()
    js.trace(xs[0])
    np.testing.assert_array_equal(mj.W.data, W0)
    np.testing.assert_array_equal(mj.b.data, b0)
    assert mj.W.grad is None
    assert js.cache_info()["calls"] == 0
    for k, x in enumerate(xs):
        np.testing.assert_allclose(js(x).data, se(x).data, rtol=1e-6)
        np.testing.assert_allclose(mj.W.data, me.W.data, rtol=1e-6)
        if k == 2:
            js.trace(x * 0.5)
    info = js.cache_info()
    assert info["calls"] == 5 and info["fallbacks"] == 0
    assert info["hits"] == info["calls"] - info["misses"]

