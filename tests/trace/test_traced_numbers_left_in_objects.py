"""A traced Python number the function leaves in a user object is the plain number
after the trace, as after an eager call (issue 9): `log.append(Record(loss=float(...)))`
left a TracedFloat in the record, which is not a float to isinstance, json or a later
trace. The walk after a trace covers lists, dicts, sets and tuples reachable from the
function's state, and user objects' __dict__ and __slots__ (bounded depth, cycles once).
"""
import dataclasses
import json
import warnings

import numpy as np

import tracejit as tj
from tracejit.testing.checks import assert_call_matches_eager
from tracejit.trace.values import TracedScalar


@dataclasses.dataclass
class Record:
    loss: float
    extra: object = None


@dataclasses.dataclass(frozen=True)
class Frozen:
    value: float


class Slotted:
    __slots__ = ("v", "w")

    def __init__(self, v):
        self.v = v


class Tracker:
    def __init__(self):
        self.items = []
        self.me = self          # a cycle


def leaks(o, path="", depth=0, seen=None):
    """Paths at which a TracedScalar is still held (walked deeper than jit does)."""
    seen = set() if seen is None else seen
    if id(o) in seen or depth > 10:
        return []
    seen.add(id(o))
    if isinstance(o, TracedScalar):
        return [path]
    out = []
    if isinstance(o, (list, tuple)):
        for i, y in enumerate(o):
            out += leaks(y, f"{path}[{i}]", depth + 1, seen)
    elif isinstance(o, dict):
        for k, y in o.items():
            out += leaks(y, f"{path}[{k!r}]", depth + 1, seen)
    elif hasattr(o, "__dict__"):
        for k, y in vars(o).items():
            out += leaks(y, f"{path}.{k}", depth + 1, seen)
    elif hasattr(o, "__slots__"):
        for k in o.__slots__:
            if hasattr(o, k):
                out += leaks(getattr(o, k), f"{path}.{k}", depth + 1, seen)
    return out


def make():
    log, hist, tracker = [], {}, Tracker()

    def f(x):
        m = float(x.data.mean())
        log.append(Record(loss=m, extra=[Record(m * 2.0, extra={"f": Frozen(m)})]))
        hist.setdefault("runs", []).append(Slotted(m + 1.0))
        tracker.items.append((m, Slotted(m)))
        return x * 2.0 if m > 0 else x * -1.0
    return f, (log, hist, tracker)


def test_traced_numbers_in_user_objects_are_plain_after_the_trace():
    f, state = make()
    g, eager_state = make()
    jf = tj.jit(f)
    with warnings.catch_warnings():
        # The appends run only while tracing (a warned side effect): what is checked
        # is what the traced call left behind.
        warnings.simplefilter("ignore", tj.JitWarning)
        for i in range(4):
            d = np.random.default_rng(i).standard_normal(3) * (1 if i % 2 else -1)
            assert_call_matches_eager(jf, g, tj.Variable(d), backward=False, atol=1e-12)
            assert leaks(state, "state") == []
    log, hist, tracker = state
    assert len(log) >= 1 and len(tracker.items) >= 1
    for rec in log:
        assert type(rec.loss) is float and type(rec.extra[0].loss) is float
        assert type(rec.extra[0].extra["f"].value) is float
        json.dumps(dataclasses.asdict(rec))           # a TracedFloat is not JSON
    for m, s in tracker.items:
        assert type(m) is float and type(s.v) is float
    assert all(type(s.v) is float for s in hist["runs"])
    # The records hold the values eager computed for the same inputs (the appends
    # ran on the warm-up and tracing calls only).
    assert [r.loss for r in log] == [r.loss for r in eager_state[0][:len(log)]]
