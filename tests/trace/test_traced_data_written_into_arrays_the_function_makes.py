"""Traced data written into an array the function made itself (np.zeros, np.empty,
np.array of numbers ...), or into traced data, is recorded: the compiled call gives
eager's results on every call, a branch on such an array among them.

`buf = np.zeros(n); buf[:] = x.data; if buf.sum() > 0:` was silently wrong: NumPy's
item assignment copied the traced call's data into the plain array, the branch on it
was never guarded, and every compiled call took the traced call's branch (the checks
against eager compare values on that branch, so none saw it). The constructors now
give a MadeArray while tracing (trace/made.py): written with traced data (item
assignment, np.copyto, fill(), `+=`), indexed by it, or stored as a Variable's data,
it is traced data from then on, its values so far a constant of the graph. Item assignment
into traced data is an AssignItem node (it was an escape). What still cannot be
followed (a write through a view of a made array, or into one a Variable holds and
has used, of traced data or plain values, np.put, np.putmask) is an escape.
"""
import copy
import functools
import pickle

import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F

# Each writes x.data (or what it computes) into an array made inside the function,
# then branches on that array (a plain NumPy value before: nothing the tracer guarded).
COMPILED = {
    "buf[:] = d": "buf = np.zeros(d.shape)\n    buf[:] = d",
    "buf[...] = d * 2": "buf = np.empty(d.shape)\n    buf[...] = d * 2",
    "buf[0:2] = d[0:2]": "buf = np.ones(4)\n    buf[0:2] = d[0:2]",
    "buf[0] = d[0] (a NumPy scalar)": "buf = np.zeros(3)\n    buf[0] = d[0]",
    "buf[1] = float(...)": "buf = np.zeros(3)\n    buf[1] = float(d.sum())",
    "np.asarray(np.zeros)": "buf = np.asarray(np.zeros(4))\n    buf[:] = d",
    "np.array(numbers)": "buf = np.array([0.0, 0.0, 0.0, 0.0])\n    buf[:] = d",
    "a made array's copy": "buf = np.zeros(4).copy()\n    buf[:] = d",
    "a made array's product, +=": "buf = np.ones(4) * 0.5\n    buf += d",
    "np.arange, float": "buf = np.arange(4.0)\n    buf[1:] = d[1:]",
    "np.zeros_like(plain)": "buf = np.zeros_like(np.ones(4))\n    buf[:] = d",
    "float32 buffer": "buf = np.zeros(4, np.float32)\n    buf[:] = d",
    "traced mask as the index": "buf = np.zeros(4)\n    buf[d > 0] = 1.0",
    "np.copyto": "buf = np.zeros(4)\n    np.copyto(buf, d)",
    "fill()": "buf = np.zeros(4)\n    buf.fill(d.max())",
    "indexed by traced data": "buf = np.eye(4)[(d > 0).astype(np.int64)][:, 0]",
    "a Variable of it, then written": "buf = np.zeros(4)\n    v = tj.Variable(buf)\n"
                                      "    buf[:] = d\n    buf = v.data",
    # (NumPy's C code made these from made arrays as plain ones: the write was frozen)
    "np.concatenate of made arrays": "buf = np.concatenate([np.zeros(2), np.ones(2)])\n"
                                     "    buf[:] = d",
    "np.stack of made arrays": "buf = np.stack([np.zeros(4), np.ones(4)])\n"
                               "    buf[1] = d",
    # NumPy's other functions gave plain arrays, of made operands (their C code does
    # not propagate the subclass) or of Python numbers and shapes: frozen, silently.
    "np.where of made arrays": "buf = np.where(np.ones(4) > 0, 0.0, 1.0)\n    buf[:] = d",
    "np.pad": "buf = np.pad(np.zeros(2), (1, 1))\n    buf[:] = d",
    "np.outer": "buf = np.outer(np.zeros(2), np.ones(2)).reshape(4).copy()\n"
                "    buf[:] = d",
    "np.resize": "buf = np.resize(np.zeros(1), 4)\n    buf[:] = d",
    "np.fromfunction": "buf = np.fromfunction(lambda i: i * 0.0, (4,))\n    buf[:] = d",
    "np.indices": "buf = np.indices((4,))[0] * 1.0\n    buf[:] = d",
    "np.dot of made arrays": "buf = np.dot(np.ones((4, 2)), np.zeros(2))\n    buf[:] = d",
    "np.meshgrid": "buf = np.meshgrid(np.zeros(4))[0].copy()\n    buf[:] = d",
    "np.mgrid": "buf = np.mgrid[0:4] * 0.0\n    buf[:] = d",
    "np.linalg.inv of a list": "buf = np.linalg.inv([[2.0, 0.0], [0.0, 2.0]])"
                               ".reshape(4).copy()\n    buf[:] = d",
    "np.fft.irfft": "buf = np.fft.irfft(np.zeros(3))\n    buf[:] = d",
    "np.ndarray(shape)": "buf = np.ndarray(4)\n    buf[:] = d",
    "np.ndarray(shape, dtype)": "buf = np.ndarray((4,), np.float32)\n    buf[:] = d",
}
ESCAPED = {
    "a view of buf written": "buf = np.zeros(5)\n    v = buf[1:]\n    v[:] = d",
    "np.put": "buf = np.zeros(4)\n    np.put(buf, [0, 1, 2, 3], d)",
    "np.putmask": "buf = np.zeros(4)\n    np.putmask(buf, np.ones(4, bool), d)",
    # (these three copied the traced values as plain ones, silently: frozen branches)
    "buf.put": "buf = np.zeros(4)\n    buf.put(np.arange(4), d)",
    "buf.flat[:] = d": "buf = np.zeros(4)\n    buf.flat[:] = d",
    "buf.flat = d": "buf = np.zeros(4)\n    buf.flat = d",
    # (the Variable's first use read the values before the write)
    "a Variable of it used, then written": "buf = np.zeros(4)\n    v = tj.Variable(buf)\n"
                                           "    w = v * 2.0\n    buf[:] = d\n"
                                           "    buf = v.data + w.data",
    # Written with plain values after the Variable's use: eager's use read the values
    # before (the graph read the buffer after the trace: compiled 15.0 for eager's 11.0)
    "a Variable of it used, then a constant written": "buf = np.ones(4)\n"
        "    v = tj.Variable(buf)\n    w = v * x\n    buf[0] = 5.0\n"
        "    buf = (w + v * 2.0).data",
    "a Variable of it used, then +=": "buf = np.ones(4)\n    v = tj.Variable(buf)\n"
        "    w = v * x\n    buf += 1.0\n    buf = (w + v).data",
}


