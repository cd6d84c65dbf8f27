"""A value the jitted function reads from captured Python state by any way eager can
read it (a @property, a custom __getattr__, __slots__, a dataclass, a namedtuple, a
class attribute, more than six levels deep, an index past a long list's first items,
a tuple dict key, a negative index of a list or deque that grows, a big object's one
attribute, a bound method of a dict or of an object)
is guarded or read anew: after the caller changes it between calls, the next call gives
eager's result. Each program runs compiled calls before and after every change."""
import collections
import dataclasses

import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")

# The value at call k: the traced one for calls 0-3 (so compiled calls run), then
# changed at calls 4 and 6 (and kept in between: compiled calls of the new variant).
_SCHEDULE = [0, 0, 0, 0, 1, 1, 2, 2]


def _value(kind, k):
    if kind == "float":
        return 0.5 + k
    if kind == "array":
        return np.full(3, 1.0 + k)
    return tj.Variable(np.full(3, 1.0 + k))


def _check(f, set_value, kind):
    """Calls of f and jit(f) with set_value(kind, k) by the schedule (a new object
    only when k changes), compared call by call, with the gradient."""
    jf = tj.jit(f)
    last = None
    for call, k in enumerate(_SCHEDULE):
        if k != last:
            set_value(_value(kind, k))
            last = k
        a = np.random.default_rng(call).standard_normal(3)
        x0, x1 = tj.Variable(a), tj.Variable(a.copy())
        y0, y1 = f(x0), jf(x1)
        np.testing.assert_allclose(y1.data, y0.data, rtol=1e-12, err_msg=f"call {call}")
        y0.backward()
        y1.backward()
        np.testing.assert_allclose(x1.grad.data, x0.grad.data, rtol=1e-12)
    info = jf.cache_info()
    assert info["hits"] > 0
    assert info["calls"] == info["hits"] + info["misses"] + info["fallbacks"]


KINDS = ["float", "array", "variable"]

_SCHED = [None]


class _Prop:
    @property
    def v(self):
        return _SCHED[0]             # a module global of the property's own


@pytest.mark.parametrize("kind", KINDS)
def test_a_property_reading_a_module_global(kind):
    p = _Prop()
    _check(lambda x: F.sum(x * p.v), lambda v: _SCHED.__setitem__(0, v), kind)


@pytest.mark.parametrize("kind", KINDS)
def test_a_property_reading_the_object(kind):
    class P:
        @property
        def v(self):
            return self._v
    p = P()
    _check(lambda x: F.sum(x * p.v), lambda v: setattr(p, "_v", v), kind)


_TABLE = {}


@pytest.mark.parametrize("kind", KINDS)
def test_a_getattr_reading_a_module_table(kind):
    class G:
        def __getattr__(self, name):
            if name in _TABLE:
                return _TABLE[name]
            raise AttributeError(name)
    g = G()
    _check(lambda x: F.sum(x * g.v), lambda v: _TABLE.__setitem__("v", v), kind)


@pytest.mark.parametrize("kind", KINDS)
def test_a_getattr_raising_keyerror_over_its_own_dict(kind):
    class G:
        def __init__(self):
            self.d = {}

        def __getattr__(self, name):
            return self.d[name]      # KeyError for unknown names, as prop.py's
    g = G()
    _check(lambda x: F.sum(x * g.v), lambda v: g.d.__setitem__("v", v), kind)


class _Desc:
    def __get__(self, obj, cls=None):
        return _SCHED[0]


@pytest.mark.parametrize("kind", KINDS)
def test_a_user_descriptor(kind):
    class D:
        v = _Desc()
    d = D()
    _check(lambda x: F.sum(x * d.v), lambda v: _SCHED.__setitem__(0, v), kind)


@pytest.mark.parametrize("kind", KINDS)
def test_a_slots_object(kind):
    class S:
        __slots__ = ("v", "other")
    s = S()
    _check(lambda x: F.sum(x * s.v), lambda v: setattr(s, "v", v), kind)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("slots", [False, True])
def test_a_dataclass(kind, slots):
    @dataclasses.dataclass(slots=slots)
    class C:
        v: object = None
    c = C()
    _check(lambda x: F.sum(x * c.v), lambda v: setattr(c, "v", v), kind)


@pytest.mark.parametrize("kind", KINDS)
def test_a_frozen_dataclass_replaced_in_a_list(kind):
    @dataclasses.dataclass(frozen=True)
    class C:
        v: object
    holder = [None]
    _check(lambda x: F.sum(x * holder[0].v), lambda v: holder.__setitem__(0, C(v)), kind)


NT = collections.namedtuple("NT", "other v")


@pytest.mark.parametrize("kind", KINDS)
def test_a_namedtuple_replaced(kind):
    holder = {"cfg": NT(1, None)}
    _check(lambda x: F.sum(x * holder["cfg"].v),
           lambda v: holder.__setitem__("cfg", holder["cfg"]._replace(v=v)), kind)


