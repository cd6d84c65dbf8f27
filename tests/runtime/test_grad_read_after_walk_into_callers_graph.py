"""A .grad read after a backward inside a jitted function went on into the caller's graph.

`loss.backward()` inside f goes on past an argument with a creator into the caller's
graph (compiled calls repeat that walk after their graph ran, core.backward_from);
where the caller's graph also uses a Parameter f updates from its .grad afterwards
(`W.data -= lr * W.grad.data`), the .grad f reads is the call's part plus what that
walk added. A compiled call reads it right after the walk and runs the part of its
graph that depends on it then (Trace._walk_read, Variant.walk_read), so nothing falls
back. Each program runs eagerly and jitted on twin worlds (Parameters, caller's
graphs), at least 4 calls with new values, comparing results, every Parameter's data
and .grad and the caller's leaves' .grad (None where eager gives None), dtypes too.
"""
import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")


def _arr(v):
    if v is None:
        return None
    return np.asarray(v.data if isinstance(v, tj.Variable) else v)


def _same(a, b, what, low=False):
    a, b = _arr(a), _arr(b)
    assert (a is None) == (b is None), (what, a, b)
    if a is not None:
        assert a.dtype == b.dtype, (what, a.dtype, b.dtype)
        # (float32, or computed from it (low): the compiled kernels round otherwise
        # than NumPy's.)
        low = low or a.dtype == np.float32
        np.testing.assert_allclose(b, a, rtol=1e-4 if low else 1e-12,
                                   atol=1e-5 if low else 1e-14, err_msg=what)


def _twins(make, call, n=5):
    """make() -> (f, {name: Parameter}); call(f, params, rng) -> {name: what to
    compare}. Both worlds see the same values; the jitted one must never fall back."""
    worlds = []
    for jit in (False, True):
        f, params = make()
        worlds.append((tj.jit(f) if jit else f, params))
    for i in range(n):
        seen = []
        for fn, params in worlds:
            got = call(fn, params, np.random.default_rng(100 + i))
            for k, p in params.items():
                got[f"{k}.data"], got[f"{k}.grad"] = p.data.copy(), p.grad
            seen.append(got)
        for k in seen[0]:
            _same(seen[0][k], seen[1][k], f"call {i}: {k}")
    info = worlds[1][0].cache_info()
    assert info["fallbacks"] == 0 and info["hits"] >= 2, info
    return worlds[1][0]


def _mlp(dtype=np.float64):
    rng = np.random.default_rng(7)
    return {"W1": tj.Parameter(rng.standard_normal((3, 4)).astype(dtype)),
            "W2": tj.Parameter(rng.standard_normal((4, 4)).astype(dtype))}


def test_an_sgd_step_updating_a_parameter_the_callers_graph_uses():
    """The task's training step: h comes from W1 and W2 in the caller's graph, f's
    backward walks on into it and adds to W2.grad (which f's own part set first)
    before f updates W2 from its .grad in place."""
    def make():
        P = _mlp()
        W2 = P["W2"]

        def step(h):
            W2.cleargrad()
            loss = F.sum(F.tanh(h @ W2))
            loss.backward()
            W2.data -= 0.1 * W2.grad.data
            return loss
        return step, P

    def call(f, P, rng):
        x = tj.Variable(rng.standard_normal((5, 3)))
        P["W1"].cleargrad()
        h = F.tanh(F.tanh(x @ P["W1"]) @ P["W2"])
        loss = f(h)
        return {"loss": loss, "x.grad": x.grad, "h.grad": h.grad}
    _twins(make, call)


def test_a_rebind_to_a_new_array_and_a_result_computed_from_the_update():
    """f rebinds W.data to a new 2-D array computed from W.grad (eager's memory order
    kept) and returns a value computed from the updated W, which the caller
    backpropagates through (the saved values of its backward come from after the
    walk too)."""
    def make():
        P = _mlp()
        W2 = P["W2"]

        def step(h):
            W2.cleargrad()
            loss = F.sum(F.sin(h @ W2))
            loss.backward()
            W2.data = W2.data - 0.05 * W2.grad.data * loss.data
            return loss, F.tanh(h @ W2)
        return step, P

    def call(f, P, rng):
        x = tj.Variable(rng.standard_normal((2, 3)))
        P["W1"].cleargrad()
        h = F.tanh(x @ P["W1"]) @ P["W2"]
        loss, y = f(h)
        P["W2"].cleargrad()
        F.sum(y * y).backward()
        return {"loss": loss, "y": y, "x.grad": x.grad}
    _twins(make, call)


