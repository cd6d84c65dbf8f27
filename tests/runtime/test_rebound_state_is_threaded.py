"""A Variable the function rebinds where it reaches it (`self.h = h_new`, an RNN's
state) is state threaded through compiled calls: read when the call starts, one more
input of the variant, and the value the function leaves there written back after it,
a result of the call (with the compiled call as its creator, so a backward outside the
call flows through it into the calls before). The state's structure (None, or a
Variable's shape and dtype) selects the variant. Attributes of objects, items of
dicts and lists, closure cells and module globals; what cannot be threaded (a
Parameter set on a Layer, a number, an object with its own __setattr__, a deletion)
runs eagerly, warned, naming the location.

Each test runs the jitted function and the eager one on twin state, calls >= 5 times
with new values (and a captured Parameter changed between calls), and compares
results, the state left behind (values, and identity where eager returns it) and
gradients.
"""
import warnings

import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F
from tracejit import Parameter, Variable
from tracejit.layers import Layer

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")


class Box:
    pass


def _cell():
    """(step, holder, read state, write state) of a tiny recurrent cell."""
    W = Parameter(np.random.randn(3, 3) * 0.5)
    box = Box()
    box.h = None

    def step(x):
        if box.h is None:
            h = F.tanh(x)
        else:
            h = F.tanh(x + F.matmul(box.h, W))
        box.h = h
        return F.sum(h * h)
    return step, box, W


def _twin(make, seed=0):
    np.random.seed(seed)
    e = make()
    np.random.seed(seed)
    j = make()
    return e, j


def _assert_close(a, b):
    if a is None or b is None:
        assert a is None and b is None, (a, b)
        return
    np.testing.assert_allclose(a.data, b.data, rtol=1e-12, atol=1e-14)


def test_attribute_state_compiles_and_carries_the_graph():
    """The book's loop in small: loss summed over calls, backward outside them, through
    every call's compiled backward and the state between them; reset between runs."""
    (estep, ebox, eW), (jstep, jbox, jW) = _twin(_cell)
    jstep = tj.jit(jstep)
    rng = np.random.default_rng(1)
    for seq in range(4):
        ebox.h = jbox.h = None                     # reset_state()
        losses = []
        for fn, box, W in ((estep, ebox, eW), (jstep, jbox, jW)):
            loss = 0
            for k in range(4):
                loss += fn(np.full((2, 3), 0.1 * k) + seq)
            W.cleargrad()
            loss.backward()
            losses.append((loss, box.h, W.grad))
        (le, he, ge), (lj, hj, gj) = losses
        _assert_close(lj, le)
        _assert_close(hj, he)
        _assert_close(gj, ge)
        assert hj.creator is not None            # the call's result, chained
        eW.data -= 0.1 * rng.standard_normal((3, 3))
        jW.data[...] = eW.data
    info = jstep.cache_info()
    assert info["fallbacks"] == 0 and info["variants"] == 2, info
    assert info["calls"] == info["hits"] + info["misses"] + info["fallbacks"]
    assert info["hits"] >= 10, info


def _run_holder(kind):
    """The same state in a cell, a global, a dict item or a list item."""
    W = Parameter(np.random.randn(3) * 0.5)
    ns = {"W": W, "F": F, "np": np}
    if kind == "cell":
        src = ("def make():\n    h = Variable(np.zeros(3))\n"
               "    def step(x):\n        nonlocal h\n        h = F.tanh(x + h * W)\n"
               "        return F.sum(h)\n"
               "    return step, lambda: h\n")
    elif kind == "global":
        src = ("h = Variable(np.zeros(3))\n"
               "def step(x):\n    global h\n    h = F.tanh(x + h * W)\n    return F.sum(h)\n"
               "def make():\n    return step, lambda: globals()['h']\n")
    else:
        init = "{'h': Variable(np.zeros(3))}" if kind == "dict" else "[Variable(np.zeros(3))]"
        key = "'h'" if kind == "dict" else "0"
        src = (f"state = {init}\n"
               f"def step(x):\n    state[{key}] = F.tanh(x + state[{key}] * W)\n"
               f"    return F.sum(state[{key}])\n"
               f"def make():\n    return step, lambda: state[{key}]\n")
    ns["Variable"] = Variable
    exec(compile(src, f"<holder {kind}>", "exec"), ns)
    return ns["make"](), W


@pytest.mark.parametrize("kind", ["cell", "global", "dict", "list"])
def test_other_locations(kind):
    np.random.seed(2)
    (estep, eread), eW = _run_holder(kind)
    np.random.seed(2)
    (jstep, jread), jW = _run_holder(kind)
    jstep = tj.jit(jstep)
    for i in range(6):
        x = np.random.randn(3)
        _assert_close(jstep(x), estep(x))
        _assert_close(jread(), eread())
        eW.data += 0.1
        jW.data += 0.1
    info = jstep.cache_info()
    assert info["fallbacks"] == 0 and info["hits"] >= 3, info


