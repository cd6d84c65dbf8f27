"""A compiled call's results are eager's objects: identity, aliasing, creators, gradients.

Eager returns an argument, a captured Variable/Parameter/array, or `.data`/`.grad` of
one as that very object; one object returned in several places (`return y, y`) is one
object, so a loss using both places gets both cotangents in the backward; computed
values are fresh arrays of their own. Each test calls the jitted function at least three
times after its trace with new values (and a mutated captured Parameter where there is
one) and compares each call with eager on values, identity and gradients.
"""
import numpy as np
import pytest
from hypothesis import given, strategies as st

import tracejit as tj
import tracejit.functions as F
from tracejit import Parameter, Variable
from tracejit.testing import assert_jit_matches_eager

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")

CALLS = 6      # warm-up, trace, then four compiled calls


def compare_with_eager(f, make_args, captured=(), mutate=None, calls=CALLS, backward=True,
                       rtol=1e-6, **jit_options):
    """jit(f) beside f, call after call, on equal copies of new arguments (made by
    make_args from a fresh generator; `mutate` changes captured state before each
    call): assert_jit_matches_eager, with the captured objects named for the identity
    and gradient checks. Returns the jitted function."""
    jf = tj.jit(f, **jit_options)
    rng = np.random.default_rng(0)

    def args(call):
        if mutate is not None:
            mutate(rng)
        return make_args(np.random.default_rng(int(rng.integers(1 << 30))))

    info = assert_jit_matches_eager(f, make_args=args, calls=calls - 2, jitted=jf,
                                    captures=dict(captured), backward=backward,
                                    rtol=rtol, atol=1e-12)
    assert info["fallbacks"] == 0 and info["hits"] >= 1, info     # compiled calls ran
    return jf


def var_arg(shape=(3,)):
    return lambda rng: (Variable(rng.standard_normal(shape)),)


# ---------------------------------------------------------------- one object, many places

def test_fan_out_is_one_object_and_both_cotangents_reach_the_input():
    def f(x):
        y = F.exp(F.tanh(x))
        return y, y

    jf = compare_with_eager(f, var_arg())
    for _ in range(3):
        xv = np.random.randn(3)
        grads_ = []
        for fn in (f, jf):
            x = Variable(xv.copy())
            a, b = fn(x)
            assert a is b
            (F.sum(a * 2.0) + F.sum(b * 5.0)).backward()
            grads_.append(x.grad.data)
        np.testing.assert_allclose(grads_[1], grads_[0], rtol=1e-10)


@pytest.mark.parametrize("shape", [(3,), (), (2, 3)])
def test_repeats_nested_in_lists_dicts_and_tuples(shape):
    def f(x):
        y = F.tanh(x)
        z = y * 2.0
        return [y, {"a": y, "b": (y, x)}, (z, z, x)]

    compare_with_eager(f, var_arg(shape))


def test_an_output_that_another_output_is_computed_from():
    def f(x):
        y = F.exp(x)
        z = F.sin(y) * y
        return y, z, F.sum(z)

    compare_with_eager(f, var_arg((4,)))


def test_an_argument_returned_beside_a_value_computed_from_it():
    def f(x):
        return x, F.exp(x), x

    compare_with_eager(f, var_arg())


def _two_equal_views(x):
    m = x * x - 0.5
    return F.tanh(m), m.data[..., 1:], m.data[..., 1:]


@pytest.mark.parametrize("n", [1, 3])
def test_two_equal_views_of_a_value_are_two_objects_also_when_empty(n):
    # Of a (1,) value both views are empty: no memory, so not rebuilt as views, and
    # the passes merged them into one array, returned twice (fuzz program 3298: the
    # first-call check ran it eagerly). Eager's are two objects; so are compiled ones.
    rng = np.random.default_rng(n)
    info = assert_jit_matches_eager(
        _two_equal_views, make_args=lambda k: (Variable(rng.standard_normal(n)),), calls=4)
    assert info["fallbacks"] == 0, info
    jf = tj.jit(_two_equal_views)
    for _ in range(3):
        _, a, b = jf(Variable(rng.standard_normal(n)))
        assert a is not b and a.shape == (n - 1,)


