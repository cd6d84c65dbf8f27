"""NumPy calls on traced data that return NumPy or Python scalars (Trace.numpy_call): norm,
median, std, reductions and 0-d calls give eager's kind of result (NumPy scalar, Python
scalar, 0-d array in Variables and effects), also under augmented assignment; NumPy
functions returning several arrays run eagerly; the checks against eager compare the
kind of result.

Every jit test calls the jitted function at least 3 times with new values and compares
with eager: values, dtype, shape, ndarray vs NumPy scalar.
"""
import warnings

import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F
from tracejit import Parameter, Variable
from tracejit.testing import assert_jit_matches_eager

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")


def test_numpy_scalar_results_of_norm_median_and_0d_calls():
    def f(a, b):
        return np.linalg.norm(a), np.median(a), np.isclose(b, b * 1.0), np.argmax(a)

    info = assert_jit_matches_eager(
        f, make_args=lambda k: [np.arange(3.0) * (k + 1) - 1.0, np.array(0.5 + k)],
        calls=3, atol=1e-12)
    assert info["fallbacks"] == 0


def test_python_scalar_results_of_numpy_functions():
    def f(a, b):
        return np.allclose(a, b), np.array_equal(a, b)

    assert_jit_matches_eager(f, make_args=lambda k: [np.arange(3.0), np.arange(3.0) + (k % 2)],
                             calls=3, atol=1e-12)


@pytest.mark.parametrize("reduce", [np.std, lambda a: a.sum()], ids=["np.std", "a.sum()"])
def test_augmented_assignment_to_a_numpy_scalar_result(reduce):
    def f(a):
        s = reduce(a)
        t = s
        s += 1.0
        return t, s

    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always", tj.JitWarning)   # the fallback follows the bug
        info = assert_jit_matches_eager(f, make_args=lambda k: [np.arange(3.0) * (k + 1)],
                                        calls=3, atol=1e-12, allow_fallback=True)
    assert info["fallbacks"] == 0


def test_numpy_functions_returning_several_arrays_are_compiled(record_jit_warnings):
    # (They ran eagerly once; now one recorded node per result.)
    def f(a):
        frac, whole = np.modf(a * 1.5)
        return frac, whole, np.divmod(a, 0.7)

    info = assert_jit_matches_eager(f, make_args=lambda k: [np.arange(3.0) + 0.25 * k],
                                    calls=4, atol=1e-12)
    assert info["fallbacks"] == 0 and not record_jit_warnings, info


def test_the_checks_against_eager_compare_the_kind_of_result():
    from tracejit.runtime.checking import first_difference
    a = np.arange(3.0)
    assert first_difference(np.float64(1.0), np.array(1.0)) is not None
    assert first_difference(True, np.bool_(True)) is not None
    assert first_difference((a, a), (a,)) is not None
    assert first_difference(Parameter(a), Variable(a)) is not None
    assert first_difference((a, np.float64(2.0)), (a.copy(), np.float64(2.0))) is None


def test_0d_results_of_numpy_calls_are_arrays_in_variables_and_effects():
    w = Parameter(np.array(0.0))

    def f(x):
        y = F.matmul(F.reshape(x, (1, 3)), F.reshape(x, (3, 1)))
        w.data                                   # read: w is live state
        w.data = np.dot(x.data, x.data)          # eager's setter makes it an array
        return F.reshape(y, ()), F.sum(x) * 2.0, x[1]

    # params: both sides from the same w, and w.data after each call compared
    info = assert_jit_matches_eager(f, make_args=lambda k: [Variable(np.arange(3.0) + k)],
                                    calls=3, atol=1e-12, params=[w])
    assert info["fallbacks"] == 0


def test_numpy_scalar_results_of_more_reductions():
    def f(x):
        a = x * 2.0
        return np.std(a), np.dot(a, a), np.prod(a)

    assert_jit_matches_eager(f, make_args=lambda k: [np.arange(1.0, 4.0) + k], calls=2,
                             atol=1e-12)
