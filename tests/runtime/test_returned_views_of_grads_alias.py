"""A result eager returns as a view of a buffer the call hands back by identity, or that
stays live after it, comes back from a compiled call as a view of that same buffer, with
eager's layout: a .grad the call sets (a backward's seed passed through to x.grad, one
seed shared by x.grad and w.grad, a captured Parameter's, a computed one), a result's
retained .grad, a returned `Variable(np.ones(...))`, an array the function made, an
argument, a captured Parameter. Views are F.transpose, `.T`, F.reshape, `.data[...]`
slices and basic indexes, `.data.T`, and views of views.

Each case runs eager and jit side by side on new arguments at every call and compares
values, strides, which objects are identical and which arrays share memory (results,
arguments, their .data and .grad, captures, their .grad), then writes into every result
and compares every buffer again (a result that pointed into a constant of the graph
would change the later calls).
"""
import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F
from tracejit import Parameter, Variable

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")

SH = (3, 4)
CALLS = 6            # warm-up, trace, then four compiled calls


# ---- bases: build() -> (g(x, w) -> the base object, captured objects)

def _seed_reshape():
    def g(x, w):
        y = F.reshape(x, x.shape)      # no op recorded: the seed passes through
        y.backward()
        return x.grad
    return g, ()


def _seed_add():
    def g(x, w):
        y = x + 1.0
        y.backward()
        return x.grad
    return g, ()


def _shared_seed():
    def g(x, w):
        y = x + w                      # x.grad is w.grad: the seed
        y.backward()
        return w.grad
    return g, ()


def _seed_create_graph():
    def g(x, w):
        y = x - 0.5
        y.backward(create_graph=True)  # the seed: a Constant
        return x.grad
    return g, ()


def _retained_seed():
    def g(x, w):
        h = x * 2.0
        y = h + 1.0
        y.backward(retain_grad=True)
        return h.grad
    return g, ()


def _retained_computed():
    def g(x, w):
        h = x * 2.0
        y = F.sum(h * h)
        y.backward(retain_grad=True)
        return h.grad
    return g, ()


def _computed_grad():
    def g(x, w):
        y = F.sum(x * x * w)
        y.backward()
        return x.grad
    return g, ()


def _captured_seed_grad():
    P = Parameter(np.ones(SH))

    def g(x, w):
        P.cleargrad()
        y = P + x
        y.backward()
        return P.grad
    return g, (P,)


def _made_variable():
    def g(x, w):
        return Variable(np.ones(SH))
    return g, ()


def _made_variable_read():
    def g(x, w):
        c = Variable(np.ones(SH) * 3.0)
        return c, x * c
    return g, ()


def _argument():
    return (lambda x, w: x), ()


def _captured_parameter():
    P = Parameter(np.ones(SH))
    return (lambda x, w: P), (P,)


def _computed():
    return (lambda x, w: F.exp(x)), ()


BASES = {
    "seed_passed_through": _seed_reshape, "seed_add": _seed_add,
    "shared_seed": _shared_seed, "seed_create_graph": _seed_create_graph,
    "retained_seed": _retained_seed, "retained_computed": _retained_computed,
    "computed_grad": _computed_grad, "captured_seed_grad": _captured_seed_grad,
    "made_variable": _made_variable, "made_variable_read": _made_variable_read,
    "argument": _argument, "captured_parameter": _captured_parameter,
    "computed": _computed,
}

VIEWS = {
    "F.transpose": lambda b: F.transpose(b),
    "Variable.T": lambda b: b.T,
    "F.reshape": lambda b: F.reshape(b, (-1,)),
    "data_slice": lambda b: b.data[1:],
    "data_T": lambda b: b.data.T,
    "data_index": lambda b: b.data[0],
    "data_itself": lambda b: b.data,
    "view_of_view": lambda b: F.transpose(F.reshape(b, (4, 3))),
    "data_view_of_view": lambda b: b.data[:, ::2].T,
    "two_views": lambda b: (F.transpose(b), b.data[::-1]),
}


def _objects(tree):
    if isinstance(tree, (tuple, list)):
        return [o for x in tree for o in _objects(x)]
    return [tree]


def _array(o):
    return o.data if isinstance(o, Variable) else o if isinstance(o, np.ndarray) else None


def _live(args, caps):
    """Everything of the caller's a result may be or alias, after the call."""
    out = []
    for a in list(args) + list(caps):
        out.append(a)
        if isinstance(a, Variable):
            out += [a.data, a.grad, None if a.grad is None else a.grad.data]
    return out