def _two_equal_views_of_an_argument(x, a):
    return F.tanh(x), a[..., 1:], a[..., 1:]


@pytest.mark.parametrize("n", [1, 3])
def test_two_equal_views_of_an_ndarray_argument_are_two_objects_also_when_empty(n):
    # Rebuilt on the argument at return: an empty replay shares no memory, and was
    # taken for a copy, so the graph's one array came back twice (fuzz program 297 of
    # a 400-program run, found by the view-returned-twice statement).
    rng = np.random.default_rng(n)
    info = assert_jit_matches_eager(
        _two_equal_views_of_an_argument,
        make_args=lambda k: (Variable(rng.standard_normal(3)), rng.standard_normal((2, n))),
        calls=4)
    assert info["fallbacks"] == 0, info


def _two_reshapes_copied(x):
    m = x * 1.5
    c = Variable(m.data)
    return F.tanh(m), [c], m.data.reshape(-1), m.data.reshape(-1)


@pytest.mark.parametrize("order", ["F", "gathered"])
def test_two_equal_reshapes_that_numpy_copies_are_two_new_arrays(order):
    # m is not C-contiguous (a transposed argument's layout, or a gather's), so NumPy
    # answers each reshape(-1) with a copy: eager returns two new arrays. Compiled
    # calls kept the graph's value where the replay copied, one array for both (CSE
    # merged them; fuzz program 254: the first-call check ran it eagerly).
    rng = np.random.default_rng(4)

    def make(k):
        a = rng.standard_normal((3, 2 + k % 2))
        a = a.T if order == "F" else a[:, [1, 0, 1]]
        return (Variable(a),)
    info = assert_jit_matches_eager(_two_reshapes_copied, make_args=make, calls=5)
    assert info["fallbacks"] == 0, info
    jf = tj.jit(_two_reshapes_copied)
    for k in range(4):
        (x,) = make(k)
        _, (c,), a, b = jf(x)
        assert a is not b and not np.shares_memory(a, b), k
        assert not np.shares_memory(a, c.data) and not np.shares_memory(b, c.data), k
        np.testing.assert_array_equal(a, (x.data * 1.5).reshape(-1))
        np.testing.assert_array_equal(b, a)
    assert jf.cache_info()["fallbacks"] == 0, jf.cache_info()


def test_repeated_python_and_numpy_scalars_are_one_object():
    def f(x, lr):
        h = F.tanh(x) * lr
        s = h.data.sum()
        return h, s, s, lr, lr

    jf = compare_with_eager(f, lambda rng: (Variable(rng.standard_normal(3)),
                                            float(rng.uniform(0.1, 1.0))))
    lr = 0.25
    r = jf(Variable(np.ones(3)), lr)
    assert r[1] is r[2] and r[3] is lr and r[4] is lr
    assert type(r[1]) is np.float64


# ---------------------------------------------------------------- arguments and captures

def test_returned_ndarray_argument_is_that_array():
    def f(x, w):
        return x, w * 2.0, x

    compare_with_eager(f, lambda rng: (rng.standard_normal(3), Variable(rng.standard_normal(3))))


def test_ndarray_argument_updated_in_place_and_returned_is_that_array():
    def f(x):
        x += 1.0
        return x

    jf = tj.jit(f)
    for _ in range(CALLS):
        xv = np.random.randn(3)
        x = xv.copy()
        r = jf(x)
        assert r is x
        np.testing.assert_allclose(x, xv + 1.0)


def test_returned_data_of_an_argument_is_its_array():
    def f(x):
        return x.data, F.exp(x), x.data

    compare_with_eager(f, var_arg())


