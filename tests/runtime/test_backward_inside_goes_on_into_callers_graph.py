"""A backward inside a jitted function goes on into the caller's graph, as eager's does.

`loss.backward()` inside f reaches the arguments and captured Variables f was given;
where one has a creator (the caller's graph, or the output of an earlier compiled
call), eager's walk goes on past it into the graph from before the call, giving the
caller's leaves their gradients and clearing the non-leaf ones. A compiled call computes
the .grad its part of the walk leaves on those Variables, then goes on from all of them
at once (one walk: each upstream Function runs once, on the summed cotangent), with the
inner backward's retain_grad. Each program runs eagerly and jitted on twin caller graphs,
at least 4 calls with new values (and captured Parameters changed), comparing results,
the .grad of every Variable of the caller's graph (None where eager gives None) and how
often each upstream Function's backward ran; no call falls back.
"""
import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F
from tracejit.core import Function

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")


def _val(v):
    return None if v is None else np.asarray(v.data if isinstance(v, tj.Variable) else v)


def _same(a, b, what=""):
    a, b = _val(a), _val(b)
    assert (a is None) == (b is None), (what, a, b)
    if a is not None:
        np.testing.assert_allclose(b, a, rtol=1e-9, atol=1e-12, err_msg=what)


class Counted(Function):
    """An upstream Function of the caller's graph that counts its backward steps."""

    def __init__(self, log):
        self.log = log

    def forward(self, x):
        return np.sin(x)

    def backward(self, gy):
        self.log.append(1)
        return gy * F.cos(self.inputs[0])


def _calls(f, make_args, n=5, hits=2):
    """f eager and jitted on twin caller graphs `make_args(rng)` builds n times;
    compares results and the .grad of every Variable of each graph."""
    jf = tj.jit(f)
    rng = np.random.default_rng(0)
    for i in range(n):
        seed = int(rng.integers(1 << 30))
        e_vars, e_args = make_args(np.random.default_rng(seed))
        j_vars, j_args = make_args(np.random.default_rng(seed))
        _same(f(*e_args), jf(*j_args), f"call {i}: result")
        for k, (ev, jv) in enumerate(zip(e_vars, j_vars)):
            _same(ev.grad, jv.grad, f"call {i}: .grad of caller's Variable {k}")
            assert (ev.creator is None) == (jv.creator is None)
    info = jf.cache_info()
    assert info["fallbacks"] == 0 and info["hits"] >= hits, info
    return jf


def test_an_argument_from_the_callers_graph():
    def f(x):
        y = F.sum(F.tanh(x) * x)
        y.backward()
        return y

    def make(rng):
        a = tj.Variable(rng.standard_normal(3))
        x = F.sin(a)
        return [a, x], (x,)
    _calls(f, make)


def test_arguments_sharing_upstream_functions_give_one_walk():
    """x1 and x2 both come from u = Counted(a): eager runs its backward once, on the
    sum of what x1 and x2 pass back; so must the compiled call."""
    logs = {}

    def f(x1, x2, w):
        loss = F.sum(x1 * x2 * w) + F.sum(F.exp(x2))
        loss.backward()
        return loss

    def make(rng):
        log = []
        a = tj.Variable(rng.standard_normal(4))
        u = Counted(log)(a)
        x1, x2 = u * 2.0, F.tanh(u)
        w = tj.Variable(rng.standard_normal(4))
        logs.setdefault("all", []).append(log)
        return [a, u, x1, x2, w], (x1, x2, w)
    _calls(f, make, n=6)
    # (Eager's and the jitted call's graphs alternate; a call checked against eager
    # runs eager on the jitted call's graph too: the last calls are plain hits.)
    runs = [len(log) for log in logs["all"]]
    assert runs[0::2] == [1] * 6 and runs[-5::2] == [1] * 3, runs


def test_a_non_leaf_argument_whose_grad_is_set_and_retain_grad():
    """x.grad set before the call: the inner backward adds to it, the walk goes on from
    the sum; with retain_grad every .grad on the way stays, else the non-leaf ones are
    cleared (None after the call, as eager's)."""
    for retain in (False, True):
        def f(x, w):
            y = F.sum(F.sin(x * w))
            y.backward(retain_grad=retain)
            return y

        def make(rng):
            a = tj.Variable(rng.standard_normal((2, 3)))
            u = F.exp(a)
            x = u * 0.5
            x.grad = tj.Variable(rng.standard_normal((2, 3)))
            w = tj.Parameter(rng.standard_normal(3))
            return [a, u, x, w], (x, w)
        _calls(f, make)


