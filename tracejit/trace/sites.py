"""Where in the user's code a change of Python state was made: the line a warning names.

Some changes are seen only by comparing state after the trace (pystate.all_changed,
pystate.grown, the random streams' states): no frame of the user's is running then.
So the line is found from the source: the statements of the function (and of the user
functions it reaches) that store to that attribute or item (`cfg.lr = ...`,
`d['k'] += 1`, setattr), change that container's size (`log.append(...)`, `d[k] = v`,
`del L[0]`) or draw from Python's or NumPy's global random stream. A statement whose
target names the very object (resolved from the call's arguments, closure cells and
globals, without running user code: no property or __getattr__) is the one; one whose
target cannot be resolved (a local alias, a helper's parameter) is taken only when
none resolves; one that resolves to another object is never taken. None: no such
statement (the caller then names the def line)."""
import ast
import functools
import inspect
import os
import random
import textwrap
import types

import numpy as np

from tracejit.trace import pystate

_UNKNOWN = object()
# Calls that change a list's, dict's or set's size or items.
_SIZE_METHODS = frozenset({"append", "extend", "insert", "pop", "remove", "clear",
                           "update", "add", "discard", "setdefault", "popitem",
                           "difference_update", "intersection_update",
                           "symmetric_difference_update", "appendleft", "extendleft",
                           "popleft", "__setitem__", "__delitem__"})
_ITEM_METHODS = _SIZE_METHODS | {"sort", "reverse", "__setitem__"}
# The global streams' methods that do not draw.
_NOT_DRAWS = frozenset({"seed", "getstate", "setstate", "get_state", "set_state"})
_FRESH_CALLS = frozenset({"list", "dict", "set", "collections.deque", "deque"})


@functools.lru_cache(maxsize=256)
def _parsed(code):
    """(module AST of the source holding code, its first line), or None (no source: a
    function made by exec, a lambda inside an expression that does not parse alone)."""
    try:
        lines, start = inspect.getsourcelines(code)
        tree = ast.parse(textwrap.dedent("".join(lines)))
    except (OSError, TypeError, SyntaxError, ValueError, IndentationError):
        return None
    return tree, max(start, 1)


def _env(func, bound, args, kwargs):
    """The names the function's code can be resolved against: its parameters bound to
    this call's arguments (bound: the arguments before those, None: not known), its
    closure cells, its globals, builtins."""
    env = {}
    glb = pystate.probe(func, "__globals__") or {}
    b = glb.get("__builtins__", {})
    env.update(b if isinstance(b, dict) else pystate.probe(b, "__dict__") or {})
    env.update(glb)
    code = func.__code__
    for name, cell in zip(code.co_freevars, pystate.probe(func, "__closure__") or ()):
        try:
            env[name] = cell.cell_contents
        except ValueError:
            pass
    if bound is not None:
        try:
            sig = inspect.signature(func)
            env.update(sig.bind_partial(*bound, *args, **kwargs).arguments)
        except (TypeError, ValueError):
            pass
    return env


def _resolve(node, env):
    """The object an expression of names, attributes and constant subscripts is, looked
    up without running user code (getattr_static: no property, no __getattr__), or
    _UNKNOWN."""
    if isinstance(node, ast.Name):
        return env.get(node.id, _UNKNOWN)
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Attribute):
        base = _resolve(node.value, env)
        if base is _UNKNOWN:
            return _UNKNOWN
        try:
            v = inspect.getattr_static(base, node.attr)
        except AttributeError:
            return _UNKNOWN
        if isinstance(v, types.MemberDescriptorType):     # a __slots__ field (C-level)
            try:
                return v.__get__(base, type(base))
            except AttributeError:
                return _UNKNOWN
        # (A class's function or property met through an instance: not the value.)
        return _UNKNOWN if isinstance(v, (property, types.FunctionType)) and \
            not isinstance(base, (type, types.ModuleType)) else v
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
        base = _resolve(node.value, env)
        if type(base) in (dict, list, tuple):
            try:
                return base[node.slice.value]
            except (KeyError, IndexError, TypeError):
                return _UNKNOWN
    return _UNKNOWN


def _fresh_names(tree):
    """Names a function binds to a new container of its own (`ys = []`, `out = dict()`):
    what they are appended to is not state."""
    out = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Assign):
            v = n.value
            fresh = isinstance(v, (ast.List, ast.Dict, ast.Set, ast.ListComp,
                                   ast.DictComp, ast.SetComp)) or (
                isinstance(v, ast.Call) and ast.unparse(v.func) in _FRESH_CALLS)
            if fresh:
                out |= {t.id for t in n.targets if isinstance(t, ast.Name)}
    return out


