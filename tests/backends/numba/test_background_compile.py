"""TRACEJIT_BACKGROUND_COMPILE=1: a kernel not compiled yet runs as NumPy while a worker
thread compiles it; the first call after that checks the kernel against NumPy and only
then puts it in the plan. Results equal eager's before, during and after the switch; a
kernel that disagrees is never used."""
import warnings

import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F
from tracejit.backends.numba import background
from tracejit.backends.numba import cache as kcache
from tracejit.backends.numba import plan as codegen
from tracejit.ir import Lit, interpret
from tracejit.ops.arrayops import Sum

from graph_builder import Builder

pytestmark = pytest.mark.usefixtures("kernel_cache_dir", "jit_warnings_are_errors")


@pytest.fixture
def background_on(monkeypatch):
    monkeypatch.setenv("TRACEJIT_BACKGROUND_COMPILE", "1")


def _graph(c):
    # A structure no other test compiles (the literal c), so its kernel is cold here;
    # a main output, a full sum and a 0-d epilogue: every kind of kernel argument.
    b = Builder()
    x, y = b.input((5, 7)), b.input((7,))
    t = b.op(F.Tanh(), b.op(F.Mul(), x, Lit(c, np.float64)))
    u = b.op(F.Add(), t, y)
    s = b.op(Sum(None, False), b.op(F.Mul(), u, u))
    return b.graph(u, b.op(F.Mul(), s, Lit(0.5, np.float64)))


def _kernel_slots(run):
    env = run.plan.__globals__
    return {k: v for k, v in env.items() if k.startswith("_k")}


def test_numpy_until_compiled_then_the_checked_kernel(background_on):
    g = _graph(1.2345671)
    run = codegen.compile(g)
    slots = _kernel_slots(run)
    assert slots and all(isinstance(v, background.Tiered) for v in slots.values())
    rng = np.random.default_rng(0)
    for k in range(6):
        xs = [rng.standard_normal((5, 7)), rng.standard_normal(7)]
        want = interpret.compile(g)(xs)
        got = run(xs)
        if k == 0:                      # the first call only submitted the compilation
            assert all(isinstance(v, background.Tiered) for v in _kernel_slots(run).values())
        for a, w in zip(got, want):
            np.testing.assert_allclose(a, w, rtol=1e-12, atol=1e-12)
            assert np.asarray(a).dtype == np.asarray(w).dtype
        if k == 2:
            background.wait()           # compiled: the next call checks and switches
    slots = _kernel_slots(run)
    assert not any(isinstance(v, background.Tiered) for v in slots.values())
    assert all(v.signatures for v in slots.values())


def test_a_kernel_that_disagrees_with_numpy_is_never_used(background_on):
    g = _graph(1.2345672)
    run = codegen.compile(g)
    (name, tiered), = _kernel_slots(run).items()
    real = tiered.disp

    class Wrong:                       # a miscompiled kernel: its first output is off
        signatures = ()

        def compile(self, sig):
            real.compile(sig)

        def __call__(self, *args):
            real(*args)
            args[tiered.n_in][...] += 1.0     # after the inputs (a lifted literal is one)
    tiered.disp = Wrong()
    before = kcache.STATS.get("background_mismatches", 0)
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal((5, 7)), rng.standard_normal(7)]
    run(xs)
    background.wait()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for _ in range(3):
            xs = [rng.standard_normal((5, 7)), rng.standard_normal(7)]
            got, want = run(xs), interpret.compile(g)(xs)
            for a, w in zip(got, want):
                np.testing.assert_allclose(a, w, rtol=1e-12, atol=1e-12)
    assert kcache.STATS["background_mismatches"] == before + 1
    shown = [w for w in seen if "differs from its NumPy reference" in str(w.message)]
    assert shown and shown[0].filename == __file__      # at the caller's line, not ours
    assert _kernel_slots(run)[name] == tiered.numpy_only


def test_jitted_training_steps_match_eager_across_the_switch(background_on):
    def step(x, W, b):
        y = F.tanh(F.matmul(x, W) + b) * 1.2345673
        return F.sum(y * y)
    f = tj.value_and_grad(step, argnums=(1, 2))
    jf = tj.jit(f)
    rng = np.random.default_rng(2)
    W, b = rng.standard_normal((3, 4)), rng.standard_normal(4)
    for k in range(8):
        x = rng.standard_normal((6, 3))
        (v, (gW, gb)), (ve, (gWe, gbe)) = jf(x, W, b), f(x, W, b)
        for a, e in ((v, ve), (gW, gWe), (gb, gbe)):
            np.testing.assert_allclose(a.data, e.data, rtol=1e-10, atol=1e-12)
        if k == 3:
            background.wait()
        W = W - 0.1 * gWe.data
    assert jf.cache_info()["fallbacks"] == 0