def test_a_captured_variable_with_a_creator():
    """f captures x, a result of the caller's graph: every call's backward goes on
    past x to a, whose .grad collects them all (x's is cleared each time)."""
    def make():
        rng = np.random.default_rng(5)
        W = tj.Parameter(rng.standard_normal(3))
        a = tj.Variable(rng.standard_normal(3))
        x = F.cos(a) * 3.0

        def f(z):
            loss = F.sum(F.tanh(x * W) * z)
            loss.backward()
            return loss
        return f, W, a, x
    (f, eW, ea, ex), (jf, jW, ja, jx) = make(), make()
    jf = tj.jit(jf)
    rng = np.random.default_rng(6)
    for i in range(9):
        z = rng.standard_normal(3)
        _same(f(z.copy()), jf(z.copy()), f"call {i}")
        for name, e, j in (("W", eW, jW), ("a", ea, ja), ("x", ex, jx)):
            _same(e.grad, j.grad, f"call {i}: {name}.grad")
        for W in (eW, jW):
            W.data = W.data + 0.1          # a captured Parameter changed between calls
            if i % 2:
                W.cleargrad()
    assert jf.cache_info()["fallbacks"] == 0 and jf.cache_info()["hits"] >= 2


def test_the_reach_into_the_callers_graph_depends_on_data():
    """Which argument the loss comes from is a guard: each branch's variant goes on
    into the caller's graph from its own arguments."""
    def f(x1, x2):
        if F.sum(x1).data > 0:
            loss = F.sum(x1 * x1)
        else:
            loss = F.sum(F.exp(x2) * x1)
        loss.backward()
        return loss

    def make(rng):
        a = tj.Variable(rng.standard_normal(3))
        b = tj.Variable(rng.standard_normal(3))
        x1, x2 = F.sin(a) + rng.standard_normal(), b * a
        return [a, b, x1, x2], (x1, x2)
    _calls(f, make, n=10, hits=4)


def test_a_state_carried_through_earlier_compiled_calls():
    """An RNN-like state h carried between calls without unchain: each call's backward
    goes on through every earlier call's compiled backward (their CompiledFunctions),
    down to h0; W and U collect the gradients of all of them."""
    def make():
        rng = np.random.default_rng(7)
        W = tj.Parameter(rng.standard_normal((3, 3)) * 0.4)
        U = tj.Parameter(rng.standard_normal((3, 3)) * 0.4)
        h0 = tj.Variable(np.zeros((2, 3)) + 0.1)
        box = type("Box", (), {})()
        box.h = h0

        def step(x):
            h = F.tanh(F.matmul(x, W) + F.matmul(box.h, U))
            box.h = h
            loss = F.sum(h * h)
            loss.backward()
            return loss
        return step, box, W, U, h0
    (estep, ebox, eW, eU, eh0), (jstep, jbox, jW, jU, jh0) = make(), make()
    jstep = tj.jit(jstep)
    rng = np.random.default_rng(8)
    for i in range(7):
        x = rng.standard_normal((2, 3))
        _same(estep(x.copy()), jstep(x.copy()), f"call {i}")
        _same(ebox.h, jbox.h, f"call {i}: h")
        for name, e, j in (("W", eW, jW), ("U", eU, jU), ("h0", eh0, jh0)):
            _same(e.grad, j.grad, f"call {i}: {name}.grad")
        assert (ebox.h.creator is None) == (jbox.h.creator is None)
        if i == 3:
            for p in (eW, jW):
                p.data = p.data * 0.9     # the captured Parameters changed
    info = jstep.cache_info()
    assert info["fallbacks"] == 0 and info["hits"] >= 3, info


