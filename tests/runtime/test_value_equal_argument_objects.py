"""An argument object whose class compares by value (__eq__ / __hash__ of its own) is
state the function reads, as an object of default equality is: an equal object holding
other arrays or Variables gets eager's results, the state it holds is guarded (changed
between calls, the next call sees it), and a Variable in it rebound between calls is no
fallback; a mutable dataclass (unhashable) is an argument as any object is. A frozen
dataclass of numbers is its value: a new equal one each call hits."""
import dataclasses

import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")


class Cfg:
    """Equal when lr is: w, v and k are not compared."""

    def __init__(self, lr, w, v, k=1.0):
        self.lr, self.w, self.v, self.k = lr, w, v, k

    def __eq__(self, other):
        return isinstance(other, Cfg) and self.lr == other.lr

    def __hash__(self):
        return hash(self.lr)


def f(c, x):
    return F.sum(x * c.w * c.lr) + F.sum(x * c.v) * c.k


def _cfg(k):
    return Cfg(0.5, np.full(3, 1.0 + k), tj.Variable(np.full(3, 2.0 + k)), 1.0 + k)


def _run(jf, c, call):
    a = np.random.default_rng(call).standard_normal(3)
    x0, x1 = tj.Variable(a), tj.Variable(a.copy())
    y0, y1 = f(c, x0), jf(c, x1)
    np.testing.assert_allclose(y1.data, y0.data, rtol=1e-12, err_msg=f"call {call}")
    y0.backward()
    y1.backward()
    np.testing.assert_allclose(x1.grad.data, x0.grad.data, rtol=1e-12)


def test_equal_objects_holding_other_state():
    a, b = _cfg(0), _cfg(5)
    assert a == b
    jf = tj.jit(f)
    for call, c in enumerate([a, a, a, a, b, b, b, a, b]):
        _run(jf, c, call)
    assert jf.cache_info()["hits"] >= 3


@pytest.mark.parametrize("what", ["w", "v", "k", "w_inplace"])
def test_state_changed_between_calls(what):
    c = _cfg(0)
    jf = tj.jit(f)
    for call in range(12):
        if call in (4, 8):
            if what == "w":
                c.w = np.full(3, 10.0 + call)
            elif what == "v":
                c.v = tj.Variable(np.full(3, 10.0 + call))
            elif what == "k":
                c.k = 3.0 + call
            else:
                c.w[:] = 10.0 + call
        _run(jf, c, call)
    assert jf.cache_info()["hits"] >= 3


def test_a_frozen_dataclass_of_numbers_is_its_value():
    @dataclasses.dataclass(frozen=True)
    class Hyper:
        lr: float
        scale: float = 2.0

    def g(h, x):
        return F.sum(x * h.lr * h.scale)
    jf = tj.jit(g)
    for call in range(8):
        h = Hyper(0.5 if call < 5 else 0.25)           # a new equal object each call
        a = np.full(3, 1.0 + call)
        np.testing.assert_allclose(jf(h, tj.Variable(a)).data, g(h, tj.Variable(a)).data)
    assert jf.cache_info()["hits"] >= 4


def test_a_mutable_dataclass_argument():
    # eq=True without frozen: __hash__ is None. An argument eager takes (jit raised
    # TypeError "neither an array, a Variable, a float nor hashable").
    @dataclasses.dataclass
    class Config:
        lr: float
        w: object

    def g(c, x):
        return F.sum(x * c.w) * c.lr
    c = Config(0.5, np.ones(3))
    jf = tj.jit(g)
    for call in range(10):
        if call == 5:
            c.lr = 0.25
        if call == 7:
            c.w = np.full(3, 2.0)
        a = np.full(3, 1.0 + call)
        np.testing.assert_allclose(jf(c, tj.Variable(a)).data, g(c, tj.Variable(a)).data)
    other = Config(0.25, np.full(3, 3.0))         # equal fields would not matter
    a = np.ones(3)
    np.testing.assert_allclose(jf(other, tj.Variable(a)).data, g(other, tj.Variable(a)).data)
    assert jf.cache_info()["hits"] >= 3
