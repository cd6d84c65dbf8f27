"""The checks of a variant against eager (trace time and first call).

They compare results on values (NumPy and Python scalars with the arrays' tolerance,
dtypes exactly), kinds and identity, and at trace time gradients too: backward from
both results with the same random cotangents. A difference demotes the variant with a
warning that names it; a match within tolerance does not. The checks leave no trace
in live state (.grad included) and compile no backward the program does not run.
"""
import importlib
import math

import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F
from tracejit import Parameter, Variable
from tracejit.runtime.checking import first_difference, gradient_difference, identity_difference
from tracejit.testing import assert_jit_matches_eager
from tracejit.testing.checks import assert_call_matches_eager
from tracejit.trace.records import Form, Leaf

jit_module = importlib.import_module("tracejit.runtime.jitted")
# Where a jitted call is traced (the record the runtime builds variants from).
call_module = importlib.import_module("tracejit.trace.call")
pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")


def _nudged(obj, ulps):
    """obj with each float scalar moved by `ulps` units in the last place."""
    if isinstance(obj, tuple):
        return tuple(_nudged(x, ulps) for x in obj)
    if isinstance(obj, np.floating):
        for _ in range(ulps):
            obj = np.nextafter(obj, type(obj)(np.inf))
        return obj
    if type(obj) is float:
        for _ in range(ulps):
            obj = math.nextafter(obj, math.inf)
        return obj
    return obj


@pytest.fixture
def compiled_scalars_off_by(monkeypatch):
    """Make the compiled runs the checks see give float scalars `n` ulps off."""
    def set_ulps(n):
        run = jit_module.Jitted._run
        monkeypatch.setattr(jit_module.Jitted, "_run",
                            lambda self, v, leaves: _nudged(run(self, v, leaves), n))
    return set_ulps


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("check", [False, True])
def test_a_one_ulp_scalar_difference_is_a_match(compiled_scalars_off_by, dtype, check):
    compiled_scalars_off_by(1)

    def f(x):
        h = F.tanh(x)
        return h, h.data.sum(), float(h.data.sum() > 0)

    jf = tj.jit(f, check=check)
    rng = np.random.default_rng(0)
    for _ in range(6):
        xv = rng.standard_normal(5).astype(dtype)
        # all three outputs: kinds and dtypes exactly, values within rtol=1e-6
        got = assert_call_matches_eager(jf, f, Variable(xv), backward=False, atol=1e-12)
        assert type(got[1]) is dtype
    assert jf.cache_info()["fallbacks"] == 0


def test_a_scalar_far_off_demotes_the_variant(compiled_scalars_off_by):
    compiled_scalars_off_by(1 << 20)

    def f(x):
        return F.exp(x), x.data.sum()

    jf = tj.jit(f)
    with pytest.warns(tj.JitWarning, match=r"output\[1\]"):
        for _ in range(4):
            xv = np.random.randn(3).astype(np.float32)
            assert_call_matches_eager(lambda x: jf(x)[1], lambda x: f(x)[1], Variable(xv),
                                      backward=False, atol=1e-12)  # eager's, after demotion


def test_the_trace_check_sees_the_grad_a_backward_inside_sets(monkeypatch):
    """The trace-time check reruns from the .grad a captured Parameter had before the
    traced call (None), not from the one the traced call's backward left: from that,
    the variant's grad-None guard fails and the check passes without comparing. A
    compiled run leaving W.grad doubled is seen on the tracing call itself."""
    W = Parameter(np.linspace(-1.0, 1.0, 4), name="W")
    run = jit_module.Jitted._run

    def doubling(self, v, leaves, *a):
        out = run(self, v, leaves, *a)
        if W.grad is not None:
            W._grad = Variable(W.grad.data * 2.0)
        return out
    monkeypatch.setattr(jit_module.Jitted, "_run", doubling)

    def f(x):
        loss = F.sum(F.tanh(x * W))
        loss.backward()
        return loss

    jf = tj.jit(f)
    for call in range(4):
        x = Variable(np.random.default_rng(call).normal(size=4))
        if call == 1:                      # the tracing call: its check demotes
            with pytest.warns(tj.JitWarning, match=r"W\.grad"):
                jf(x)
        else:
            jf(x)
        want = 1.0 - np.tanh(x.data * W.data) ** 2
        np.testing.assert_allclose(W.grad.data, want * x.data)   # eager's, after demotion
        W.cleargrad()
        W.data = W.data + 0.125
    assert jf.cache_info()["fallbacks"] == 3


