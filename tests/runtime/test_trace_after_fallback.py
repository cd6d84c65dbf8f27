"""`f.trace(*args)` and `f.backward_graph(*args)` after these arguments fell back for good:
the graph traced for them, marked NOT RUN with the check's reason, where a variant was
traced and then demoted by a check against eager; else a RuntimeError that says they run
eagerly, why, and at which line (an escape stops the trace: there is no graph).
Neither runs the function (no call counted)."""
import os
import tempfile

import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F

# A number kept in a file, where the tracer does not look: its value is frozen, and the
# check against eager finds the compiled variant's results unlike eager's once the
# caller changes it.
_HELD = os.path.join(tempfile.mkdtemp(prefix="tracejit-held-"), "k.txt")


def _hold(k):
    with open(_HELD, "w") as fh:
        fh.write(repr(k))


def with_frozen_value(x):
    with open(_HELD) as fh:
        k = float(fh.read())
    return F.tanh(x) * 2.0 + k


def with_escape(x):
    h = F.tanh(x) * 2.0
    m = np.asarray(x.data.tolist()).mean()     # .tolist(): read outside the tracer
    return h * m


def test_a_demoted_signature_shows_its_graph_marked_not_run(record_jit_warnings):
    jf = tj.jit(with_frozen_value)
    for i in range(5):
        x = np.linspace(-1.0, 1.0, 4) * (i + 1)
        _hold(0.5 * i)
        got = jf(tj.Variable(x))
        want = with_frozen_value(tj.Variable(x))
        np.testing.assert_allclose(got.data, want.data, rtol=1e-12)
    assert any("differs from eager" in str(w.message) for w in record_jit_warnings)
    calls = jf.cache_info()["calls"]
    g = jf.trace(tj.Variable(np.ones(4)))
    text = str(g)
    assert "forward, optimized; NOT RUN" in text and "differs from eager" in text
    assert "tanh" in text
    raw = jf.trace(tj.Variable(np.ones(4)), optimized=False)
    assert "forward, as traced; NOT RUN" in str(raw)
    b = jf.backward_graph(tj.Variable(np.ones(4)), optimized=False)
    assert b is not None and "backward, as traced; NOT RUN" in str(b)
    assert jf.cache_info()["calls"] == calls     # trace() is not a call


def test_an_escaped_signature_says_why_it_has_no_graph(record_jit_warnings):
    jf = tj.jit(with_escape)
    for i in range(4):
        x = np.linspace(-1.0, 1.0, 3) * (i + 1)
        np.testing.assert_allclose(jf(tj.Variable(x)).data,
                                   with_escape(tj.Variable(x)).data, rtol=1e-12)
    with pytest.raises(RuntimeError) as e:
        jf.trace(tj.Variable(np.ones(3)))
    msg = str(e.value)
    assert "runs eagerly for them" in msg and ".tolist() of traced data" in msg
    assert "test_trace_after_fallback.py:" in msg        # the line of the escape
    with pytest.raises(RuntimeError, match="runs eagerly"):
        jf.backward_graph(tj.Variable(np.ones(3)))
