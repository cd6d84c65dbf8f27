"""A backward with retain_grad=True or create_graph=True through a compiled call replays
eager's backward over the call on Variables. Eager's backward reads more forward values
than the compiled one, which gives only the gradients of the call's differentiable
inputs: the result h's retained .grad in `return h * Variable(h.data) + x0, h` reads h,
which nothing differentiable is computed from when h comes from an ndarray. When the
call then updates that ndarray in place (`x1 += 0.5`), the replay recomputed h from
the updated buffer (sin(x1 + 0.5)) where eager's graph holds the h the call computed:
h.grad silently wrong from the first compiled call on (fuzz seed 0, program 4372).
The forward now saves each such value for a replay, and a made leaf's value is read
as the made leaf's data then, as the compiled backward reads it.

Each test calls the jitted function five times with new values (and a captured array
the call updates), comparing each call with eager; an unexpected fallback fails it.
"""
import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")


def _ndarray_argument(x0, x1):
    # The fuzz program's shape: a made leaf sharing h's array, two in-place updates.
    h = F.sin(x1) * 0.5
    c = tj.Variable(h.data)
    x1 += 0.5
    np.multiply(x1, 0.75, out=x1)
    return F.relu(h * c + x0), h


def _data_of_argument(x0, x1):
    # h from the argument Variable's .data (no path to x0 in eager's graph).
    h = F.tanh(x0.data) * 2.0
    x0.data += 0.25
    return h * h + x0, h


def _make_captured(buf):
    def f(x0, x1):
        h = F.exp(buf) * 0.3 + x1
        np.multiply(buf, 0.9, out=buf)
        return F.sum(h * h * x0), h
    return f


def _plain(fn):
    return lambda buf: fn


CASES = {"ndarray_argument": _plain(_ndarray_argument),
         "data_of_argument": _plain(_data_of_argument),
         "captured_array": _make_captured}


def _arguments(call, dtype, shape):
    rng = np.random.default_rng(100 + call)
    x0 = tj.Variable(rng.uniform(-1.0, 1.0, shape).astype(dtype))
    x1 = rng.uniform(-2.0, 2.0, shape).astype(dtype)
    # A view into a stacked array, as the fuzzer makes (its own buffer is not x1's).
    return x0, np.stack([x1 * 0.0, x1])[1, ...]


def _run(f, call, dtype, shape, mode):
    x0, x1 = _arguments(call, dtype, shape)
    y, h = f(x0, x1)
    loss = F.sum(y * 0.7)
    if mode == "both":
        loss = loss + F.sum(h * -0.3)
    loss.backward(retain_grad=True, create_graph=(mode == "create_graph"))
    out = [y.data, h.data, x0.grad, h.grad, x1, x0.data]
    if mode == "create_graph":
        # The second order through the gradients' graphs too.
        gs = [g for g in (x0.grad, h.grad) if g is not None]
        x0.cleargrad()
        h.cleargrad()
        sum(F.sum(g * g) for g in gs).backward()
        out += [x0.grad, h.grad]
    return [None if v is None else np.array(v.data if isinstance(v, tj.Variable) else v)
            for v in out]


def _compare(name, dtype, shape, mode):
    buf0 = np.linspace(-1.0, 1.0, int(np.prod(shape))).reshape(shape).astype(dtype)
    buf_e, buf_j = buf0.copy(), buf0.copy()
    fe = CASES[name](buf_e)
    fj = tj.jit(CASES[name](buf_j))
    tol = dict(rtol=1e-10, atol=1e-12) if dtype == np.float64 else dict(rtol=1e-5, atol=1e-6)
    for call in range(5):
        want = _run(fe, call, dtype, shape, mode)
        got = _run(fj, call, dtype, shape, mode)
        for k, (a, b) in enumerate(zip(got, want)):
            assert (a is None) == (b is None), (call, k)
            if a is not None:
                assert a.dtype == b.dtype, (call, k)
                np.testing.assert_allclose(a, b, err_msg=f"call {call}: entry {k}", **tol)
        np.testing.assert_allclose(buf_j, buf_e, **tol)


@pytest.mark.parametrize("mode", ["retain", "both", "create_graph"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_retained_grads_of_values_computed_before_the_update(name, mode):
    _compare(name, np.float64, (3,), mode)


@pytest.mark.parametrize("name", sorted(CASES))
def test_float32_zero_d(name):
    _compare(name, np.float32, (), "both")
