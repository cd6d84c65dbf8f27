"""The hot call path: the last signature's matcher, the last variant, the generated
backward, and the Python state a transformed function reads. Each test interleaves what
could confuse a cache of the last call (new shapes, dtypes, grad mode, guard outcomes,
rebound globals) and compares every call with eager."""
import warnings

import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F
from tracejit import Variable

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")

SCALE = 2.0


def _close(a, b):
    np.testing.assert_allclose(np.asarray(a.data if isinstance(a, Variable) else a),
                               np.asarray(b.data if isinstance(b, Variable) else b),
                               rtol=1e-12, atol=1e-12)


def _vg_close(got, want):
    _close(got[0], want[0])
    for g, w in zip(got[1], want[1]):
        _close(g, w)


def rosen(x, y):
    return 100 * (y - x ** 2) ** 2 + (1 - x) ** 2


def test_signature_changes_between_calls_never_reuse_the_last_variant():
    vg = tj.value_and_grad(lambda x, y: F.sum(rosen(x, y)), argnums=(0, 1))
    f = tj.jit(vg)
    rng = np.random.default_rng(0)
    shapes = [(), (), (3,), (), (3,), (2, 3), (2, 3), (), (3,)]
    for dtype in (np.float64, np.float32):
        for shape in shapes * 2:
            x = rng.standard_normal(shape).astype(dtype)
            y = rng.standard_normal(shape).astype(dtype)
            got, want = f(x, y), vg(x, y)
            assert got[0].data.dtype == want[0].data.dtype == dtype
            assert got[0].shape == want[0].shape
            np.testing.assert_allclose(got[0].data, want[0].data, rtol=1e-5)
            for g, w in zip(got[1], want[1]):
                np.testing.assert_allclose(g.data, w.data, rtol=1e-5)
    info = f.cache_info()
    assert info["fallbacks"] == 0 and info["hits"] > 0


def test_grad_mode_is_part_of_the_hot_signature():
    f = tj.jit(rosen)
    x, y = Variable(np.array(0.3)), Variable(np.array(-0.2))
    for i in range(8):
        x.data = np.array(0.1 * i)
        x.cleargrad()
        y.cleargrad()
        if i % 3 == 2:
            with tj.no_grad():
                z = f(x, y)
            assert z.creator is None
            _close(z, rosen(x, y))
            continue
        z = f(x, y)
        z.backward()
        gx, gy = x.grad.data.copy(), y.grad.data.copy()
        x.cleargrad()
        y.cleargrad()
        rosen(x, y).backward()
        _close(gx, x.grad)
        _close(gy, y.grad)
    assert f.cache_info()["fallbacks"] == 0


def test_guard_failure_on_the_hot_variant_finds_the_sibling_variant():
    def grow(x):
        y = x
        while y.data < 100:
            y = y * 2 + 1
        return y

    f = tj.jit(tj.value_and_grad(grow))
    g = tj.value_and_grad(grow)
    xs = [3.0, 7.0, 11.0, 3.5, 7.5, 11.5, 3.25, 60.0, 7.25] * 2
    for x in xs:
        _close(f(np.array(x))[0], g(np.array(x))[0])
        _close(f(np.array(x))[1], g(np.array(x))[1])
    info = f.cache_info()
    assert info["fallbacks"] == 0 and info["guard_failures"] > 0
    assert info["variants"] == 3          # trip counts 5, 4 and 1


def test_a_variable_whose_data_is_none_misses_the_hot_path_cleanly():
    f = tj.jit(lambda x: x * 2)
    x = Variable(np.arange(3.0))
    for k in range(4):
        x.data = np.arange(3.0) + k
        _close(f(x), x.data * 2)
    x.data = None
    with pytest.raises(Exception):
        f(x)
    x.data = np.arange(3.0) + 10
    _close(f(x), x.data * 2)


