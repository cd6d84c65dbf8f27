"""What a jitted function reads from Python outside its arguments, and how it is kept live.

A location is a closure cell, a module global the function loads or stores, a default
argument, or (up to _MAX_DEPTH levels below those) an attribute (an instance's __dict__
or __slots__, a class's data attribute), a dict item (string, integer or tuple key) or
a list/tuple item (namedtuples too; a dict subclass's or a mappingproxy's item, a
functools.partial's bound arguments, and what a weak reference refers to: a
WeakValueDictionary's or WeakKeyDictionary's item, a weakref.ref's referent; a
ContextVar's value in the current context; a memoized function's result for the
arguments the trace called it with, trace.opaque; a user class's data attributes,
the attributes the code names of a user's or the standard library's module and of a C
object (its C fields); the members of a set and the items of a C container: array.array,
bytearray, a ctypes array, numba's typed List, a Mapping such as os.environ; the keys of a
dict keyed by objects; what a function kept in state reads); and, for a container whose
items are not all listed one by one (past the first _MAX_ITEMS, below the depth bound, a
set, a C container), its whole contents, a "contents" location (scalars by value, the
rest by identity: `sum(L)` of a long list, `for o in S`). Below that, for _DEEP more
levels, the reads the code names (its attribute names, keys and indices), which are
also followed past a
container's first _MAX_ITEMS items and past the location bound (`BIG[80]`, one
attribute of an object with a thousand). Module-level helper functions the function
calls are followed, and so are the getters of the objects walked (properties,
__getattr__, descriptors: what they compute from is in their globals and closures).
A captured Variable the trace uses that is at none of these locations (reached through
a C object, deeper still) is not guarded: the signature runs eagerly (trace.call,
`unguarded_captures`) rather than read it stale. The objects among the arguments
(keyed by identity in the signature, also those whose class compares by value) are
roots too. Every look tracejit takes at a user's object goes through `probe`: what
a user __getattr__ raises is an absent attribute, never the user's error.
At trace time:
  - ndarrays at those locations are swapped for traced views, so NumPy on them
    (`x * c + c ** 2` with a closure array c) is recorded, not frozen;
  - Python and NumPy scalars there are constants of the variant, guarded by value,
    and every other object by identity: each call compares them, so a changed
    learning rate, a rebound global array or a new `model.l1` retraces;
  - a scalar the function itself changes (`self.t += 1`) cannot be replayed, and a
    container that grows (`log.append`) is a side effect that runs only while tracing;
  - a Variable the function rebinds (`self.h = h_new`, an RNN's state) is state it
    threads: read at each call, written back after it (`threaded`, below).
"""
import collections
import collections.abc
import contextvars
import ctypes
import functools
import itertools
import operator
import sys
import types
import weakref

import numpy as np

from tracejit import core as _core
from tracejit.core import Variable

_SCALARS = (bool, int, float, complex, str, bytes, type(None))
_SEQUENCES = (list, tuple, collections.deque)    # items by index (a replay buffer too)
_MISSING = object()
# Levels below a root (obj.cfg.scale is two) walked whole. Deep enough for configs and
# nested models (cfg.model.enc.l1.W is four); below, only the reads the code names
# (_DEEP more levels); a Variable deeper still is refused (unguarded_captures).
_MAX_DEPTH = 6
_MAX_LOCATIONS = 400      # bounds the per-call check on very large object graphs
_MAX_ITEMS = 64           # items of one list, tuple or dict
# A container whose items the walk does not list one by one (more than _MAX_ITEMS, a
# set, a C container: array.array, bytearray, a ctypes array, numba's typed List) is
# guarded by its contents (`sum(L)` over a list of 100 floats, `next(iter(S)).k`):
# every item, scalars by value and the rest by identity, up to this many items.
_MAX_CONTENTS = 100_000
# A class made by a class statement (a C type's attributes are its methods).
_HEAPTYPE = 1 << 9
# The objects in such a container walked one by one (their attributes are state too).
_MAX_OBJECT_ITEMS = 1024


def probe(obj, name, default=None):
    """getattr(obj, name, default) for a look tracejit itself takes at an object the
    user's function reaches (its __dict__, __module__, __self__, ...): eager never makes
    it, so nothing it raises may reach the user; a user __getattr__ that raises KeyError
    (or anything else) for an unknown name says the attribute is not there."""
    try:
        return getattr(obj, name, default)
    except Exception:  # noqa: BLE001 - the user's __getattr__ / property, not ours
        return default


class Location:
    __slots__ = ("kind", "container", "key", "label", "parent", "pinned")

    def __init__(self, kind, container, key, label, parent=None):
        # pinned: guarded by identity although a list of weak references (_bookkeeping)
        # is not, because the code reads through it (_walk).
        self.pinned = False
        self.kind = kind            # "cell", "global", "default", "attr", "item",
                                    # "deref", "ctxvar", "call", "contents", "member"
        self.container = container
        self.key = key
        self.label = label          # how the user names it: "k", "opt.lr", "cfg['k']"
        self.parent = parent        # the location container was read from (None: a root)

    def describe(self):
        if self.kind == "attr":
            return f"{self.label} ({type(self.container).__name__}.{self.key})"
        return self.label

    def read(self):
        try:
            if self.kind == "cell":
                return self.container.cell_contents
            if self.kind == "attr":
                return getattr(self.container, self.key, _MISSING)
            if self.kind == "default":
                return self.container.__defaults__[self.key]
            if self.kind == "deref":           # a weak reference's referent
                v = self.container()
                return _MISSING if v is None else v
            if self.kind == "ctxvar":
                return context_value(self.container)
            if self.kind == "call":
                return cached_call(self.container, self.key)
            if self.kind == "contents":
                return contents(self.container)
            if self.kind == "member":
                return member(self.container, self.key)
            if self.kind == "item" and isinstance(self.container, _SEQUENCES):
                c = self.container
                return c[self.key] if -len(c) <= self.key < len(c) else _MISSING
            return self.container.get(self.key, _MISSING)
        except Exception:  # noqa: BLE001 - an empty cell, changed defaults, a property
            return _MISSING                    # or __getattr__ that raises (KeyError)

    def write(self, value):
        if self.kind == "cell":
            self.container.cell_contents = value
        elif self.kind == "attr":
            if self.key not in (probe(self.container, "__dict__") or {}) and \
                    self.key not in _slot_names(type(self.container)):
                raise AttributeError(self.key)        # a class attribute: leave it be
            if _custom_setattr(self.container):
                object.__setattr__(self.container, self.key, value)
            else:
                setattr(self.container, self.key, value)
        elif self.kind == "ctxvar":
            # (In the current context, the call's: a trace's swap, undone after it.)
            self.container.set(value)
        elif self.kind == "default":
            # A new tuple with value at key: how swap_arrays puts a traced view in
            # place of an ndarray default (`def f(x, buf=BUF): buf[...] = x`), whose
            # writes would otherwise go to the real array, unrecorded. (fn's own code
            # reads its defaults when called: the copy symbolic_scalars makes after the
            # swap takes the swapped tuple.)
            d = list(self.container.__defaults__)
            d[self.key] = value
            self.container.__defaults__ = tuple(d)
        elif self.kind in ("deref", "call", "contents", "member") or \
                isinstance(self.container, tuple):
            raise TypeError("immutable location")
        else:
            self.container[self.key] = value


