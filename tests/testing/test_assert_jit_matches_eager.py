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


# ---------------------------------------------------------------- the options of PR 10 item 6

def test_context_runs_each_sides_call_in_the_calls_mode():
    def f(x):
        return F.exp(x) * (2.0 if tj.Config.enable_backprop else 3.0)

    modes = [tj.no_grad, tj.test_mode, lambda: tj.using_config("enable_backprop", True)]
    info = assert_jit_matches_eager(f, make_args=_x, calls=4,
                                    context=lambda k: modes[k % 3]())
    assert info["fallbacks"] == 0
    # eager's side runs in no_grad too: it matches a jit side that is no_grad's f
    no_grad_f = tj.jit(lambda x: F.exp(x) * 3.0)
    with tj.no_grad():
        no_grad_f(*_x(0))                  # its trace, in no_grad (no creator)
    assert_jit_matches_eager(f, make_args=_x, jitted=no_grad_f, context=lambda k: tj.no_grad())
    with pytest.raises(AssertionError, match="creator|differs"):
        assert_jit_matches_eager(f, make_args=_x, jitted=tj.jit(lambda x: F.exp(x) * 3.0))
    with pytest.raises(AssertionError, match="creator"):   # jit's side outside no_grad
        assert_jit_matches_eager(
            f, make_args=_x, jitted=tj.jit(lambda x: _outside_no_grad(f, x)),
            context=lambda k: tj.no_grad())


def _outside_no_grad(f, x):
    with tj.using_config("enable_backprop", True):
        return f(x)


class _Boom(tj.Function):
    def forward(self, x):
        return x * 2.0

    def backward(self, gy):
        raise RuntimeError("no backward may run")


def test_backward_false_runs_no_backward_and_compares_no_gradients():
    def f(x):                        # eager's side: a backward would raise
        return _Boom()(x)

    assert_jit_matches_eager(f, make_args=_x, backward=False,
                             jitted=tj.jit(lambda x: x * 2.0))
    with pytest.raises(RuntimeError, match="no backward"):
        assert_jit_matches_eager(f, make_args=_x, jitted=tj.jit(lambda x: x * 2.0))
    with pytest.raises(AssertionError, match="differs"):       # values still compared
        assert_jit_matches_eager(f, make_args=_x, backward=False,
                                 jitted=tj.jit(lambda x: x * 2.5))


class _ScalarGrad(tj.Function):
    """A gradient whose data is a NumPy scalar (of the right value) for a 0-d input."""

    def forward(self, x):
        return x * 2.0

    def backward(self, gy):
        g = tj.Variable(np.array(0.0))
        g._data = np.float64(gy.data * 2.0)
        return g


def test_gradients_are_compared_on_their_kind():
    from tracejit.testing.checks import _assert_results_match, _results_and_grads
    x = tj.Variable(np.array(0.5))
    want = _results_and_grads(lambda x: x * 2.0, [x], 0)
    got = _results_and_grads(lambda x: _ScalarGrad()(x), [x], 0)
    _assert_results_match(want, want, 1e-6, 1e-9, "call")
    with pytest.raises(AssertionError, match="gradient of argument 0 .*float64"):
        _assert_results_match(got, want, 1e-6, 1e-9, "call")


def test_results_returned_as_a_returned_argument_get_its_cotangent():
    # Every float Variable result is in the loss, creator or not: an argument
    # returned as itself gets its cotangent, and a copy returned instead misses it.
    from tracejit.testing.checks import _assert_results_match, _results_and_grads
    x = tj.Variable(np.arange(3.0))
    want = _results_and_grads(lambda x: (x, F.exp(x)), [x], 0)
    got = _results_and_grads(lambda x: (tj.Variable(x.data.copy()), F.exp(x)), [x], 0)
    got = (got[0], got[1], got[2], want[3])            # identities equal: the gradient
    with pytest.raises(AssertionError, match="gradient of argument 0"):
        _assert_results_match(got, want, 1e-6, 1e-9, "call")


