"""Arguments and results nested deeper than a signature key or a generated runner can
be (pytree.MAX_DEPTH levels of lists, tuples and dicts) run eagerly with a JitWarning
naming the argument (or the result) and the bound; up to the bound they compile.

Once, an argument nested ~1100 lists deep raised RecursionError from the signature
key (eager works), and a result that deep fell back with "tracing raised
RecursionError". Each test calls the jitted function at least four times with new
values, compares each call with eager (values, gradients of the argument and of a
captured Parameter it updates between calls) and, where it expects compiled calls,
makes an unexpected fallback an error.
"""
import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F
from tracejit import Parameter, Variable
from tracejit.trace.pytree import MAX_DEPTH

W = Parameter(np.linspace(0.5, 1.5, 3))


def innermost(v):
    while isinstance(v, (list, tuple, dict)):
        v = v["x"] if isinstance(v, dict) else v[0]
    return v


def from_deep_argument(tree):
    return F.sum(F.sin(innermost(tree)) * W)


def deep_result(x):
    r = F.sin(x) * W
    for i in range(DEPTH[0]):
        r = ({"x": r}, (r,), [r])[i % 3]
    return r


DEPTH = [MAX_DEPTH]


def nest(v, depth):
    for i in range(depth):
        v = ({"x": v}, (v,), [v])[i % 3]
    return v


def run(fn, make, n=5):
    """fn eagerly and jitted on the same new values each call: the pairs of (result's
    innermost value, x.grad, W.grad)."""
    f = tj.jit(fn)
    rng = np.random.RandomState(3)
    for _ in range(n):
        v = rng.randn(3)
        got = []
        for g in (fn, f):
            x = Variable(v.copy())
            W.cleargrad()
            out = innermost(g(make(x)))
            F.sum(out * out).backward()
            got.append((out.data, x.grad.data, W.grad.data))
        for a, b in zip(*got):
            np.testing.assert_allclose(b, a, rtol=1e-12, atol=1e-14)
        W.data = W.data + 0.25            # a captured Parameter changed between calls
    return f


@pytest.mark.usefixtures("jit_warnings_are_errors")
def test_nesting_up_to_the_bound_compiles():
    f = run(from_deep_argument, lambda x: nest(x, MAX_DEPTH))
    assert f.cache_info()["hits"] >= 3
    DEPTH[0] = MAX_DEPTH
    f = run(deep_result, lambda x: x)
    assert f.cache_info()["hits"] >= 3


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 1100, 5000])
def test_a_deeper_argument_runs_eagerly_naming_it(depth, record_jit_warnings):
    f = run(from_deep_argument, lambda x: nest(x, depth))
    info = f.cache_info()
    assert info["fallbacks"] == info["calls"] == 5 and info["hits"] == 0
    msgs = [str(w.message) for w in record_jit_warnings]
    assert len(msgs) == 1, msgs
    assert f"argument tree nests lists, tuples or dicts more than {MAX_DEPTH} levels" \
        in msgs[0] and "from_deep_argument" in msgs[0]


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 1100])
def test_a_deeper_result_runs_eagerly_saying_why(depth, record_jit_warnings):
    DEPTH[0] = depth
    f = run(deep_result, lambda x: x)
    assert f.cache_info()["hits"] == 0
    msgs = [str(w.message) for w in record_jit_warnings]
    assert len(msgs) == 1, msgs
    assert f"the result nests lists, tuples or dicts more than {MAX_DEPTH} levels deep" \
        in msgs[0] and "RecursionError" not in msgs[0]
    assert "def deep_result" in msgs[0]
