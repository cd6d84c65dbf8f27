"""A backward through a compiled call after its argument's data changed gives eager's
gradients.

Eager's backward reads each Function's input Variables as they are at backward time
and the intermediate values as the forward computed them. A compiled call's backward
recomputes cheap intermediates (remat) from its inputs, and its create_graph replay
recomputes with NumPy the values computed from inputs it assumes unchanged: right for
captured state (live, never recomputed), wrong for an argument Variable whose data the
caller changes between the call and its backward (in place, or rebinding `.data`).
Each test calls the jitted function at least four times with new values, comparing
each call with eager; an unexpected fallback fails the test.
"""
import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F
from tracejit import Variable

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")

REASON = ("remat and the create_graph replay recompute from an argument's data as it is "
          "at backward time; eager's intermediates are the forward's (only captured "
          "state counts as live)")


def _compare(fn, update, second_order):
    f = tj.jit(fn)
    rng = np.random.RandomState(0)
    for i in range(5):
        v, w = rng.randn(3), rng.randn(3)
        got = []
        for g in (fn, f):
            x, p = Variable(v.copy()), Variable(w.copy())
            y = g(x, p)
            update(x, p)
            y.backward(create_graph=second_order)
            out = [x.grad.data.copy(), p.grad.data.copy()]
            if second_order:
                gx = x.grad
                x.cleargrad()
                p.cleargrad()
                F.sum(gx * gx).backward()
                out += [x.grad.data, p.grad.data]
            got.append(out)
        for a, b in zip(*got):
            np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)


def cheap(x, p):
    return F.sum((x * 2.0) * (x * p + 1.0))


def costly(x, p):
    return F.sum(F.sin(x) * p * x)


def in_place(x, p):
    x.data += 1.0
    p.data *= 2.0


def rebind(x, p):
    x.data = x.data + 1.0


@pytest.mark.parametrize("fn", [cheap, costly])
def test_in_place_update_of_an_argument_then_backward(fn):
    _compare(fn, in_place, second_order=False)


def test_in_place_update_of_an_argument_then_create_graph():
    _compare(costly, in_place, second_order=True)


def test_rebound_argument_data_then_backward():
    _compare(costly, rebind, second_order=False)


def test_untouched_arguments_backward_later():
    # The same programs with nothing changed between call and backward: they match.
    _compare(cheap, lambda x, p: None, second_order=True)
    _compare(costly, lambda x, p: None, second_order=True)


# Neighbours: every way a deferred backward reads an argument.

def _compare_calls(fn, make, update, second_order=False, n=5):
    """fn(*make(rng)) eager and jitted, `update` the arguments between the call and
    the backward, and compare the results' gradients (and, with second_order, those of
    F.sum(g * g) over the create_graph gradients) argument by argument."""
    f = tj.jit(fn)
    for i in range(n):
        got = []
        for g in (fn, f):
            args = make(np.random.RandomState(i))
            out = g(*args)
            y = out[0] if isinstance(out, tuple) else out
            update(*args)
            y.backward(create_graph=second_order)
            vs = [a for a in args if isinstance(a, Variable)]
            res = [None if a.grad is None else a.grad.data.copy() for a in vs]
            if second_order:
                gs = [a.grad for a in vs if a.grad is not None]
                for a in vs:
                    a.cleargrad()
                sum(F.sum(gx * gx) for gx in gs).backward()
                res += [None if a.grad is None else a.grad.data.copy() for a in vs]
            got.append(res)
        for a, b in zip(*got):
            assert (a is None) == (b is None)
            if a is not None:
                assert a.dtype == b.dtype
                np.testing.assert_allclose(a, b, rtol=1e-6 if a.dtype == np.float32
                                           else 1e-9, atol=1e-12)


def _vars(*shapes, dtype=np.float64, cls=Variable):
    return lambda rng: [cls(np.asarray(rng.randn(*s), dtype)) for s in shapes]


def chain(x, p):
    # Cheap elementwise math on arguments only: what remat recomputes.
    z = x
    for _ in range(3):
        z = z * p + x
    return F.sum(z * z)


def mixed(x, p):
    return F.sum(F.tanh(x * p) * (x + 1.0) + F.exp(p * 0.5) * x)


UPDATES = {
    "in place": lambda x, p: (x.data.__iadd__(1.0), p.data.__imul__(2.0)),
    "x.data += 1": in_place,
    "rebind": lambda x, p: (setattr(x, "data", x.data + 1.0),
                            setattr(p, "data", p.data * -2.0)),
    "slice write": lambda x, p: x.data.__setitem__(Ellipsis, 0.5),
}


