"""A leaf the call makes of an input's data (`c = Variable(x.data)`, down a chain
`c2 = Variable(c.data)`, returned or not) holds the array the input had at the call:
after the caller rebinds `x.data` (or a captured Parameter's) before the backward,
eager's backward reads x's uses from the new array and c's from the old one. The
compiled backward, plain or create_graph (and the second order through it), gives
eager's gradients.

Each test calls the jitted function six times with new values and a captured Parameter
changed between calls, comparing each call with eager; a fallback fails the test.
"""
import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F
from tracejit import Variable

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")

W = tj.Parameter(np.array([0.5, -1.0, 0.25]))


def _of_the_argument(x, keep):
    c1 = Variable(x.data)
    c2 = Variable(c1.data)
    y = x * c1 * W + c2 * 0.5 + F.sin(c2) * x
    return y, [(c1, c2)[k] for k in keep]


def _of_the_parameter(x, keep):
    c1 = Variable(W.data)
    c2 = Variable(c1.data)
    y = x * W * c1 + F.sin(c2) * W
    return y, [(c1, c2)[k] for k in keep]


def _rebind_argument(x):
    x.data = x.data * 0.5 + 0.125


def _rebind_parameter(x):
    W.data = W.data * 0.5 + 0.125


CASES = {"argument": (_of_the_argument, _rebind_argument),
         "parameter": (_of_the_parameter, _rebind_parameter)}
_JITTED = {}


def _run(fn, call, keep, rebind, create_graph):
    W.data = np.array([0.5, -1.0, 0.25]) * (1.0 + 0.1 * call)   # changed between calls
    W.cleargrad()
    x = Variable(np.linspace(-1.0, 1.0, 3) + 0.2 * call)
    y, made = fn(x, keep)
    if call % 2 == 0:
        rebind(x)
    F.sum(y * y * np.array([1.0, -2.0, 0.5])).backward(create_graph=create_graph)
    out = [y.data.copy(), x.grad.data.copy(), W.grad.data.copy()]
    out += [c.grad.data.copy() for c in made]
    if create_graph:
        gx, gw = x.grad, W.grad
        x.cleargrad()
        W.cleargrad()
        F.sum(gx * gx + gw * gw).backward()
        out += [x.grad.data.copy(), W.grad.data.copy()]
    return out


@pytest.mark.parametrize("create_graph", [False, True], ids=["plain", "create_graph"])
@pytest.mark.parametrize("keep", [(), (0,), (1,), (0, 1)],
                         ids=["none_returned", "leaf", "chain_end", "chain"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_rebind_after_the_call_made_a_leaf_of_it(case, keep, create_graph):
    fn, rebind = CASES[case]
    key = (case, keep)
    jf = _JITTED.get(key) or _JITTED.setdefault(key, tj.jit(lambda x, k: fn(x, k)))
    before = jf.cache_info()["hits"]
    for call in range(6):
        want = _run(fn, call, keep, rebind, create_graph)
        got = _run(jf, call, keep, rebind, create_graph)
        assert len(got) == len(want)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12)
    info = jf.cache_info()
    assert info["fallbacks"] == 0 and info["hits"] - before >= 4, info


def _float32_beside_a_float64_parameter(x):
    c = Variable(x.data)
    return F.sin(x * c), c, F.tanh(W) * 2.0


def test_rebind_with_a_float64_cotangent_into_a_float32_result():
    # A float64 cotangent into the float32 result takes the interpreted backward graph
    # (NumPy's promotion), which has one value for x and c as the kernels do.
    jf = tj.jit(_float32_beside_a_float64_parameter)
    for call in range(6):
        W.data = np.array([0.5, -1.0, 0.25]) * (1.0 + 0.1 * call)
        seen = []
        for fn in (_float32_beside_a_float64_parameter, jf):
            W.cleargrad()
            x = Variable((np.linspace(-1.0, 1.0, 3) + 0.2 * call).astype(np.float32))
            y, c, z = fn(x)
            if call % 2 == 0:
                x.data = x.data * 0.5 + 0.125
            F.sum(y * y + z).backward()
            seen.append([y.data, x.grad.data, c.grad.data, W.grad.data])
        for got, want in zip(seen[1], seen[0]):
            assert got.dtype == want.dtype
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    info = jf.cache_info()
    assert info["fallbacks"] == 0 and info["hits"] >= 4, info