def test_scalar_comparison_keeps_kind_and_dtype_exact():
    a32 = np.float32(1.0)
    assert first_difference(a32, np.nextafter(a32, np.float32(2))) is None
    assert first_difference(a32, np.float64(1.0)) is not None
    assert first_difference(np.float64(1.0), 1.0) is not None
    assert first_difference(1.0, 1.0 + 1e-12) is None
    assert first_difference(1.0, 1.001) is not None
    assert first_difference(np.int64(3), np.int64(3)) is None
    assert first_difference(np.int64(3), np.int64(4)) is not None
    assert first_difference(np.bool_(True), np.bool_(False)) is not None
    assert first_difference({"a": 1}, {"b": 1}) is not None


def test_identity_difference_sees_repeats_arguments_and_data():
    x = Variable(np.ones(3))
    y = Variable(np.ones(3))
    y2 = Variable(np.ones(3))
    assert identity_difference((y, y), (y, y2)) is not None
    assert identity_difference((y, y2), (y, y)) is not None
    assert identity_difference((x, y), (Variable(np.ones(3)), y), known=[x]) is not None
    assert identity_difference((x, y), (x, y2), known=[x]) is None
    assert identity_difference((y, y.data), (y2, y2.data)) is None
    assert identity_difference((y, y.data), (y2, y.data)) is not None


def test_gradient_difference_compares_values_and_none():
    x = Variable(np.array([0.5, -1.0]))
    p = Variable(np.array([2.0, 3.0]))
    y = F.exp(x) * p
    assert gradient_difference((y, y), (y, y), [("x", x), ("p", p)]) is None
    other = F.exp(x) * 2.0        # no path to p
    d = gradient_difference(y, other, [("x", x), ("p", p)])
    assert d is not None and "x" in d
    d = gradient_difference(y, Variable(y.data.copy()), [("x", x)])
    assert d is not None and "None compiled" in d
    assert x.grad is None and p.grad is None     # gradients kept aside


def _reintroduce_fan_out_bug(monkeypatch, identity_check=True):
    """The variant of `return y, y` as before the fix: two Variables of one value, the
    second output's cotangent dropped (and, optionally, no identity check)."""
    real = call_module.result_leaves

    def buggy(tr, raw):
        leaves, objs = real(tr, raw)
        return [Leaf("out", tr.value_of(x), Form.VARIABLE)
                if leaf[0] == "same" and isinstance(x, Variable)
                else leaf for x, leaf in zip(raw, leaves)], objs

    monkeypatch.setattr(call_module, "result_leaves", buggy)
    if not identity_check:
        monkeypatch.setattr(jit_module, "identity_difference", lambda *a, **k: None)


def _fan_out(x):
    y = F.exp(F.tanh(x))
    return y, y


def _eager_after_warning(jf, match):
    with pytest.warns(tj.JitWarning, match=match):
        for _ in range(5):
            xv = np.random.randn(3)
            grads = []
            for fn in (_fan_out, jf):
                x = Variable(xv.copy())
                a, b = fn(x)
                assert a is b
                (F.sum(a * 2.0) + F.sum(b * 5.0)).backward()
                grads.append(x.grad.data)
            np.testing.assert_allclose(grads[1], grads[0], rtol=1e-12)
    assert jf.cache_info()["variants"] == 0


def test_the_trace_check_compares_gradients(monkeypatch):
    _reintroduce_fan_out_bug(monkeypatch, identity_check=False)
    _eager_after_warning(tj.jit(_fan_out), r"backward differs .*gradient of argument x")


def test_the_trace_check_compares_identity(monkeypatch):
    _reintroduce_fan_out_bug(monkeypatch)
    _eager_after_warning(tj.jit(_fan_out), r"not the objects eager returns .*output\[1\]")