@pytest.mark.parametrize("update", UPDATES.values(), ids=UPDATES.keys())
@pytest.mark.parametrize("fn", [chain, mixed, cheap, costly])
@pytest.mark.parametrize("second_order", [False, True], ids=["first", "create_graph"])
def test_any_update_of_arguments_then_backward(fn, update, second_order):
    _compare_calls(fn, _vars((4,), (4,)), update, second_order)


def test_zero_dimensional_arguments():
    # Graphs of 0-d values recompute everything they can: not from changed arguments.
    def gp(x, y):
        return (1 + (x + y + 1) ** 2 * (19 - 14 * x + 3 * x ** 2)) * (30 + (2 * x - 3 * y) ** 2)
    for update in UPDATES.values():
        _compare_calls(gp, _vars((), ()), update)
        _compare_calls(gp, _vars((), ()), update, second_order=True)


def test_float32_arguments():
    _compare_calls(chain, _vars((5,), (5,), dtype=np.float32), in_place)
    _compare_calls(mixed, _vars((5,), (5,), dtype=np.float32), UPDATES["rebind"])


def test_parameters_passed_as_arguments():
    _compare_calls(chain, _vars((3,), (3,), cls=tj.Parameter), in_place)
    _compare_calls(mixed, _vars((3,), (3,), cls=tj.Parameter), UPDATES["rebind"], True)


def test_the_argument_is_also_returned():
    def f(x, p):
        return F.sum((x * p + 1.0) * x), x

    f_j = tj.jit(f)
    for i in range(4):
        x, p = Variable(np.random.RandomState(i).randn(3)), Variable(np.ones(3) * i)
        y, xr = f_j(x, p)
        assert xr is x
    _compare_calls(f, _vars((3,), (3,)), in_place)
    _compare_calls(f, _vars((3,), (3,)), UPDATES["rebind"], second_order=True)


def test_an_ndarray_argument_updated_in_place():
    # An ndarray argument: eager wraps the array itself, so its backward reads it as it
    # is then (a direct read), and the values computed from it as they were.
    def make(rng):
        return [rng.randn(4), Variable(rng.randn(4))]

    def update(a, p):
        a += 1.0
        p.data *= 3.0

    for fn in (chain, mixed, cheap, costly):
        _compare_calls(fn, make, update)
        _compare_calls(fn, make, update, second_order=True)


def test_a_captured_parameter_and_an_argument_both_change():
    W = tj.Parameter(np.linspace(-1.0, 1.0, 4))

    def f(x):
        return F.sum((x * W + 1.0) * (x * 2.0))

    def make(rng):
        # W in place (the capture stays the same object), the same for both sides.
        W.data[...] = rng.randn(4)
        return [Variable(rng.randn(4))]

    def update(x):
        x.data += 1.0
        W.data *= 0.5
    for second_order in (False, True):
        _compare_calls(f, make, update, second_order)


def test_the_function_updates_the_argument_and_the_caller_again():
    def f(x, p):
        y = F.sum((x * p + 1.0) * x)
        x.data *= 0.5
        return y

    _compare_calls(f, _vars((3,), (3,)), in_place)
    _compare_calls(f, _vars((3,), (3,)), UPDATES["rebind"])


def test_the_function_rebinds_an_argument_data():
    # A rebind inside the call: eager's backward reads the new array directly.
    def f(x, p):
        y = F.sum(F.sin(x) * p * x)
        x.data = x.data * 2.0
        return y

    _compare_calls(f, _vars((3,), (3,)), lambda x, p: None)
    _compare_calls(f, _vars((3,), (3,)), in_place)
    _compare_calls(f, _vars((3,), (3,)), UPDATES["rebind"])


def test_a_captured_parameter_the_call_and_then_the_caller_update():
    # The call's update is a state of W's buffer; eager's backward reads W as the
    # caller left it, and the values computed before either update as they were.
    W = tj.Parameter(np.linspace(-1.0, 1.0, 4))

    def f(x):
        y = F.sum(F.sin(x) * W * x + (x * W) * 2.0)
        W.data -= 0.25 * W.data
        return y

    def make(rng):
        W.data[...] = rng.randn(4)
        return [Variable(rng.randn(4))]

    def update(x):
        W.data *= -0.5
        x.data += 1.0
    for second_order in (False, True):
        _compare_calls(f, make, update, second_order)


