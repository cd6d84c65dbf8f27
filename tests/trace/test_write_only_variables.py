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

from compare import data_of, same

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")


def _grad(v):
    return None if v.grad is None else v.grad.data


def _same_grad(a, b):
    assert (a.grad is None) == (b.grad is None), (_grad(a), _grad(b))
    if b.grad is not None:
        _same(a.grad, b.grad, creator=False)


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
        xj, xe = Variable(np.arange(3.0) + k), Variable(np.arange(3.0) + k)
        yj, ye = jf(xj), fe(xe)
        _same(yj, ye)
        _same_grad(pj, pe)
        yj.backward()
        ye.backward()
        _same_grad(xj, xe)
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
        _same(jf(Variable(np.arange(3.0) + k)), fe(Variable(np.arange(3.0) + k)))
        _same_grad(pj, pe)
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
        if outer_no_grad:
            with tj.no_grad():
                got, want = jf(Variable(np.arange(3.0) + k)), fe(Variable(np.arange(3.0) + k))
        else:
            got, want = jf(Variable(np.arange(3.0) + k)), fe(Variable(np.arange(3.0) + k))
        _same(got, want)
        _same(wj, we)
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
        _same(jf(Variable(np.arange(3.0) + k)), fe(Variable(np.arange(3.0) + k)))
        assert len(sj) == len(se) == 1
        _same(sj[0], se[0])
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
        xj, xe = Variable(np.arange(3.0) + k), Variable(np.arange(3.0) + k)
        wj.cleargrad()
        we.cleargrad()
        yj, ye = jf(xj), fe(xe)
        _same(yj, ye)
        _same(wj, we)
        yj.backward()
        ye.backward()
        _same_grad(xj, xe)
        _same_grad(wj, we)                             # jit: None


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
        got = jf(Variable(np.array([1.0, 2.0]) + k))
        want = fe(Variable(np.array([1.0, 2.0]) + k))
        _same(got, want)
        assert (got[0] is wj) == (want[0] is we)


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
        _same(jf(Variable(v)), fe(Variable(v)))
        _same(wj, we)                                  # jit: 2x, eager: 3x


_data, _same = data_of, same


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
        _same(jf(Variable(np.arange(3.0) + k)), fe(Variable(np.arange(3.0) + k)))
        _same(wj, we, creator=False)
