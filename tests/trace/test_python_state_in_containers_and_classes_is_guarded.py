"""Python numbers a jitted function reads from state it captures, wherever the state
keeps them: a class attribute (`Config.lr`), a user's module (`cfg.lr`), a set or
frozenset member's attribute, array.array, bytearray, ctypes arrays and fields, numba's
typed List, os.environ, a dict keyed by objects, a function kept in an attribute, a list
or dict longer than the walk lists item by item, a container below the depth bound.
Each is guarded (pystate), so a change after the first-call checks retraces instead of
the compiled call using the traced value (silently wrong before: the checks of a
variant's first calls were the only thing that could see it)."""
import array
import ctypes
import importlib
import os
import sys
import types
import weakref

import numpy as np
import pytest

import tracejit as tj


class _Obj:
    pass


def _obj(k):
    o = _Obj()
    o.k = k
    return o


def _late(k):
    # The same for five calls (the variant's checks pass), then new at every call.
    return 2.0 if k < 5 else float(k)


def _run(fn, setv, n=9):
    """n calls of jit(fn) against fn, setv(value) before each; the value changes only
    after the first five calls."""
    jf = tj.jit(fn)
    for k in range(n):
        setv(_late(k))
        x = np.random.randn(3)
        got, want = jf(tj.Variable(x)), fn(tj.Variable(x))
        np.testing.assert_allclose(got.data, want.data, rtol=1e-12)
    info = jf.cache_info()
    assert info["fallbacks"] == 0 and info["hits"] >= 2
    return jf


def _set_case(kind):
    o = _obj(2.0)
    holder = {"set": lambda: {o}, "frozenset": lambda: frozenset([o]),
              "weakset": lambda: weakref.WeakSet([o])}[kind]()
    return (lambda x: x * next(iter(holder)).k), (lambda v: setattr(o, "k", v)), (o, holder)


@pytest.mark.usefixtures("jit_warnings_are_errors")
@pytest.mark.parametrize("kind", ["set", "frozenset", "weakset"])
def test_an_attribute_of_a_set_member(kind):
    fn, setv, _keep = _set_case(kind)
    _run(fn, setv)


@pytest.mark.usefixtures("jit_warnings_are_errors")
def test_a_class_attribute():
    class Config:
        lr = 2.0

    def fn(x):
        return x * Config.lr
    _run(fn, lambda v: setattr(Config, "lr", v))


@pytest.mark.usefixtures("jit_warnings_are_errors")
def test_a_class_attribute_read_through_an_instance_and_a_subclass():
    class Base:
        k = 2.0

    class Sub(Base):
        pass
    s = Sub()

    def fn(x):
        return x * s.k + Sub.k
    _run(fn, lambda v: setattr(Base, "k", v))


@pytest.mark.usefixtures("jit_warnings_are_errors")
def test_an_attribute_of_a_users_module_file(tmp_path, monkeypatch):
    (tmp_path / "tj_cfg_mod.py").write_text("lr = 2.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = importlib.import_module("tj_cfg_mod")
    try:
        _run(lambda x: x * cfg.lr, lambda v: setattr(cfg, "lr", v))
    finally:
        sys.modules.pop("tj_cfg_mod", None)


@pytest.mark.usefixtures("jit_warnings_are_errors")
def test_an_attribute_of_a_module_made_at_run_time():
    cfg = types.ModuleType("cfg_made")
    cfg.lr = 2.0
    _run(lambda x: x * cfg.lr, lambda v: setattr(cfg, "lr", v))


@pytest.mark.usefixtures("jit_warnings_are_errors")
@pytest.mark.parametrize("kind", ["array.array", "bytearray", "ctypes array",
                                  "ctypes.py_object", "numba typed List"])
def test_an_item_of_a_c_container(kind):
    if kind == "array.array":
        c = array.array("d", [2.0])
        fn, setv = (lambda x: x * c[0]), (lambda v: c.__setitem__(0, v))
    elif kind == "bytearray":
        c = bytearray([2])
        fn, setv = (lambda x: x * c[0]), (lambda v: c.__setitem__(0, int(v)))
    elif kind == "ctypes array":
        c = (ctypes.c_double * 2)(2.0, 1.0)
        fn, setv = (lambda x: x * c[0]), (lambda v: c.__setitem__(0, v))
    elif kind == "ctypes.py_object":
        o = _obj(2.0)
        c = ctypes.py_object(o)
        fn, setv = (lambda x: x * c.value.k), (lambda v: setattr(o, "k", v))
    else:
        import numba.typed
        c = numba.typed.List([2.0])
        fn, setv = (lambda x: x * c[0]), (lambda v: c.__setitem__(0, v))
    _run(fn, setv)


@pytest.mark.usefixtures("jit_warnings_are_errors")
def test_an_environment_variable(monkeypatch):
    monkeypatch.setenv("TRACEJIT_TEST_K", "2.0")
    _run(lambda x: x * float(os.environ["TRACEJIT_TEST_K"]),
         lambda v: os.environ.__setitem__("TRACEJIT_TEST_K", repr(v)))


@pytest.mark.usefixtures("jit_warnings_are_errors")
def test_an_attribute_of_an_object_used_as_a_dict_key():
    o = _obj(2.0)
    table = {o: "first"}
    _run(lambda x: x * next(iter(table)).k, lambda v: setattr(o, "k", v))


@pytest.mark.usefixtures("jit_warnings_are_errors")
def test_a_function_kept_in_an_attribute_reads_its_closure():
    o = _obj(2.0)

    class Model:
        def __init__(self):
            self.scale = lambda: o.k
    m = Model()
    _run(lambda x: x * m.scale(), lambda v: setattr(o, "k", v))


@pytest.mark.usefixtures("jit_warnings_are_errors")
@pytest.mark.parametrize("kind", ["list", "dict", "tuple in a list"])
def test_an_item_past_the_first_items_of_a_long_container(kind):
    if kind == "list":
        c = [1.0] * 100
        fn, setv = (lambda x: x * sum(c)), (lambda v: c.__setitem__(90, v))
    elif kind == "dict":
        c = {i: 1.0 for i in range(100)}
        fn, setv = (lambda x: x * sum(c.values())), (lambda v: c.__setitem__(90, v))
    else:
        c = [(1.0, 1.0)] * 100
        fn, setv = (lambda x: x * sum(a + b for a, b in c)), \
            (lambda v: c.__setitem__(90, (v, 1.0)))
    _run(fn, setv)


@pytest.mark.usefixtures("jit_warnings_are_errors")
def test_a_list_below_the_depth_bound_read_whole():
    deep = [[[[[[[[[1.0, 2.0]]]]]]]]]

    def fn(x):
        return x * sum(deep[0][0][0][0][0][0][0][0])
    _run(fn, lambda v: deep[0][0][0][0][0][0][0][0].__setitem__(1, v))


def test_a_class_attribute_the_function_changes_runs_eagerly_with_a_warning():
    # Compiled calls would not replay `Counter.n += 1` (silently skipped before).
    class Counter:
        n = 0

    def fn(x):
        Counter.n += 1
        return x * 2.0
    jf = tj.jit(fn)
    with pytest.warns(tj.JitWarning, match="Counter.n"):
        for _ in range(4):
            jf(tj.Variable(np.ones(3)))
    assert Counter.n == 4
