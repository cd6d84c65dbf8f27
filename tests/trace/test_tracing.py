"""Tracing (tracejit.trace.record): one run of the function on tracer values records a
graph, as `f.trace(..., optimized=False)` prints it. Each operation on traced values is
one node, in the order it ran, naming the user's line; a float argument is an input, not
a constant; NumPy on `.data` is recorded like the op it is; a branch on traced data is a
guard on the comparison, and only the branch taken is recorded; what the tracer cannot
follow (`.tolist()`) is not recorded, and the call runs eagerly with a JitWarning.
Every test also runs the function compiled, call after call, against eager."""
import os
import re

import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F
from tracejit import Variable
from tracejit.testing import assert_jit_matches_eager

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")

HERE = os.path.basename(__file__)


def _ops(graph_text):
    """The op of each node line (`t3: f64[2] = tanh t2` -> 'tanh'), and 'guard'."""
    ops = []
    for line in graph_text.splitlines()[1:]:
        m = re.match(r"\s+(?:\S+: \S+(?:\[[^\]]*\])?(?:, )?)+ = (\w+)", line)
        if m:
            ops.append(m.group(1))
        elif line.strip().startswith("guard"):
            ops.append("guard")
    return ops


def _args(i=0):
    return [Variable(np.linspace(-1.0, 1.0, 6).reshape(2, 3) + 0.1 * i),
            Variable(np.linspace(0.5, -0.5, 6).reshape(3, 2)), 0.5 + 0.1 * i]


def test_each_operation_is_one_node_in_order_naming_the_users_line():
    def f(x, W, lr):
        h = F.matmul(x, W)              # line A
        return F.sum(F.tanh(h) * lr)

    text = str(tj.jit(f).trace(*_args(), optimized=False))
    assert _ops(text) == ["matmul", "tanh", "mul", "sum"], text
    line = f.__code__.co_firstlineno + 1
    assert f"{HERE}:{line}" in text.splitlines()[1], text
    assert_jit_matches_eager(f, make_args=_args)


def test_a_float_argument_is_an_input_not_a_constant():
    def f(x, W, lr):
        return F.sum(F.matmul(x, W) * lr)

    text = str(tj.jit(f).trace(*_args(), optimized=False))
    assert "lr: f64[]" in text.splitlines()[0], text
    assert "0.5" not in text, text                      # the value is not baked in
    info = assert_jit_matches_eager(f, make_args=_args)
    assert info["variants"] == 1 and info["retraces"] == 0, info


def test_numpy_on_data_is_recorded_as_its_op():
    def f(x, W, lr):
        e = np.exp(x.data) * lr
        return F.sum(F.matmul(Variable(e), W))

    text = str(tj.jit(f).trace(*_args(), optimized=False))
    assert _ops(text)[:2] == ["exp", "mul"], text
    assert_jit_matches_eager(f, make_args=_args)


def test_a_branch_is_a_guard_and_only_the_branch_taken_is_recorded():
    def f(x, W, lr):
        h = F.matmul(x, W)
        if float(F.sum(h).data) > 0:
            return F.sum(F.exp(h))
        return F.sum(F.sin(h))

    x, W, lr = _args()
    text = str(tj.jit(f).trace(x, W, lr, optimized=False))
    ops = _ops(text)
    assert "guard" in ops and "greater" in ops, text
    taken = float(F.sum(F.matmul(x, W)).data) > 0
    assert ("exp" in ops) == taken and ("sin" in ops) != taken, text
    assert_jit_matches_eager(f, make_args=lambda i: [x * (-1.0) ** i, W, lr])


def test_what_the_tracer_cannot_follow_runs_eagerly_with_a_warning():
    def f(x):
        n = len(x.data.tolist())
        return F.sum(x) * n

    jf = tj.jit(f)
    with pytest.warns(tj.JitWarning, match="tolist"):
        for i in range(4):
            x = np.arange(3.0) + i
            np.testing.assert_allclose(jf(Variable(x)).data, f(Variable(x)).data)
    assert jf.cache_info()["fallbacks"] >= 1