def test_rebinding_a_global_the_wrapped_function_reads_retraces():
    global SCALE

    def loss(x):
        return F.sum(x * SCALE) ** 2

    f = tj.jit(tj.value_and_grad(loss))
    x = np.arange(1.0, 4.0)
    try:
        for s in (2.0, 2.0, 2.0, 3.0, 3.0, 5.0, 2.0):
            SCALE = s
            x = x + 0.5
            want = tj.value_and_grad(loss)(x)
            _vg_close(f(x), want)
    finally:
        SCALE = 2.0
    assert f.cache_info()["fallbacks"] == 0


def test_grad_wrappers_do_not_put_library_internals_in_the_guarded_state():
    def loss(x, y):
        return rosen(x, y)

    f = tj.jit(tj.grad(loss, argnums=(0, 1)))
    x, y = np.array(0.5), np.array(1.5)
    for _ in range(4):
        f(x, y)
    v = next(iter(f._variants.values()))[0]
    labels = [loc.label for loc, _, _ in v.state]
    assert labels == ["rosen"], labels      # the user's helper, not argnums or backprop


def test_closure_array_of_the_wrapped_function_stays_live():
    w = np.array([1.0, 2.0, 3.0])

    def loss(x):
        return F.sum((x * w) ** 2)

    f = tj.jit(tj.grad(loss))
    x = np.array([0.5, -1.0, 2.0])
    for k in range(6):
        w[...] = k + 1.0           # mutated in place: read at every call
        _close(f(x), tj.grad(loss)(x))
    assert f.cache_info()["fallbacks"] == 0


def test_generated_backward_handles_unused_outputs_and_repeated_backward():
    def two(x):
        return x * 3, F.sin(x)

    f = tj.jit(two)
    for k in range(5):
        xa = Variable(np.linspace(0, 1, 4) + k)
        xb = Variable(xa.data.copy())
        a, _ = f(xa)           # the second output is dropped: its gradient is zeros
        F.sum(a * a).backward()
        a2, _ = two(xb)
        F.sum(a2 * a2).backward()
        _close(xa.grad, xb.grad)
        b, c = f(xa)
        (F.sum(b) + F.sum(c)).backward()
        b2, c2 = two(xb)
        (F.sum(b2) + F.sum(c2)).backward()
        _close(xa.grad, xb.grad)
    assert f.cache_info()["fallbacks"] == 0


def test_retain_grad_keeps_the_output_gradient():
    f = tj.jit(rosen)
    for k in range(5):
        x, y = Variable(np.array(0.1 * k)), Variable(np.array(0.3))
        z = f(x, y)
        z.backward(retain_grad=True)
        assert z.grad is not None and float(z.grad.data) == 1.0
        z2 = f(x, y)
        z2.backward()
        assert z2.grad is None


class _Cfg:
    shift = 0.5                  # a class attribute, read through the instance


CFG = _Cfg()
TABLE = {"k": 2.0}
ITEMS = [1.0, 3.0]


def test_every_kind_of_python_location_is_rechecked_on_the_hot_path():
    scale = 1.5

    def f(x, bias=0.25):
        return x * scale + TABLE["k"] * ITEMS[1] + CFG.shift + bias

    jf = tj.jit(f)
    x = np.arange(3.0)

    def check():
        for _ in range(3):
            _close(jf(x), f(x))

    check()
    scale = 4.0                                   # closure cell
    check()
    TABLE["k"] = -1.0                             # dict item
    check()
    ITEMS[1] = 7.0                                # list item
    check()
    _Cfg.shift = 0.125                            # class attribute
    check()
    CFG.shift = 9.0                               # instance attribute shadows it
    check()
    f.__defaults__ = (1.0,)                       # default argument
    check()
    del CFG.shift
    _Cfg.shift = 0.5
    TABLE["k"], ITEMS[1] = 2.0, 3.0
    check()
    assert jf.cache_info()["fallbacks"] == 0 and jf.cache_info()["retraces"] >= 7


# ---- regressions found by review


