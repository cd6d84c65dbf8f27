"""A user Function's backward reads `self.inputs[0].data` when it runs: where the caller
rebinds the argument's data (`x.data = x.data * 0.5 + 0.125`) between the call and the
backward, eager's derivative is at the new array. The compiled call's replay (a
create_graph backward, or a backward after a rebind beside a fresh-leaf read of
`x.data` in f) reads the new array there too: only the forward's fresh-leaf reads
(`x.data.sum().item()` in f) hold the array of the call. Each program: 5 calls with
new values, the rebind between call and backward, x.grad compared with eager's; no
call falls back."""
import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F
from detached_tanh import TanhData

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")



def _f(reads_data):
    def f(x):
        if reads_data:
            x.data.sum().item()         # a fresh-leaf read of x's array in the forward
        h = TanhData()(x)
        return F.reshape(h, h.shape + (1,))
    return f


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("create_graph", [False, True])
@pytest.mark.parametrize("reads_data", [False, True])
def test_user_backward_reads_the_rebound_array(reads_data, create_graph, dtype):
    f = _f(reads_data)
    jf = tj.jit(f)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    for call in range(5):
        grads = []
        for fn in (f, jf):
            rng = np.random.default_rng(737 + call)
            x = tj.Variable(rng.uniform(-2.0, 2.0, (2, 1, 5)).astype(dtype))
            y = fn(x)
            x.data = x.data * 0.5 + 0.125
            F.sum(y * y).backward(create_graph=create_graph)
            grads.append(x.grad.data.copy())
        assert grads[1].dtype == grads[0].dtype
        np.testing.assert_allclose(grads[1], grads[0], rtol=tol, atol=tol,
                                   err_msg=f"call {call}")
    assert jf.cache_info()["fallbacks"] == 0
