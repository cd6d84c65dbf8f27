"""Turning jit off: tj.disable_jit(), a jitted function's .eager, and TRACEJIT_DISABLE (also
set after decoration) run the plain Python function.
"""
import numpy as np
import pytest

import tracejit as tj
from tracejit import Variable

N_CALLS = 6          # >= 5: warm-up, trace, then at least 3 replays


pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")


def _printing(x):
    print("CALLED", float(x.data.sum()))
    return x * 3


def test_disable_jit_runs_plain_python(capsys):
    jf = tj.jit(_printing)
    with tj.disable_jit():
        for i in range(N_CALLS):
            y = jf(Variable(np.arange(2.0) + i))
            np.testing.assert_allclose(y.data, (np.arange(2.0) + i) * 3)
    out = capsys.readouterr().out
    assert out.count("CALLED") == N_CALLS
    assert jf.cache_info()["variants"] == 0


def test_eager_method_runs_plain_python(capsys):
    jf = tj.jit(_printing)
    for i in range(N_CALLS):
        y = jf.eager(Variable(np.arange(2.0) + i))
        np.testing.assert_allclose(y.data, (np.arange(2.0) + i) * 3)
    assert capsys.readouterr().out.count("CALLED") == N_CALLS
    assert jf.cache_info()["variants"] == 0


@tj.jit
def _module_level_jitted(x):
    print("CALLED")
    return x * 3


def test_env_disable_after_decoration(monkeypatch, capsys):
    monkeypatch.setenv("TRACEJIT_DISABLE", "1")
    for i in range(N_CALLS):
        y = _module_level_jitted(Variable(np.arange(2.0) + i))
        np.testing.assert_allclose(y.data, (np.arange(2.0) + i) * 3)
    assert capsys.readouterr().out.count("CALLED") == N_CALLS
    assert _module_level_jitted.cache_info()["variants"] == 0


def test_env_disable(monkeypatch, capsys):
    monkeypatch.setenv("TRACEJIT_DISABLE", "1")
    jf = tj.jit(_printing)
    for i in range(N_CALLS):
        y = jf(Variable(np.arange(2.0) + i))
        np.testing.assert_allclose(y.data, (np.arange(2.0) + i) * 3)
    assert capsys.readouterr().out.count("CALLED") == N_CALLS
    assert jf.cache_info()["variants"] == 0
