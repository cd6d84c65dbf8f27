"""An argument object keyed by identity (default equality, or a class with a value __eq__
that is not a frozen dataclass of numbers) that is new at every call: the Jitted keeps
none of them alive (its keys hold them weakly, its tables are bounded), warns once that
nothing can compile (naming the caller's line) and runs such calls eagerly, cheaply;
cache_info() adds up. Objects that live on (several models called in turn) compile."""
import dataclasses
import gc
import weakref

import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F
from tracejit.core import Variable


class Plain:
    def __init__(self, s):
        self.s = s
        self.w = np.linspace(0.5, 1.5, 3)


@dataclasses.dataclass
class Holder:                 # eq without frozen: unhashable, keyed by identity
    s: float
    w: np.ndarray


def f(o, x):
    return F.sum(x * o.s * o.w)


def _info_adds_up(info):
    assert info["calls"] == info["hits"] + info["misses"] + info["fallbacks"]


@pytest.mark.parametrize("make", [lambda i: Plain(1.0 + i),
                                  lambda i: Holder(1.0 + i, np.arange(3.0) + i)])
def test_new_object_every_call_warns_once_and_keeps_nothing(make):
    jf = tj.jit(f)
    refs = []
    n = 30
    with pytest.warns(tj.JitWarning, match=r"new (Plain|Holder) object is passed at every "
                                           r"call.*test_argument_objects_new_every_call"):
        for i in range(n):
            o = make(i)
            refs.append(weakref.ref(o))
            x = Variable(np.random.rand(3))
            got = jf(o, x)
            want = f(o, x)
            np.testing.assert_allclose(got.data, want.data)
            del o, got, want
    info = jf.cache_info()
    _info_adds_up(info)
    assert info["calls"] == n
    assert info["misses"] == 8 and info["fallbacks"] == n - 8
    assert info["variants"] == 0 and info["traces"] == 0
    # Nothing kept alive: without gc (no cycle), and after it.
    assert sum(r() is not None for r in refs) == 0
    gc.collect()
    assert sum(r() is not None for r in refs) == 0
    assert len(jf._warm) <= 8


def test_long_lived_objects_called_in_turn_compile(jit_warnings_are_errors):
    objs = [Plain(1.0 + i) for i in range(10)]
    jf = tj.jit(f)
    for rnd in range(4):
        for i, o in enumerate(objs):
            if rnd == 3 and i == 2:
                o.w[...] = 7.0                   # a captured array mutated in place
            x = Variable(np.random.rand(3))
            np.testing.assert_allclose(jf(o, x).data, f(o, x).data)
    info = jf.cache_info()
    _info_adds_up(info)
    assert info["calls"] == 40 and info["hits"] >= 20


def test_same_object_reused_after_a_storm_stays_correct():
    jf = tj.jit(f)
    with pytest.warns(tj.JitWarning, match="new Plain object"):
        for i in range(12):
            o = Plain(float(i))
            x = Variable(np.random.rand(3))
            np.testing.assert_allclose(jf(o, x).data, f(o, x).data)
    keep = Plain(3.0)
    for i in range(5):
        keep.s = float(i)
        x = Variable(np.random.rand(3))
        np.testing.assert_allclose(jf(keep, x).data, f(keep, x).data)
    _info_adds_up(jf.cache_info())


def test_objects_called_twice_then_dropped_keep_a_bounded_number_of_variants(monkeypatch):
    import tracejit.runtime.jitted as jitted
    monkeypatch.setattr(jitted, "_MAX_SIGNATURES", 4)
    jf = tj.jit(f)
    refs = []
    for i in range(10):
        o = Plain(float(i))
        refs.append(weakref.ref(o))
        for _ in range(4):
            x = Variable(np.random.rand(3))
            np.testing.assert_allclose(jf(o, x).data, f(o, x).data)
        del o
    gc.collect()
    info = jf.cache_info()
    _info_adds_up(info)
    assert info["variants"] <= 4 and info["hits"] == 20
    assert sum(r() is not None for r in refs) <= 4
