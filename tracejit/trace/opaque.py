"""State a traced call reads through objects whose state the pystate walk cannot read.

An iterator made outside the call (a generator's frame locals, a C iterator's position:
itertools.count / cycle, iter(list), a file) gives the call its next value and moves on:
what it yields is frozen into the graph, and compiled calls would neither advance it
nor see what it yields next. Nothing can be guarded (a re-read advances it too): a call
that advances one runs eagerly. A memoized function (functools.lru_cache / cache) keeps
its results in C: re-read, as eager calls it, it gives the cached object (a lookup) or,
after cache_clear() or an eviction, a new one; so each call the trace makes of one with
plain arguments becomes a location (pystate, kind "call") guarded as any.

While the user's function traces, such objects at the locations it reads (and among its
arguments) are swapped for probes that record their use (as pystate.swap_arrays swaps
arrays for traced views); trace.call reads them off after the call.
"""
import functools
import queue
import random
import types

import numpy as np

from tracejit import core
from tracejit.trace import pystate

_CACHE_TYPES = tuple(t for t in (getattr(functools, "_lru_cache_wrapper", None),)
                     if isinstance(t, type))


def is_opaque_iterator(v):
    """A generator or an iterator implemented in C (its position is not in a __dict__
    the walk reads; a Python iterator class's is, and is guarded as any state)."""
    if isinstance(v, (types.GeneratorType, types.CoroutineType)):
        return True
    if isinstance(v, (IteratorProbe, np.ndarray, core.Variable, type)) or \
            pystate._is_namespace_object(v):
        return False
    t = type(v)
    return getattr(t, "__next__", None) is not None and getattr(t, "__iter__", None) \
        is not None


# C objects whose methods read and change state kept in C (a queue's items, a random
# generator's position): any method the call uses on one is such a read.
_STATEFUL_TYPES = (queue.SimpleQueue, np.random.Generator, np.random.RandomState,
                   random.Random)


def _line():
    from tracejit.trace.record import user_line
    return user_line(3)


class IteratorProbe:
    """Stands for an iterator made outside the call while the call traces: notes that
    the call advanced it (first line), and advances it, as eager does."""

    __slots__ = ("it", "label", "line")

    def __init__(self, it, label):
        self.it, self.label, self.line = it, label, None

    def _seen(self):
        if self.line is None:
            self.line = _line() or "?"

    def __iter__(self):
        return self

    def __next__(self):
        self._seen()
        return next(self.it)

    def send(self, value):
        self._seen()
        return self.it.send(value)

    def throw(self, *args):
        self._seen()
        return self.it.throw(*args)

    def close(self):
        self._seen()
        return self.it.close()

    def __getattr__(self, name):
        return getattr(self.it, name)

    def escape(self):
        """(reason, line) if the call advanced the iterator, else None."""
        if self.line is None:
            return None
        what = "a generator" if isinstance(self.it, types.GeneratorType) else \
            f"a {type(self.it).__name__} iterator"
        return (f"the function advances {self.label} ({what} made outside it): what it "
                f"yields is state jit cannot guard or re-read (compiled calls would "
                f"neither advance it nor see its next values)", self.line)


class StatefulProbe:
    """Stands for a C object of _STATEFUL_TYPES while the call traces: notes the first
    method the call uses on it (its results are that state, frozen into the graph)."""

    __slots__ = ("obj", "label", "line", "method")

    def __init__(self, obj, label):
        self.obj, self.label, self.line, self.method = obj, label, None, None

    def __getattr__(self, name):
        attr = getattr(self.obj, name)
        if not callable(attr):
            return attr

        def method(*args, **kwargs):
            if self.line is None:
                self.line, self.method = _line() or "?", name
            return attr(*args, **kwargs)
        return method

    def escape(self):
        if self.line is None:
            return None
        return (f"the function calls {self.label}.{self.method}() (a "
                f"{type(self.obj).__name__} made outside it): its state is kept in C, "
                f"which jit cannot guard or replay (compiled calls would reuse what it "
                f"gave while tracing)", self.line)


class CacheProbe:
    """Stands for a memoized function while the call traces: records the calls made
    with plain arguments (re-read as guards at each compiled call), and notes one made
    with traced data (its cached result would be frozen)."""

    __slots__ = ("fn", "label", "calls", "traced_line")

    def __init__(self, fn, label):
        self.fn, self.label, self.calls, self.traced_line = fn, label, [], None

    def __call__(self, *args, **kwargs):
        if all(_plain(a) for a in list(args) + list(kwargs.values())):
            key = (tuple(args), dict(kwargs))
            if not any(k == key for k in self.calls):
                self.calls.append(key)
        elif self.traced_line is None:
            self.traced_line = _line() or "?"
        return self.fn(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.fn, name)

    def locations(self):
        return [pystate.Location("call", self.fn, key, f"{self.label}{_call_text(key)}")
                for key in self.calls]

    def escape(self):
        if self.traced_line is None:
            return None
        return (f"the function calls the memoized {self.label} with traced data: its "
                f"cached result would be frozen", self.traced_line)


def _plain(a):
    """An argument a memoized call may be re-read with: hashable, no traced data."""
    if isinstance(a, (core.ScalarTracer, np.ndarray, core.Variable)):
        return False
    if type(a) in (tuple, frozenset):
        return all(_plain(x) for x in a)
    try:
        hash(a)
    except TypeError:
        return False
    return True


def _call_text(key):
    args, kwargs = key
    parts = [repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()]
    text = ", ".join(parts)
    return f"({text if len(text) < 40 else text[:37] + '...'})"


def probe_for(v, label):
    """The probe standing for v while a call traces, or None."""
    if _CACHE_TYPES and isinstance(v, _CACHE_TYPES):
        return CacheProbe(v, label)
    if is_opaque_iterator(v):
        return IteratorProbe(v, label)
    if isinstance(v, _STATEFUL_TYPES):
        return StatefulProbe(v, label)
    return None


def swap_probes(locs):
    """Put a probe in place of each memoized function and outside iterator at locs;
    (location, original, probe) to undo with pystate.unswap."""
    swaps = []
    for loc in locs:
        v = loc.read()
        p = probe_for(v, loc.label)
        if p is None:
            continue
        try:
            loc.write(p)
        except Exception:  # noqa: BLE001 - a location that cannot be written
            continue
        swaps.append((loc, v, p))
    return swaps


def findings(probes):
    """(escapes, locations) the probes recorded: (reason, line) of each outside iterator
    the call advanced or memoized call of traced data, and the memoized calls to
    guard."""
    escapes, locs = [], []
    for p in probes:
        e = p.escape()
        if e is not None:
            escapes.append(e)
        if isinstance(p, CacheProbe):
            locs += p.locations()
    return escapes, locs
