"""A result that is a reshape of an argument's buffer (`Variable(x.data.reshape(-1)[0:2])`)
is a view where NumPy can reshape without copying and a copy where it cannot, and that
depends on the strides, not on the shape, dtype or contiguity the signature keys on:
(2, 4) with strides (64, 16) (x[::2] of a longer buffer) reshapes to a view, (2, 4) with
strides (64, 8) (x[:, :4] of a (2, 8)) copies, and both are non-contiguous. A variant
traced on the copying layout kept its copy on the other layout, where eager returns a
view of the argument: silently unaliased (a write through the result changes x in
eager only). The trace records the view steps of a result whose traced reshape copied
too, and the runner replays them: a view where NumPy gives one, the graph's value where
it copies (as before)."""
import numpy as np
import pytest

import tracejit as tj
from tracejit.core import Variable

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")


def head(x):
    v = Variable(x.data.reshape(-1)[0:2])
    return v * 2.0, v


def flat(x):
    return x * 0.5, x.data.reshape(-1)          # an ndarray result, the whole buffer


def layout(i, kind):
    if kind == "copies":        # (2, 4), strides (64, 8): reshape(-1) copies
        a = (np.arange(16.0).reshape(2, 8) * (i + 1) / 7.0)[:, :4]
    elif kind == "views":       # (2, 4), strides (64, 16): reshape(-1) is a view
        a = (np.arange(16.0) * (i + 1) / 7.0)[::2].reshape(2, 4)
    else:                       # C-contiguous
        a = np.arange(8.0).reshape(2, 4) * (i + 1) / 7.0
    assert a.shape == (2, 4)
    return a


ORDERS = [["copies", "copies", "views", "views", "copies", "views", "contiguous"],
          ["views", "views", "copies", "copies", "views", "copies", "contiguous"],
          ["contiguous", "contiguous", "copies", "views", "copies", "views"]]


def _raw(r):
    return r.data if isinstance(r, Variable) else r


@pytest.mark.parametrize("fn", [head, flat])
@pytest.mark.parametrize("order", ORDERS, ids=["copies_first", "views_first",
                                               "contiguous_first"])
def test_a_reshaped_argument_aliases_it_exactly_where_eager_does(fn, order):
    jf = tj.jit(fn)
    for i, kind in enumerate(order):
        xj, xe = Variable(layout(i, kind)), Variable(layout(i, kind))
        (yj, rj), (ye, re) = jf(xj), fn(xe)
        np.testing.assert_allclose(yj.data, ye.data, rtol=1e-12)
        np.testing.assert_array_equal(_raw(rj), _raw(re))
        assert type(rj) is type(re)
        assert np.shares_memory(_raw(rj), xj.data) == np.shares_memory(_raw(re), xe.data), \
            (i, kind)
        # A write through the result: x changes where eager's result is a view.
        _raw(rj)[0] = -3.0
        _raw(re)[0] = -3.0
        np.testing.assert_array_equal(xj.data, xe.data)
    assert jf.cache_info()["hits"] >= 3
