"""Non-finite values: every primitive, compiled (forward kernel, fusion with its
consumers, the compiled backward with recomputed values), gives NumPy's results on
inputs with inf, -inf, nan, 0, -0.0 and huge values.

Drawn over the primitive registry (the cases of test_functions.CASES give each
primitive's shapes and parameters; the float inputs' values are replaced by special
ones). Each jitted function is called once per special value (over the calls every
element takes every value) and each call is compared with eager: the same shapes and dtypes, NaN, +-inf and -0.0 in the same places, finite values
equal to float tolerance (vecmath's transcendental functions are within 1.5 ulp, not
bitwise NumPy's), for the output and for the gradients of sum(output * cotangent).
"""
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tracejit as tj
import tracejit.functions as F
from test_functions import CASES, FLOATS

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors", "kernel_cache_dir")

# RandomUniform has no float inputs to make special.
NAMES = sorted(n for n in CASES if n != "RandomUniform")


def _special(dtype):
    big = np.finfo(dtype).max / 4
    return [np.inf, -np.inf, np.nan, 0.0, -0.0, big, -big, 1.0, -2.5, 0.5, 1e-30]


def _specials(a, call, j):
    # Element k of input j on call c holds special value k + c + 3 j (cyclically): over
    # len(pool) calls every element, a 0-d one too, takes every value, and the inputs
    # of a binary op meet in different pairs.
    pool = np.array(_special(a.dtype), a.dtype)
    k = np.arange(a.size).reshape(a.shape)
    return np.asarray(pool[(k + call + 3 * j) % len(pool)], a.dtype)


def assert_same(got, want, what):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype, (
        what, got.shape, want.shape, got.dtype, want.dtype)
    if want.dtype.kind not in "fc":
        np.testing.assert_array_equal(got, want, err_msg=what)
        return
    for test in (np.isnan, np.isposinf, np.isneginf):
        bad = test(got) != test(want)
        assert not bad.any(), f"{what}: {test.__name__} differs: got {got[bad]}, " \
                              f"eager {want[bad]}"
    zero = want == 0                   # 1 / -0.0 is -inf: the sign of a zero matters
    bad = zero & (np.signbit(got) != np.signbit(want))
    assert not bad.any(), f"{what}: the sign of zero differs: got {got[bad]}, eager {want[bad]}"
    fin = np.isfinite(want)
    tol = 1e-5 if want.dtype == np.float32 else 1e-12
    np.testing.assert_allclose(got[fin], want[fin], rtol=tol, atol=0, err_msg=what)


def _form(f, form):
    if form == "alone":
        return f
    # Fused with consumers: relu and the add are cheap, so the compiled backward
    # recomputes them from the primitive's saved output (remat).
    return lambda *xs: F.relu(f(*xs)) * 3.0 + f(*xs)


def _run(f, inputs, cot):
    xs = [tj.Variable(a.copy()) if isinstance(a, np.ndarray) and a.dtype.kind == "f" else a
          for a in inputs]
    with np.errstate(all="ignore"):
        y = f(*xs)
        grads = []
        if y.dtype.kind == "f" and y.creator is not None:
            F.sum(y * cot.astype(y.dtype)).backward()
            grads = [x.grad for x in xs if isinstance(x, tj.Variable)]
    return y, grads


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=2, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_primitive_with_nonfinite_inputs_matches_eager(name, data):
    dtype = data.draw(st.sampled_from(FLOATS), label="dtype")
    form = data.draw(st.sampled_from(["alone", "fused"]), label="form")
    case = CASES[name](data, dtype)
    f = _form(case.f, form)
    jf = tj.jit(f)
    rng = np.random.default_rng(len(name))
    for call in range(len(_special(dtype))):
        inputs = [_specials(a, call, j) if isinstance(a, np.ndarray) and a.dtype.kind == "f"
                  else a for j, a in enumerate(case.inputs)]
        cot = rng.standard_normal(_shape_of(f, inputs))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            want, wgrads = _run(f, inputs, cot)
            got, ggrads = _run(jf, inputs, cot)
        assert_same(got.data, want.data, f"{name} {form} call {call}: output")
        assert len(ggrads) == len(wgrads)
        for k, (g, w) in enumerate(zip(ggrads, wgrads)):
            assert (g is None) == (w is None), (name, k)
            if w is not None:
                assert_same(g.data, w.data, f"{name} {form} call {call}: grad of x{k}")


def _shape_of(f, inputs):
    xs = [tj.Variable(a.copy()) if isinstance(a, np.ndarray) and a.dtype.kind == "f" else a
          for a in inputs]
    with np.errstate(all="ignore"), tj.no_grad():
        return f(*xs).shape


@pytest.mark.parametrize("fn", [
    lambda x: F.sum(F.relu(x)),
    lambda x: F.sum(F.max(x, axis=1)),
    lambda x: F.sum(F.exp(x * 1000)),
    lambda x: F.sum(F.exp(F.tanh(x)) * x),
])
def test_reported_nonfinite_gradients(fn):
    jf = tj.jit(fn)
    rng = np.random.default_rng(0)
    for call in range(4):
        xv = rng.standard_normal((2, 3))
        xv[0, 0], xv[1, 1] = np.inf, -np.inf
        res = []
        for f in (fn, jf):
            x = tj.Variable(xv.copy())
            with np.errstate(all="ignore"):
                y = f(x)
                y.backward()
            res.append((y.data, x.grad.data))
        assert_same(res[1][0], res[0][0], "output")
        assert_same(res[1][1], res[0][1], "gradient")


def test_max_gradient_of_a_fused_expression_on_huge_values():
    # The max is computed in a reduction kernel and its mask (h == max) in the backward:
    # both must round h = x * 1000 - y as eager does (no FMA), or the gradient is lost.
    def f(x, y):
        return F.sum(F.max(x * 1000 - y, axis=-1))
    jf = tj.jit(f)
    rng = np.random.default_rng(1)
    for call in range(4):
        xv = rng.standard_normal((3, 5)) * 1e300
        yv = rng.standard_normal((3, 5)) * 1e300
        res = []
        for fn in (f, jf):
            x, y = tj.Variable(xv.copy()), tj.Variable(yv.copy())
            with np.errstate(all="ignore"):
                fn(x, y).backward()
            res.append((x.grad.data, y.grad.data))
        assert_same(res[1][0], res[0][0], "grad of x")
        assert_same(res[1][1], res[0][1], "grad of y")


@pytest.mark.parametrize("op", [F.maximum, F.minimum])
def test_maximum_minimum_of_equal_zeros_give_numpy_s_zero(op):
    # np.maximum/np.minimum return the second operand on a tie: 1 / the result is then
    # +inf or -inf as in eager.
    def f(x, y):
        return 1.0 / op(x, y)
    jf = tj.jit(f)
    for call in range(4):
        xv = np.array([-0.0, 0.0, -0.0, 1.0 + call])
        yv = np.array([0.0, -0.0, -0.0, 2.0])
        with np.errstate(all="ignore"):
            want = f(tj.Variable(xv), tj.Variable(yv)).data
            got = jf(tj.Variable(xv), tj.Variable(yv)).data
        assert_same(got, want, "1 / op(x, y)")