def contents(c):
    """A container's items as a tuple (a mapping's (key, value) pairs), in its order:
    what a "contents" location guards (_same_contents compares them)."""
    if isinstance(c, collections.abc.Mapping):
        return tuple(c.items())
    return tuple(c)


def member(c, k):
    """Item k of a container a walk lists by position: a sequence's by index, a set's
    (and a mapping's key) in iteration order (its contents are guarded, so the order is
    the traced one)."""
    if isinstance(c, (collections.abc.Set, collections.abc.Mapping)):
        return next(itertools.islice(c, k, None), _MISSING)     # (a mapping's keys)
    return c[k] if -len(c) <= k < len(c) else _MISSING


def _same_item(a, b):
    if a is b:
        return True
    if type(a) is not type(b):
        return False
    if type(a) in _SCALARS or isinstance(a, np.generic):
        return _same_scalar(a, b)
    return type(a) is tuple and _same_contents(a, b)


def _same_contents(a, b):
    """Two contents() tuples hold the same items: scalars equal, the rest the same
    objects (never a user __eq__: an equal object may differ where the function reads)."""
    if a is b:
        return True
    if type(a) is not tuple or len(a) != len(b):
        return False
    return all(map(operator.is_, a, b)) or all(map(_same_item, a, b))


def _c_container(obj):
    """A container the attribute walk cannot enter and whose items are state: a set or
    frozenset (a weakref.WeakSet keeps one), array.array, bytearray, a ctypes array, a
    library's sequence or mapping (numba's typed List and Dict)."""
    if isinstance(obj, (str, bytes, np.ndarray, Variable)) or type(obj) in (list, tuple, dict):
        return False
    if isinstance(obj, (set, frozenset, bytearray, ctypes.Array)) or \
            type(obj).__module__ == "array":
        return True
    return isinstance(obj, (collections.abc.Set, collections.abc.Sequence,
                            collections.abc.Mapping)) and _library_class(type(obj))


def _library_module(mod):
    """A module of NumPy, numba, tracejit or an installed package: no state of the
    user's; a user's module (a config module, `cfg.lr`; also a class or function it
    holds, rebound) and the standard library's (`os.environ`) are walked for the
    attributes the code names."""
    name = probe(mod, "__name__", "") or ""
    if not isinstance(name, str) or name.startswith(("tracejit", "numpy", "numba")):
        return True
    spec = probe(mod, "__spec__")
    origin = probe(spec, "origin", None) if spec is not None else None
    if origin is None:
        return False          # made at run time (types.ModuleType(...)): the user's
    if _stdlib_module(mod):
        return False          # its named data is read as state (os.environ, sys.argv)
    return not isinstance(origin, str) or "site-packages" in origin or \
        "dist-packages" in origin


def _stdlib_module(mod):
    name = probe(mod, "__name__", "") or ""
    return isinstance(name, str) and name.partition(".")[0] in sys.stdlib_module_names


def _data_value(v):
    """A class's attribute that is state, not code: anything but a function, method,
    property, module or class (a number, an array, a Variable, a container, an object,
    a weak reference, a partial)."""
    return not isinstance(v, (types.FunctionType, types.BuiltinFunctionType,
                              types.MethodType, types.ModuleType, type, staticmethod,
                              classmethod, property, np.ufunc, types.MethodDescriptorType,
                              types.WrapperDescriptorType, types.GetSetDescriptorType,
                              types.MemberDescriptorType,
                              types.ClassMethodDescriptorType))


def _class_data_names(klass):
    """A user class's own data attributes and its user bases' (`Config.lr`, a counter
    kept on the class): read by getattr, guarded as an instance's."""
    names = []
    for k in klass.__mro__[:-1]:
        if _library_class(k):
            continue
        for name, v in vars(k).items():
            if not name.startswith("__") and name not in names and _data_value(v):
                names.append(name)
    return names


def context_value(var):
    """What `var.get()` gives in the current context (_MISSING: nothing, no default).
    Not var.get(_MISSING): a default argument overrides the variable's own default."""
    try:
        return var.get()
    except LookupError:
        return _MISSING


def cached_call(fn, key):
    """fn(*args, **kwargs) for key (args, kwargs): a memoized function's result for the
    arguments a trace called it with (trace.opaque), as eager's call gets it (a lookup
    when it is cached, the function run again after cache_clear or an eviction)."""
    args, kwargs = key
    return fn(*args, **kwargs)


def _custom_setattr(obj):
    # Layers register Parameters in __setattr__; a swap of a plain array must not.
    return type(obj).__setattr__ is not object.__setattr__


def _is_namespace_object(o):
    if isinstance(o, (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType,
                      types.MethodType, np.ndarray, np.generic)):
        return False
    return isinstance(probe(o, "__dict__"), dict) or bool(_slot_names(type(o)))


@functools.lru_cache(maxsize=1024)
def _slot_names(cls):
    """The attributes a class keeps in __slots__ (a slots dataclass, a small record
    class): state as an instance __dict__'s entries are. tracejit's own classes
    (Variable) and the libraries' are not walked into."""
    out = []
    for klass in cls.__mro__[:-1]:
        if _library_class(klass):
            return ()
        slots = vars(klass).get("__slots__", ())
        for k in (slots,) if isinstance(slots, str) else slots:
            if isinstance(k, str) and k not in ("__dict__", "__weakref__") \
                    and k not in out:
                out.append(k)
    return tuple(out)


def _library_class(klass):
    # (A C type's __module__ is not in its own __dict__: `numpy`, `builtins`.)
    mod = vars(klass).get("__module__", None) or probe(klass, "__module__", "") or ""
    return not isinstance(mod, str) or mod.startswith(("tracejit", "numpy", "numba",
                                                       "builtins"))


def _getters(cls):
    """The user functions that run when an attribute of a cls instance is read: its
    properties' getters, __getattr__ / __getattribute__, and a user descriptor's __get__
    (what `cfg.lr` computes from: their globals and closures are state the call reads,
    as a helper function's are)."""
    out = []
    for klass in cls.__mro__[:-1]:
        if _library_class(klass):
            continue
        for k, v in vars(klass).items():
            if isinstance(v, property):
                out += [f for f in (v.fget,) if _is_user_function(f)]
            elif k in ("__getattr__", "__getattribute__") and _is_user_function(v):
                out.append(v)
            elif not isinstance(v, (types.FunctionType, staticmethod, classmethod, type)):
                get = getattr(type(v), "__get__", None)
                if _is_user_function(get):
                    out.append(get)
    return out