def test_data_updated_in_place_and_returned_is_the_arguments_array():
    def f(x):
        d = x.data
        d -= 1.0
        return d, F.sum(x)

    jf = tj.jit(f)
    for _ in range(CALLS):
        xv = np.random.randn(3)
        x = Variable(xv.copy())
        d, s = jf(x)
        assert d is x.data
        np.testing.assert_allclose(d, xv - 1.0)
        np.testing.assert_allclose(s.data, np.sum(xv - 1.0))
    assert jf.cache_info()["fallbacks"] == 0


def test_returned_captured_parameter_array_and_data_are_those_objects():
    P = Parameter(np.random.randn(3), name="P")
    Q = Parameter(np.random.randn(3), name="Q")     # returned, never used in an op
    A = np.random.randn(3)

    def f(x):
        return F.sum(P * x) + F.sum(A * x), P, Q, A, P.data, Q

    def mutate(rng):
        P.data += 0.1 * rng.standard_normal(3)      # in place: the same array object
        Q.data = rng.standard_normal(3)             # rebound: a new one

    compare_with_eager(f, var_arg(), captured={"P": P, "Q": Q, "A": A}, mutate=mutate)


def test_returned_grad_of_a_captured_parameter_is_its_current_grad():
    P = Parameter(np.random.randn(3), name="P")

    def f(x):
        return F.sum(P * x), P.grad

    jf = tj.jit(f)
    for k in range(CALLS):
        P.cleargrad()
        F.sum(P * P * float(k + 1)).backward()
        g = P.grad
        s, r = jf(Variable(np.random.randn(3)))
        assert r is g
    assert jf.cache_info()["fallbacks"] == 0


def test_returned_grad_set_by_a_backward_inside_is_that_grad():
    def f(x):
        loss = F.sum(F.exp(x) * x)
        loss.backward()
        return loss, x.grad, x.grad

    # x.grad is set by the call: "argument 0.grad after the call" in both places
    compare_with_eager(f, var_arg(), rtol=1e-10)


# A backward that passes its seed through unchanged (add, sub, a size-preserving
# reshape) leaves a .grad that no op computed: the seed Variable itself. Eager returns
# that very .grad; several Variables reached by the same pass-through share it.

def test_a_seed_passed_through_to_a_returned_grad_is_it():
    def f(x):
        y = x + 1.0
        y.backward()
        return x.grad

    compare_with_eager(f, var_arg())


def test_a_seed_passed_through_two_ops_returned_twice_is_one_grad():
    def f(x):
        y = x + 1.0
        z = y - 2.0
        z.backward()
        return x.grad, x.grad

    compare_with_eager(f, var_arg((2, 3)))


def test_a_seed_passed_through_to_a_captured_parameter_is_its_grad():
    W = Parameter(np.random.randn(3), name="W")

    def f(x):
        W.cleargrad()
        y = W + 1.0
        y.backward()
        return F.sum(W * x), W.grad

    def mutate(rng):
        W.data -= 0.1 * rng.standard_normal(3)

    compare_with_eager(f, var_arg(), captured={"W": W}, mutate=mutate)


def test_one_seed_on_two_arguments_is_one_grad_object():
    def f(x, w):
        y = x + w
        y.backward()
        return x.grad

    jf = compare_with_eager(f, lambda rng: (Variable(rng.standard_normal(3)),
                                            Variable(rng.standard_normal(3))))
    for _ in range(3):
        x, w = Variable(np.random.randn(3)), Variable(np.random.randn(3))
        r = jf(x, w)
        assert r is x.grad and x.grad is w.grad        # as eager: both are the seed


def test_a_retained_result_grad_that_is_an_argument_grad_is_that_object():
    def f(x):
        y = x + 1.0
        y.backward(retain_grad=True)
        return y, x.grad

    jf = compare_with_eager(f, var_arg())
    for _ in range(3):
        x = Variable(np.random.randn(3))
        y, g = jf(x)
        assert g is x.grad and y.grad is x.grad