def test_an_in_place_update_before_the_backward():
    """W.data is scaled in place before the backward and updated from W.grad after it:
    the part run after the walk reads W as the call found it (a copy), not the buffer
    the first update already changed."""
    def make():
        P = _mlp()
        W2 = P["W2"]

        def step(h):
            loss = F.mean(F.tanh(h @ W2))
            W2.data *= 0.9
            W2.cleargrad()
            loss.backward()
            W2.data -= 0.2 * W2.grad.data
            return loss
        return step, P

    def call(f, P, rng):
        x = tj.Variable(rng.standard_normal((4, 3)))
        P["W1"].cleargrad()
        h = F.tanh(x @ P["W1"]) * F.sum(P["W2"])
        loss = f(h)
        return {"loss": loss, "x.grad": x.grad}
    _twins(make, call)


def test_float32_parameters_and_graph():
    """All float32: the .grad f reads is float32 and so is what the walk adds."""
    def make():
        P = _mlp(np.float32)
        W2 = P["W2"]

        def step(h):
            W2.cleargrad()
            loss = F.sum(F.tanh(h @ W2))
            loss.backward()
            W2.data -= np.float32(0.1) * W2.grad.data
            return loss
        return step, P

    def call(f, P, rng):
        x = tj.Variable(rng.standard_normal((5, 3)).astype(np.float32))
        P["W1"].cleargrad()
        h = F.tanh(x @ P["W1"]) @ P["W2"]
        loss = f(h)
        return {"loss": loss, "x.grad": x.grad}
    _twins(make, call)


def test_a_caller_graph_that_changes_dtype_is_not_read_as_traced(record_jit_warnings):
    """float32 W traced with an all-float32 caller's graph; later callers put a float64
    Variable on W's path, so the walk adds float64 gradients and W.grad becomes float64:
    those calls do not use the variant (float32), and every call matches eager."""
    def make():
        P = _mlp(np.float32)
        W2 = P["W2"]

        def step(h):
            W2.cleargrad()
            loss = F.sum(F.tanh(h @ W2))
            loss.backward()
            W2.data -= 0.1 * W2.grad.data
            return loss
        return step, P

    worlds = [make() for _ in range(2)]
    jf = tj.jit(worlds[1][0])
    fns = [worlds[0][0], jf]
    for i in range(8):
        seen = []
        for fn, (_, P) in zip(fns, worlds):
            rng = np.random.default_rng(300 + i)
            x = tj.Variable(rng.standard_normal((5, 3)).astype(np.float32))
            s = tj.Variable(np.asarray(1.5, np.float64 if i >= 4 else np.float32))
            P["W1"].cleargrad()
            h = F.cast(F.tanh(x @ P["W1"]) @ (P["W2"] * s), np.float32) if i >= 4 else \
                F.tanh(x @ P["W1"]) @ (P["W2"] * s)
            loss = fn(h)
            seen.append([loss, x.grad, s.grad, P["W1"].grad, P["W2"].grad, P["W2"].data])
        for k, (a, b) in enumerate(zip(*seen)):
            _same(a, b, f"call {i}: {k}", low=True)
    assert jf.cache_info()["hits"] >= 2, jf.cache_info()


def test_a_grad_changed_in_place_after_it_is_read_runs_eagerly(record_jit_warnings):
    """f scales W.grad in place after reading it past the walk: a change of the
    caller's state the part after the walk does not make, so it runs eagerly, warned
    at that line, and matches eager."""
    def make():
        P = _mlp()
        W2 = P["W2"]

        def step(h):
            W2.cleargrad()
            loss = F.sum(F.tanh(h @ W2))
            loss.backward()
            W2.data -= 0.1 * W2.grad.data
            W2.grad.data *= 0.5
            return loss
        return step, P

    worlds = [make() for _ in range(2)]
    jf = tj.jit(worlds[1][0])
    for i in range(4):
        seen = []
        for fn, (_, P) in zip([worlds[0][0], jf], worlds):
            rng = np.random.default_rng(500 + i)
            x = tj.Variable(rng.standard_normal((5, 3)))
            P["W1"].cleargrad()
            loss = fn(F.tanh(x @ P["W1"]) @ P["W2"])
            seen.append([loss, x.grad, P["W1"].grad, P["W2"].grad, P["W2"].data])
        for k, (a, b) in enumerate(zip(*seen)):
            _same(a, b, f"call {i}: {k}")
    msgs = [str(w.message) for w in record_jit_warnings]
    assert any("W2.grad.data *= 0.5" in m for m in msgs), msgs


