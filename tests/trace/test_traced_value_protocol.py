"""The protocol between core and the active trace, and type tests for traced values.

core.TraceHooks declares every method core calls on the active trace; the recording
Trace (jit) and eval_shape's _AbstractTrace subclass it. Which traced value a thing is
comes from its type (core.ScalarTracer, TracedArray, Variable), never from probing for
an attribute such as `_tv`: a user's object may define one, and a traced number must be
taken where the number it stands for is (grad of a float argument under jit).
"""
import ast
import inspect

import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F
from tracejit.testing import assert_call_matches_eager
from tracejit import Function, Variable, core
from tracejit.trace.abstract import _AbstractTrace
from tracejit.trace.record import Trace

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")

# What core calls on the active trace. `call` is the abstract trace's alone (it takes
# each Function call over), `before_forward` and `record` the recording trace's alone.
HOOKS = {"new_variable", "read_data", "write_data", "read_grad", "write_grad", "literal",
         "scalar_input", "before_forward", "record", "call", "backward_of", "backward_outside",
         "input_grads",
         "unchaining"}
ABSTRACT_ONLY = {"call"}
RECORDING_ONLY = {"before_forward", "record"}


def _declared_hooks():
    return {name for name, v in vars(core.TraceHooks).items()
            if inspect.isfunction(v) and not name.startswith("_")}


def _attributes_core_uses_on_the_trace():
    """Every `<name>.<attr>` in core.py where core bound <name> to the active trace
    (`tr = _state.trace`, `prev = _state.trace`)."""
    tree = ast.parse(inspect.getsource(core))
    bound = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Attribute) \
                and node.value.attr == "trace":
            bound.update(t.id for t in node.targets if isinstance(t, ast.Name))
    assert "tr" in bound, bound
    return {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name) and node.value.id in bound}


def test_the_base_declares_exactly_the_hooks_core_calls():
    assert _declared_hooks() == HOOKS
    assert _attributes_core_uses_on_the_trace() == HOOKS | {"abstract"}
    assert core.TraceHooks.abstract is False


@pytest.mark.parametrize("cls", [Trace, _AbstractTrace])
def test_each_trace_implements_every_hook_of_its_kind(cls):
    assert issubclass(cls, core.TraceHooks)
    skipped = RECORDING_ONLY if cls.abstract else ABSTRACT_ONLY
    for name in HOOKS:
        base = getattr(core.TraceHooks, name)
        mine = getattr(cls, name)
        if name in skipped:
            # Function.__call__ never asks this kind of trace: the base's stays.
            assert mine is base, (cls.__name__, name)
            continue
        assert mine is not base, f"{cls.__name__} does not implement {name}"
        want = list(inspect.signature(base).parameters)
        assert list(inspect.signature(mine).parameters) == want, (cls.__name__, name)


def test_the_kinds_of_trace():
    assert Trace.abstract is False and _AbstractTrace.abstract is True


def test_set_trace_takes_a_trace_or_none():
    prev = core.active_trace()
    try:
        with pytest.raises(TypeError, match="TraceHooks"):
            core.set_trace(object())
        assert core.active_trace() is prev
    finally:
        core.set_trace(prev)


def test_jit_of_grad_takes_a_python_float_on_every_call():
    # The float argument is a TracedFloat while tracing: grad takes it as the float it
    # stands for (the second call traced, and once refused it as "a TracedFloat").
    def f(x):
        return x * x + F.sin(Variable(np.array(2.0)) * x)

    g = tj.grad(f)
    jg = tj.jit(g)
    for x in (1.5, -0.25, 3.0, 0.5, 2.75):
        assert_call_matches_eager(jg, g, x, rtol=1e-12, atol=0)
    info = jg.cache_info()
    assert info["fallbacks"] == 0 and info["variants"] == 1, info


def test_jit_of_value_and_grad_takes_python_numbers():
    def f(a, b, n):
        return a * b * b + n * a

    vg = tj.value_and_grad(f, argnums=(0, 1, 2))
    jvg = tj.jit(vg)
    for a, b, n in ((1.0, 2.0, 3), (3.0, -4.0, 5), (0.5, 0.25, -2), (2.0, 1.0, 7)):
        assert_call_matches_eager(jvg, vg, a, b, n, rtol=1e-12, atol=0)
    assert jvg.cache_info()["fallbacks"] == 0


def test_eval_shape_on_shapes():
    def f(x, w):
        return F.sum(F.matmul(x, w), axis=0), F.reshape(x, (-1,))

    out = tj.eval_shape(f, core.ShapeDtype((4, 3), np.float32),
                        core.ShapeDtype((3, 2), np.float32))
    assert out == (core.ShapeDtype((2,), np.float32), core.ShapeDtype((12,), np.float32))
    assert core.active_trace() is None


def test_eval_shape_inside_jit_with_a_float_argument():
    # Under eval_shape the enclosing trace's TracedFloat is an operand (v * s): the
    # abstract trace answers scalar_input too (it once raised AttributeError).
    def f(x, s):
        spec = tj.eval_shape(lambda v: F.sum(v * s, axis=0, keepdims=True), x)
        return x * s, spec

    jf = tj.jit(f)
    for s in (2.0, 3.5, -1.0, 0.25):
        x = Variable(np.arange(6, dtype=np.float32).reshape(2, 3) + s)
        _, spec = assert_call_matches_eager(jf, f, x, s, rtol=1e-6, atol=0)
        assert spec == core.ShapeDtype((1, 3), np.float32)
    assert jf.cache_info()["fallbacks"] == 0


class _HasTracerNames:
    """A user's object that happens to have attributes named like a tracer's."""

    def __init__(self, k):
        self._tv = "not a tracer"
        self._trace = None
        self.k = k


class _ScaleBy(Function):
    def __init__(self, cfg):
        self.cfg = cfg

    def forward(self, x):
        return x * self.cfg.k

    def backward(self, gy):
        return gy * self.cfg.k


def test_a_user_object_with_a_tv_attribute_is_not_a_traced_value():
    # It was taken for a traced number kept by the Function (an escape: a fallback).
    cfg = _HasTracerNames(3.0)

    def f(x):
        return F.sum(_ScaleBy(cfg)(x) * x)

    jf = tj.jit(f)
    rng = np.random.default_rng(0)
    for _ in range(4):
        # Values, dtypes, identity and x's gradient, jit beside eager.
        assert_call_matches_eager(jf, f, Variable(rng.standard_normal(5)), rtol=1e-12,
                                  atol=0)
    assert jf.cache_info()["fallbacks"] == 0


def test_grad_refuses_a_user_object_with_a_tv_attribute():
    with pytest.raises(TypeError, match="_HasTracerNames"):
        tj.grad(lambda x: x)(_HasTracerNames(1.0))