def test_a_create_graph_seed_passed_through_stays_a_constant():
    def f(x):
        y = x + 1.0
        y.backward(create_graph=True)
        return x.grad

    jf = compare_with_eager(f, var_arg())
    x = Variable(np.random.randn(3))
    assert jf(x) is x.grad and type(x.grad) is type(f(Variable(np.ones(3))))


def test_a_create_graph_seed_on_two_arguments_is_one_constant():
    def f(x, w):
        y = x + w
        y.backward(create_graph=True)
        return x.grad, w.grad, F.sum(x * w)

    jf = compare_with_eager(f, lambda rng: (Variable(rng.standard_normal(3)),
                                            Variable(rng.standard_normal(3))))
    for _ in range(3):
        x, w = Variable(np.random.randn(3)), Variable(np.random.randn(3))
        gx, gw, _ = jf(x, w)
        assert gx is gw is x.grad is w.grad and type(gx) is tj.core.Constant


@pytest.mark.parametrize("backend", ["numba", "interpret"])
def test_a_passed_through_seed_changed_in_place_is_not_the_next_calls(backend):
    # The seed is an array of the trace the graph reads as a constant: each call's .grad
    # is a new array, so ClipGrad-style in-place changes do not reach the next call.
    def f(x):
        y = x + 1.0
        y.backward()
        return F.sum(x * 2.0)

    jf = tj.jit(f, backend=backend)
    for _ in range(CALLS):
        x = Variable(np.random.randn(3))
        jf(x)
        np.testing.assert_array_equal(x.grad.data, np.ones(3))
        x.grad.data *= 10.0
    assert jf.cache_info()["fallbacks"] == 0


def test_returned_float_argument_is_that_float():
    def f(x, lr):
        return x * lr, lr

    jf = tj.jit(f)
    for _ in range(CALLS):
        lr = float(np.random.rand())
        assert jf(Variable(np.ones(2)), lr)[1] is lr


# ---------------------------------------------------------------- fresh arrays, aliasing

def test_equal_computations_are_fresh_arrays_not_one_buffer():
    def f(x):
        return F.exp(x), F.exp(x), x * 1.0

    jf = compare_with_eager(f, var_arg())
    x = Variable(np.random.randn(3))
    a, b, c = jf(x)
    assert not np.shares_memory(a.data, b.data)
    assert not np.shares_memory(c.data, x.data)
    a.data[...] = 0.0
    assert np.all(b.data != 0.0)


def test_data_of_a_returned_variable_is_its_array():
    def f(x):
        h = F.tanh(x)
        return h, h.data, h.data.sum()

    jf = compare_with_eager(f, var_arg())
    h, d, s = jf(Variable(np.random.randn(3)))
    assert d is h.data


def test_data_of_an_unreturned_variable_twice_is_one_array():
    def f(x):
        h = F.tanh(x)
        return h.data, h.data

    jf = compare_with_eager(f, var_arg(), backward=False)
    a, b = jf(Variable(np.random.randn(3)))
    assert a is b


# ---------------------------------------------------------------- creators as eager

def test_an_output_computed_under_no_grad_has_no_creator():
    def f(x):
        with tj.no_grad():
            c = F.sigmoid(x)
        return c, F.exp(x)

    jf = compare_with_eager(f, var_arg())
    c, e = jf(Variable(np.random.randn(3)))
    assert c.creator is None and e.creator is not None


def test_a_new_variable_of_plain_data_has_no_creator():
    def f(x):
        return Variable(np.ones(3)), F.exp(x)

    compare_with_eager(f, var_arg())


# ---------------------------------------------------------------- random result trees

_POOL = ("x", "y", "z", "P", "A", "xd", "s")