def test_an_ndarray_argument_the_call_and_then_the_caller_update():
    def f(a, p):
        y = F.sum(F.sin(p) * a)
        a *= 0.5
        return y + F.sum(p * a * p)      # read after the update: a state of a's buffer

    def make(rng):
        return [rng.randn(4), Variable(rng.randn(4))]

    def update(a, p):
        a += 1.0
        p.data *= 2.0
    _compare_calls(f, make, update)


# Intermediates eager holds as views of an argument's buffer (F.transpose, F.reshape, a
# view of a view, x.data[...] wrapped): its backward reads them through the buffer, as
# the caller's update left it (after `x.data = ...`: the old buffer, still aliased). The
# compiled backward rebuilds them on the call's buffer. F.get_item copies in eager: its
# result is the forward's, by construction.

def _set_element(x, p):
    x.data[0, 1] = 5.0          # in place, through the buffer eager's views alias


def _rebind_both(x, p):
    x.data = x.data + 1.0       # eager's views keep the old buffer
    p.data = p.data * -2.0


def _rebind_then_write_the_old_buffer(x, p):
    old = x.data
    x.data = old * 2.0
    old[1, 2] = -3.0            # what eager's views alias


VIEW_UPDATES = {"element": _set_element, "x.data += 1": in_place, "rebind": _rebind_both,
                "rebind, old written": _rebind_then_write_the_old_buffer,
                "slice write": UPDATES["slice write"]}


def view_transpose(x, p):
    return F.sum(F.tanh(p) / (F.transpose(x, (1, 0)) ** 2 + 1.0))


def view_transpose_read_directly(x, p):
    return F.sum(F.tanh(p) * F.transpose(x))       # Mul's backward reads the view


def view_reshape(x, p):
    return F.sum(F.sin(p) * F.reshape(x, (3, 2)) ** 2)


def view_of_a_view(x, p):
    # transpose of (2, 3) is F-contiguous: reshaping it to its own shape is a view too.
    return F.sum(F.tanh(p) * F.reshape(F.transpose(x), (3, 2)) * F.transpose(x)[0:3])


def view_of_data_wrapped(x, p):
    # x.data.T is NumPy's view; the Variable wrapping it is a leaf Mul's backward reads.
    return F.sum(F.tanh(p) * Variable(x.data.T) * F.transpose(x) ** 2)


def view_get_item(x, p):
    # F.get_item copies (eager's GetItem.forward): not a view, the forward's value.
    return F.sum(F.tanh(p) * F.transpose(x[0:2, :]) ** 2 * F.transpose(x)[0:3, 0:2])


def view_also_returned(x, p):
    t = F.transpose(x)
    return F.sum(F.tanh(p) * t * t), t


VIEW_PROGRAMS = [view_transpose, view_transpose_read_directly, view_reshape,
                 view_of_a_view, view_of_data_wrapped, view_get_item, view_also_returned]


@pytest.mark.parametrize("update", VIEW_UPDATES.values(), ids=VIEW_UPDATES.keys())
@pytest.mark.parametrize("fn", VIEW_PROGRAMS)
@pytest.mark.parametrize("second_order", [False, True], ids=["first", "create_graph"])
def test_views_of_arguments_then_update_then_backward(fn, update, second_order):
    _compare_calls(fn, _vars((2, 3), (3, 2)), update, second_order)


def test_a_returned_view_still_aliases_the_argument():
    f = tj.jit(view_also_returned)
    for i in range(4):
        x, p = _vars((2, 3), (3, 2))(np.random.RandomState(i))
        y, t = f(x, p)
        assert np.shares_memory(t.data, x.data)
        y.backward()


def test_views_of_a_non_contiguous_argument():
    # A reshape of a non-contiguous argument copies in eager (and in the replay); a
    # transpose of it is a view again.
    def make(rng):
        return [Variable(np.asfortranarray(rng.randn(2, 3))), Variable(rng.randn(3, 2))]

    for fn in (view_reshape, view_transpose, view_of_a_view):
        for update in (_set_element, _rebind_both):
            _compare_calls(fn, make, update)
            _compare_calls(fn, make, update, second_order=True)


def test_views_of_float32_and_parameter_arguments():
    _compare_calls(view_transpose, _vars((2, 3), (3, 2), dtype=np.float32), _set_element)
    _compare_calls(view_of_a_view, _vars((2, 3), (3, 2), cls=tj.Parameter), _rebind_both,
                   second_order=True)


