"""A result eager returns as a view of an argument's, a captured array's or Parameter's,
or another result's buffer comes back from a compiled call as a view of the same buffer,
with the same layout: writing into it changes the buffer (and the reverse), as in eager.

`x.data[0:2]`, `x.data.T`, `x.data.reshape(-1)`, F.reshape(x), F.transpose(x), a captured
array's slice and `a.data[1:]` next to `a` are NumPy views in eager; F.get_item (x[0:2])
is a copy in eager and stays one. Each case runs eager and jit side by side on equal
copies of new arguments and of captured state mutated before every call, and compares
values, which results share memory with which buffers, strides, and what a write into
each result does to every buffer.
"""
import itertools

import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F
from tracejit import Parameter, Variable

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")

CALLS = 6      # warm-up, trace, then four compiled calls
# The numba backend's plans hand out some movements of an input as NumPy views by
# themselves; the interpret backend does not: the rebuild must not rely on either.
BACKENDS = ["auto", "interpret"]


def _arrays(obj):
    """The arrays of a result or argument tree (a Variable's data), in order."""
    if isinstance(obj, Variable):
        return [obj.data]
    if isinstance(obj, np.ndarray):
        return [obj]
    if isinstance(obj, (tuple, list)):
        return [a for x in obj for a in _arrays(x)]
    return []


def _mutate(rng, caps):
    for c in caps:
        a = c.data if isinstance(c, Variable) else c
        a[...] = rng.standard_normal(a.shape)


def check_aliasing(build, make_args, calls=CALLS, **jit_options):
    """build() -> (f, captured objects): called twice, one copy for eager, one for jit.
    Returns the jitted function."""
    fe, cap_e = build()
    fj, cap_j = build()
    jf = tj.jit(fj, **jit_options)
    for call in range(calls):
        seed = 100 + call
        _mutate(np.random.default_rng(seed), cap_e)
        _mutate(np.random.default_rng(seed), cap_j)
        args_e = make_args(np.random.default_rng(seed + 1))
        args_j = make_args(np.random.default_rng(seed + 1))
        re, rj = fe(*args_e), jf(*args_j)
        oe, oj = _arrays(re), _arrays(rj)
        be = _arrays(args_e) + _arrays(list(cap_e))
        bj = _arrays(args_j) + _arrays(list(cap_j))
        assert len(oe) == len(oj)
        for k, (a, b) in enumerate(zip(oe, oj)):
            np.testing.assert_allclose(b, a, rtol=1e-12, err_msg=f"call {call} result {k}")
            assert a.strides == b.strides and a.dtype == b.dtype, (call, k)
            for m, (x, y) in enumerate(zip(be + oe, bj + oj)):
                if m == len(be) + k:
                    continue
                assert np.shares_memory(a, x) == np.shares_memory(b, y), \
                    f"call {call}: result {k} and buffer {m} alias in one run only"
                assert (a is x) == (b is y), \
                    f"call {call}: result {k} is buffer {m} in one run only"
        # A write into each result reaches the buffers it views, as in eager.
        for k, (a, b) in enumerate(zip(oe, oj)):
            if a.flags.writeable:
                a += 10.0 * (k + 1)
                b += 10.0 * (k + 1)
            for m, (x, y) in enumerate(zip(be + oe, bj + oj)):
                np.testing.assert_allclose(y, x, rtol=1e-12,
                                           err_msg=f"call {call}: buffer {m} after a "
                                                   f"write into result {k}")
    info = jf.cache_info()
    assert info["fallbacks"] == 0 and info["hits"] >= 3, info
    return jf


def var_arg(shape=(3, 4)):
    return lambda rng: (Variable(rng.standard_normal(shape)),)


def arr_arg(shape=(3, 4)):
    return lambda rng: (rng.standard_normal(shape),)


def no_caps(fn):
    return lambda: (fn, ())


