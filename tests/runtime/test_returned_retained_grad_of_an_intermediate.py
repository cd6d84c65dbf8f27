"""A backward inside the function with retain_grad=True (create_graph=False) leaves a
.grad on an intermediate h, and the function returns h.grad. In eager the returned
Variable and the .grad the caller's walk adds at h are one object, a leaf (no
history: the backward inside kept no graph). So the caller's create_graph backward
through h makes x.grad depend on that very Variable, and a second-order backward
through x.grad reaches it and sets its .grad; and it stops there (no derivative
through the backward inside). Compiled calls link the held .grad to the returned
result and, for one without history, add it as a leaf. Each test calls the jitted
function at least four times with new values, the captured Parameter changed between
calls, compared with eager (values and None-ness); an unexpected fallback fails."""
import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F
from tracejit import Parameter, Variable

W = Parameter(np.array([[0.5, -0.3], [0.2, 0.8], [-0.6, 0.1]]))


def returns_held_grad(x):
    h = F.tanh(x @ W)
    F.sum(F.sin(h * h)).backward(retain_grad=True)      # h.grad stays on h, a leaf
    return F.sum(h * h * 2.0), h.grad


def returns_held_grad_on_a_branch(x):
    h = F.tanh(x @ W)
    k = h * h
    if x.data.sum() > 0:                                 # a variant with no backward inside
        F.sum(F.sin(k)).backward(retain_grad=True)
    return F.sum(k * 2.0 + h), h.grad, x.grad


def returns_held_grad_twice(x):
    # One object in two places: both are the Variable eager's walk adds at h.
    h = F.tanh(x @ W)
    F.sum(F.sin(h * h)).backward(retain_grad=True)
    return F.sum(h * h * 2.0), h.grad, h.grad


def _call(fn, v, retain, preset):
    W.cleargrad()
    x = Variable(v.copy())
    out = fn(x)
    outs = out if isinstance(out, tuple) else (out,)
    rest = [r for r in outs[1:] if r is not None]
    if preset:
        for r in rest:
            if r.grad is None:
                r.grad = Variable(np.full(r.shape, 0.25))
    F.sum(outs[0] * outs[0]).backward(create_graph=True, retain_grad=retain)
    targets = [x, W] + rest
    gs = [t.grad for t in targets]
    first = [None if g is None else g.data.copy() for g in gs]
    for t in targets:
        t.cleargrad()
    loss2 = None
    for g in gs:
        if g is not None:
            term = F.sum(g * g)
            loss2 = term if loss2 is None else loss2 + term
    loss2.backward()
    second = [None if t.grad is None else t.grad.data.copy() for t in targets]
    return first + second + [None if r is None else r.data.copy() for r in outs[1:]]


@pytest.mark.usefixtures("jit_warnings_are_errors")
@pytest.mark.parametrize("retain", [False, True], ids=["", "retain"])
@pytest.mark.parametrize("preset", [False, True], ids=["", "preset"])
@pytest.mark.parametrize("fn", [returns_held_grad, returns_held_grad_on_a_branch,
                                returns_held_grad_twice],
                         ids=lambda f: f.__name__)
def test_second_order_through_a_returned_retained_grad(fn, retain, preset):
    jf = tj.jit(fn)
    rng = np.random.default_rng(11)
    W.data = np.array([[0.5, -0.3], [0.2, 0.8], [-0.6, 0.1]])
    for call in range(8):
        sign = 1.0 if call in (0, 1, 3, 5, 6) else -1.0
        v = rng.uniform(0.1, 0.9, (4, 3)) * sign
        e = _call(fn, v, retain, preset)
        j = _call(jf, v, retain, preset)
        assert len(e) == len(j)
        for k, (a, b) in enumerate(zip(e, j)):
            assert (a is None) == (b is None), (call, k)
            if a is not None:
                np.testing.assert_allclose(b, a, rtol=1e-10, atol=1e-12, err_msg=str((call, k)))
        W.data = W.data * 1.1
    assert jf.cache_info()["hits"] >= 3
    assert jf.cache_info()["fallbacks"] == 0