def _program(body):
    src = (f"def f(x):\n    d = x.data\n    {body}\n"
           f"    if buf.sum() > 0:\n        return x * 2.0\n    return x * -1.0\n")
    scope = {"np": np, "tj": tj}
    exec(compile(src, "<made-array program>", "exec"), scope)
    return scope["f"]


def _drive(f, jf):
    rng = np.random.default_rng(0)
    # Thirty calls on one side of the branch, then ten on the other.
    for call in range(40):
        a = np.abs(rng.normal(size=4)) + 0.1
        a = a if call < 30 else -a
        np.testing.assert_array_equal(jf(tj.Variable(a.copy())).data,
                                      f(tj.Variable(a.copy())).data)


@pytest.mark.parametrize("name", list(COMPILED))
def test_a_branch_on_traced_data_in_a_made_array_compiles_and_matches_eager(
        name, jit_warnings_are_errors):
    f = _program(COMPILED[name])
    jf = tj.jit(f)
    _drive(f, jf)
    info = jf.cache_info()
    # One variant per side of the branch; the rest are compiled calls.
    assert info["fallbacks"] == 0 and info["variants"] == 2 and info["hits"] >= 35, info


@pytest.mark.parametrize("name", list(ESCAPED))
def test_what_cannot_be_followed_runs_eagerly_and_says_where(name, record_jit_warnings):
    f = _program(ESCAPED[name])
    jf = tj.jit(f)
    _drive(f, jf)
    messages = [str(w.message) for w in record_jit_warnings]
    assert any("runs eagerly" in m and "made-array program" in m for m in messages), \
        messages
    assert any(("array made inside the function" in m or "in place" in m) for m in messages)


def test_made_arrays_written_with_constants_still_compile(jit_warnings_are_errors):
    def f(x):
        buf = np.zeros(x.shape)
        buf[0] = 1.5
        buf[1:] = np.arange(x.shape[0] - 1)
        w = np.ones(x.shape) * 0.5
        w.fill(0.25)
        return x * tj.Variable(buf) + F.sum(x * tj.Variable(w))

    jf = tj.jit(f)
    rng = np.random.default_rng(1)
    for _ in range(5):
        a = rng.normal(size=4)
        np.testing.assert_allclose(jf(tj.Variable(a.copy())).data,
                                   f(tj.Variable(a.copy())).data, rtol=1e-12)
    info = jf.cache_info()
    assert info["fallbacks"] == 0 and info["hits"] >= 3, info