def test_the_gradient_check_leaves_live_state_and_compiles_no_backward():
    P = Parameter(np.random.randn(3), name="P")
    F.sum(P * P).backward()
    g, gv = P.grad, P.grad.data.copy()

    def f(x):
        return F.sum(F.tanh(P * x)), P * 2.0

    jf = tj.jit(f)
    for _ in range(5):
        x = Variable(np.random.randn(3))
        # no backward: the test is that none is compiled
        got = assert_call_matches_eager(jf, f, x, eager_args=(Variable(x.data.copy()),),
                                        backward=False, atol=1e-12)
        assert x.grad is None and P.grad is g
        np.testing.assert_array_equal(P.grad.data, gv)
    (v,) = [v for vs in jf._variants.values() for v in vs]
    assert v._bexe is None and v.backward_runner is None     # nothing ran backward yet
    got[0].backward()
    assert v._bexe is not None


def test_the_gradient_check_stops_at_a_captured_variables_own_graph():
    # h was computed before the calls, by an op whose backward must not run when the
    # check differentiates the call (it would cost, and a user backward may count).
    calls = []

    class Double(tj.Function):
        def forward(self, x):
            return x * 2.0

        def backward(self, gy):
            calls.append(1)
            return gy * 2.0

    h = Double()(Variable(np.random.randn(3)))

    def f(w):
        return F.sum(F.tanh(h * w))

    jf = tj.jit(f)
    for _ in range(5):
        # no backward: it would go through h's graph
        got = assert_call_matches_eager(jf, f, Variable(np.random.randn(3)),
                                        backward=False, atol=1e-12)
    assert calls == []
    got.backward()              # the user's own backward does go through h's graph
    assert calls == [1]


def test_the_first_call_check_compares_identity(monkeypatch):
    _reintroduce_fan_out_bug(monkeypatch)
    monkeypatch.setattr(jit_module.Jitted, "_perturbation_check", lambda *a: None)
    _eager_after_warning(tj.jit(_fan_out), r"not the objects eager returns .*output\[1\]")


def test_identity_difference_sees_repeated_lists_and_dicts():
    y = Variable(np.ones(3))
    pair = [y]
    assert identity_difference((pair, pair), (pair, [y])) is not None
    d = {"a": y}
    assert identity_difference((d, d), ({"a": y}, {"a": y})) is not None
    assert identity_difference((d, d), (d, d)) is None


def test_the_checks_compare_the_results_grad(monkeypatch):
    # A variant that leaves a result's .grad None where eager's backward inside the
    # call set it (as before results kept it: retain_grad=True) is demoted, warned.
    real = call_module.trace_backward

    def without_result_grads(tr, *a, **k):
        tr.made_grads = []
        return real(tr, *a, **k)

    monkeypatch.setattr(call_module, "trace_backward", without_result_grads)
    W = Parameter(np.random.randn(3))

    # (No intermediate between the results: a .grad retained on one makes the call run
    # eagerly before any check, trace/backward._retained_on_the_way.)
    def step(x):
        y = x * W
        loss = F.sum(y)
        loss.backward(retain_grad=True)
        return loss, y

    jf = tj.jit(step)
    with pytest.warns(tj.JitWarning, match=r"output\[\d\]\.grad is None"):
        for _ in range(5):
            xv = np.random.randn(3)
            res = []
            for fn in (step, jf):
                W.cleargrad()
                loss, y = fn(Variable(xv.copy()))
                res.append((y.grad.data, W.grad.data))
            for a, b in zip(*res):
                np.testing.assert_allclose(b, a, rtol=1e-12)
    assert jf.cache_info()["variants"] == 0


def test_check_mode_agrees():
    g = lambda x, s: F.tanh(x) * s
    jf = tj.jit(g, check=True)
    r = np.random.default_rng(29)
    info = assert_jit_matches_eager(
        g, make_args=lambda i: (Variable(r.standard_normal(3)), float(r.uniform(0.5, 2))),
        jitted=jf, calls=4, rtol=1e-10, atol=1e-12)
    assert info["hits"] >= 1 and info["fallbacks"] == 0
