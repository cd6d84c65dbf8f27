"""The records one stage hands the next (tracejit.trace.records): tracing gives a
TracedCall and its BackwardPlan (or a BackwardEscape with its reason); a Variant is built
from those and a compile callable alone, without the Jitted; leaves carry a Form, not a
one-letter tag."""
import io
import pathlib
import threading
import tokenize

import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F
from tracejit import Function, Parameter, Variable
from tracejit.runtime.variant import Variant, compile_graph
from tracejit.trace.call import trace_call
from tracejit.trace.records import (BackwardEscape, BackwardPlan, Effect, Escape, Form,
                                    Leaf, SideEffect, Source, Target, TracedCall)

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")


def _interpret(g):
    return compile_graph(g, "interpret")


def _make_small():
    W = Parameter(np.array([1.0, -2.0, 0.5]), name="W")
    buf = np.zeros(3)

    def f(x, s):
        y = F.sum(F.tanh(x * W)) * s
        np.add(buf, x.data, out=buf)        # a captured array, updated in place
        return y, x
    return f, W, buf


def test_a_traced_call_lists_its_sources_leaves_and_effects():
    f, W, buf = _make_small()
    x = Variable(np.array([0.1, 0.2, 0.3]))
    call = trace_call(f, "f", (x, 2.0), {})
    assert isinstance(call, TracedCall)
    assert call.escapes == [] and call.side_effects == []
    assert call.leaf_forms == [Form.VARIABLE, Form.FLOAT]
    # x and s are the call's argument leaves 0 and 1; W's data and buf are captures,
    # read where they live at each call, of the shape and dtype the trace saw.
    assert call.sources[:2] == [Source("arg", 0, None), Source("arg", 1, None)]
    captured = {s.kind: s for s in call.sources[2:]}
    assert captured["var"].obj is W and captured["var"].spec == ((3,), np.float64)
    assert captured["array"].obj is buf and captured["array"].spec == ((3,), np.float64)
    assert len(call.sources) == len(call.graph.inputs[:call.n_inputs]) == 4
    # The result: a computed Variable, then the argument x itself.
    y_leaf, x_leaf = call.out_leaves
    assert isinstance(y_leaf, Leaf) and y_leaf.kind == "out" and y_leaf.form is Form.VARIABLE
    assert x_leaf == Leaf("arg", 0, Form.VARIABLE)
    # The in-place update of buf, replayed after each compiled call.
    (effect,) = call.effects
    assert isinstance(effect, Effect) and effect.kind == "inplace_array"
    assert effect.target == Target("obj", buf) and effect.target.obj is buf
    # The traced call's own result is eager's: x itself, and buf updated once.
    y, same_x = call.result
    assert same_x is x
    np.testing.assert_allclose(y.data, np.sum(np.tanh(x.data * W.data)) * 2.0)
    np.testing.assert_allclose(buf, x.data)


def test_the_backward_plan_names_what_the_forward_saves_and_the_gradients_sources():
    f, W, buf = _make_small()
    call = trace_call(f, "f", (Variable(np.array([0.1, 0.2, 0.3])), 2.0), {})
    plan = call.backward
    assert isinstance(plan, BackwardPlan)
    # Gradients go to the Variable argument and the captured Parameter.
    assert [s[0] for s in plan.diff_sources] == ["arg", "var"]
    assert plan.diff_sources[1][1] is W
    assert len(plan.grad_slots) == 2 and plan.graph.name == "f_backward"
    assert plan.saved_bytes == sum(v.nbytes for v in plan.saved)
    with pytest.raises(AttributeError):
        plan.graph = None          # frozen: a stage does not edit what it was handed


class _Picky(Function):
    """A user Function whose backward branches on the gradient's values."""

    def forward(self, x):
        return x * 2.0

    def backward(self, gy):
        if float(F.sum(gy).data) > 0:
            return gy * 2.0
        return gy * 3.0


def _picky(x):
    return F.sum(_Picky()(x))


def test_a_backward_that_inspects_values_is_an_escape_with_its_reason():
    call = trace_call(_picky, "picky", (Variable(np.ones(3)),), {})
    assert isinstance(call.backward, BackwardEscape)
    assert call.backward.reason == "the backward pass inspects values"
    assert call.escapes == [Escape(call.backward.reason, None)]
    # The jitted function runs eagerly for it, warned with that reason, and is right.
    jf = tj.jit(_picky)
    with pytest.warns(tj.JitWarning, match="the backward pass inspects values"):
        for i in range(3):
            xv = np.random.default_rng(i).standard_normal(3)
            xj, xe = Variable(xv.copy()), Variable(xv.copy())
            yj, ye = jf(xj), _picky(xe)
            yj.backward()
            ye.backward()
            np.testing.assert_array_equal(yj.data, ye.data)
            np.testing.assert_array_equal(xj.grad.data, xe.grad.data)
    assert jf.cache_info()["variants"] == 0


