"""A NamedTuple or a dataclass of results is rebuilt per compiled call as one of its class.

`return Out(loss, h)` gives each compiled call its own Out of this call's Variables
(eager's kind, values, gradients, and one object where eager returns one twice); as a
leaf, compiled calls returned the traced call's Out again, and the check fell back
with a warning about a frozen value. A dataclass the call makes (`Output(loss=...,
logits=...)`, frozen or slotted, with what its __post_init__ sets) is rebuilt the same
way; one from before the call is returned as that object. Results the JIT does not
rebuild (a generator, an object of the user's other classes) run eagerly with a warning
that says so.
Each test calls the jitted function at least four times with new values and compares
each call with eager; an unexpected fallback fails the test.
"""
from collections import namedtuple
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F
from tracejit import Parameter, Variable

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")

Out = namedtuple("Out", "loss h")


class Typed(NamedTuple):
    loss: object
    parts: tuple
    n: int


W = Parameter(np.random.RandomState(0).randn(3))


def plain(x):
    h = F.tanh(x * W)
    return Out(F.sum(h), h)


def nested(x):
    h = F.exp(x) * W
    return Typed(F.sum(h * h), (h, h, x), 3)


@pytest.mark.parametrize("fn", [plain, nested])
def test_namedtuple_results_compile_and_match(fn):
    f = tj.jit(fn)
    rng = np.random.RandomState(1)
    for i in range(6):
        v = rng.randn(3)
        got = []
        for g in (fn, f):
            x = Variable(v.copy())
            W.cleargrad()
            r = g(x)
            assert type(r) is type(fn(Variable(v.copy())))
            if isinstance(r, Typed):
                assert r.parts[0] is r.parts[1] and r.parts[2] is x and r.n == 3
                (r.loss + F.sum(r.parts[0] * 2.0)).backward()
                got.append([r.loss.data, r.parts[0].data, x.grad.data, W.grad.data])
            else:
                (r.loss + F.sum(r.h * 3.0)).backward()
                got.append([r.loss.data, r.h.data, x.grad.data, W.grad.data])
        for a, b in zip(*got):
            np.testing.assert_allclose(b, a, rtol=1e-9, atol=1e-12)
        W.data += 0.1
    assert f.cache_info()["hits"] >= 3


@dataclass
class DC:
    loss: object
    h: object


@dataclass(frozen=True)
class Frozen:
    loss: object
    parts: tuple


@dataclass(slots=True)
class Slotted:
    h: object
    n: int = 2


@dataclass
class Derived:
    h: object

    def __post_init__(self):
        self.total = F.sum(self.h)          # computed of traced values: in the graph
        self.flag = "made"


HELD = DC(Variable(np.ones(3)), None)       # from before the call: itself, as eager


def dc_plain(x):
    h = F.tanh(x * W)
    return DC(F.sum(h), h)


def dc_frozen(x):
    h = F.exp(x) * W
    return Frozen(F.sum(h * h), (h, [h, x]))


def dc_slotted(x):
    return Slotted(F.sin(x) * W)


def dc_derived(x):
    return Derived(F.tanh(x) * W), HELD


def dc_nested(x):
    inner = DC(F.sum(x * W), x * 2.0)
    return {"out": DC(inner, inner), "n": 3}


@pytest.mark.parametrize("fn", [dc_plain, dc_frozen, dc_slotted, dc_derived, dc_nested])
def test_dataclass_results_compile_and_match(fn):
    f = tj.jit(fn)
    rng = np.random.RandomState(2)
    for i in range(6):
        v = rng.randn(3)
        got = []
        for g in (fn, f):
            x = Variable(v.copy())
            W.cleargrad()
            r = g(x)
            if fn is dc_plain:
                (r.loss + F.sum(r.h * 3.0)).backward()
                got.append([r.loss.data, r.h.data, x.grad.data, W.grad.data])
            elif fn is dc_frozen:
                assert r.parts[0] is r.parts[1][0] and r.parts[1][1] is x
                (r.loss + F.sum(r.parts[0])).backward()
                got.append([r.loss.data, r.parts[0].data, x.grad.data, W.grad.data])
            elif fn is dc_slotted:
                assert type(r) is Slotted and r.n == 2
                F.sum(r.h).backward()
                got.append([r.h.data, x.grad.data, W.grad.data])
            elif fn is dc_derived:
                d, held = r
                assert type(d) is Derived and d.flag == "made" and held is HELD
                (d.total * 2.0).backward()
                got.append([d.h.data, d.total.data, x.grad.data, W.grad.data])
            else:
                out = r["out"]
                assert out.loss is out.h and r["n"] == 3
                (out.loss.loss + F.sum(out.h.h)).backward()
                got.append([out.loss.loss.data, out.h.h.data, x.grad.data, W.grad.data])
        for a, b in zip(*got):
            np.testing.assert_allclose(b, a, rtol=1e-9, atol=1e-12)
        W.data += 0.1
    info = f.cache_info()
    assert info["hits"] >= 3 and info["fallbacks"] == 0, info


class Obj:
    def __init__(self, h):
        self.h = h


@pytest.mark.parametrize("fn,kind", [
    (lambda x: Obj(F.exp(x)), "Obj"),
    (lambda x: (F.exp(x) * k for k in range(2)), "generator"),
])
def test_results_not_rebuilt_run_eagerly_saying_so(fn, kind):
    f = tj.jit(fn)
    with pytest.warns(tj.JitWarning, match=f"a {kind} is returned by the traced call"):
        for i in range(4):
            v = np.random.randn(3)
            e, j = fn(Variable(v.copy())), f(Variable(v.copy()))
            assert type(e) is type(j)
            vals = [list(r) if kind == "generator" else [r.h] for r in (e, j)]
            for a, b in zip(*vals):
                np.testing.assert_allclose(b.data, a.data, rtol=1e-12)
