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


@pytest.mark.usefixtures("jit_warnings_are_errors")
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_a_reshape_of_a_non_contiguous_argument_compiles(dtype):
    f = tj.jit(reshape_then_update)
    for i in range(6):
        a = (np.arange(16.0).reshape(2, 8) * (i + 1) / 10).astype(dtype)[:, :4]
        xj = Variable(a)
        xe = Variable((np.arange(16.0).reshape(2, 8) * (i + 1) / 10).astype(dtype)[:, :4])
        rj, re = f(xj), reshape_then_update(xe)
        assert rj.data.dtype == re.data.dtype
        np.testing.assert_allclose(rj.data, re.data, rtol=1e-6)
        np.testing.assert_array_equal(xj.data, xe.data)
    info = f.cache_info()
    assert info["fallbacks"] == 0 and info["hits"] >= 3


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
