"""tracejit.testing.assert_jit_matches_eager, the suite's one comparison of jit with eager:
it passes for a function that compiles, and fails for every difference it promises to
find (kind, identity, creator, container, value, gradient of any order, a captured
Parameter's data or gradient, a fallback). The failing cases check a deliberately
different "jitted" function (the `jitted` option) against f.

0-d arguments (Variable and ndarray) are taken: their perturbed copies are 0-d arrays
(a TypeError from Variable(np.float64) before)."""
import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F
from tracejit.testing import assert_jit_matches_eager


def test_zero_d_variable_beside_rank_3():
    info = assert_jit_matches_eager(lambda s, x: F.tanh(s * x + s),
                                    tj.Variable(np.array(0.3)),
                                    tj.Variable(np.random.RandomState(0).rand(2, 1, 3)))
    assert info["hits"] >= 3


def test_zero_d_ndarray_argument():
    info = assert_jit_matches_eager(lambda s, x: F.sum(F.exp(x * s)), np.array(0.5),
                                    tj.Variable(np.random.RandomState(1).rand(4)))
    assert info["hits"] >= 3


def test_assert_jit_matches_eager_passes_for_a_compiling_function():
    W = tj.Parameter(np.random.default_rng(0).standard_normal((3, 2)))
    info = assert_jit_matches_eager(lambda x, b: F.tanh(F.matmul(x, W) + b),
                                    np.random.default_rng(1).standard_normal((4, 3)),
                                    tj.Variable(np.zeros(2)))
    assert info["fallbacks"] == 0 and info["hits"] >= 3


def test_assert_jit_matches_eager_fails_on_a_fallback():
    def f(x):
        x.data.tolist()            # an escape: the variant runs eagerly, with a warning
        return F.sin(x)

    with pytest.raises((AssertionError, tj.JitWarning), match="eagerly|fell back"):
        assert_jit_matches_eager(f, np.random.default_rng(2).uniform(-2, 2, (3, 4)))


def test_assert_jit_matches_eager_with_numpy_scalars():
    def f(x):
        return x, x.data.sum()

    assert_jit_matches_eager(f, np.random.randn(3))


def test_assert_jit_matches_eager_with_trees_and_repeats():
    def f(x, w):
        h = F.tanh(x * w)
        return {"h": h, "again": (h, h.data), "s": float(h.data.sum() > 0), "x": x}

    assert_jit_matches_eager(f, np.random.randn(3), tj.Variable(np.random.randn(3)))


def test_assert_jit_matches_eager_compares_kinds_identity_and_creators():
    from tracejit.testing.checks import _assert_results_match, _results_and_grads
    x = tj.Variable(np.random.randn(3))
    runs = {
        "arg": lambda x: x,
        "copy": lambda x: tj.Variable(x.data.copy()),
        "twice": lambda x: (lambda y: (y, y))(F.exp(x)),
        "two": lambda x: (F.exp(x), F.exp(x)),
        "detached": lambda x: tj.Variable(F.exp(x).data),
        "computed": lambda x: F.exp(x),
        "scalar": lambda x: x.data.sum(),
        "float": lambda x: float(x.data.sum()),
    }
    results = {k: _results_and_grads(fn, [x], 0) for k, fn in runs.items()}
    for got, want in [("copy", "arg"), ("two", "twice"), ("detached", "computed"),
                      ("float", "scalar")]:
        with pytest.raises(AssertionError):
            _assert_results_match(results[got], results[want], 1e-6, 1e-9, "call")
        _assert_results_match(results[want], results[want], 1e-6, 1e-9, "call")


class _CubeDetached(tj.Function):
    """x ** 3 whose backward reads x's data: right first order, no second order."""

    def forward(self, x):
        return x ** 3

    def backward(self, gy):
        return gy * 3 * self.inputs[0].data ** 2


def _x(i):
    return [tj.Variable(np.linspace(-1.0, 1.0, 4) + 0.1 * i)]


def test_make_args_gives_each_call_its_arguments():
    def f(x, k):
        return F.sum(F.tanh(x) * k)

    info = assert_jit_matches_eager(f, make_args=lambda i: _x(i) + [2], calls=3)
    assert info["calls"] == 5 and info["fallbacks"] == 0
    with pytest.raises(TypeError, match="either"):
        assert_jit_matches_eager(f, *_x(0), make_args=_x)