def test_a_guard_miss_on_the_hot_path_is_one_retrace():
    def f(x):
        if x.data.sum() > 0:
            return F.sum(x * 2.0)
        return F.sum(x * 3.0)

    jf = tj.jit(f)
    pos, neg = Variable(np.ones(3)), Variable(-np.ones(3))
    for _ in range(4):
        _close(jf(pos), f(pos))
    before = jf.cache_info()
    _close(jf(neg), f(neg))
    after = jf.cache_info()
    assert after["retraces"] - before["retraces"] == 1
    assert after["guard_failures"] - before["guard_failures"] == 1
    for _ in range(3):
        _close(jf(neg), f(neg))
        _close(jf(pos), f(pos))
    assert jf.cache_info()["fallbacks"] == 0


def test_a_failing_effect_applies_no_effect_twice():
    W = tj.Parameter(np.ones(3))

    def f(x, a):
        W.data -= 0.1
        a += 1.0
        return F.sum(x * W)

    jf = tj.jit(f)
    for _ in range(4):
        jf(Variable(np.ones(3)), np.zeros(3))
    W.data[...] = 1.0
    ro = np.zeros(3)
    ro.flags.writeable = False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tj.JitWarning)   # the variant is demoted
        with pytest.raises(ValueError, match="read-only"):
            jf(Variable(np.ones(3)), ro)
    np.testing.assert_array_equal(W.data, 0.9)           # as eager leaves it: once


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.bool_])
def test_transcendental_of_integer_data_compiles(dtype):
    f = tj.jit(lambda x: F.tanh(x) + F.exp(x) * F.sin(x))
    for k in range(4):
        x = (np.arange(6) % (2 if dtype == np.bool_ else 5) + k).astype(dtype)
        _close(f(x), F.tanh(x) + F.exp(x) * F.sin(x))
    assert f.cache_info()["fallbacks"] == 0


def test_backward_when_another_output_of_the_call_died():
    def f(x):
        h = F.tanh(x)
        return F.sum(h * h), h

    jf = tj.jit(f)
    for k in range(4):
        xj, xe = Variable(np.array([0.1, 0.2, 0.3]) + k), Variable(np.array([0.1, 0.2, 0.3]) + k)
        jf(xj)[0].backward()         # the second output dies at once
        f(xe)[0].backward()
        _close(xj.grad, xe.grad)


K_STATE = 2.0


class _Scaler:
    def __init__(self):
        self.k = 2.0

    def __call__(self, x):
        return F.sum(x * self.k * K_STATE)

    def method(self, x):
        return F.sum(x * self.k)


def _helper(x, scale):
    return F.sum(x * scale * K_STATE)


_INNER = tj.jit(lambda x: F.sum(x * K_STATE))


def _calls_inner(x):
    return _INNER(x) * 1.0


@pytest.mark.parametrize("make", [
    lambda o: tj.jit(o.method),
    lambda o: tj.jit(tj.grad(o.method)),
    lambda o: tj.jit(o),
    lambda o: tj.jit(tj.grad(o)),
    lambda o: tj.jit(__import__("functools").partial(_helper, scale=1.5)),
    lambda o: tj.jit(tj.grad(__import__("functools").partial(_helper, scale=1.5))),
    lambda o: tj.jit(tj.jit(lambda x: F.sum(x * K_STATE))),
    lambda o: tj.jit(_calls_inner),
], ids=["method", "grad(method)", "callable", "grad(callable)", "partial", "grad(partial)",
        "jit(jit(f))", "nested jitted helper"])
def test_state_behind_methods_partials_callables_and_nested_jit_is_watched(make):
    global K_STATE
    obj = _Scaler()
    jf = make(obj)
    x = np.arange(1.0, 4.0)
    try:
        for k_state, k_obj in ((2.0, 2.0), (2.0, 2.0), (2.0, 2.0), (5.0, 2.0), (5.0, 7.0),
                               (5.0, 7.0)):
            K_STATE, obj.k = k_state, k_obj
            got = jf(x)
            with tj.disable_jit():
                want = jf(x)
            _close(got, want)
    finally:
        K_STATE = 2.0
    assert jf.cache_info()["fallbacks"] == 0