def test_a_made_array_beside_traced_data_in_a_numpy_call_is_recorded(
        jit_warnings_are_errors):
    # The made array first: NumPy asks it first, and ndarray's own __array_function__
    # would run np.concatenate on the traced buffer as plain data (frozen).
    def f(x):
        head = np.zeros(2)
        c = np.concatenate([head, x.data])
        return x * tj.Variable(c[2:] + c[:-2].sum())

    jf = tj.jit(f)
    rng = np.random.default_rng(2)
    for _ in range(6):
        a = rng.normal(size=4)
        np.testing.assert_allclose(jf(tj.Variable(a.copy())).data,
                                   f(tj.Variable(a.copy())).data, rtol=1e-12)
    info = jf.cache_info()
    assert info["fallbacks"] == 0 and info["hits"] >= 3, info


def test_made_arrays_leave_the_call_as_plain_ndarrays(jit_warnings_are_errors):
    def f(x):
        b = np.zeros(3)
        v = tj.Variable(np.ones(2))
        return x * 2.0, b, [b, {"b": b}], (b,), v

    jf = tj.jit(f)
    for _ in range(4):
        y, b, lst, tup, v = jf(tj.Variable(np.ones(3)))
        assert type(b) is np.ndarray and type(v.data) is np.ndarray
        # One array in four places is one object, as eager's is.
        assert lst[0] is b and lst[1]["b"] is b and tup[0] is b
        np.testing.assert_array_equal(b, np.zeros(3))


def test_a_made_array_pickles_and_copies_as_a_plain_array(jit_warnings_are_errors):
    def f(x):
        b = np.arange(3.0)
        p = pickle.loads(pickle.dumps(b))
        c = copy.deepcopy(b)
        assert type(p) is np.ndarray and type(c) is np.ndarray
        return x * tj.Variable(p + c)

    jf = tj.jit(f)
    for _ in range(4):
        np.testing.assert_array_equal(jf(tj.Variable(np.ones(3))).data, [0.0, 2.0, 4.0])


def _closure_program():
    zeros = np.zeros          # bound before any trace: the function's closure cell

    def f(x):
        buf = zeros(4)
        buf[:] = x.data
        return x * 2.0 if buf.sum() > 0 else x * -1.0
    return f


def test_a_constructor_held_in_a_closure_cell_gives_a_made_array_too(
        jit_warnings_are_errors):
    f = _closure_program()
    jf = tj.jit(f)
    for call in range(12):
        a = (np.arange(4.0) + 1.0) * (1 if call < 8 else -1)
        np.testing.assert_array_equal(jf(tj.Variable(a.copy())).data,
                                      f(tj.Variable(a.copy())).data)
    assert jf.cache_info()["variants"] == 2, jf.cache_info()
    # The cell holds NumPy's own function again after the trace.
    assert f.__closure__[0].cell_contents is np.zeros


def _held_constructors():
    """(name, f, where NumPy's own function must be again after the trace) for np.zeros
    held where the module's attribute swap does not reach: each gave plain arrays, the
    write of traced data and the branch on it frozen (silently, 0 fallbacks)."""
    def body(buf, x):
        buf[:] = x.data
        return x * 2.0 if buf.sum() > 0 else x * -1.0

    def default(x, zeros=np.zeros):
        return body(zeros(x.shape), x)

    def kwonly(x, *, zeros=np.zeros):
        return body(zeros(x.shape), x)

    table = {"zeros": np.zeros}

    def in_a_dict(x):
        return body(table["zeros"](x.shape), x)

    def step(x, zeros):
        return body(zeros(x.shape), x)
    keyword = functools.partial(step, zeros=np.zeros)
    return [("default", default, lambda: default.__defaults__[0] is np.zeros),
            ("keyword-only default", kwonly, lambda: kwonly.__kwdefaults__["zeros"] is np.zeros),
            ("a dict's item", in_a_dict, lambda: table["zeros"] is np.zeros),
            ("a partial's keyword", keyword, lambda: keyword.keywords["zeros"] is np.zeros)]


_NP_PAD, _NP_DOT, _NP_LINSPACE = np.pad, np.dot, np.linspace
_NP_SUM, _NP_MEAN = np.sum, np.mean


def _eager_messages(f, record_jit_warnings):
    """Six calls, three on each side of f's branch, each compared with eager: the
    jitted function's cache_info and the JitWarnings' messages."""
    jf = tj.jit(f)
    for call in range(6):
        a = (np.arange(4.0) + 1.0) * (1 if call < 3 else -1)
        np.testing.assert_array_equal(jf(tj.Variable(a.copy())).data,
                                      f(tj.Variable(a.copy())).data)
    return jf.cache_info(), [str(w.message) for w in record_jit_warnings]


