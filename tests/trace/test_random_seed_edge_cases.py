"""np.random.seed inside a jitted function, with seeds of every kind a program computes
(issue 9, item 4): a NumPy integer, or a Python int computed from traced data (a
symbolic number, item 3). Each is recorded as the seed it is, so the call compiles and
the draws after it, and the stream's state, are eager's on every call."""
import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F
from tracejit import Variable

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")


def _same_stream(a, b):
    return a[2] == b[2] and np.array_equal(a[1], b[1])


def _compare(fn, xs, max_traces):
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
    _compare(f, xs, max_traces=2)


def test_numpy_integer_seeds():
    def f(x):
        np.random.seed(np.int64(7))
        a = F.dropout(x, 0.5)
        np.random.seed(np.uint32(9))
        return a + F.dropout(x, 0.3)

    _compare(f, [np.linspace(-1, 1, 6) * (k + 1) for k in range(5)], max_traces=1)
