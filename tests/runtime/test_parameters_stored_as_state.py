"""A Parameter the function stores as state (made in the call, `S['h'] =
Parameter(...)`, or a captured Parameter rebound into a holder) is threaded through
compiled calls as a Variable is: the state after each call is a Parameter (Layer.params()
and optimizers take it as one), the very object eager stores where eager stores one it
already had, with eager's .grad. As an attribute of a Layer (which registers it in its
params()) it is not threaded: that runs eagerly, warned
(test_rebound_state_is_threaded.py).

Each test runs the jitted function beside the eager one on twin state, 5 calls with new
values and the captured Parameter changed between calls, and compares results, the
stored state (class, identity, value, .grad) and the gradients a backward leaves.
"""
import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F
from test_stored_state_aliases_as_in_eager import _assert_same, _holder

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")

HOLDERS = ["dict", "object", "list"]


def _side(body, holder, jit):
    write, read = _holder(holder)
    W = tj.Parameter(np.linspace(-1.0, 1.0, 6).reshape(3, 2), name="W")

    def f(x):
        p = body(x, W, read())
        write(p)
        y = F.sum(F.tanh(x * p) * W)
        return y, x
    return (tj.jit(f) if jit else f), W, read


def _record(fn, W, read, call, before):
    rng = np.random.default_rng(call)
    x = tj.Variable(rng.uniform(-1.0, 1.0, (3, 2)))
    y, _ = fn(x)
    h = read()
    y.backward()
    rec = [np.array(y.data), type(h).__name__, h is W, h is before, h.name,
           np.array(h.data, copy=True)]
    rec += [None if v.grad is None else np.array(v.grad.data, copy=True) for v in (x, W, h)]
    W.cleargrad()
    W.data += 0.25            # the captured Parameter changes between calls
    return rec, h


def _compare(body, holder):
    eager, jitted = _side(body, holder, False), _side(body, holder, True)
    before = [None, None]
    for call in range(5):
        want, before[0] = _record(*eager, call, before[0])
        got, before[1] = _record(*jitted, call, before[1])
        for field, (a, b) in enumerate(zip(want, got)):
            try:
                _assert_same(a, b)
            except AssertionError as e:
                raise AssertionError(f"call {call}, field {field}: {e}") from None
    info = jitted[0].cache_info()
    assert info["fallbacks"] == 0 and info["hits"] >= 2, info


BODIES = {
    "made of computed data": lambda x, W, h: tj.Parameter(x.data * 2.0),
    "made from the previous one": lambda x, W, h: tj.Parameter(
        x.data if h is None else h.data * 0.5 + x.data, name="h"),
    "made of new data": lambda x, W, h: tj.Parameter(np.full((3, 2), 0.5)),
    "made of the argument's data": lambda x, W, h: tj.Parameter(x.data),
    "the captured one": lambda x, W, h: W,
    "kept once stored": lambda x, W, h: tj.Parameter(x.data * 0.5) if h is None else h,
}


@pytest.mark.parametrize("holder", HOLDERS)
@pytest.mark.parametrize("what", list(BODIES))
def test_a_parameter_stored_as_state_is_eagers(what, holder):
    _compare(BODIES[what], holder)


@pytest.mark.parametrize("where", ["last", "first"])
def test_a_parameter_stored_on_a_layer_is_registered_as_eagers(where):
    """`self.h = Parameter(...)` on a Layer: threaded, and the Layer's params() (their
    order too: an optimizer walks them) are eager's after every call, also after the
    caller unregisters it (`m.h = None`) between calls."""
    def run(jit):
        class M(tj.layers.Layer):
            def __init__(self):
                super().__init__()
                if where == "first":
                    self.h = tj.Parameter(np.zeros(3), name="h")
                self.W = tj.Parameter(np.full((3,), 0.5), name="W")
                if where == "last":
                    self.h = None
                self.V = tj.Parameter(np.full((3,), 0.25), name="V")
        m = M()

        def step(x):
            y = F.tanh(x * m.W) * m.V
            prev = m.h
            m.h = tj.Parameter(y.data * 0.5 if prev is None else
                               prev.data * 0.5 + y.data, name="h")
            return F.sum(y * m.h)
        g = tj.jit(step) if jit else step
        out = []
        for call in range(7):
            if call == 4:
                m.h = None
            y = g(tj.Variable(np.random.default_rng(call).uniform(-1.0, 1.0, (3,))))
            y.backward()
            out.append(([p.name for p in m.params()], np.array(y.data),
                         m.h.data.copy(), m.h.grad.data.copy(), m.W.grad.data.copy()))
            m.cleargrads()
            m.W.data *= 1.1
        return out, g

    (eager, _), (jitted, g) = run(False), run(True)
    for a, b in zip(eager, jitted):
        assert a[0] == b[0]
        for u, v in zip(a[1:], b[1:]):
            np.testing.assert_allclose(v, u, rtol=1e-12)
    info = g.cache_info()
    assert info["fallbacks"] == 0 and info["hits"] >= 2, info
