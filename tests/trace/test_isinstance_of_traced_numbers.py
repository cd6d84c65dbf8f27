"""isinstance / type of a float argument inside jit answer as for the float (issue 9):
a float argument is a TracedFloat while tracing (not a float subclass, on purpose), and
jit rewrites isinstance/type calls in the code a trace runs to answer for traced
numbers. That code must include the helpers the function calls through a user module
(`helpers.is_lr(lr)`) and the helpers those call, or a program branching on the type
takes the other branch. And where some code still sees the TracedFloat itself
(`lr.__class__`), the first-call check makes the signature eager and that call, too,
returns what eager returns.
"""
import warnings

import numpy as np
import pytest

import tracejit as tj
from tracejit.testing import assert_jit_matches_eager

import _isinstance_helpers as helpers

SCHEDULE = helpers.Schedule()


def _args(i):
    d = np.random.default_rng(i).standard_normal(3) * (1 if i % 2 else -1)
    return [tj.Variable(d), 0.1 + 0.2 * i]


def calls(f, n=6, **jit_options):
    """n calls of jit(f), each compared with eager (no fallback)."""
    jf = tj.jit(f, **jit_options)
    assert_jit_matches_eager(f, make_args=_args, calls=n - 2, atol=1e-12, jitted=jf)
    return jf


@pytest.mark.usefixtures("jit_warnings_are_errors")
@pytest.mark.parametrize("check", [
    lambda lr: helpers.is_lr(lr),
    lambda lr: helpers.is_float_type(lr),
    lambda lr: helpers.is_real(lr),
    lambda lr: isinstance(lr, float) and type(lr) is float,
    lambda lr: isinstance(lr * 2.0, float),
], ids=["module-helper-isinstance", "module-helper-type", "helper-of-helper",
        "inline", "arithmetic"])
def test_a_float_argument_is_a_float_to_the_helpers_it_reaches(check):
    def f(x, lr):
        return x * lr if check(lr) else x * 0.0

    jf = calls(f)
    assert jf.cache_info()["hits"] >= 4, jf.cache_info()


@pytest.mark.usefixtures("jit_warnings_are_errors")
def test_a_method_of_an_object_from_a_user_module():
    def f(x, lr):
        return x * SCHEDULE.scale(lr)

    jf = calls(f)
    assert jf.cache_info()["hits"] >= 4, jf.cache_info()


def test_a_type_check_the_rewrite_does_not_reach_runs_eagerly_with_eagers_result():
    # lr.__class__ is the TracedFloat's own class: the trace takes the other branch.
    # The first-call check catches that; the traced call's result was the other
    # branch's, so the call is rerun eagerly from the state before the trace.
    W = tj.Parameter(np.ones(3))

    def f(x, lr):
        W.data += 1.0
        return x * W * lr if lr.__class__ is float else x * 0.0

    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always", tj.JitWarning)
        # params: W after each call is eager's (the update applied once per call)
        assert_jit_matches_eager(f, make_args=lambda i: [tj.Variable(np.arange(3.0) + i),
                                                         0.5 + i],
                                 calls=3, params=[W], atol=1e-12, allow_fallback=True)
    msgs = [str(m.message) for m in w if issubclass(m.category, tj.JitWarning)]
    assert len(msgs) == 1 and "runs eagerly" in msgs[0], msgs
