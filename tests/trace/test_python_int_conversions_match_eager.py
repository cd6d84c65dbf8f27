"""int(), .item(), round() and math.floor/ceil/trunc of traced data give the Python int
eager gives, at every compiled call (issue 9 audit).

A traced int is an int64 in the graph: a uint64 value from 2**63 (and a float beyond
int64) must not wrap there. The call whose value does not fit retraces and gets it by
value, or runs eagerly; a NaN or an infinity raises what eager raises. round() and
math.floor/ceil/trunc give a recorded int as int() does (round half to even), so a new
value whose outcome is the same runs the same compiled variant instead of retracing.
"""
import math
import warnings

import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F
from tracejit.testing.checks import assert_call_matches_eager

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")


def _outcome(fn, a):
    """What one call gives: (the int, its type, the array result), or the error."""
    try:
        y, n = fn(tj.Variable(a.copy()))
    except (ValueError, OverflowError) as e:
        return type(e), str(e)
    return n, type(n), y.data.dtype, y.data.tolist()


def drive(f, arrays):
    """jit(f) and f on each array, compared (the int exactly, its type, the result);
    returns cache_info()."""
    jf = tj.jit(f)
    for a in arrays:
        with warnings.catch_warnings():
            # A call raising like eager (floor(nan)) may run eagerly to raise it.
            warnings.simplefilter("ignore", tj.JitWarning)
            want, got = _outcome(f, a), _outcome(jf, a)
        assert got == want, (a, got, want)
        if not isinstance(want[0], type):
            assert_call_matches_eager(jf, f, tj.Variable(a.copy()), backward=False,
                                      atol=0)
    return jf.cache_info()


def _uses(conv):
    def f(x):
        n = conv(x)
        # The int reaches the graph's result too (as a float: a Python int operand of a
        # narrow integer array is taken by value).
        return x * 0.0 + float(n % 1000), n
    return f


U64_SMALL_THEN_LARGE = [[5], [7], [8], [9], [10], [2 ** 63 + 5], [2 ** 64 - 1], [3],
                        [2 ** 63], [2 ** 63 - 1]]


@pytest.mark.parametrize("conv", [lambda x: int(x.data.sum()),
                                  lambda x: x.data.sum().item(),
                                  lambda x: int(x.data[0]),
                                  lambda x: x.data[0].item(),
                                  lambda x: int(x.data.max()) + 1],
                         ids=["int(sum)", "sum.item", "int(index)", "index.item",
                              "int(max)+1"])
def test_uint64_at_or_above_2_63_does_not_wrap_on_compiled_calls(conv):
    arrays = [np.array(v, dtype=np.uint64) for v in U64_SMALL_THEN_LARGE]
    drive(_uses(conv), arrays)


def test_uint64_traced_large_first_then_small_and_large():
    arrays = [np.array(v, dtype=np.uint64) for v in
              [[2 ** 63 + 5], [2 ** 64 - 1], [4], [6], [2 ** 63 + 9], [11]]]
    drive(_uses(lambda x: int(x.data.sum())), arrays)


def test_uint32_and_int64_extremes_stay_compiled():
    arrays = [np.array([v], dtype=np.uint32) for v in (1, 2 ** 32 - 1, 7, 2 ** 31)]
    info = drive(_uses(lambda x: int(x.data.sum())), arrays)
    assert info["variants"] == 1, info
    arrays = [np.array([v], dtype=np.int64) for v in (1, 2 ** 63 - 1, -2 ** 63, 5)]
    drive(_uses(lambda x: x.data.sum().item()), arrays)


def test_int_of_a_float_beyond_int64_matches_eager():
    arrays = [np.array([v]) for v in (1.5, -2.5, 1e19, 3.0, -1e19, 2.0 ** 63, 7.9,
                                      -2.0 ** 63, 1e300, 4.0)]
    drive(_uses(lambda x: int(x.data.sum())), arrays)


ROUNDINGS = {
    "floor": lambda x: math.floor(float(x.data.sum())),
    "ceil": lambda x: math.ceil(float(x.data.sum())),
    "trunc": lambda x: math.trunc(x.data.sum().item()),
    "round": lambda x: round(float(x.data.sum())),
    "floor(numpy scalar)": lambda x: math.floor(x.data.sum()),
    "ceil(numpy scalar)": lambda x: math.ceil(x.data.mean()),
    "round(numpy scalar)": lambda x: round(x.data.sum()),
    "floor(Variable)": lambda x: math.floor(F.sum(x)),
    "ceil(Variable)": lambda x: math.ceil(F.sum(x)),
    "floor(int())": lambda x: math.floor(int(x.data.sum())),
    "round(int())": lambda x: round(int(x.data.sum())),
    "round(x * 2) // 3": lambda x: round(float(x.data.sum()) * 2) // 3,
}