def test_creators_with_float_arguments_skips_only_calls_without_one():
    def f(x, k):
        return x * 2.0

    def no_creator(x, k):
        return tj.Variable((x * 2.0).data)

    ints = lambda i: [tj.Variable(np.arange(3) + i), 1]       # noqa: E731
    floats = lambda i: [tj.Variable(np.arange(3.0) + i), 1]   # noqa: E731
    with pytest.raises(AssertionError, match="creator"):
        assert_jit_matches_eager(f, make_args=ints, jitted=tj.jit(no_creator),
                                 backward=False)
    assert_jit_matches_eager(f, make_args=ints, jitted=tj.jit(no_creator), backward=False,
                             creators="with float arguments")
    with pytest.raises(AssertionError, match="creator"):
        assert_jit_matches_eager(f, make_args=floats, jitted=tj.jit(no_creator),
                                 backward=False, creators="with float arguments")
    with pytest.raises(ValueError, match="creators"):
        assert_jit_matches_eager(f, make_args=floats, creators="never")


def test_captures_names_captured_objects_their_data_and_grad_in_the_identity_check():
    P = tj.Parameter(np.array([0.5, -1.0, 2.0, 0.25]), name="P")
    A = np.arange(4.0)

    def f(x):
        return F.sum(P * x), P, P.data, A, P.grad

    def copies(what):
        def g(x):
            r = list(f(x))
            i = {"P": 1, "P.data": 2, "A": 3}[what]
            r[i] = tj.Parameter(P.data.copy()) if what == "P" else r[i].copy()
            return tuple(r)
        return g

    def make(i):
        P.data += 0.1                                         # in place, both sides see it
        P.grad = tj.Variable(np.full(4, float(i)))
        return _x(i)

    assert_jit_matches_eager(f, make_args=make, captures={"P": P, "A": A}, backward=False)
    for what in ("P", "P.data", "A"):
        with pytest.raises(AssertionError, match="jit gave a new object"):
            assert_jit_matches_eager(f, make_args=make, captures={"P": P, "A": A},
                                     backward=False, jitted=tj.jit(copies(what)))


def test_captures_compares_the_gradients_of_captured_variables():
    P = tj.Parameter(np.array([0.5, -1.0, 2.0, 0.25]), name="P")

    def f(x):
        return F.sum(P * x)

    def detaches_p(x):
        return F.sum(tj.Variable(P.data) * x)

    assert_jit_matches_eager(f, make_args=_x, captures={"P": P})
    assert_jit_matches_eager(f, make_args=_x, jitted=tj.jit(detaches_p))   # not looked at
    with pytest.raises(AssertionError, match=r"gradient of captures\['P'\]"):
        assert_jit_matches_eager(f, make_args=_x, captures={"P": P},
                                 jitted=tj.jit(detaches_p))


def test_a_grad_returned_is_that_grad_on_both_sides():
    def f(x):
        return F.exp(x), x.grad

    def copies(x):
        return F.exp(x), tj.Variable(x.grad.data.copy())

    def make(i):
        x, = _x(i)
        x.grad = tj.Variable(np.full(4, float(i)))            # copied with the argument
        return [x]

    assert_jit_matches_eager(f, make_args=make)
    with pytest.raises(AssertionError, match=r"argument 0\.grad"):
        assert_jit_matches_eager(f, make_args=make, jitted=tj.jit(copies))


def test_one_list_in_two_places_is_one_list_in_both():
    def f(x):
        pair = [F.exp(x), x]
        return pair, pair

    def two(x):
        return [F.exp(x), x], [F.exp(x), x]

    assert_jit_matches_eager(f, make_args=_x)
    with pytest.raises(AssertionError, match="the object of output"):
        assert_jit_matches_eager(f, make_args=_x, jitted=tj.jit(two))


def test_an_argument_given_twice_is_one_object_on_each_side():
    def f(a, b):
        return F.exp(a), a is b

    assert_jit_matches_eager(f, make_args=lambda i: [_x(i)[0]] * 2)


def test_parameter_arguments_stay_parameters():
    from tracejit.testing.checks import _copy_args

    def f(x):
        return x, F.exp(x)

    info = assert_jit_matches_eager(f, make_args=lambda i: [tj.Parameter(_x(i)[0].data)])
    assert info["fallbacks"] == 0
    p = tj.Parameter(np.arange(3.0), name="p")
    p.grad = tj.Variable(np.ones(3))
    a, b, c = _copy_args([p, p, np.asfortranarray(np.ones((2, 2)))])
    assert type(a) is tj.Parameter and a.name == "p" and a is b and a is not p
    assert a.data is not p.data and np.array_equal(a.grad.data, p.grad.data)
    assert a.grad is not p.grad and c.flags.f_contiguous


