"""A compiled call's outputs have a creator wherever eager's have one, also when no
argument is a Variable (ndarrays and floats only, nothing captured): eager's `F.tanh(x)`
wraps x in a Variable of its own and its output has a Tanh creator, which graph walkers
read (get_dot_graph, unchain_backward). The compiled output's creator is a
CompiledFunction with no inputs: a backward from it reaches nothing outside, as eager's.
Each jitted function is called at least three times after its trace with new values."""
import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F
from tracejit.utils import get_dot_graph

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")

CASES = [
    lambda x: F.tanh(x),
    lambda x: F.exp(tj.Variable(x)) * 2.0,
    lambda x, s: (F.sum(F.sin(x) * s), F.cos(x)),
]


@pytest.mark.parametrize("k", range(len(CASES)))
def test_outputs_of_an_all_array_call_have_a_creator_as_eager(k):
    f = CASES[k]
    jf = tj.jit(f)
    rng = np.random.default_rng(k)
    for _ in range(6):
        x = rng.normal(size=3)
        args = (x,) if k < 2 else (x, float(rng.normal()))
        e, g = f(*args), jf(*args)
        es, gs = (e, g) if isinstance(e, tuple) else ((e,), (g,))
        for a, b in zip(es, gs):
            np.testing.assert_allclose(b.data, a.data)
            assert (a.creator is None) == (b.creator is None)
            assert b.generation >= 1 if b.creator is not None else b.generation == 0
            assert "->" in get_dot_graph(b)          # the walker reaches a function
            a.backward()
            b.backward()
            assert a.grad is None and b.grad is None     # cleared: not retained
            b.unchain_backward()
            assert b.creator is not None
    assert jf.cache_info()["hits"] >= 3


def test_no_creator_under_no_grad():
    jf = tj.jit(lambda x: F.tanh(x))
    rng = np.random.default_rng(9)
    with tj.no_grad():
        for _ in range(5):
            x = rng.normal(size=3)
            y = jf(x)
            assert y.creator is None
            np.testing.assert_allclose(y.data, np.tanh(x))
    assert jf.cache_info()["hits"] >= 3
