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
none resolves; one that resolves to another object is never taken. Of several alike
statements, the function's own before its helpers', the first in the source (which
branch of an `if` ran is not known: `if c: cfg.lr = a else: cfg.lr = b` names the
first). None: no such statement (the caller then names the def line)."""
import ast
import functools
import inspect
import os
import random
import re
import textwrap
import types

import numpy as np

from tracejit.ops.trace_only import Guard
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


def _local_names(code):
    """The names code (and the functions, lambdas and comprehensions in it) binds
    locally: never a global or closure value of the same name."""
    names = set(code.co_varnames) | set(code.co_cellvars)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            names |= _local_names(c)
    return names


def _env(func, args=None, kwargs=None):
    """The names the function's code can be resolved against: its parameters bound to
    args and kwargs (None: not known; _UNKNOWN values too), its other locals unknown,
    its closure cells, its globals, builtins."""
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
    env.update(dict.fromkeys(_local_names(code), _UNKNOWN))
    if args is not None:
        try:
            env.update(inspect.signature(func).bind_partial(*args, **kwargs).arguments)
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
        if isinstance(base, (type, types.ModuleType)):
            return v.__func__ if isinstance(v, staticmethod) else v
        # A class's function met through an instance: the method (for the calls it
        # makes); a property's value would run user code.
        if isinstance(v, types.FunctionType):
            return types.MethodType(v, base)
        if isinstance(v, staticmethod):
            return v.__func__
        return _UNKNOWN if isinstance(v, (property, classmethod)) else v
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


def branch_outcomes(graph):
    """{("file.py", line): {outcomes}} of the graph's bool guards: which side of an `if`
    on traced data the trace took (a loop's test: both, over its trips)."""
    out = {}
    for n in getattr(graph, "nodes", ()):
        fn = n.fn
        if isinstance(fn, Guard) and fn.conv == "bool" and n.line:
            m = re.match(r"(.*?):(\d+)", n.line)
            if m:
                out.setdefault((os.path.basename(m.group(1)), int(m.group(2))),
                               set()).add(bool(fn.expected))
    return out


def _not_taken(node, parents, start, filename, outcomes):
    """Is node inside a side of an `if` the trace did not take (outcomes: of its test's
    guard)? Then another statement storing to the same place is the one that ran."""
    child, p = node, parents.get(node)
    while p is not None:
        if isinstance(p, ast.If):
            seen = outcomes.get((filename, start + p.test.lineno - 1))
            if seen is not None and child is not p.test:
                side = any(child is c for c in p.body)
                if side not in seen:
                    return True
        child, p = p, parents.get(p)
    return False


def _search(functions, match, skip=frozenset(), outcomes=None):
    """The best line over functions [(func, env, strict)]: match(node, base, key, how,
    env, fresh) scores a target, (score, certain) or 0 (not it); certain: its object
    resolved to the one that changed (a strict function's others are not taken). A
    line the trace ran before one on a side of an `if` it did not take (outcomes:
    branch_outcomes), then the highest score, then the first function, then the first
    line. skip: lines ("file.py:12") not to name."""
    from tracejit.trace.record import source_line
    best = None
    for rank, (func, env, strict) in enumerate(functions):
        parsed = _parsed(func.__code__)
        if parsed is None:
            continue
        tree, start = parsed
        fresh = _fresh_names(tree)
        filename = os.path.basename(func.__code__.co_filename)
        parents = {c: n for n in ast.walk(tree) for c in ast.iter_child_nodes(n)} \
            if outcomes else {}
        for node, base, key, how in _targets(tree):
            lineno = start + node.lineno - 1
            if skip and f"{filename}:{lineno}" in skip:
                continue
            m = match(node, base, key, how, env, fresh)
            if m and m[0] and (m[1] or not strict):
                k = (bool(outcomes) and _not_taken(node, parents, start, filename,
                                                   outcomes), -m[0], rank, lineno)
                if best is None or k < best[0]:
                    best = (k, func.__code__.co_filename, lineno)
    return None if best is None else source_line(best[1], best[2])


def _base_score(base, env, fresh, obj):
    """2: base is obj; 1: base cannot be resolved (maybe obj); 0: it is something else
    (or a new container of the function's own)."""
    if base is None or isinstance(base, ast.Name) and base.id in fresh:
        return 0
    v = _resolve(base, env)
    return 1 if v is _UNKNOWN else 2 if v is obj else 0


def _user_function(obj):
    """(the user's function a call of obj runs, the arguments it gets first), or None
    (a library's, a C function, no source)."""
    from tracejit.trace.record import _user_functions, unwrap_user_function
    if obj is _UNKNOWN or isinstance(obj, type):
        return None
    func, bound = unwrap_user_function(obj)
    if type(func) is not types.FunctionType or not _user_functions(func):
        return None
    return func, bound


def _call_args(call, env):
    """The arguments of a call node, resolved ((args, kwargs) of values or _UNKNOWN),
    or None (a *args or **kwargs)."""
    if any(isinstance(a, ast.Starred) for a in call.args) or \
            any(k.arg is None for k in call.keywords):
        return None
    return ([_resolve(a, env) for a in call.args],
            {k.arg: _resolve(k.value, env) for k in call.keywords})


_MAX_FUNCTIONS = 64


def _functions(fn, args, kwargs, helpers):
    """[(func, env, strict)]: the user's function behind fn, its parameters bound to
    the call's arguments; the user functions its code calls (and theirs, breadth
    first), their parameters bound to the arguments those calls pass where they
    resolve; then the other user functions the trace reached (helpers: callbacks kept
    in state, a class's other methods), strict (their parameters unknown)."""
    from tracejit.trace.record import unwrap_user_function
    func, bound = unwrap_user_function(fn)
    out, seen = [], set()
    if type(func) is types.FunctionType:
        env = _env(func, None if bound is None else (*bound, *args), kwargs)
        out.append((func, env, False))
        seen.add(func)
    i = 0
    while i < len(out) and len(out) < _MAX_FUNCTIONS:
        caller, env, _ = out[i]
        i += 1
        parsed = _parsed(caller.__code__)
        if parsed is None:
            continue
        for node in ast.walk(parsed[0]):
            if not isinstance(node, ast.Call):
                continue
            found = _user_function(_resolve(node.func, env))
            if found is None or found[0] in seen:
                continue
            callee, first = found
            passed = _call_args(node, env)
            seen.add(callee)
            out.append((callee, _env(callee, None if first is None or passed is None else
                                     (*first, *passed[0]),
                                     None if passed is None else passed[1]), False))
    for h in helpers:
        h = pystate.probe(h, "__func__", h)
        if type(h) is types.FunctionType and h not in seen:
            seen.add(h)
            out.append((h, _env(h), True))
    return out


def change_line(fn, args, kwargs, helpers, loc, container=None, outcomes=None):
    """The line that changed the value at loc (container given: the line that changed
    that container's size or items), or None. outcomes (branch_outcomes of the trace's
    graph): a statement on the side of an `if` that ran is named before one on the
    other side."""
    def match(node, base, key, how, env, fresh):
        def on(obj, key_score=1):
            b = _base_score(base, env, fresh, obj)
            return (b * key_score, b == 2)
        if container is not None:
            if how == "item" or (how == "call" and key in _ITEM_METHODS | {"__iadd__"}):
                return on(container)
            return 0
        if loc.kind == "attr" and how == "attr" and key == loc.key:
            return on(loc.container)
        if loc.kind == "item":
            if how == "item":
                k = _resolve(key, env)
                if k is _UNKNOWN:
                    return on(loc.container)
                if type(k) is type(loc.key) and k == loc.key:
                    return on(loc.container, 2)
            elif how == "call" and key in _ITEM_METHODS:
                return on(loc.container)
            return 0
        if loc.kind == "contents" and (how == "item" or
                                       (how == "call" and key in _ITEM_METHODS)):
            return on(loc.container)
        if loc.kind in ("cell", "global") and how == "name" and key == loc.label:
            return (4, True)
        return 0
    try:
        return _search(_functions(fn, args, kwargs, helpers), match, outcomes=outcomes)
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
        # (A bound method of the global stream's object: random.random is one of
        # random._inst, np.random.rand one of the global RandomState.)
        return (2, True) if isinstance(f, (types.BuiltinMethodType, types.MethodType)) \
            and f.__self__ is owner and f.__name__ not in _NOT_DRAWS else 0

    skip = {str(s).split("  ", 1)[0] for s in skip_lines if s}
    try:
        return _search(_functions(fn, args, kwargs, helpers), match, skip)
    except Exception:  # noqa: BLE001 - only a better line for a warning
        return None