def _counter(step=1.0, gscale=2.0, returns="w"):
    w = tj.Parameter(np.zeros(4), name="w")
    q = tj.Parameter(np.zeros(4), name="q")

    def f(x):                                  # state the function writes
        w.data = w.data + x.data
        q.data = q.data + step * x.data
        q.grad = tj.Variable(x.data * gscale)
        return F.sum(x * w), (w if returns == "w" else q)
    return f, {"w": w, "more": [q]}


def test_make_function_gives_each_side_its_own_state_and_compares_it():
    info = assert_jit_matches_eager(make_function=_counter, make_args=_x, calls=3)
    assert info["fallbacks"] == 0
    # A wrong jit side made by hand: the first make_function call is the jit side's.
    for wrong, message in (
            (lambda: _counter(step=2.0), r"state\['more'\]\[0\]: differs"),
            (lambda: _counter(gscale=3.0), r"gradient of state\['more'\]\[0\]"),
            (lambda: _counter(returns="q"), r"output\[1\]: jit gave state\['more'\]")):
        sides = iter([wrong, _counter])
        with pytest.raises(AssertionError, match=message):
            assert_jit_matches_eager(make_function=lambda: next(sides)(), make_args=_x,
                                     calls=1, backward=False)
    with pytest.raises(TypeError, match="make_function"):
        assert_jit_matches_eager(F.exp, make_function=_counter, make_args=_x)


def test_assert_call_matches_eager_compares_one_call_with_its_states_and_keywords():
    from tracejit.testing.checks import assert_call_matches_eager
    fj, sj = _counter()
    fe, se = _counter()
    jf = tj.jit(fj)
    for k in range(4):
        y = assert_call_matches_eager(jf, fe, *_x(k), states=(sj, se),
                                      context=tj.test_mode)
        assert y[1] is sj["w"]                         # the jit side's result
    assert jf.cache_info()["hits"] >= 1
    (wj, sw), (fe, se) = _counter(step=2.0), _counter()
    with pytest.raises(AssertionError, match=r"call 3: state\['more'\]\[0\]: differs"):
        assert_call_matches_eager(tj.jit(wj), fe, *_x(0), states=(sw, se), what="call 3")

    def g(x, scale=1.0):
        return F.exp(x) * scale

    assert_call_matches_eager(tj.jit(g), g, *_x(0), kwargs={"scale": np.array(2.0)})
    with pytest.raises(AssertionError, match="differs"):
        assert_call_matches_eager(tj.jit(lambda x, scale: g(x, scale * 2.0)), g, *_x(0),
                                  kwargs={"scale": np.array(2.0)})
    with pytest.raises(AssertionError, match="creator"):
        assert_call_matches_eager(tj.jit(lambda x: _outside_no_grad(F.exp, x)), F.exp,
                                  *_x(0), context=tj.no_grad)


def test_a_variable_and_its_data_given_together_stay_aliased():
    from tracejit.testing.checks import _copy_args
    x = tj.Variable(np.arange(3.0))
    for args in ([x, x.data], [x.data, x]):
        a, b = _copy_args(args)
        v, d = (a, b) if isinstance(a, tj.Variable) else (b, a)
        assert v.data is d and d is not x.data

    def f(x, d):
        return F.exp(x) + d, d     # d is "argument 0.data" on both sides

    assert_jit_matches_eager(f, make_args=lambda i: (lambda v: [v, v.data])(_x(i)[0]))


def test_identity_false_leaves_out_only_the_identity_comparison():
    def f(x):
        return x, F.exp(x)

    def copies(x):
        return tj.Variable(x.data.copy()), F.exp(x)

    def copies_wrong(x):
        return tj.Variable(x.data * 2.0), F.exp(x)

    with pytest.raises(AssertionError, match="new object"):
        assert_jit_matches_eager(f, make_args=_x, jitted=tj.jit(copies), backward=False)
    assert_jit_matches_eager(f, make_args=_x, jitted=tj.jit(copies), backward=False,
                             identity=False)
    with pytest.raises(AssertionError, match="differs"):
        assert_jit_matches_eager(f, make_args=_x, jitted=tj.jit(copies_wrong),
                                 backward=False, identity=False)
