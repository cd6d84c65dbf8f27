"""An argument that is also state the function captures is one object, as in eager:
`f(x, W)` with W the closure's Parameter, a captured Parameter or array the function
stores as threaded state (`S['h'] = W`: the next call gets it as an argument and reads
the closure's W too), a captured Parameter's .grad stored as state (`S['h'] = W.grad`,
which backward adds to: W.grad is the argument). The graph reads it as the argument,
so compiled calls hold while it is that object (another object there selects another
variant; it was silently read in W's place), and the first-call check reruns the call
with that relation (it broke it and reported a false "froze a value" or difference).

Each test calls the jitted function beside the eager one on twin state, 6+ calls with
new values and the captured Parameter changed between calls, then passes another
object where the captured one was, and compares results and state with eager's, with
no fallback.
"""
import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")


def _x(call):
    return tj.Variable(np.random.default_rng(call).uniform(-2.0, 2.0, (3, 2)))


def test_a_captured_parameter_passed_as_an_argument():
    def run(jit):
        W = tj.Parameter(np.full((1,), 0.5))

        def f(x, w):
            return F.tanh(x * W) + w

        g = tj.jit(f) if jit else f
        out = []
        for call in range(7):
            w = W if call < 5 else tj.Parameter(np.full((1,), 3.0 + call))
            y = g(_x(call), w)
            F.sum(y).backward()
            out.append((y.data.copy(), W.grad.data.copy(), w.grad.data.copy()))
            W.cleargrad()
            W.data *= 1.25                 # the caller updates it between calls
        return out, g

    (eager, _), (jitted, g) = run(False), run(True)
    for a, b in zip(eager, jitted):
        for u, v in zip(a, b):
            np.testing.assert_allclose(v, u, rtol=1e-12)
    assert g.cache_info()["hits"] >= 3


@pytest.mark.parametrize("kind", ["parameter", "array"])
def test_captured_state_stored_as_threaded_state(kind):
    """`S['h'] = W` (or a captured array): threaded, it is the next call's argument."""
    def run(jit):
        W = tj.Parameter(np.full((1,), 0.5)) if kind == "parameter" else np.full((1,), 0.5)
        S = {"h": None}

        def f(x):
            old = S["h"]
            S["h"] = W
            y = F.tanh(x * W)
            return y if old is None else y * old

        g = tj.jit(f) if jit else f
        out = []
        for call in range(8):
            if call == 5:
                # Another object stored between calls: eager's next call reads the
                # closure's W, and stores it again.
                S["h"] = tj.Parameter(np.full((1,), 3.0)) if kind == "parameter" \
                    else np.full((1,), 3.0)
            y = g(_x(call))
            out.append((y.data.copy(), S["h"] is W))
            if kind == "parameter":
                W.data *= 1.25
            else:
                W *= 1.25
        return out, g

    (eager, _), (jitted, g) = run(False), run(True)
    for (ye, se), (yj, sj) in zip(eager, jitted):
        np.testing.assert_allclose(yj, ye, rtol=1e-12)
        assert se == sj
    assert g.cache_info()["hits"] >= 3


def test_an_accumulating_grad_stored_as_state():
    """`F.sum(x * W).backward(); S['h'] = W.grad`: the next call's W.grad is its
    threaded argument, to which backward adds; compiled from the first check on."""
    def run(jit):
        W = tj.Parameter(np.ones((3, 2)))
        S = {"h": None}

        def f(x):
            F.sum(x * W).backward()
            S["h"] = W.grad
            return F.sin(x)

        g = tj.jit(f) if jit else f
        out = []
        for call in range(8):
            if call == 6:
                W.cleargrad()          # S['h'] is no longer W.grad
            y = g(tj.Variable(np.full((3, 2), float(call + 1))))
            out.append((y.data.copy(), W.grad.data.copy(), S["h"] is W.grad))
        return out, g

    (eager, _), (jitted, g) = run(False), run(True)
    for a, b in zip(eager, jitted):
        np.testing.assert_allclose(b[0], a[0], rtol=1e-12)
        np.testing.assert_allclose(b[1], a[1], rtol=1e-12)
        assert a[2] == b[2]
    info = g.cache_info()
    assert info["fallbacks"] == 0 and info["hits"] >= 3


def test_a_grad_passed_as_an_argument():
    """f(x, W.grad) adding to W.grad: another Variable passed there gives eager's."""
    def run(jit):
        W = tj.Parameter(np.ones((3, 2)))

        def f(x, g):
            F.sum(x * W).backward()
            return F.sin(x) * g

        h = tj.jit(f) if jit else f
        W.grad = tj.Variable(np.ones((3, 2)))
        out = []
        for call in range(7):
            g = W.grad if call < 5 else tj.Variable(np.full((3, 2), 100.0))
            y = h(tj.Variable(np.full((3, 2), float(call + 1))), g)
            out.append((y.data.copy(), W.grad.data.copy()))
        return out, h

    (eager, _), (jitted, h) = run(False), run(True)
    for a, b in zip(eager, jitted):
        for u, v in zip(a, b):
            np.testing.assert_allclose(v, u, rtol=1e-12)
    assert h.cache_info()["hits"] >= 3