def _is_user_function(f):
    # (Not the standard library's: copy.copy's globals are copy's tables, not state.)
    mod = probe(f, "__module__", "") or ""
    return isinstance(f, types.FunctionType) and isinstance(mod, str) and \
        not mod.startswith(("tracejit", "numpy", "numba")) and \
        mod.partition(".")[0] not in sys.stdlib_module_names


def _is_library_wrapper(f):
    # Set by grad / value_and_grad on the closures they return.
    return probe(f, "_tracejit_wrapper", False) is True


def _is_scalar_config(v):
    return type(v) in _SCALARS or (type(v) is tuple and all(type(x) in _SCALARS for x in v))


def _jitted_fn(obj):
    # A nested jit: runtime.jitted.Jitted marks its class (tracing sits below the runtime
    # and does not import it). Looked up on the type, so no user __getattr__ runs.
    return obj.fn if getattr(type(obj), "_tracejit_jitted", False) is True else None


def _threads(fn):
    # A state-threading wrapper (threaded()): the user's function it runs. Looked up
    # on the function's own __dict__, so nothing a user defines is taken for one.
    d = probe(fn, "__dict__")
    return d.get("_tracejit_threads") if type(d) is dict else None


def _roots(fn, seen_functions):
    """(Location, value) of the names a function reads directly. Callables that are not
    functions are looked through: a nested jit (its function), functools.partial (its
    function and arguments), an object with __call__ (a Model: its attributes, and what
    its class's __call__ and forward read)."""
    inner = _jitted_fn(fn)
    if inner is None:
        inner = _threads(fn)
    if inner is not None:
        return _roots(inner, seen_functions)
    if isinstance(fn, functools.partial):
        out = _roots(fn.func, seen_functions)
        for k, a in list(enumerate(fn.args)) + list(fn.keywords.items()):
            if type(a) is np.ndarray or callable(a) and not isinstance(a, type) and \
                    str(probe(a, "__module__") or "").startswith("numpy"):
                # A location, as an array in a tuple's item is: the keywords' dict can
                # hold a traced view, the args tuple cannot (a write is then seen by
                # written_unswapped). (A C function too: np.zeros, swapped for the
                # tracer's stand-in where it can be, trace.record.)
                out.append((Location("item", fn.args if type(k) is int else fn.keywords,
                                     k, f"partial argument {k}"), None, None))
            elif not _is_scalar_config(a):
                out.append((None, a, "an argument bound by functools.partial"))
        return out
    if not isinstance(fn, (types.FunctionType, types.MethodType, types.BuiltinFunctionType,
                           type)) and callable(fn) and _is_namespace_object(fn):
        out = [(None, fn, "self")]
        for name in ("__call__", "forward"):
            m = getattr(type(fn), name, None)
            if isinstance(m, types.FunctionType):
                out += _roots(m, seen_functions)
        return out
    target = probe(fn, "__func__", fn)
    if id(target) in seen_functions:
        return []
    seen_functions.add(id(target))
    code = probe(target, "__code__")
    if isinstance(code, types.CodeType) and isinstance(seen_functions, _Reached):
        seen_functions.note(code)
    out = []
    owner = probe(fn, "__self__", _MISSING)
    if owner is not _MISSING and _is_namespace_object(owner):
        out.append((None, owner, "self"))
    code = probe(target, "__code__")
    if not isinstance(code, types.CodeType):
        return out
    cells = zip(code.co_freevars, probe(target, "__closure__") or ())
    if _is_library_wrapper(target):
        # grad / value_and_grad wrappers: their globals are library internals and their
        # scalar cells (argnums) are fixed at creation; only the wrapped function counts.
        for name, cell in cells:
            try:
                v = cell.cell_contents
            except ValueError:
                continue
            if callable(v) and not isinstance(v, type):
                out += _roots(v, seen_functions)
            elif not _is_scalar_config(v):
                out.append((Location("cell", cell, None, name), None, name))
        return out
    for name, cell in cells:
        out.append((Location("cell", cell, None, name), None, name))
    glb = probe(target, "__globals__") or {}
    for name in _global_names(code):
        if name in glb:
            out.append((Location("global", glb, name, name), None, name))
    for i, _ in enumerate(probe(target, "__defaults__") or ()):
        out.append((Location("default", target, i, f"default argument {i}"), None, None))
    kwdefaults = probe(target, "__kwdefaults__")
    if type(kwdefaults) is dict:     # (keyword-only: a dict, the function reads per call)
        for name in kwdefaults:
            out.append((Location("item", kwdefaults, name, f"default argument {name}"),
                        None, None))
    return out


class _Reached(set):
    """ids of the functions whose roots a walk took, and the attribute names, string
    keys and integer indices their code (and its lambdas, comprehensions) names: what
    a read below the walk's depth bound can be (`a.b.c`, `d['k']`, `l[3]`)."""

    def __init__(self):
        super().__init__()
        self.names = set()
        self.indices = set()

    def note(self, code):
        self.names.update(_names(code))
        for c in _consts(code):
            if type(c) in (str, tuple):          # a tuple: a key (`d[(1, 'n')]`)
                self.names.add(c)
            elif type(c) is int:
                self.indices.add(c)


def _consts(code):
    out = []
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            out += _consts(c)
        elif type(c) is tuple:
            out += [x for x in c if type(x) in (str, int)]
            if _is_scalar_config(c):
                out.append(c)
        else:
            out.append(c)
    return out


_GLOBAL_OPS = frozenset(("LOAD_GLOBAL", "STORE_GLOBAL", "DELETE_GLOBAL", "LOAD_NAME",
                         "STORE_NAME", "DELETE_NAME"))