@pytest.mark.parametrize("fn", [
    lambda x: x.data[0:2],
    lambda x: x.data[1:, ::2],
    lambda x: x.data[::-1, 1],
    lambda x: x.data.T,
    lambda x: x.data.reshape(-1),
    lambda x: x.data[:, 1:].T,
    lambda x: F.reshape(x, (4, 3)),
    lambda x: F.transpose(x),
    lambda x: x.T,
    lambda x: (x.data[0], x.data[1:], x),
], ids=["slice", "strided", "reversed", "T", "reshape", "slice_T", "F.reshape",
        "F.transpose", "Variable.T", "several"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_view_of_a_variable_argument_aliases_it(fn, backend):
    check_aliasing(no_caps(fn), var_arg(), backend=backend)


@pytest.mark.parametrize("fn", [
    lambda x: x[1:],
    lambda x: x.T[::2],
    lambda x: (x * 2.0, x.reshape(2, 6)),
], ids=["slice", "T_step", "with_computed"])
def test_a_view_of_an_array_argument_aliases_it(fn):
    check_aliasing(no_caps(fn), arr_arg())


def test_get_item_is_a_copy_as_in_eager():
    check_aliasing(no_caps(lambda x: x[0:2]), var_arg())


def test_a_view_of_a_captured_array_and_parameter_aliases_them():
    def build():
        W = np.ones((3, 4))
        P = Parameter(np.ones((4, 3)))

        def f(x):
            y = F.matmul(x, P)
            return y, W[1:], P.data[:, 0], F.reshape(P, (-1,))
        return f, (W, P)

    check_aliasing(build, var_arg())


def test_a_view_of_another_result_aliases_it():
    def f(x):
        a = F.exp(x)
        return a, a.data[1:], F.transpose(a)

    check_aliasing(no_caps(f), var_arg())


def test_a_view_sees_the_in_place_updates_of_the_call():
    def build():
        W = np.ones((3, 4))
        P = Parameter(np.ones((3, 4)))

        def f(x):
            v, w = W[:, ::2], P.data.T
            y = F.sum(x * P)
            np.add(W, 1.0, out=W)
            P.data -= 0.1 * x.data
            return y, v, w
        return f, (W, P)

    check_aliasing(build, var_arg())


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_reshaped_argument_that_is_not_contiguous_is_a_copy_as_in_eager(backend):
    # Traced on a contiguous argument (a view), called on transposed ones: eager's
    # reshape copies, so does the compiled call.
    n = [0]

    def make_args(rng):
        call = n[0] // 2          # called twice per call: eager's, then jit's
        n[0] += 1
        a = rng.standard_normal((4, 3))
        return (np.ascontiguousarray(a.T) if call < 2 or call % 2 else a.T,)

    check_aliasing(no_caps(lambda x: x.reshape(-1)), make_args, backend=backend)


def test_a_view_compiled_calls_cannot_rebuild_runs_eagerly(record_jit_warnings):
    # np.diagonal is an opaque NumPy call to the tracer: no view operations to replay.
    # A copy would be silently unaliased; the function runs eagerly and says why.
    jf = tj.jit(lambda x: np.diagonal(x.data))
    for k in range(4):
        x = Variable(np.random.default_rng(k).standard_normal((3, 4)))
        r = jf(x)
        assert np.shares_memory(r, x.data)
        np.testing.assert_array_equal(r, np.diagonal(x.data))
    assert jf.cache_info()["hits"] == 0
    messages = [str(w.message) for w in record_jit_warnings]
    assert any("view of an argument's" in m and "test_returned_views_alias.py" in m
               for m in messages), messages


def test_a_reshape_to_the_same_shape_is_a_new_view_of_the_buffer():
    # No op is recorded for it: still a view, as eager's reshape gives.
    def f(x):
        h = F.tanh(x + x)
        return h, h.data.reshape(-1), x.data.reshape(x.shape)

    check_aliasing(no_caps(f), var_arg((3,)))


def test_the_data_of_a_returned_seed_gradient_is_its_array_on_the_traced_call_too():
    # The trace copies a .grad that holds backward's seed; the traced call's
    # `h.data` must be the copy's array, the one its returned h holds.
    def build():
        W = Parameter(np.ones(3))

        def f(x):
            W.cleargrad()
            y = (W + 0.5) - 0.25
            y.backward(retain_grad=True, create_graph=True)
            h = y.grad
            return h, h.data, x * 2.0
        return f, (W,)

    check_aliasing(build, var_arg((3,)))


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_reshape_traced_on_a_copy_gives_a_view_of_a_later_contiguous_argument(backend):
    # Traced on a transposed argument (eager's reshape copies), then called on
    # contiguous ones: eager's reshape is a view of those, so is the compiled call's.
    n = [0]

    def make_args(rng):
        call = n[0] // 2
        n[0] += 1
        a = rng.standard_normal((4, 3))
        return (a.T if call < 2 or call % 2 else np.ascontiguousarray(a.T),)

    check_aliasing(no_caps(lambda x: (x.reshape(-1), x.T.reshape(2, 6))), make_args,
                   backend=backend)


# A new array NumPy computes from a transposed operand is laid out as that operand
# (order='K'): F.tanh(F.transpose(x, (1, 2, 0))) of a C-ordered (2, 3, 4) x has strides
# (32, 8, 96), not (64, 16, 8). The kernels write C order; a compiled call returned that
# layout, so its `h.data` had other strides than eager's, `h.data.reshape(-1)` was a
# view of h where eager's is a copy, and `h.data.T` a view with other strides.
@pytest.mark.parametrize("fn", [
    lambda x: (lambda h: (h, h.data))(F.tanh(F.transpose(x, (1, 2, 0)) * 0.5)),
    lambda x: (lambda h: (h, h.data.reshape(-1)))(F.exp(F.transpose(x, (2, 0, 1)))),
    lambda x: (lambda h: (h.data.T, h))(x.T * 2.0 + 1.0),
    lambda x: (lambda h: (h, F.reshape(h, (-1,)), h.data[0]))(F.sin(F.transpose(x)) + x.T),
], ids=["data", "reshape_copies", "T_of_it", "several"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_computed_result_has_eager_s_memory_order_and_its_views_alias_as_eager_s(
        fn, backend):
    check_aliasing(no_caps(fn), var_arg((2, 3, 4)), backend=backend)


def test_a_computed_result_of_a_broadcast_capture_has_eager_s_memory_order():
    def build():
        W = Parameter(np.ones((1,), dtype=np.float64))

        def f(x):
            h = F.tanh(F.transpose(x, (1, 2, 0)) * 0.5 + W)
            return h, h.data
        return f, (W,)

    check_aliasing(build, lambda rng: (rng.standard_normal((2, 3, 4)).astype(np.float32),))


class _State:
    h = None
    w = None


def test_state_the_call_stores_has_eager_s_memory_order_and_aliasing():
    """The fuzzer's reproducer: an RNN-like h stored on an object and returned with its
    .data, and a .data rebound on a new Variable the call stores (not returned)."""
    def build():
        m = _State()

        def f(x):
            t = F.transpose(x, (1, 2, 0)) * 0.5
            h = F.tanh(t if m.h is None else t + m.h * 0.5)
            m.h = h
            m.w = Variable(np.ones(1))
            m.w.data = F.exp(x.T).data
            return h * 2.0, h.data.reshape(-1), h.data
        return f, m

    (fe, me), (fj, mj) = build(), build()
    jf = tj.jit(fj)
    for call in range(CALLS):
        x = np.random.default_rng(call).standard_normal((2, 3, 4))
        re, rj = fe(Variable(x.copy())), jf(Variable(x.copy()))
        be = [r.data if isinstance(r, Variable) else r for r in re] + [me.h.data, me.w.data]
        bj = [r.data if isinstance(r, Variable) else r for r in rj] + [mj.h.data, mj.w.data]
        for k, (a, b) in enumerate(zip(be, bj)):
            np.testing.assert_allclose(b, a, rtol=1e-12, err_msg=f"call {call} array {k}")
            assert a.strides == b.strides, (call, k, a.strides, b.strides)
            for m, (c, d) in enumerate(zip(be, bj)):
                assert np.shares_memory(a, c) == np.shares_memory(b, d), (call, k, m)
    info = jf.cache_info()
    assert info["fallbacks"] == 0 and info["hits"] >= 3, info


@pytest.mark.parametrize("order", ["FFCCFCFC", "CCFFCFCF"], ids=["F_first", "C_first"])
def test_a_computed_result_follows_the_memory_order_of_each_call_s_argument(order):
    """The signature does not key on strides: one variant serves a C-ordered and an
    F-ordered x, and eager's F.exp(x) is laid out as x in each call."""
    def f(x):
        h = F.exp(x * 0.5)
        return h, h.data, h.data.reshape(-1)

    jf = tj.jit(f)
    for call, o in enumerate(order):
        a = np.random.default_rng(call).standard_normal((3, 4))
        a = np.asfortranarray(a) if o == "F" else a
        re, rj = f(Variable(a.copy(order="K"))), jf(Variable(a.copy(order="K")))
        oe = [re[0].data, re[1], re[2]]
        oj = [rj[0].data, rj[1], rj[2]]
        for k, (x, y) in enumerate(zip(oe, oj)):
            np.testing.assert_allclose(y, x, rtol=1e-12)
            assert x.strides == y.strides, (call, o, k)
            for m in range(len(oe)):
                assert np.shares_memory(x, oe[m]) == np.shares_memory(y, oj[m]), (call, k, m)
    info = jf.cache_info()
    assert info["fallbacks"] == 0 and info["hits"] >= 4, info


def test_one_view_returned_twice_is_one_object_on_the_traced_call_too():
    # The traced call rebuilt the first place on the argument's buffer and left the
    # second a copy: two objects, one not aliasing the argument.
    def f(x):
        h = x.data[:, ::-1]
        return F.sin(x), h, h

    jf = check_aliasing(no_caps(f), var_arg())
    for call in range(4):
        x = Variable(np.random.default_rng(call).standard_normal((3, 4)))
        _, a, b = jf(x)
        assert a is b and np.shares_memory(a, x.data), call


# One buffer returned as several kinds of result: the Variable holding it, its `.data`,
# a view of it that is a reshape to its own shape (no op recorded: the Variable's own
# Value), a new Variable wrapping it (`Variable(h.data)`, which holds that very array).
# Eager's are views of, or are, the one array in whatever order they are made and
# returned; the compiled call's were rooted on the first, so a view returned before h
# made h a view of it, and `Variable(h.data)` then held an array the view did not see.
_KINDS = {
    "var": lambda h: h,
    "data": lambda h: h.data,
    "view": lambda h: h.data.reshape(-1),
    "wrap": lambda h: Variable(h.data),
    "wrap2": lambda h: Variable(Variable(h.data).data),
    "F.reshape": lambda h: F.reshape(h, h.shape),
}


def _returned_as(order, base):
    """f returning, in `order`, the results _KINDS makes of base(x, P)."""
    def build():
        P = Parameter(np.ones(3))

        def f(x):
            h = base(x, P)
            return tuple(_KINDS[k](h) for k in order)
        return f, (P,)
    return build


_BASES = {
    "computed": lambda x, P: F.tanh(x * P),
    "argument": lambda x, P: x,
    "captured": lambda x, P: P,
}


@pytest.mark.parametrize("order", list(itertools.permutations(["var", "view", "wrap", "data"])),
                         ids="-".join)
def test_a_view_and_a_wrap_of_a_computed_result_alias_it_in_any_order(order):
    check_aliasing(_returned_as(order, _BASES["computed"]), var_arg((3,)))


@pytest.mark.parametrize("base", sorted(_BASES))
@pytest.mark.parametrize("order", [
    ("view", "wrap2", "var"), ("var", "wrap2", "view"),
    ("F.reshape", "wrap", "view", "data"), ("view", "F.reshape", "data", "wrap"),
    ("view", "wrap"), ("wrap", "view"),
], ids="-".join)
def test_views_and_wraps_of_one_buffer_alias_it_whatever_holds_it(base, order):
    check_aliasing(_returned_as(order, _BASES[base]), var_arg((3,)))


@pytest.mark.parametrize("order", [("view", "wrap", "y", "var"), ("var", "y", "wrap", "view")],
                         ids="-".join)
def test_a_wrap_a_later_result_reads_aliases_the_view_before_its_buffer(order):
    # The fuzzer's reproducer: `Variable(h.data)` is an input of a later computed result
    # (the runner makes it before the results), returned next to a view of h.data.
    def build():
        def f(x):
            h = x + 0.5
            made = {"view": h.data.reshape(-1), "wrap": Variable(h.data), "var": h}
            made["y"] = F.sin(h * made["wrap"])
            return tuple(made[k] for k in order)
        return f, ()

    jf = check_aliasing(build, var_arg((1,)))
    for call in range(4):
        x = Variable(np.random.default_rng(call).standard_normal((1,)))
        r = dict(zip(order, jf(x)))
        assert r["wrap"].data is r["var"].data and np.shares_memory(r["view"], r["var"].data)
        np.testing.assert_allclose(r["y"].data, np.sin((x.data + 0.5) ** 2))


_OF_DATA = {
    "data": lambda a, made: a,
    "view": lambda a, made: a.reshape(-1),
    "wrap": lambda a, made: made.setdefault("wrap", Variable(a)),
    "wrap.data": lambda a, made: made.setdefault("wrap", Variable(a)).data,
    "wrapT": lambda a, made: made.setdefault("wrapT", Variable(a.T)),
    "wrapT.data": lambda a, made: made.setdefault("wrapT", Variable(a.T)).data,
    "wrap2": lambda a, made: made.setdefault("wrap2", Variable(Variable(a).data)),
}


@pytest.mark.parametrize("order", [
    ("view", "wrap", "data"), ("data", "wrap", "view"), ("view", "data", "wrap"),
    ("view", "wrap.data", "wrap"), ("data", "wrapT", "wrapT.data"),
    ("wrapT.data", "view", "wrapT", "data"), ("view", "data", "wrap2"),
    ("wrap2", "data", "wrap"),
], ids="-".join)
def test_results_made_of_the_data_of_a_variable_not_returned_alias_as_in_eager(order):
    # h is not a result: `Variable(a)` holds eager's `a = h.data` itself, and a view
    # of a is a view of that Variable's array; the traced call rebuilt the Variable on
    # a copy and left the `a` it returned on the old array.
    def f(x):
        a, made = F.exp(x).data, {}
        return tuple(_OF_DATA[k](a, made) for k in order)

    check_aliasing(no_caps(f), var_arg((3, 1)))


@pytest.mark.parametrize("shape", [(), (3,)], ids=["0d", "1d"])
@pytest.mark.parametrize("order", [("g", "wrap"), ("wrap", "g", "data"), ("g", "wrap2")],
                         ids="-".join)
def test_a_wrap_of_a_returned_grad_holds_its_array(order, shape):
    # The runner made the wrap's array a copy of the .grad's where the graph's output
    # is not an array of its own (a 0-d one): `Variable(g.data).data is g.data` failed
    # and every call ran eagerly.
    def f(x):
        x.cleargrad()
        F.sum(F.tanh(x) * x).backward()
        g = x.grad
        made = {"g": g, "data": g.data, "wrap": Variable(g.data),
                "wrap2": Variable(Variable(g.data).data)}
        return tuple(made[k] for k in order)

    check_aliasing(no_caps(f), var_arg(shape))


@pytest.mark.parametrize("order", [("wrapT", "wrapT.data"), ("g", "wrapT", "wrapT.data"),
                                   ("wrapT.data", "data", "wrapT")], ids="-".join)
def test_the_data_of_a_wrap_of_a_seed_passed_through_is_its_array(order):
    # x.grad is backward's seed (create_graph: a Constant the graph reads): the traced
    # call gave the new Variable of its array (`.T` of a 1-d one: no op) the .grad's
    # copy after the returned `.data` was taken, which then aliased nothing.
    def f(x):
        x.cleargrad()
        y = x + 0.5
        y.backward(retain_grad=True, create_graph=True)
        g = x.grad
        made = {"g": g, "data": g.data, "wrapT": Variable(g.data.T)}
        made["wrapT.data"] = made["wrapT"].data
        return tuple(made[k] for k in order)

    check_aliasing(no_caps(f), var_arg((2,)))
