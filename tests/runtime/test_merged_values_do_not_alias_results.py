"""Values the optimizer merges keep eager's buffers: every pair of results, and every
result against the arguments, the captured Parameter, their .data and .grad, and the
state the call stores (a captured holder's attribute, a rebound Parameter's .data),
shares memory exactly where eager's do.

The passes make one value of several equal ones (common subexpressions, a constant
folded, a fused kernel writing two outputs), and a view eager returns is rebuilt at
return time on the array the graph computed (pytree.result_views): without care two
results that are distinct arrays in eager came back as views of one buffer, and a write
into one changed the other (runtime.variant.fresh_copies now decides, once per variant,
which handed-out outputs get a buffer of their own). Here each kind of merge meets each kind of view (none,
F.reshape, F.transpose, .T, a slice of .data, .data itself), on both backends, for six calls with new
arguments and a mutated Parameter; what is compared after each call: values and
strides, `np.shares_memory` of every pair of buffers, `is` between the result objects,
and every buffer after a write into each result.
"""
import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F
from tracejit import Parameter, Variable

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")

CALLS = 6        # warm-up, trace, then four compiled calls
BACKENDS = ["auto", "interpret"]

VIEWS = {
    "none": lambda v: v,
    "reshape": lambda v: F.reshape(v, (-1,)),
    "transpose": lambda v: F.transpose(v),
    ".T": lambda v: v.T,
    ".data slice": lambda v: v.data[..., 1:] if v.ndim else v.data[...],
    ".data": lambda v: v.data,          # the array itself (views of it alias it)
}


class Holder:
    """A captured object whose attribute the call sets (threaded state)."""


# Each merge kind: (shape of x, body) where body(x, s, W, h, view_a, view_b) returns
# the results; a and b are the two values the passes may merge (or the one value).
def _cse(x, s, W, h, va, vb):
    a = F.sin(x) * 0.5
    b = F.sin(x) * 0.5                  # equal to a: CSE makes one value of both
    return va(a), vb(b)


def _cse_with_plain(x, s, W, h, va, vb):
    a = F.tanh(x) + 1.0
    b = F.tanh(x) + 1.0
    return a, va(a), vb(b)              # a itself next to views of it and of b


def _twice(x, s, W, h, va, vb):
    a = F.exp(x) * 2.0                  # one value returned through two views: eager's
    return va(a), vb(a)                 # views of one array alias each other


def _capture(x, s, W, h, va, vb):
    a = W * 3.0                         # of the captured Parameter
    b = W * 3.0
    return va(a), vb(b), x * 1.0


def _constant_grads(x, s, W, h, va, vb):
    # s is 0-d: two gradients of s * 3.0, from seeds the graph holds as constants;
    # eager's are two new arrays.
    y = s * 3.0
    y.backward()
    a = s.grad
    s.cleargrad()
    y2 = s * 3.0
    y2.backward()
    b = s.grad
    return va(a), vb(b), va(s * 3.0)


def _identity(x, s, W, h, va, vb):
    a = x * 1.0                         # new arrays in eager, whatever a pass makes
    b = x + 0.0                         # of them (x itself)
    c = F.reshape(x, x.shape)           # x itself in eager (DeZero returns x)
    return va(a), vb(b), va(c), vb(x)


def _stored(x, s, W, h, va, vb):
    h.a = va(F.cos(x) - 0.25)           # state the call leaves behind
    return vb(F.cos(x) - 0.25)


def _stored_same(x, s, W, h, va, vb):
    a = F.cos(x) - 0.25
    h.a = va(a)                         # eager: a view of the result's array
    return a, vb(a)


def _rebound(x, s, W, h, va, vb):
    W.data = (F.sin(x) + 0.5).data      # the Parameter's new array
    return vb(F.sin(x) + 0.5)


def _fused_two(x, s, W, h, va, vb):
    a = F.exp(x) * 2.0
    b = F.exp(x) * 2.0
    c = a * b + 1.0                     # one kernel writes the merged value and c
    return va(a), vb(b), c


MERGES = {
    "cse": _cse,
    "cse beside the value": _cse_with_plain,
    "one value twice": _twice,
    "cse of a capture": _capture,
    "constant gradients": _constant_grads,
    "identity of an input": _identity,
    "stored as state": _stored,
    "stored and returned": _stored_same,
    "rebound state": _rebound,
    "fused kernel outputs": _fused_two,
}
# An ndarray stored in a holder's attribute is not threaded state (the call runs
# eagerly, warned), so the state kinds store Variables only.
_STATE = {"stored as state", "stored and returned"}
CASES = [(m, a, b) for m in MERGES for a in VIEWS for b in VIEWS
         if not (m in _STATE and a in (".data slice", ".data"))
         and (a == b or m in ("cse", "one value twice", "stored as state"))]


