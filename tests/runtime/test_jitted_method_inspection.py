"""A jitted method bound to its object has the debugging tools of a jitted function:
`obj.step.trace(x)`, `backward_graph`, `eager`, `cache_info`, and calls like it."""
import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")


class Model:
    def __init__(self, w):
        self.W = tj.Parameter(w)

    @tj.jit
    def step(self, x):
        return F.sum(F.tanh(x) * self.W)


def test_a_bound_jitted_method_calls_traces_and_counts():
    rng = np.random.default_rng(0)
    m = Model(rng.normal(size=3))
    for i in range(5):
        x = rng.normal(size=3)
        m.W.data += 0.5                      # a mutated captured Parameter
        got = m.step(tj.Variable(x))
        expected = m.step.eager(tj.Variable(x))
        np.testing.assert_allclose(got.data, expected.data)
        np.testing.assert_allclose(got.data, np.sum(np.tanh(x) * m.W.data))
    info = m.step.cache_info()
    assert info["calls"] == Model.step.cache_info()["calls"]      # one cache per method
    assert info["hits"] >= 3 and info["calls"] == 5       # eager() is not a call
    g = m.step.trace(tj.Variable(np.ones(3)))
    assert "tanh" in str(g)
    assert m.step.backward_graph(tj.Variable(np.ones(3))) is not None
    assert m.step.__name__ == "step"
    assert m.step.cache_info()["calls"] == 5               # trace() is not a call either
