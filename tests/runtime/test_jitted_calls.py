"""What a jitted call takes and returns: Variable, ndarray and keyword arguments, containers
of results, dtypes, fresh results, arguments written in place, nested jit, methods,
random programs; each call after call with new values, compared with eager.

Every test calls a jitted function well past its warm-up (1st call eager, 2nd traces,
later calls replay). An unexpected fallback fails the test: JitWarning is an error.
"""
import warnings

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st, HealthCheck

import tracejit as tj
import tracejit.functions as F
from tracejit import Variable
from tracejit.testing import strategies as tjst

from tracejit.testing.checks import assert_call_matches_eager

from twin_models import twins as _twins

N_CALLS = 6          # >= 5: warm-up, trace, then at least 3 replays

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")


def _same_call(jf, f, *args, rtol=1e-10, atol=1e-12, **options):
    """One call of jf and f on copies of args: the results, then (unless backward=False)
    the arguments' gradients from a backward with random cotangents, compared."""
    return assert_call_matches_eager(jf, f, *args, rtol=rtol, atol=atol, **options)


def _graph(x, W, b):
    h = F.tanh(F.matmul(x, W) + b)
    return F.sum(h * h - 0.5 * h) / 3.0


def test_basic_variable_args_values_and_grads():
    jf = tj.jit(_graph)
    r = np.random.default_rng(1)
    for i in range(N_CALLS):
        xa, Wa, ba = r.standard_normal((4, 3)), r.standard_normal((3, 2)), r.standard_normal(2)
        _same_call(jf, _graph, Variable(xa), Variable(Wa), Variable(ba))
    info = jf.cache_info()
    assert info["variants"] == 1 and info["retraces"] == 0
    assert info["hits"] >= N_CALLS - 3, info   # the first replay may be a checked run
    assert jf.cache_info()["fallbacks"] == 0, jf.cache_info()


def test_basic_ndarray_args_and_mixed():
    jf = tj.jit(_graph)
    r = np.random.default_rng(2)
    for i in range(N_CALLS):
        xa, Wa, ba = r.standard_normal((5, 3)), r.standard_normal((3, 4)), r.standard_normal(4)
        _same_call(jf, _graph, xa, Variable(Wa), ba)
        # all-ndarray call: a Variable result that is not attached to any leaf
        _same_call(jf, _graph, xa, Wa, ba, backward=False)
    assert jf.cache_info()["fallbacks"] == 0, jf.cache_info()


def _multi(x, y):
    s = x * y + F.sin(x)
    return s, {"a": F.sum(s), "b": [x - y, F.exp(y)]}


@pytest.mark.parametrize("form", ["tuple", "dict", "list"])
def test_output_containers(form):
    def f(x, y):
        a, rest = _multi(x, y)
        if form == "tuple":
            return a, rest["a"]
        if form == "dict":
            return rest
        return [a, rest["b"][0], rest["b"][1]]

    jf = tj.jit(f)
    r = np.random.default_rng(3)
    for i in range(N_CALLS):
        xa, ya = r.standard_normal((2, 3)), r.standard_normal((2, 3))
        # the outputs, then the gradients of a random combination of all of them
        _same_call(jf, f, Variable(xa), Variable(ya))
    assert jf.cache_info()["fallbacks"] == 0, jf.cache_info()


def test_keyword_arguments():
    def f(x, *, scale, shift=None):
        y = F.tanh(x) * scale
        if shift is not None:
            y = y + shift
        return F.sum(y)

    jf = tj.jit(f)
    r = np.random.default_rng(4)
    for i in range(N_CALLS):
        xa, sa, ta = r.standard_normal(3), r.standard_normal(3), r.standard_normal(3)
        # and the gradients of x and of the keyword argument scale
        _same_call(jf, f, Variable(xa), kwargs={"scale": Variable(sa), "shift": ta})
    assert jf.cache_info()["variants"] == 1
    assert jf.cache_info()["fallbacks"] == 0, jf.cache_info()


