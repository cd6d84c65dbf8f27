"""NumPy scalar arguments (np.float16/32/64) trace as NumPy scalars, not as 0-d arrays.

While tracing, an np.float32 argument is a 0-d tracer standing for the scalar eager has:
isinstance / type / np.isscalar answer as for the scalar, grad and value_and_grad make
eager's float64 leaf of it (a 0-d float32 array would stay float32), it is returned as
the argument object itself, and its results have eager's dtypes and kinds over every
combination with Python numbers, NumPy scalars, arrays and Variables. A 0-d array
argument of the same dtype keys apart (another variant): the two are told apart by
eager's code. Each program is called at least four times with new values, compared
with eager on values, dtypes, kinds, identity and gradients; a fallback fails.
"""
import operator

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tracejit as tj
import tracejit.functions as F
from tracejit.testing import assert_jit_matches_eager

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")

FLOATS = [np.float16, np.float32, np.float64]
OPS = [operator.add, operator.sub, operator.mul, operator.truediv]


def other_operand(kind, k):
    """The other operand of call k, of the drawn kind."""
    v = 1.25 + 0.5 * k
    return {
        "python float": v, "python int": 2 + k,
        "np.float64": np.float64(v), "np.float32": np.float32(v),
        "np.float16": np.float16(v),
        "f64 array": np.full(3, v), "f32 array": np.full(3, v, np.float32),
        "f16 array": np.full(3, v, np.float16), "i32 array": np.arange(3, dtype=np.int32),
        "f32 0-d array": np.array(v, np.float32), "f64 0-d array": np.array(v),
        "f32 Variable": tj.Variable(np.full(2, v, np.float32)),
        "f64 Variable": tj.Variable(np.full(2, v)),
    }[kind]


KINDS = ["python float", "python int", "np.float64", "np.float32", "np.float16",
         "f64 array", "f32 array", "f16 array", "i32 array", "f32 0-d array",
         "f64 0-d array", "f32 Variable", "f64 Variable"]


@settings(max_examples=40, deadline=None)
@given(dtype=st.sampled_from(FLOATS), kind=st.sampled_from(KINDS),
       op=st.sampled_from(OPS), swap=st.booleans())
def test_arithmetic_with_a_numpy_scalar_argument_has_eager_dtypes(dtype, kind, op, swap):
    def f(s, o):
        y = op(o, s) if swap else op(s, o)
        return y, s * 2.0, s + 1, np.isscalar(s)

    assert_jit_matches_eager(f, make_args=lambda k: (dtype(0.75 + 0.25 * k),
                                                     other_operand(kind, k)), rtol=2e-3)


@settings(max_examples=20, deadline=None)
@given(dtype=st.sampled_from(FLOATS), kind=st.sampled_from(
    ["python float", "np.float32", "f32 array", "f64 array", "f32 Variable"]))
def test_grad_of_a_numpy_scalar_argument_is_eagers_float64(dtype, kind):
    def loss(u, o):
        return F.sum(u * u * 2.0 * o)

    def f(s, o):
        return tj.grad(loss)(s, o), tj.value_and_grad(loss)(s, o)

    assert_jit_matches_eager(f, make_args=lambda k: (dtype(0.75 + 0.25 * k),
                                                     other_operand(kind, k)), rtol=2e-3)


def test_type_checks_and_the_returned_argument_are_eagers():
    def f(s, x):
        scale = 2.0 if isinstance(s, np.generic) else 3.0
        kind = type(s).__name__
        return s, x * s * scale, kind

    info = assert_jit_matches_eager(
        f, make_args=lambda k: (np.float32(1.5 + k), tj.Variable(np.arange(3.0) + k)))
    assert info["hits"] >= 3


def test_a_numpy_scalar_and_a_0d_array_key_apart():
    def f(s):
        return tj.grad(lambda u: u * u * 2.0)(s), s

    jf = tj.jit(f)
    for k in range(6):
        for s in (np.float32(1.5 + k), np.array(1.5 + k, np.float32)):
            want, got = f(s), jf(s)
            assert got[0].dtype == want[0].dtype, (type(s), got[0].dtype, want[0].dtype)
            np.testing.assert_allclose(got[0].data, want[0].data)
            assert got[1] is s
    assert jf.cache_info()["variants"] == 2
    assert jf.cache_info()["hits"] >= 6
