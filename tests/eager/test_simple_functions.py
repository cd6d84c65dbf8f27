"""DeZero's *_simple functions (compositions of primitives) and the book's step 47.

Each is gradient-checked over generated shapes (first and second order), compared
with its non-simple counterpart, and compiled by tj.jit with no fallback.
"""
import numpy as np
import pytest
from hypothesis import given, strategies as st

import tracejit as tj
import tracejit.functions as F
from tracejit.testing import assert_jit_matches_eager, gradcheck
from tracejit.testing import strategies as tst

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")


def _array(shape, seed, scale=1.0):
    return np.random.default_rng(seed).standard_normal(shape) * scale


@given(st.tuples(st.integers(1, 4), st.integers(1, 4), st.integers(1, 4)),
       st.booleans(), st.integers(0, 2 ** 16))
def test_linear_simple(dims, bias, seed):
    n, i, o = dims
    x, W, b = _array((n, i), seed), _array((i, o), seed + 1), _array((o,), seed + 2)
    args = (x, W, b) if bias else (x, W)
    np.testing.assert_allclose(F.linear_simple(*args).data, F.linear(*args).data)
    assert gradcheck(F.linear_simple, *args, second_order=True)


@given(tst.arrays(tst.shapes(max_dims=3, max_side=4)))
def test_sigmoid_simple(x):
    np.testing.assert_allclose(F.sigmoid_simple(x).data, F.sigmoid(x).data, rtol=1e-12,
                               atol=1e-15)
    assert gradcheck(F.sigmoid_simple, x, second_order=True)


@given(tst.shapes(min_dims=1, max_dims=3, max_side=4), st.integers(0, 2 ** 16),
       st.data())
def test_softmax_simple(shape, seed, data):
    axis = data.draw(st.integers(0, len(shape) - 1))
    x = _array(shape, seed)
    y = F.softmax_simple(x, axis=axis)
    np.testing.assert_allclose(y.data, F.softmax(x, axis=axis).data, rtol=1e-12)
    np.testing.assert_allclose(y.data.sum(axis=axis), 1.0)
    assert gradcheck(lambda a: F.softmax_simple(a, axis=axis), x, second_order=True)


def test_softmax_simple_is_the_books_unstabilised_version():
    # No max subtraction: large logits overflow where F.softmax does not.
    x = np.array([[1000.0, 0.0]])
    with np.errstate(over="ignore", invalid="ignore"):
        assert np.isnan(F.softmax_simple(x).data).any()
    np.testing.assert_allclose(F.softmax(x).data, [[1.0, 0.0]])


@given(tst.shapes(min_dims=1, max_dims=3, max_side=4), st.integers(0, 2 ** 16))
def test_mean_squared_error_simple(shape, seed):
    a, b = _array(shape, seed), _array(shape, seed + 1)
    np.testing.assert_allclose(F.mean_squared_error_simple(a, b).data,
                               F.mean_squared_error(a, b).data, rtol=1e-12)
    np.testing.assert_allclose(F.mean_squared_error_simple(a, b).data,
                               ((a - b) ** 2).sum() / len(a), rtol=1e-12)
    assert gradcheck(F.mean_squared_error_simple, a, b, second_order=True)


@given(st.integers(1, 5), st.integers(2, 5), st.integers(0, 2 ** 16))
def test_softmax_cross_entropy_simple(n, classes, seed):
    x = _array((n, classes), seed, scale=2.0)
    t = np.random.default_rng(seed).integers(0, classes, size=n)
    np.testing.assert_allclose(F.softmax_cross_entropy_simple(x, t).data,
                               F.softmax_cross_entropy(x, t).data, rtol=1e-10)
    assert gradcheck(F.softmax_cross_entropy_simple, x, t, second_order=True)
    assert gradcheck(F.softmax_cross_entropy_simple, x, tj.Variable(t))


def test_softmax_cross_entropy_simple_rejects_mismatched_labels():
    with pytest.raises(ValueError, match="N labels"):
        F.softmax_cross_entropy_simple(np.zeros((3, 4)), np.zeros(2, np.int64))


@pytest.mark.parametrize("name, make_args", [
    ("linear_simple", lambda: (_array((4, 3), 0), _array((3, 2), 1), _array((2,), 2))),
    ("sigmoid_simple", lambda: (_array((3, 4), 3),)),
    ("softmax_simple", lambda: (_array((3, 4), 4),)),
    ("mean_squared_error_simple", lambda: (_array((5, 1), 5), _array((5, 1), 6))),
    ("softmax_cross_entropy_simple", lambda: (_array((4, 3), 7), np.array([0, 2, 1, 2]))),
])
def test_simple_functions_compile(name, make_args):
    info = assert_jit_matches_eager(getattr(F, name), *make_args(), calls=3)
    assert info["fallbacks"] == 0


def test_step47_on_tracejit():
    # steps/step47.py with `dezero` -> tracejit (printing replaced by checks).
    np.random.seed(0)
    from tracejit import Variable, as_variable
    import tracejit.functions as F
    from tracejit.models import MLP

    def softmax1d(x):
        x = as_variable(x)
        y = F.exp(x)
        sum_y = F.sum(y)
        return y / sum_y

    model = MLP((10, 3))

    x = Variable(np.array([[0.2, -0.4]]))
    y = model(x)
    p = softmax1d(y)
    assert y.shape == (1, 3) and p.shape == (1, 3)
    np.testing.assert_allclose(p.data.sum(), 1.0)
    np.testing.assert_allclose(p.data, np.exp(y.data) / np.exp(y.data).sum())

    x = np.array([[0.2, -0.4], [0.3, 0.5], [1.3, -3.2], [2.1, 0.3]])
    t = np.array([2, 0, 1, 0])

    y = model(x)
    p = F.softmax_simple(y)
    assert p.shape == (4, 3)
    np.testing.assert_allclose(p.data.sum(axis=1), 1.0)

    loss = F.softmax_cross_entropy_simple(y, t)
    loss.backward()
    assert loss.shape == ()
    want = -np.log(p.data[np.arange(4), t]).mean()
    np.testing.assert_allclose(float(loss.data), want, rtol=1e-6)
    # Same gradients as the fused softmax_cross_entropy.
    grads = [p.grad.data.copy() for p in model.params()]
    model.cleargrads()
    F.softmax_cross_entropy(model(x), t).backward()
    for g, p in zip(grads, model.params()):
        np.testing.assert_allclose(g, p.grad.data, rtol=1e-5, atol=1e-7)