def test_returned_state_is_the_object_left_in_place():
    np.random.seed(3)
    box = Box()
    box.h = Variable(np.zeros((2, 3)))
    W = Parameter(np.random.randn(3, 3))

    @tj.jit
    def step(x):
        box.h = F.tanh(F.matmul(box.h, W) + x)
        return box.h, F.sum(box.h)

    ref = box.h.data.copy()
    for i in range(6):
        x = np.random.randn(2, 3)
        h_in = box.h
        h, s = step(x)
        assert h is box.h and h is not h_in
        ref = np.tanh(ref @ W.data + x)
        np.testing.assert_allclose(h.data, ref, rtol=1e-12)
        W.data *= 0.9
    assert step.cache_info()["hits"] >= 3


def test_state_structure_selects_the_variant():
    """None, then a Variable; a new batch size of the state is a new variant too."""
    (estep, ebox, eW), (jstep, jbox, jW) = _twin(_cell, seed=4)
    jstep = tj.jit(jstep)
    for batch in (2, 2, 5, 2, 5):
        ebox.h = jbox.h = None
        for k in range(4):
            x = np.random.randn(batch, 3)
            _assert_close(jstep(x), estep(x))
            _assert_close(jbox.h, ebox.h)
    info = jstep.cache_info()
    assert info["fallbacks"] == 0 and info["variants"] == 4, info


def test_state_rebound_on_one_branch_only():
    np.random.seed(5)
    box = Box()
    box.best = None
    W = Parameter(np.random.randn(3))

    def step(x):
        y = F.sum(F.tanh(x * W))
        if box.best is None or float(y.data) > float(box.best.data):
            box.best = y
        return y
    ebox = Box()
    ebox.best = None
    jstep = tj.jit(step)

    def estep(x):
        saved, box.best = box.best, ebox.best
        try:
            return step(x)
        finally:
            ebox.best, box.best = box.best, saved
    for i in range(10):
        x = np.random.randn(3)
        e = estep(x)
        j = jstep(x)
        _assert_close(j, e)
        _assert_close(box.best, ebox.best)
        assert (box.best is j) == (ebox.best is e)
    assert jstep.cache_info()["fallbacks"] == 0


def test_trace_leaves_the_state_alone():
    (_, _, _), (jstep, jbox, jW) = _twin(_cell, seed=6)
    jstep = tj.jit(jstep)
    for i in range(3):
        jstep(np.random.randn(2, 3))
    h = jbox.h
    g = jstep.trace(np.random.randn(2, 3))
    assert "matmul" in str(g)
    assert jbox.h is h
    assert jstep.backward_graph(np.random.randn(2, 3)) is not None
    assert jbox.h is h


def test_an_exception_leaves_the_state_as_eager_does():
    np.random.seed(7)
    boxes = [Box(), Box()]
    W = Parameter(np.random.randn(3))

    def make(box):
        def step(x):
            box.h = F.tanh(x * W) if box.h is None else F.tanh(x * W + box.h)
            if float(x.sum()) > 10:
                raise ValueError("too big")
            return F.sum(box.h)
        return step
    for b in boxes:
        b.h = None
    estep, jstep = make(boxes[0]), tj.jit(make(boxes[1]))
    raised = 0
    for i in range(12):
        x = np.full(3, 5.0 if i in (5, 9) else 0.2 * i - 0.5)
        out = []
        for fn in (estep, jstep):
            try:
                out.append(fn(x))
            except ValueError:
                out.append("raised")
        if out[0] == "raised":
            raised += 1
            assert out[1] == "raised"
        else:
            _assert_close(out[1], out[0])
        _assert_close(boxes[1].h, boxes[0].h)
        if out[0] == "raised":
            boxes[0].h = boxes[1].h = None
    assert raised >= 2


class OwnSetattr:
    def __setattr__(self, k, v):
        object.__setattr__(self, k, v)


@pytest.mark.parametrize("what", ["number", "own __setattr__"])
def test_what_cannot_be_threaded_runs_eagerly_naming_it(what, record_jit_warnings):
    # (A Parameter, also one stored as a Layer's attribute, is threaded:
    # test_parameters_stored_as_state.py.)
    np.random.seed(8)
    box = OwnSetattr() if what == "own __setattr__" else \
        Layer() if what == "Parameter on a Layer" else Box()
    box.h = Variable(np.zeros(3)) if what != "number" else 0.0
    W = Parameter(np.random.randn(3))

    def step(x):
        y = F.tanh(x * W)
        if what == "Parameter on a Layer":
            box.h = Parameter(y.data + box.h.data)
        elif what == "number":
            box.h = box.h + 1.0
        else:
            box.h = y + box.h
        return F.sum(y)
    jstep = tj.jit(step)
    for i in range(5):
        x = np.random.randn(3)
        before = box.h
        y = jstep(x)
        np.testing.assert_allclose(y.data, np.tanh(x * W.data).sum(), rtol=1e-12)
        assert box.h is not before
        W.data += 0.1
    msgs = [str(w.message) for w in record_jit_warnings]
    assert any("box.h" in m and "runs eagerly" in m for m in msgs), msgs
    assert jstep.cache_info()["fallbacks"] >= 3