def _atoms(x, P, A):
    y = F.exp(F.tanh(x))
    z = y * P
    return {"x": x, "y": y, "z": z, "P": P, "A": A, "xd": x.data, "s": F.sum(z)}


_tree = st.recursive(
    st.sampled_from(_POOL),
    lambda children: st.one_of(
        st.lists(children, min_size=1, max_size=3).map(tuple),
        st.lists(children, min_size=1, max_size=3),
        st.dictionaries(st.sampled_from("abc"), children, min_size=1, max_size=3)),
    max_leaves=6)


def _build(tree, atoms):
    if isinstance(tree, str):
        return atoms[tree]
    if isinstance(tree, dict):
        return {k: _build(v, atoms) for k, v in tree.items()}
    return type(tree)(_build(v, atoms) for v in tree)


@given(tree=_tree)
def test_random_result_trees_with_repeats_match_eager(tree):
    P = Parameter(np.random.randn(3), name="P")
    A = np.random.randn(3)

    def f(x):
        return _build(tree, _atoms(x, P, A))

    def mutate(rng):
        P.data += 0.1 * rng.standard_normal(3)

    compare_with_eager(f, var_arg(), captured={"P": P, "A": A}, mutate=mutate,
                       backend="interpret")


@pytest.mark.parametrize("which", [(0,), (1,), (2,), (0, 1), (1, 2)])
def test_backward_from_some_outputs_leaves_the_others_inputs_grad_none(which):
    # One creator makes all of a call's outputs; a backward from some of them must not
    # give the inputs only the others depend on a gradient (eager leaves it None).
    P = Parameter(np.random.randn(3), name="P")

    def f(x, w):
        return F.exp(x), F.sin(w), F.exp(x) * P

    jf = tj.jit(f)
    for call in range(CALLS):
        P.data += 0.1
        xv, wv = np.random.randn(3), np.random.randn(3)
        got = []
        for fn in (f, jf):
            P.cleargrad()
            x, w = Variable(xv.copy()), Variable(wv.copy())
            outs = fn(x, w)
            loss = None
            for k in which:
                term = F.sum(outs[k] * float(k + 1))
                loss = term if loss is None else loss + term
            loss.backward()
            got.append([None if v.grad is None else v.grad.data.copy() for v in (x, w, P)])
        for a, b in zip(*got):
            assert (a is None) == (b is None), (call, which, got)
            if a is not None:
                np.testing.assert_allclose(a, b, rtol=1e-10)
    assert jf.cache_info()["fallbacks"] == 0


def test_second_order_through_a_repeated_output_matches_eager():
    def f(x):
        y = F.tanh(x) * x
        return y, [y, F.exp(y)]

    jf = tj.jit(f)
    for call in range(CALLS):
        xv = np.random.randn(3)
        res = []
        for fn in (f, jf):
            x = Variable(xv.copy())
            a, (b, c) = fn(x)
            assert a is b
            F.sum(a * b * 2.0 + c).backward(create_graph=True)
            g = x.grad
            x.cleargrad()
            F.sum(g * g).backward()
            res.append((g.data.copy(), x.grad.data.copy()))
        for got, want in zip(res[1], res[0]):
            np.testing.assert_allclose(got, want, rtol=1e-10)
    assert jf.cache_info()["fallbacks"] == 0


@pytest.mark.parametrize("case", ["result", "result_first", "argument", "captured", "twice"])
def test_a_new_variable_of_an_array_eager_returns_holds_that_array(case):
    # `Variable(y.data)` (a detached copy of the graph, not of the data): eager's new
    # Variable holds y's array object itself, and has no creator.
    P = Parameter(np.random.randn(3), name="P")

    def f(x):
        y = F.exp(x) * P
        if case == "result":
            return y, Variable(y.data)
        if case == "result_first":
            return Variable(y.data), y
        if case == "argument":
            return y, Variable(x.data)
        if case == "captured":
            return y, Variable(P.data)
        z = Variable(y.data)
        return z, z, y

    def mutate(rng):
        P.data += 0.1 * rng.standard_normal(3)

    compare_with_eager(f, var_arg(), captured={"P": P}, mutate=mutate)