def test_float_returned_and_python_float_output():
    def f(x, lr):
        return x * 2.0, lr * 3.0

    jf = tj.jit(f)
    for i in range(N_CALLS):
        lr = 0.1 * (i + 1)
        xa = np.arange(3.0) * i
        oj = _same_call(jf, f, Variable(xa), lr, backward=False, rtol=1e-12)
        assert type(oj[1]) is float
    assert jf.cache_info()["fallbacks"] == 0, jf.cache_info()


def test_arguments_not_mutated_and_results_fresh():
    def f(x, a):
        return x * 1.0, a

    jf = tj.jit(f)
    for i in range(N_CALLS):
        xa = np.arange(3.0) + i
        a = np.arange(2.0) - i
        xa0, a0 = xa.copy(), a.copy()
        x = Variable(xa)
        y, b = jf(x, a)
        np.testing.assert_array_equal(xa, xa0)
        np.testing.assert_array_equal(a, a0)
        assert not np.shares_memory(y.data, xa)
        y.data[...] = 99.0
        np.testing.assert_array_equal(xa, xa0)
        np.testing.assert_array_equal(b, a0)
    assert jf.cache_info()["fallbacks"] == 0, jf.cache_info()


def test_jit_method_of_model():
    m_j, m_e = _twins(2, (5, 2))

    class Net:
        def __init__(self, m):
            self.m = m

        @tj.jit
        def loss(self, x):
            return F.sum(self.m(x) ** 2)

    net = Net(m_j)
    r = np.random.default_rng(16)
    for i in range(N_CALLS):
        xa = r.standard_normal((4, 3))
        m_j.cleargrads()
        m_e.cleargrads()
        # the loss, then the parameters' data and gradients after a backward
        _same_call(net.loss, lambda x: F.sum(m_e(x) ** 2), xa,
                   states=(list(m_j.params()), list(m_e.params())))
        # mutate the params the same way in both
        for p1, p2 in zip(m_j.params(), m_e.params()):
            d = r.standard_normal(p1.shape) * 0.1
            p1.data += d
            p2.data += d


def test_jit_keeps_no_argument_alive():
    import gc
    import weakref

    jf = tj.jit(lambda x: F.sum(F.tanh(x) * 2))
    refs = []
    for i in range(N_CALLS):
        x = Variable(np.arange(3.0) + i)
        y = jf(x)
        y.backward()
        refs.append(weakref.ref(x))
        del x, y
    gc.collect()
    assert [r() is None for r in refs] == [True] * N_CALLS
    assert jf.cache_info()["fallbacks"] == 0, jf.cache_info()


@pytest.mark.parametrize("kind", ["ndarray", "variable"])
def test_inplace_write_into_argument_replayed(kind):
    if kind == "ndarray":
        def f(x, a):
            a += 1.0
            return x * a
    else:
        def f(x, a):
            a.data += 1.0
            return x * a

    jf = tj.jit(f)
    for i in range(N_CALLS):
        aj, ae = np.arange(3.0) + i, np.arange(3.0) + i
        if kind == "variable":
            aj, ae = Variable(aj), Variable(ae)
        xa = np.linspace(-1, 1, 3) * i
        # a after the call: exactly eager's
        _same_call(jf, f, Variable(xa), aj, eager_args=(Variable(xa), ae), backward=False,
                   rtol=0.0, atol=0.0)
    assert jf.cache_info()["fallbacks"] == 0, jf.cache_info()


def test_nested_jit():
    inner = tj.jit(lambda x: F.sin(x) * x)

    def outer(x):
        return F.sum(inner(x) + x)

    def eager(x):
        return F.sum(F.sin(x) * x + x)

    jo = tj.jit(outer)
    r = np.random.default_rng(26)
    for i in range(N_CALLS):
        xa = r.standard_normal(3)
        _same_call(jo, eager, Variable(xa))
    assert jo.cache_info()["fallbacks"] == 0, jo.cache_info()


def test_int_dtype_arrays_correct():
    f = lambda x: x * 2 + 1
    jf = tj.jit(f)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tj.JitWarning)   # ints may run eagerly, with a warning
        for i in range(N_CALLS):
            a = np.arange(3) + i
            _same_call(jf, f, Variable(a), backward=False)


