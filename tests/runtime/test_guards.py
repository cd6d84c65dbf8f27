"""Python control flow on traced data: each outcome of a branch or a loop's trip count is a
guarded variant of its own, dispatched by the guard tree; past max_variants the call
runs eagerly with one JitWarning.
"""
import warnings

import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F
from tracejit import Variable

from tracejit.testing.checks import assert_call_matches_eager

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")


def _loop(x):
    y = x
    while y.data < 100:
        y = y + x
    return y


def test_define_by_run_while_loop():
    jf = tj.jit(_loop)
    seq = [3.0, 7.0, 3.0, 50.0, 7.0, 2.5]
    for rnd in range(4):
        before = jf.cache_info()
        for v in seq:
            # the result, then x's gradient from a backward
            assert_call_matches_eager(jf, _loop, Variable(np.array(v)), rtol=1e-10,
                                      atol=1e-12)
    info = jf.cache_info()
    assert info["guard_failures"] > 0, info
    assert info["variants"] == 4, info          # one per trip count
    # by the last round every value has its variant: all hits, no new trace
    assert info["hits"] - before["hits"] == len(seq), (before, info)
    assert info["retraces"] == before["retraces"], (before, info)
    assert jf.cache_info()["fallbacks"] == 0, jf.cache_info()


def test_while_loop_max_variants_falls_back_once():
    jf = tj.jit(_loop, max_variants=2)
    values = [3.0, 7.0, 3.0, 50.0, 7.0, 2.5, 1.5, 50.0, 3.0]
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always", tj.JitWarning)
        for v in values:
            # the result, then x's gradient from a backward
            assert_call_matches_eager(jf, _loop, Variable(np.array(v)), rtol=1e-10,
                                      atol=1e-12)
    jw = [w for w in rec if issubclass(w.category, tj.JitWarning)]
    assert len(jw) == 1, [str(w.message) for w in jw]
    assert "max_variants" in str(jw[0].message)
    info = jf.cache_info()
    assert info["variants"] <= 2
    assert info["fallbacks"] >= 1


def _branch(x, W, b):
    h = F.tanh(F.matmul(x, W) + b)
    if h.data.mean() > 0:
        h = h * 2
    else:
        h = h - 1
    return F.sum(h ** 2)


def test_data_dependent_branch_both_outcomes():
    jf = tj.jit(_branch)
    r = np.random.default_rng(10)
    outcomes = []
    for i in range(10):
        sign = 1.0 if (i // 2) % 2 == 0 else -1.0
        xa = np.abs(r.standard_normal((3, 2)))
        Wa = np.abs(r.standard_normal((2, 2)))
        ba = sign * (2.0 + np.abs(r.standard_normal(2)))
        # the result, then W's and b's gradients from a backward
        assert_call_matches_eager(jf, _branch, xa, Variable(Wa), Variable(ba), rtol=1e-10,
                                  atol=1e-12)
        outcomes.append(np.tanh(xa @ Wa + ba).mean() > 0)
    assert any(outcomes) and not all(outcomes)
    info = jf.cache_info()
    assert info["variants"] == 2, info
    assert info["guard_failures"] >= 1
    assert jf.cache_info()["fallbacks"] == 0, jf.cache_info()
