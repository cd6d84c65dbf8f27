"""A compiled variant (tracejit.runtime.variant) serves the calls of its signature: new
values hit it, a new shape misses it and gets a variant of its own (its first call eager,
its second traced), the old shape keeps hitting its variant, and each variant's results
and gradients are eager's."""
import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F
from tracejit import Variable
from tracejit.testing import assert_jit_matches_eager

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")


def _f(x):
    return F.sum(F.tanh(x) * x)


def _call(jf, n, k=0):
    return jf(Variable(np.linspace(-1.0, 1.0, n) + 0.1 * k))


def test_new_values_of_its_shapes_hit_the_variant():
    jf = tj.jit(_f)
    for k in range(6):
        _call(jf, 3, k)
    info = jf.cache_info()
    assert (info["variants"], info["traces"], info["misses"], info["hits"]) == (1, 1, 2, 4)
    assert_jit_matches_eager(_f, Variable(np.linspace(-1.0, 1.0, 3)))


def test_a_new_shape_misses_and_gets_its_own_variant():
    jf = tj.jit(_f)
    for k in range(3):
        _call(jf, 3, k)
    before = jf.cache_info()
    _call(jf, 4)                                  # eager: a new signature's warm-up
    _call(jf, 4, 1)                               # traced
    after = jf.cache_info()
    assert after["misses"] - before["misses"] == 2 and after["variants"] == 2
    _call(jf, 3, 5)
    _call(jf, 4, 5)
    final = jf.cache_info()
    assert final["hits"] - after["hits"] == 2 and final["traces"] == 2, final
    assert_jit_matches_eager(_f, make_args=lambda i: [Variable(
        np.linspace(-1.0, 1.0, 3 + i % 2) + 0.1 * i)], calls=6)


def test_each_outcome_of_a_guard_is_a_variant_and_both_keep_hitting():
    def f(x):
        if F.sum(x).data > 0:
            return F.sum(F.exp(x))
        return F.sum(x * x)

    jf = tj.jit(f)
    signs = [1, 1, -1, -1, 1, -1, 1, -1]
    for k, s in enumerate(signs[:4]):
        jf(Variable(s * (np.arange(3.0) + 1 + 0.1 * k)))
    both = jf.cache_info()
    assert both["variants"] == 2 and both["traces"] == 2, both    # one per outcome
    for k, s in enumerate(signs[4:]):
        jf(Variable(s * (np.arange(3.0) + 2 + 0.1 * k)))
    info = jf.cache_info()
    assert info["traces"] == 2 and info["hits"] - both["hits"] == 4, info
    assert_jit_matches_eager(f, make_args=lambda i: [Variable(
        signs[i] * (np.arange(3.0) + 1 + 0.1 * i))], calls=6)