def test_non_array_outputs_are_constants():
    jf = tj.jit(lambda x, n: (x * 2, n, None, "s"))
    for i in range(N_CALLS):
        out = jf(Variable(np.arange(2.0) + i), 3)
        assert out[1:] == (3, None, "s")
        np.testing.assert_array_equal(out[0].data, (np.arange(2.0) + i) * 2)
    assert jf.cache_info()["fallbacks"] == 0, jf.cache_info()


def test_mask_from_data_comparison():
    def f(x):
        mask = x.data > 0
        return F.sum(x * Variable(mask.astype(x.dtype)) + F.relu(-x) * 0.5)

    jf = tj.jit(f)
    r = np.random.default_rng(31)
    for i in range(N_CALLS):
        xa = r.standard_normal(5)
        _same_call(jf, f, Variable(xa))
    assert jf.cache_info()["fallbacks"] == 0, jf.cache_info()


def test_softmax_cross_entropy_with_int_labels():
    jf = tj.jit(F.softmax_cross_entropy)
    r = np.random.default_rng(32)
    for i in range(N_CALLS):
        xa, t = r.standard_normal((4, 3)), r.integers(0, 3, 4)
        _same_call(jf, F.softmax_cross_entropy, Variable(xa), t)
    assert jf.cache_info()["fallbacks"] == 0, jf.cache_info()


def test_accuracy_compiles():
    jf = tj.jit(F.accuracy)
    r = np.random.default_rng(33)
    for i in range(N_CALLS):
        xa, t = r.standard_normal((6, 3)), r.integers(0, 3, 6)
        _same_call(jf, F.accuracy, xa, t, backward=False)
    assert jf.cache_info()["fallbacks"] == 0, jf.cache_info()


def test_float32_stays_float32():
    def f(x, w):
        return F.tanh(x * 2.0) + w * 0.5 - 1, F.sum(x * w) / 3.0

    jf = tj.jit(f)
    r = np.random.default_rng(22)
    for i in range(N_CALLS):
        xa = r.standard_normal(4).astype(np.float32)
        wa = r.standard_normal(4).astype(np.float32)
        xj, wj = Variable(xa.copy()), Variable(wa.copy())
        aj, bj = _same_call(jf, f, xj, wj, eager_args=(Variable(xa), Variable(wa)),
                            rtol=1e-6, atol=1e-7)
        assert aj.dtype == np.float32 and bj.dtype == np.float32
        assert xj.grad.dtype == np.float32 and wj.grad.dtype == np.float32
    assert jf.cache_info()["fallbacks"] == 0, jf.cache_info()


def test_float32_times_runtime_float_arg():
    def f(x, s):
        return x * s

    jf = tj.jit(f)
    for i in range(N_CALLS):
        xa = (np.arange(3) + i).astype(np.float32)
        s = 0.1 * (i + 1)
        yj = _same_call(jf, f, Variable(xa), s, backward=False, rtol=1e-6)
        assert yj.dtype == np.float32          # eager's dtype too: compared
    assert jf.cache_info()["fallbacks"] == 0, jf.cache_info()


@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck),
          derandomize=True, database=None)
@given(data=st.data(), dtype=st.sampled_from([np.float64, np.float32]))
def test_random_programs_jit_matches_eager(data, dtype):
    prog, inputs = data.draw(tjst.programs(dtype=dtype))
    jf = tj.jit(prog)
    rtol, atol = (1e-9, 1e-11) if dtype == np.float64 else (2e-4, 1e-5)
    shapes = [a.shape for a in inputs]
    r = np.random.default_rng(len(shapes))
    for call in range(N_CALLS):
        if call == 0:
            arrays = inputs
        else:
            arrays = [r.uniform(-2, 2, s).astype(dtype) for s in shapes]
        _same_call(jf, prog, *[Variable(a) for a in arrays], rtol=rtol, atol=atol)
    info = jf.cache_info()
    assert info["variants"] == 1 and info["hits"] >= N_CALLS - 3, info
    assert jf.cache_info()["fallbacks"] == 0, jf.cache_info()
