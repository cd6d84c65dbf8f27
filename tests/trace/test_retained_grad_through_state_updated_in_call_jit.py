"""A result's .grad retained by the caller's backward (retain_grad=True, another
result computed from it) is eager's cotangent through it, which a replay of eager's
backward computes; where that cotangent reads a value computed from captured state the
call then updates in place (`h4 = F.tanh(h1 * W.data); W.data *= 0.9`), the replay
reads the value the call computed (saved), not one recomputed from the updated buffer
(eager's tanh keeps its output; its Mul reads the buffer as it is then)."""
import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")

VALUES = [-1.2, -0.7, 0.9, -1.1, 1.3, 0.5]


def _make(W):
    def f(x):
        h1 = F.sin(x)
        h4 = F.tanh(h1 * W.data)
        W.data *= 0.9
        return h4 + h1, h1
    return f


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_retained_result_grad_after_inplace_capture_update(dtype):
    # (x an ndarray: the call has no differentiable argument, its compiled backward
    # reads nothing, and only the replay reads the forward's values.)
    W = tj.Parameter(np.array(0.7, dtype))
    f = _make(W)
    jf = tj.jit(f)
    tol = 1e-12 if dtype == np.float64 else 1e-5

    def run(fn, a):
        h5, h1 = fn(np.array(a, dtype))
        (F.sum(h5 * 0.6) + F.sum(h1 * -0.3)).backward(retain_grad=True)
        return [h1.grad.data, h5.grad.data, W.data.copy()]

    for a in VALUES:
        w0 = W.data.copy()
        got = run(jf, a)
        W.data[...] = w0
        W.cleargrad()
        want = run(f, a)
        W.cleargrad()
        for k, (g, e) in enumerate(zip(got, want)):
            np.testing.assert_allclose(g, e, rtol=tol, atol=tol, err_msg=f"x = {a}, entry {k}")
