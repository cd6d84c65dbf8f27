"""What a jitted function reads from Python outside its arguments, and how it is kept live.

A location is a closure cell, a module global the function names, an attribute of an
object found there, or an item of a dict found there (one level deep). At trace time:
  - ndarrays at those locations are swapped for traced views, so NumPy on them
    (`x * c + c ** 2` with a closure array c) is recorded, not frozen;
  - Python scalars there become constants of the variant, guarded by value: every
    call compares them (a changed learning rate or global `k` retraces);
  - a scalar the function itself changes (`self.t += 1`) cannot be replayed, and a
    container that grows (`log.append`) is a side effect that runs only while tracing.
"""
import types

import numpy as np

_SCALARS = (bool, int, float, complex, str, bytes, type(None))
_MISSING = object()


class Location:
    __slots__ = ("kind", "container", "key", "label")

    def __init__(self, kind, container, key, label):
        self.kind = kind            # "cell", "global", "attr", "item"
        self.container = container
        self.key = key
        self.label = label          # how the user names it: "k", "opt.lr", "cfg['k']"

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
            return self.container.get(self.key, _MISSING)
        except ValueError:          # an empty closure cell
            return _MISSING

    def write(self, value):
        if self.kind == "cell":
            self.container.cell_contents = value
        elif self.kind == "attr":
            if _custom_setattr(self.container):
                object.__setattr__(self.container, self.key, value)
            else:
                setattr(self.container, self.key, value)
        else:
            self.container[self.key] = value


def _custom_setattr(obj):
    # Layers register Parameters in __setattr__; a swap of a plain array must not.
    return type(obj).__setattr__ is not object.__setattr__


def _is_namespace_object(o):
    if isinstance(o, (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType,
                      types.MethodType, np.ndarray)):
        return False
    return isinstance(getattr(o, "__dict__", None), dict)


def locations(fn):
    """The locations fn can read: closure cells, named globals, one level below them."""
    target = getattr(fn, "__func__", fn)
    code = getattr(target, "__code__", None)
    top = []
    if hasattr(fn, "__self__") and _is_namespace_object(fn.__self__):
        top.append((None, fn.__self__, "self"))
    if code is not None:
        for name, cell in zip(code.co_freevars, getattr(target, "__closure__", None) or ()):
            top.append((Location("cell", cell, None, name), None, name))
        glb = getattr(target, "__globals__", {})
        for name in code.co_names:
            if name in glb:
                top.append((Location("global", glb, name, name), None, name))
    out = []
    seen = set()
    for loc, obj, name in top:
        if loc is not None:
            out.append(loc)
            obj = loc.read()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if type(obj) is dict:
            out += [Location("item", obj, k, f"{name}[{k!r}]") for k in list(obj)
                    if isinstance(k, (str, int))]
        elif _is_namespace_object(obj):
            for k, v in list(vars(obj).items()):
                out.append(Location("attr", obj, k, f"{name}.{k}"))
                if type(v) is dict and id(v) not in seen:
                    seen.add(id(v))
                    out += [Location("item", v, kk, f"{name}.{k}[{kk!r}]") for kk in list(v)
                            if isinstance(kk, (str, int))]
    return out


def snapshot(locs):
    """(location, value) for the Python scalars among the locations."""
    snap = []
    for loc in locs:
        v = loc.read()
        if type(v) in _SCALARS:
            snap.append((loc, v))
    return snap


def changed(snap):
    """The first location whose scalar differs from the snapshot, as (loc, old, new)."""
    for loc, v in snap:
        cur = loc.read()
        if cur is not v and not (type(cur) is type(v) and cur == v):
            return loc, v, cur
    return None


def sizes(locs):
    out = []
    for loc in locs:
        v = loc.read()
        if type(v) in (list, set, dict):
            out.append((loc, v, len(v)))
    return out


def grown(size_snap):
    for loc, container, n in size_snap:
        if len(container) != n:
            return loc
    return None


def swap_arrays(locs, make_view):
    """Put a traced view in place of each plain ndarray; return what to undo."""
    swaps = []
    for loc in locs:
        v = loc.read()
        if type(v) is np.ndarray and v.dtype != object:
            view = make_view(v)
            try:
                loc.write(view)
            except (AttributeError, TypeError):
                continue
            swaps.append((loc, v, view))
    return swaps


def unswap(swaps):
    for loc, original, view in reversed(swaps):
        if loc.read() is view:     # the function may have rebound it: keep its value then
            loc.write(original)
