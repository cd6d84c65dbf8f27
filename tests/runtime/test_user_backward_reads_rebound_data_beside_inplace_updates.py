"""A user Function's backward reads `self.inputs[0].data` when it runs, and the call
also updates an input in place (`x.data *= 0.9`, `W.data -= ...` in f): where the
caller then rebinds that Variable's data (`x.data = x.data * 0.5 + 0.125`, the same
for a captured Parameter) before `backward(create_graph=True)`, eager's derivative is
at the new array. The compiled call's create_graph backward replays its joint graph
(an input updated in place keeps it from replaying eager's backward), whose traced
user backward reads the input's data at backward time too, not the array of the call.
Each program: 5 calls with new values, the rebind between call and backward, the
first- and second-order gradients compared with eager's; no call falls back."""
import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F
from detached_tanh import TanhData

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")



def _program(where, before):
    """f and its captured Parameter W; `where`: which Variable f updates in place and
    the user Function reads ("x": the argument, "W": the captured Parameter)."""
    W = tj.Parameter(np.linspace(-1.0, 1.0, 12).reshape(3, 4))

    def update(x):
        if where == "x":
            x.data *= 0.9
        else:
            W.data -= 0.01 * W.data

    def f(x):
        if before:
            update(x)
        h = TanhData()(x) if where == "x" else TanhData()(W) * x
        if not before:
            update(x)
        return F.reshape(h, h.shape + (1,))
    return f, W


@pytest.mark.parametrize("before", [False, True])
@pytest.mark.parametrize("where", ["x", "W"])
def test_backward_reads_the_rebound_array_beside_an_inplace_update(where, before):
    runs = []
    for jitted in (False, True):
        f, W = _program(where, before)
        fn = tj.jit(f) if jitted else f
        got = []
        for call in range(5):
            rng = np.random.default_rng(911 + call)
            x = tj.Variable(rng.uniform(-1.5, 1.5, (3, 4)))
            y = fn(x)
            target = x if where == "x" else W
            target.data = target.data * 0.5 + 0.125         # rebound: a new array
            F.sum(y * y).backward(create_graph=True)
            g = target.grad
            first = g.data.copy()
            x.cleargrad()
            W.cleargrad()
            F.sum(g * g).backward()
            got.append((first, target.grad.data.copy()))
            x.cleargrad()
            W.cleargrad()
        runs.append(got)
        if jitted:
            assert fn.cache_info()["fallbacks"] == 0
    for call, (e, j) in enumerate(zip(*runs)):
        for order, (a, b) in enumerate(zip(e, j), 1):
            np.testing.assert_allclose(b, a, rtol=1e-12, atol=1e-12,
                                       err_msg=f"call {call}, order {order}")
