"""backward()'s seed is np.ones_like(y.data): laid out as y's data. With
y = F.reshape(x, x.shape) of an F-ordered x, x.grad is that seed (reshaped: the same
F-ordered buffer), so F.reshape(x.grad, (-1, 1)) copies in eager. The tracing call gave
x.grad a C-ordered copy of the seed (the graph keeps the seed as its constant), so the
reshape was a view of x.grad on that call: silently aliased. The traced call's copies
of arrays made in the call keep their layout (order='K')."""
import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F
from tracejit.core import Variable

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")


def flat_grad(x):
    x.cleargrad()
    y = F.reshape(x, x.shape)
    y.backward()
    return F.transpose(F.reshape(x.grad, (-1, 1)))


def _layout(i, kind):
    a = np.arange(20.0).reshape(4, 5) * (i + 1) / 7.0
    return np.asfortranarray(a) if kind == "F" else a


@pytest.mark.parametrize("order", [["F"] * 5, ["C", "F", "F", "C", "F", "F"],
                                   ["F", "C", "F", "C", "F", "C"]],
                         ids=["f_only", "c_first", "alternating"])
def test_a_reshape_of_a_seed_grad_aliases_it_where_eager_does(order):
    jf = tj.jit(flat_grad)
    for i, kind in enumerate(order):
        xj, xe = Variable(_layout(i, kind)), Variable(_layout(i, kind))
        rj, re = jf(xj), flat_grad(xe)
        np.testing.assert_array_equal(rj.data, re.data)
        np.testing.assert_array_equal(xj.grad.data, xe.grad.data)
        assert xj.grad.data.strides == xe.grad.data.strides, (i, kind)
        assert np.shares_memory(rj.data, xj.grad.data) == \
            np.shares_memory(re.data, xe.grad.data), (i, kind)
        # A write through the result: x.grad shows it where eager's does.
        rj.data[0, 0] = -3.0
        re.data[0, 0] = -3.0
        np.testing.assert_array_equal(xj.grad.data, xe.grad.data)
    assert jf.cache_info()["hits"] >= 3
