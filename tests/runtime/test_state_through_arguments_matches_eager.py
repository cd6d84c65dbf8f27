"""State a function rebinds on an object it is passed (a model passed as `m`, a jitted
method's `self`, a dict argument) leaves, after each call, what one eager call leaves:
the call runs eagerly, warned with the location (such state is threaded only where
the function captures it), and no check that reruns the function (first-call check,
perturbation check, float64 twin, the trace itself) advances it a second time.

Each test runs the jitted and the eager function on twin objects for >= 6 calls with
new values and compares the result and the whole state after every call.
"""
import warnings

import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F
import tracejit.layers as L
from tracejit import JitWarning
from tracejit.models import Model


class _RNNModel(Model):
    def __init__(self, lazy):
        super().__init__()
        self.rnn = L.RNN(4) if lazy else L.RNN(4, in_size=3)
        self.fc = L.Linear(1) if lazy else L.Linear(1, in_size=4)

    def forward(self, x):
        return self.fc(self.rnn(x))


def _state(m):
    return [None if p.data is None else p.data.copy() for p in m.params()] + \
        [None if m.rnn.h is None else m.rnn.h.data.copy()]


def _same_state(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert (x is None) == (y is None)
        if x is not None:
            np.testing.assert_allclose(x, y, rtol=1e-12, atol=1e-14)


def _run(fe, fj, me, mj, calls=7):
    rng = np.random.default_rng(3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for k in range(calls):
            x = rng.standard_normal((2, 3))
            np.random.seed(k)                     # a lazy layer's initial weights
            a = fe(me, x)
            np.random.seed(k)
            b = fj(mj, x)
            np.testing.assert_allclose(b.data, a.data, rtol=1e-12, atol=1e-14)
            _same_state(_state(mj), _state(me))
            if k == 3:
                me.rnn.reset_state()
                mj.rnn.reset_state()
    return [str(w.message) for w in caught if issubclass(w.category, JitWarning)]


@pytest.mark.parametrize("lazy", [False, True])
def test_model_passed_as_argument(lazy):
    np.random.seed(0)
    me = _RNNModel(lazy)
    np.random.seed(0)
    mj = _RNNModel(lazy)
    f = lambda m, x: F.sum(m(x))             # noqa: E731
    jf = tj.jit(f)
    msgs = _run(f, jf, me, mj)
    if not lazy:
        # The model is a plain object argument: pystate walks it (keyed by identity),
        # so its rnn.h is threaded as captured state is, and the calls compile.
        assert msgs == [], msgs
        assert jf.cache_info()["hits"] > 0


class _Trainer:
    def __init__(self):
        self.model = _RNNModel(False)

    def step(self, x):
        return F.sum(self.model(x) ** 2)

    jstep = tj.jit(step)


def test_jitted_method_rebinding_state_on_self():
    np.random.seed(0)
    te = _Trainer()
    np.random.seed(0)
    tj_ = _Trainer()
    rng = np.random.default_rng(5)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for k in range(7):
            x = rng.standard_normal((2, 3))
            a = te.step(x)
            b = tj_.jstep(x)
            np.testing.assert_allclose(b.data, a.data, rtol=1e-12, atol=1e-14)
            _same_state(_state(tj_.model), _state(te.model))
    msgs = [str(w.message) for w in caught if issubclass(w.category, JitWarning)]
    # self is a plain object argument: self.model.rnn.h is threaded, the calls compile.
    assert msgs == [], msgs
    assert tj_.jstep.cache_info()["hits"] > 0


def test_variable_rebound_in_a_dict_argument():
    W = tj.Parameter(np.random.default_rng(0).standard_normal((3, 3)) * 0.5)

    def f(cfg, x):
        h = F.tanh(x if cfg["h"] is None else x + F.matmul(cfg["h"], W))
        cfg["h"] = h
        return F.sum(h)
    jf = tj.jit(f)
    ce, cj = {"h": None}, {"h": None}
    rng = np.random.default_rng(1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", JitWarning)
        for k in range(7):
            x = rng.standard_normal((2, 3))
            a, b = f(ce, x), jf(cj, x)
            np.testing.assert_allclose(b.data, a.data, rtol=1e-12, atol=1e-14)
            np.testing.assert_allclose(cj["h"].data, ce["h"].data, rtol=1e-12)
            W.data += 0.01


def test_first_call_check_leaves_argument_state_as_one_eager_call():
    """A compiled variant whose first-call check runs the function eagerly next to it
    (check=True: its first three calls): an object passed in and read, not changed, by
    the traced path; its attribute rebound by eager's run is put back before the
    compiled run and, the compiled result kept, stays as the compiled call leaves it."""
    class Holder:
        pass
    W = tj.Parameter(np.ones((3, 3)) * 0.1)

    def f(hold, x):
        return F.sum(F.matmul(x, W) * hold.scale)
    jf = tj.jit(f, check=True)
    he, hj = Holder(), Holder()
    he.scale = hj.scale = 2.0
    rng = np.random.default_rng(2)
    for k in range(6):
        x = rng.standard_normal((2, 3))
        a, b = f(he, x), jf(hj, x)
        np.testing.assert_allclose(b.data, a.data, rtol=1e-12)
        assert vars(hj) == vars(he)
        W.data += 0.1


class _Buffers:
    pass


@pytest.mark.usefixtures("jit_warnings_are_errors")
def test_array_updated_in_place_through_an_argument_compiles():
    """`hold.buf += 1.0` (NumPy on an array of an object passed in): an effect of
    every compiled call, as of every eager one."""
    def f(hold, x):
        hold.buf += 1.0
        return F.sum(x * 2.0)
    jf = tj.jit(f)
    he, hj = _Buffers(), _Buffers()
    he.buf, hj.buf = np.zeros(3), np.zeros(3)
    rng = np.random.default_rng(4)
    for k in range(6):
        x = rng.standard_normal(3)
        np.testing.assert_allclose(jf(hj, x).data, f(he, x).data, rtol=1e-12)
        np.testing.assert_array_equal(hj.buf, he.buf)
    assert jf.cache_info()["hits"] >= 2


@pytest.mark.usefixtures("jit_warnings_are_errors")
def test_attribute_the_caller_rebinds_on_an_argument_is_guarded():
    """The caller rebinds `hold.buf` (or a number on it) between calls: the variant
    that read the old one does not run (the argument's state is guarded, as a
    capture's is)."""
    def f(hold, x):
        return F.sum(x * hold.buf) * hold.scale
    jf = tj.jit(f)
    hold = _Buffers()
    hold.buf, hold.scale = np.ones(3), 1.0
    rng = np.random.default_rng(6)
    for k in range(6):
        x = rng.standard_normal(3)
        if k % 2:
            hold.buf = np.full(3, float(k))       # rebound, not updated in place
        else:
            hold.buf[...] = k + 0.5
        hold.scale = 1.0 + (k % 3)
        np.testing.assert_allclose(jf(hold, x).data, f(hold, x).data, rtol=1e-12)