@pytest.mark.parametrize("name", list(ROUNDINGS))
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_rounding_builtins_record_ints(name, dtype):
    """Values with one outcome (each rounds to 2, or 3 for ceil): one compiled variant,
    where a guard on each value retraced for every call."""
    f = _uses(ROUNDINGS[name])
    vals = (2.2, 2.4, 2.3, 2.1, 2.45, 2.35, 2.25)
    info = drive(f, [np.array([v, 0.0], dtype) for v in vals])
    assert info["variants"] == 1 and info["retraces"] == 0, info
    assert info["hits"] >= len(vals) - 2, info


@pytest.mark.parametrize("name", list(ROUNDINGS))
def test_rounding_matches_python_on_halves_signs_and_extremes(name):
    """Round half to even, negative values, beyond int64, and nan/inf raising as eager."""
    vals = (2.5, 3.5, -0.5, 0.5, -2.5, 1.5, -1.7, 1e19, -3e18, 2.0 ** 62, 7.5,
            float("nan"), 4.2, float("inf"), -float("inf"), 9.5, 0.0, -0.0)
    info = drive(_uses(ROUNDINGS[name]), [np.array([v, 0.0]) for v in vals])
    # One variant for the values int64 holds, one by value for each beyond it (1e19;
    # 2 * 2**62 for round(x * 2)), and none for nan/inf (they raise): not one per value.
    assert info["variants"] <= 3, info


def test_round_to_ndigits_gives_pythons_float():
    """round(v, n) is a float rounded as Python rounds decimals (2.675 -> 2.67, which
    np.round gives as 2.68)."""
    def f(x):
        r = round(float(x.data.sum()), 2)
        return x * 0 + r, r
    drive(f, [np.array([v]) for v in (2.675, 1.005, 2.5, 0.125, -2.675, 0.375)])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_round_to_ndigits_follows_each_value_in_one_variant(dtype):
    """round(v, n) is Python's own rounding of each call's value (a replayed call), not
    the traced value behind a guard: a loss printed or logged as round(loss, 4) in a
    training step compiled once, where every new value used to retrace until
    max_variants and then run eagerly for good. Infinities stay infinities."""
    def f(x):
        r = round(x.data.sum().item(), 2)
        return x * r + round(float(x.data.max()), 3), r
    vals = (2.675, 1.005, 2.5, 0.125, -2.675, 0.375, 3.14159, -0.35, 1e300, 12.3456,
            float("inf"), -7.0625, 0.0, 5.5e-3)
    info = drive(f, [np.array([v, 0.25], dtype) for v in vals])
    assert info["variants"] == 1 and info["retraces"] == 0, info


def test_trip_count_from_floor_retraces_per_count_only():
    def f(x):
        acc = x * 0
        for _ in range(math.floor(float(x.data.sum()))):
            acc = acc + x
        return acc, math.floor(float(x.data.sum()))
    vals = (2.1, 2.9, 2.5, 3.2, 3.7, 2.2, 3.01)
    info = drive(f, [np.array([v]) for v in vals])
    assert info["variants"] == 2 and info["retraces"] == 1, info


@pytest.mark.parametrize("conv,dtype", [
    (lambda x: math.trunc(x.data.sum()), np.float32),     # np.float32: no __trunc__
    (lambda x: math.trunc(x.data), np.float64),           # an ndarray: none either
    (lambda x: round(x.data), np.float64),                # an ndarray has no round()
    (lambda x: math.trunc(x), np.float64)],               # nor a Variable (DeZero)
    ids=["trunc(float32 scalar)", "trunc(ndarray)", "round(ndarray)", "trunc(Variable)"])
def test_rounding_what_eager_cannot_raises_its_type_error(conv, dtype):
    def f(x):
        return conv(x)
    jf = tj.jit(f)
    for v in (1.5, 2.5, 3.5):
        a = np.array(v, dtype)
        with pytest.raises(TypeError) as want:
            f(tj.Variable(a))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", tj.JitWarning)
            with pytest.raises(TypeError) as got:
                jf(tj.Variable(a))
        assert str(got.value) == str(want.value)
