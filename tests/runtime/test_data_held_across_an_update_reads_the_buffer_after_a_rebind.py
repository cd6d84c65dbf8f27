"""f holds a Variable's data (`v = W.data`: eager wraps it in a Constant aliasing the
buffer), uses it, updates the Variable in place (`W.data *= 0.9`) and uses it again.
Eager's backward reads v's buffer as it is then (updated by the call). When the caller
rebinds `W.data` (or an argument's `x.data`) to a new array before the backward, the
buffer v holds is still the call's: eager's gradient does not change. The compiled
call's replays read the held data as the Variable's new array (`tanh(x * v)` twice:
x.grad 0.52 where eager's is 0.91). Each program: 5 calls with new values, the rebind
between call and backward, plain and create_graph (then a second order), the
gradients compared with eager's; no call falls back."""
import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")


def _program(where):
    W = tj.Parameter(np.array(-0.4))

    def f(x, z):
        held = W if where == "W" else x
        v = held.data
        h = F.tanh(z * v)
        held.data *= 0.9
        return h + F.tanh(z * v) * W
    return f, W


def _grads(where, create_graph, jitted):
    f, W = _program(where)
    fn = tj.jit(f) if jitted else f
    out = []
    for call in range(5):
        rng = np.random.default_rng(55 + call)
        W.data = np.array(-0.4 - 0.05 * call)
        x = tj.Variable(rng.uniform(-1.0, 1.0, (4,)))
        z = tj.Variable(rng.uniform(-1.0, 1.0, (4,)))
        y = fn(x, z)
        held = W if where == "W" else x
        held.data = held.data * 0.5 + 0.125            # rebound: a new array
        F.sum(y * y).backward(create_graph=create_graph)
        gs = [x.grad, z.grad, W.grad]
        row = [None if g is None else g.data.copy() for g in gs]
        if create_graph:
            for a in (x, z, W):
                a.cleargrad()
            sum(F.sum(g * g) for g in gs if g is not None).backward()
            row += [None if a.grad is None else a.grad.data.copy() for a in (x, z, W)]
        W.cleargrad()
        out.append(row)
    if jitted:
        assert fn.cache_info()["fallbacks"] == 0
    return out


@pytest.mark.parametrize("create_graph", [False, True])
@pytest.mark.parametrize("where", ["W", "x"])
def test_held_data_is_the_call_buffer_after_a_rebind(where, create_graph):
    want = _grads(where, create_graph, jitted=False)
    got = _grads(where, create_graph, jitted=True)
    for call, (e_row, j_row) in enumerate(zip(want, got)):
        for k, (a, b) in enumerate(zip(e_row, j_row)):
            where_ = f"call {call}, gradient {k}"
            assert (a is None) == (b is None), where_
            if a is not None:
                np.testing.assert_allclose(b, a, rtol=1e-12, atol=1e-12, err_msg=where_)
