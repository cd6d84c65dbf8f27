"""np.random.seed(k) inside a jitted function is an effect on NumPy's global stream,
recorded in order with the draws (F.dropout): the call compiles, and on every call the
draws, the gradients and the stream's state afterwards are eager's. Seeds of every kind
a program computes (a NumPy integer, a Python int computed from traced data) are
recorded as the seed they are."""
import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F
from tracejit import Parameter, Variable

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")


def _same_stream(a, b):
    return a[2] == b[2] and np.array_equal(a[1], b[1])


def _compare(jf, fn, make, n=5, grads=True, traces=1):
    """Each call from the same stream state as eager's, with new values (and a draw of
    the caller's between calls): results, grads and the stream state after match."""
    for k in range(n):
        np.random.rand(k + 1)                       # the caller's own draws move the stream
        state = np.random.get_state()
        args_j, args_e = make(k), make(k)
        got = jf(*args_j)
        after_j = np.random.get_state()
        np.random.set_state(state)
        want = fn(*args_e)
        after_e = np.random.get_state()
        np.testing.assert_allclose(got.data, want.data, rtol=1e-12, atol=1e-12)
        assert _same_stream(after_j, after_e), k
        if grads:
            got.backward()
            want.backward()
            for a, b in zip(args_j, args_e):
                if isinstance(a, Variable):
                    np.testing.assert_allclose(a.grad.data, b.grad.data, rtol=1e-12)
    info = jf.cache_info()
    assert info["fallbacks"] == 0 and info["hits"] >= n - 1 - traces, info


def _x(k, shape=(4, 5)):
    return Variable(np.linspace(-1, 1, 20).reshape(shape) * (1 + k))


def test_seed_then_dropout_compiles_and_matches_eager():
    def f(x):
        np.random.seed(7)
        return F.sum(F.dropout(F.tanh(x), 0.5) * x)

    _compare(tj.jit(f), f, lambda k: (_x(k),))


def test_draw_seed_draw():
    W = Parameter(np.linspace(0.5, 1.5, 5))

    def f(x):
        h = F.dropout(x, 0.3) * W                     # from the caller's stream
        np.random.seed(11)
        return F.sum(F.dropout(h, 0.6) ** 2)          # from seed 11

    def make(k):
        W.data = W.data + 0.1                         # a captured Parameter, updated
        return (_x(k),)

    _compare(tj.jit(f), f, make)


def test_a_seed_from_a_static_argument():
    def f(x, seed):
        np.random.seed(seed)
        return F.sum(F.dropout(x, 0.5))

    jf = tj.jit(f, static_argnums=1)
    for seed in (1, 2):
        _compare(jf, lambda x, s=seed: f(x, s), lambda k, s=seed: (_x(k), s), n=4,
                 grads=False)


def test_a_seed_after_a_guard_that_fails_leaves_the_stream_as_eager():
    def f(x):
        np.random.seed(3)
        y = F.dropout(x, 0.5)
        if y.data.sum() > 0:
            y = y * 2.0
        return F.sum(y)

    sign = [1.0, 1.0, 1.0, -1.0, -1.0, 1.0, -1.0]
    jf = tj.jit(f)
    _compare(jf, f, lambda k: (Variable(np.full((3, 4), sign[k % len(sign)] * (k + 1))),),
             n=7, traces=2)


def test_create_graph_through_a_seeded_call():
    def f(x):
        np.random.seed(5)
        return F.sum(F.dropout(x, 0.5) ** 3)

    jf = tj.jit(f)
    for k in range(4):
        xj, xe = _x(k), _x(k)
        yj, ye = jf(xj), f(xe)
        np.testing.assert_allclose(yj.data, ye.data, rtol=1e-12)
        yj.backward(create_graph=True)
        ye.backward(create_graph=True)
        gj, ge = xj.grad, xe.grad
        xj.cleargrad()
        xe.cleargrad()
        F.sum(gj).backward()
        F.sum(ge).backward()
        np.testing.assert_allclose(xj.grad.data, xe.grad.data, rtol=1e-12)
    assert jf.cache_info()["fallbacks"] == 0


def test_the_seed_is_a_node_of_the_graph():
    def f(x):
        np.random.seed(9)
        return F.dropout(x, 0.5)

    jf = tj.jit(f)
    for k in range(3):
        np.testing.assert_array_equal(jf(_x(k)).data, f(_x(k)).data)
    text = str(jf.trace(_x(0), optimized=False))
    assert "random_seed[seed=9]" in text and text.index("random_seed") < \
        text.index("random_uniform")


def _compare_on_inputs(fn, xs, max_traces):
    jf = tj.jit(fn)
    for k, x in enumerate(xs):
        np.random.rand(k + 1)                   # the caller's draws move the stream
        state = np.random.get_state()
        got = jf(Variable(x.copy()))
        after_j = np.random.get_state()
        np.random.set_state(state)
        want = fn(Variable(x.copy()))
        after_e = np.random.get_state()
        np.testing.assert_allclose(got.data, want.data, rtol=1e-12, atol=1e-12)
        assert _same_stream(after_j, after_e), k
    info = jf.cache_info()
    assert info["fallbacks"] == 0 and info["traces"] <= max_traces, info
    assert info["hits"] >= len(xs) - 1 - 2 * max_traces, info


def test_a_seed_computed_with_int_of_traced_data_is_its_value():
    # int(...) of traced data is a TracedInt: as a seed it is the value it is (guarded,
    # a new value retraces), not an escape that runs every call eagerly.
    def f(x):
        k = int(abs(x.data.sum())) % 2 + 3
        np.random.seed(k)
        return F.dropout(x * 2.0, 0.5)

    xs = [np.linspace(-1, 1, 6) + s for s in (0.1, 0.2, 0.9, 0.95, 0.15, 0.92)]
    _compare_on_inputs(f, xs, max_traces=2)


def test_numpy_integer_seeds():
    def f(x):
        np.random.seed(np.int64(7))
        a = F.dropout(x, 0.5)
        np.random.seed(np.uint32(9))
        return a + F.dropout(x, 0.3)

    _compare_on_inputs(f, [np.linspace(-1, 1, 6) * (k + 1) for k in range(5)], max_traces=1)