def test_a_container_of_another_type_fails():
    def f(x):
        return (x * 2.0, F.exp(x))

    def as_list(x):
        return [x * 2.0, F.exp(x)]

    with pytest.raises(AssertionError, match="list"):
        assert_jit_matches_eager(f, make_args=_x, jitted=tj.jit(as_list))


def test_second_order_compares_the_gradients_of_gradients():
    def f(x):
        return F.sum(x ** 3)

    def detached(x):
        return F.sum(_CubeDetached()(x))

    assert_jit_matches_eager(f, make_args=_x, jitted=tj.jit(detached))   # first order
    with pytest.raises(AssertionError, match="second-order gradient of argument 0"):
        assert_jit_matches_eager(f, make_args=_x, jitted=tj.jit(detached), second_order=True)
    assert_jit_matches_eager(f, make_args=_x, second_order=True)


def test_params_compares_a_captured_parameters_data_and_gradient():
    P = tj.Parameter(np.array([0.5, -1.0, 2.0, 0.25]))

    # The gradients do not depend on P's data: the differences below are P's own.
    def f(x):
        y = F.sum(F.tanh(x)) + F.sum(P)
        P.data -= 0.1 * x.data
        return y

    def steps_twice(x):
        y = F.sum(F.tanh(x)) + F.sum(P)
        P.data -= 0.2 * x.data
        return y

    def detaches_p(x):
        q = tj.Variable(P.data.copy())
        y = F.sum(F.tanh(x)) + F.sum(q)
        P.data -= 0.1 * x.data
        return y

    start = P.data.copy()
    assert_jit_matches_eager(f, make_args=_x, params=[P], second_order=True)
    assert not np.array_equal(P.data, start)          # the updates did run
    with pytest.raises(AssertionError, match=r"params\[0\]\.data after the call"):
        assert_jit_matches_eager(f, make_args=_x, params=[P], jitted=tj.jit(steps_twice))
    with pytest.raises(AssertionError, match=r"gradient of params\[0\]"):
        assert_jit_matches_eager(f, make_args=_x, params=[P], jitted=tj.jit(detaches_p))


def test_jit_options_and_an_already_jitted_function_exclude_each_other():
    with pytest.raises(TypeError, match="already jitted"):
        assert_jit_matches_eager(F.tanh, *_x(0), jitted=tj.jit(F.tanh), max_variants=2)


def test_allow_fallback_still_compares_every_call():
    def f(x):
        x.data.tolist()            # an escape: every compiled call runs eagerly
        return F.sin(x)

    def g(x):
        x.data.tolist()
        return F.cos(x)

    with pytest.warns(tj.JitWarning, match="eagerly"):
        info = assert_jit_matches_eager(f, make_args=_x, allow_fallback=True)
    assert info["fallbacks"] >= 1
    with pytest.raises(AssertionError, match="differs"):        # at the warm-up call
        assert_jit_matches_eager(f, make_args=_x, allow_fallback=True, jitted=tj.jit(g))


def test_make_args_passes_ndarrays_as_given_each_side_its_copy():
    def f(x, a):
        a *= 2.0                   # in place: each side must get its own copy
        return F.sum(x * a), a

    assert_jit_matches_eager(f, make_args=lambda i: [
        tj.Variable(np.linspace(-1.0, 1.0, 3) + i), np.arange(3.0) + i], calls=3)


def test_an_argument_updated_otherwise_than_eager_fails():
    def f(x, a):
        a *= 2.0
        return F.sum(F.tanh(x))

    def g(x, a):
        a *= 3.0
        return F.sum(F.tanh(x))

    with pytest.raises(AssertionError, match="argument 1 after the call"):
        assert_jit_matches_eager(f, make_args=lambda i: [
            tj.Variable(np.linspace(-1.0, 1.0, 3) + i), np.arange(3.0) + i], jitted=tj.jit(g))


def test_a_parameter_left_holding_another_kind_of_data_fails():
    w = tj.Parameter(np.array(0.0))

    def f(x):
        w.data = np.asarray(np.dot(x.data, x.data))         # a 0-d array

    def g(x):
        w._data = np.dot(x.data, x.data)                    # a NumPy scalar, same value

    make = lambda i: [tj.Variable(np.arange(3.0) + i)]      # noqa: E731
    assert_jit_matches_eager(f, make_args=make, params=[w], calls=2)
    with pytest.raises(AssertionError, match="float64"):
        assert_jit_matches_eager(f, make_args=make, params=[w], jitted=tj.jit(g))
