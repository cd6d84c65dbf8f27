"""Variables a function only writes (Trace.write_data / write_grad) are effects of the
compiled call: a .grad it only sets, cleargrad of Parameters it never reads, writes under
no_grad, a Variable made on the first call and kept, a write-only Parameter used
afterwards, a Parameter the function rebinds and returns, a Variable written twice.

Every jit test calls the jitted function at least 3 times with new values and compares
with eager, also on the state the function writes.
"""
import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F
from tracejit import Parameter, Variable

from tracejit.testing.checks import assert_call_matches_eager

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")


def _same_call(jf, fe, x, state_j, state_e, backward=False, **options):
    """One call of each side on copies of x; the results and the state each side's
    function writes (data and .grad) compared, and with backward=True the gradients of
    a backward from the results."""
    return assert_call_matches_eager(jf, fe, x, states=(state_j, state_e),
                                     backward=backward, atol=1e-12, **options)


def test_a_grad_the_function_only_writes():
    def make():
        p = Parameter(np.zeros(3))

        def f(x):
            p.grad = Variable(x.data * 2.0)
            return F.sum(x * x)
        return p, f

    pj, fj = make()
    pe, fe = make()
    jf = tj.jit(fj)
    for k in range(5):
        # p.grad as the call left it (the backward does not reach p), then x's gradient
        _same_call(jf, fe, Variable(np.arange(3.0) + k), pj, pe, backward=True)
    assert jf.cache_info()["fallbacks"] == 0


def test_cleargrad_of_parameters_the_function_never_reads():
    def make():
        p = Parameter(np.zeros(3))

        def f(x):
            p.cleargrad()
            return x * 2.0
        return p, f

    pj, fj = make()
    pe, fe = make()
    jf = tj.jit(fj)
    for k in range(5):
        pj.grad = Variable(np.ones(3) * k)
        pe.grad = Variable(np.ones(3) * k)
        _same_call(jf, fe, Variable(np.arange(3.0) + k), pj, pe)
    assert jf.cache_info()["fallbacks"] == 0


@pytest.mark.parametrize("outer_no_grad", [False, True])
def test_a_write_only_variable_written_under_no_grad(outer_no_grad):
    def make():
        w = Parameter(np.zeros(3))

        def f(x):
            with tj.no_grad():
                w.data = x.data * 2.0 + 1.0
            return F.sin(x)
        return w, f

    wj, fj = make()
    we, fe = make()
    jf = tj.jit(fj)
    for k in range(5):
        _same_call(jf, fe, Variable(np.arange(3.0) + k), wj, we,
                   context=tj.no_grad if outer_no_grad else None)
    assert jf.cache_info()["fallbacks"] == 0


def test_a_variable_made_on_the_first_call_and_kept_in_a_global_list():
    def make():
        store = []

        def f(x):
            if not store:
                store.append(Variable(np.zeros(3)))     # the eager warm-up makes it
            store[0].data = x.data * 3.0
            return x * 2.0
        return store, f

    sj, fj = make()
    se, fe = make()
    jf = tj.jit(fj)
    for k in range(5):
        _same_call(jf, fe, Variable(np.arange(3.0) + k), sj, se)
        assert len(sj) == len(se) == 1
    assert jf.cache_info()["fallbacks"] == 0


def test_a_write_only_parameter_used_afterwards_gets_its_grad():
    def make():
        w = Parameter(np.zeros(3))

        def f(x):
            w.data = x.data * 2.0
            return F.sum(w * x)
        return w, f

    wj, fj = make()
    we, fe = make()
    jf = tj.jit(fj)
    for k in range(5):
        wj.cleargrad()
        we.cleargrad()
        # w's data, then the gradients of x and w (jit: None) after a backward
        _same_call(jf, fe, Variable(np.arange(3.0) + k), wj, we, backward=True)


@pytest.mark.parametrize("read_first", [False, True], ids=["write-only", "read-first"])
def test_returning_a_parameter_the_function_rebinds(read_first):
    def make():
        w = Parameter(np.array([1.0, 2.0]))

        def f(x):
            if read_first:
                w.data
            w.data = x.data * 2.0
            return w, x * 3.0
        return w, f

    wj, fj = make()
    we, fe = make()
    jf = tj.jit(fj)
    for k in range(5):
        # output[0] is "state" (w) on both sides, or a new object on both
        _same_call(jf, fe, Variable(np.array([1.0, 2.0]) + k), wj, we)


def test_a_write_only_variable_written_twice():
    def make():
        w = Variable(np.zeros(2))

        def f(x):
            w.data = x.data * 2.0
            w.data = x.data * 3.0
            return x * 1.0
        return w, f

    wj, fj = make()
    we, fe = make()
    jf = tj.jit(fj)
    for k in range(7):
        v = np.zeros(2) if k < 3 else np.array([1.0, 2.0]) * k
        _same_call(jf, fe, Variable(v), wj, we)           # jit: 2x, eager: 3x


def test_a_parameter_the_function_only_writes():
    def make():
        w = Parameter(np.array(0.0))

        def f(x):
            w.data = F.sum(x * x).data
            return F.sum(x) * 2.0
        return w, f

    wj, fj = make()
    we, fe = make()
    jf = tj.jit(fj)
    for k in range(5):
        _same_call(jf, fe, Variable(np.arange(3.0) + k), wj, we)