class _StaticMaker:
    make = staticmethod(np.zeros)


class _PlainMaker:
    make = np.zeros                 # a builtin: no binding, on the class or an instance
    lin = np.linspace               # a NumPy 2 dispatcher: binds, as a function does


class _MakerChild(_StaticMaker):
    pass


_plain_maker = _PlainMaker()


def _class_held_constructors():
    """(name, f, where NumPy's own function must be again after the trace) for np.zeros
    held as a class attribute. Classes are not walked as state: `Maker.make(3)` gave a
    plain array, and traced data written into it, then branched on, took the traced
    call's branch on every compiled call (0 fallbacks, no warning)."""
    import _np_maker_module as makers

    def body(buf, x):
        buf[:] = x.data
        return x * 2.0 if buf.sum() > 0 else x * -1.0

    def static(x):
        return body(_StaticMaker.make(x.shape), x)

    def inherited(x):
        return body(_MakerChild.make(x.shape), x)

    def instance(x):
        return body(_plain_maker.make(x.shape), x)

    def dispatcher(x):
        # (on the class: unbound, as NumPy's own; on an instance it would bind)
        return body(_PlainMaker.lin(0.0, 0.0, x.shape[0]), x)

    def module_class(x):
        return body(makers.Maker.make(x.shape), x)

    def module_attr(x):
        return body(makers.zeros(x.shape), x)

    class Model:
        make = staticmethod(np.zeros)

        def __call__(self, x):
            return body(self.make(x.shape), x)

    model = Model()

    def argument(m, x):
        return m(x)

    def static_of(c):
        return lambda: c.__dict__["make"].__func__ is np.zeros
    return [("staticmethod", static, static_of(_StaticMaker)),
            ("inherited", inherited, static_of(_StaticMaker)),
            ("through an instance", instance,
             lambda: _PlainMaker.__dict__["make"] is np.zeros),
            ("a dispatcher", dispatcher, lambda: _PlainMaker.__dict__["lin"] is _NP_LINSPACE),
            ("a user module's class", module_class, static_of(makers.Maker)),
            ("a user module's attribute", module_attr, lambda: makers.zeros is np.zeros),
            ("an argument's class", functools.partial(argument, model), static_of(Model))]


@pytest.mark.parametrize("case", _held_constructors() + _class_held_constructors(),
                         ids=lambda c: c[0])
def test_a_constructor_held_wherever_the_function_reaches_it_gives_a_made_array_too(
        case, jit_warnings_are_errors):
    _, f, held = case
    jf = tj.jit(f)
    for call in range(12):
        a = (np.arange(4.0) + 1.0) * (1 if call < 8 else -1)
        np.testing.assert_array_equal(jf(tj.Variable(a.copy())).data,
                                      f(tj.Variable(a.copy())).data)
    info = jf.cache_info()
    assert info["variants"] == 2 and info["fallbacks"] == 0, info
    assert held(), "NumPy's own function is back where it was held"


def test_numpy_functions_are_numpy_s_own_outside_a_trace(jit_warnings_are_errors):
    # The stand-ins are in NumPy's namespace only while a trace runs.
    jf = tj.jit(lambda x: x * tj.Variable(np.where(np.ones(3) > 0, 1.0, 0.0)))
    for _ in range(3):
        jf(tj.Variable(np.ones(3)))
    assert type(np.where).__name__ == "_ArrayFunctionDispatcher"
    assert np.pad is _NP_PAD and np.dot is _NP_DOT


def test_a_view_of_a_made_array_numpy_gives_plain_is_one_of_its_views(
        record_jit_warnings):
    # np.broadcast_to's result shares buf's memory without being its subclass view: a
    # write into buf while it lives is an escape, as for buf[1:].
    def f(x):
        buf = np.zeros(4)
        v = np.broadcast_to(buf, (2, 4))
        buf[:] = x.data
        return x * 2.0 if v.sum() > 0 else x * -1.0

    info, messages = _eager_messages(f, record_jit_warnings)
    assert any("runs eagerly" in m and "has views" in m for m in messages), messages


def test_np_ndarray_over_traced_data_runs_eagerly(record_jit_warnings):
    def f(x):
        v = np.ndarray(x.shape, x.data.dtype, buffer=x.data)
        return x * 2.0 if v.sum() > 0 else x * -1.0

    info, messages = _eager_messages(f, record_jit_warnings)
    assert any("np.ndarray(..., buffer=...)" in m for m in messages), messages
    assert info["hits"] == 0


