"""Variables made inside a jitted function of one array (`c = Variable(h.data);
d = Variable(h.data)`, `Variable(c.data)` of such a Variable, in a chain of any length),
returned in any order, in containers, or stored as state, as eager returns them: every one a leaf holding
that one array (`c.data is d.data`), each given its own gradient by a backward through
the results. Each used to name the other as the owner of the array (the result leaves'
"wrap" of "vardata" of a result), a cycle the runner's code generation recursed around
until RecursionError: a fallback on every call.
"""
import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F
from tracejit import Variable

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")


def two_of_one(x):
    h = F.sin(x)                          # not returned: its array is computed
    c = Variable(h.data)
    d = Variable(h.data)
    return x * c + d * d, c, d


def in_containers(x):
    h = x ** 2
    c = Variable(h.data)
    y = F.sin(h * c) + c
    d = Variable(h.data)
    return y, (c,), [d], float(y.data.sum())


def chain(x, n=5, used=5):
    h = F.tanh(x) * 2.0
    cs = [Variable(h.data)]
    for _ in range(n - 1):
        cs.append(Variable(cs[-1].data))  # the same array again
    y = x
    for c in cs[:used] + cs[-1:]:
        y = y * c + c
    return (y,) + tuple(reversed(cs))     # the last made first


def long_chain(x):
    # Deeper than the recursion limit if each leaf's code named the one before it.
    return chain(x, n=1100, used=2)


def with_the_owner_returned_last(x):
    h = F.exp(x * 0.5)
    c = Variable(h.data)
    return x * c, c, h                    # h's array is c's too


def used_through_a_chain_to_the_owner(x):
    # d is an input of the call's compiled Function, made before its results: its
    # array is c's, which is h's, a result made after (the runner named h's Variable
    # before assigning it: UnboundLocalError, a fallback on every call).
    h = F.tanh(x)
    c = Variable(h.data)
    d = Variable(c.data)
    return x * d, c, [d], h


class _Holder:
    def __init__(self):
        self.h = Variable(np.zeros(4))


STORE = _Holder()


def used_through_a_chain_to_stored_state(x):
    # The same with the owner stored as state the call rebinds, not returned.
    h = F.sin(x)
    STORE.h = h
    c = Variable(h.data)
    d = Variable(c.data)
    e = Variable(d.data)
    return x * e + d, (c,), d, e


W = tj.Parameter(np.array([0.3, -0.2, 0.5, 0.1]))


def of_a_seed_the_call_made(x):
    # g is the backward's seed passed through (a retained .grad, np.ones the call
    # made: a constant of the graph, a new array every call). c holds it, d holds it
    # through c's data, e directly: one array. Each leaf was given its own copy of the
    # seed once c held its copy already (d found no owner), so d.data was not c.data:
    # a fallback on every call (the first-call check saw the identity differ).
    W.cleargrad()
    h = W * 2.0
    (h + 1.0).backward(retain_grad=True)
    g = h.grad
    c = Variable(g.data)
    d = Variable(c.data)
    e = Variable(g.data)
    return x * c + e * W, [c], (d,), e


def of_a_captured_grad_returned_after(x):
    # The same seed as W.grad, returned after the leaves made of it: each leaf got a
    # copy of the seed (the .grad, a later result with no creator, could not be named
    # as the owner), so d.data was not W.grad.data.
    W.cleargrad()
    (W + 0.5).backward()
    g = W.grad
    c = Variable(g.data)
    d = Variable(c.data)
    return x * c + W, (c,), d, g


CASES = [two_of_one, in_containers, chain, long_chain, with_the_owner_returned_last,
         used_through_a_chain_to_the_owner, used_through_a_chain_to_stored_state,
         of_a_seed_the_call_made, of_a_captured_grad_returned_after]


def _leaves(r):
    """The result's Variables in order, flattened, and its Python number if any."""
    out = []
    for x in r:
        if isinstance(x, (tuple, list)):
            out += _leaves(x)
        elif isinstance(x, Variable):
            out.append(x)
    return out


def _observe(fn, call):
    x = Variable(np.linspace(-1.0, 1.0, 4) * (1 + 0.3 * call) + 0.1 * call)
    r = fn(x)
    vs = _leaves(r)
    # Which results share an array object (eager: every made leaf holds one array):
    # each result's data as the first result holding that object.
    first = {}
    shares = [first.setdefault(id(v.data), k) for k, v in enumerate(vs)]
    rng = np.random.default_rng(call)
    loss = sum(F.sum(v * rng.uniform(-1.0, 1.0, v.shape)) for v in vs)
    loss.backward()
    return dict(values=[v.data.copy() for v in vs], shares=shares,
                creators=[v.creator is not None for v in vs],
                grads=[None if v.grad is None else v.grad.data.copy() for v in vs],
                xgrad=x.grad.data.copy(),
                numbers=[x for x in r if isinstance(x, float)])


@pytest.mark.parametrize("fn", CASES, ids=lambda f: f.__name__)
def test_made_leaves_of_one_array_compile_and_match_eager(fn):
    jf = tj.jit(fn)
    for call in range(7):       # (state the call rebinds: traced on the third)
        W.data *= 0.9       # the captured Parameter changed in place between calls
        want, got = _observe(fn, call), _observe(jf, call)
        assert got["shares"] == want["shares"]
        assert got["creators"] == want["creators"]
        assert got["numbers"] == pytest.approx(want["numbers"], rel=1e-12)
        for key in ("values", "grads"):
            for g, w in zip(got[key], want[key]):
                assert (g is None) == (w is None), key
                if w is not None:
                    np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-12, err_msg=key)
        np.testing.assert_allclose(got["xgrad"], want["xgrad"], rtol=1e-10, atol=1e-12)
    info = jf.cache_info()
    assert info["fallbacks"] == 0 and info["hits"] >= 4, info
