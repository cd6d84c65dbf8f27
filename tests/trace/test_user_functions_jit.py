"""User Functions under jit: a fresh instance per call, its backward on that instance.

An opaque user Function (a tj.Function subclass without codegen data) whose forward
keeps per-call state on self (a sign, a mask, a list) must give every compiled call the
gradient of that call's state, first and second order, as eager does.
"""
import threading
import warnings

import numpy as np
import pytest
from hypothesis import given, strategies as st

import tracejit as tj
import tracejit.functions as F
from tracejit.testing import assert_jit_matches_eager

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")

# First and second order, tight: what the comparisons with eager here check.
SECOND_ORDER = dict(second_order=True, rtol=1e-9, atol=1e-9)


def _variables(*arrays):
    return [tj.Variable(a) for a in arrays]


def _signed(i, shape=(3,)):
    # Alternating signs: the state the forward keeps flips from call to call.
    return (1 if i % 2 else -1) * (np.abs(np.random.randn(*shape)) + 0.1)


class SignScale(tj.Function):
    def forward(self, x):
        self.k = 2.0 if x.sum() > 0 else -3.0
        return x * self.k

    def backward(self, gy):
        return gy * self.k


class Mask2(tj.Function):
    """Two outputs, a mask kept on self, a backward reading its inputs."""

    def forward(self, x, w):
        self.mask = x > 0
        return x * self.mask * w, x.sum() * np.ones(())

    def backward(self, gy, gz):
        x, w = self.inputs
        return gy * w * self.mask + gz, F.sum_to(gy * x * self.mask, w.shape)


class Counted(tj.Function):
    """A container made by __init__ and filled by forward: fresh per call in eager."""

    def __init__(self):
        self.seen = []

    def forward(self, x):
        self.seen.append(x.copy())
        return x * len(self.seen)

    def backward(self, gy):
        return gy * len(self.seen)


def test_state_set_by_forward_is_the_calls_own():
    def f(x):
        return F.sum(SignScale()(F.tanh(x)) * x)

    assert_jit_matches_eager(f, make_args=lambda i: _variables(_signed(i)), calls=4,
                             **SECOND_ORDER)


def test_state_of_a_two_output_function_first_and_second_order():
    def f(x, w):
        a, b = Mask2()(F.tanh(x), w)
        return F.sum(a ** 2) + b * 3

    assert_jit_matches_eager(
        f, make_args=lambda i: _variables(np.random.randn(2, 3), np.random.randn(3)), calls=2,
        **SECOND_ORDER)


def test_a_dead_output_does_not_reset_the_state():
    # The spec of an output nobody used comes from shape_rule, which runs forward on
    # zeros: on the instance itself it overwrote the mask (eager was wrong too).
    def f(x, w):
        a, _ = Mask2()(F.tanh(x), w)
        return F.sum(a ** 2)

    x, w = np.array([[0.5, -1.0, 2.0]]), np.array([1.0, 2.0, 3.0])
    xs = _variables(x.copy(), w.copy())
    f(*xs).backward(create_graph=True)
    gx = xs[0].grad.data
    t = np.tanh(x)
    np.testing.assert_allclose(gx, 2 * (t * (t > 0) * w) * w * (t > 0) * (1 - t ** 2))
    assert_jit_matches_eager(
        f, make_args=lambda i: _variables(np.random.randn(2, 3), np.random.randn(3)), calls=2,
        **SECOND_ORDER)


def test_containers_made_by_init_are_fresh_per_call():
    def f(x):
        return F.sum(Counted()(x) * x)

    assert_jit_matches_eager(f, make_args=lambda i: _variables(np.random.randn(3)), calls=2,
                             **SECOND_ORDER)


def test_stateful_function_inside_grad_inside_jit():
    def f(x):
        g = tj.grad(lambda z: F.sum(SignScale()(z) * z))(x)
        return F.sum(g * x)

    assert_jit_matches_eager(f, make_args=lambda i: _variables(_signed(i)), calls=3,
                             **SECOND_ORDER)


# --- create_graph through a stateful user backward: its gradients have a history


def _second_backward_inside(x):
    # backward(create_graph=True) inside the function, then a second backward (by the
    # caller) through x.grad: it differentiates SignScale's backward, `gy * self.k`,
    # whose gy (= x, from the product) depends on x.
    x.cleargrad()
    y = F.sum(SignScale()(F.tanh(x)) * x)
    y.backward(create_graph=True)
    gx = x.grad
    x.cleargrad()
    return F.sum(gx ** 2)