def test_an_update_after_the_backward_is_one_the_walk_does_not_see():
    """The caller's graph reads K (x = a * K); f updates K in place before its backward
    and after it: eager's walk reads K between the two updates, and so does the
    compiled call's."""
    K = tj.Variable(np.array([1.0, 2.0, 3.0]))

    def f(x):
        K.data *= 0.5
        loss = F.sum(x ** 2)
        loss.backward()
        K.data += 1.0
        return loss

    jf = tj.jit(f)
    rng = np.random.default_rng(3)
    for i in range(5):
        a_data = rng.standard_normal(3)
        out = []
        for fn in (f, jf):
            K.data = np.array([1.0, 2.0, 3.0]) * (1 + i)
            K.cleargrad()
            a = tj.Variable(a_data.copy())
            y = fn(a * K)
            out.append((y, a.grad, K.grad, K.data.copy()))
        for e, j in zip(*out):
            _same(e, j, f"call {i}")
    assert jf.cache_info()["fallbacks"] == 0 and jf.cache_info()["hits"] >= 2


def test_a_grad_read_after_the_walk_that_it_touches_is_read_after_it():
    """W is in the caller's graph and f reads W.grad after its backward (the walk
    there adds to it first): compiled calls run the walk after their graph, then the
    update that reads W.grad again on what the walk left (Variant.walk_read), and
    match eager without falling back."""
    W = tj.Parameter(np.array([0.5, -1.0, 2.0]))

    def f(x):
        loss = F.sum(F.sin(x * W))
        W.cleargrad()
        loss.backward()
        W.data -= 0.1 * W.grad.data
        return loss

    jf = tj.jit(f)
    for i in range(4):
        a_data = np.arange(3.0) + i
        out = []
        W0 = np.array([0.5, -1.0, 2.0]) + i
        for fn in (f, jf):
            W.data = W0.copy()
            a = tj.Variable(a_data.copy())
            y = fn(F.tanh(a * W))
            out.append((y, a.grad, W.grad, W.data.copy()))
        for e, j in zip(*out):
            _same(e, j, f"call {i}")
    info = jf.cache_info()
    assert info["fallbacks"] == 0 and info["hits"] >= 2, info


def test_a_grad_read_after_the_walk_it_reaches_only_later(record_jit_warnings):
    """W is not in the caller's graph when traced, so the variant compiles; a later
    caller's graph that uses W makes the walk touch W.grad, which f reads after it:
    that call does not use the variant (it runs eagerly), and every call matches."""
    W = tj.Parameter(np.array([0.5, -1.0, 2.0]))

    def f(x):
        loss = F.sum(F.sin(x * W))
        W.cleargrad()
        loss.backward()
        W.data -= 0.1 * W.grad.data
        return loss

    jf = tj.jit(f)
    for i in range(8):
        out = []
        W0 = np.array([0.5, -1.0, 2.0]) + 0.1 * i
        for fn in (f, jf):
            W.data = W0.copy()
            a = tj.Variable(np.arange(3.0) + i)
            x = F.tanh(a * W) if i >= 5 else F.tanh(a * 2.0)
            y = fn(x)
            out.append((y, a.grad, W.grad, W.data.copy()))
        for e, j in zip(*out):
            _same(e, j, f"call {i}")
    assert jf.cache_info()["hits"] >= 2, jf.cache_info()


def test_two_backwards_each_going_on_into_the_callers_graph():
    """Two backwards inside f, each reaching the caller's graph through u0 (and x0
    directly): the first with retain_grad, the second adding to x0's .grad, which the
    first walk gave a part too, and to u0's, which it kept; f returns u0.grad after the
    second walk cleared it. Each walk is seeded with what its own backward left."""
    def f(x0, u0, u1):
        l1 = F.mean(F.tanh(x0 * u0))
        l1.backward(retain_grad=True)
        kept = u0.grad * 1.0
        l2 = F.mean(F.sin(u0 * u1)) + F.mean(x0 * x0)
        l2.backward()
        return l2, kept, u0.grad

    def make(rng):
        x0 = tj.Variable(rng.standard_normal(3))
        u0 = F.tanh(x0 * 0.5)
        u1 = F.exp(u0 * 0.5)
        return [x0, u0, u1], (x0, u0, u1)
    jf = tj.jit(f)
    rng = np.random.default_rng(1)
    for i in range(6):
        seed = int(rng.integers(1 << 30))
        (e_vars, e_args), (j_vars, j_args) = make(np.random.default_rng(seed)), \
            make(np.random.default_rng(seed))
        for e, j in zip(f(*e_args), jf(*j_args)):
            _same(e, j, f"call {i}: result")
        for k, (ev, jv) in enumerate(zip(e_vars, j_vars)):
            _same(ev.grad, jv.grad, f"call {i}: .grad of caller's Variable {k}")
    info = jf.cache_info()
    assert info["fallbacks"] == 0 and info["hits"] >= 2, info


