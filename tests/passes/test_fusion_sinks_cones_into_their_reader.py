"""Fusion's _sink_into_reader (passes/fusion.py): an elementwise cone whose only reader
is one fused group of its iteration shape is computed in that group's kernel, not
written to an array by the group the greedy walk put it in. Each pattern: the counts
of graph.summary() with the step off and on (kernel calls, materialized values), and
jit against eager, values and gradients, over calls with new values. Patterns that
must not move (a cone read by two groups, a value read broadcast at a larger shape, a
result) keep their counts and their values.
"""
import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F
import tracejit.layers as L
from tracejit.ir import check
from tracejit.passes import fusion
from tracejit.testing import assert_jit_matches_eager

from lstm_window import assert_step_matches, lstm_window

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")


def _counts(monkeypatch, f, *args):
    """(kernels, materialized) of f's optimized forward graph, without and with the step
    (fusion's later _join_operand_group off: the counts are the sink step's alone; its
    own are in test_fusion_joins_a_part_into_its_operands_group.py)."""
    monkeypatch.setattr(fusion, "JOIN_OPERAND_GROUP", False, raising=False)
    out = []
    for on in (False, True):
        monkeypatch.setattr(fusion, "SINK_INTO_READER", on, raising=False)
        g = tj.jit(f).trace(*args)
        assert check(g)
        s = g.summary()
        out.append((s["kernels"], s["materialized"]))
    monkeypatch.setattr(fusion, "SINK_INTO_READER", True, raising=False)
    return out


def _args(seed, *shapes):
    rng = np.random.default_rng(seed)
    return [tj.Variable(rng.standard_normal(s)) for s in shapes]


# ------------------------------------------------------------ cones that move

def horizontal(x, W, a, b):
    # a * b reads only arguments: the greedy walk puts it into the open group of its
    # shape, tanh's; its reader cannot join that group (the matmul between), so the
    # product was a kernel of its own (split_group) and an array. W7's dy * W_fc.
    h = F.tanh(x)
    y = F.matmul(h, W)
    m = a * b
    return F.sum(F.exp(m + y))


def horizontal_chain(x, W, a, b, c):
    # A cone of three nodes, broadcast operands of three shapes.
    h = F.tanh(x)
    y = F.matmul(h, W)
    m = (a * b) * 0.5 + c
    return F.sum(F.exp(m + y) * y)


def read_twice_in_the_reader(x, W, a, b):
    # The cone's value read by two nodes of its one reader group: it moves.
    h = F.tanh(x)
    y = F.matmul(h, W)
    m = a * b
    return F.sum(F.exp(m + y) * m)


def with_an_index_load(x, W, a, b):
    # A basic-index read (a load: index arithmetic) moves with the add that reads it.
    h = F.tanh(x)
    y = F.matmul(h, W)
    m = a[1:, ::-1] + b
    return F.sum(F.exp(m + y))


@pytest.mark.parametrize("f, shapes, before, after", [
    (horizontal, [(6, 5), (5, 5), (6, 1), (1, 5)], (3, 2), (2, 1)),
    (with_an_index_load, [(6, 5), (5, 5), (7, 5), (1, 5)], (3, 2), (2, 1)),
    (horizontal_chain, [(6, 5), (5, 5), (6, 1), (1, 5), (5,)], (3, 1), (2, 0)),
    (read_twice_in_the_reader, [(6, 5), (5, 5), (6, 1), (1, 5)], (3, 2), (2, 1)),
])
def test_a_cone_moves_into_its_one_reader(monkeypatch, f, shapes, before, after):
    assert _counts(monkeypatch, f, *_args(0, *shapes)) == [before, after]
    info = assert_jit_matches_eager(f, *_args(1, *shapes), calls=4)
    assert info["fallbacks"] == 0


