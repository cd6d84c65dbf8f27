"""Structurally identical kernels share one compiled function.

A loop unrolled by tracing (an RNN / LSTM window: N identical cells) gives N fused groups
of one structure, forward and backward. Their kernels must be one source text, so one
numba dispatcher compiled once (in process and on disk), however large N is:
  - constants that differ between the copies (the step's index into xs[i], a slice's
    start) are kernel arguments, not literals;
  - a group that horizontal fusion made of unrelated chains (Adam's update of several
    parameters, the steps' loss gradients) is split into its independent parts, so
    each part is one of N identical kernels instead of one kernel N times as large.
Counts only: kernels built and numba compilations, never timings.
"""
import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F
import tracejit.layers as L
from tracejit import optimizers
from tracejit.backends.numba import cache as kcache
from tracejit.backends.numba import plan as codegen
from tracejit.models import Model
from tracejit.testing import assert_jit_matches_eager

pytestmark = pytest.mark.usefixtures("kernel_cache_dir", "jit_warnings_are_errors")

H, B, I = 5, 4, 2


def kernels(source):
    """The distinct kernel sources of a plan's source, and how many calls it makes."""
    parts = source.split("\n# kernel\n")
    calls = sum(1 for ln in parts[0].splitlines() if "_k" in ln and "# " in ln
                and ln.strip().startswith("_k"))
    return set(parts[1:]), calls


def lstm_window(n):
    """An LSTM cell in F.* calls, unrolled over n steps of xs; the loss over all steps."""
    def window(xs, ts, h, c, Wx, Wh, b):
        loss = 0
        for i in range(n):
            z = F.matmul(xs[i], Wx) + F.matmul(h, Wh) + b
            f = F.sigmoid(z[:, :H])
            g = F.sigmoid(z[:, H:2 * H])
            o = F.sigmoid(z[:, 2 * H:3 * H])
            u = F.tanh(z[:, 3 * H:])
            c = f * c + g * u
            h = o * F.tanh(c)
            loss = loss + F.mean_squared_error(F.sum(h, axis=1, keepdims=True), ts[i])
        return loss
    return window


def lstm_args(n, rng):
    return (rng.standard_normal((n, B, I)), rng.standard_normal((n, B, 1)),
            rng.standard_normal((B, H)), rng.standard_normal((B, H)),
            tj.Parameter(rng.standard_normal((I, 4 * H)) * 0.5),
            tj.Parameter(rng.standard_normal((H, 4 * H)) * 0.5),
            tj.Parameter(rng.standard_normal(4 * H) * 0.1))


def test_unrolled_lstm_cells_share_their_kernels_forward_and_backward():
    rng = np.random.default_rng(0)
    seen = {}
    for n in (3, 6, 12, 20):
        f = tj.value_and_grad(lstm_window(n), argnums=(2, 3, 4, 5, 6))
        if n <= 12:
            info = assert_jit_matches_eager(f, make_args=lambda k, n=n: lstm_args(n, rng),
                                            calls=3, backward=False)
            assert info["fallbacks"] == 0
        built = kcache.STATS["kernels_built"]
        compiled = codegen.stats()["numba_compilations"]
        jf = tj.jit(f)
        for k in range(4):
            args = lstm_args(n, rng)
            got = jf(*args)
            if n > 12:
                want = f(*args)
                np.testing.assert_allclose(got[0].data, want[0].data, rtol=1e-9)
                for a, b in zip(got[1], want[1]):
                    np.testing.assert_allclose(a.data, b.data, rtol=1e-9, atol=1e-12)
        g = jf.trace(*args)
        distinct, calls = kernels(g.source)
        summary = g.summary()
        assert (summary["kernels"], summary["distinct_kernels"]) == (calls, len(distinct))
        seen[n] = (distinct, calls, kcache.STATS["kernels_built"] - built,
                   codegen.stats()["numba_compilations"] - compiled)
    # The distinct kernels do not grow with the window: the cells' kernels, and the
    # gradient sums over the steps in pieces of 8, 4, 2 and 1 terms.
    assert len(seen[20][0]) == len(seen[12][0]) <= 16, {n: len(s[0]) for n, s in seen.items()}
    assert len(seen[3][0]) <= len(seen[12][0])
    # ... while the calls grow with n (the cells are not merged into one kernel).
    assert seen[20][1] > seen[12][1] > seen[6][1] > seen[3][1]
    # 20 cells compile nothing that 12 cells did not (19 = 8 + 8 + 2 + 1 terms, 11 = 8
    # + 2 + 1): one dispatcher per structure, and numba does not recompile it for
    # arguments of the same types.
    assert seen[20][2] == 0 and seen[20][3] == 0, seen[20][2:]


def test_indexed_steps_share_one_kernel():
    # xs[i] * w + ts[i] for each i: int indices are kernel arguments, and the steps,
    # fused horizontally into one group, are split again into identical parts.
    def f(xs, ts, w, n):
        return [F.tanh(xs[i] * w + ts[i]) for i in range(n)]
    rng = np.random.default_rng(1)
    counts = {}
    for n in (2, 5):
        info = assert_jit_matches_eager(
            lambda xs, ts, w, n=n: f(xs, ts, w, n),
            make_args=lambda k, n=n: (rng.standard_normal((n, 3, 4)),
                                      rng.standard_normal((n, 3, 4)),
                                      tj.Variable(rng.standard_normal(4))), calls=3)
        assert info["fallbacks"] == 0
        jf = tj.jit(lambda xs, ts, w, n=n: f(xs, ts, w, n))
        xs, ts, w = rng.standard_normal((n, 3, 4)), rng.standard_normal((n, 3, 4)), \
            rng.standard_normal(4)
        for _ in range(3):
            got = jf(xs, ts, w)
        for i in range(n):
            np.testing.assert_allclose(got[i].data, np.tanh(xs[i] * w + ts[i]), rtol=1e-12)
        counts[n] = kernels(jf.trace(xs, ts, w).source)
    assert len(counts[2][0]) == len(counts[5][0]) == 1
    assert counts[5][1] == 5