def test_a_deletion_of_threaded_state_runs_eagerly(record_jit_warnings):
    np.random.seed(9)
    box = Box()
    box.h = Variable(np.zeros(3))
    W = Parameter(np.random.randn(3))

    def step(x, drop):
        box.h = F.tanh(x * W + box.h)
        y = F.sum(box.h)
        if drop:
            del box.h
        return y
    jstep = tj.jit(step, static_argnums=1)
    for i in range(4):
        jstep(np.random.randn(3), False)
    h = box.h
    ref = np.tanh(0.5 * W.data + h.data).sum()
    for i in range(3):
        box.h = h
        y = jstep(np.full(3, 0.5), True)
        np.testing.assert_allclose(y.data, ref, rtol=1e-12)
        assert not hasattr(box, "h")
    msgs = [str(w.message) for w in record_jit_warnings]
    assert any("box.h" in m and "deleted" in m for m in msgs), msgs


def test_disable_jit_between_calls():
    (estep, ebox, eW), (jstep, jbox, jW) = _twin(_cell, seed=10)
    jstep = tj.jit(jstep)
    for i in range(8):
        x = np.random.randn(2, 3)
        if i == 4:
            with tj.disable_jit():
                _assert_close(jstep(x), estep(x))
        else:
            _assert_close(jstep(x), estep(x))
        _assert_close(jbox.h, ebox.h)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            eW.data += 0.01
            jW.data += 0.01
    assert jstep.cache_info()["fallbacks"] == 0


def test_state_deleted_between_calls_runs_eagerly(record_jit_warnings):
    """The function then sees no attribute, as eager's does (AttributeError)."""
    (estep, ebox, eW), (jstep, jbox, jW) = _twin(_cell, seed=11)
    jstep = tj.jit(jstep)
    for i in range(5):
        x = np.random.randn(2, 3)
        _assert_close(jstep(x), estep(x))
    del jbox.h
    with pytest.raises(AttributeError):
        jstep(np.random.randn(2, 3))
    assert not hasattr(jbox, "h")
    msgs = [str(w.message) for w in record_jit_warnings]
    assert any("box.h" in m and "holds nothing" in m for m in msgs), msgs
    jbox.h = None                  # back: compiled again
    for i in range(4):
        x = np.random.randn(2, 3)
        ebox.h = None if i == 0 else ebox.h
        _assert_close(jstep(x), estep(x))
        _assert_close(jbox.h, ebox.h)
    info = jstep.cache_info()
    assert info["calls"] == info["hits"] + info["misses"] + info["fallbacks"], info


def test_a_backward_inside_that_would_go_past_the_state_compiles():
    """A window that backpropagates inside but cuts the state only sometimes (a static
    flag): the state it starts from may carry the graph of the windows before, which
    eager's backward goes on into (adding to W.grad, which the update then reads); a
    variant traced with a state that had none is not used for one that has, and such a
    call runs the walk, then the update on what it left (Variant.walk_read): no call
    falls back."""
    def make():
        np.random.seed(12)
        W = Parameter(np.random.randn(3) * 0.5)
        box = Box()
        box.h = Variable(np.zeros((2, 3)))

        def window(xs, cut):
            loss = 0
            for x in xs:
                box.h = F.tanh(x + box.h * W)
                loss += F.sum(box.h)
            W.cleargrad()
            loss.backward()
            if cut:
                loss.unchain_backward()
            W.data -= 0.05 * W.grad.data
            return loss
        return window, box, W
    (ewin, ebox, eW), (jwin, jbox, jW) = make(), make()
    jwin = tj.jit(jwin, static_argnums=1)
    rng = np.random.default_rng(13)
    for cut in [True] * 5 + [False, True, False, False, True, False]:
        xs = rng.standard_normal((2, 2, 3)) * 0.5
        _assert_close(jwin(xs, cut), ewin(xs, cut))
        _assert_close(jW, eW)
        _assert_close(jbox.h, ebox.h)
        assert (jbox.h.creator is None) == (ebox.h.creator is None)
    info = jwin.cache_info()
    assert info["hits"] >= 2 and info["fallbacks"] == 0, info
