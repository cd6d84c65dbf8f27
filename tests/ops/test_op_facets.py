"""What fusion, remat and the numba backend need to know about an op is declared on the
op's class (its facets, tracejit/ops/primitive.py): a new elementwise op with a kernel
is one class, and no pass or backend tests an op's name."""
import ast
import os

import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F
from tracejit import Variable
from tracejit.ops.primitive import PRIMITIVES, Elementwise
from tracejit.passes import FUSED
from tracejit.testing import assert_jit_matches_eager

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")


# Two ops defined here, outside the library, each one class. Not registered with
# @primitive: the registry's own test lists the library's primitives.

class Cube(Elementwise):
    """x ** 3 as a multiply chain."""

    expr = "{0} * {0} * {0}"

    def forward(self, x):
        return x * x * x

    def backward(self, gy):
        x, = self.inputs
        return gy * (3.0 * x * x)


class Softplus(Elementwise):
    """log(1 + exp(x)): libm calls, so it declares vector math (and is then costly to
    recompute, counts against the kernel size bound, runs as vecmath in float64)."""

    expr = "math.log(1.0 + math.exp({0}))"
    vector_math = True

    def forward(self, x):
        return np.log(1.0 + np.exp(x))

    def backward(self, gy):
        x, = self.inputs
        return gy * F.sigmoid(x)


def _fused_groups(g):
    return [n for n in g.nodes if n.kind == FUSED]


def _op_types(group):
    return {type(m.fn) for m in group.fn.graph.nodes}


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_a_new_elementwise_op_fuses_with_its_neighbours(dtype):
    def f(x, y):
        return F.sum(Cube()(x * 0.5 + y) - F.tanh(y))

    rng = np.random.default_rng(0)
    x = Variable(rng.standard_normal((4, 5)).astype(dtype))
    y = Variable(rng.standard_normal((4, 5)).astype(dtype))
    tol = dict(rtol=1e-4, atol=1e-5) if dtype == np.float32 else {}
    assert_jit_matches_eager(f, x, y, calls=3, **tol)

    jf = tj.jit(f)
    g = jf.trace(x, y)
    (group,) = _fused_groups(g)        # one kernel: the mul, add, cube, tanh, sub, sum
    assert Cube in _op_types(group) and F.Sum in _op_types(group)
    assert F.Tanh in _op_types(group) and F.Mul in _op_types(group)
    assert g.summary()["kernels"] == 1
    assert "def k_" in g.source
    # Its gradient traces through Cube.backward and fuses too.
    bg = jf.backward_graph(x, y)
    assert _fused_groups(bg) and bg.summary()["kernels"] >= 1


def test_a_new_vector_math_op_uses_vecmath_and_its_gradient_matches():
    def f(x):
        return F.sum(Softplus()(x) * x)

    rng = np.random.default_rng(1)
    x = Variable(rng.standard_normal((64,)))
    assert_jit_matches_eager(f, x, calls=3)
    g = tj.jit(f).trace(x)
    (group,) = _fused_groups(g)
    assert Softplus in _op_types(group)
    # vector_math: the kernel calls tracejit's vector math, not libm.
    assert "vm.exp64(" in g.source and "vm.log64(" in g.source


def test_a_new_op_jit_values_and_gradients_over_calls():
    # Eager and jit side by side, each call with new values, gradient included.
    def f(x):
        return F.sum(Cube()(x) * 2.0 + Softplus()(x))

    jf = tj.jit(f)
    rng = np.random.default_rng(2)
    for _ in range(4):
        xd = rng.standard_normal((3, 7))
        xe, xj = Variable(xd.copy()), Variable(xd.copy())
        ye, yj = f(xe), jf(xj)
        ye.backward()
        yj.backward()
        np.testing.assert_allclose(yj.data, ye.data, rtol=1e-12)
        np.testing.assert_allclose(xj.grad.data, xe.grad.data, rtol=1e-12)
    assert jf.cache_info()["fallbacks"] == 0


def test_facets_of_the_library_ops():
    vector = {name for name, cls in PRIMITIVES.items() if cls.vector_math}
    assert vector == {"Exp", "Log", "Tanh", "Sigmoid", "Sin", "Cos"}
    assert {n for n, c in PRIMITIVES.items() if c.checks_trig_range} == {"Sin", "Cos"}
    combine = {n: c.reduction_combine for n, c in PRIMITIVES.items()
               if c.reduction_combine is not None}
    assert combine == {"Sum": np.add, "SumTo": np.add, "Max": np.maximum,
                       "Min": np.minimum}
    assert [PRIMITIVES[n].reduction_identity for n in ("Sum", "Max", "Min")] == \
        [0.0, -np.inf, np.inf]
    # remat: libm math is costly to recompute, x ** 2 is not, x ** 0.3 is.
    assert not F.Exp().cheap_to_recompute() and F.Mul().cheap_to_recompute()
    assert F.Pow(2).cheap_to_recompute() and not F.Pow(0.3).cheap_to_recompute()
    assert not F.PowV().cheap_to_recompute()
    # reduced_axes: a sum over axis 1 of a 3-d iteration space; sum_to (2, 1, 4).
    assert F.Sum((1,), False).reduced_axes(3) == ({1}, [0, 2])
    assert F.Sum((1,), True).reduced_axes(3) == ({1}, [0, None, 2])
    assert F.SumTo((3, 1)).reduced_axes(3) == ({0, 2}, [1, None])


# ---------------------------------------------------------------- no name tests

_STAGES = ("passes", "backends", "ir", "trace", "runtime")


def _op_name_strings():
    """(file, line, text) of string constants in the stage packages that are an op's
    class name: the way code outside an op's class used to ask which op a node is."""
    names = set(PRIMITIVES)
    root = os.path.dirname(tj.__file__)
    found = []
    for stage in _STAGES:
        for dirpath, _, files in os.walk(os.path.join(root, stage)):
            for fname in files:
                if not fname.endswith(".py"):
                    continue
                path = os.path.join(dirpath, fname)
                with open(path, encoding="utf-8") as fh:
                    tree = ast.parse(fh.read(), path)
                for node in ast.walk(tree):
                    where = (os.path.relpath(path, root), getattr(node, "lineno", 0))
                    if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                            and node.value in names:
                        found.append(where + (node.value,))
                    # n.op.__name__ == ..., type(n.fn).__name__ in (...)
                    if isinstance(node, ast.Compare) and any(
                            isinstance(x, ast.Attribute) and x.attr == "__name__"
                            and ast.unparse(x.value) in ("n.op", "node.op", "type(n.fn)")
                            for x in [node.left] + node.comparators):
                        found.append(where + (ast.unparse(node),))
    return found


def test_no_stage_outside_the_ops_names_an_op():
    assert _op_name_strings() == []