def test_create_graph_into_the_callers_graph_runs_eagerly(record_jit_warnings):
    """backward(create_graph=True) inside f going on into the caller's graph: the
    gradients it leaves there carry a history through the call, which compiled calls
    do not give them yet; it runs eagerly, warned, with eager's first- and second-order
    gradients."""
    def f(x):
        y = F.sum(F.tanh(x) * x)
        y.backward(create_graph=True)
        return y

    jf = tj.jit(f)
    for i in range(4):
        a_data = np.random.default_rng(i).standard_normal(3)
        out = []
        for fn in (f, jf):
            a = tj.Variable(a_data.copy())
            fn(F.sin(a))
            g1 = a.grad.data.copy()
            ga = a.grad
            a.cleargrad()
            F.sum(ga * ga).backward()
            out.append((g1, a.grad))
        for e, j in zip(*out):
            _same(e, j, f"call {i}")
    msgs = [str(w.message) for w in record_jit_warnings]
    assert any("create_graph=True" in m for m in msgs), msgs


def test_a_cut_before_the_backward():
    """unchain_backward inside f cuts x1's part of the caller's graph (u and what made
    it included), then a backward goes on past x2 into what is left of it: the
    compiled call repeats the cut before it goes on, so u is a leaf there too."""
    W = tj.Parameter(np.array([0.5, -1.0, 2.0]))

    def f(x1, x2):
        a = F.tanh(x1 * W)
        a.unchain_backward()
        loss = F.sum(a * x2) + F.sum(F.sin(x2))
        loss.backward()
        return loss

    jf = tj.jit(f)
    rng = np.random.default_rng(4)
    for i in range(6):
        d = rng.standard_normal(3)
        out = []
        for fn in (f, jf):
            W.cleargrad()
            a0 = tj.Variable(d.copy())
            u = F.exp(a0 * 0.3)
            x1, x2 = u * 2.0, F.cos(u)
            y = fn(x1, x2)
            out.append((y, a0.grad, u.grad, x1.grad, x2.grad, W.grad))
            assert x1.creator is None and u.creator is None
        for e, j in zip(*out):
            _same(e, j, f"call {i}")
        W.data = W.data * 0.9
    info = jf.cache_info()
    assert info["fallbacks"] == 0 and info["hits"] >= 2, info


@pytest.mark.parametrize("retain", [True, False])
@pytest.mark.parametrize("branch", [True, False])
def test_a_later_backward_from_an_argument_an_earlier_walk_passed(retain, branch):
    """Two backwards inside f, each going on into the caller's graph: the first from u1
    (made by the caller from u0), the second from u0 itself, retaining its .grad. The
    compiled call set u0.grad (the second backward's retained part) with the other
    effects, before the first walk, which then added to it: the caller's leaf L got
    u0's part twice (22 for eager's 16; fuzz program 74, caught only by the first-call
    check, so the call ran eagerly). It is set right before the second walk now."""
    def f(x0, u0, u1):
        if branch:
            loss1 = F.sum(F.tanh(x0 * u1))
        else:
            loss1 = F.sum(x0 * u1) * 2.0
        loss1.backward(retain_grad=False)
        loss3 = F.sum(F.sin(u0) * 3.0)
        loss3.backward(retain_grad=retain)
        return loss3

    def run(fn, call):
        L = tj.Variable(np.array([0.5 + 0.25 * call, -0.25 * call]))
        u0 = L * 2.0
        u1 = F.exp(u0 * 0.5)
        x0 = tj.Variable(np.array([1.0, 0.5]) * (call + 1))
        out = fn(x0, u0, u1)
        got = [out, L.grad, u0.grad, u1.grad, x0.grad]
        out.backward()
        return got + [L.grad, x0.grad]

    jf = tj.jit(f)
    for call in range(5):
        want, got = run(f, call), run(jf, call)
        for k, (e, j) in enumerate(zip(want, got)):
            _same(e, j, f"call {call}, entry {k}")
    info = jf.cache_info()
    assert info["fallbacks"] == 0 and info["hits"] >= 3, info