def test_the_first_block_of_an_axis_shares_the_other_blocks_kernel():
    # x[:, 0:n], x[:, n:2n], ... each read by one chain of one structure: the zero start
    # of the first block is a kernel argument as the others' are (a literal 0 made its
    # own kernel: W7's Adam update of the first gate's column block of the joined
    # weight-gradient product). A whole axis (x[:, :]) keeps the literal.
    n = 3

    def f(x):
        return [F.tanh(x[:, k * n:(k + 1) * n]) * 2.0 + 1.0 for k in range(4)]
    rng = np.random.default_rng(5)
    info = assert_jit_matches_eager(f, make_args=lambda k: (rng.standard_normal((2, 4 * n)),),
                                    calls=3)
    assert info["fallbacks"] == 0
    jf = tj.jit(f)
    for _ in range(3):
        x = rng.standard_normal((2, 4 * n))
        got = jf(x)
        for k in range(4):
            np.testing.assert_allclose(got[k].data, np.tanh(x[:, k * n:(k + 1) * n]) * 2 + 1,
                                       rtol=1e-12)
    distinct, calls = kernels(jf.trace(x).source)
    assert len(distinct) == 1 and calls == 4, distinct


def test_independent_chains_split_and_a_shared_input_keeps_them_fused():
    # Four independent chains of one shape: one kernel source, four calls. Chains that
    # read one input whole stay one kernel (that input is read once).
    def apart(a, b, c, d):
        return [F.tanh(x) * 2.0 + 1.0 for x in (a, b, c, d)]

    def shared(x):
        return [F.tanh(x) * 2.0 + 1.0, F.sin(x) * 3.0]
    rng = np.random.default_rng(2)
    info = assert_jit_matches_eager(apart, *[rng.standard_normal((3, 4)) for _ in range(4)])
    assert info["fallbacks"] == 0
    assert_jit_matches_eager(shared, rng.standard_normal((3, 4)))
    ja, js = tj.jit(apart), tj.jit(shared)
    xs = [rng.standard_normal((3, 4)) for _ in range(4)]
    for _ in range(3):
        ja(*xs)
        js(xs[0])
    distinct, calls = kernels(ja.trace(*xs).source)
    assert len(distinct) == 1 and calls == 4
    distinct, calls = kernels(js.trace(xs[0]).source)
    assert len(distinct) == 1 and calls == 1


class _Net(Model):
    def __init__(self):
        super().__init__()
        self.rnn = L.LSTM(H)
        self.fc = L.Linear(1)

    def forward(self, x):
        return self.fc(self.rnn(x))


def _training_window(n):
    """The book's step-60 window (LSTM layer, Adam, backward inside), the state (h, c)
    an argument and a result, xs and ts arguments."""
    def make():
        np.random.seed(3)
        m = _Net()
        x0 = np.zeros((B, 1))
        m(x0)
        m(x0)
        m.rnn.reset_state()
        opt = optimizers.Adam().setup(m)

        def window(xs, ts, h, c):
            m.rnn.h, m.rnn.c = h, c
            loss = 0
            for i in range(n):
                loss = loss + F.mean_squared_error(m(xs[i]), ts[i])
            m.cleargrads()
            loss.backward()
            loss.unchain_backward()
            opt.update()
            h, c = m.rnn.h, m.rnn.c
            m.rnn.reset_state()
            return loss, h, c
        return m, window
    return make


def test_lstm_training_window_kernels_do_not_grow_with_the_window():
    rng = np.random.default_rng(4)
    distinct = {}
    for n in (12, 20):
        make = _training_window(n)
        m_e, w_e = make()
        m_j, w_j = make()
        w_j = tj.jit(w_j)
        se = sj = (None, None)
        built = kcache.STATS["kernels_built"]
        for k in range(4):
            xs, ts = rng.standard_normal((n, B, 1)), rng.standard_normal((n, B, 1))
            le, *se = w_e(xs, ts, *se)
            lj, *sj = w_j(xs, ts, *sj)
            np.testing.assert_allclose(lj.data, le.data, rtol=1e-9, atol=1e-12)
            for a, b in zip(sj, se):
                np.testing.assert_allclose(a.data, b.data, rtol=1e-9, atol=1e-12)
            for p, q in zip(m_j.params(), m_e.params()):
                np.testing.assert_allclose(p.data, q.data, rtol=1e-9, atol=1e-12)
        assert w_j.cache_info()["fallbacks"] == 0
        distinct[n] = (kernels(w_j.trace(xs, ts, *sj).source)[0],
                       kcache.STATS["kernels_built"] - built)
    # The same kernels, no more (the gradient sums over 11 and 19 steps: pieces of 8, 2
    # and 1 terms); the longer window built no new kernel.
    assert distinct[20][0] == distinct[12][0] and len(distinct[12][0]) <= 16
    assert distinct[20][1] == 0
