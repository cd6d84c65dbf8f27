"""The pipeline is data: passes.PIPELINE, a named sequence of Graph -> Graph passes, runs
once on every graph the JIT compiles, before any backend (the interpret backend too),
timed per pass; backends only lower what it returns."""
import warnings

import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F
from tracejit import Variable, passes
from tracejit.passes import FUSED, pipeline
from tracejit.testing import assert_jit_matches_eager

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")


def _mlp_like(x, w):
    h = F.tanh(F.matmul(x, w) * 0.5 + 1.0)
    return F.sum(h * h) / h.shape[0], F.max(F.exp(x[1:, :2]), axis=0)


def _args(seed=0):
    rng = np.random.default_rng(seed)
    return Variable(rng.standard_normal((6, 4))), Variable(rng.standard_normal((4, 3)))


def test_the_pipeline_is_a_named_sequence_of_graph_passes():
    names = [p.__name__ for p in passes.PIPELINE]
    assert names == ["eliminate_dead_code", "fold_constants",
                     "eliminate_common_subexpressions", "eliminate_dead_code",
                     "batch_matmuls", "fuse_conv_epilogues", "fuse"]
    g = tj.jit(_mlp_like).trace(*_args())
    assert set(g.notes["pass_seconds"]) == set(names)
    assert all(t >= 0 for t in g.notes["pass_seconds"].values())


@pytest.mark.parametrize("backend", ["interpret", "numba"])
def test_every_backend_runs_the_optimized_graph(backend):
    jf = tj.jit(_mlp_like, backend=backend)
    x, w = _args()
    g = jf.trace(x, w)
    assert any(n.kind == FUSED for n in g.nodes), g
    assert_jit_matches_eager(_mlp_like, x, w, calls=3, backend=backend)
    bg = jf.backward_graph(x, w)
    assert any(n.kind == FUSED for n in bg.nodes), bg


def test_interpret_and_numba_agree_on_fused_graphs_with_guards():
    def f(x):
        s = F.sum(F.exp(x) * 2.0)
        if float(s) > 20.0:               # a guard between fused groups
            return F.tanh(x * s) + 1.0
        return F.sin(x[::2]) * s

    ji, jn = tj.jit(f, backend="interpret"), tj.jit(f, backend="numba")
    for scale in (0.1, 2.0, 0.2, 3.0):
        xd = np.linspace(-1.0, 1.0, 8) * scale
        xe, xi, xn = Variable(xd.copy()), Variable(xd.copy()), Variable(xd.copy())
        ye, yi, yn = f(xe), ji(xi), jn(xn)
        for y in (ye, yi, yn):
            F.sum(y * y).backward()
        np.testing.assert_allclose(yi.data, ye.data, rtol=1e-12)
        np.testing.assert_allclose(yn.data, ye.data, rtol=1e-12)
        np.testing.assert_allclose(xi.grad.data, xe.grad.data, rtol=1e-12)
        np.testing.assert_allclose(xn.grad.data, xe.grad.data, rtol=1e-12)
    assert ji.cache_info()["fallbacks"] == jn.cache_info()["fallbacks"] == 0


def test_results_the_passes_merge_are_still_two_arrays_on_interpret():
    # CSE merges the two exps into one value; eager returns two arrays.
    def f(x, a):
        return F.exp(x), F.exp(x), a * 1.0, F.exp(a)

    rng = np.random.default_rng(3)
    assert_jit_matches_eager(f, Variable(rng.standard_normal(5)), rng.standard_normal(5),
                             calls=3, backend="interpret")


@pytest.mark.parametrize("backend", ["interpret", "numba"])
def test_each_graph_goes_through_the_pipeline_once(backend, monkeypatch):
    seen = []
    real = pipeline.run_pipeline

    def counting(g, *a, **k):
        seen.append(g.name)
        return real(g, *a, **k)
    monkeypatch.setattr(pipeline, "run_pipeline", counting)
    monkeypatch.setattr(passes, "run_pipeline", counting)
    jf = tj.jit(_mlp_like, backend=backend)
    for seed in range(3):
        x, w = _args(seed)
        loss, _ = jf(x, w)
        loss.backward()
    assert len(seen) == len(set(seen)) == 2, seen      # the forward and the backward


def test_dump_after_a_named_pass(monkeypatch, capsys):
    monkeypatch.setenv("TRACEJIT_DUMP", "fold_constants")
    jf = tj.jit(lambda x: F.exp(x) * (2.0 * 3.0), backend="interpret")
    for k in range(3):                  # warm-up, trace and compile, a compiled call
        x = Variable(np.arange(3.0) + k)
        np.testing.assert_allclose(jf(x).data, np.exp(np.arange(3.0) + k) * 6.0)
    err = capsys.readouterr().err
    assert err.count("# after fold_constants") == 1 and "# after fuse" not in err


def test_a_failing_pass_runs_the_traced_graph_interpreted(monkeypatch):
    def broken(g):
        raise RuntimeError("simulated pass failure")
    monkeypatch.setattr(pipeline, "PIPELINE", (passes.eliminate_dead_code, broken))

    def f(x):
        return F.sum(F.tanh(x) * x)

    jf = tj.jit(f)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for k in range(4):
            xd = np.linspace(-2.0, 2.0, 7) * (k + 1)
            got = jf(Variable(xd))
            np.testing.assert_allclose(got.data, f(Variable(xd)).data, rtol=1e-12)
    msgs = [str(w.message) for w in seen if issubclass(w.category, tj.JitWarning)]
    assert len(msgs) == 1 and "pass broken failed" in msgs[0] and "unoptimized" in msgs[0], msgs
    assert jf.cache_info()["fallbacks"] == 0