def test_jit_of_a_model_sees_replaced_layers():
    from tracejit import layers as L
    from tracejit.models import MLP
    np.random.seed(0)
    model = MLP((4, 2))
    jm = tj.jit(model)
    x = np.random.randn(3, 5)
    for _ in range(3):
        jm(x)
    for change in (lambda: setattr(model, "l1", L.Linear(2)),
                   lambda: setattr(model, "activation", F.relu),
                   lambda: model.layers.__setitem__(0, L.Linear(4))):
        change()
        for _ in range(3):
            got = jm(x)
            with tj.disable_jit():
                want = model(x)
            _close(got, want)


def test_parameter_and_variable_arguments_trace_apart():
    def f(x):
        if isinstance(x, tj.Parameter):
            return F.sum(x * 10.0)
        return F.sum(x)

    jf = tj.jit(f)
    a = np.arange(3.0)
    for _ in range(3):
        for make in (Variable, tj.Parameter):
            _close(jf(make(a.copy())), f(make(a.copy())))
    assert jf.cache_info()["fallbacks"] == 0


def test_aliased_arguments_never_share_a_variant_with_distinct_ones():
    def f(a, b):
        a += 1.0                       # an in-place update the other argument may see
        return F.sum(a * 2.0 + b)

    jf = tj.jit(f)
    for k in range(4):
        for aliased in (False, True, True, False):
            xj, xe = np.arange(3.0) + k, np.arange(3.0) + k
            yj, ye = np.full(3, 10.0), np.full(3, 10.0)
            got = jf(xj, xj if aliased else yj)
            want = f(xe, xe if aliased else ye)
            _close(got, want)
            _close(xj, xe)
    info = jf.cache_info()
    assert info["fallbacks"] == 0 and info["variants"] == 2, info


def test_aliased_variables_and_their_data_key_apart():
    def f(a, b):
        return F.sum(a * 2.0 + b)

    jf = tj.jit(f)
    for k in range(4):
        x = Variable(np.arange(3.0) + k)
        for other in (x, Variable(x.data), Variable(x.data.copy())):
            _close(jf(x, other), f(x, other))
    assert jf.cache_info()["fallbacks"] == 0


def test_a_parameter_updated_between_the_call_and_its_backward():
    """Eager's backward keeps the intermediates computed from the old weight (and reads
    the new weight where a rule reads W itself); the compiled backward must not
    recompute those intermediates from the updated buffer."""
    def run(jit):
        W = tj.Parameter(np.array([0.5, -1.0, 2.0]))

        def f(x):
            h = x * W + 1.0
            return F.sum(h ** 2)

        jf = tj.jit(f) if jit else f
        out = []
        for i in range(5):
            x = Variable(np.array([1.0, 2.0, 3.0]) + i)
            W.cleargrad()
            y = jf(x)
            W.data -= 0.25                    # in place, after the forward
            y.backward()
            out.append((x.grad.data.copy(), W.grad.data.copy()))
        return out

    for got, want in zip(run(True), run(False)):
        for g, w in zip(got, want):
            _close(g, w)


def test_numpy_reductions_of_data_return_numpy_scalars_as_in_eager():
    def f(x):
        a = x * 2.0 + 1.0
        return (a.sum(), np.max(a), a.sum(axis=0), np.exp(a[0, 0]), a[1, 1], a[1:2, 0],
                np.mean(a), a.mean(axis=1))

    jf = tj.jit(f)
    for k in range(4):
        x = np.arange(6.0).reshape(3, 2) + k
        got, want = jf(x), f(x)
        for g, w in zip(got, want):
            assert type(g) is type(w), (type(g), type(w))
            np.testing.assert_allclose(g, w, rtol=1e-12)
    assert jf.cache_info()["fallbacks"] == 0


# ---- one thread-local mode, the fused hot runner, 0-d entry points

def test_switching_jit_off_after_the_hot_path_is_built_runs_python():
    seen = []

    def f(x):
        seen.append(1)               # runs only while tracing, or eagerly
        return x * 2.0
    fj = tj.jit(f)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tj.JitWarning)   # the append is a side effect
        for _ in range(5):
            fj(np.array(1.5))
    n = len(seen)
    assert fj(np.array(2.0)) == 4.0 and len(seen) == n          # compiled: no append
    with tj.disable_jit():
        assert fj(np.array(3.0)) == 6.0
    assert len(seen) == n + 1
    assert fj(np.array(4.0)) == 8.0 and len(seen) == n + 1      # on again: compiled