@pytest.mark.parametrize("kind", KINDS)
def test_a_class_attribute(kind):
    class K:
        v = None
    k = K()
    _check(lambda x: F.sum(x * k.v), lambda v: setattr(K, "v", v), kind)


class _N:
    pass


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("depth", [7, 9, 16])
def test_deeper_than_six_attribute_levels(kind, depth):
    root = _N()
    node = root
    for _ in range(depth - 1):
        node.n = _N()
        node = node.n
    src = "lambda x: F.sum(x * root" + ".n" * (depth - 1) + ".v)"
    f = eval(src, {"F": F, "root": root})
    _check(f, lambda v: setattr(node, "v", v), kind)


@pytest.mark.parametrize("kind", KINDS)
def test_an_index_past_a_long_lists_first_items(kind):
    big = [0.0] * 100
    _check(lambda x: F.sum(x * big[80]), lambda v: big.__setitem__(80, v), kind)


@pytest.mark.parametrize("kind", KINDS)
def test_a_negative_index_of_a_list_that_grows(kind):
    hist = [None]
    _check(lambda x: F.sum(x * hist[-1]), lambda v: hist.append(v), kind)


@pytest.mark.parametrize("kind", KINDS)
def test_a_tuple_key(kind):
    table = {(1, "a"): None}
    _check(lambda x: F.sum(x * table[(1, "a")]), lambda v: table.__setitem__((1, "a"), v),
           kind)


@pytest.mark.parametrize("kind", KINDS)
def test_one_attribute_of_an_object_with_a_thousand(kind):
    big = _N()
    for i in range(1000):
        setattr(big, f"a{i}", float(i))
    big.z = _N()
    _check(lambda x: F.sum(x * big.z.v), lambda v: setattr(big.z, "v", v), kind)


@pytest.mark.parametrize("kind", KINDS)
def test_an_array_list_held_by_a_captured_object(kind):
    class Holder:
        def __init__(self):
            self.ws = [None, None]
            self.d = {"w": None}
    h = Holder()

    def f(x):
        return F.sum(x * h.ws[1]) + F.sum(x * h.d["w"])

    def put(v):
        h.ws[1] = v
        h.d["w"] = v
    _check(f, put, kind)


def test_an_in_place_change_of_an_array_in_a_list_of_a_captured_object():
    class Holder:
        def __init__(self):
            self.ws = [np.ones(3)]
    h = Holder()
    _check(lambda x: F.sum(x * h.ws[0]), lambda v: h.ws[0].__setitem__(slice(None), v),
           "array")


def test_a_module_global_named_like_an_attribute_is_no_state():
    # `state.h` names `h`; the caller's own module global h (a result it keeps)
    # changes every call: the function compiles all the same.
    ns = {"F": F, "tj": tj, "np": np}
    exec("class S: pass\nstate = S()\nstate.h = tj.Variable(np.ones(3))\nh = None\n"
         "def f(x):\n    return F.sum(x * state.h)\n", ns)
    jf = tj.jit(ns["f"])
    for call in range(6):
        x = tj.Variable(np.full(3, float(call)))
        ns["h"] = jf(x)
        np.testing.assert_allclose(ns["h"].data, ns["f"](x).data)
    assert jf.cache_info()["hits"] >= 3


@pytest.mark.parametrize("kind", KINDS)
def test_a_bound_method_of_a_table(kind):
    table = {"v": None}
    get = table.get                  # the function reads the table through it

    def f(x):
        return F.sum(x * get("v"))
    _check(f, lambda v: table.__setitem__("v", v), kind)


@pytest.mark.parametrize("kind", KINDS)
def test_a_bound_method_of_a_user_object(kind):
    class Cfg:
        def value(self):
            return self.v
    value = Cfg().value
    _check(lambda x: F.sum(x * value()), lambda v: setattr(value.__self__, "v", v), kind)


@pytest.mark.parametrize("kind", KINDS)
def test_the_last_item_of_a_deque(kind):
    buf = collections.deque([None], maxlen=4)
    _check(lambda x: F.sum(x * buf[-1]), lambda v: buf.append(v), kind)


# ---- behind weak references: the walk follows them (WeakValueDictionary and
# WeakKeyDictionary items, `r()` of a weakref.ref, a proxy's attributes), so a value
# rebound behind one retraces instead of being read from the traced call's object.

class _Box:
    pass


@pytest.mark.parametrize("kind", KINDS)
def test_a_weak_value_dictionary_item(kind):
    import weakref
    b = _Box()
    W = weakref.WeakValueDictionary({"b": b})
    _check(lambda x: F.sum(x * W["b"].w), lambda v: setattr(b, "w", v), kind)


@pytest.mark.parametrize("kind", KINDS)
def test_a_weak_key_dictionary_value(kind):
    import weakref
    key = _Box()
    K = weakref.WeakKeyDictionary({key: _Box()})
    _check(lambda x: F.sum(x * K[key].w), lambda v: setattr(K[key], "w", v), kind)


