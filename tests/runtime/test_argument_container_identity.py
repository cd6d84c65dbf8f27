"""A list, dict or tuple argument returned is the caller's object, as in eager.

`def f(xs): return xs` returns the list it was passed (and `return xs[0]` the inner
list), not a new one with the same contents; a function that changes a list or dict it
is passed (item assignment, append) runs eagerly with a warning, and the traced call
changes the caller's container as eager does. Each test calls the jitted function at
least three times after its trace with new values and compares with eager.
"""
import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F
from tracejit import Variable

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")


def new_args(rng, kind):
    if kind == "list":
        return ([Variable(rng.normal(size=2)), Variable(rng.normal(size=3))],)
    if kind == "nested":
        return ([[Variable(rng.normal(size=2))], rng.normal(size=3)],)
    if kind == "tuple":
        return ((Variable(rng.normal(size=2)), rng.normal(size=2)),)
    return ({"a": Variable(rng.normal(size=3)), "b": [Variable(rng.normal(size=2))]},)


CASES = {
    "list": (lambda xs: xs, lambda r, xs: r is xs),
    "nested": (lambda xs: xs[0], lambda r, xs: r is xs[0]),
    "tuple": (lambda xs: (F.exp(xs[0]), xs), lambda r, xs: r[1] is xs),
    "dict": (lambda d: (d, F.sum(d["a"]), d["b"]),
             lambda r, d: r[0] is d and r[2] is d["b"]),
}


@pytest.mark.parametrize("kind", list(CASES))
def test_a_returned_argument_container_is_the_callers(kind):
    f, is_callers = CASES[kind]
    jf = tj.jit(f)
    rng = np.random.default_rng(0)
    for _ in range(6):
        args = new_args(rng, kind)
        expected = f(*args)
        got = jf(*args)
        assert is_callers(expected, args[0])
        assert is_callers(got, args[0])
        for e, g in zip(expected if isinstance(expected, tuple) else (expected,),
                        got if isinstance(got, tuple) else (got,)):
            if isinstance(e, Variable):
                np.testing.assert_allclose(g.data, e.data)
    assert jf.cache_info()["hits"] >= 3


def test_a_returned_keyword_argument_container():
    f = lambda x, ys=None: (F.exp(x), ys)       # noqa: E731
    jf = tj.jit(f)
    rng = np.random.default_rng(1)
    for _ in range(5):
        x, ys = Variable(rng.normal(size=2)), [Variable(rng.normal(size=2))]
        y, r = jf(x, ys=ys)
        assert r is ys
        np.testing.assert_allclose(y.data, np.exp(x.data))
    assert jf.cache_info()["hits"] >= 3


def test_a_function_changing_its_list_argument_runs_eagerly_and_changes_it():
    def f(xs, d):
        xs[0] = F.exp(xs[0])
        d["n"] = F.sum(xs[1])
        return xs

    jf = tj.jit(f)
    rng = np.random.default_rng(2)
    with pytest.warns(tj.JitWarning, match="changes the list or dict argument 0"):
        for _ in range(5):
            a, b = rng.normal(size=2), rng.normal(size=3)
            xs_e, xs_j = [Variable(a), Variable(b)], [Variable(a), Variable(b)]
            d_e, d_j = {}, {}
            r_e, r_j = f(xs_e, d_e), jf(xs_j, d_j)
            assert r_e is xs_e and r_j is xs_j
            assert r_j[1] is xs_j[1] and type(r_j[0]) is Variable
            np.testing.assert_allclose(r_j[0].data, r_e[0].data)
            assert type(d_j["n"]) is Variable
            np.testing.assert_allclose(d_j["n"].data, d_e["n"].data)
