"""The IR (tracejit.ir): a Graph of single-assignment Values in topological order, checked
by ir.check, printed as text, and run by the interpret backend node by node as NumPy
computes it; a guard that does not hold stops the run with GuardFailure."""
import numpy as np
import pytest

import tracejit.functions as F
from tracejit.ir import Graph, Lit, Node, Value, check, interpret
from tracejit.ops.trace_only import GuardFailure

from graph_builder import Builder


def _tanh_of_product():
    b = Builder()
    x, y = b.input((2, 3)), b.input((3,))
    p = b.op(F.Mul(), x, y)
    t = b.op(F.Tanh(), p)
    s = b.op(F.Sum(None, False), t)
    b.guard(b.op(F.Greater(), s, Lit(0.0, np.float64)))
    return b.graph(t, s)


def test_interpret_computes_each_node_as_numpy_does():
    run = interpret.compile(_tanh_of_product())
    rng = np.random.default_rng(0)
    for _ in range(3):
        x, y = rng.uniform(0.1, 1.0, (2, 3)), rng.uniform(0.1, 1.0, 3)
        t, s = run([x, y])
        np.testing.assert_array_equal(t, np.tanh(x * y))
        np.testing.assert_array_equal(s, np.sum(np.tanh(x * y)))


def test_a_guard_that_does_not_hold_stops_the_run():
    run = interpret.compile(_tanh_of_product())
    with pytest.raises(GuardFailure):
        run([-np.ones((2, 3)), np.ones(3)])
    with pytest.raises(ValueError, match="takes 2 inputs"):
        run([np.ones((2, 3))])


def test_check_accepts_a_valid_graph_and_names_what_breaks_one():
    g = _tanh_of_product()
    assert check(g)
    x = g.inputs[0]
    stray = Value((2, 3), np.float64)
    bad = Graph("g", g.inputs, [Node(F.Tanh(), [stray], [Value((2, 3), np.float64)])],
                [x])
    with pytest.raises(AssertionError, match="undefined value"):
        check(bad)
    out = Value((2, 3), np.float64)
    twice = Graph("g", g.inputs, [Node(F.Tanh(), [x], [out]), Node(F.Exp(), [x], [out])],
                  [out])
    with pytest.raises(AssertionError, match="redefines"):
        check(twice)
    wrong = Graph("g", g.inputs, [Node(F.Tanh(), [x], [Value((3,), np.float64)])], [x])
    with pytest.raises(AssertionError, match="shape rule"):
        check(wrong)


def test_the_text_names_inputs_types_and_nodes():
    text = str(_tanh_of_product())
    head, *lines = text.splitlines()
    assert "f64[2, 3]" in head and "f64[3]" in head, text
    assert [line.split(" = ")[1].split()[0].split("[")[0] for line in lines if " = " in line] == \
        ["mul", "tanh", "sum", "greater"], text
    assert any(line.strip().startswith("guard") for line in lines), text
