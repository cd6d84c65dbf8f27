"""Order of reads and in-place writes through NumPy views of live buffers.

`y = x.data[0:2]` is a view in eager: an in-place update of x's data afterwards shows in
y. The trace rebuilds such a view (and `d = x.data` itself) from the buffer's new value
at the update, so a view used after the update compiles and matches eager; an in-place
write through a view of an argument runs eagerly, warned. Each function is called at
least three times after its trace with new values (a mutated captured Parameter where
there is one) and compared with eager.
"""
import warnings

import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F
from tracejit import Parameter, Variable

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")


def returned_view(x):
    d = x.data
    y = d[0:2]
    x.data -= 1.0
    return y


def used_view(x):
    r = x.data.reshape(3, 1)
    x.data *= 2.0
    return F.sum(F.exp(r)), x


def written_view(x):
    y = x.data[0:2]
    y += 1.0
    return F.sum(x)


def run_both(f, rng, calls=5):
    jf = tj.jit(f)
    for _ in range(calls):
        a = rng.normal(size=3)
        xe, xj = Variable(a.copy()), Variable(a.copy())
        e, g = f(xe), jf(xj)
        for u, v in zip(e if isinstance(e, tuple) else (e,), g if isinstance(g, tuple) else (g,)):
            u = u.data if isinstance(u, Variable) else u
            v = v.data if isinstance(v, Variable) else v
            np.testing.assert_allclose(v, u)
        np.testing.assert_allclose(xj.data, xe.data)
    return jf


def read_before_update(x):
    d = x.data                 # the buffer itself, read before another read writes it
    x.data -= 1.0
    return F.sum(F.exp(Variable(d))), x


def test_a_view_used_after_an_inplace_update_compiles_and_matches():
    for f in (returned_view, used_view, read_before_update):
        jf = run_both(f, np.random.default_rng(0))
        assert jf.cache_info()["hits"] >= 3, f.__name__


def test_a_write_through_a_slice_of_traced_data_compiles():
    # `y = x.data[0:2]; y += 1.0` is x.data[0:2] = y + 1 (an AssignItem on x's data):
    # x's buffer holds the write on every compiled call, as eager's.
    rng = np.random.default_rng(0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", tj.JitWarning)
        jf = run_both(written_view, rng)
    assert jf.cache_info()["hits"] >= 3


def written_reshaped_view(x):
    y = x.data.reshape(3)
    y += 1.0
    return F.sum(x)


def test_a_write_through_another_view_runs_eagerly_named():
    rng = np.random.default_rng(0)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always", tj.JitWarning)
        jf = run_both(written_reshaped_view, rng)
    msgs = [str(x.message) for x in w if issubclass(x.category, tj.JitWarning)]
    assert len(msgs) == 1, msgs
    assert "in-place update through a view" in msgs[0] and \
        "y = x.data.reshape(3)" in msgs[0]
    assert "froze a value" not in msgs[0]
    assert jf.cache_info()["hits"] == 0


def test_a_view_not_used_after_the_update_compiles():
    W = Parameter(np.ones((3, 2)))
    W2 = Parameter(np.ones((3, 2)))

    def make(W):
        def step(x):
            Wt = W.data.T             # a view, alive, not used after the update
            W.data -= 0.1 * x.data.sum()
            return F.sum(F.matmul(x, W)), Wt.shape
        return step

    f, jf = make(W), tj.jit(make(W2))
    rng = np.random.default_rng(1)
    for i in range(6):
        a = rng.normal(size=(1, 3))
        ye, se = f(Variable(a))
        yj, sj = jf(Variable(a))
        np.testing.assert_allclose(yj.data, ye.data)
        assert se == sj
        np.testing.assert_allclose(W2.data, W.data)
        W.data[0, 0] += i
        W2.data[0, 0] += i                  # the captured Parameter mutated between calls
    assert jf.cache_info()["hits"] >= 3