def test_a_variable_of_an_ndarray_argument_holds_that_array():
    def f(x, w):
        return Variable(x), F.exp(w) * Variable(x)

    compare_with_eager(f, lambda rng: (rng.standard_normal(3),
                                       Variable(rng.standard_normal(3))))


def test_a_list_or_dict_returned_in_several_places_is_one_object():
    def f(x):
        y = F.exp(x)
        pair = [y, x]
        d = {"a": pair}
        return pair, d, (pair, [pair]), d

    jf = compare_with_eager(f, var_arg())
    r = jf(Variable(np.random.randn(3)))
    assert r[0] is r[1]["a"] is r[2][0] is r[2][1][0] and r[1] is r[3]
    r[0].append(1)           # one list: eager's aliasing
    assert r[2][1][0][-1] == 1


def test_returned_grad_of_an_argument_is_this_calls_arguments_grad():
    def f(x):
        return F.exp(x), x.grad

    jf = tj.jit(f)
    for k in range(CALLS):
        xv = np.random.randn(3)
        x = Variable(xv.copy())
        x.grad = Variable(np.full(3, float(k)))
        e, g = jf(x)
        assert g is x.grad
        np.testing.assert_allclose(e.data, np.exp(xv), rtol=1e-12)
    assert jf.cache_info()["fallbacks"] == 0


def test_results_of_every_kind_leave_no_reference_cycle():
    import gc
    import weakref
    P = Parameter(np.random.randn(3), name="P")

    def f(x, a, lr):
        y = F.exp(x) * P
        return y, y, [x, a, lr], Variable(y.data), x.data, P

    jf = tj.jit(f)
    gc.collect()
    gc.disable()
    try:
        for _ in range(CALLS):
            x = Variable(np.random.randn(3))
            out = jf(x, np.random.randn(3), 0.5)
            probe = weakref.ref(out[0].creator)
            out[0].backward()
            del out
            x.cleargrad()
            P.cleargrad()
            assert probe() is None
    finally:
        gc.enable()
    assert jf.cache_info()["fallbacks"] == 0


# An array the function makes that the graph reads as a constant (np.ones(3), a
# backward's seed): eager returns a new one each call. The traced call's own result and
# each compiled call's are arrays of their own; changing one in place changes no other.

@pytest.mark.parametrize("backend", ["numba", "interpret"])
def test_an_array_made_in_the_call_is_a_new_array_every_call(backend):
    def f(x):
        return x * 2.0, np.ones(3)

    compare_with_eager(f, var_arg(), backend=backend)
    jf = tj.jit(f, backend=backend)     # its traced call's result changed in place too
    results = []
    for k in range(CALLS):
        r = jf(Variable(np.full(3, float(k))))[1]
        np.testing.assert_array_equal(r, np.ones(3))
        assert all(r is not s and not np.shares_memory(r, s) for s in results)
        results.append(r)
        for s in results:               # what the caller does with its results
            s += 10.0
    assert jf.cache_info()["fallbacks"] == 0


def test_a_returned_seed_whose_grad_was_cleared_is_a_new_variable_every_call():
    W = Parameter(np.random.randn(3), name="W")

    def f(x):
        y = W + 1.0
        y.backward()
        r = W.grad
        W.cleargrad()
        return r, F.sum(x * W)

    jf = compare_with_eager(f, var_arg(), captured={"W": W})
    kept = []
    for k in range(CALLS):
        W.cleargrad()                   # (the comparison's backward left one)
        r, _ = jf(Variable(np.random.randn(3)))
        np.testing.assert_array_equal(r.data, np.ones(3))
        kept.append(r)
        for s in kept:
            s.data *= 3.0
    assert jf.cache_info()["fallbacks"] == 0
