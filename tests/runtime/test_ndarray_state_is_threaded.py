"""An ndarray a jitted function stores as state (`S['h'] = x.grad.data`, `self.buf =
x.data[::-1]`, in a dict, an object, a Layer, a list or a module global) is threaded
through compiled calls as a Variable is: compiled, the state after the call is what
eager leaves there, the same buffer (an argument's, a .grad's, a captured array's, or
a view of it; a new array for a computed one), and the next call reads it. A NumPy
scalar stored there (`x.data.sum()`) runs eagerly, the warning names it as the user
wrote it, not as the tracer holds it, and the state holds it as eager's does (not the
tracer).

Each test runs the jitted function beside the eager one on twin state, 5 calls with new
values (the state reset to None once), and compares results, the state's values,
class, identity and aliases (tracejit.testing.fuzz.harness._aliases).
"""
import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F
from tracejit.testing.fuzz.harness import _aliases

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")

class Box:
    pass


def _holder(kind):
    """(write(v), read()) of a place the function stores its state in."""
    if kind == "dict":
        d = {"h": None}
        return (lambda v: d.__setitem__("h", v)), (lambda: d["h"])
    if kind == "list":
        L = [None]
        return (lambda v: L.__setitem__(0, v)), (lambda: L[0])
    b = tj.layers.Layer() if kind == "layer" else Box()
    b.h = None
    return (lambda v: setattr(b, "h", v)), (lambda: b.h)


def _grad(x):
    F.sum(x * x).backward()
    return x.grad.data


def _seed(x):
    F.reshape(x, x.shape).backward()
    return x.grad.data


STORED = {
    "argument's data": lambda x, A: x.data,
    "a view of it": lambda x, A: x.data[:, ::-1],
    "a computed .grad": lambda x, A: _grad(x),
    "a view of a .grad": lambda x, A: _grad(x)[::-1],
    "the seed's .grad": lambda x, A: _seed(x),
    "a captured array": lambda x, A: A,
    "a computed value's": lambda x, A: F.tanh(x).data,
}


def _side(store, holder, jit):
    A = np.arange(6.0).reshape(3, 2)
    if holder == "global":
        # A module global of its own per side (eager's and jit's calls interleave).
        ns = {"F": F, "store": store, "A": A, "H": None}
        exec("def f(x):\n"
             "    global H\n"
             "    x.cleargrad()\n"
             "    old = H\n"
             "    H = store(x, A)\n"
             "    y = F.sin(x)\n"
             "    return (y if old is None else y + old), x\n", ns)
        f, read, write = ns["f"], (lambda: ns["H"]), (lambda v: ns.__setitem__("H", v))
    else:
        write, read = _holder(holder)

        def f(x):
            x.cleargrad()
            old = read()
            write(store(x, A))
            y = F.sin(x)
            return (y if old is None else y + old), x
    return (tj.jit(f) if jit else f), read, (lambda: write(None)), A


def _record(fn, read, A, call):
    x = tj.Variable(np.random.default_rng(call).uniform(-1.0, 1.0, (3, 2)))
    y, same = fn(x)
    h = read()
    return [np.array(y.data, copy=True), same is x, type(h).__name__, h is x.data,
            x.grad is not None and h is x.grad.data, h is A,
            _aliases(h, [x], {"A": A}, [y]), np.array(h, copy=True)]


@pytest.mark.parametrize("holder", ["dict", "object", "layer", "list", "global"])
@pytest.mark.parametrize("stored", sorted(STORED))
def test_stored_ndarray_state_is_eagers_buffer(stored, holder):
    (fe, re_, xe, Ae), (fj, rj, xj, Aj) = (_side(STORED[stored], holder, jit)
                                           for jit in (False, True))
    for call in range(5):
        if call == 3:
            xe(), xj()             # reset_state(): the None signature again
        a, b = _record(fe, re_, Ae, call), _record(fj, rj, Aj, call)
        for u, v in zip(a, b):
            if isinstance(u, np.ndarray):
                np.testing.assert_allclose(v, u, rtol=1e-12)
            else:
                assert u == v
    assert fj.cache_info()["hits"] >= 1


def test_a_numpy_scalar_stored_runs_eagerly_named_as_written(record_jit_warnings):
    S = {"h": None}

    def f(x):
        S["h"] = x.data.sum()
        return F.sin(x)
    fj = tj.jit(f)
    for call in range(4):
        x = tj.Variable(np.random.default_rng(call).uniform(-1.0, 1.0, (3, 2)))
        y = fj(x)
        np.testing.assert_allclose(y.data, np.sin(x.data))
        assert type(S["h"]) is np.float64 and S["h"] == x.data.sum()
    messages = [str(w.message) for w in record_jit_warnings]
    assert any("S['h'] (np.float64(" in m and "-> np.float64(" in m for m in messages), \
        messages
    assert not any("TracedArray" in m for m in messages), messages
