"""Python numbers computed from traced values are symbolic under jit (issue 9, item 3).

float(), int() and .item() of traced data, and the arithmetic and comparisons done on
the numbers they give, are recorded: `if float(h.data.mean()) > 0` is one guard on the
comparison's outcome, so a new input value runs the compiled variant of its outcome
instead of retracing. Only a use the tracer cannot follow (str, a dict key, math.*)
guards the value itself, and the log says where. A traced number is a Python scalar to
NumPy: weak, so float32 data stays float32.
"""
import logging
import math
import operator
import threading
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tracejit as tj
import tracejit.functions as F
from tracejit.testing import assert_jit_matches_eager
from tracejit.testing.checks import assert_call_matches_eager

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")


def run(f, args_list, **options):
    """Call jit(f) and f on each argument tuple (each side its copies), compare (values,
    kinds, dtypes, creators, identity; no backward), give cache_info."""
    return assert_jit_matches_eager(f, make_args=lambda i: args_list[i],
                                    calls=len(args_list) - 2, backward=False, atol=1e-12,
                                    **options)


def _same_call(jf, f, *args):
    """One call of jf and of f on copies of args, compared (no backward)."""
    return assert_call_matches_eager(jf, f, *args, backward=False, atol=1e-12)


def signs(n, shape=(4,), dtype=np.float64, seed=0):
    """Inputs whose mean flips sign from call to call (each outcome seen twice or more)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        s = 1.0 if (i // 2) % 2 == 0 else -1.0
        out.append((s * (np.abs(rng.standard_normal(shape)) + 0.1)).astype(dtype))
    return out


def assert_compiled(info, n_calls, outcomes):
    """Traced once per outcome, then compiled calls: no value-by-value retrace storm."""
    assert info["fallbacks"] == 0, info
    assert info["variants"] <= outcomes, info
    assert info["retraces"] <= outcomes - 1, info
    # Per outcome: a trace and a checked first call; the first call of all is warm-up.
    assert info["hits"] >= n_calls - 1 - 2 * outcomes, info


# ------------------------------------------------------------------ conditions

def test_float_of_mean_in_a_condition_is_one_guard_per_outcome():
    def f(x):
        h = F.tanh(x)
        if float(h.data.mean()) > 0:
            return h * 2
        return h
    xs = signs(12)
    assert_compiled(run(f, [(x,) for x in xs]), 12, 2)


def test_item_below_a_tolerance():
    def f(x, tol):
        err = (x * x).mean()
        if err.data.item() < tol:
            return x, err
        return x * 0.5, err
    rng = np.random.default_rng(1)
    args = [(tj.Variable(rng.standard_normal(5) * (0.1 if i % 3 else 3.0)), 0.5)
            for i in range(12)]
    assert_compiled(run(f, args), 12, 2)


def test_int_in_a_comparison_and_int_arithmetic():
    def f(x):
        n = int(x.sum())          # truncation toward zero, as Python's int()
        if n % 2 == 0 and n > -3:
            return x * (n + 1)
        return x - n // 2
    rng = np.random.default_rng(2)
    xs = [rng.uniform(-6, 6, 3) for _ in range(16)]
    jf = tj.jit(f, max_variants=8)
    for x in xs:
        _same_call(jf, f, x)
    info = jf.cache_info()
    # Outcomes: (even, > -3) True, (even, not > -3), odd: at most 3 variants.
    assert info["fallbacks"] == 0 and info["variants"] <= 3, info
    assert info["hits"] >= 16 - 1 - 2 * 3, info


def test_comparison_kept_as_a_bool_and_returned():
    def f(x):
        big = float(x.data.max()) > 1.0       # a bool, not looked at: no guard
        return x * 2, big, int(x.data.argmax())
    rng = np.random.default_rng(3)
    xs = [rng.uniform(0, 2, 4) for _ in range(8)]
    info = run(f, [(tj.Variable(x),) for x in xs])
    assert info["variants"] == 1 and info["retraces"] == 0 and info["fallbacks"] == 0, info
    assert info["hits"] >= 8 - 3, info


# ------------------------------------------------------------------ bookkeeping

def test_loss_accumulated_with_float_is_returned_without_retrace():
    W = tj.Parameter(np.random.default_rng(4).standard_normal((3, 2)))

    def f(x):
        total = 0.0
        for k in range(3):
            loss = F.sum(F.matmul(x * (k + 1), W) ** 2)
            loss_value = float(loss.data)          # the DeZero idiom
            total += loss_value
        return loss, total, total / 3
    rng = np.random.default_rng(5)
    xs = [tj.Variable(rng.standard_normal((4, 3))) for _ in range(6)]
    jf = tj.jit(f)
    for i, x in enumerate(xs):
        got = _same_call(jf, f, x)
        assert type(got[1]) is float
        W.data *= 1.1          # captured Parameter mutated: still read live
    info = jf.cache_info()
    assert info["variants"] == 1 and info["retraces"] == 0 and info["fallbacks"] == 0, info
    assert info["hits"] >= 6 - 3, info


def test_print_of_a_traced_number_is_a_side_effect_not_a_guard(capsys):
    def f(x):
        loss = F.sum(x * x)
        loss_value = float(loss.data)
        print("loss", loss_value)
        return loss, loss_value
    jf = tj.jit(f)
    rng = np.random.default_rng(6)
    with pytest.warns(tj.JitWarning, match="print"):
        for _ in range(5):
            x = rng.standard_normal(3)
            _same_call(jf, f, x.copy())
    info = jf.cache_info()
    assert info["variants"] == 1 and info["retraces"] == 0 and info["fallbacks"] == 0, info


# ------------------------------------------------------------------ arithmetic

def test_arithmetic_with_arrays_and_variables_uses_the_traced_value():
    def f(x):
        s = float(x.data.mean())
        m = x.data.max().item()
        t = (s - m) ** 2 / (abs(s) + 1.0) - -s
        return x * s, s * x, x.data - t, F.sum(x / (1.0 + abs(m))), t, 2 ** s
    rng = np.random.default_rng(7)
    args = [(tj.Variable(rng.standard_normal(4)),) for _ in range(6)]
    info = run(f, args)
    assert info["variants"] == 1 and info["retraces"] == 0 and info["fallbacks"] == 0, info


def test_gradient_through_a_symbolic_scale():
    def f(x):
        s = float(x.data.std()) + 1.0       # a plain number in eager: no gradient of it
        return F.sum(x * s) + F.sum(x ** 2) * (1 / s)
    jf = tj.jit(f)
    rng = np.random.default_rng(8)
    for _ in range(5):
        xv = rng.standard_normal(4)
        a, b = tj.Variable(xv.copy()), tj.Variable(xv.copy())
        f(a).backward()
        jf(b).backward()
        np.testing.assert_allclose(b.grad.data, a.grad.data, rtol=1e-12)
    info = jf.cache_info()
    assert info["variants"] == 1 and info["fallbacks"] == 0, info


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_symbolic_numbers_are_weak_against_float32(dtype):
    K = np.random.default_rng(9).standard_normal(3).astype(dtype)

    def f(x, lr):
        s = float(x.data.sum())
        return (F.sum(K / (1.0 + lr)), K * lr, lr * x, x * s, x.data + s, np.sqrt(lr) * K,
                x ** (lr + 1), (x.data * 2).sum().item() * K)
    rng = np.random.default_rng(10)
    args = [(tj.Variable(np.abs(rng.standard_normal(3)).astype(dtype)), 0.1 * (i + 1))
            for i in range(6)]
    info = run(f, args)
    assert info["variants"] == 1 and info["fallbacks"] == 0, info


def test_jit_of_grad_with_a_python_float():
    g = tj.jit(tj.grad(lambda x: x * x))
    for v in (1.0, 2.0, 3.0, -1.5):
        got = g(v)
        assert isinstance(got, tj.Variable) and got.data.dtype == np.float64
        assert got.data == 2 * v
    vg = tj.jit(tj.value_and_grad(lambda x, y: x * y + x ** 3, argnums=(0, 1)))
    for v in (0.5, 2.0, -1.0):
        y, (gx, gy) = vg(v, 3.0)
        assert float(y.data) == pytest.approx(v * 3.0 + v ** 3)
        assert float(gx.data) == pytest.approx(3.0 + 3 * v ** 2)
        assert float(gy.data) == pytest.approx(v)


def test_zero_divisor_raises_as_in_eager():
    def f(x):
        s = float(x.sum())
        return x * (1.0 / s), x / s      # Python raises on the first; NumPy gives inf
    jf = tj.jit(f)
    for v in (1.0, 2.0, 3.0):
        _same_call(jf, f, np.full(2, v))
    with pytest.raises(ZeroDivisionError):
        f(np.zeros(2))
    with pytest.raises(ZeroDivisionError):
        jf(np.zeros(2))
    _same_call(jf, f, np.full(2, 4.0))


def test_int_of_nan_raises_as_in_eager():
    def f(x):
        return x * int(x.sum())
    jf = tj.jit(f)
    for v in (1.5, 2.5, -3.5):
        _same_call(jf, f, np.full(2, v))
    with pytest.raises(ValueError):
        jf(np.array([np.nan, 1.0]))


# ------------------------------------------------------------------ escapes

def test_escapes_guard_the_value_and_log_where(caplog):
    lut = {0: 1.0, 1: -1.0, 2: 0.5}

    def f(x):
        s = float(x.sum())
        r = math.sqrt(abs(s))                     # a C function: by value
        k = lut[int(abs(s)) % 3]                  # a dict key: by value
        tag = f"{s:.1f}"                          # formatting: by value
        return x * r * k, tag
    jf = tj.jit(f, max_variants=16)
    with caplog.at_level(logging.INFO, logger="tracejit"):
        for v in (0.3, 0.3, 1.7, 2.2, 0.3):
            _same_call(jf, f, np.full(2, v))
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "test_symbolic_scalars.py:" in logged and "r = math.sqrt(abs(s))" in logged
    assert "hash()" in logged and "string formatting" in logged
    assert "float() by a C function" in logged
    info = jf.cache_info()
    assert info["fallbacks"] == 0 and info["hits"] >= 1, info


def _helper_mean(h):
    return float(h.mean())      # a module-level helper: followed too


class _Scaled(tj.Model):
    def __init__(self):
        super().__init__()
        self.l1 = tj.layers.Linear(2)

    def forward(self, x):
        h = self.l1(x)
        return h * 2 if float(h.data.mean()) > 0 else h - 1


def test_float_in_helpers_and_a_model_forward_is_symbolic():
    model = _Scaled()

    def f(x):
        y = model(x)
        return y * 2 if _helper_mean(x.data) > 0 else y
    rng = np.random.default_rng(14)
    xs = [tj.Variable(rng.standard_normal((3, 4)) + (1.0 if (i // 2) % 2 else -1.0))
          for i in range(14)]
    model(xs[0])           # the Linear layer's lazy weight, before jit sees it
    info = run(f, [(x,) for x in xs])
    assert_compiled(info, 14, 4)


def test_float_in_a_function_passed_as_an_argument_is_by_value_and_logged(caplog):
    def f(x, helper):
        return x * 2 if helper(x) > 0 else x
    jf = tj.jit(f, static_argnums=1, max_variants=16)
    with caplog.at_level(logging.INFO, logger="tracejit"):
        for v in (0.5, 0.5, 1.5, -2.0, 0.5):
            _same_call(jf, f, np.full(2, v), _helper_mean)
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "return float(h.mean())" in logged and "outside the jitted function" in logged
    info = jf.cache_info()
    assert info["fallbacks"] == 0 and info["hits"] >= 1, info


def test_range_of_int_is_a_trip_count_guard():
    def f(x):
        n = int(x.max())
        for _ in range(n):
            x = x * 0.5
        return x
    rng = np.random.default_rng(11)
    xs = [np.array([float(n), 0.0]) for n in (2, 2, 3, 3, 2, 3)]
    info = run(f, [(x,) for x in xs])
    assert info["variants"] == 2 and info["fallbacks"] == 0, info
    del rng


# ------------------------------------------------------------------ threads

def test_threads_compile_once_per_outcome_and_hit():
    def f(x):
        h = F.tanh(x)
        if float(h.data.mean()) > 0:
            return h * 2
        return h - 1
    jf = tj.jit(f)
    xs = signs(48, seed=12)
    want = [f(x.copy()) for x in xs]
    errors = []

    def worker(k):
        try:
            for i in range(k, 48, 8):
                # eager's side: its result, computed before the threads start
                _same_call(jf, lambda x, i=i: want[i], xs[i])
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)
    with warnings.catch_warnings():
        warnings.simplefilter("error", tj.JitWarning)
        threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not errors, errors
    info = jf.cache_info()
    assert info["fallbacks"] == 0 and info["variants"] <= 2, info
    assert info["retraces"] <= 4, info
    assert info["hits"] >= 48 - 12, info


# ------------------------------------------------------------------ hypothesis

_HYP = tj.jit(lambda x, c: _hyp_body(x, c), max_variants=64)


def _hyp_body(x, c):
    s = float(x.data.sum())
    n = int(x.data.max() * 3)
    a = s * c - n / 7 + (s - c) ** 2
    b = (n // 3, n % 4, -n, abs(s) % 1.5, s // 0.75) if c != 0 else (0, 0, 0, 0.0, 0.0)
    if a > c and n >= 0:
        return x * a, b, a
    if s < -c or n % 2:
        return x - b[3], b, a
    return x, b, a


@settings(max_examples=40)
@given(st.lists(st.floats(-5, 5), min_size=3, max_size=3), st.floats(-2, 2))
def test_python_number_semantics_match_eager(vals, c):
    x = np.array(vals)
    want = _hyp_body(tj.Variable(x.copy()), c)
    got = assert_call_matches_eager(_HYP, _hyp_body, tj.Variable(x), c, backward=False,
                                    atol=1e-12)
    # and the Python floats closer than the comparer's rtol: to 1e-12 relative
    for g, w in zip(got[1], want[1]):
        assert type(g) is type(w) and _same_number(g, w), (got[1], want[1])


# ------------------------------------------------------------------ Python's types

def test_float_of_a_float_argument_and_types_are_python_types():
    def f(x, lr):
        lr = float(lr)                       # no value guard: a new lr does not retrace
        s = float(F.sum(x))                  # float() of a Variable
        n = int(x.data.sum() * 1000)
        kinds = (isinstance(s, float), isinstance(n, int), type(s) is float,
                 type(n) is int, isinstance(s > 0, bool), isinstance(lr, (int, float)),
                 isinstance(n, float))
        return x * lr, kinds, n ** 2 * 3 - n, s
    args = [(tj.Variable(np.array([0.3 + i * 0.7, 0.1])), 0.1 * i) for i in range(6)]
    info = run(f, args)
    assert info["variants"] == 1 and info["retraces"] == 0 and info["fallbacks"] == 0, info


def test_ints_beyond_int64_are_exact():
    def f(x):
        n = int(x.sum())
        return n ** 9, n * 10 ** 17, -(n << 70)
    jf = tj.jit(f, max_variants=16)
    for v in (3.0, 4.0, 90.0, 3.0, 700.0, -55.0):
        got, want = jf(np.array([v])), f(np.array([v]))
        assert got == want and all(type(g) is int for g in got), (got, want)
    assert jf.cache_info()["fallbacks"] == 0


def test_a_traced_number_stored_on_an_object_is_a_plain_number_after_the_trace():
    class Box:
        pass
    box = Box()
    box.last = 0.0

    def f(x):
        box.last = float(x.sum())       # a Python value the function changes: eager
        return x * 2
    jf = tj.jit(f)
    with pytest.warns(tj.JitWarning, match="changes the Python value"):
        for v in (1.0, 2.0, 3.0, 4.0):
            _same_call(jf, f, np.full(2, v))
            assert type(box.last) is float and box.last == 2 * v


# ------------------------------------------------------------------ random programs

_BIN = [operator.add, operator.sub, operator.mul, operator.truediv, operator.floordiv,
        operator.mod, lambda a, b: a ** (b % 3), operator.lt, operator.ge, operator.eq,
        operator.ne, lambda a, b: max(a, b), lambda a, b: a if a > b else -b]
_UN = [operator.neg, abs, lambda a: float(a), lambda a: int(a) if abs(a) < 1e15 else a,
       lambda a: a + True]

_ops = st.lists(st.tuples(st.sampled_from(["bin", "un", "if"]), st.integers(0, 99),
                          st.integers(0, 99), st.integers(0, 99)), min_size=1, max_size=6)


def _program(ops):
    def f(x, c):
        vals = [float(x.data.sum()), int(x.data.max() * 3), x.data.mean().item(), c,
                int(x.data.argmax())]
        for kind, i, j, k in ops:
            a, b = vals[i % len(vals)], vals[j % len(vals)]
            if kind == "bin":
                vals.append(_BIN[k % len(_BIN)](a, b))
            elif kind == "un":
                vals.append(_UN[k % len(_UN)](a))
            elif a:                      # a branch on a traced number
                vals.append(b * 2)
            else:
                vals.append(b - 1)
        last = vals[-1]
        # The numbers meet arrays too: weak, so float32 data stays float32.
        return (x * float(last), x * last, x.data - last, F.sum(x / (1.0 + abs(last))),
                tuple(vals[5:]))
    return f


def _outcome(f, x, c):
    try:
        with np.errstate(all="ignore"):
            return f(tj.Variable(x.copy()), c)
    except (ArithmeticError, ValueError, TypeError) as e:   # 1 / 0, 1e300 ** 2, complex
        return type(e)


@settings(max_examples=25)
@given(_ops, st.lists(st.tuples(st.lists(st.floats(-4, 4, width=32), min_size=3,
                                         max_size=3), st.floats(-3, 3)),
                      min_size=4, max_size=4),
       st.sampled_from([np.float64, np.float32]))
def test_random_programs_on_python_numbers_match_eager(ops, calls, dtype):
    f = _program(ops)
    jf = tj.jit(f, max_variants=32)
    rel = 1e-12 if dtype == np.float64 else 1e-5     # float32 sums: NumPy's pairwise
    for vals, c in calls:
        x = np.array(vals, dtype)
        want, got = _outcome(f, x, c), _outcome(jf, x, c)
        if isinstance(want, type):
            assert got is want, (ops, vals, c, got, want)
            continue
        assert not isinstance(got, type), (ops, vals, c, got, want)
        for g, w in zip(got[:4], want[:4]):
            assert type(g) is type(w), (ops, vals, c, got, want)
            gd, wd = [np.asarray(a._data if isinstance(a, tj.Variable) else a) for a in (g, w)]
            assert gd.dtype == wd.dtype and gd.shape == wd.shape, (ops, vals, c, g, w)
            np.testing.assert_allclose(gd, wd, rtol=rel * 10, atol=1e-300)
        for g, w in zip(got[4], want[4]):
            assert type(g) is type(w) and _same_number(g, w, rel), \
                (ops, vals, c, got[1], want[1])


def _same_number(g, w, rel=1e-12):
    # Kernels round like NumPy operation by operation, but may fold `s / 3 * 2` (1 ulp).
    if type(w) is float:
        return math.isclose(g, w, rel_tol=rel, abs_tol=1e-300) or (g != g and w != w)
    return g == w


def test_float_in_a_differentiated_function_under_jit_is_symbolic():
    def loss(x):
        y = F.sum(x ** 2)
        return y * 2 if float(y.data) > 1.0 else y
    g = tj.grad(loss)
    jg = tj.jit(g)
    rng = np.random.default_rng(13)
    for i in range(10):
        xv = rng.standard_normal(3) * (2.0 if (i // 2) % 2 else 0.3)
        _same_call(jg, g, tj.Variable(xv))
    info = jg.cache_info()
    assert info["fallbacks"] == 0 and info["variants"] <= 2, info
    assert info["hits"] >= 10 - 1 - 2 * 2, info


def test_traced_ints_as_static_arguments_are_their_values():
    def f(x):
        n = int(x.data[0, 0] > 0)           # 0 or 1
        k = int(x.data[0, 1] > 0) + 1       # 1 or 2
        return (x[n], x.data[n], x[:k], F.sum(x, axis=n - 1), F.reshape(x, 4 * k // k),
                F.reshape(x, (k, -1)), x.reshape(k * 2, -1), F.broadcast_to(x[0], (k, 2)))
    rng = np.random.default_rng(15)
    args = []
    for i in range(12):
        xv = rng.standard_normal(4) + 0.2
        xv[0], xv[1] = abs(xv[0]) * (-1) ** (i // 3), abs(xv[1]) * (-1) ** (i // 2)
        args.append((tj.Variable(xv.reshape(2, 2)),))
    info = run(f, args)
    assert info["fallbacks"] == 0 and info["variants"] <= 4, info
    assert info["hits"] >= 12 - 1 - 2 * 4, info
