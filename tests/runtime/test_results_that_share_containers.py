"""A result is a DAG when one container sits in several places (`r = (r, r)` sixty
times: 2**60 paths, which eager returns at once). Compiled calls return the same sharing
(one tuple, list or dict object in each place, as eager's), and neither the trace nor the
checks against eager walk it path by path (before: the trace or the first-call check never
returned)."""
import faulthandler

import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F
from tracejit.runtime.checking import first_difference, identity_difference, \
    leaves_with_paths
from tracejit.testing import assert_jit_matches_eager

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")

DEPTH = 60


def _wrap(kind, r, i):
    if kind == "tuple":
        return (r, r)
    if kind == "list":
        return [r, r]
    if kind == "dict":
        return {"a": r, "b": r}
    return (r, [r, r]) if i % 2 else [r, (r, r)]    # mixed: 2 levels a step


def _dag(kind, x, depth):
    r = F.sin(x) * 2.0
    for i in range(depth):
        r = _wrap(kind, r, i)
    return r


@pytest.fixture(autouse=True)
def _no_hang():
    # A regression hangs (2**60 paths): fail in bounded time instead.
    faulthandler.dump_traceback_later(240, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


@pytest.mark.parametrize("kind", ["tuple", "list", "dict", "mixed"])
def test_a_result_dag_compiles_with_eager_sharing(kind):
    depth = DEPTH // 2 if kind == "mixed" else DEPTH
    f = lambda x: _dag(kind, x, depth)          # noqa: E731
    jf = tj.jit(f)
    info = assert_jit_matches_eager(f, np.linspace(-1.0, 1.0, 3), jitted=jf, calls=4)
    assert info["fallbacks"] == 0 and info["hits"] >= 3
    out = jf(tj.Variable(np.ones(3)))
    for _ in range(depth):                       # one object in every place, as eager's
        items = list(out.values()) if isinstance(out, dict) else list(out)
        if kind == "mixed":
            inner = items[1] if isinstance(out, tuple) else items[1]
            assert inner[0] is inner[1]
            out = items[0]
            continue
        assert items[0] is items[1]
        out = items[0]
    assert isinstance(out, tj.Variable)


def test_the_checks_walk_a_dag_once_and_still_see_a_lost_sharing():
    a = tj.Variable(np.ones(2))
    r = a
    for _ in range(DEPTH):
        r = [r, r]
    assert len(leaves_with_paths(r)) == 2          # the innermost [a, a], once
    assert first_difference(r, r) is None
    other = tj.Variable(np.ones(2))
    r2 = other
    for _ in range(DEPTH):
        r2 = [r2, r2]
    assert first_difference(r, r2) is None           # equal values
    r3 = tj.Variable(np.ones(2) * 3.0)
    for _ in range(DEPTH):
        r3 = [r3, r3]
    assert "output" in first_difference(r, r3)
    # Eager shares the inner list; compiled returns two equal ones: named.
    inner = [a]
    split = [[a], [a]]
    d = identity_difference([inner, inner], split)
    assert d is not None and "output[1]" in d
