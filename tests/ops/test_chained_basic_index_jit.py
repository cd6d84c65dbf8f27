"""Chains of basic indexing under jit: x[k1][k2][k3] with slices of any start and step
(negative steps and starts, offsets), ints, None and Ellipsis, on a captured Parameter
and on an argument, through an elementwise op, forward and gradient, float32 and
float64, compiled == eager call after call.

The movement ops of a chain fold into the kernel that reads them: the outer op's index
source is the inner op's loop index, so every op's index arithmetic must treat it as
one operand (x[..., ::-1][..., ::-1] in one kernel read c1 - c0 - i0, not
c1 - (c0 - i0): a Parameter's gradient was 0 off the first element). The gradients of
such a chain are chains of GetItemGrads (masked reads), fused with the update
W.data -= lr * W.grad.data that reads them.
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
def basic_key(draw, shape):
    """A basic index of an array of `shape` selecting at least one element: one entry
    per axis (a slice, often reversing, or an int), with None and one Ellipsis drawn in
    between. Returns (key, shape of the result)."""
    key = []
    for d in shape:
        kind = draw(st.sampled_from(["slice", "slice", "slice", "full", "int"]))
        if kind == "int" and len(shape) > 1:
            key.append(draw(st.integers(-d, d - 1)))
        elif kind == "full":
            key.append(slice(None))
        else:
            bound = st.one_of(st.none(), st.integers(-d - 1, d + 1))
            step = draw(st.sampled_from([None, 1, 2, -1, -1, -2, -3]))
            key.append(slice(draw(bound), draw(bound), step))
        if draw(st.integers(0, 5)) == 0:
            key.append(None)
    if draw(st.booleans()):
        # Ellipsis in place of the leading or trailing full slices (or of none).
        at = draw(st.sampled_from(["front", "back"]))
        if at == "back":
            while key and key[-1] == slice(None):
                key.pop()
            key.append(Ellipsis)
        else:
            while key and key[0] == slice(None):
                key.pop(0)
            key.insert(0, Ellipsis)
    key = tuple(key)
    out = np.empty(shape)[key].shape
    if 0 in out or out == ():
        key, out = (Ellipsis, slice(None, None, -1)), shape[:-1] + (shape[-1],)
    return key, out


@st.composite
def index_chains(draw):
    """(shape, [key, ...], result shape): a chain of 1-3 basic indexes."""
    ndim = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(2, 5), min_size=ndim, max_size=ndim)))
    keys, cur = [], shape
    for _ in range(draw(st.integers(1, 3))):
        k, cur = draw(basic_key(cur))
        keys.append(k)
    return shape, keys, cur


def chain(v, keys):
    for k in keys:
        v = v[k]
    return v


def tolerances(dtype):
    return dict(rtol=2e-5, atol=1e-6) if dtype == np.float32 else {}


@settings(max_examples=30, deadline=None)
@given(ch=index_chains(), dtype=st.sampled_from([np.float32, np.float64]),
       seed=st.integers(0, 2 ** 16))
def test_a_chain_on_a_captured_parameter_updated_by_its_gradient(ch, dtype, seed):
    shape, keys, out = ch
    W = tj.Parameter(np.random.default_rng(seed).uniform(-1, 1, shape).astype(dtype))

    def f(x):
        h = F.tanh(x * chain(W, keys))
        loss = F.mean(h ** 2)
        W.cleargrad()
        loss.backward()
        W.data -= 0.1 * W.grad.data
        return h

    def make_args(call):
        r = np.random.default_rng(seed + 1 + call)
        return (tj.Variable(r.uniform(-1, 1, (2,) + out).astype(dtype)),)

    info = assert_jit_matches_eager(f, make_args=make_args, params=(W,), calls=4,
                                    **tolerances(dtype))
    assert info["hits"] >= 3, (keys, info)


@settings(max_examples=30, deadline=None)
@given(ch=index_chains(), dtype=st.sampled_from([np.float32, np.float64]),
       seed=st.integers(0, 2 ** 16))
def test_a_chain_on_an_argument(ch, dtype, seed):
    shape, keys, out = ch

    def f(a, x):
        v = chain(a, keys)
        return F.tanh(x * v) + chain(a * 2.0, keys)

    def make_args(call):
        r = np.random.default_rng(seed + 1 + call)
        return (tj.Variable(r.uniform(-1, 1, shape).astype(dtype)),
                tj.Variable(r.uniform(-1, 1, out).astype(dtype)))

    info = assert_jit_matches_eager(f, make_args=make_args, calls=4, **tolerances(dtype))
    assert info["hits"] >= 3, (keys, info)


def test_the_reported_double_reversal_of_a_parameter():
    W = tj.Parameter(np.random.default_rng(339).uniform(-1, 1, (5,)).astype(np.float32))

    def f(x):
        view = W[..., ::-1]
        h = F.tanh(x * view[..., ::-1])
        loss = F.mean(h ** 2)
        W.cleargrad()
        loss.backward()
        W.data -= 0.1 * W.grad.data
        return h

    r = np.random.default_rng(0)
    info = assert_jit_matches_eager(
        f, make_args=lambda k: (tj.Variable(r.uniform(-1, 1, (5, 5))),), params=(W,))
    assert info["hits"] >= 3
