"""Whole programs through the numba backend: values and gradients equal eager, call
after call, with no fallback (a JitWarning fails the test)."""

import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F
from tracejit import optimizers
from tracejit.models import MLP

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")


@pytest.mark.parametrize("opt_cls", [optimizers.SGD, optimizers.MomentumSGD,
                                     optimizers.AdaGrad, optimizers.Adam])
def test_mlp_training_step_numba_matches_eager(opt_cls):
    # Regression: fusion once produced a cyclic schedule on this graph (Adam's update
    # reads values from several groups), and the step fell back to interpret.
    rng = np.random.default_rng(0)
    x = rng.standard_normal((16, 8)).astype(np.float32)
    t = rng.integers(0, 10, 16)

    def make():
        np.random.seed(0)
        model = MLP((12, 10), activation=F.relu)
        model(x)
        return model, opt_cls().setup(model)

    def step(model, opt, x, t):
        loss = F.softmax_cross_entropy(model(x), t)
        model.cleargrads()
        loss.backward()
        opt.update()
        return loss

    mj, oj = make()
    me, oe = make()
    jstep = tj.jit(lambda x, t: step(mj, oj, x, t), backend="numba")
    for i in range(8):
        xi = x + np.float32(0.1 * i)
        lj = jstep(xi, t)
        le = step(me, oe, xi, t)
        np.testing.assert_allclose(lj.data, le.data, rtol=1e-5)
        for p, q in zip(mj.params(), me.params()):
            np.testing.assert_allclose(p.data, q.data, rtol=1e-5, atol=1e-6)
    info = jstep.cache_info()
    assert info["fallbacks"] == 0 and info["variants"] == 1, info


def test_goldstein_price_dezero_form_numba():
    def gp(x, y):
        return (1 + (x + y + 1) ** 2 * (19 - 14 * x + 3 * x ** 2 - 14 * y + 6 * x * y
                                        + 3 * y ** 2)) \
            * (30 + (2 * x - 3 * y) ** 2 * (18 - 32 * x + 12 * x ** 2 + 48 * y - 36 * x * y
                                            + 27 * y ** 2))
    fj = tj.jit(gp, backend="numba")
    rng = np.random.default_rng(1)
    for _ in range(6):
        a, b = rng.uniform(-1, 1, 2)
        xj, yj = tj.Variable(np.array(a)), tj.Variable(np.array(b))
        xe, ye = tj.Variable(np.array(a)), tj.Variable(np.array(b))
        zj = fj(xj, yj)
        zj.backward()
        ze = gp(xe, ye)
        ze.backward()
        np.testing.assert_allclose(zj.data, ze.data, rtol=1e-12)
        np.testing.assert_allclose([xj.grad.data, yj.grad.data], [xe.grad.data, ye.grad.data],
                                   rtol=1e-10)
    assert fj.trace(xj, yj).summary()["kernels"] == 1
    assert fj.cache_info()["fallbacks"] == 0


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_large_transcendental_groups_threaded_blocks_match_eager(dtype):
    # 2**18 elements. float32: NumPy-ufunc blocks split across threads; a per-row
    # reduction writes disjoint slices, so it may be threaded; a group with a full sum
    # (one shared accumulator) must stay on one thread. float64: one vectorized numba
    # kernel calling tracejit.backends.numba.vecmath (faster than the blocks there).
    def rows(x, w):
        return F.sum(F.tanh(x * w) * F.exp(-x * x), axis=1)

    def both(x, w):
        h = F.tanh(x * w) * F.exp(-x * x)
        return F.sum(h, axis=1), F.sum(F.sin(h))

    rj, bj = tj.jit(rows, backend="numba"), tj.jit(both, backend="numba")
    rng = np.random.default_rng(3)
    w = rng.standard_normal(1024).astype(dtype)
    tol = 1e-12 if dtype == np.float64 else 1e-4
    for _ in range(5):
        x = rng.standard_normal((256, 1024)).astype(dtype)
        np.testing.assert_allclose(rj(x, w).data, rows(tj.Variable(x), tj.Variable(w)).data,
                                   rtol=tol, atol=tol)
        (r1, s1), (r2, s2) = bj(x, w), both(tj.Variable(x), tj.Variable(w))
        np.testing.assert_allclose(r1.data, r2.data, rtol=tol, atol=tol)
        np.testing.assert_allclose(s1.data, s2.data, rtol=1e-9 if dtype == np.float64 else 1e-3)
    if dtype == np.float32:
        assert "_rb" in rj.trace(x, w).source          # threaded
        assert "_rb" not in bj.trace(x, w).source      # one shared accumulator: not threaded
    else:
        src = rj.trace(x, w).source + bj.trace(x, w).source
        assert "vm.tanh64(" in src and "vm.exp64(" in src and "_rb" not in src
    assert rj.cache_info()["fallbacks"] == 0 and bj.cache_info()["fallbacks"] == 0