def test_the_grad_read_is_the_callers_grad_object():
    """What f reads is W.grad itself (the traced call is a real one): f returns a
    value computed from it, and W.grad after each call is the Variable the walk left,
    not one the trace made."""
    def make():
        P = _mlp()
        W2 = P["W2"]

        def step(h):
            W2.cleargrad()
            loss = F.sum(F.tanh(h @ W2))
            loss.backward()
            g = W2.grad
            W2.data -= 0.1 * g.data
            return loss, F.sum(g * g)
        return step, P

    def call(f, P, rng):
        x = tj.Variable(rng.standard_normal((5, 3)))
        P["W1"].cleargrad()
        loss, gg = f(F.tanh(x @ P["W1"]) @ P["W2"])
        assert P["W2"].grad.creator is None
        return {"loss": loss, "gg": gg, "x.grad": x.grad}
    _twins(make, call)


def test_a_later_backward_adding_to_a_root_of_the_walk():
    """u0 and u1 come from the caller's graph (u1 from u0): the first backward with
    retain_grad goes on into it from both, leaving on u0 its seed plus what u1's path
    added; a second backward inside f reads that .grad to add to it, then goes on into
    the caller's graph from u0 and u1 again, seeded with the sums (Trace._walk_read_root):
    the part of the graph after the first walk computes those seeds."""
    def make():
        W = tj.Parameter(np.array(0.7))

        def f(x0, u0, u1):
            loss1 = F.mean(F.tanh(x0 * u0)) + F.mean(F.tanh(x0 * u1))
            loss1.backward(retain_grad=True)
            loss2 = F.mean(F.tanh(loss1 * W) ** 2)
            W.cleargrad()
            loss2.backward()
            W.data -= 0.1 * W.grad.data
            return F.tanh(loss1 * W)
        return f, {"W": W}

    def call(f, P, rng):
        x0 = tj.Variable(rng.standard_normal((2, 3)))
        u0 = F.sin(x0) * 2.0
        u1 = F.exp(u0 * 0.5)
        y = f(x0, u0, u1)
        return {"y": y, "x0.grad": x0.grad, "u0.grad": u0.grad, "u1.grad": u1.grad}
    _twins(make, call)


def test_a_later_backward_adding_to_a_leaf_the_walk_reached_without_adding():
    """box.h, the state the call before left, comes from that compiled call, whose
    creator holds W0 as an input though h does not depend on it: the walk from h reaches
    W0 and gives it nothing. A later backward inside f adds to W0.grad; at call time
    the walk may add to it too, and both parts end up there, as in eager."""
    class Box:
        h = None

    def make():
        rng = np.random.default_rng(3)
        P = {"W0": tj.Parameter(rng.standard_normal(3)),
             "W3": tj.Parameter(rng.standard_normal(3))}
        box = Box()
        W0, W3 = P["W0"], P["W3"]

        def f(x0, x1):
            W0.cleargrad()
            loss1 = F.sum(F.tanh(x0 * W0))
            loss1.backward()
            h2 = F.tanh(x0 * W0)
            p = box.h
            h5 = F.tanh(x1 * 0.5) if p is None else F.tanh(x1 * 0.5 + 0.5 * p)
            box.h = h5
            W3.cleargrad()
            loss12 = F.sum(F.tanh(h5 * W3))
            loss12.backward()
            loss15 = F.sum(h2 * 2.0)
            loss15.backward()
            return loss15, h5
        f.box = box
        return f, P

    def call(f, P, rng):
        x0 = tj.Variable(rng.standard_normal(3))
        x1 = tj.Variable(rng.standard_normal(3))
        loss, h = f(x0, x1)
        return {"loss": loss, "h": h, "x0.grad": x0.grad, "x1.grad": x1.grad}
    _twins(make, call, n=8)