@functools.lru_cache(maxsize=4096)
def _global_names(code):
    """The globals a function's code (and its lambdas, comprehensions) loads or stores:
    not every name in co_names, which holds the attribute names too (`state.h` names
    `h`, and a module global `h` the function never reads is no state of its)."""
    import dis
    names = []
    try:
        for ins in dis.get_instructions(code):
            if ins.opname in _GLOBAL_OPS and isinstance(ins.argval, str) \
                    and ins.argval not in names:
                names.append(ins.argval)
    except Exception:  # noqa: BLE001 - bytecode dis cannot read: every name, as before
        return tuple(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            names += [n for n in _global_names(c) if n not in names]
    return tuple(names)


def _names(code):
    # Globals named in the function and in the lambdas / comprehensions it defines.
    names = list(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            names += _names(c)
    return names


def argument_objects(args, kwargs):
    """The objects among a call's arguments (in its lists, tuples and dicts) that the
    signature keys by identity (static, default hash and ==): what the function reads in
    them is Python state as a closure's is, so (label, object) roots of locations."""
    out = []

    def walk(x, label, depth):
        t = type(x)
        if t in (list, tuple) and depth < 4:
            for i, y in enumerate(x[:_MAX_ITEMS]):
                walk(y, f"{label}[{i}]", depth + 1)
        elif t is dict and depth < 4:
            for k in list(x)[:_MAX_ITEMS]:
                walk(x[k], f"{label}[{k!r}]", depth + 1)
        elif _is_namespace_object(x) and not isinstance(x, Variable) and (
                t.__hash__ is object.__hash__ and t.__eq__ is object.__eq__
                or keyed_by_identity(x) or _scalar_record(x)):
            out.append((label, x))

    for i, a in enumerate(args):
        walk(a, f"argument {i}", 0)
    for k, a in kwargs.items():
        walk(a, f"argument {k}", 0)
    return out


def argument_object(obj):
    """Is obj an argument object of default equality that argument_objects walks as a
    root (its state is the function's Python state)? The signature keys it by identity,
    as (BY_ID, ...), held weakly (pytree._Identity)."""
    t = type(obj)
    return t.__hash__ is object.__hash__ and t.__eq__ is object.__eq__ and \
        not isinstance(obj, Variable) and _is_namespace_object(obj)


def keyed_by_identity(obj):
    """Is obj an argument the signature keys by identity although its class compares
    by value? A user object with __eq__ / __hash__ of its own holds state the function
    reads that an equal object need not share (its __eq__ may compare one field, or
    arrays by identity); only a frozen dataclass of numbers and strings (its generated
    __eq__ compares every field, none can change) is its value."""
    t = type(obj)
    if isinstance(obj, Variable) or not _is_namespace_object(obj) or (
            t.__hash__ is object.__hash__ and t.__eq__ is object.__eq__):
        return False
    return not _scalar_record(obj)


def _scalar_record(obj):
    import dataclasses
    t = type(obj)
    params = getattr(t, "__dataclass_params__", None)
    if params is None or not params.frozen or not params.eq:
        return False
    eq = vars(t).get("__eq__")
    if not isinstance(eq, types.FunctionType) or eq.__code__.co_filename != "<string>":
        return False                         # an __eq__ of the user's, not generated
    fields = {f.name for f in dataclasses.fields(obj) if f.compare}
    d = probe(obj, "__dict__")
    names = set(d) if isinstance(d, dict) else set()
    names |= set(_slot_names(t))
    return names <= fields and all(_is_scalar_config(probe(obj, k)) for k in names)


def locations(fn, arg_objects=(), max_depth=_MAX_DEPTH, max_locations=_MAX_LOCATIONS):
    """The locations fn can read (breadth first, bounded); arg_objects: (label, object)
    of argument_objects, walked as the roots are."""
    seen_functions = _Reached()
    roots = list(_roots(fn, seen_functions)) + [(None, obj, label) for label, obj in arg_objects]
    return _walk(roots, seen_functions, max_depth, max_locations)


def locations_below(fn, arg_objects, locs):
    """locs and the locations below them, walked as locations(fn, arg_objects) walks
    (the reads fn's code names past the depth bound): the state under locations found
    after the trace (a memoized call's result, trace.opaque)."""
    seen_functions = _Reached()
    _roots(fn, seen_functions)
    for _, obj in arg_objects:
        for g in _getters(type(obj)):
            _roots(g, seen_functions)
    return _walk([(loc, None, None) for loc in locs], seen_functions)


def argument_locations(args, max_depth=_MAX_DEPTH, max_locations=_MAX_LOCATIONS):
    """The locations reached through the objects a call is passed (a model passed as
    `m`, a method's `self`), labelled from the argument ("argument 0.rnn.h"): state the
    function may change that locations(fn) does not see."""
    roots = [(None, a, f"argument {name}") for name, a in args
             if not _is_scalar_config(a) and not isinstance(a, (np.ndarray, Variable))]
    return _walk(roots, _Reached(), max_depth, max_locations)


def _walk(roots, seen_functions, max_depth=_MAX_DEPTH, max_locations=_MAX_LOCATIONS):
    """Breadth first from the roots: every attribute, dict item and list item to
    max_depth levels (the first `items` of a container), and below that, to _DEEP more
    levels, only the reads the code can make (the attribute names, string keys and
    integer indices it names: `r.a.b.c.d.e.f.g.lr`); an index or key the code names is
    followed past a container's first `items` too (`BIG[80]`, `cfg[(1, 2)]` keyed by a
    tuple of numbers)."""
    frontier = collections.deque((loc, obj, name, 0) for loc, obj, name in roots)
    out = []
    seen = set()
    names = getattr(seen_functions, "names", None)
    indices = getattr(seen_functions, "indices", None)
    while frontier and len(out) < max_locations * _NAMED_FACTOR:
        loc, obj, name, depth = frontier.popleft()
        if loc is not None:
            if len(out) >= max_locations and not _named(loc, names, indices):
                # Past the bound, only the reads the code names (`model.z.w` of a
                # model with a thousand other attributes): the per-call check stays
                # small, and what the function reads is still guarded.
                continue
            out.append(loc)
            obj = loc.read()
        if obj is _MISSING or type(obj) in _SCALARS or isinstance(obj, np.generic):
            continue
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if _jitted_fn(obj) is not None and depth == 0:
            # A jitted helper the function calls runs as part of its trace: what the
            # helper's function reads counts, not the jit object's own bookkeeping.
            frontier += [(l, o, n, 0) for l, o, n in _roots(obj, seen_functions)]
            continue
        if _is_user_function(obj):
            # A module-level helper the function calls, or a function kept in state (a
            # callback, `self.act = lambda x: x * k`): what it reads counts too.
            frontier += [(l, o, n, 0) for l, o, n in _roots(obj, seen_functions)]
            continue
        if depth == 0 and isinstance(obj, types.MethodType) and \
                _is_user_function(obj.__func__):
            # A user's bound method the function calls: its object and what it reads.
            frontier += [(l, o, n, 0) for l, o, n in _roots(obj, seen_functions)]
            continue
        owner = _bound_owner(obj)
        if owner is not None and depth < max_depth + _DEEP:
            # A bound method at a location (`get = cfg.get`, `read = table.__getitem__`,
            # `step = other.update`): what it reads is its object's state.
            label = name or (loc.label if loc is not None else "?")
            frontier.append((Location("attr", obj, "__self__", f"{label}.__self__", loc),
                             None, None, depth + 1))
            continue
        namespace = _is_namespace_object(obj)
        if namespace:
            # What a property, __getattr__ or descriptor computes the value from (a
            # schedule in a module global of the class's): read as a helper's state.
            for g in _getters(type(obj)):
                frontier += [(l, o, n, 0) for l, o, n in _roots(g, seen_functions)]
        limit = max_depth + (loc is None)
        if depth >= limit + _DEEP:
            continue
        named = depth >= limit          # below the bound: only what the code names
        if named and names is None:
            continue
        label = name or (loc.label if loc is not None else "?")
        items = _MAX_ITEMS if max_locations <= _MAX_LOCATIONS else max_locations
        t = type(obj)
        if isinstance(obj, type) and not _library_class(obj) and \
                obj.__flags__ & _HEAPTYPE:
            # A user class (`Config.lr`, a counter kept on the class): its data
            # attributes, guarded as an instance's are, and a class in one the code
            # names (`Config.Optim.lr`).
            attrs = _class_data_names(obj)
            if names is not None:
                attrs += [k for k, v in vars(obj).items() if isinstance(v, type)
                          and k in names and k not in attrs]
            frontier += [(Location("attr", obj, k, f"{label}.{k}", loc), None, None,
                          depth + 1) for k in attrs if not named or k in names]
            continue
        if isinstance(obj, types.ModuleType):
            # A user's module (`import cfg; cfg.lr`): the attributes the code names
            # (a module holds its imports and functions too: not state).
            if not _library_module(obj) and names is not None:
                d = probe(obj, "__dict__") or {}
                stdlib = _stdlib_module(obj)     # (its data only: os.environ, not copy.copy)
                frontier += [(Location("attr", obj, k, f"{label}.{k}", loc), None, None,
                              depth + 1) for k in list(d)
                             if k in names and not (stdlib and (callable(d[k]) and not
                                                                _c_container(d[k])
                                                                or not _data_value(d[k])))]
            continue
        if _c_container(obj) or (t in (list, tuple, dict, collections.deque) and (
                named or _sized(obj) > items or _object_keys(obj))
                and not _bookkeeping(obj)):
            # Items the walk does not list one by one (past the first `items`, below
            # the depth bound, in a set or a C container): the function may read any
            # of them (`sum(L)`, `for o in S`), so the contents are guarded whole.
            if _sized(obj) <= _MAX_CONTENTS:
                out.append(Location("contents", obj, None, f"{label} (its items)", loc))
            if _c_container(obj) or _object_keys(obj):
                frontier += [(l, None, None, depth + 1)
                             for l in _members(obj, label, loc, items)]
                if not isinstance(obj, dict):
                    continue
        if t in (list, tuple, dict) and _bookkeeping(obj):
            # A Layer's `inputs` / `outputs`: weak references rebuilt on every call, not
            # guarded (snapshot), nor walked: what they refer to is a per-call object.
            # One the code reads through (its attribute, key and index named: `r.n[0]()`)
            # is state: guarded by identity (pinned), and walked.
            if loc is None or not _named(loc, names, indices) or _layer_own(loc):
                # (Not seen: the code may read it at another location that names it,
                # `d[-1]` of a deque whose item 1 it is.)
                seen.discard(id(obj))
                continue
            loc.pinned = True
        if isinstance(obj, weakref.ref):
            # `r()` in the code (a weakref.ref, a KeyedRef): its referent, guarded by
            # identity as any object (a dead referent reads as absent).
            frontier.append((Location("deref", obj, None, f"{label}()", loc), None, None,
                             depth + 1))
            continue
        if isinstance(obj, contextvars.ContextVar):
            # `cv.get()` in the code: the value in the current context (C-level state
            # the attribute walk does not enter), guarded, and walked, as a cell's.
            frontier.append((Location("ctxvar", obj, None, f"{label}.get()", loc), None,
                             None, depth + 1))
            continue
        if isinstance(obj, (weakref.WeakValueDictionary, weakref.WeakKeyDictionary)):
            # Items read as a dict's are (`W["b"].w`): the weak container holds them
            # in C-level refs the attribute walk does not enter. A WeakKeyDictionary's
            # keys are objects: its items are locations of those keys.
            weak_keys = isinstance(obj, weakref.WeakKeyDictionary)
            try:
                keys = list(obj.keys())
            except Exception:  # noqa: BLE001 - changed size while listed (a GC)
                keys = []
            first = [k for k in keys[:items] if weak_keys or _is_key(k)]
            frontier += [(Location("item", obj, k, f"{label}[{k!r}]", loc), None, None,
                          depth + 1) for k in first]
            continue
        if t is dict or isinstance(obj, (dict, types.MappingProxyType,
                                         collections.abc.Mapping)):
            # (A dict subclass (OrderedDict, defaultdict, a user's) and a read-only
            # mappingproxy hold their items in C: walked as a dict's, a subclass's
            # attributes too, below.)
            try:
                keys = list(obj.keys())
            except Exception:  # noqa: BLE001 - a user keys() that raises
                keys = []
            first = [] if named else [k for k in keys[:items] if _is_key(k)]
            if names is not None:
                have = set(map(_key_id, first))
                first += [k for k in keys if _key_id(k) not in have and _is_key(k) and (
                    (type(k) in (str, tuple) and k in names)
                    or (type(k) is int and k in indices))]
            frontier += [(Location("item", obj, k, f"{label}[{k!r}]", loc), None, None,
                          depth + 1) for k in first]
            if t is dict or not namespace:
                continue
        if t in (list, tuple, collections.deque) or isinstance(obj, tuple):
            n = len(obj)
            idx = [] if named else list(range(min(n, items)))
            if not named and n > items:
                # Past the first items, the objects (the contents guard has the
                # scalars): `L[len(L) - 30].k` reads one the code names no index of.
                idx += [i for i in range(items, min(n, _MAX_OBJECT_ITEMS))
                        if not (_is_scalar_config(obj[i]) or isinstance(obj[i], np.generic))]
            if indices is not None:
                # A negative index the code names is a location of its own: `h[-1]`
                # is the last item at every call, also of a list grown since.
                idx += sorted(i for i in indices if (items <= i < n) or
                              (named and 0 <= i < n) or -n <= i < 0)
            frontier += [(Location("item", obj, i, f"{label}[{i}]", loc), None, None,
                          depth + 1) for i in idx]
        elif namespace:
            attrs = _attr_names(obj)
            if named:
                attrs = [k for k in attrs if k in names]
            if names is not None:     # (a C-level field the code names: ctypes' .value)
                attrs += [k for k in _c_fields(type(obj)) if k in names and k not in attrs]
            frontier += [(Location("attr", obj, k, f"{label}.{k}", loc), None, None,
                          depth + 1) for k in attrs]
        elif names is not None and _opaque_object(obj):
            # An object of a C type (a ctypes.py_object's `.value`, an extension's
            # record): its attributes live in C, not in a __dict__; the ones the code
            # names are read as state.
            frontier += [(Location("attr", obj, k, f"{label}.{k}", loc), None, None,
                          depth + 1) for k in sorted(n for n in names if type(n) is str)
                         if not k.startswith("__")
                         and probe(obj, k, _MISSING) is not _MISSING
                         and _data_value(probe(obj, k))]
    return out


@functools.lru_cache(maxsize=1024)
def _c_fields(cls):
    """The fields a class keeps in C (getset and member descriptors of its own and its
    bases', not NumPy's, numba's or tracejit's): `value` of a ctypes.py_object."""
    out = []
    for klass in cls.__mro__[:-1]:
        mod = vars(klass).get("__module__", "") or ""
        if isinstance(mod, str) and mod.startswith(("tracejit", "numpy", "numba")):
            continue
        for k, v in vars(klass).items():
            if not k.startswith("__") and isinstance(v, (types.GetSetDescriptorType,
                                                         types.MemberDescriptorType)):
                out.append(k)
    return tuple(out)


def _opaque_object(obj):
    """An object the walk has no rule for (not a container, array, Variable, function,
    class, module or object with a __dict__): a C type's instance, not NumPy's, numba's
    or tracejit's (their attributes are views and metadata made anew on each read)."""
    if isinstance(obj, (np.ndarray, np.generic, Variable, types.FunctionType,
                        types.BuiltinFunctionType, types.MethodType, types.ModuleType, type,
                        weakref.ref, functools.partial, contextvars.ContextVar,
                        types.CodeType, types.CellType, np.ufunc, list, tuple, dict, set,
                        frozenset, collections.deque, str, bytes)) or _c_container(obj):
        return False      # (containers: guarded and walked by their own rules)
    mod = probe(type(obj), "__module__", "") or ""
    return isinstance(mod, str) and not mod.startswith(("tracejit", "numpy", "numba")) \
        and not _is_namespace_object(obj)


def _sized(obj):
    try:
        return len(obj)
    except Exception:  # noqa: BLE001 - a user __len__ that raises: listed as empty
        return 0


def _object_keys(obj):
    # A dict keyed by objects (`{layer: lr}`): its keys are state as its values are.
    return type(obj) is dict and any(not _is_key(k) for k in itertools.islice(obj, _MAX_ITEMS))


def _members(obj, label, loc, items):
    """Locations of a C container's first `items` items that are objects (walked
    below; its scalars are in its contents guard): a mapping's by key, the rest by
    position (a set's in iteration order). Below the depth bound too (named): a set's
    member is read by iterating, never by a name the code has."""
    try:
        if isinstance(obj, collections.abc.Mapping) and not _object_keys(obj):
            keys = [k for k in itertools.islice(obj.keys(), items) if _is_key(k)]
            return [Location("item", obj, k, f"{label}[{k!r}]", loc) for k in keys]
        first = list(itertools.islice(iter(obj), items))     # (a dict's: its keys)
    except Exception:  # noqa: BLE001 - a container that cannot be listed now
        return []
    return [Location("member", obj, i, f"{label} item {i}", loc)
            for i, v in enumerate(first)
            if not (type(v) in _SCALARS or isinstance(v, np.generic))]


def _bound_owner(obj):
    """The object a bound method (a C one, `d.get`, or a Python one) at a location
    reads, when it is a container or a user object; else None."""
    if not isinstance(obj, (types.BuiltinMethodType, types.MethodType,
                            types.MethodWrapperType)):
        return None
    owner = probe(obj, "__self__")
    if type(owner) in (dict, list, tuple) or (
            _is_namespace_object(owner) and not isinstance(owner, Variable)):
        return owner
    return None


# Levels below _MAX_DEPTH a walk follows the reads the code names (attributes, keys),
# and how many times max_locations it may list when those are past the bound.
_DEEP = 16
_NAMED_FACTOR = 8


def _named(loc, names, indices):
    if names is None or loc.kind not in ("attr", "item"):
        return loc.kind not in ("attr", "item")
    k = loc.key
    if k == "__self__" and loc.kind == "attr":
        return True
    return (type(k) in (str, tuple) and k in names) or (type(k) is int and k in indices)


def _is_key(k):
    return type(k) in (str, int) or (type(k) is tuple and _is_scalar_config(k))


def _key_id(k):
    return (type(k), k)


def _attr_names(obj):
    """An object's attributes a walk reads: its __dict__, its slots, and its classes'
    data attributes (numbers, arrays, Variables, containers, objects: not functions,
    properties or descriptors, which _getters follows), first the instance's; a
    functools.partial's bound arguments (C-level fields, not in its __dict__)."""
    d = probe(obj, "__dict__")
    names = list(d) if isinstance(d, dict) else []
    if isinstance(obj, functools.partial):
        names += ["func", "args", "keywords"]
    names += [k for k in _slot_names(type(obj)) if k not in names]
    for klass in type(obj).__mro__[:-1]:
        lib = _library_class(klass)
        for k, v in vars(klass).items():
            if k.startswith("__") or k in names:
                continue
            if type(v) in _SCALARS or not lib and (
                    isinstance(v, (np.ndarray, np.generic, Variable))
                    or type(v) in (list, tuple, dict)):
                names.append(k)
    return names


def paths_to(fn, arg_objects, targets):
    """Locations that guard the objects in targets (id -> object) where the bounded walk
    did not reach them (a big model, a deep config): each one found, with every level
    above it, by a wider walk (12 levels, 20000 locations), run only when needed."""
    out, have = [], set()
    for loc in locations(fn, arg_objects, max_depth=12, max_locations=20000):
        if id(loc.read()) not in targets:
            continue
        while loc is not None and id(loc) not in have:
            have.add(id(loc))
            out.append(loc)
            loc = loc.parent
    return out


def unguarded_captures(snap, captured):
    """The captured Variables (id -> Variable) at no location the snapshot guards by
    identity: a rebinding of theirs would go unseen and the call use the traced one."""
    guarded = {id(v) for _, v, by_identity in snap if by_identity}
    return [var for k, var in captured.items() if k not in guarded]


def snapshot(locs):
    """(location, value, by_identity): scalars by value; arrays, Variables, objects and
    functions and containers by identity, except lists of weak references (a Layer's
    `self.inputs = [...]`, rebuilt on every call, must not retrace every call)."""
    snap = []
    for loc in locs:
        v = loc.read()
        if type(v) in _SCALARS or isinstance(v, np.generic) or loc.kind == "contents":
            snap.append((loc, v, False))
        elif isinstance(v, (np.ndarray, Variable, types.FunctionType, type, types.MethodType,
                            types.BuiltinFunctionType, np.ufunc, types.ModuleType)) \
                or _c_container(v) \
                or _is_namespace_object(v) \
                or (type(v) in (list, tuple, dict, collections.deque)
                    and (loc.pinned or not _bookkeeping(v))) \
                or isinstance(v, (dict, types.MappingProxyType, weakref.ref,
                                  weakref.WeakValueDictionary,
                                  weakref.WeakKeyDictionary, functools.partial,
                                  contextvars.ContextVar)) \
                or isinstance(v, tuple) \
                or _opaque_object(v):
            # (A tuple: a namedtuple config, CFG._replace(lr=...); an opaque object: a C
            # type's instance, its fields below.)
            snap.append((loc, v, True))
    return snap


def _layer_own(loc):
    """A Layer's own `inputs` / `outputs`, which Layer.__call__ rebinds on every call
    (the names its code has are its own store, not a read through them)."""
    from tracejit.layers import Layer
    return loc.kind == "attr" and loc.key in ("inputs", "outputs") and \
        isinstance(loc.container, Layer)


def _bookkeeping(container):
    # DeZero's Layer keeps `inputs` / `outputs` as fresh lists of weak references on
    # every call; guarding their identity would retrace after every eager call.
    items = container.values() if isinstance(container, dict) else container
    items = list(items)
    return bool(items) and all(isinstance(x, weakref.ref) for x in items)


def changed(snap):
    """The first location whose value differs from the snapshot, as (loc, old, new)."""
    for loc, v, by_identity in snap:
        cur = loc.read()
        if cur is not v and _differs(loc, v, cur, by_identity):
            return loc, v, cur
    return None


def _differs(loc, v, cur, by_identity):
    if loc.kind == "contents":
        return not _same_contents(cur, v)
    return by_identity or type(cur) is not type(v) or not _same_scalar(cur, v)


def all_changed(snap):
    """Every location whose value differs from the snapshot, as (loc, old, new)."""
    out = []
    for loc, v, by_identity in snap:
        cur = loc.read()
        if cur is not v and _differs(loc, v, cur, by_identity):
            out.append((loc, v, cur))
    return out


def compile_check(snap):
    """A function () -> bool, True when some location differs from the snapshot: the
    reads and comparisons of `changed` written out in line (one per location, no loop,
    no dispatch on the location's kind). `changed` then says which one, for the log."""
    if not snap:
        return lambda: False
    env = {"M": _MISSING, "same": _same_scalar, "ctx": context_value, "call": cached_call,
           "contents": contents, "member": member, "same_contents": _same_contents}
    lines = []
    for i, (loc, v, by_identity) in enumerate(snap):
        env[f"c{i}"], env[f"k{i}"], env[f"v{i}"], env[f"t{i}"] = \
            loc.container, loc.key, v, type(v)
        if loc.kind == "cell":
            read = f"c{i}.cell_contents"
        elif loc.kind == "attr":
            read = f"getattr(c{i}, k{i}, M)"
        elif loc.kind == "default":
            read = f"c{i}.__defaults__[k{i}]"
        elif loc.kind == "ctxvar":
            read = f"ctx(c{i})"
        elif loc.kind == "call":
            read = f"call(c{i}, k{i})"
        elif loc.kind == "deref":
            read = f"(c{i}() if c{i}() is not None else M)"
        elif loc.kind == "member":
            read = f"member(c{i}, k{i})"
        elif loc.kind == "contents":
            lines.append(f"if not same_contents(contents(c{i}), v{i}): return True")
            continue
        elif loc.kind == "item" and isinstance(loc.container, _SEQUENCES):
            read = f"(c{i}[k{i}] if -len(c{i}) <= k{i} < len(c{i}) else M)"
        else:
            read = f"c{i}.get(k{i}, M)"
        if by_identity:
            lines.append(f"if {read} is not v{i}: return True")
        else:
            lines += [f"x = {read}",
                      f"if x is not v{i} and (type(x) is not t{i} or not same(x, v{i})): "
                      f"return True"]
    src = ("def check():\n    try:\n"
           + "".join(f"        {line}\n" for line in lines)
           + "    except Exception:\n"       # any failure to read: let `changed` decide
           + "        return True\n    return False\n")
    exec(compile(src, "<tracejit-state-check>", "exec"), env)
    return env["check"]


def _same_scalar(a, b):
    try:
        return bool(a == b) or (a != a and b != b)
    except (TypeError, ValueError):
        return False


def describe_value(v):
    """v as the user wrote it: a traced array is the ndarray (or NumPy scalar) eager
    has there."""
    if type(v) in _SCALARS or isinstance(v, np.generic):
        return repr(v)
    if isinstance(v, np.ndarray):
        if getattr(v, "_numpy_scalar", False):
            return f"a NumPy {v.dtype} scalar"
        return f"an ndarray of shape {v.shape} and dtype {v.dtype}"
    return f"a {type(v).__name__} object"


def sizes(locs):
    out = []
    for loc in locs:
        v = loc.read()
        if type(v) in (list, set, dict):
            out.append((loc, v, len(v)))
    return out


def grown(size_snap):
    """(location, container) of the first list, set or dict whose size changed, or None."""
    for loc, container, n in size_snap:
        if len(container) != n:
            return loc, container
    return None


# What an array swap_arrays could not swap is, in the warnings that name one.
UNSWAPPED = ("an array held where the tracer cannot put a traced view (a partial's "
             "positional argument, a tuple in a tuple)")


def swap_arrays(locs, make_view, unswapped=None):
    """Put a traced view in place of each plain ndarray; return what to undo. An item
    of a tuple or namedtuple held at a writable place is swapped by rebuilding the
    tuple there (_swap_in_tuple). An array no view can be put in place of (a partial's
    positional argument, a tuple in a tuple, an attribute the user's class guards)
    stays plain: its writes would go to the array unrecorded, so unswapped (a list)
    gets (location, array, a copy) for written_unswapped to compare after the trace."""
    swaps = []
    for loc in locs:
        v = loc.read()
        if type(v) is np.ndarray and v.dtype != object:
            view = make_view(v)
            try:
                loc.write(view)
            except Exception:  # noqa: BLE001 - immutable, or a class that guards it
                if not _swap_in_tuple(loc, view, swaps) and unswapped is not None:
                    unswapped.append((loc, v, v.copy()))
                continue
            swaps.append((loc, v, view))
    return swaps


def _swap_in_tuple(loc, view, swaps):
    """An array in a tuple (or namedtuple) held at a writable location (`T = (K, 1)` a
    global, a closure cell, an attribute): that location holds a tuple with the view in
    its place while the trace runs (NumPy computed on the plain array unseen: `T[0] *
    2.0` was frozen, `T[0].T` returned a copy). Built from the tuple there now (a
    sibling swapped before is kept); unswap puts each back in reverse order."""
    parent = loc.parent
    if loc.kind != "item" or not isinstance(loc.container, tuple) or parent is None \
            or parent.kind not in ("global", "cell", "attr", "item"):
        return False
    current = parent.read()
    if not isinstance(current, tuple) or not (-len(current) <= loc.key < len(current)) \
            or current[loc.key] is not loc.container[loc.key]:
        return False
    items = list(current)
    items[loc.key] = view
    try:
        new = type(current)(items) if type(current) is tuple else type(current)._make(items)
        parent.write(new)
    except Exception:  # noqa: BLE001 - a tuple subclass that cannot be rebuilt, a guard
        return False
    swaps.append((parent, current, new))
    return True


def written_unswapped(unswapped):
    """The first location of unswapped whose array the trace wrote into, or None."""
    for loc, arr, before in unswapped:
        if arr.shape != before.shape or arr.tobytes() != before.tobytes():
            return loc
    return None


def unswap(swaps):
    for loc, original, view in reversed(swaps):
        if loc.read() is view:     # the function may have rebound it: keep its value then
            loc.write(original)


# ---------------------------------------------------------------- threaded state
#
# A function that rebinds a Variable it reaches (`self.h = h_new` in an RNN layer, run
# by `model(x)`) changes Python state, which a compiled call cannot replay as such. It
# can thread it: the value at the location is one more argument of the call, read when
# the call starts, and the value the function leaves there one more result, written
# back after it. threaded() makes that function of the user's; the runtime calls it
# with the state read from the locations and writes the results back (runtime.jitted),
# so a variant sees the state as it sees any argument: its structure (None, or a
# Variable's shape and dtype) is part of the signature, its gradients flow through the
# compiled backward into the previous call's, and the new state is a result of the
# call, a Variable with the compiled call as its creator.


class _Unset:
    """What a threaded location holds while the call runs (no __dict__: pystate
    neither guards it nor walks into it); the function itself never sees it."""

    __slots__ = ()

    def __repr__(self):
        return "<state being threaded>"


UNSET = _Unset()


def state_refusal(loc, old, new):
    """Why a rebinding of loc (old -> new) cannot be threaded, None when it can: an
    attribute in an object's own __dict__ (set as its class sets attributes), an item
    of a dict or list, a closure cell or a module global, holding None, a Variable or
    an ndarray before and after. A Parameter too (the runner gives back the same
    object, or one of its class, as eager), except as an attribute of a Layer: a Layer registers it
    (its params() change), and put() writes past that."""
    from tracejit.core import Parameter
    from tracejit.layers import Layer
    for v in (old, new):
        if v is not None and not isinstance(v, Variable) and not _threadable_array(v):
            return f"{describe_value(v)} is not None, a Variable or an ndarray"
    if loc.kind == "attr":
        obj = loc.container
        if loc.key not in (probe(obj, "__dict__") or {}) and \
                loc.key not in _slot_names(type(obj)):
            return "it is not an attribute of the object itself"
        setattr_ = type(obj).__setattr__
        if setattr_ is not object.__setattr__ and setattr_ is not Layer.__setattr__:
            return f"{type(obj).__name__} defines its own __setattr__"
        if isinstance(obj, Layer) and loc.key in obj.__dict__.get("_params", ()) and \
                not all(v is None or isinstance(v, Parameter) for v in (old, new)):
            # (A Parameter rebound to a Parameter or None: write_back registers it.)
            return "it is a registered Parameter or Layer name"
        return None
    if loc.kind in ("cell", "global"):
        return None
    if loc.kind == "item" and type(loc.container) in (dict, list):
        return None
    return "the location cannot be written"


def _threadable_array(v):
    """An ndarray (traced, it is a result of the call, aliasing what eager's aliases):
    not a NumPy scalar eager gives (`x.data.sum()`), which the tracer holds as one."""
    from tracejit.trace.made import MadeArray
    from tracejit.trace.values import TracedArray
    return type(v) is np.ndarray or type(v) is MadeArray or (
        type(v) is TracedArray and not v._numpy_scalar)


def threaded(fn, locs, labels, name):
    """fn threading the state at locs: threaded(*state, *args, **kwargs) writes state
    into the locations, runs fn(*args, **kwargs), and returns (result, state after),
    leaving UNSET at the locations (so the trace's snapshot of Python state sees no
    change, and a call's check guards no state by identity). The caller
    (runtime.jitted) writes UNSET before and the results back after; on an exception
    the locations keep what fn left there. A value fn leaves that cannot be threaded
    (a deletion, a Parameter, a number) is an escape while tracing: that signature runs
    eagerly, and the caller writes back whatever it is."""
    import inspect
    n = len(locs)
    locs = tuple(locs)

    def run(*args, **kwargs):
        for loc, v in zip(locs, args[:n]):
            put(loc, v)
        result = fn(*args[n:], **kwargs)
        new = tuple(loc.read() for loc in locs)
        tr = _core._state.trace
        if tr is not None and hasattr(tr, "escape"):
            for loc, v, old in zip(locs, new, args[:n]):
                why = None if v is _MISSING else state_refusal(loc, old, v)
                if v is _MISSING or why is not None:
                    # (fn has returned: the line is its statement that rebinds loc.)
                    from tracejit.trace import record, sites
                    line = sites.change_line(fn, args[n:], kwargs, (), loc,
                                             outcomes=sites.branch_outcomes(tr.graph))
                    tr.escape(f"the function rebinds {loc.describe()}, state it "
                              f"threads, to {'nothing (deleted)' if v is _MISSING else why}"
                              f"; compiled calls could not write that back",
                              line or record.def_line(fn))
        for loc, old in zip(locs, args[:n]):
            # A Layer's registry as the state before left it (a trace sees no change
            # of its size): write_back registers the state after, as eager's did.
            _register(loc, old)
            put(loc, UNSET)
        return result, new

    run._tracejit_threads = fn
    run.__wrapped__ = fn
    run.__name__ = run.__qualname__ = name
    # Its signature names the state (graph inputs print as model_rnn_h), then fn's.
    try:
        rest = list(inspect.signature(fn).parameters.values())
    except Exception:  # noqa: BLE001 - (as pytree.arg_names: a user __getattr__)
        rest = [inspect.Parameter("args", inspect.Parameter.VAR_POSITIONAL),
                inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD)]
    taken = {p.name for p in rest}
    params = []
    for i, lab in enumerate(labels):
        pname = _identifier(lab, i)
        while pname in taken:
            pname += "_"
        taken.add(pname)
        params.append(inspect.Parameter(pname, inspect.Parameter.POSITIONAL_ONLY))
    run.__signature__ = inspect.Signature(params + rest)
    run._tracejit_rethread = lambda g: threaded(g, locs, labels, name)
    return run


def _identifier(label, i):
    s = "".join(c if c.isalnum() else "_" for c in label).strip("_") or f"state{i}"
    return s if s.isidentifier() else f"state{i}_{s}"


def same_location(a, b):
    return a.kind == b.kind and a.container is b.container and a.key == b.key


def put(loc, value):
    """Write a threaded location as the runtime does (UNSET, the state, the state after
    the call): not an assignment of the user's, so not through the object's own
    __setattr__ (a Layer's would unregister a name; state_refusal allows only classes
    whose __setattr__ does nothing else for these values), and also where the function
    deleted the attribute."""
    if loc.kind == "attr":
        object.__setattr__(loc.container, loc.key, value)
    elif loc.kind == "cell":
        loc.container.cell_contents = value
    else:
        loc.container[loc.key] = value


def _register(loc, value):
    """A Layer's parameter registry after `layer.name = value`, as Layer.__setattr__
    leaves it (a Parameter stored as threaded state on a Layer): registered in its
    place (the end when new), unregistered when the name held one and value is not."""
    from tracejit.layers import Layer
    obj = loc.container
    if loc.kind != "attr" or not isinstance(obj, Layer):
        return
    params = obj.__dict__.get("_params")
    if params is None:
        return
    if isinstance(value, (_core.Parameter, Layer)):
        params[loc.key] = None
    else:
        params.pop(loc.key, None)


def write_back(loc, value):
    """Leave value at a threaded location after the call: what the function left
    there (_MISSING: it deleted it)."""
    if value is not _MISSING:
        put(loc, value)
        _register(loc, value)
        return
    if loc.kind == "cell":
        del loc.container.cell_contents
    elif loc.kind == "attr":
        object.__delattr__(loc.container, loc.key)
    else:
        del loc.container[loc.key]