def test_np_ndarray_called_under_another_global_name_runs_eagerly(record_jit_warnings):
    # `from numpy import ndarray as ND; ND(4)`: nothing can stand in for the type there.
    src = ("def f(x):\n    buf = ND(4)\n    buf[:] = x.data\n"
           "    return x * 2.0 if buf.sum() > 0 else x * -1.0\n")
    scope = {"np": np, "tj": tj, "ND": np.ndarray}
    exec(compile(src, "<ND program>", "exec"), scope)
    f = scope["f"]
    info, messages = _eager_messages(f, record_jit_warnings)
    assert any("np.ndarray is called as the global ND" in m and "ND program" in m
               for m in messages), messages
    assert info["hits"] == 0 and scope["ND"] is np.ndarray


_OPS = (np.sum, np.max)
_MEAN0 = functools.partial(np.mean, axis=0)


def test_numpy_functions_held_in_a_tuple_or_a_partial_still_compile(
        jit_warnings_are_errors):
    # Only a constructor there is an escape: NumPy's other functions stay its own.
    def f(x):
        return x * float(_OPS[0](x.data)) + x * float(_MEAN0(x.data))

    jf = tj.jit(f)
    for i in range(5):
        a = np.arange(3.0) + i
        np.testing.assert_allclose(jf(tj.Variable(a)).data, f(tj.Variable(a)).data,
                                   rtol=1e-12)
    info = jf.cache_info()
    assert info["fallbacks"] == 0 and info["hits"] >= 3, info
    assert _OPS[0] is _NP_SUM and _MEAN0.func is _NP_MEAN


def test_a_constructor_held_where_it_cannot_be_swapped_runs_eagerly_naming_it(
        record_jit_warnings):
    T = (np.zeros, "config")

    def f(x):
        buf = T[0](x.shape)
        buf[:] = x.data
        return x * 2.0 if buf.sum() > 0 else x * -1.0

    info, messages = _eager_messages(f, record_jit_warnings)
    assert any("np.zeros is held at T[0]" in m for m in messages), messages
    assert info["hits"] == 0


@pytest.mark.parametrize("mode", ["plain", "data_changed"])
def test_a_variable_of_a_made_array_written_after_holds_the_write(
        mode, jit_warnings_are_errors):
    # `v = tj.Variable(buf); buf[:] = x.data * 2`: eager's v.data is buf, so v holds the
    # written values; v returned, the caller's backward reads v.data as it is then.
    def f(x):
        buf = np.zeros(3)
        v = tj.Variable(buf)
        buf[:] = x.data * 2.0
        return F.sum(x * v), v

    jf = tj.jit(f)
    rng = np.random.default_rng(11)
    for _ in range(5):
        a = rng.normal(size=3)
        outs = []
        for fn in (f, jf):
            x = tj.Variable(a.copy())
            y, v = fn(x)
            if mode == "data_changed":
                v.data *= 3.0
            y.backward()
            outs.append((y.data.copy(), v.data.copy(), x.grad.data.copy(),
                         None if v.grad is None else v.grad.data.copy()))
        for e, j in zip(*outs):
            assert (e is None) == (j is None)
            if e is not None:
                np.testing.assert_allclose(j, e, rtol=1e-12)
    info = jf.cache_info()
    assert info["fallbacks"] == 0 and info["hits"] >= 3, info


@pytest.mark.parametrize("order", ["variable_first", "array_first"])
def test_a_made_array_returned_beside_the_variable_holding_it_is_its_data(
        order, jit_warnings_are_errors):
    # `v = tj.Variable(a); a[:] = x.data; return v, a`: eager's a is v.data, one object
    # (compiled calls returned two and the first-call check ran them eagerly).
    def f(x):
        a = np.zeros(x.shape)
        v = tj.Variable(a)
        a[:] = x.data * 2.0
        y = F.tanh(x) * v
        return (y, v, a) if order == "variable_first" else (y, a, v)

    jf = tj.jit(f)
    rng = np.random.default_rng(3)
    for _ in range(5):
        xv = rng.normal(size=3)
        got = []
        for fn in (f, jf):
            y, p, q = fn(tj.Variable(xv.copy()))
            v, a = (p, q) if order == "variable_first" else (q, p)
            assert v.data is a
            got.append((y.data, a))
        for e, j in zip(*got):
            np.testing.assert_allclose(j, e, rtol=1e-12)
    info = jf.cache_info()
    assert info["fallbacks"] == 0 and info["hits"] >= 3, info