def test_a_view_of_a_captured_parameter_updated_before_the_backward():
    # An optimizer step on W between the call and its backward: eager's W.T aliases W.
    W = tj.Parameter(np.linspace(-1.0, 1.0, 6).reshape(2, 3))

    def f(x):
        h = F.tanh(F.matmul(x, F.transpose(W)))          # (2, 2)
        return F.sum(h) + F.sum(F.tanh(F.transpose(x)) * F.transpose(W) ** 2)

    def make(rng):
        W.data[...] = rng.randn(2, 3)
        return [Variable(rng.randn(2, 3))]

    def update(x):
        W.data -= 0.5 * W.data + 0.25
        x.data[0, 1] = 5.0
    for second_order in (False, True):
        _compare_calls(f, make, update, second_order)


class _UserTranspose(tj.Function):
    # A view the trace cannot name: the user's forward returns NumPy's x.T.
    def forward(self, x):
        return x.T

    def backward(self, gy):
        return F.transpose(gy)


def test_a_view_the_backward_cannot_rebuild_runs_eagerly(record_jit_warnings):
    def f(x, p):
        return F.sum(F.tanh(p) * _UserTranspose()(x))

    f_j = tj.jit(f)
    for i in range(4):
        got = []
        for g in (f, f_j):
            x, p = _vars((2, 3), (3, 2))(np.random.RandomState(i))
            y = g(x, p)
            _set_element(x, p)
            y.backward()
            got.append(p.grad.data.copy())
        np.testing.assert_allclose(*got, rtol=1e-12)
    msgs = [str(w.message) for w in record_jit_warnings]
    assert any("no view the compiled backward can rebuild" in m and
               "_UserTranspose()(x)" in m for m in msgs), msgs


def test_traced_on_a_non_contiguous_argument_then_contiguous_ones():
    # The traced call's reshape copied (eager's too); on later contiguous arguments it
    # is a view again, which the caller's update reaches.
    def make(rng):
        a = rng.randn(2, 3)
        make.k += 1
        return [Variable(np.asfortranarray(a) if make.k <= 4 else a),
                Variable(rng.randn(3, 2))]

    for fn in (view_reshape, view_of_a_view):
        for second_order in (False, True):
            make.k = 0
            _compare_calls(fn, make, _set_element, second_order, n=6)


def test_a_view_of_a_captured_array_and_of_an_argument_written_before_the_backward():
    K = np.linspace(-1.0, 1.0, 6).reshape(2, 3)

    def f(x):
        return F.sum(F.tanh(x) * F.transpose(K) ** 2 + F.reshape(F.transpose(x), (3, 2)) ** 2)

    def make(rng):
        K[...] = rng.randn(2, 3)
        return [Variable(rng.randn(3, 2))]

    def update(x):
        K[0, 1] = 7.0
        x.data[1, 1] = -4.0
    for second_order in (False, True):
        _compare_calls(f, make, update, second_order)


def test_a_returned_view_written_by_the_caller_before_the_backward():
    # Writing the returned view writes the argument's buffer: both backwards see it.
    f_j = tj.jit(view_also_returned)
    for i in range(4):
        got = []
        for g in (view_also_returned, f_j):
            x, p = _vars((2, 3), (3, 2))(np.random.RandomState(i))
            y, t = g(x, p)
            t.data[2, 0] = 3.0
            y.backward()
            got.append((x.grad.data.copy(), p.grad.data.copy()))
        for a, b in zip(*got):
            np.testing.assert_allclose(a, b, rtol=1e-9)


def test_a_view_of_an_argument_the_call_updates_in_place():
    # Eager's view shows the call's update and then the caller's.
    def f(x, p):
        t = F.transpose(x)
        y = F.sum(F.tanh(p) * t)
        x.data *= 0.5
        return y + F.sum(p * F.transpose(x))

    for update in (lambda x, p: None, _set_element, _rebind_then_write_the_old_buffer):
        _compare_calls(f, _vars((2, 3), (3, 2)), update)
        _compare_calls(f, _vars((2, 3), (3, 2)), update, second_order=True)


def test_a_view_of_a_captured_parameter_the_call_updates():
    W = tj.Parameter(np.linspace(-1.0, 1.0, 6).reshape(2, 3))

    def f(x):
        y = F.sum(F.tanh(x) * F.transpose(W) ** 2)
        W.data -= 0.25 * W.data
        return y

    def make(rng):
        W.data[...] = rng.randn(2, 3)
        return [Variable(rng.randn(3, 2))]

    def update(x):
        W.data[0, 1] = 3.0
    for second_order in (False, True):
        _compare_calls(f, make, update, second_order)