def check_views(build, calls=CALLS, **jit_options):
    fe, cap_e = build()
    fj, cap_j = build()
    jf = tj.jit(fj, **jit_options)
    for call in range(calls):
        rng = np.random.default_rng(call)
        a, b = rng.standard_normal(SH), rng.standard_normal(SH)
        for c_e, c_j in zip(cap_e, cap_j):     # captured state mutated between calls
            new = rng.standard_normal(SH)
            c_e.data[...] = new
            c_j.data[...] = new
        args_e = (Variable(a.copy()), Variable(b.copy()))
        args_j = (Variable(a.copy()), Variable(b.copy()))
        oe = _objects(fe(*args_e)) + _live(args_e, cap_e)
        oj = _objects(jf(*args_j)) + _live(args_j, cap_j)
        assert len(oe) == len(oj)
        for k, (p, q) in enumerate(zip(oe, oj)):
            assert type(p) is type(q), (call, k, type(p), type(q))
            pa, qa = _array(p), _array(q)
            if pa is None:
                continue
            np.testing.assert_allclose(qa, pa, rtol=1e-12, err_msg=f"call {call} object {k}")
            assert pa.strides == qa.strides and pa.dtype == qa.dtype, \
                (call, k, pa.strides, qa.strides)
            for m in range(k + 1, len(oe)):
                assert (p is oe[m]) == (q is oj[m]), \
                    f"call {call}: objects {k} and {m} identical in one run only"
                ra, sa = _array(oe[m]), _array(oj[m])
                if ra is None:
                    continue
                assert np.shares_memory(pa, ra) == np.shares_memory(qa, sa), \
                    f"call {call}: objects {k} and {m} share memory in one run only"
        # A write into each result reaches exactly the buffers eager's reaches.
        arrays_e = [_array(o) for o in oe]
        arrays_j = [_array(o) for o in oj]
        for k, (pa, qa) in enumerate(zip(arrays_e, arrays_j)):
            if pa is None or not pa.flags.writeable:
                continue
            pa += 10.0 * (k + 1)
            qa += 10.0 * (k + 1)
            for m, (ra, sa) in enumerate(zip(arrays_e, arrays_j)):
                if ra is not None:
                    np.testing.assert_allclose(sa, ra, rtol=1e-12, err_msg=(
                        f"call {call}: object {m} after a write into object {k}"))
    info = jf.cache_info()
    assert info["fallbacks"] == 0 and info["hits"] >= 3, info
    return jf


def _case(base, view, with_base):
    def build():
        g, caps = BASES[base]()

        def f(x, w):
            b = g(x, w)
            if isinstance(b, tuple):       # (base, something computed from it)
                b, extra = b
                v = VIEWS[view](b)
                return (b, extra, v) if with_base else (extra, v)
            v = VIEWS[view](b)
            return (b, v) if with_base else v
        return f, caps
    return build


@pytest.mark.parametrize("with_base", [True, False], ids=["with_base", "view_only"])
@pytest.mark.parametrize("view", list(VIEWS))
@pytest.mark.parametrize("base", list(BASES))
def test_a_returned_view_aliases_its_base_as_in_eager(base, view, with_base):
    check_views(_case(base, view, with_base))


@pytest.mark.parametrize("view", ["F.transpose", "data_T", "view_of_view", "two_views"])
@pytest.mark.parametrize("base", ["seed_passed_through", "shared_seed", "retained_seed",
                                  "computed_grad", "made_variable"])
def test_the_rebuild_does_not_rely_on_the_backend_handing_out_views(base, view):
    # The numba plans return some movements of an output as views by themselves (a
    # transpose of a computed .grad): the interpret backend does not.
    check_views(_case(base, view, False), backend="interpret")


def test_the_reproducer_of_the_fuzzer():
    def f(x0):
        y3 = F.reshape(x0, x0.shape)
        y3.backward()
        g4 = x0.grad
        view5 = F.transpose(g4)
        return g4, view5

    jf = tj.jit(f)
    for k in range(5):
        a = np.random.default_rng(k).standard_normal((2, 3))
        x = Variable(a.copy())
        g, v = jf(x)
        assert g is x.grad
        assert np.shares_memory(g.data, v.data) and v.data.strides == g.data.T.strides
    assert jf.cache_info()["hits"] >= 3


def test_views_of_a_retained_seed_no_result_holds_alias_each_other():
    # h is not returned: its .grad lives only in the two views, which eager gives as
    # views of one new array every call.
    def f(x):
        h = x * 2.0
        y = h + 1.0
        y.backward(retain_grad=True)
        return h.grad.data.T, F.reshape(h.grad, (-1,))

    check_views(lambda: (lambda x, w: f(x), ()))


def test_a_view_of_an_array_the_function_made_is_new_every_call():
    # c is a constant of the graph: the traced call's view must not point into it (a
    # write into it would change every later call's y).
    def f(x, w):
        c = Variable(np.ones(SH))
        y = x * c
        return y, F.transpose(c)

    check_views(lambda: (f, ()))


def test_two_views_of_a_value_no_result_holds_alias_each_other():
    # h is not returned: eager's two views are views of its one array.
    def build():
        K = np.ones(SH)

        def f(x, w):
            h = x + K
            return F.reshape(h, (-1,)), h.data.reshape(-1), h.data[:, ::2].T
        return f, ()

    check_views(build)
