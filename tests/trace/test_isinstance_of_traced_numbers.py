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
from compare import same

import _isinstance_helpers as helpers

SCHEDULE = helpers.Schedule()


def calls(f, n=6, **jit_options):
    jf = tj.jit(f, **jit_options)
    for i in range(n):
        lr = 0.1 + 0.2 * i
        d = np.random.default_rng(i).standard_normal(3) * (1 if i % 2 else -1)
        same(jf(tj.Variable(d.copy()), lr), f(tj.Variable(d.copy()), lr))
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

    W_eager = tj.Parameter(np.ones(3))

    def g(x, lr):
        W_eager.data += 1.0
        return x * W_eager * lr if lr.__class__ is float else x * 0.0

    jf = tj.jit(f)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always", tj.JitWarning)
        for i in range(5):
            d = np.arange(3.0) + i
            same(jf(tj.Variable(d.copy()), 0.5 + i), g(tj.Variable(d.copy()), 0.5 + i))
            np.testing.assert_allclose(W.data, W_eager.data)     # applied once per call
    msgs = [str(m.message) for m in w if issubclass(m.category, tj.JitWarning)]
    assert len(msgs) == 1 and "runs eagerly" in msgs[0], msgs
