"""A captured Variable the caller replaces by a new Variable before every call (an
RNN's `state.h = Variable(np.zeros(...))` per sequence, a target recomputed outside)
is read at each call as an argument is, once seen replaced: the function compiles
although the Variable's identity changes every call, and stays eager's: results,
gradients into the new Variable and through it into the caller's graph, the state left
behind, and a new shape (another variant) or None (another variant) in its place.
Attributes, dict items, list items, closure cells and module globals."""
import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")

W = tj.Parameter(np.random.default_rng(0).standard_normal((3, 3)))


class State:
    pass


_G = {"h": None}
H = None            # a module global the function reads (the "global" case)


def _holder(where):
    """(read, write): how the function reads the state, and how the caller sets it."""
    if where == "attr":
        s = State()
        return (lambda: s.h), (lambda v: setattr(s, "h", v))
    if where == "dict":
        d = {}
        return (lambda: d["h"]), (lambda v: d.__setitem__("h", v))
    if where == "list":
        lst = [None]
        return (lambda: lst[0]), (lambda v: lst.__setitem__(0, v))
    if where == "cell":
        h = None

        def read():
            return h

        def write(v):
            nonlocal h
            h = v
        return read, write

    def write(v):
        global H
        H = v
    return (lambda: H), write


def _shape(call):
    return (2, 3) if call in (7, 8) else (1, 3)


@pytest.mark.parametrize("where", ["attr", "dict", "list", "cell", "global"])
def test_a_state_replaced_every_call(where):
    read, write = _holder(where)

    def step(x):
        h = read()
        if h is None:
            return F.sum(F.tanh(F.matmul(x, W)))
        return F.sum(F.tanh(F.matmul(x, W) + h) * h)

    jf = tj.jit(step)
    for call in range(12):
        got = []
        for g in (step, jf):
            W.cleargrad()
            # The caller's graph: the state computed from u outside the call.
            u = tj.Variable(np.full(_shape(call), 0.1 * call))
            h = None if call == 10 else u * 2.0
            write(h)
            x = tj.Variable(np.random.default_rng(call).standard_normal(_shape(call)))
            y = g(x)
            y.backward()
            got.append((float(y.data), W.grad.data.copy(), x.grad.data.copy(),
                        None if h is None else u.grad.data.copy(), read() is h))
        (y0, gw0, gx0, gu0, same0), (y1, gw1, gx1, gu1, same1) = got
        np.testing.assert_allclose(y1, y0, rtol=1e-12, err_msg=f"call {call}")
        np.testing.assert_allclose(gw1, gw0, rtol=1e-12)
        np.testing.assert_allclose(gx1, gx0, rtol=1e-12)
        if gu0 is not None:
            np.testing.assert_allclose(gu1, gu0, rtol=1e-12)
        assert same0 and same1
    assert jf.cache_info()["hits"] >= 4


def test_a_parameter_replaced_every_call_still_retraces_soundly():
    # A Parameter is a Layer's registered weight (its identity is the model's):
    # not threaded, each new one retraces, results stay eager's.
    s = State()

    def f(x):
        return F.sum(x * s.p)
    jf = tj.jit(f, max_variants=3)
    import warnings
    for call in range(6):
        s.p = tj.Parameter(np.full(3, 1.0 + call))
        x = tj.Variable(np.ones(3))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", tj.JitWarning)
            np.testing.assert_allclose(jf(x).data, f(x).data)
