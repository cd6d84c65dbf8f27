"""A .grad the call's backward computes (`y = x * w; y.backward()` gives x.grad = gy * w)
is laid out in eager as its operands are: F order for F-ordered x and w (NumPy's
order='K'). The runner laid it out so (eager_layouts, laid_out: a transposed view of a
new buffer), then copied it as a view, in C order: x.grad's strides differed from
eager's, and F.reshape(x.grad, (-1,)) was a view of it where eager's copies. The
runner's copies of a result or .grad keep the array's layout (order='K')."""
import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F
from tracejit.core import Variable

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")

OPS = {
    "mul": lambda x, w: x * w,
    "exp_add": lambda x, w: F.exp(x) + w,
    "transposed": lambda x, w: F.transpose(x * w) * 2.0,
    "sum_axis": lambda x, w: F.sum(x - w, axis=0) * 1.0,
}


def _make(op):
    def f(x, w):
        x.cleargrad()
        w.cleargrad()
        y = op(x, w)
        y.backward()
        return F.reshape(x.grad, (-1,)), x.data.ravel(), F.reshape(w.grad, (-1, 1)), y
    return f


def _arrays(rs):
    return [r.data if isinstance(r, Variable) else r for r in rs]


@pytest.mark.parametrize("op", sorted(OPS))
def test_a_computed_grad_of_f_order_arguments_is_laid_out_and_aliased_as_eager(op):
    f = _make(OPS[op])
    jf = tj.jit(f)
    for c, kind in enumerate("CFFCFCFF"):
        a = np.arange(20.0).reshape(4, 5) / 7 + c
        b = np.full((4, 5), 0.5 + c)
        if kind == "F":
            a, b = np.asfortranarray(a), np.asfortranarray(b)
        xe, we = Variable(a.copy(order="K")), Variable(b.copy(order="K"))
        xj, wj = Variable(a.copy(order="K")), Variable(b.copy(order="K"))
        re, rj = f(xe, we), jf(xj, wj)
        le = [xe.grad.data, we.grad.data] + _arrays(re)
        lj = [xj.grad.data, wj.grad.data] + _arrays(rj)
        for m, (p, q) in enumerate(zip(le, lj)):
            np.testing.assert_allclose(q, p, rtol=1e-12)
            assert p.strides == q.strides, (c, kind, m)
            for n in range(m + 1, len(le)):
                assert np.shares_memory(p, le[n]) == np.shares_memory(q, lj[n]), \
                    (c, kind, m, n)
    assert jf.cache_info()["hits"] >= 3
