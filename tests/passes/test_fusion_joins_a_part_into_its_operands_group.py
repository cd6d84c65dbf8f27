"""Fusion's _join_operand_group (passes/fusion.py): a part of a fused group that reads a
computed array of exactly one other group of its iteration shape is computed in that
group's kernel. An unrolled LSTM window with its backward inside (the book's step 60 in
small, W7's form): the backward's seed broadcast to the loss's shape joined the last
step's loss group, and with it every step's loss gradient dy_k = seed * (2 / n * diff_k)
and its sum_to (the bias's gradient), a kernel of its own per step after split_group.
With the step each dy_k is in step k's loss group: steps - 1 kernel calls fewer, the
steps' loss kernels one structure. Counts of graph.summary() with the step off and on,
and jit against eager (values, gradients, updated parameters) over calls with new values.
"""
import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F
import tracejit.layers as L
from tracejit.backends.numba.plan import split_group
from tracejit.ir import check
from tracejit.passes import fusion

from lstm_window import assert_step_matches, lstm_window

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")


def _lstm_program(seed, steps, hidden=3, batch=2):
    return lstm_window(seed, steps=steps, hidden=hidden, batch=batch)


def _rnn_program(seed, steps, features=1, hidden=5):
    # A tanh RNN, the loss of each step summed. One input feature: xs[i] @ W is a
    # broadcast multiply, the steps' loss groups separate groups (as the LSTM's); four:
    # a product, the loss groups one group whose split_group parts already hold each
    # dy_k, and the step leaves the graph as it is.
    rng = np.random.default_rng(seed)
    W = tj.Parameter(rng.standard_normal((features, hidden)) * 0.5)
    U = tj.Parameter(rng.standard_normal((hidden, hidden)) * 0.5)
    V = tj.Parameter(rng.standard_normal((hidden, 1)) * 0.5)
    b = tj.Parameter(np.zeros(1))
    params = [W, U, V, b]

    def window(xs, ts):
        loss = 0
        h = F.tanh(F.matmul(xs[0], W))
        for i in range(steps):
            if i:
                h = F.tanh(F.matmul(xs[i], W) + F.matmul(h, U))
            loss = loss + F.mean_squared_error(F.matmul(h, V) + b, ts[i])
        for p in params:
            p.cleargrad()
        loss.backward()
        for p in params:
            p.data -= 0.1 * p.grad.data
        return loss
    return window, params


def _rnn4(seed, steps):
    return _rnn_program(seed, steps, features=4)


def _xs(rng, steps, batch, features=1):
    return (rng.standard_normal((steps, batch, features)),
            rng.standard_normal((steps, batch, 1)))


def _counts(monkeypatch, make, steps, batch, features=1):
    """(kernels, distinct kernels, materialized, kernels of the loss gradient alone) of
    the window's optimized graph, without and with the step."""
    out = []
    args = _xs(np.random.default_rng(5), steps, batch, features)
    for on in (False, True):
        monkeypatch.setattr(fusion, "JOIN_OPERAND_GROUP", on)
        g = make(0, steps)[0]
        g = tj.jit(g).trace(*args)
        assert check(g)
        s = g.summary()
        labels = [p.fn.label for n in g.nodes if n.kind == "fused"
                  for p in split_group(n) if p.kind == "fused"]
        out.append((s["kernels"], s["distinct_kernels"], s["materialized"],
                    labels.count("reshape_broadcast_to_mul_sum_to")))
    monkeypatch.setattr(fusion, "JOIN_OPERAND_GROUP", True)
    return out


@pytest.mark.parametrize("make, steps, batch, before, after", [
    # Off: steps - 1 kernels of dy_k = seed * (2 / n * diff_k) and its sum_to alone;
    # on: none, each in its step's loss kernel, which then are one kernel structure
    # (distinct kernels - 2). Materialized + 2: the seed's reshape and broadcast_to are
    # NumPy views now (at these sizes _sink_into_reader had moved 2 / n * diff_k into
    # the dy_k kernel already; W7's (30, 1) one was an array, 29 fewer there).
    # (The LSTM's counts since matmul batching joins the first step's gate products
    # too: one cell kernel structure, 3 fewer materialized values.)
    # (Distinct kernels 2-3 fewer on both sides since the first step's loss literal is
    # a kernel argument and the last step's backward runs the other steps' kernels with
    # -0.0 addends: test_kernels_shared_across_a_literal_or_a_missing_addend.py.)
    (_lstm_program, 3, 2, (25, 10, 71, 2), (23, 8, 73, 0)),
    (_lstm_program, 5, 2, (33, 9, 105, 4), (29, 7, 107, 0)),
    (_rnn_program, 3, 6, (15, 7, 32, 2), (13, 5, 34, 0)),
])
def test_each_steps_loss_gradient_joins_its_steps_loss_kernel(
        monkeypatch, make, steps, batch, before, after):
    assert _counts(monkeypatch, make, steps, batch) == [before, after]


def test_a_window_whose_steps_share_a_group_keeps_its_counts(monkeypatch):
    before, after = _counts(monkeypatch, _rnn4, 3, 6, features=4)
    assert before == after
    assert before[3] == 0


@pytest.mark.parametrize("on", [False, True])
@pytest.mark.parametrize("make, steps, batch, features", [
    (_lstm_program, 3, 2, 1), (_lstm_program, 5, 4, 1), (_rnn_program, 3, 6, 1),
    (_rnn4, 3, 6, 4)])
def test_the_window_matches_eager_over_calls(monkeypatch, on, make, steps, batch, features):
    monkeypatch.setattr(fusion, "JOIN_OPERAND_GROUP", on)
    rng = np.random.default_rng(11)
    (f, params), (fe, params_e) = make(1, steps), make(1, steps)
    jf = tj.jit(f)
    for _ in range(6):          # the LSTM's rebound state: a trace, then its threading
        args = _xs(rng, steps, batch, features)
        loss, loss_e = jf(*args), fe(*args)
        assert_step_matches(loss, loss_e, params, params_e)
    info = jf.cache_info()
    assert info["fallbacks"] == 0 and info["hits"] >= 3, info