def _second_backward_known(xv):
    # gx = k (sech^2(x) x + tanh x); d/dx sum(gx^2) = 2 gx k (2 sech^2 x - 2 sech^2 x tanh x x)
    k = 2.0 if np.tanh(xv).sum() > 0 else -3.0
    t = np.tanh(xv)
    s2 = 1 - t ** 2
    gx = k * (s2 * xv + t)
    return 2 * gx * k * (2 * s2 - 2 * s2 * t * xv)


def test_second_backward_through_a_stateful_backward_matches_eager():
    assert_jit_matches_eager(_second_backward_inside,
                             make_args=lambda i: _variables(_signed(i)), calls=4,
                             **SECOND_ORDER)


def test_second_backward_through_a_stateful_backward_is_the_known_derivative():
    from tracejit.testing import gradcheck
    jf = tj.jit(_second_backward_inside)
    for i in range(6):             # the sign, so self.k, flips from call to call
        xv = _signed(i)
        x = tj.Variable(xv.copy())
        jf(x).backward()
        np.testing.assert_allclose(x.grad.data, _second_backward_known(xv), rtol=1e-9)
        assert gradcheck(_second_backward_inside, xv.copy(), jit=True)
    assert jf.cache_info()["hits"] >= 4


class DataSquare(tj.Function):
    """Per-call state, and a backward that reads `.data`: detached, so eager's second
    derivative misses the term through x. jit must miss it too."""

    def forward(self, x):
        self.k = 2.0 if x.sum() > 0 else -3.0
        return self.k * x ** 2

    def backward(self, gy):
        return gy * (2 * self.k) * self.inputs[0].data


def test_data_read_in_a_stateful_backward_stays_detached():
    # Compared with eager, not with numerical derivatives: eager's answer is wrong on
    # purpose (g = 2kx with x detached, so d/dx sum(g * x) is 2kx, not 4kx), and the
    # compiled call must differentiate exactly what eager differentiates.
    def f(x):
        g = tj.grad(lambda z: F.sum(DataSquare()(z)))(x)
        return F.sum(g * x)

    assert_jit_matches_eager(f, make_args=lambda i: _variables(_signed(i)), calls=4,
                             **SECOND_ORDER)
    jf = tj.jit(f)
    for i in range(4):
        xv = _signed(i)
        x = tj.Variable(xv.copy())
        jf(x).backward()
        k = 2.0 if xv.sum() > 0 else -3.0
        np.testing.assert_allclose(x.grad.data, 2 * k * xv, rtol=1e-12)   # not 4kx


class SignCube(tj.Function):
    def forward(self, x):
        self.k = 2.0 if x.sum() > 0 else -3.0
        return self.k * x ** 3

    def backward(self, gy):
        x, = self.inputs
        return gy * (3 * self.k) * x ** 2


def test_third_derivative_through_a_stateful_backward():
    # grad of grad inside, the caller's backward outside: the derivative of the
    # derivative of the user's backward (UserGrad levels 1 and 2).
    def f(x):
        inner = lambda w: F.sum(SignCube()(w) * w)              # noqa: E731
        g = tj.grad(lambda z: F.sum(tj.grad(inner)(z) * z))(x)
        return F.sum(g * x)

    assert_jit_matches_eager(f, make_args=lambda i: _variables(_signed(i)), calls=4,
                             **SECOND_ORDER)
    jf = tj.jit(f)
    for i in range(4):
        xv = _signed(i)
        x = tj.Variable(xv.copy())
        jf(x).backward()
        k = 2.0 if xv.sum() > 0 else -3.0
        # inner' = 4k w^3; h = sum(4k z^4), h' = 16k z^3; f = sum(16k x^4), f' = 64k x^3
        np.testing.assert_allclose(x.grad.data, 64 * k * xv ** 3, rtol=1e-9)


class StateOnlyGrad(tj.Function):
    """A backward that depends on nothing traced (only on the state): its own
    derivative gives no input a gradient."""

    def forward(self, x):
        self.k = 2.0 if x.sum() > 0 else -3.0
        return x * self.k

    def backward(self, gy):
        return tj.Variable(np.full(gy.shape, self.k))