def test_the_environment_switch_is_read_on_the_hot_path(monkeypatch):
    seen = []

    def f(x):
        seen.append(1)
        return x + 1.0
    fj = tj.jit(f)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tj.JitWarning)
        for _ in range(5):
            fj(np.array(1.0))
    n = len(seen)
    monkeypatch.setenv("TRACEJIT_DISABLE", "1")
    assert fj(np.array(2.0)) == 3.0 and len(seen) == n + 1
    monkeypatch.delenv("TRACEJIT_DISABLE")
    assert fj(np.array(2.0)) == 3.0 and len(seen) == n + 1


def test_grad_mode_is_per_thread_on_the_hot_path():
    import threading
    f = tj.jit(lambda x: F.sin(x) * x)
    x = Variable(np.array(0.7))
    for _ in range(4):
        assert f(x).creator is not None
    out = {}

    def other():
        with tj.no_grad():
            for i in range(4):
                out[i] = f(Variable(np.array(0.1 * i)))
    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert all(y.creator is None for y in out.values())
    for i, y in out.items():
        _close(y, np.sin(0.1 * i) * 0.1 * i)
    y = f(x)                          # this thread is still in grad mode
    assert y.creator is not None
    y.backward()
    _close(x.grad, np.cos(0.7) * 0.7 + np.sin(0.7))


def test_the_signature_matcher_agrees_with_the_key():
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from tracejit.core import Parameter
    from tracejit.runtime.signature import signature_matcher
    fj = tj.jit(lambda *a: a)

    def leaf(kind, shape, dtype, fill):
        a = np.full(shape, fill, dtype)
        return {"arr": a, "var": Variable(a), "par": Parameter(a), "float": float(fill),
                "int": int(fill), "none": Variable(None)}[kind]

    leaves = st.tuples(st.sampled_from(["arr", "var", "par", "float", "int", "none"]),
                       st.sampled_from([(), (1,), (2,), (2, 1)]),
                       st.sampled_from([np.float64, np.float32, np.int64]),
                       st.integers(0, 3))

    @settings(max_examples=150, deadline=None)
    @given(st.lists(leaves, max_size=3), st.lists(leaves, max_size=3), st.booleans(),
           st.booleans())
    def check(a, b, alias, grad):
        args_a = [leaf(*p) for p in a]
        args_b = [leaf(*p) for p in b]
        if alias and args_b:
            args_b.append(args_b[0])
        key_a = fj._fast_key(args_a)
        if key_a is None:
            return
        match = signature_matcher(key_a)
        with tj.using_config("enable_backprop", grad):
            key_b = fj._fast_key(args_b)
            assert match(args_b) == (key_b == key_a)
        assert match(args_a)
    check()


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.int64, np.int32, np.bool_])
def test_0d_graphs_of_every_input_dtype_through_the_entry_point(dtype):
    def f(x, y):
        z = x * y + x
        if (z > 1).data:              # a guard inside the one 0-d kernel
            return z * 2, z
        return z - 1, x
    fj = tj.jit(f)
    rng = np.random.default_rng(1)
    for _ in range(12):
        x, y = (np.asarray(rng.integers(-3, 4), dtype) for _ in range(2))
        if dtype in (np.float64, np.float32):
            x = np.asarray(x + rng.uniform(-1, 1), dtype)
        got, want = fj(Variable(x), Variable(y)), f(Variable(x), Variable(y))
        for g, w in zip(got, want):
            assert type(g.data) is type(w.data) and g.data.dtype == w.data.dtype
            assert g.shape == w.shape == ()
            _close(g, w)
    assert fj.cache_info()["fallbacks"] == 0
    if dtype in (np.float64, np.float32):     # integer arithmetic is not fused (NumPy)
        assert fj.trace(Variable(x), Variable(y)).notes.get("mode") == "scalar"
