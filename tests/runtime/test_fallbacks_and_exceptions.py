"""What jit cannot compile runs eagerly with a JitWarning naming the cause and the line
(tolist, item assignment, print); an exception inside the function propagates as eager's,
also after warm-up and trace; bad input is a ValueError in the user's terms.
"""
import warnings

import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F
from tracejit import Variable

from tracejit.testing.checks import assert_call_matches_eager

N_CALLS = 6          # >= 5: warm-up, trace, then at least 3 replays

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")


def _same_call(jf, f, *args, backward=False):
    """One call of jf and f on copies of args compared (and with backward=True the
    arguments' gradients from a backward of the result)."""
    return assert_call_matches_eager(jf, f, *args, backward=backward, rtol=1e-10,
                                     atol=1e-12)


def test_tolist_falls_back_with_warning_naming_cause_and_line():
    def f(x):
        vals = x.data.tolist()  # USER-LINE-TOLIST
        return x * float(sum(vals))

    jf = tj.jit(f)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always", tj.JitWarning)
        for i in range(N_CALLS):
            xa = np.arange(3.0) * (i + 1)
            _same_call(jf, f, Variable(xa), backward=True)
    jw = [str(w.message) for w in rec if issubclass(w.category, tj.JitWarning)]
    assert len(jw) == 1, jw
    assert "tolist" in jw[0] and "USER-LINE-TOLIST" in jw[0]
    assert jf.cache_info()["fallbacks"] >= 1


def test_item_assignment_falls_back():
    def f(x):
        d = (x * 2).data
        d[0] = 5.0  # USER-LINE-SETITEM
        return F.sum(Variable(d) * x)

    jf = tj.jit(f)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always", tj.JitWarning)
        for i in range(N_CALLS):
            xa = np.arange(3.0) + i
            _same_call(jf, f, Variable(xa))
    jw = [str(w.message) for w in rec if issubclass(w.category, tj.JitWarning)]
    assert len(jw) == 1, jw
    assert "assignment" in jw[0] and "USER-LINE-SETITEM" in jw[0]


def test_print_inside_warns_runs_only_while_tracing(capsys):
    def f(x):
        print(f"x is {x.data}")
        return x * 2

    jf = tj.jit(f)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always", tj.JitWarning)
        for i in range(N_CALLS):
            xa = np.arange(3.0) + i
            _same_call(jf, f, Variable(xa), backward=True)
    jw = [str(w.message) for w in rec if issubclass(w.category, tj.JitWarning)]
    assert len(jw) == 1, jw
    assert "only while tracing" in jw[0]
    assert "print" in jw[0] or "format" in jw[0]
    assert jf.cache_info()["fallbacks"] == 0, jf.cache_info()


def test_exception_inside_propagates():
    def f(x, n):
        y = F.tanh(x)
        if y.data.sum() > 100:
            raise RuntimeError("too big")
        if n == 0:
            raise KeyError("n is zero")
        return y

    jf = tj.jit(f)
    for i in range(N_CALLS):
        xa = np.arange(3.0) + i
        _same_call(jf, f, Variable(xa), 1)
    for i in range(3):
        with pytest.raises(KeyError, match="n is zero"):
            jf(Variable(np.arange(3.0)), 0)
    g = lambda x: f(x, 1) if x.data.sum() < 10 else (_ for _ in ()).throw(
        ValueError("big sum"))
    jg = tj.jit(g)
    for i in range(N_CALLS):
        with pytest.raises(ValueError, match="big sum"):
            jg(Variable(np.full(3, 10.0 + i)))
        _same_call(jg, g, Variable(np.full(3, 0.5 * i)))
    assert jf.cache_info()["fallbacks"] == 0, jf.cache_info()


def test_exception_midway_after_warm_and_trace():
    def f(x):
        y = x * 2
        if float(y.data[0]) > 50:
            raise ArithmeticError("over 50")
        return y

    jf = tj.jit(f)
    for v in [1.0, 2.0, 20.0, 3.0, 4.0, 5.0]:
        with pytest.raises(ArithmeticError, match="over 50"):
            jf(Variable(np.array([v + 100])))
        _same_call(jf, f, Variable(np.array([v])))


def test_bad_input_non_broadcastable_raises_value_error():
    def f(x, y):
        return x + y

    jf = tj.jit(f)
    for i in range(N_CALLS):
        _same_call(jf, f, Variable(np.ones(3) * i), Variable(np.ones(3)))
    for i in range(3):
        with pytest.raises(ValueError) as e_j:
            jf(Variable(np.ones(3)), Variable(np.ones(4)))
        with pytest.raises(ValueError) as e_e:
            f(Variable(np.ones(3)), Variable(np.ones(4)))
        assert "(3,)" in str(e_j.value) and "(4,)" in str(e_j.value)
        assert type(e_j.value) is type(e_e.value)
    assert jf.cache_info()["fallbacks"] == 0, jf.cache_info()