def test_derivative_of_a_backward_that_depends_on_no_input():
    def f(x):
        g = tj.grad(lambda z: F.sum(StateOnlyGrad()(z) * z))(x)
        return F.sum(g * x)

    assert_jit_matches_eager(f, make_args=lambda i: _variables(_signed(i)), calls=4,
                             **SECOND_ORDER)


def test_constructor_argument_kept_in_a_create_graph_replay():
    # The replay of a user Function copies the node's instance: calling its class with
    # no arguments would have taken the default c=1.0.
    class Scale(tj.Function):
        def __init__(self, c=1.0):
            self.c = c

        def forward(self, x):
            return x * self.c

        def backward(self, gy):
            return gy * self.c * self.inputs[0]

    def f(x):
        return F.sum(Scale(3.0)(x) ** 2)

    assert_jit_matches_eager(f, make_args=lambda i: _variables(np.random.randn(3)), calls=2,
                             **SECOND_ORDER)


def test_unchain_backward_keeps_the_calls_instance():
    def f(x):
        return F.sum(SignScale()(F.tanh(x)) * x)

    jf = tj.jit(f)
    for i in range(5):
        xv = _signed(i)
        grads = []
        for fn in (f, jf):
            x = tj.Variable(xv.copy())
            y = fn(x)
            z = y * 2.0
            y.unchain_backward()     # z still reaches y, whose graph is cut
            z.backward()
            y2 = fn(x)
            x.cleargrad()
            y2.backward()
            grads.append(x.grad.data)
        np.testing.assert_allclose(grads[1], grads[0])


