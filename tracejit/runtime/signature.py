"""Signature keys of a jitted call: what makes two calls share a variant.

A key holds the arguments' structure, shapes and dtypes, which are Variables,
Parameters or ndarrays, whether a Variable's .grad is None (and its shape and dtype if
not: backward adds to it, the function may read it), which share an array (aliasing),
static values and the grad mode. `signature_matcher` writes out, for one key, a function that recognises a call
with that key without building it (the hot path of a repeated call); `key_change` says
in the user's terms how a new key differs from an old one (the retrace log).
"""
import numpy as np

from tracejit.core import Config, Parameter, Variable
from tracejit.trace.pytree import ARR, FLT, VAR
from tracejit.trace.records import Form

PAR = Form.PARAMETER     # a Parameter argument in a signature key (VAR: a Variable)


def alias_pattern(leaves):
    """None if no two array leaves share an object (a Variable, or its data); else, per
    leaf, the index of the first leaf it shares one with."""
    seen = {}
    pattern = []
    shared = False
    for i, x in enumerate(leaves):
        first = i
        if isinstance(x, Variable):
            objs = (x, x._data)
        elif isinstance(x, np.ndarray):
            objs = (x,)
        else:
            objs = ()
        for o in objs:
            if o is not None:
                j = seen.setdefault(id(o), i)
                if j != i:
                    first, shared = min(first, j), True
        pattern.append(first)
    return tuple(pattern) if shared else None


def matcher_lines(key, env, miss, grad_mode=True):
    """Source lines that run `miss` unless positional `leaves` have exactly the key
    _fast_key would build (type, shape and dtype tests in line, nothing built or
    hashed); leaf i is left bound to l{i}. The names they use are put in env.
    grad_mode=False leaves out the Config test (the caller compares core._state.mode)."""
    parts, backprop, train = key
    env.update(ndarray=np.ndarray, Variable=Variable, Parameter=Parameter,
               local=Config._local, backprop=backprop, train=train)
    lines = [f"if len(leaves) != {len(parts)}: {miss}"]
    for i, p in enumerate(parts):
        lines.append(f"l{i} = leaves[{i}]")
        if p == FLT:
            lines.append(f"if type(l{i}) is not float: {miss}")
            continue
        shape, dtype, kind = p[:3]
        env[f"sd{i}"] = dtype
        if kind in (VAR, PAR):
            lines += [f"if type(l{i}) is not {'Variable' if kind == VAR else 'Parameter'}: "
                      f"{miss}",
                      f"a = l{i}._data",
                      f"if type(a) is not ndarray: {miss}"]    # None, or not an array
            if len(p) == 3:
                # Traced with .grad None: backward set it, where now it would add.
                lines.append(f"if l{i}._grad is not None: {miss}")
            else:
                gshape, gdtype = p[3]
                env[f"gd{i}"] = gdtype
                lines += [f"g = l{i}._grad",
                          f"if g is None: {miss}",
                          "g = g._data",
                          f"if type(g) is not ndarray or g.shape != {gshape!r} or "
                          f"(g.dtype is not gd{i} and g.dtype != gd{i}): {miss}"]
            a = "a"
        else:
            a = f"l{i}"
            lines.append(f"if type({a}) is not ndarray: {miss}")
        # ndim is a cached int; shape builds a tuple on every read.
        same_shape = f"{a}.ndim != 0" if shape == () else f"{a}.shape != {shape!r}"
        lines.append(f"if {same_shape} or ({a}.dtype is not sd{i} and {a}.dtype != sd{i}): "
                     f"{miss}")
    # No two arguments share an array (a fast key never has aliases: see _fast_key).
    objs = []      # (leaf, expression)
    for i, p in enumerate(parts):
        if p != FLT:
            objs.append((i, f"l{i}"))
            if p[2] != ARR:
                objs.append((i, f"l{i}._data"))
    pairs = [(a, b) for k, (i, a) in enumerate(objs) for j, b in objs[k + 1:] if i != j]
    if pairs:
        if len(pairs) <= 3:
            lines.append("if " + " or ".join(f"{a} is {b}" for a, b in pairs) + f": {miss}")
        else:
            lines.append(f"if len({{{', '.join(f'id({o})' for _, o in objs)}}}) != "
                         f"{len(objs)}: {miss}")
    if grad_mode:
        lines.append(f"if local.enable_backprop != backprop or local.train != train: {miss}")
    return lines


def signature_matcher(key):
    """A function args -> bool that holds exactly when _fast_key(args) == key."""
    env = {}
    lines = matcher_lines(key, env, "return False")
    src = "def match(leaves):\n" + "".join(f"    {line}\n" for line in lines) + \
        "    return True\n"
    exec(compile(src, "<tracejit-signature>", "exec"), env)
    return env["match"]


def key_distance(a, b):
    if type(a) is not type(b) or not isinstance(a, tuple) or len(a) != len(b):
        return 0 if a == b else 1
    return sum(key_distance(x, y) for x, y in zip(a, b))


def key_change(old, new):
    parts_old, parts_new = old[0], new[0]
    if old[-2] != new[-2]:
        return f"grad mode changed (Config.enable_backprop {old[-2]} -> {new[-2]})"
    if old[-1] != new[-1]:
        return f"train mode changed (Config.train {old[-1]} -> {new[-1]})"
    if len(old) == 3 and len(new) == 3 and len(parts_old) == len(parts_new):
        for i, (a, b) in enumerate(zip(parts_old, parts_new)):
            if a != b:
                if isinstance(a, tuple) and isinstance(b, tuple) and len(a) >= 3 \
                        and len(b) >= 3 and a[:3] == b[:3]:
                    return f"argument {i}'s .grad {_grad_state(a)} -> {_grad_state(b)}"
                if isinstance(a, tuple) and isinstance(b, tuple) and len(a) >= 3 \
                        and len(b) >= 3:
                    if a[:2] == b[:2]:
                        kinds = {VAR: "a Variable", PAR: "a Parameter", ARR: "an ndarray"}
                        return f"argument {i} is now {kinds.get(b[2], b[2])}, was " \
                               f"{kinds.get(a[2], a[2])}"
                    what = "shape" if a[0] != b[0] else "dtype"
                    va, vb = (a[0], b[0]) if what == "shape" else (a[1], b[1])
                    return f"argument {i} {what} changed: {va} -> {vb}"
                return f"argument {i} changed: {a} -> {b}"
    for i, (a, b) in enumerate(zip(old[1], new[1])) if len(old) == 4 else ():
        if a != b and isinstance(a, tuple) and isinstance(b, tuple) and len(a) >= 3 \
                and len(b) >= 3 and a[:3] == b[:3]:
            return f"array argument {i}'s .grad {_grad_state(a)} -> {_grad_state(b)}"
        if a != b:
            return f"array argument {i} changed: shape/dtype {a} -> {b}"
    return "the arguments' structure or static values changed"


def _grad_state(part):
    """A Variable key part's .grad, in words (part[3]: its (shape, dtype), if set)."""
    if len(part) == 3:
        return "None"
    shape, dtype = part[3]
    return f"set ({shape}, {np.dtype(dtype).name})"