# Random draws: a dropout mask drawn in the forward, under a seed, with an argument of
# any shape (0-d and size-1 graphs compile to one scalar kernel, and remat cuts them
# differently: it may save the argument's snapshot and the uniform draw, not the mask
# times the argument). What the replay computes from a draw and a snapshot is the
# call's, not recomputed from the argument as the caller left it.

class _Scale(tj.Function):
    def forward(self, x):
        return x * 3.0

    def backward(self, gy):
        return gy * 3.0


def dropout_square(x, p):
    h = F.dropout(x, 0.3)
    return F.sum(h * h)


def dropout_then_math(x, p):
    h = F.dropout(F.tanh(x) * p, 0.5)
    return F.sum(h * x + F.exp(h * 0.5) * p)


def dropout_user_function(x, p):
    h = F.dropout(_Scale()(x), 0.3)
    return F.sum(h * h * p)


def two_draws(x, p):
    h = F.dropout(x, 0.4)
    k = F.dropout(x * p, 0.6)
    return F.sum(h * k + h * h)


RANDOM_PROGRAMS = [dropout_square, dropout_then_math, dropout_user_function, two_draws]


def _compare_seeded(fn, shape, update, second_order, n=5):
    f = tj.jit(fn)
    for i in range(n):
        got = []
        for g in (fn, f):
            rng = np.random.RandomState(i)
            x = Variable(np.asarray(rng.randn(*shape) + 1.5))
            p = Variable(np.asarray(rng.randn(*shape)))
            np.random.seed(i)
            y = g(x, p)
            update(x, p)
            y.backward(create_graph=second_order)
            res = [None if a.grad is None else a.grad.data.copy() for a in (x, p)]
            if second_order:
                gs = [a.grad for a in (x, p) if a.grad is not None]
                x.cleargrad()
                p.cleargrad()
                sum(F.sum(gx * gx) for gx in gs).backward()
                res += [None if a.grad is None else a.grad.data.copy() for a in (x, p)]
            got.append(res)
        for a, b in zip(*got):
            assert (a is None) == (b is None)
            if a is not None:
                assert a.shape == b.shape and a.dtype == b.dtype
                np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)


RANDOM_UPDATES = {
    "x.data *= -0.5": lambda x, p: (x.data.__imul__(-0.5), p.data.__iadd__(1.0)),
    "rebind": lambda x, p: (setattr(x, "data", x.data * -0.5),
                            setattr(p, "data", p.data + 1.0)),
    "nothing": lambda x, p: None,
}


@pytest.mark.parametrize("second_order", [False, True], ids=["first", "create_graph"])
@pytest.mark.parametrize("update", RANDOM_UPDATES.values(), ids=RANDOM_UPDATES.keys())
@pytest.mark.parametrize("shape", [(), (1,), (3,)], ids=["0d", "size1", "3"])
@pytest.mark.parametrize("fn", RANDOM_PROGRAMS)
def test_dropout_under_a_seed_then_update_then_backward(fn, shape, update, second_order):
    _compare_seeded(fn, shape, update, second_order)


def _made_leaf_of_the_argument(x, W):
    c = Variable(x.data)                 # holds the array x has at the call
    return F.tanh(x * c * W) + c, c


def test_rebound_argument_data_with_a_made_leaf_of_it():
    # The caller rebinds x.data before the backward: eager's backward reads x's uses
    # from the new array and c's from the old one; the compiled backward had one value
    # for both (x.grad silently wrong). A rebind replays eager's backward.
    W = tj.Parameter(np.array([0.5, -1.0, 0.25]))
    jf = tj.jit(_made_leaf_of_the_argument)
    for call in range(6):
        W.data *= 1.1                    # the captured Parameter changed between calls
        base = np.linspace(-1.0, 1.0, 3) + 0.2 * call
        seen = []
        for fn in (_made_leaf_of_the_argument, jf):
            W.cleargrad()
            x = Variable(base.copy())
            y, c = fn(x, W)
            if call % 2:
                x.data = x.data * 0.5 + 0.125
            F.sum(y * np.array([1.0, -2.0, 0.5])).backward()
            seen.append([y.data, x.grad.data, c.grad.data, W.grad.data])
        for got, want in zip(seen[1], seen[0]):
            np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    info = jf.cache_info()
    assert info["fallbacks"] == 0 and info["hits"] >= 4, info
