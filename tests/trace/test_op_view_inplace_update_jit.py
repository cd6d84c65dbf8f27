"""A Variable that an op returns as a view of a buffer, used after an in-place update of
that buffer.

`h = F.reshape(a, ...)` (also F.transpose, F.expand_dims, F.flatten: any op whose eager
output is a view) of an ndarray argument or of a Variable is, in eager, a Variable whose
data is a view of the operand's buffer: `a *= 0.9` afterwards changes `h`, in its forward
uses after the update and in the backward of an op that reads it. The trace rebuilds such
a view from the buffer's new value at the update, so these compile and match eager. A
view made by a user Function cannot be rebuilt (its forward is the user's): a use of it
after the update runs eagerly with a warning naming the view's line and the update's (not
the generic "froze a value"). Each function is called at least four times with new
values, compared with eager on values, updated arguments and gradients.
"""
import warnings

import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F
from tracejit import Variable

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")


def reshape_of_array(x0, x2):
    h1 = F.reshape(x2, x2.shape + (1,))
    x2 *= 0.9
    return h1 * x0


def reshape_of_variable(x0, x2):
    h1 = F.reshape(x2, x2.shape + (1,))
    x2.data *= 0.9
    return h1 * x0


def transpose_of_array(x0, x2):
    h1 = F.transpose(x2)
    x2 -= 1.0
    return F.sum(h1 * x0, axis=1, keepdims=True)


def expand_dims_of_array(x0, x2):
    h1 = F.expand_dims(x2, 1)
    x2 += 2.0
    return h1 * x0


def flatten_of_reshape(x0, x2):
    h1 = F.flatten(F.reshape(x2, (1, 3)))      # a view of a view of x2
    x2 *= 0.5
    return F.reshape(h1, (3, 1)) * x0


def view_read_by_backward(x0, x2):
    h1 = F.reshape(x2, x2.shape + (1,))
    y = h1 * x0              # Mul's backward reads h1: eager's sees the update
    x2 *= 0.9
    return y


def view_not_read_after(x0, x2):
    h1 = F.reshape(x2, x2.shape + (1,))
    y = h1 + x0              # Add's backward does not read h1
    x2 *= 0.9
    return y


def view_without_update(x0, x2):
    h1 = F.reshape(x2, x2.shape + (1,))
    return h1 * x0


def make_args(rng, name):
    x0 = rng.normal(size=(3, 3)) if name == "transpose_of_array" else rng.normal(size=(3, 1))
    x2 = rng.normal(size=(3,)) if name != "transpose_of_array" else rng.normal(size=(3, 3))
    return x0, x2


def run_both(f, calls=5):
    jf = tj.jit(f)
    rng = np.random.default_rng(0)
    for _ in range(calls):
        a0, a2 = make_args(rng, f.__name__)
        res = []
        for fn in (f, jf):
            x0 = Variable(a0.copy())
            x2 = Variable(a2.copy()) if "variable" in f.__name__ else a2.copy()
            y = fn(x0, x2)
            F.sum(y * y).backward()
            res.append((y.data, x0.grad.data, x2.data if isinstance(x2, Variable) else x2,
                        x2.grad.data if isinstance(x2, Variable) else None))
        for e, c in zip(*res):
            if e is None:
                assert c is None
            else:
                np.testing.assert_allclose(c, e, rtol=1e-10, atol=1e-12)
    return jf


@pytest.mark.parametrize("f", [reshape_of_array, reshape_of_variable, transpose_of_array,
                               expand_dims_of_array, flatten_of_reshape,
                               view_read_by_backward])
def test_an_op_view_used_after_an_inplace_update_compiles_and_matches(f):
    jf = run_both(f)
    assert jf.cache_info()["hits"] >= 3


class Reverse(tj.Function):
    """A user Function whose output is a view of its input (x[::-1])."""

    def forward(self, x):
        return x[::-1]

    def backward(self, gy):
        return gy[::-1]


def user_view_of_variable(x0, x2):
    # The reshape's operand is the reversed view, which only the user's forward makes.
    h1 = F.reshape(Reverse()(x2), (3, 1))
    x2.data *= 0.9
    return h1 * x0


def test_a_user_function_view_used_after_an_update_runs_eagerly_named():
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always", tj.JitWarning)
        jf = run_both(user_view_of_variable)
    msgs = [str(x.message) for x in w if issubclass(x.category, tj.JitWarning)]
    assert len(msgs) == 1, msgs
    msg = msgs[0]
    assert "is used after an in-place update" in msg, msg
    assert "h1 = F.reshape(Reverse()(x2), (3, 1))" in msg and "x2.data *= 0.9" in msg, msg
    assert "froze a value" not in msg and "differs from eager" not in msg, msg
    assert jf.cache_info()["hits"] == 0


@pytest.mark.parametrize("f", [view_not_read_after, view_without_update])
def test_an_op_view_not_read_after_an_update_compiles(f):
    jf = run_both(f)
    assert jf.cache_info()["hits"] >= 3