from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from tracejit.testing import strategies as tjst  # noqa: E402


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck),
          derandomize=True, database=None)
@given(data=st.data(), dtype=st.sampled_from([np.float64, np.float32]))
def test_random_programs_with_empty_and_size1_dims_numba(data, dtype):
    # Shapes with 0 and 1 sides and 0-d inputs, through fused kernels: values and
    # gradients equal eager on every call (NaN from a mean over nothing included).
    prog, inputs = data.draw(tjst.programs(dtype=dtype, min_side=0, max_side=3))
    jf = tj.jit(prog, backend="numba")
    rtol, atol = (1e-9, 1e-11) if dtype == np.float64 else (2e-4, 1e-5)
    r = np.random.default_rng(7)
    with np.errstate(all="ignore"):
        for call in range(5):
            arrays = inputs if call == 0 else [r.uniform(-2, 2, a.shape).astype(dtype)
                                               for a in inputs]
            xj = [tj.Variable(a.copy()) for a in arrays]
            xe = [tj.Variable(a.copy()) for a in arrays]
            yj, ye = jf(*xj), prog(*xe)
            np.testing.assert_allclose(yj.data, ye.data, rtol=rtol, atol=atol)
            assert yj.dtype == ye.dtype and yj.shape == ye.shape
            F.sum(yj * 1.5).backward()
            F.sum(ye * 1.5).backward()
            for a, b in zip(xj, xe):
                if b.grad is None:
                    assert a.grad is None
                else:
                    np.testing.assert_allclose(a.grad.data, b.grad.data, rtol=rtol, atol=atol)
    assert jf.cache_info()["fallbacks"] == 0


def test_backward_after_in_place_update_reads_current_weights_like_eager():
    # The step updates W in place; a later loss.backward() in eager DeZero reads W's
    # current (updated) data. The compiled backward must do the same, with no copies.
    rng = np.random.default_rng(5)

    def make():
        W = tj.Parameter(rng.standard_normal((4, 3)))
        return W, optimizers.SGD(0.1)

    Wj, _ = make()
    We = tj.Parameter(Wj.data.copy())

    def step(W, x):
        loss = F.sum(F.tanh(F.matmul(x, W)) ** 2)
        W.cleargrad()
        loss.backward()
        W.data -= 0.1 * W.grad.data
        return loss

    jstep = tj.jit(lambda x: step(Wj, x))
    for i in range(6):
        x = rng.standard_normal((5, 4))
        lj, le = jstep(x), step(We, x)
        np.testing.assert_allclose(lj.data, le.data, rtol=1e-10)
        np.testing.assert_allclose(Wj.data, We.data, rtol=1e-10)
        Wj.cleargrad()
        We.cleargrad()
        lj.backward()
        le.backward()
        np.testing.assert_allclose(Wj.grad.data, We.grad.data, rtol=1e-10)
    assert jstep.cache_info()["fallbacks"] == 0


def test_a_failing_compiled_call_falls_back_with_a_warning_not_a_traceback(monkeypatch):
    # Simulate a backend failure at run time: the call must still return eager's
    # result, warn, and keep running eagerly for that signature.
    f = lambda x: F.sum(F.tanh(x) * 2)                          # noqa: E731
    jf = tj.jit(f)
    x = np.linspace(-1, 1, 5)
    for _ in range(3):
        jf(x)
    v = next(iter(jf._variants.values()))[0]

    def broken(arrays):
        raise RuntimeError("simulated backend failure")

    monkeypatch.setattr(v, "runner", broken)
    with pytest.warns(tj.JitWarning, match="simulated backend failure"):
        y = jf(x)
    np.testing.assert_allclose(y.data, f(tj.Variable(x)).data)
    y2 = jf(x * 0.5)
    np.testing.assert_allclose(y2.data, f(tj.Variable(x * 0.5)).data)
    assert jf.cache_info()["fallbacks"] >= 1


def test_plain_numpy_square_fuses_like_pow():
    """`d ** 2` on traced arrays is NumPy's np.square: recorded as pow 2, so a
    pure-NumPy function fuses into one kernel (it used to stay an opaque NumPy call)."""
    def f(x):
        d = x[1:] - x[:-1]
        return np.sum(d ** 2) + np.sum(np.square(x))

    j = tj.jit(f)
    rng = np.random.default_rng(3)
    for n in (50, 50, 50, 50, 80, 80):
        x = rng.standard_normal(n)
        np.testing.assert_allclose(j(x), f(x), rtol=1e-12)
    s = j.trace(x).summary()
    # Two reductions over two iteration shapes: two kernels, no NumPy call between.
    assert s["numpy_calls"] == 0 and s["ops"]["pow"] == 2 and s["kernels"] == 2, s
    xi = np.arange(7)
    for k in range(4):
        got = tj.jit(lambda a: a ** 2 + 1)(xi + k)
        assert got.dtype == xi.dtype and (got == (xi + k) ** 2 + 1).all()
    assert j.cache_info()["fallbacks"] == 0
