"""Indexing with mixed index tuples under jit: index arrays that are arguments (ndarrays
or int Variables) next to ints, slices with any step (negative too), None and Ellipsis,
and boolean masks, in the forms NumPy allows.

Each drawn program `x[key]` (Variable indexing, and `x.data[key]` on traced data) is
jitted and called at least five times with new values of x and of the index arrays
(masks keep their shape and their number of True entries, so the compiled variant runs),
compared with eager on values, dtypes, shapes and gradients; a fallback fails the test.
A mask with another number of True entries selects another shape: it runs another
variant (a guard on the count), never a wrong one.
"""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tracejit as tj
import tracejit.functions as F
from tracejit.testing import assert_jit_matches_eager

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")


@st.composite
def mixed_keys(draw):
    """(shape, spec): spec is one entry per key position: ("int", i), ("slice", s),
    ("array", shape), ("mask", shape), ("none",), ("ellipsis",). Index arrays all have
    one shape (they broadcast together); a mask is the only array in its key."""
    ndim = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=ndim, max_size=ndim)))
    use_mask = draw(st.booleans())
    ishape = draw(st.sampled_from([(1,), (2,), (3,), (2, 2), (1, 3), ()]))
    adv_axis = draw(st.integers(0, ndim - 1))     # at least one array or mask, here
    spec, axis, arrays = [], 0, 0
    while axis < ndim:
        kinds = ["int", "slice", "slice", "full"] + ([] if use_mask else ["array"])
        if axis == adv_axis:
            kind = "mask" if use_mask else "array"
        else:
            kind = draw(st.sampled_from(kinds))
        d = shape[axis]
        if kind == "int":
            spec.append(("int", draw(st.integers(-d, d - 1))))
            axis += 1
        elif kind == "full":
            spec.append(("slice", slice(None)))
            axis += 1
        elif kind == "slice":
            bound = st.one_of(st.none(), st.integers(-d - 1, d + 1))
            step = draw(st.sampled_from([None, 1, 2, -1, -2, -3]))
            spec.append(("slice", slice(draw(bound), draw(bound), step)))
            axis += 1
        elif kind == "array":
            spec.append(("array", ishape))
            arrays += 1
            axis += 1
        else:
            span = draw(st.integers(1, min(2, ndim - axis)))
            spec.append(("mask", shape[axis:axis + span]))
            arrays += 1
            axis += span
        if draw(st.integers(0, 7)) == 0:
            spec.append(("none",))
    if len(spec) > 1 and draw(st.booleans()):
        # Ellipsis in place of the trailing full slices (or of nothing).
        while spec and spec[-1] == ("slice", slice(None)):
            spec.pop()
        spec.insert(draw(st.integers(0, len(spec))), ("ellipsis",))
    return shape, spec


def index_arrays(spec, shape, rng, count=None):
    """New index arrays for spec: ints in range of their axis (negative ones too), masks
    with `count` True entries (None: drawn)."""
    out, axis = [], 0
    for e in spec:
        if e[0] == "array":
            d = shape[axis]
            out.append(rng.integers(-d, d, size=e[1]))
        elif e[0] == "mask":
            n = int(np.prod(e[1]))
            c = rng.integers(0, n + 1) if count is None else count
            flat = np.zeros(n, bool)
            flat[rng.permutation(n)[:c]] = True
            out.append(flat.reshape(e[1]))
        if e[0] in ("int", "slice", "array"):
            axis += 1
        elif e[0] == "mask":
            axis += len(e[1])
        elif e[0] == "ellipsis":
            axis += len(shape) - sum(1 if s[0] in ("int", "slice", "array") else
                                     len(s[1]) if s[0] == "mask" else 0 for s in spec)
    return out


def build_key(spec, arrays):
    it = iter(arrays)
    key = []
    for e in spec:
        if e[0] in ("int", "slice"):
            key.append(e[1])
        elif e[0] in ("array", "mask"):
            key.append(next(it))
        else:
            key.append(None if e[0] == "none" else Ellipsis)
    return tuple(key)


def numpy_accepts(shape, spec, arrays):
    try:
        np.zeros(shape)[build_key(spec, arrays)]
    except IndexError:
        return False
    return True


@settings(max_examples=30, deadline=None)
@given(keyspec=mixed_keys(), seed=st.integers(0, 2 ** 16), how=st.sampled_from(
    ["variable", "int variable index", "data"]))
def test_a_mixed_index_with_argument_arrays_compiles_and_matches(keyspec, seed, how):
    shape, spec = keyspec
    rng = np.random.default_rng(seed)
    first = index_arrays(spec, shape, rng)
    if not numpy_accepts(shape, spec, first):
        return                        # NumPy raises (a mask's shape after an int, ...)
    counts = [int(a.sum()) for a in first if a.dtype == bool]

    def make_args(call):
        r = np.random.default_rng(seed + 1 + call)
        idx = index_arrays(spec, shape, r, counts[0] if counts else None) if call \
            else first
        if how == "int variable index":
            idx = [tj.Variable(a) if a.dtype != bool else a for a in idx]
        return (tj.Variable(r.standard_normal(shape)),) + tuple(idx)

    if how == "data":
        def f(x, *idx):
            return x.data[build_key(spec, idx)] * 2.0
    else:
        def f(x, *idx):
            return x[build_key(spec, idx)] * 2.0

    info = assert_jit_matches_eager(f, make_args=make_args)
    assert info["hits"] >= 3, (spec, info)


def test_the_reported_index_compiles():
    def f(x, i):
        return F.sum(x[i, ::-1] ** 2)

    r = np.random.default_rng(0)
    info = assert_jit_matches_eager(
        f, make_args=lambda k: (tj.Variable(r.standard_normal((3, 4))), r.integers(0, 3, 2)),
        second_order=True)
    assert info["hits"] >= 3


def test_a_mask_with_another_count_runs_another_variant(record_jit_warnings):
    def f(x, m):
        return F.sum(x[:, m, ::-1] * 3.0)

    jf = tj.jit(f)
    r = np.random.default_rng(0)
    for call in range(8):
        x = r.standard_normal((2, 4, 3))
        m = r.random(4) < 0.5
        want = f(tj.Variable(x), m).data
        xv = tj.Variable(x)
        y = jf(xv, m)
        np.testing.assert_allclose(y.data, want, rtol=1e-12)
        y.backward()
        g = np.zeros_like(x)
        g[:, m, :] = 3.0
        np.testing.assert_allclose(xv.grad.data, g)
    assert not record_jit_warnings
    assert jf.cache_info()["guard_failures"] >= 1