@pytest.mark.parametrize("kind", KINDS)
def test_a_weakref_called_in_the_code(kind):
    import weakref
    b = _Box()
    r = weakref.ref(b)
    _check(lambda x: F.sum(x * r().w), lambda v: setattr(b, "w", v), kind)


@pytest.mark.parametrize("kind", KINDS)
def test_a_weakref_proxy(kind):
    import weakref
    b = _Box()
    p = weakref.proxy(b)
    _check(lambda x: F.sum(x * p.w), lambda v: setattr(b, "w", v), kind)


def test_an_array_behind_a_weak_reference_changed_in_place():
    import weakref
    b = _Box()
    b.w = np.ones(3)
    W = weakref.WeakValueDictionary({"b": b})
    f = lambda x: F.sum(x * W["b"].w)         # noqa: E731
    jf = tj.jit(f)
    for call in range(6):
        if call == 4:
            b.w[...] = 3.0
        x = tj.Variable(np.arange(3.0) + call)
        np.testing.assert_allclose(jf(x).data, f(x).data)
    assert jf.cache_info()["hits"] > 0


# ---- C-level containers: items of a dict subclass and of a mappingproxy, a
# functools.partial's bound arguments, a dict an operator.itemgetter reads.

class _OrderedTable(collections.OrderedDict):
    pass


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("table", [collections.OrderedDict, _OrderedTable,
                                   lambda: collections.defaultdict(float)])
def test_an_item_of_a_dict_subclass(kind, table):
    d = table()
    _check(lambda x: F.sum(x * d["v"]), lambda v: d.__setitem__("v", v), kind)


@pytest.mark.parametrize("kind", KINDS)
def test_an_item_of_a_mappingproxy(kind):
    import types
    d = {}
    mp = types.MappingProxyType(d)
    _check(lambda x: F.sum(x * mp["v"]), lambda v: d.__setitem__("v", v), kind)


def _scale(x, w=None):
    return x * w


@pytest.mark.parametrize("kind", KINDS)
def test_a_functools_partial_keyword(kind):
    import functools
    p = functools.partial(_scale, w=None)
    _check(lambda x: F.sum(p(x)), lambda v: p.keywords.__setitem__("w", v), kind)


@pytest.mark.parametrize("kind", KINDS)
def test_a_functools_partial_positional_argument_rebound(kind):
    import functools
    holder = [None]
    _check(lambda x: F.sum(holder[0](x)),
           lambda v: holder.__setitem__(0, functools.partial(lambda w, x: x * w, v)), kind)


@pytest.mark.parametrize("kind", KINDS)
def test_an_operator_itemgetter_of_a_table(kind):
    import operator
    d = {}
    get = operator.itemgetter("v")
    _check(lambda x: F.sum(x * get(d)), lambda v: d.__setitem__("v", v), kind)


@pytest.mark.parametrize("holder", ["odict", "mappingproxy", "partial", "weak"])
def test_an_array_in_a_c_level_container_changed_in_place(holder):
    import functools
    import types
    import weakref
    w = np.ones(3)
    box = _Box()
    box.w = w
    if holder == "odict":
        d = collections.OrderedDict(w=w)
        f = lambda x: F.sum(x * d["w"])                          # noqa: E731
    elif holder == "mappingproxy":
        d = types.MappingProxyType({"w": w})
        f = lambda x: F.sum(x * d["w"])                          # noqa: E731
    elif holder == "partial":
        p = functools.partial(_scale, w=w)
        f = lambda x: F.sum(p(x))                                # noqa: E731
    else:
        W = weakref.WeakValueDictionary({"b": box})
        f = lambda x: F.sum(x * W["b"].w)                        # noqa: E731
    jf = tj.jit(f)
    for call in range(7):
        if call in (4, 6):
            w[...] = 2.0 + call
        x = tj.Variable(np.arange(3.0) + call)
        np.testing.assert_allclose(jf(x).data, f(x).data)
    assert jf.cache_info()["hits"] > 0


_KEEP = []


def _weak_list(v):
    b = _Box()
    b.w = v
    _KEEP.append(b)
    return [weakref_ref(b)]


def weakref_ref(b):
    import weakref
    return weakref.ref(b)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("container", ["list", "dict"])
def test_a_list_of_weak_references_the_code_reads_through_rebound(kind, container):
    # (A list of weak references is a Layer's bookkeeping, rebuilt every call, and not
    # guarded: one the code reads through is state, guarded all the same.)
    h = _Box()
    if container == "list":
        f = lambda x: F.sum(x * h.refs[0]().w)                        # noqa: E731
        put = lambda v: setattr(h, "refs", _weak_list(v))              # noqa: E731
    else:
        f = lambda x: F.sum(x * h.refs["k"]().w)                      # noqa: E731
        put = lambda v: setattr(h, "refs", {"k": _weak_list(v)[0]})    # noqa: E731
    _check(f, put, kind)