def _buffers(obj, out):
    """The arrays of a tree of results or state: a Variable's data and .grad's data."""
    if isinstance(obj, Variable):
        if obj.data is not None:
            out.append(obj.data)
        if obj.grad is not None:
            _buffers(obj.grad, out)
    elif isinstance(obj, np.ndarray):
        out.append(obj)
    elif isinstance(obj, (tuple, list)):
        for x in obj:
            _buffers(x, out)
    return out


def _leaves(obj):
    return [y for x in obj for y in _leaves(x)] if isinstance(obj, (tuple, list)) else [obj]


def _side(merge, va, vb):
    W = Parameter(np.zeros((2, 3)), name="W")
    h = Holder()
    h.a = None
    return (lambda x, s: merge(x, s, W, h, va, vb)), W, h


def _check(merge_name, view_a, view_b, backend):
    merge, va, vb = MERGES[merge_name], VIEWS[view_a], VIEWS[view_b]
    fe, We, he = _side(merge, va, vb)
    fj, Wj, hj = _side(merge, va, vb)
    jf = tj.jit(fj, backend=backend)
    for call in range(CALLS):
        rng = np.random.default_rng(10 + call)
        w0 = rng.standard_normal((2, 3))
        We.data[...] = w0               # the captured Parameter, mutated between calls
        Wj.data[...] = w0
        x0, s0 = rng.standard_normal((2, 3)), np.array(rng.standard_normal())
        xe, se = Variable(x0.copy()), Variable(s0.copy())
        xj, sj = Variable(x0.copy()), Variable(s0.copy())
        re, rj = fe(xe, se), jf(xj, sj)
        le, lj = _leaves(re), _leaves(rj)
        assert len(le) == len(lj)
        for i in range(len(le)):        # the same objects where eager's are
            for k in range(len(le)):
                assert (le[i] is le[k]) == (lj[i] is lj[k]), (call, i, k)
            for name, (ae, aj) in {"x": (xe, xj), "s": (se, sj), "W": (We, Wj)}.items():
                assert (le[i] is ae) == (lj[i] is aj), (call, i, name)
        be = _buffers([re, xe, se, We, he.a], [])
        bj = _buffers([rj, xj, sj, Wj, hj.a], [])
        n_results = len(_buffers(re, []))
        assert len(be) == len(bj), (call, len(be), len(bj))
        for i, (a, b) in enumerate(zip(be, bj)):
            np.testing.assert_allclose(b, a, rtol=1e-12, err_msg=f"call {call} buffer {i}")
            assert a.dtype == b.dtype and a.shape == b.shape, (call, i)
            if i < n_results:
                assert a.strides == b.strides, (call, i, a.strides, b.strides)
            for k in range(i + 1, len(be)):
                assert np.shares_memory(a, be[k]) == np.shares_memory(b, bj[k]), \
                    f"call {call}: buffers {i} and {k} alias in one run only " \
                    f"(eager {np.shares_memory(a, be[k])})"
        # A write into each result reaches what it aliases, and nothing else, as in eager.
        for i in range(n_results):
            if be[i].flags.writeable:
                be[i][...] += 10.0 * (i + 1)
                bj[i][...] += 10.0 * (i + 1)
            for k, (a, b) in enumerate(zip(be, bj)):
                np.testing.assert_allclose(b, a, rtol=1e-12,
                                           err_msg=f"call {call}: buffer {k} after a "
                                                   f"write into result buffer {i}")
    info = jf.cache_info()
    assert info["fallbacks"] == 0 and info["hits"] >= 3, info


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("merge,view_a,view_b", CASES,
                         ids=[f"{m}-{a}-{b}" for m, a, b in CASES])
def test_merged_values_alias_as_in_eager(merge, view_a, view_b, backend):
    _check(merge, view_a, view_b, backend)


def test_the_reproducer_of_the_issue():
    # From the first compiled call on, the two results shared one buffer.
    def f(x):
        a = F.sin(x) * 0.5
        b = F.sin(x) * 0.5
        return F.reshape(a, (-1,)), F.transpose(b)
    jf = tj.jit(f)
    for call in range(6):
        u, v = jf(Variable(np.random.default_rng(call).standard_normal((2, 3))))
        assert not np.shares_memory(u.data, v.data), call
        u.data[...] = 7.0
        np.testing.assert_allclose(v.data, 0.5 * np.sin(np.random.default_rng(call)
                                                          .standard_normal((2, 3))).T)


def test_a_merged_view_base_costs_one_copy_decided_when_compiled():
    # The copy is in the generated runner, not a test made at every call.
    def f(x):
        a = F.sin(x) * 0.5
        b = F.sin(x) * 0.5
        return a, F.transpose(b)
    jf = tj.jit(f)
    for call in range(4):
        jf(Variable(np.random.default_rng(call).standard_normal((2, 3))))
    (variant,) = [v for vs in jf._variants.values() for v in vs]
    assert len(variant.copy_outputs) == 1
    assert ".copy(order='K')" in variant.runner.source
