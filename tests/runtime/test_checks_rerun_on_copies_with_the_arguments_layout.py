"""The checks against eager rerun the function on copies of the arguments laid out as
the arguments are.

The perturbation check, the unperturbed rerun and the float64 twin (runtime/checking.py,
runtime/jitted.py) run the user's function again on copies of the call's arguments.
Where the function's behaviour depends on an argument's layout (a reshape of a
non-contiguous array copies, of a contiguous one is a view), a C-contiguous copy is
another program: the check saw a difference that is not there and fell back with a
misleading reason. checking.layout_copy keeps each argument's strides, and views
between arguments stay views of one copy.
"""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import tracejit as tj
from tracejit import Variable
from tracejit.runtime.checking import layout_copy, twin_copy


def reshape_then_update(x):
    # x non-contiguous: the reshape copies, so r keeps x's values from before the update.
    r = Variable(x.data.reshape(-1)[0:2])
    x.data += 1.0
    return r * 2.0


def _reshape_copies(i):
    return (np.arange(16.0).reshape(2, 8) * (i + 1) / 10)[:, :4]     # strides (64, 8)


def _reshape_views(i):
    return (np.arange(16.0) * (i + 1) / 10)[::2].reshape(2, 4)        # strides (64, 16)


ORDERS = [["copy"] * 7 + ["view"] * 3, ["copy", "copy", "view", "view", "copy", "view"],
          ["view", "view", "copy", "copy", "view", "copy"]]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("order", ORDERS, ids=["copies then views", "copies first",
                                               "views first"])
def test_a_reshape_of_an_argument_then_its_update_matches_eager(order, dtype):
    # Whether r sees the update depends on the strides (a copy: no; a view: yes),
    # which the signature does not hold: each call is eager's, and a fallback names
    # that cause (the checks, on C-contiguous copies, used to see another program and
    # blame "NumPy on arrays the tracer cannot see"; once they were right, a variant
    # traced on the copying layout ran the viewing one silently wrong).
    f = tj.jit(reshape_then_update)
    make = {"copy": _reshape_copies, "view": _reshape_views}
    import warnings
    with warnings.catch_warnings(record=True) as ws:
        warnings.simplefilter("always")
        for i, kind in enumerate(order):
            xj = Variable(make[kind](i).astype(dtype, copy=False)
                          if dtype is np.float64 else _as32(make[kind](i)))
            xe = Variable(make[kind](i).astype(dtype, copy=False)
                          if dtype is np.float64 else _as32(make[kind](i)))
            rj, re = f(xj), reshape_then_update(xe)
            assert rj.data.dtype == re.data.dtype
            np.testing.assert_array_equal(rj.data, re.data)
            np.testing.assert_array_equal(xj.data, xe.data)
    for w in ws:
        if issubclass(w.category, tj.JitWarning):
            msg = str(w.message)
            assert "differs from eager" not in msg and "cannot see" not in msg, msg


def _as32(a):
    """a's layout in float32: the same strides in items."""
    base = np.empty(a.size * 8, np.float32)
    out = np.lib.stride_tricks.as_strided(
        base, a.shape, tuple(st // 2 for st in a.strides))
    out[...] = a
    return out


@st.composite
def strided_arrays(draw):
    n = draw(st.sampled_from([1, 2, 3, 4, 6]))
    base = np.arange(float(draw(st.integers(1, 4)) * 24))
    shape = (len(base) // n, n) if draw(st.booleans()) else (len(base),)
    a = base.reshape(shape)
    idx = tuple(slice(draw(st.integers(0, 1)), None, draw(st.sampled_from([1, 2, -1, -2])))
                for _ in shape)
    a = a[idx]
    if a.ndim == 2 and draw(st.booleans()):
        a = a.T
    return a


@settings(max_examples=200, deadline=None)
@given(strided_arrays(), st.sampled_from([None, np.float32, np.float64]))
def test_layout_copy_keeps_strides_values_and_reshape_behaviour(a, dtype):
    if dtype is np.float32:
        a = a.astype(np.float32)[..., ::1]
    c = layout_copy(a, {}, np.float64 if dtype is not None else None)
    np.testing.assert_array_equal(c, a)
    assert not np.shares_memory(c, a)
    if a.size > 1:
        assert c.strides == tuple(s // a.itemsize * c.itemsize for s in a.strides)
        assert np.shares_memory(c.reshape(-1), c) == np.shares_memory(a.reshape(-1), a)


def test_views_between_arguments_stay_views_of_one_copy():
    base = np.arange(12.0)
    x, y = Variable(base[:8]), Variable(base[4:][::2])
    memo = {}
    cx, cy = twin_copy(x, memo), twin_copy(y, memo)
    assert np.shares_memory(cx.data, cy.data)
    cx.data[4] = -1.0
    assert cy.data[0] == -1.0 and base[4] == 4.0
    # float32 arguments widened by the float64 twin keep the sharing too.
    b32 = np.arange(12.0, dtype=np.float32)
    memo = {}
    cx, cy = twin_copy(Variable(b32[2:]), memo), twin_copy(Variable(b32[::3]), memo)
    assert cx.data.dtype == np.float64 and np.shares_memory(cx.data, cy.data)
    np.testing.assert_array_equal(cy.data, b32[::3])
