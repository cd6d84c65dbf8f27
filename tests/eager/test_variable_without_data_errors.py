"""A Variable whose data is None (DeZero allows `Variable(None)`) used where a value,
shape or dtype is needed raises NoDataError naming it (issue 9, item 4's clear errors):
a TypeError, and an AttributeError as DeZero's `x.shape` of one is, never a NumPy or
AttributeError traceback from deep inside an op. Passed to a jitted function, the error
names the argument; a jitted function that does not use it gives eager's result.
"""
import math
import warnings

import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F
from tracejit.core import NoDataError

Y = np.array([1.0, 2.0])

USES = {
    "x + 1": lambda x: x + 1,
    "1 - x": lambda x: 1 - x,
    "x * 2.0": lambda x: x * 2.0,
    "x * y": lambda x: x * tj.Variable(Y),
    "ndarray + x": lambda x: Y + x,
    "x ** 2": lambda x: x ** 2,
    "F.sum": lambda x: F.sum(x),
    "x.sum()": lambda x: x.sum(),
    "x.reshape": lambda x: x.reshape(2),
    "F.matmul": lambda x: F.matmul(x, tj.Variable(np.ones((2, 2)))),
    "F.linear": lambda x: F.linear(tj.Variable(np.ones((1, 2))), x),
    "F.broadcast_to": lambda x: F.broadcast_to(x, (2, 2)),
    "F.mean_squared_error": lambda x: F.mean_squared_error(x, tj.Variable(Y)),
    "x.shape": lambda x: x.shape,
    "x.ndim": lambda x: x.ndim,
    "x.dtype": lambda x: x.dtype,
    "x.size": lambda x: x.size,
    "len(x)": lambda x: len(x),
    "float(x)": lambda x: float(x.sum()) if x.data is not None else float(x),
    "int(x)": lambda x: int(x),
    "bool(x)": lambda x: bool(x),
    "math.floor(x)": lambda x: math.floor(x),
    "x.backward()": lambda x: x.backward(),
}


@pytest.mark.parametrize("use", list(USES))
def test_eager_use_raises_no_data_error_naming_the_variable(use):
    x = tj.Variable(None, name="w")
    with pytest.raises(NoDataError, match=r"Variable 'w' whose data is None") as e:
        USES[use](x)
    assert isinstance(e.value, TypeError) and isinstance(e.value, AttributeError)


def test_hasattr_and_repr_of_a_variable_without_data_stay_as_in_dezero():
    x = tj.Variable(None)
    assert not hasattr(x, "shape")            # DeZero: AttributeError, so False
    assert getattr(x, "dtype", "none") == "none"
    assert repr(x) == "variable(None)"
    x.data = np.array(3.0)                    # given data later, it works
    assert float(x * 2) == 6.0


@pytest.mark.parametrize("use", ["x * 2.0", "F.sum", "x + 1", "x.reshape", "F.linear",
                                 "float(x)", "x.shape"])
def test_jitted_call_names_the_argument(use):
    body = USES[use]

    def f(a, x):
        return a * 1.0, body(x)
    jf = tj.jit(f)
    for k in range(3):
        a = tj.Variable(np.full(2, float(k)))
        jf(a, tj.Variable(Y * k))                  # compiled calls in between
        with pytest.raises(NoDataError, match=r"jit\(f\): argument 'x' is a Variable "
                                              r"whose data is None"):
            jf(a, tj.Variable(None))
        with pytest.raises(NoDataError, match=r"argument 'x' is a Variable whose data"):
            jf(a, x=tj.Variable(None))
    # The compiled variant survives the refused calls.
    assert jf.cache_info()["variants"] == 1


def test_jitted_call_names_an_argument_holding_one():
    jf = tj.jit(lambda pair: pair[0] * pair[1])
    for k in range(3):
        with pytest.raises(NoDataError, match=r"argument 'pair' holds a Variable whose "
                                              r"data is None"):
            jf((tj.Variable(Y * k), tj.Variable(None)))


def test_jitted_function_that_does_not_use_it_gives_eagers_result():
    def f(a, x):
        return a * 2.0 if x is not None else a
    jf = tj.jit(f)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always", tj.JitWarning)
        for k in range(3):
            got = jf(tj.Variable(Y * k), tj.Variable(None))
            np.testing.assert_array_equal(got.data, Y * k * 2.0)
    assert any("argument 'x' is a Variable whose data is None" in str(w.message)
               for w in seen)