def test_threads_each_get_their_own_instances():
    def f(x):
        return F.sum(SignScale()(x) ** 2)

    jf = tj.jit(f)
    for i in range(3):
        jf(tj.Variable(_signed(i)))
    errors = []

    def worker(sign):
        for _ in range(40):
            xv = sign * (np.abs(np.random.randn(3)) + 0.1)
            x, xe = tj.Variable(xv.copy()), tj.Variable(xv.copy())
            jf(x).backward()
            f(xe).backward()
            if not np.allclose(x.grad.data, xe.grad.data):
                errors.append(sign)

    threads = [threading.Thread(target=worker, args=(s,)) for s in (1, -1, 1, -1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


class Gate(tj.Function):
    """Its backward gives w a gradient only on calls whose x sums above 0."""

    def forward(self, x, w):
        self.pos = x.sum() > 0
        return x * w

    def backward(self, gy):
        x, w = self.inputs
        return gy * w, (gy * x if self.pos else None)


def test_backward_that_changes_which_inputs_get_gradients_runs_eagerly():
    def f(x, w):
        return F.sum(Gate()(F.tanh(x), w) * w)

    signs = [1, 1, 1, -1, 1, -1, -1]       # warm-up, trace (x > 0), compiled calls
    assert_jit_matches_eager(
        f, make_args=lambda i: _variables(_signed(signs[i] > 0), np.random.randn(3)),
        calls=len(signs) - 2, rtol=1e-9, atol=1e-9)


def test_create_graph_through_such_a_backward_runs_it_eagerly():
    # Under create_graph too: that call's backward is eager's, on the call's own inputs,
    # so the gradients carry their history (a second backward reaches x and w).
    def f(x, w):
        return F.sum(Gate()(F.tanh(x), w) * w)

    signs = [1, 1, 1, -1, 1, -1, -1]
    assert_jit_matches_eager(
        f, make_args=lambda i: _variables(_signed(signs[i] > 0), np.random.randn(3)),
        calls=len(signs) - 2, **SECOND_ORDER)


def test_function_built_from_a_traced_value_runs_eagerly():
    class Scale(tj.Function):
        def __init__(self, c):
            self.c = c

        def forward(self, x):
            return x * self.c

        def backward(self, gy):
            return gy * self.c

    def f(x):
        return F.sum(Scale(F.tanh(x).data.sum())(x))    # c computed from traced data

    jf = tj.jit(f)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always", tj.JitWarning)
        for i in range(4):
            xv = np.random.randn(3)
            np.testing.assert_allclose(jf(tj.Variable(xv)).data, f(tj.Variable(xv)).data)
    assert jf.cache_info()["variants"] == 0
    said = [str(w.message) for w in seen if issubclass(w.category, tj.JitWarning)]
    assert any("runs eagerly" in m and "return x * self.c" in m for m in said), said


@given(st.lists(st.sampled_from([-1.0, 1.0]), min_size=3, max_size=6),
       st.integers(0, 2 ** 16))
def test_sign_sequences(signs, seed):
    rng = np.random.default_rng(seed)

    def f(x, w):
        h = SignScale()(x * w)
        return F.sum(h * h * w)

    assert_jit_matches_eager(
        f, make_args=lambda i: _variables(signs[i] * (np.abs(rng.standard_normal(3)) + 0.1),
                                          np.abs(rng.standard_normal(3)) + 0.1),
        calls=len(signs) - 2, **SECOND_ORDER)


@pytest.mark.parametrize("order", [0, 1, 2], ids=["backward", "create_graph", "twice"])
def test_stateful_function_graph_is_freed_by_refcounting(order):
    import gc
    import weakref

    from test_no_reference_cycles import _graph_refs

    def f(x, w):
        a, b = Mask2()(F.tanh(x), w)
        return F.sum(SignScale()(a) ** 2) + b

    jf = tj.jit(f)
    gc.collect()
    gc.disable()
    try:
        for k in range(5):       # warm-up, trace, checked call, compiled calls
            x, w = tj.Variable(_signed(k, (2, 3))), tj.Variable(np.random.randn(3))
            y = jf(x, w)
            y.backward(create_graph=order > 0)
            refs = _graph_refs(y) + _graph_refs(x.grad, w.grad)
            if order > 1:
                gx = x.grad
                x.cleargrad()
                w.cleargrad()
                z = F.sum(gx ** 2)
                del gx
                z.backward(create_graph=True)
                refs += _graph_refs(z, x.grad, w.grad)
                del z
            probe = weakref.ref(y.creator)
            del y
            x.cleargrad()
            w.cleargrad()
            alive = [type(r()).__name__ for r in refs
                     if r() is not None and r() is not x and r() is not w]
            assert alive == [] and probe() is None, (k, alive)
    finally:
        gc.enable()
    assert jf.cache_info()["fallbacks"] == 0


@pytest.mark.parametrize("create_graph", [False, True])
def test_create_graph_through_a_stateful_backward_is_freed_by_refcounting(create_graph):
    # The UserGrad calls (their instances and the leaves of their VJPs) make no cycle.
    import gc
    import weakref

    from test_no_reference_cycles import _graph_refs

    jf = tj.jit(_second_backward_inside)
    gc.collect()
    gc.disable()
    try:
        for k in range(5):       # warm-up, trace, checked call, compiled calls
            x = tj.Variable(_signed(k))
            y = jf(x)
            y.backward(create_graph=create_graph)
            refs = _graph_refs(y) + _graph_refs(x.grad)
            probe = weakref.ref(y.creator)
            del y
            x.cleargrad()
            alive = [type(r()).__name__ for r in refs if r() is not None and r() is not x]
            assert alive == [] and probe() is None, (k, alive)
    finally:
        gc.enable()
    assert jf.cache_info()["fallbacks"] == 0


def test_function_built_from_python_numbers_of_traced_values_compiles():
    # float() of traced data and a float argument given to __init__: the NumPy forward
    # sees numbers, as in eager; each is guarded by its value.
    class Scale(tj.Function):
        def __init__(self, c):
            self.c = c

        def forward(self, x):
            return x * self.c

        def backward(self, gy):
            return gy * self.c

    def f(x, lr):
        m = float(x.data.mean() > 0)
        return F.sum(Scale(m + 1.0)(x) * Scale(lr)(x))

    lrs = [0.5, 0.5, 0.25, 0.25, 0.5, 0.25, 0.5]
    info = assert_jit_matches_eager(lambda x: f(x, lrs[0]),
                                    make_args=lambda i: _variables(np.random.randn(3)),
                                    calls=3, **SECOND_ORDER)
    assert info["fallbacks"] == 0
    jf = tj.jit(f)
    for i, lr in enumerate(lrs):
        xv = np.random.randn(3)
        got, want = [], []
        for fn, out in ((f, want), (jf, got)):
            x = tj.Variable(xv.copy())
            y = fn(x, lr)
            y.backward()
            out += [y.data, x.grad.data]
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w)
    assert jf.cache_info()["fallbacks"] == 0
