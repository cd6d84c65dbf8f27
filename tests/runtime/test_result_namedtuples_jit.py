"""A NamedTuple of results is rebuilt per compiled call as one of its class.

`return Out(loss, h)` gives each compiled call its own Out of this call's Variables
(eager's kind, values, gradients, and one object where eager returns one twice); as a
leaf, compiled calls returned the traced call's Out again, and the check fell back
with a warning about a frozen value. Results the JIT does not rebuild (a dataclass, a
generator, an object of the user's class) run eagerly with a warning that says so.
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


class Obj:
    def __init__(self, h):
        self.h = h


@pytest.mark.parametrize("fn,kind", [
    (lambda x: DC(F.sum(F.tanh(x)), F.tanh(x)), "DC"),
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
