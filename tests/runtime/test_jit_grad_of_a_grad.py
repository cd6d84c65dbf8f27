"""A .grad that a later backward in the call gives a .grad of its own (x.grad.grad).

`F.reshape(x, s).backward()` sets x.grad, a Variable with no creator: a leaf, so a
later `F.sum(x.grad * W).backward()` sets x.grad.grad, as eager does. Compiled calls
set one level of .grad (the grad effects, a result's retained .grad): such a call runs
eagerly from its trace on, warned with that cause at the backward's line (it used to
be compiled, found to differ by the first-call check, and reported as "computes with
NumPy on arrays the tracer cannot see"). One level only still compiles.
"""
import re

import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F
from tracejit.testing import assert_jit_matches_eager

W = tj.Parameter(np.random.default_rng(1).standard_normal(4))


def nested(x):
    x.cleargrad()
    F.reshape(x, x.shape).backward()
    g = x.grad
    F.sum(g * W).backward()               # sets g.grad: x.grad.grad
    return g


def one_level(x):
    x.cleargrad()
    F.sum(x * W).backward()
    return F.tanh(x.grad) * 2.0


def test_a_grad_of_a_grad_runs_eagerly_with_its_cause(record_jit_warnings):
    rng = np.random.default_rng(0)
    jf = tj.jit(nested)
    for i in range(5):
        W.data = W.data + 0.25                # the captured weight mutated
        x = rng.standard_normal((2, 4))
        W.cleargrad()
        e = nested(tj.Variable(x))
        e_w = W.grad.data.copy()
        W.cleargrad()
        j = jf(tj.Variable(x))
        np.testing.assert_array_equal(j.data, e.data)
        np.testing.assert_array_equal(j.grad.data, e.grad.data)
        np.testing.assert_array_equal(W.grad.data, e_w)
    msgs = [str(w.message) for w in record_jit_warnings]
    assert len(msgs) == 1, msgs
    assert re.search(r"sets the \.grad of a \.grad .* at test_jit_grad_of_a_grad\.py:\d+  "
                     r"F\.sum\(g \* W\)\.backward\(\)", msgs[0]), msgs
    assert jf.cache_info()["variants"] == 0


@pytest.mark.usefixtures("jit_warnings_are_errors")
def test_one_level_of_grad_still_compiles():
    rng = np.random.default_rng(2)

    def make_args(i):
        W.data = W.data - 0.125 * i
        return (tj.Variable(rng.standard_normal((2, 4))),)
    info = assert_jit_matches_eager(one_level, make_args=make_args, calls=4)
    assert info["fallbacks"] == 0