def _targets(tree):
    """(node, base, key, how) for every statement part that changes an object: how is
    "attr" (key: the attribute name), "item" (key: the subscript's node), "call" (key:
    the method's name), "name" (key: the rebound name, with a global/nonlocal)."""
    declared = {name for n in ast.walk(tree) if isinstance(n, (ast.Global, ast.Nonlocal))
                for name in n.names}
    for n in ast.walk(tree):
        if isinstance(n, ast.Attribute) and isinstance(n.ctx, (ast.Store, ast.Del)):
            yield n, n.value, n.attr, "attr"
        elif isinstance(n, ast.Subscript) and isinstance(n.ctx, (ast.Store, ast.Del)):
            yield n, n.value, n.slice, "item"
        elif isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store) and n.id in declared:
            yield n, None, n.id, "name"
        elif isinstance(n, ast.AugAssign) and isinstance(n.target, (ast.Name, ast.Attribute,
                                                                    ast.Subscript)):
            # `L += [x]`, `S |= {x}`: in place on a list or set.
            yield n, n.target, "__iadd__", "call"
        elif isinstance(n, ast.Call):
            f = n.func
            if isinstance(f, ast.Name) and f.id in ("setattr", "delattr") and \
                    len(n.args) >= 2 and isinstance(n.args[1], ast.Constant):
                yield n, n.args[0], n.args[1].value, "attr"
            elif isinstance(f, ast.Attribute):
                yield n, f.value, f.attr, "call"
            elif isinstance(f, ast.Name):      # (`from random import random`)
                yield n, None, f.id, "call"


def _search(functions, match, skip=frozenset()):
    """The best line over functions [(func, env)]: match(node, base, key, how, env,
    fresh) scores a target (0: not it); the highest score, then the first function, then
    the first line. skip: lines ("file.py:12") not to name."""
    from tracejit.trace.record import source_line
    best = None
    for rank, (func, env) in enumerate(functions):
        code = pystate.probe(func, "__code__")
        parsed = _parsed(code) if isinstance(code, types.CodeType) else None
        if parsed is None:
            continue
        tree, start = parsed
        fresh = _fresh_names(tree)
        for node, base, key, how in _targets(tree):
            lineno = start + node.lineno - 1
            if skip and f"{os.path.basename(code.co_filename)}:{lineno}" in skip:
                continue
            s = match(node, base, key, how, env, fresh)
            if s:
                k = (-s, rank, lineno)
                if best is None or k < best[0]:
                    best = (k, code.co_filename, lineno)
    return None if best is None else source_line(best[1], best[2])


def _base_score(base, env, fresh, obj):
    """2: base is obj; 1: base cannot be resolved (maybe obj); 0: it is something else
    (or a new container of the function's own)."""
    if base is None or isinstance(base, ast.Name) and base.id in fresh:
        return 0
    v = _resolve(base, env)
    return 1 if v is _UNKNOWN else 2 if v is obj else 0


def _functions(fn, args, kwargs, helpers):
    from tracejit.trace.record import unwrap_user_function
    func, bound = unwrap_user_function(fn)
    out = [] if func is None else [(func, _env(func, bound, args, kwargs))]
    for h in helpers:
        h = pystate.probe(h, "__func__", h)
        if isinstance(h, types.FunctionType) and (func is None or h is not func):
            out.append((h, _env(h, None, None, None)))
    return out


def change_line(fn, args, kwargs, helpers, loc, container=None):
    """The line that changed the value at loc (container given: the line that changed
    that container's size), or None."""
    def match(node, base, key, how, env, fresh):
        if container is not None:
            if how == "item" or (how == "call" and key in _SIZE_METHODS | {"__iadd__"}):
                return _base_score(base, env, fresh, container)
            return 0
        if loc.kind == "attr" and how == "attr" and key == loc.key:
            return _base_score(base, env, fresh, loc.container)
        if loc.kind == "item":
            s = 0
            if how == "item":
                k = _resolve(key, env)
                if k is _UNKNOWN:
                    s = 1
                elif type(k) is type(loc.key) and k == loc.key:
                    s = 2
            elif how == "call" and key in _ITEM_METHODS:
                s = 1
            return s and s * _base_score(base, env, fresh, loc.container)
        if loc.kind == "contents" and (how == "item" or
                                       (how == "call" and key in _ITEM_METHODS)):
            return _base_score(base, env, fresh, loc.container)
        if loc.kind in ("cell", "global") and how == "name" and key == loc.label:
            return 4
        return 0
    try:
        return _search(_functions(fn, args, kwargs, helpers), match)
    except Exception:  # noqa: BLE001 - only a better line for a warning
        return None


def draw_line(fn, args, kwargs, helpers, stream, skip_lines=()):
    """The first line calling the global stream's draw: stream "python" (random.*) or
    "numpy" (np.random.* of the global RandomState); skip_lines: lines of draws the
    tracer recorded (replayed, not the cause)."""
    owner = random._inst if stream == "python" else np.random.mtrand._rand

    def match(node, base, key, how, env, fresh):
        if how != "call" or key in _NOT_DRAWS or not isinstance(node, ast.Call):
            return 0
        f = _resolve(node.func, env)
        return 2 if f is not _UNKNOWN and pystate.probe(f, "__self__") is owner and \
            pystate.probe(f, "__name__") not in _NOT_DRAWS else 0

    skip = {str(s).split("  ", 1)[0] for s in skip_lines if s}
    try:
        return _search(_functions(fn, args, kwargs, helpers), match, skip)
    except Exception:  # noqa: BLE001 - only a better line for a warning
        return None
