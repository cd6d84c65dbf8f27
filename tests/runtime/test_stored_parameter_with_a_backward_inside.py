"""A captured Parameter the function stores as state (`S.h = W`, threaded: from the call
that finds it stored, the variant reads W as an argument) whose .grad a backward
inside the function adds to compiles and matches eager. The trace-time check reruns
such a call from the .grad W had before the traced call (the signature keys it), not
from the one the traced call's own backward left there: from that one, eager's rerun
adds its gradient a second time and the variant (keyed on a None .grad) does not, a
difference of the check's making that demoted a correct variant.

Each test runs the jitted function beside the eager one on twin state, 8 calls with new
values, the state reset only before the first two (later calls find W stored), W
changed between calls, and compares results, the stored state, .data and .grad of
the captured Parameters and the argument's gradient after the caller's backward.
"""
import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")

GLOBAL_H = None


class Box:
    pass


class _Side:
    """One side: the function (jitted or not), its captured Parameters W and V, and the
    place it stores W in (a global: saved and put back around each of this side's
    calls, the other side uses the same name)."""

    def __init__(self, holder, jit):
        self.holder, self.saved = holder, None
        self.W = W = tj.Parameter(np.linspace(-1.0, 1.0, 5), name="W")
        self.V = V = tj.Parameter(np.array(0.3), name="V")
        box = self.box = Box()
        box.h = None

        def f(x):
            global GLOBAL_H
            if holder == "global":
                GLOBAL_H = W
            else:
                box.h = W
            h = F.tanh(x * W)
            loss = F.mean(F.tanh(h * V) ** 2)
            V.cleargrad()
            loss.backward()            # adds to W.grad and x.grad too
            V.data -= 0.1 * V.grad.data
            return F.tanh(h * V)
        self.fn = tj.jit(f) if jit else f

    def record(self, i, x, preset):
        global GLOBAL_H
        if i in (0, 1):                # later calls find W stored
            self.saved = self.box.h = None
        if preset and i % 2:
            self.W.grad = tj.Variable(np.full(5, 0.5))
        GLOBAL_H = self.saved
        xv = tj.Variable(x.copy())
        y = self.fn(xv)
        self.saved = GLOBAL_H
        stored = self.saved if self.holder == "global" else self.box.h
        F.sum(y * y).backward()
        rec = [y.data.copy(), xv.grad.data.copy(), self.W.grad.data.copy(),
               self.V.grad.data.copy(), self.V.data.copy(), stored is self.W]
        self.W.cleargrad()
        self.V.cleargrad()
        self.W.data = self.W.data + 0.125      # the captured Parameter changes
        return rec


@pytest.mark.parametrize("preset", [False, True], ids=["grad None", "grad preset"])
@pytest.mark.parametrize("holder", ["global", "object"])
def test_a_stored_parameter_whose_grad_a_backward_inside_adds_to(holder, preset):
    eager, jitted = _Side(holder, False), _Side(holder, True)
    for i in range(8):
        x = np.random.default_rng(i).normal(size=5)
        want, got = eager.record(i, x, preset), jitted.record(i, x, preset)
        for k, (a, b) in enumerate(zip(want, got)):
            np.testing.assert_allclose(b, a, rtol=1e-6, atol=1e-9,
                                       err_msg=f"call {i}, field {k}")
    info = jitted.fn.cache_info()
    assert info["fallbacks"] == 0 and info["hits"] >= 1, info
