"""The .grad dtypes a backward inside a jitted function leaves after going on into the
caller's graph are eager's, whether or not that walk reaches an argument.

`f(x0, x1, u0, u1)` with the caller's `u0 = F.sin(x0) * 2.0`: f's first backward goes
on through u0 into the caller's graph and gives the float32 x0 a float64 gradient
(from the float64 x1); a second backward adds x0's own float32 part. Eager's x0.grad is
then float64 where u0 is made from x0, float32 where it is made from another Variable:
the compiled call's part of x0.grad must not carry the walk's dtype (it did: every call
whose walk missed x0 got a float64 .grad, and the first-call check, whose copies of the
arguments are unrelated leaves, saw it and made the function run eagerly for good).
Each case: 6 calls with new values, eager and jitted on twin caller graphs, comparing
results and every Variable's .grad (value, dtype, None); no call falls back.
"""
import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")


def f(x0, x1, u0, u1):
    loss1 = F.mean(F.tanh(x1 * u0))
    loss1.backward(retain_grad=True)
    loss4 = F.mean(F.tanh(x0 * u1))
    loss4.backward(retain_grad=False)
    return loss4 * 1.0


def _make(rng, related, x1_dtype):
    """The caller's graph: u0 made from x0 (related) or from another Variable z."""
    x0 = tj.Variable(np.asarray(rng.uniform(-2.0, 2.0, ()), dtype=np.float32))
    z = tj.Variable(np.asarray(rng.uniform(-2.0, 2.0, ()), dtype=np.float32))
    x1 = tj.Variable(np.asarray(rng.uniform(-2.0, 2.0, (4, 2)), dtype=x1_dtype))
    u0 = F.sin(x0 if related else z) * 2.0
    u1 = F.sin(x0) * 2.0
    return [x0, z, x1, u0, u1], (x0, x1, u0, u1)


def _same(e, j, what):
    assert (e is None) == (j is None), what
    if e is not None:
        assert j.dtype == e.dtype, (what, e.dtype, j.dtype)
        np.testing.assert_allclose(j.data, e.data, rtol=1e-5, atol=1e-7, err_msg=what)


@pytest.mark.parametrize("x1_dtype", [np.float64, np.float32])
@pytest.mark.parametrize("relations, hits", [
    ([True] * 6, 4),                                  # the relation at every call
    ([True, True, False, True, False, False], 4),     # traced with it, later without
    # Traced without it: a walk that now reaches x0, whose .grad f reads after it, is
    # not the traced variant's (it goes stale, a retrace).
    ([False, False, True, False, True, True], 1),
], ids=["always", "traced_related", "traced_unrelated"])
def test_grad_dtypes_follow_the_walks_reach(relations, hits, x1_dtype):
    jf = tj.jit(f)
    for call, related in enumerate(relations):
        e_vars, e_args = _make(np.random.default_rng(call), related, x1_dtype)
        j_vars, j_args = _make(np.random.default_rng(call), related, x1_dtype)
        _same(f(*e_args), jf(*j_args), f"call {call}: result")
        for k, (ev, jv) in enumerate(zip(e_vars, j_vars)):
            _same(ev.grad, jv.grad, f"call {call}: .grad of caller's Variable {k}")
    info = jf.cache_info()
    assert info["fallbacks"] == 0 and info["hits"] >= hits, info
