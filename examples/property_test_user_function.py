"""Test your own tracejit Function with tracejit.testing.

    python examples/property_test_user_function.py

A user-defined op (softplus, written as a Function with its own backward) is checked
three ways: one gradcheck on fixed inputs, a hypothesis property test over random
shapes and dtypes (run here directly, no pytest needed), and a check that gradcheck
does catch a broken backward.
"""
import os
import sys

import numpy as np
from hypothesis import given, settings

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tracejit as tj  # noqa: E402
import tracejit.functions as F  # noqa: E402
from tracejit.testing import gradcheck, strategies  # noqa: E402


class Softplus(tj.Function):
    """log(1 + exp(x)), computed without overflow for large x."""

    def forward(self, x):
        return np.logaddexp(x.dtype.type(0), x)

    def backward(self, gy):
        x, = self.inputs
        # Written with tracejit functions (not x.data), so it differentiates again:
        # second derivatives and the JIT both work.
        return gy * F.sigmoid(x)


def softplus(x):
    return Softplus()(x)


class BrokenSoftplus(Softplus):
    def backward(self, gy):
        x, = self.inputs
        return gy * F.sigmoid(-x)          # a typical slip: the sign inside sigmoid


# 1. One check on fixed inputs; second_order also checks the backward's own backward.
x = np.linspace(-3, 3, 12).reshape(3, 4)
assert gradcheck(softplus, x, second_order=True)


# 2. A property test over shapes and dtypes: the forward matches NumPy, float32 stays
#    float32, and gradients (first and second order) match central differences.
@settings(max_examples=50, deadline=None)
@given(data=strategies.shapes(max_side=4).flatmap(
    lambda shape: strategies.dtypes().flatmap(
        lambda dtype: strategies.arrays(shape, dtype, safe=strategies.SafeRange(-4, 4)))))
def test_softplus(data):
    y = softplus(tj.Variable(data))
    assert y.dtype == data.dtype and y.shape == data.shape
    ref = np.log1p(np.exp(data.astype(np.float64)))
    np.testing.assert_allclose(y.data, ref, rtol=1e-5 if data.dtype == np.float32 else 1e-12)
    gradcheck(softplus, data, second_order=True)


test_softplus()

# 3. gradcheck catches the broken backward, and says where.
try:
    gradcheck(lambda v: BrokenSoftplus()(v), x)
except AssertionError as e:
    print("caught as expected:", str(e).splitlines()[0][:120], "...")
else:
    raise AssertionError("gradcheck missed a wrong backward")

print("softplus: all checks passed")
