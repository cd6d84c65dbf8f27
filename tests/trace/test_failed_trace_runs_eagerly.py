"""A trace that raises where eager works is jit's failure, not the user's (issue 9): C
code that wants a real float gets a TracedFloat (float.hex, json, Fraction), or some
other use of a tracer fails. The call then runs eagerly with everything the trace
changed put back (arguments, captured Parameters and arrays, .grad, Python state, both
random streams), so the step is applied once, and the signature runs eagerly from then
on, with a JitWarning naming the exception and the user's line that raised it. Where
eager raises too, the exception is the user's: eager's is raised, applied once.
"""
import json
import random
import struct
import warnings

import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F
from tracejit.testing import assert_jit_matches_eager


def signs(n=6, shape=(3,), seed=0):
    """Data whose mean flips sign every two calls."""
    rng = np.random.default_rng(seed)
    return [(1.0 if (i // 2) % 2 == 0 else -1.0) * (np.abs(rng.standard_normal(shape)) + .1)
            for i in range(n)]


def run_warned(f, expect=None, n=6):
    """Call jit(f) and f on the same new values n times; compare results and gradients.
    expect: None (no JitWarning may be raised) or (text, line number) of the one
    fallback warning."""
    jf = tj.jit(f)
    data = signs(n)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always", tj.JitWarning)
        assert_jit_matches_eager(f, make_args=lambda i: [tj.Variable(data[i])], calls=n - 2,
                                 atol=1e-12, jitted=jf, allow_fallback=True)
    seen = [m for m in w if issubclass(m.category, tj.JitWarning)]
    if expect is None:
        assert not seen, [str(m.message) for m in seen]
    else:
        text, line = expect
        assert len(seen) == 1, [str(m.message) for m in seen]
        msg = str(seen[0].message)
        assert "runs eagerly" in msg and text in msg, msg
        assert seen[0].lineno == line, (seen[0].lineno, line, msg)
        assert jf.cache_info()["fallbacks"] == n - 1, jf.cache_info()
    return jf


def lineno(fn, offset):
    return fn.__code__.co_firstlineno + offset


# ------------------------------------------------- C code that needs a real float

def hex_in_a_library(m):
    # Third-party code calling float's method by name: a TracedFloat is not a float.
    return float.hex(m)


def test_float_hex_of_a_traced_float_runs_eagerly_and_names_the_line():
    def f(x):
        m = float(x.data.mean())
        h = hex_in_a_library(m)
        return h, x * 2.0 if m > 0 else x * -1.0

    run_warned(f, ("TypeError", lineno(hex_in_a_library, 2)))


def test_json_of_a_traced_float_runs_eagerly_and_names_the_line():
    def f(x):
        s = json.dumps({"mean": float(x.data.mean())})
        return s, x * 3.0

    run_warned(f, ("TypeError: Object of type TracedFloat is not JSON serializable",
                   lineno(f, 1)))


def test_float_method_descriptor_on_a_traced_float_runs_eagerly():
    def f(x):
        a = float.__abs__(float(x.data.sum()))
        return a, x * a

    run_warned(f, ("TypeError", lineno(f, 1)))


@pytest.mark.usefixtures("jit_warnings_are_errors")
@pytest.mark.parametrize("use", [
    lambda m: struct.unpack("d", struct.pack("d", m))[0],
    lambda m: __import__("array").array("d", [m])[0],
    lambda m: memoryview(__import__("array").array("d", [m])).tolist()[0],
], ids=["struct.pack", "array.array", "memoryview"])
def test_c_code_that_converts_with_float_compiles(use):
    # These call __float__ (PyFloat_AsDouble): the value, guarded; no failed trace.
    def f(x):
        m = float(x.data.mean())
        return use(m), x * 2.0 if m > 0 else x * -1.0

    run_warned(f)


class HexFunction(tj.Function):
    """A user Function whose forward calls C code on a number of its input."""

    def forward(self, x):
        self.h = json.dumps(float(x.sum()))
        return x * 2.0

    def backward(self, gy):
        return gy * 2.0


def test_user_function_whose_forward_calls_c_code_matches_eager():
    def f(x):
        y = HexFunction()(x)
        return x * 1.0 if float(y.data.sum()) > 0 else y

    run_warned(f, None)


class TracedNumberInForward(tj.Function):
    def __init__(self, k):
        self.k = k

    def forward(self, x):
        return x * float.__mul__(self.k, 1.0)

    def backward(self, gy):
        return gy * self.k


def test_user_function_given_a_traced_number_its_c_code_rejects():
    def f(x):
        return TracedNumberInForward(float(x.data.mean()) + 1.0)(x)

    # Either compiled (the number frozen by value) or eager with a warning: as eager.
    data = signs()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tj.JitWarning)
        assert_jit_matches_eager(f, make_args=lambda i: [tj.Variable(data[i])],
                                 calls=len(data) - 2, atol=1e-12, allow_fallback=True)


# ------------------------------------------------- everything the trace changed, put back

def test_state_the_failed_trace_changed_is_put_back_step_applied_once():
    def make():
        W = tj.Parameter(np.arange(3.0))
        buf = np.zeros(3)
        log = []
        box = {"n": 0}

        def f(x):
            W.data -= 0.1 * x.data            # captured Parameter, in place
            buf[...] += x.data                # captured array, in place
            y = F.sum(W * x)
            y.backward()                      # x.grad and W.grad set
            noise = F.dropout(x, 0.5)         # NumPy's global stream
            r = random.random()               # Python's stream
            log.append(len(log))
            box["n"] += 1
            s = json.dumps(float(x.data.mean()))    # the trace raises here
            return s, noise * r, y
        return f, W, buf, log, box

    f0, W0, b0, l0, box0 = make()
    f1, W1, b1, l1, box1 = make()
    jf = tj.jit(f1)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always", tj.JitWarning)
        for i, d in enumerate(signs(4)):
            x0, x1 = tj.Variable(d.copy()), tj.Variable(d.copy())
            np.random.seed(i)
            random.seed(i)
            want = f0(x0)
            after = np.random.get_state()[1].copy(), random.random()
            np.random.seed(i)
            random.seed(i)
            got = jf(x1)
            assert np.array_equal(np.random.get_state()[1], after[0])
            assert random.random() == after[1]      # both streams drawn from once
            assert got[0] == want[0]
            for g, v in zip(got[1:], want[1:]):         # Variables: dtype, shape, values
                assert type(g) is type(v) and (g.dtype, g.shape) == (v.dtype, v.shape)
                np.testing.assert_allclose(g.data, v.data, rtol=1e-6, atol=1e-12)
            np.testing.assert_allclose(x1.grad.data, x0.grad.data)
            np.testing.assert_allclose(W1.data, W0.data)
            np.testing.assert_allclose(W1.grad.data, W0.grad.data)
            np.testing.assert_allclose(b1, b0)
            assert l1 == l0 and box1 == box0, (l1, l0, box1, box0)
    msgs = [str(m.message) for m in w if issubclass(m.category, tj.JitWarning)]
    assert any("tracing raised TypeError" in m for m in msgs), msgs


def test_the_users_own_exception_is_raised_once_with_state_as_eager():
    def make():
        W = tj.Parameter(np.ones(3))

        def f(x):
            W.data += 1.0
            if float(x.data.mean()) < 0:
                raise ValueError("negative batch")
            return x * W
        return f, W

    f0, W0 = make()
    f1, W1 = make()
    jf = tj.jit(f1)
    for d in signs(6):
        outcomes = []
        for fn in (f0, jf):
            try:
                outcomes.append(fn(tj.Variable(d.copy())).data)
            except ValueError as e:
                outcomes.append(str(e))
        if isinstance(outcomes[0], str):
            assert outcomes[1] == outcomes[0] == "negative batch"
        else:
            np.testing.assert_allclose(outcomes[1], outcomes[0])
        np.testing.assert_allclose(W1.data, W0.data)     # applied once, as eager
    # The user's exception does not make the signature eager.
    assert jf.cache_info()["eager_signatures"] == 0, jf.cache_info()


def test_a_raise_inside_the_trace_of_a_later_variant_runs_that_call_eagerly():
    # The first variant compiles; a new branch's trace raises: that call is eager, right.
    def f(x):
        m = float(x.data.mean())
        if m > 0:
            return x * 2.0
        return x * float.__neg__(m)

    jf = tj.jit(f)
    data = signs(8)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always", tj.JitWarning)
        assert_jit_matches_eager(f, make_args=lambda i: [tj.Variable(data[i])],
                                 calls=len(data) - 2, atol=1e-12, jitted=jf,
                                 allow_fallback=True)
    msgs = [str(m.message) for m in w if issubclass(m.category, tj.JitWarning)]
    assert len(msgs) == 1 and "descriptor '__neg__'" in msgs[0], msgs
    info = jf.cache_info()
    assert info["calls"] == info["hits"] + info["misses"] + info["fallbacks"], info