def test_escapes_come_in_the_order_they_are_reported():
    class Box:
        pass
    box = Box()
    box.count = 0

    def f(x):
        box.count += 1              # a Python value the function changes
        return F.sum(_Picky()(x))
    call = trace_call(f, "f", (Variable(np.ones(3)),), {})
    assert all(type(e) is Escape for e in call.escapes)
    reasons = [e.reason for e in call.escapes]
    assert "changes the Python value" in reasons[0], reasons
    assert reasons[-1] == "the backward pass inspects values"


def test_a_variant_is_built_and_run_from_the_records_without_a_jitted():
    f, W, buf = _make_small()
    x0 = Variable(np.array([0.1, 0.2, 0.3]))
    call = trace_call(f, "f", (x0, 2.0), {})
    compiled = []

    def backend_compile(g):
        compiled.append(g.name)
        return _interpret(g)
    v = Variant(call, call.backward, backend_compile, threading.RLock())
    assert not hasattr(v, "jitted") and compiled == ["f"]
    for i in range(3):
        rng = np.random.default_rng(i)
        xv, s = rng.standard_normal(3), float(rng.uniform(0.5, 2.0))
        W.data = W.data * 1.1               # a captured Parameter changed between calls
        W.cleargrad()
        before = buf.copy()
        xj = Variable(xv.copy())
        yj, same = v.runner([xj, s])
        assert same is xj
        np.testing.assert_allclose(buf, before + xv)          # the effect, replayed
        yj.backward()
        gx, gw = xj.grad.data, W.grad.data
        # Eager on the same values.
        W.cleargrad()
        buf[...] = before
        xe = Variable(xv.copy())
        ye, _ = f(xe, s)
        ye.backward()
        np.testing.assert_allclose(yj.data, ye.data, rtol=1e-12)
        np.testing.assert_allclose(gx, xe.grad.data, rtol=1e-12)
        np.testing.assert_allclose(gw, W.grad.data, rtol=1e-12)
    # The backward compiled lazily, with the compile callable it was given.
    assert compiled == ["f", "f_backward"]


def test_a_jitted_variant_gets_the_jitteds_lock_and_compile_not_the_jitted():
    f, W, buf = _make_small()
    jf = tj.jit(f, backend="interpret")
    for i in range(3):
        xv = np.random.default_rng(i).standard_normal(3)
        W.data = W.data + 0.1
        before = buf.copy()
        yj, _ = jf(Variable(xv.copy()), 1.5)
        after = buf.copy()
        buf[...] = before
        ye, _ = f(Variable(xv.copy()), 1.5)
        np.testing.assert_allclose(yj.data, ye.data, rtol=1e-12)
        np.testing.assert_allclose(after, buf)
    (v,) = [v for vs in jf._variants.values() for v in vs]
    assert v.lock is jf.lock and not hasattr(v, "jitted")
    # Its compile callable is no bound method of the Jitted either: no way back to it.
    assert getattr(v.backend_compile, "__self__", None) is not jf
    assert jf not in getattr(v.backend_compile, "args", ())


def test_signature_keys_hold_forms():
    p = Parameter(np.ones(2))
    jf = tj.jit(lambda a, b, c, d: F.sum(a * p) + F.sum(b) + F.sum(c) * d,
                backend="interpret")
    for i in range(3):
        a, b = Variable(np.full(2, float(i))), Parameter(np.ones(2))
        jf(a, b, np.ones(2), 2.0)
    (key,) = jf._variants
    kinds = [part if isinstance(part, str) else part[2] for part in key[0]]
    assert kinds == [Form.VARIABLE, Form.PARAMETER, Form.ARRAY, Form.FLOAT]
    assert all(type(k) is Form for k in kinds)


_PACKAGE = pathlib.Path(tj.__file__).parent
_TAGS = {"V", "A", "F", "S", "I", "P"}


def _one_letter_strings(path):
    src = path.read_text(encoding="utf-8")
    out = []
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type == tokenize.STRING and tok.string.strip("'\"") in _TAGS \
                and len(tok.string) == 3:
            out.append(f"{path.name}:{tok.start[0]}  {tok.line.strip()}")
    return out


@pytest.mark.parametrize("stage", ["trace", "runtime"])
def test_no_one_letter_tags_are_left(stage):
    """The stages hand each other Forms and records, not "V"/"A"/"F"/"S"/"I"/"P"."""
    found = [hit for path in sorted((_PACKAGE / stage).glob("*.py"))
             for hit in _one_letter_strings(path)]
    assert found == []


def test_a_side_effect_is_recorded_not_an_escape():
    log = []

    def f(x):
        log.append("called")         # runs while tracing only: warned, still compiled
        return F.tanh(x)
    call = trace_call(f, "f", (Variable(np.ones(2)),), {})
    assert call.escapes == []
    (effect,) = call.side_effects
    assert type(effect) is SideEffect and "changing the size of" in effect.what
    assert log == ["called"]