def _lstm_program(seed, hidden=3, steps=3, batch=2):
    """The book's step 60 in small: LSTM + Linear over a window, backward and SGD inside."""
    return lstm_window(seed, steps=steps, hidden=hidden, batch=batch)


def _tanh_step_program(seed):
    rng = np.random.default_rng(seed)
    W = tj.Parameter(rng.standard_normal((5, 4)) * 0.5)
    V = tj.Parameter(rng.standard_normal((4, 3)) * 0.5)

    def step(x):
        # sigmoid(tanh(.)): the gradient's 1 - h * h and 1 - s are computed in the
        # forward's kernel (they read its values) and read only by the backward's.
        h = F.tanh(F.matmul(x, W))
        s = F.sigmoid(h)
        y = F.matmul(s, V)
        loss = F.sum(y * y)
        W.cleargrad()
        V.cleargrad()
        loss.backward()
        W.data -= 0.01 * W.grad.data
        V.data -= 0.01 * V.grad.data
        return loss
    return step, [W, V]


def _xs_lstm(rng):
    return rng.standard_normal((3, 2, 1)), rng.standard_normal((3, 2, 1))


@pytest.mark.parametrize("make, make_args, before, after", [
    (_tanh_step_program, lambda rng: (rng.standard_normal((6, 5)),), (5, 9), (5, 7)),
    # Per step: the backward's dy * W_fc moves into the step's backward kernel (a kernel
    # call less), and the forward cell's 1 - tanh(c) ** 2, 1 - sigmoid(.) terms too.
    # (Materialized 3 fewer since matmul batching joins the first step's gate products.)
    (_lstm_program, _xs_lstm, (27, 89), (25, 71)),
])
def test_a_step_with_backward_inside_moves_its_cones_and_matches_eager(
        monkeypatch, make, make_args, before, after):
    rng = np.random.default_rng(7)
    f, _ = make(0)
    assert _counts(monkeypatch, f, *make_args(rng)) == [before, after]
    (f, params), (fe, params_e) = make(1), make(1)
    jf = tj.jit(f)
    for _ in range(7):          # the LSTM's rebound state: a trace, then its threading
        args = make_args(rng)
        loss, loss_e = jf(*args), fe(*args)
        assert_step_matches(loss, loss_e, params, params_e)
    info = jf.cache_info()
    assert info["fallbacks"] == 0 and info["hits"] >= 4, info


# ------------------------------------------------------------ cones that stay
# Each program also has a cone that moves (k = a * c, read by the same group): the
# counts change by that one cone, nothing more.

def read_by_two_groups(x, W, a, b, c):
    h = F.tanh(x)
    y = F.matmul(h, W)
    m = a * b
    k = a * c
    z = F.matmul(F.exp(m + k + y), W)
    return F.sum(F.sin(m * z))


def read_broadcast(x, W, a, b, c):
    # exp(2a) is (6, 1); its reader's shape is (6, 5): in it, exp would run 5 times
    # per value.
    h = F.tanh(x)
    y = F.matmul(h, W)
    m = F.exp(a * 2.0)
    k = a * c
    return F.sum(F.exp(m + k + y))


def a_result(x, W, a, b, c):
    h = F.tanh(x)
    y = F.matmul(h, W)
    m = a * b
    k = a * c
    return F.sum(F.exp(m + k + y)), m


@pytest.mark.parametrize("f, before, after", [
    (read_by_two_groups, (4, 3), (4, 2)), (read_broadcast, (4, 2), (3, 1)),
    (a_result, (3, 2), (3, 1))])
def test_a_cone_read_elsewhere_or_at_a_larger_shape_stays(monkeypatch, f, before, after):
    shapes = [(6, 5), (5, 5), (6, 1), (1, 5), (1, 5)]
    assert _counts(monkeypatch, f, *_args(0, *shapes)) == [before, after]
    info = assert_jit_matches_eager(f, *_args(2, *shapes), calls=4)
    assert info["fallbacks"] == 0
