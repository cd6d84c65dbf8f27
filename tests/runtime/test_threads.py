"""One jitted function called from several threads: correct results, and a cold kernel
cache compiles once.
"""
import threading
import warnings

import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F
from tracejit import Variable


pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")


def f_threads(x, W):
    # A longer chain: tracing takes long enough for the threads to overlap.
    h = F.matmul(x, W)
    for _ in range(40):
        h = F.tanh(h) * 1.01 + 0.01
    return F.sum(h ** 2)


def test_threads_correct_results():
    """4 threads, one cold jitted function: every call gets eager's value and gradient."""
    try:
        for rep in range(3):
            _run_threads(tj.jit(f_threads), rep)
            assert tj.Config.enable_backprop is True
    finally:
        tj.Config.enable_backprop = True     # a failure must not leak into other tests


def test_threads_cold_cache_compiles_once():
    for rep in range(5):
        jf = tj.jit(f_threads)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                _run_threads(jf, rep, check=False)
            finally:
                tj.Config.enable_backprop = True
        info = jf.cache_info()
        assert info["variants"] == 1, info


def _run_threads(jf, seed, check=True):
    f = f_threads
    r = np.random.default_rng(100 + seed)
    n_threads, n_calls = 4, 6
    inputs = [[(r.standard_normal((3, 4)), r.standard_normal((4, 2))) for _ in range(n_calls)]
              for _ in range(n_threads)]
    results = [[None] * n_calls for _ in range(n_threads)]
    errors = []
    barrier = threading.Barrier(n_threads)

    def work(k):
        try:
            barrier.wait()
            for i, (x, W) in enumerate(inputs[k]):
                Wv = Variable(W.copy())
                y = jf(x, Wv)
                y.backward()
                results[k][i] = (y.data.copy(),
                                 None if Wv.grad is None else Wv.grad.data.copy())
        except BaseException as e:       # pragma: no cover - reported below
            errors.append(e)

    ts = [threading.Thread(target=work, args=(k,)) for k in range(n_threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if not check:
        return
    assert not errors, errors
    assert tj.Config.enable_backprop is True
    for k in range(n_threads):
        for i, (x, W) in enumerate(inputs[k]):
            Wv = Variable(W.copy())
            y = f(x, Wv)
            y.backward()
            np.testing.assert_allclose(results[k][i][0], y.data, rtol=1e-10)
            assert results[k][i][1] is not None, f"thread {k} call {i}: no gradient"
            np.testing.assert_allclose(results[k][i][1], Wv.grad.data, rtol=1e-10)
    assert jf.cache_info()["fallbacks"] == 0, jf.cache_info()
