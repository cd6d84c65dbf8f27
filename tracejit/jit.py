"""tracejit.jit: the decorator, its variant cache, and the compiled call.

The path of one call: the arguments give a signature key (shapes, dtypes, static
values, grad mode). Under that key sit the variants traced so far, one per sequence
of guard outcomes. A variant runs its graph; the first guard that fails names the
outcome seen, which leads to the variant traced for that outcome, or to a new trace
(a real call that records). Outputs are Variables whose one creator, a
CompiledFunction, runs the compiled backward graph.
"""
import logging
import os
import threading
import time
import warnings
import weakref

import numpy as np

from tracejit import core, interpret
from tracejit.core import Config, DictGrads, Function, Parameter, Variable, backprop
from tracejit.ir import Graph, Lit, Value
from tracejit.trace_ops import GUARD, GuardFailure
from tracejit import pystate, tracing
from tracejit.tracing import TracedArray, TracedFloat, Trace

log = logging.getLogger("tracejit")


class JitWarning(UserWarning):
    """tracejit ran something eagerly, or saw a side effect that only runs while tracing."""


class _DisabledFlag(threading.local):
    on = False


_disabled = _DisabledFlag()


_ENVIRON = getattr(os.environ, "_data", None)
_ENV_KEY = os.environ.encodekey("TRACEJIT_DISABLE") if hasattr(os.environ, "encodekey") \
    else "TRACEJIT_DISABLE"


def _env_disabled():
    # Read at every call, cheaply: os.environ's backing dict, not os.environ.get.
    if _ENVIRON is not None:
        v = _ENVIRON.get(_ENV_KEY)
        return v is not None and v in (b"1", "1")
    return os.environ.get("TRACEJIT_DISABLE") == "1"


def jit_disabled():
    return _disabled.on or _env_disabled()


class disable_jit:
    """`with tj.disable_jit():` runs every jitted function as plain Python (pdb, print)."""

    def __enter__(self):
        self.prev = getattr(_disabled, "on", False)
        _disabled.on = True

    def __exit__(self, *exc):
        _disabled.on = self.prev


# ------------------------------------------------------------------ argument trees

_VAR, _ARR, _FLT = "V", "A", "F"


def _flatten(obj, leaves, static_ok=True):
    """Append array-like leaves to `leaves`; return a hashable structure with statics."""
    t = type(obj)
    if t is Variable or isinstance(obj, Variable):
        leaves.append(obj)
        return _VAR
    if t is np.ndarray or isinstance(obj, np.ndarray):
        leaves.append(obj)
        return _ARR
    if t is float:
        leaves.append(obj)
        return _FLT
    if t is tuple or t is list:
        return (t.__name__,) + tuple(_flatten(x, leaves) for x in obj)
    if t is dict:
        keys = tuple(obj)
        return ("dict", keys) + tuple(_flatten(obj[k], leaves) for k in keys)
    if isinstance(obj, np.generic) and obj.dtype.kind == "f":
        leaves.append(np.asarray(obj))
        return _ARR
    try:
        hash(obj)
    except TypeError:
        raise TypeError(f"jit: argument of type {t.__name__} is neither an array, a Variable, "
                        f"a float nor hashable (it could not be a static argument)") from None
    return ("S", obj)


def _unflatten(tree, leaves, it=None):
    it = iter(leaves) if it is None else it
    if tree in (_VAR, _ARR, _FLT):
        return next(it)
    tag = tree[0]
    if tag == "S":
        return tree[1]
    if tag == "tuple":
        return tuple(_unflatten(t, None, it) for t in tree[1:])
    if tag == "list":
        return [_unflatten(t, None, it) for t in tree[1:]]
    if tag == "dict":
        return {k: _unflatten(t, None, it) for k, t in zip(tree[1], tree[2:])}
    raise AssertionError(tree)


def _leaf_key(x):
    if isinstance(x, Variable):
        d = x._data
        if d is None:
            raise TypeError("jit: a Variable argument has data None")
        return (d.shape, d.dtype.char)
    if isinstance(x, np.ndarray):
        if x.dtype == object:
            raise TypeError("jit: object arrays are not supported")
        return (x.shape, x.dtype.char)
    return None


# ------------------------------------------------------------------ the compiled call

class CompiledFunction(Function):
    """The one creator of a compiled call's outputs: its backward is a compiled graph."""

    def __init__(self, variant, saved, arrays):
        self.variant = variant
        self.saved = saved
        self.arrays = arrays      # the call's inputs, for a create_graph replay

    def backward(self, *gys):
        v = self.variant
        if Config.enable_backprop:
            # create_graph: replay forward and backward on Variables, so the grads
            # carry the history that higher-order derivatives need.
            return v.backward_with_variables(self.inputs, gys, self.arrays)
        bexe = v.backward_executable()
        arrays = []
        for kind, i in v.bwd_sources:
            if kind == "saved":
                arrays.append(self.saved[i])
            elif kind == "input":
                arrays.append(self.arrays[i])
            elif kind != "gy":
                arrays.append(_read_capture(kind, i))
            else:
                g = gys[i]
                arrays.append(g._data if g is not None else
                              np.zeros(v.out_specs[i].shape, v.out_specs[i].dtype))
        grads = bexe(arrays)
        out = []
        for slot in v.bwd_grad_slots:
            out.append(None if slot is None else Variable(grads[slot]))
        return tuple(out)


class Variant:
    """One traced graph for one signature and one sequence of guard outcomes."""

    def __init__(self, jitted, trace, n_fwd_inputs, n_fwd_nodes, out_tree, out_leaves,
                 diff_vars, bwd_info):
        self.jitted = jitted
        g = trace.graph
        self.guard_outcomes = [n.fn.expected for n in g.nodes[:n_fwd_nodes] if n.kind == GUARD]
        self.has_random = bool(trace.random_nodes)
        self.calls = 0
        self.demoted = None
        # Where each forward input comes from at call time.
        self.sources = []
        arg_pos = {id(v): i for i, v in trace.arg_inputs}
        cap_src = {id(v): src for v, src in trace.captures}
        fwd_inputs = g.inputs[:n_fwd_inputs]
        for v in fwd_inputs:
            if id(v) in arg_pos:
                self.sources.append(("arg", arg_pos[id(v)], None))
            else:
                kind, obj = cap_src[id(v)]
                self.sources.append((kind, obj, (v.shape, v.dtype)))
        self.out_tree = out_tree
        self.out_leaves = out_leaves         # ('out', index, kind) or ('const', obj)
        user_outs = [v for kind, v, _ in out_leaves if kind == "out"]
        # Effects on live state, replayed after the graph ran and every guard held.
        effect_values = []
        def target(obj):
            # An argument is the current call's argument, not the traced call's.
            leaf = trace.arg_leaf.get(id(obj))
            return ("leaf", leaf) if leaf is not None else ("obj", obj)

        self.effects = []
        for kind, obj, v in trace.effects:
            self.effects.append((kind, target(obj), len(user_outs) + len(effect_values)))
            effect_values.append(v)
        self.grad_effects = []
        for var, gv in trace.grad_effects:
            if gv is None:
                self.grad_effects.append((target(var), None))
            else:
                self.grad_effects.append((target(var), len(user_outs) + len(effect_values)))
                effect_values.append(gv)
        # Backward: what the forward saves, and where each backward input comes from.
        self.diff_sources = diff_vars       # sources (as in self.sources) of the creator's inputs
        saved_values = bwd_info["saved"] if bwd_info else []
        self.n_user_outs = len(user_outs)
        self.n_effect_outs = len(effect_values)
        fwd_nodes = g.nodes[:n_fwd_nodes]
        self.forward_graph = Graph(g.name, fwd_inputs, fwd_nodes,
                                   user_outs + effect_values + saved_values,
                                   g.input_names[:n_fwd_inputs])
        # Specs of the output Variables, in the order of the creator's outputs.
        self.out_specs = [v.spec for kind, v, b in out_leaves if kind == "out" and b == _VAR]
        if bwd_info:
            # What a call keeps for its backward, and what recomputation spared it.
            self.forward_graph.notes["saved_for_backward_bytes"] = bwd_info["saved_bytes"]
            self.forward_graph.notes["recomputed_instead_bytes"] = bwd_info["recomputed_bytes"]
        self.bwd = bwd_info
        if bwd_info:
            self.bwd_sources = bwd_info["sources"]
            self.bwd_grad_slots = bwd_info["grad_slots"]
            self.joint_graph = bwd_info["joint"]
        in_ids = {id(x) for x in fwd_inputs}
        self.copy_outputs = [i for i, x in enumerate(user_outs) if id(x) in in_ids]
        self.state = ()
        self.checks_left = 3 if jitted.check else 1
        self.exe = jitted.backend_compile(self.forward_graph)
        self.runner = build_runner(self, trace.leaf_kinds)
        self._bexe = None
        self.input_ids = None

    def backward_executable(self):
        if self._bexe is None:
            with self.jitted.lock:
                if self._bexe is None:
                    self._bexe = self.jitted.backend_compile(self.bwd["graph"])
        return self._bexe

    def guard_line(self, index):
        guards = [n for n in self.forward_graph.nodes if n.kind == GUARD]
        return guards[index].line if index < len(guards) else "?"

    def backward_with_variables(self, inputs, gys, arrays):
        """Replay the joint forward+backward graph through the primitives on Variables."""
        j = self.joint_graph
        env_vars = []
        diff_pos = {i: k for k, i in enumerate(self.bwd["joint_diff_inputs"])}
        for idx, v in enumerate(j.inputs):
            if idx in diff_pos:
                env_vars.append(inputs[diff_pos[idx]])
            elif idx in self.bwd["joint_gy_inputs"]:
                k = self.bwd["joint_gy_inputs"][idx]
                g = gys[k]
                env_vars.append(g if g is not None else Variable(
                    np.zeros(self.out_specs[k].shape, self.out_specs[k].dtype)))
            elif idx in self.bwd["joint_captures"]:
                env_vars.append(Variable(_read_capture(*self.bwd["joint_captures"][idx])))
            else:
                env_vars.append(Variable(arrays[idx]))
        outs = interpret.run_with_variables(j, env_vars)
        return tuple(outs[s] if s is not None else None for s in self.bwd["joint_grad_slots"])


def _read_capture(kind, obj):
    if kind == "var":
        return obj._data
    if kind == "grad":
        return obj._grad._data
    return obj


def build_runner(v, leaf_kinds):
    """Python source for one variant's call: read inputs, run the compiled graph, apply
    the effects, build the outputs. Generated once per variant, so the hot path has no
    loops over descriptors and no isinstance checks."""
    env = {"np": np, "exe": v.exe, "v": v, "_Stale": _Stale, "GuardFailure": GuardFailure,
           "CompiledFunction": CompiledFunction, "Config": Config, "wrap": core.wrap_array,
           "ref": weakref.ref}
    consts = []

    def const(obj):
        consts.append(obj)
        name = f"k{len(consts) - 1}"
        env[name] = obj
        return name

    body = []
    names = []
    for i, (kind, obj, spec) in enumerate(v.sources):
        n = f"a{i}"
        names.append(n)
        if kind == "arg":
            lk = leaf_kinds[obj]
            if lk == _VAR:
                body.append(f"{n} = leaves[{obj}]._data")
            elif lk == _FLT:
                body.append(f"{n} = np.asarray(leaves[{obj}])")
            else:
                body.append(f"{n} = leaves[{obj}]")
                body.append(f"if type({n}) is not np.ndarray: {n} = np.asarray({n})")
        elif kind in ("var", "grad"):
            src = f"{const(obj)}._data" if kind == "var" else \
                f"({const(obj)}._grad._data if {const(obj)}._grad is not None else None)"
            body.append(f"{n} = {src}")
            body.append(f"if {n} is None or {n}.shape != {spec[0]!r} or "
                        f"{n}.dtype != {const(spec[1])}: "
                        f"raise _Stale('a captured {kind} changed shape or dtype')")
        else:
            body.append(f"{n} = {const(obj)}")
    body.append(f"arrays = [{', '.join(names)}]")
    if v.has_random:
        body += ["rng = np.random.get_state()",
                 "try:",
                 "    outs = exe(arrays)",
                 "except GuardFailure:",
                 "    np.random.set_state(rng)",
                 "    raise"]
    else:
        body.append("outs = exe(arrays)")
    for i in v.copy_outputs:
        body.append(f"outs[{i}] = outs[{i}].copy()")

    def target(where, obj):
        return f"leaves[{obj}]" if where == "leaf" else const(obj)

    for kind, (where, obj), slot in v.effects:
        t = target(where, obj)
        if kind == "inplace":
            body.append(f"np.copyto({t}._data, outs[{slot}], casting='unsafe')")
        elif kind == "inplace_array":
            body.append(f"np.copyto({t}, outs[{slot}], casting='unsafe')")
        else:
            body.append(f"val = outs[{slot}]")
            body.append(f"{t}._data = val.copy() if any(val is x for x in arrays) else val")
    for (where, var), slot in v.grad_effects:
        t = target(where, var)
        body.append(f"{t}._grad = None" if slot is None else f"{t}._grad = wrap(outs[{slot}])")
    # Outputs: each leaf's expression, then the user's structure around them.
    exprs, made = [], []
    k = 0
    for kind, a, b in v.out_leaves:
        if kind == "arg":
            exprs.append(f"leaves[{a}]")
        elif kind == "const":
            exprs.append(const(a))
        else:
            if b == _VAR:
                name = f"y{len(made)}"
                made.append((name, k, v.out_specs[len(made)].dtype.kind in "fc"))
                exprs.append(name)
            elif b == _FLT:
                exprs.append(f"float(outs[{k}])")
            else:
                exprs.append(f"outs[{k}]")
            k += 1
    structure = _structure_source(v.out_tree, iter(exprs), const)
    plain = [f"{name} = wrap(outs[{slot}])" for name, slot, _ in made]
    if v.bwd is not None:
        n_saved_from = v.n_user_outs + v.n_effect_outs
        diff = ", ".join(f"leaves[{o}]" if kind == "arg" else const(o)
                         for kind, o in v.diff_sources)
        body.append("if Config.enable_backprop:")
        inner = [f"cf = CompiledFunction(v, outs[{n_saved_from}:], arrays)",
                 f"cf.inputs = ins = [{diff}]",
                 "cf.generation = max([x.generation for x in ins])" if v.diff_sources
                 else "cf.generation = 0"]
        inner += [f"{name} = wrap(outs[{slot}], cf)" if is_float else
                  f"{name} = wrap(outs[{slot}])" for name, slot, is_float in made]
        inner.append(f"cf.outputs = [{', '.join(f'ref({n})' for n, _, _ in made)}]")
        body += ["    " + line for line in inner]
        body.append("else:")
        body += ["    " + line for line in plain] or ["    pass"]
    else:
        body += plain
    body.append(f"return {structure}")
    src = "def run(leaves):\n" + "\n".join("    " + line for line in body) + "\n"
    exec(compile(src, f"<tracejit-runner {v.forward_graph.name}>", "exec"), env)
    run = env["run"]
    run.source = src
    return run


def _structure_source(tree, exprs, const):
    if tree in (_VAR, _ARR, _FLT):
        return next(exprs)
    tag = tree[0]
    if tag == "S":
        return const(tree[1])
    parts = [_structure_source(t, exprs, const) for t in tree[(2 if tag == "dict" else 1):]]
    if tag == "tuple":
        return "(" + "".join(p + ", " for p in parts) + ")"
    if tag == "list":
        return "[" + ", ".join(parts) + "]"
    keys = tree[1]
    return "{" + ", ".join(f"{const(k)}: {p}" for k, p in zip(keys, parts)) + "}"


class _LiveState:
    """Snapshot and restore of everything a variant reads or writes outside its args."""

    def __init__(self, v, leaves):
        self.vars, self.arrays = [], []
        seen = set()
        objs = [(kind, obj) for kind, obj, _ in v.sources if kind != "arg"]
        objs += [("var" if kind != "inplace_array" else "array", t) for kind, (w, t), _ in
                 v.effects if w == "obj"]
        objs += [("var", var) for (w, var), _ in v.grad_effects if w == "obj"]
        objs += [("var", x) for x in leaves if isinstance(x, Variable)]
        objs += [("array", x) for x in leaves if isinstance(x, np.ndarray)]
        for kind, obj in objs:
            if kind == "grad":
                kind = "var"
            if id(obj) in seen:
                continue
            seen.add(id(obj))
            (self.vars if kind == "var" else self.arrays).append(obj)
        self.initial = self.capture()

    def capture(self):
        vs = [(var._data, None if var._data is None else var._data.copy(), var._grad,
               None if var._grad is None else var._grad._data.copy()) for var in self.vars]
        arrs = [a.copy() for a in self.arrays]
        return vs, arrs

    def restore(self, snap):
        vs, arrs = snap
        for var, (data, data_copy, grad, grad_copy) in zip(self.vars, vs):
            if data is not None:
                np.copyto(data, data_copy)
            var._data = data
            if grad is not None:
                np.copyto(grad._data, grad_copy)
            var._grad = grad
        for a, c in zip(self.arrays, arrs):
            np.copyto(a, c)

    def restore_initial(self):
        self.restore(self.initial)

    def difference(self, snap):
        vs, arrs = snap
        for var, (data, data_copy, grad, grad_copy) in zip(self.vars, vs):
            name = var.name or "a captured Variable"
            d = _array_difference(data_copy, var._data, f"{name}.data")
            if d:
                return d
            if (grad_copy is None) != (var._grad is None):
                return f"{name}.grad is {'None' if var._grad is None else 'set'} compiled"
            if grad_copy is not None:
                d = _array_difference(grad_copy, var._grad._data, f"{name}.grad")
                if d:
                    return d
        for a, c in zip(self.arrays, arrs):
            d = _array_difference(c, a, "a captured array")
            if d:
                return d
        return None


def _array_difference(expected, got, what):
    if expected is None or got is None:
        return None if expected is got else f"{what} is None in one run"
    expected, got = np.asarray(expected), np.asarray(got)
    if expected.shape != got.shape or expected.dtype != got.dtype:
        return (f"{what}: eager {expected.dtype}{list(expected.shape)}, compiled "
                f"{got.dtype}{list(got.shape)}")
    if expected.dtype.kind in "fc":
        ok = np.isclose(got, expected, rtol=1e-5, atol=1e-7, equal_nan=True)
    else:
        ok = got == expected
    if np.all(ok):
        return None
    i = np.unravel_index(np.argmin(ok), ok.shape) if ok.ndim else ()
    where = list(int(k) for k in i) if i else ""
    return f"{what}{where}: eager {expected[i]}, compiled {got[i]}"


def _first_difference(expected, got, path="output"):
    if isinstance(expected, Variable) or isinstance(expected, np.ndarray):
        e = expected._data if isinstance(expected, Variable) else expected
        g = got._data if isinstance(got, Variable) else got
        return _array_difference(e, g, path)
    if isinstance(expected, (tuple, list)):
        for i, (e, g) in enumerate(zip(expected, got)):
            d = _first_difference(e, g, f"{path}[{i}]")
            if d:
                return d
        return None
    if isinstance(expected, dict):
        for k in expected:
            d = _first_difference(expected[k], got[k], f"{path}[{k!r}]")
            if d:
                return d
        return None
    if isinstance(expected, float):
        return None if np.isclose(expected, got, rtol=1e-5, equal_nan=True) else \
            f"{path}: eager {expected!r}, compiled {got!r}"
    return None if expected == got else f"{path}: eager {expected!r}, compiled {got!r}"


_RETRACE = object()


class _Stale(Exception):
    """A captured input changed shape or dtype, or died: this variant no longer applies."""


class Jitted:
    """The callable `tj.jit(f)` returns."""

    def __init__(self, fn, static_argnums=(), static_argnames=(), max_variants=8,
                 backend="auto", parallel=None, cache=True, check=None, name=None):
        self.fn = fn
        self.__wrapped__ = fn
        self.__name__ = name or getattr(fn, "__name__", "f")
        self.__doc__ = getattr(fn, "__doc__", None)
        if isinstance(static_argnums, int):
            static_argnums = (static_argnums,)
        if isinstance(static_argnames, str):
            static_argnames = (static_argnames,)
        self.static_argnums = frozenset(static_argnums)
        self.static_argnames = frozenset(static_argnames)
        self.max_variants = max_variants
        self.backend = backend
        self.parallel = parallel
        self.cache = cache
        self.check = check if check is not None else os.environ.get("TRACEJIT_CHECK") == "1"
        self.lock = threading.RLock()
        self._version = 0            # bumped whenever the variants change

        self._variants = {}          # key -> list of Variant
        self._warm = set()
        self._eager_keys = {}        # key -> reason (fallback for good)
        self._warned = set()
        self.stats = dict(hits=0, misses=0, variants=0, retraces=0, guard_failures=0,
                          fallbacks=0, trace_seconds=0.0, compile_seconds=0.0)

    def __get__(self, obj, objtype=None):
        if obj is None:
            return self
        import functools
        return functools.partial(self.__call__, obj)

    # ---- public

    def eager(self, *args, **kwargs):
        return self.fn(*args, **kwargs)

    def cache_info(self):
        info = dict(self.stats)
        info["variants"] = sum(len(v) for v in self._variants.values())
        return info

    def trace(self, *args, **kwargs):
        """The forward graph of the variant these arguments run (tracing if needed)."""
        self(*args, **kwargs)
        self(*args, **kwargs)
        key, _ = self._call_key(args, kwargs)
        variants = self._variants.get(key)
        if not variants:
            reason = self._eager_keys.get(key, "no variant")
            raise RuntimeError(f"jit({self.__name__}): runs eagerly for these arguments "
                               f"({reason})")
        return variants[-1].forward_graph

    def backward_graph(self, *args, **kwargs):
        self.trace(*args, **kwargs)
        key, _ = self._call_key(args, kwargs)
        v = self._variants[key][-1]
        return v.bwd["graph"] if v.bwd else None

    # ---- the call

    def _key(self, args, kwargs):
        leaves = []
        parts = []
        for i, a in enumerate(args):
            if i in self.static_argnums:
                parts.append(("S", a))
            else:
                parts.append(_flatten(a, leaves))
        if kwargs:
            for k in sorted(kwargs):
                if k in self.static_argnames:
                    parts.append((k, ("S", kwargs[k])))
                else:
                    parts.append((k, _flatten(kwargs[k], leaves)))
        key = (tuple(parts), tuple([_leaf_key(x) for x in leaves]),
               Config.enable_backprop, Config.train)
        try:
            hash(key)
        except TypeError as e:
            raise TypeError(f"jit({self.__name__}): a static argument is not hashable: "
                            f"{e}") from None
        return key, leaves

    def _fast_key(self, args):
        """The key for positional Variables / ndarrays / floats: the common call, fast."""
        parts = []
        for a in args:
            t = type(a)
            if t is Variable or t is Parameter:
                d = a._data
                if d is None:
                    return None
                parts.append((d.shape, d.dtype, _VAR))
            elif t is np.ndarray:
                parts.append((a.shape, a.dtype, _ARR))
            elif t is float:
                parts.append(_FLT)
            else:
                return None
        return (tuple(parts), Config.enable_backprop, Config.train)

    def _call_key(self, args, kwargs):
        key = None if kwargs or self.static_argnums else self._fast_key(args)
        if key is not None:
            return key, args
        return self._key(args, kwargs)

    def __call__(self, *args, **kwargs):
        if _disabled.on or core._state.trace is not None or _env_disabled():
            # Nested in another trace: the outer trace records our ops directly.
            return self.fn(*args, **kwargs)
        key, leaves = self._call_key(args, kwargs)
        for attempt in (0, 1):
            version = self._version
            variants = self._variants.get(key)
            if variants:
                out = self._dispatch(key, variants, args, kwargs, leaves)
                if out is not _RETRACE:
                    return out
            with self.lock:
                if self._version != version and attempt == 0:
                    continue    # another thread traced meanwhile: try its variant first
                return self._cold_call(key, args, kwargs)

    def _dispatch(self, key, variants, args, kwargs, leaves):
        """Run the variant whose guards hold; _RETRACE if none does."""
        v = variants[0]
        tried = 0
        while True:
            try:
                if v.checks_left > 0:
                    return self._run_checked(key, v, args, kwargs, leaves)
                out = self._run(v, leaves)
                self.stats["hits"] += 1
                return out
            except GuardFailure as gf:
                self.stats["guard_failures"] += 1
                nxt = self._next_variant(variants, v, gf)
                tried += 1
                if nxt is None or tried > len(variants):
                    log.info("jit(%s): retrace: guard %d (%s) saw %r", self.__name__,
                             gf.index, v.guard_line(gf.index), gf.outcome)
                    self.stats["retraces"] += 1
                    return _RETRACE
                v = nxt
            except _Stale as e:
                log.info("jit(%s): retrace: %s", self.__name__, e)
                self.stats["retraces"] += 1
                with self.lock:
                    if v in variants:
                        variants.remove(v)
                        self._version += 1
                return _RETRACE

    def _cold_call(self, key, args, kwargs):
        """Warm-up, fallback or a new trace (under the lock: a cold cache traces once)."""
        if key in self._eager_keys:
            self.stats["fallbacks"] += 1
            return self.fn(*args, **kwargs)
        if key not in self._warm:
            # The first call with a new signature runs eagerly: state created during a
            # call (a lazy Linear, an optimizer's buffers) exists before tracing starts.
            self._warm.add(key)
            self.stats["misses"] += 1
            return self.fn(*args, **kwargs)
        variants = self._variants.get(key)
        if variants is not None and len(variants) >= self.max_variants:
            self._fallback(key, f"more than max_variants={self.max_variants} variants "
                           f"(data-dependent control flow keeps changing)")
            return self.fn(*args, **kwargs)
        if log.isEnabledFor(logging.INFO):
            log.info("jit(%s): trace: %s", self.__name__, self._why_new(key))
        result = self._trace_and_compile(key, args, kwargs)
        self._version += 1
        return result

    def _why_new(self, key):
        """What differs from the nearest signature traced before, in the user's terms."""
        known = [k for k in self._variants if k != key]
        if not known:
            return "first trace"
        old = min(known, key=lambda k: _key_distance(k, key))
        return _key_change(old, key)

    def _next_variant(self, variants, failed, gf):
        prefix = failed.guard_outcomes[:gf.index]
        for v in variants:
            if v is failed:
                continue
            go = v.guard_outcomes
            if len(go) > gf.index and go[:gf.index] == prefix and go[gf.index] == gf.outcome:
                return v
        return None

    def _fallback(self, key, reason, line=None):
        self._eager_keys[key] = reason
        self.stats["fallbacks"] += 1
        if reason not in self._warned:
            self._warned.add(reason)
            where = f" at {line}" if line else ""
            warnings.warn(f"jit({self.__name__}) runs eagerly: {reason}{where}", JitWarning,
                          stacklevel=4)

    # ---- verifying a variant against eager

    def _run_checked(self, key, v, args, kwargs, leaves):
        """Run eager and compiled side by side from the same state; keep eager's on a
        mismatch. Every variant's first call does this (check=True: its first three),
        so a value the tracer could not see (NumPy on a bare array the function also
        mutates) demotes the variant instead of replaying a frozen constant."""
        v.checks_left -= 1
        state = _LiveState(v, leaves)
        rng = np.random.get_state()
        with disable_jit():
            expected = self.fn(*args, **kwargs)
        eager_state = state.capture()
        rng_after = np.random.get_state()
        state.restore_initial()
        np.random.set_state(rng)
        try:
            got = self._run(v, leaves)
        except (GuardFailure, _Stale):
            state.restore(eager_state)
            np.random.set_state(rng_after)
            return expected
        diff = _first_difference(expected, got) or state.difference(eager_state)
        if diff is None:
            return got
        variants = self._variants.get(key, [])
        if v in variants:
            variants.remove(v)
        state.restore(eager_state)
        np.random.set_state(rng_after)
        self._fallback(key, f"the compiled variant differs from eager ({diff}); the "
                            f"function likely computes with NumPy on arrays the tracer "
                            f"cannot see")
        return expected

    # ---- running a variant

    def _run(self, v, leaves):
        if v.state:
            changed = pystate.changed(v.state)
            if changed is not None:
                loc, old, new = changed
                raise _Stale(f"{loc.describe()} changed from {old!r} to {new!r}")
        return v.runner(leaves)

    # ---- tracing

    def _trace_and_compile(self, key, args, kwargs):
        t0 = time.perf_counter()
        tr = Trace(self.__name__)
        tr.arg_inputs = []
        tr.arg_leaf = {}
        tr.leaf_kinds = []
        leaves = []
        targs, tkwargs = self._tracer_args(tr, args, kwargs, leaves)
        rng_before = np.random.get_state()
        locs = pystate.locations(self.fn)
        snap_before = pystate.snapshot(locs)
        sizes_before = pystate.sizes(locs)
        prev = tracing.start(tr)
        swaps = pystate.swap_arrays(locs, tr.capture_view)
        try:
            try:
                result = self.fn(*targs, **tkwargs)
            finally:
                pystate.unswap(swaps)
            out_leaves_raw = []
            out_tree = _flatten_out(result, out_leaves_raw)
            out_leaves = []
            out_vals = []
            for x in out_leaves_raw:
                if isinstance(x, Variable) and id(x) in tr.arg_leaf:
                    out_leaves.append(("arg", tr.arg_leaf[id(x)], _VAR))
                elif isinstance(x, Variable) and tr.captured_vars.get(id(x), (None,))[0] is x \
                        and x._tv is tr.captured_vars[id(x)][1]:
                    out_leaves.append(("const", x, _VAR))
                elif isinstance(x, Variable):
                    out_leaves.append(("out", tr.value_of(x), _VAR))
                elif isinstance(x, TracedFloat):
                    out_leaves.append(("out", x._tv, _FLT))
                elif isinstance(x, np.ndarray):
                    out_leaves.append(("out", tr.array_value(x), _ARR))
                else:
                    out_leaves.append(("const", x, None))
            tr.grad_effects = [(var, None if var._grad is None else tr.value_of(var._grad))
                               for var in tr.grad_writes.values()]
            n_fwd_inputs = len(tr.graph.inputs)
            n_fwd_nodes = len(tr.graph.nodes)
            bwd_info = None
            diff_vars = []
            if Config.enable_backprop:
                bwd_info, diff_vars = self._trace_backward(tr, out_leaves_raw, out_leaves)
        finally:
            tracing.stop(tr, prev)
            for x in leaves:
                if isinstance(x, Variable):
                    x._tv = None
        result = _strip(result)
        self._check_rng(tr, rng_before)
        self.stats["trace_seconds"] += time.perf_counter() - t0
        reason = None
        mutated = pystate.changed(snap_before)
        if tr.escapes:
            reason, line = tr.escapes[0]
        elif mutated is not None:
            loc, old, new = mutated
            reason = (f"the function changes the Python value {loc.describe()} ({old!r} -> "
                      f"{new!r}); compiled calls would not")
            line = None
        elif bwd_info == "escape":
            reason, line = "the backward pass inspects values", None
        if reason is not None:
            self._fallback(key, reason, line)
            return result
        grown = pystate.grown(sizes_before)
        if grown is not None:
            tr.side_effects.append((f"changing the size of {grown.label} (append, insert, "
                                    f"pop)", None))
        if tr.side_effects and self.__name__ not in self._warned:
            self._warned.add(self.__name__)
            what, line = tr.side_effects[0]
            warnings.warn(f"jit({self.__name__}): {what} at {line} runs only while tracing, "
                          f"not on compiled calls", JitWarning, stacklevel=3)
        t1 = time.perf_counter()
        try:
            variant = Variant(self, tr, n_fwd_inputs, n_fwd_nodes, out_tree, out_leaves,
                              diff_vars, bwd_info)
        except _Unsupported as e:
            self._fallback(key, str(e))
            return result
        self.stats["compile_seconds"] += time.perf_counter() - t1
        variant.state = pystate.snapshot(locs)
        self._variants.setdefault(key, []).append(variant)
        self.stats["variants"] += 1
        return result

    def _tracer_args(self, tr, args, kwargs, leaves):
        def convert(x, name):
            if isinstance(x, Variable):
                leaves.append(x)
                tr.leaf_kinds.append(_VAR)
                tr.arg_leaf[id(x)] = len(leaves) - 1
                v = tr.add_input(x.shape, x.dtype, x.name or name)
                tr.arg_inputs.append((v, len(leaves) - 1))
                x._tv = v
                tr.arg_vars[id(x)] = (x, v)
                return x
            if isinstance(x, np.ndarray):
                leaves.append(x)
                tr.leaf_kinds.append(_ARR)
                tr.arg_leaf[id(x)] = len(leaves) - 1
                v = tr.add_input(x.shape, x.dtype, name)
                tr.arg_inputs.append((v, len(leaves) - 1))
                t = x.view(TracedArray)
                t._tv = v
                t._trace = tr
                tr.arg_arrays[id(x)] = (x, v)
                return t
            if type(x) is float:
                leaves.append(x)
                tr.leaf_kinds.append(_FLT)
                v = tr.add_input((), np.float64, name)
                tr.arg_inputs.append((v, len(leaves) - 1))
                f = TracedFloat(x)
                f._tv = v
                f._trace = tr
                return f
            if isinstance(x, np.generic) and x.dtype.kind == "f":
                return convert(np.asarray(x), name)
            if type(x) in (tuple, list):
                return type(x)(convert(y, f"{name}_{i}") for i, y in enumerate(x))
            if type(x) is dict:
                return {k: convert(y, f"{name}_{k}") for k, y in x.items()}
            return x

        names = _arg_names(self.fn, len(args))
        targs = [a if i in self.static_argnums else convert(a, names[i])
                 for i, a in enumerate(args)]
        tkwargs = {k: (a if k in self.static_argnames else convert(a, k))
                   for k, a in sorted(kwargs.items())}
        # arg_inputs maps input Value -> leaf index; Variant wants (leaf index, Value).
        tr.arg_inputs = [(i, v) for v, i in tr.arg_inputs]
        return targs, tkwargs

    def _trace_backward(self, tr, out_raw, out_leaves):
        """Trace the eager backward over the traced forward: the backward graph."""
        # Differentiable Variables at the region's boundary: arguments and captures.
        boundary = []
        leaf_of = {id(val): i for i, val in tr.arg_inputs}
        for var, val in tr.arg_vars.values():
            if var.dtype.kind in "fc":
                boundary.append((("arg", leaf_of[id(val)]), var))
        for var, val in tr.captured_vars.values():
            if var.dtype.kind in "fc" and not _is_grad_capture(tr, val):
                boundary.append((("var", var), var))
        outs = [x for x in out_raw if isinstance(x, Variable)]
        roots = [y for y in outs if y.creator is not None and y.creator in tr.functions
                 and y.dtype.kind in "fc"]
        if not boundary or not roots:
            return None, []
        g = tr.graph
        n_nodes = len(g.nodes)
        n_inputs = len(g.inputs)
        grads = DictGrads()
        gy_values = {}
        out_index = {}
        # gys are numbered like the compiled call's output Variables (its creator's outputs).
        k = 0
        for x, (kind, _, b) in zip(out_raw, out_leaves):
            if kind == "out" and b == _VAR:
                out_index.setdefault(id(x), k)
                k += 1
        roots = [y for y in roots if id(y) in out_index]
        for y in roots:
            gy = Variable(np.ones_like(y._data))
            gv = tr.add_input(y.shape, y.dtype, f"g{out_index[id(y)]}")
            gy._tv = gv
            gy_values[id(gv)] = out_index[id(y)]
            grads.set(y, gy)
        with core.no_grad():
            backprop(roots, grads=grads, within=tr.functions)
        tr.bwd_line = None
        bwd_nodes = g.nodes[n_nodes:]
        if any(n.kind == GUARD for n in bwd_nodes) or tr.escapes:
            return "escape", []
        grad_values = []
        diff_sources = []
        for src, var in boundary:
            gvar = grads.get(var)
            diff_sources.append(src)
            grad_values.append(None if gvar is None else tr.value_of(gvar))
        # Backward graph inputs: forward values it reads (saved), and the gys.
        defined = {id(v) for n in bwd_nodes for v in n.outputs}
        fwd_inputs = g.inputs[:n_inputs]
        bwd_inputs, sources, saved = [], [], []
        seen = set()
        new_caps = {id(v) for v in g.inputs[n_inputs:] if id(v) not in gy_values}
        cap_source = {id(v): src for v, src in tr.captures if id(v) in new_caps}

        fwd_pos = {id(v): i for i, v in enumerate(fwd_inputs)}
        recompute = _recompute_rule(g.nodes[:n_nodes])
        recomputed = {}

        def need(v):
            if not isinstance(v, Value) or id(v) in defined or id(v) in seen:
                return
            seen.add(id(v))
            node = recompute.get(id(v))
            if node is not None:
                # Cheaper to recompute in the backward kernel than to store and reload.
                recomputed[node[0]] = node[1]
                for u in node[1].inputs:
                    need(u)
                return
            bwd_inputs.append(v)
            if id(v) in gy_values:
                sources.append(("gy", gy_values[id(v)]))
            elif id(v) in new_caps:
                # Captured by the backward alone (a constant array a user Function's
                # backward builds): read from where it lives, like a forward capture.
                sources.append(cap_source[id(v)])
            elif id(v) in fwd_pos:
                sources.append(("input", fwd_pos[id(v)]))   # the call's own input array
            else:
                sources.append(("saved", len(saved)))
                saved.append(v)

        for n in bwd_nodes:
            for v in n.inputs:
                need(v)
        for v in grad_values:
            if v is not None:
                need(v)
        bwd_nodes = [recomputed[i] for i in sorted(recomputed)] + bwd_nodes
        outs_b = [v for v in grad_values if v is not None]
        slot, grad_slots = 0, []
        for v in grad_values:
            if v is None:
                grad_slots.append(None)
            else:
                grad_slots.append(slot)
                slot += 1
        bgraph = Graph(g.name + "_backward", bwd_inputs, bwd_nodes, outs_b,
                       [v.name for v in bwd_inputs])
        # The joint graph (for create_graph): all inputs, all nodes.
        joint = Graph(g.name + "_joint", g.inputs, g.nodes,
                      outs_b, g.input_names)
        pos = {id(v): i for i, v in enumerate(g.inputs)}
        joint_diff = []
        for src, var in boundary:
            val = tr.arg_vars[id(var)][1] if src[0] == "arg" else tr.captured_vars[id(var)][1]
            joint_diff.append(pos[id(val)])
        joint_gy = {pos[id(v)]: gy_values[id(v)] for v in g.inputs if id(v) in gy_values}
        recomputed_bytes = sum(v.nbytes for n in recomputed.values() for v in n.outputs)
        info = dict(graph=bgraph, sources=sources, grad_slots=grad_slots, saved=saved,
                    saved_bytes=sum(v.nbytes for v in saved), recomputed_bytes=recomputed_bytes,
                    joint=joint, joint_diff_inputs=joint_diff, joint_gy_inputs=joint_gy,
                    joint_grad_slots=grad_slots)
        info["joint_captures"] = {pos[id(v)]: cap_source[id(v)] for v in g.inputs
                                  if id(v) in new_caps}
        return info, diff_sources

    def _check_rng(self, tr, before):
        after = np.random.get_state()
        if _same_rng(before, after) and not tr.random_nodes:
            return
        # Replay the recorded draws from the state before: they must explain the change.
        np.random.set_state(before)
        for n in tr.random_nodes:
            n.fn.forward()
        replayed = np.random.get_state()
        np.random.set_state(after)
        if not _same_rng(replayed, after):
            tr.escape("a random draw the tracer does not see (np.random.* on something "
                      "other than traced data); use tracejit functions for random draws")

    def backend_name(self):
        b = self.backend
        return os.environ.get("TRACEJIT_BACKEND", "numba") if b == "auto" else b

    def backend_compile(self, g):
        return compile_graph(g, self.backend, self.parallel, self.cache)


class _Unsupported(Exception):
    pass


def compile_graph(g, backend="auto", parallel=None, cache=True):
    """backend: "numba" (fused kernels), "interpret" (the reference), or "auto"
    (TRACEJIT_BACKEND, else numba; a graph numba fails on runs interpreted, warned)."""
    if parallel is None and any(n.kind == core.MATMUL for n in g.nodes):
        # Measured (MLP 784-256-10 step, 2 cores): prange kernels between BLAS calls
        # run 8.4 ms a step, serial ones 0.99 ms. Numba's OpenMP threads and OpenBLAS's
        # threads spin against each other; a graph with a matmul stays serial.
        parallel = False
    if backend == "auto":
        backend = os.environ.get("TRACEJIT_BACKEND", "numba")
        if backend == "numba":
            from tracejit import codegen
            try:
                return codegen.compile(g, parallel=parallel, cache=cache)
            except Exception as e:  # noqa: BLE001 - any codegen failure: still correct
                warnings.warn(f"jit({g.name}): the numba backend failed ({type(e).__name__}: "
                              f"{e}); this graph runs on the interpret backend", JitWarning,
                              stacklevel=2)
                return interpret.compile(g)
    if backend == "numba":
        from tracejit import codegen
        return codegen.compile(g, parallel=parallel, cache=cache)
    if backend == "interpret":
        return interpret.compile(g)
    raise ValueError(f"jit: unknown backend {backend!r} (use 'numba', 'interpret' or 'auto')")


# Elementwise ops whose recomputation costs more than a store and a load of the value.
_COSTLY = {"Exp", "Log", "Tanh", "Sin", "Cos", "Sigmoid", "PowV"}


def _recompute_rule(fwd_nodes):
    """id(value) -> (index, node) for forward values the backward recomputes.

    Cheap elementwise values (add, mul, compare, integer powers, ...) are recomputed
    inside the fused backward kernel rather than written by the forward and read back;
    on a graph of 0-d values everything elementwise is (the cost is the call, not the
    math). Reductions, matmuls, random draws and opaque nodes are always saved.
    """
    scalar = all(v.ndim == 0 for n in fwd_nodes for v in n.outputs)
    out = {}
    for i, n in enumerate(fwd_nodes):
        if n.kind != core.ELEMENTWISE or len(n.outputs) != 1:
            continue
        name = n.op.__name__
        costly = name in _COSTLY or (name == "Pow" and not float(n.params[0]).is_integer())
        if scalar or not costly:
            out[id(n.outputs[0])] = (i, n)
    return out


def _key_distance(a, b):
    if type(a) is not type(b) or not isinstance(a, tuple) or len(a) != len(b):
        return 0 if a == b else 1
    return sum(_key_distance(x, y) for x, y in zip(a, b))


def _key_change(old, new):
    parts_old, parts_new = old[0], new[0]
    if old[-2] != new[-2]:
        return f"grad mode changed (Config.enable_backprop {old[-2]} -> {new[-2]})"
    if old[-1] != new[-1]:
        return f"train mode changed (Config.train {old[-1]} -> {new[-1]})"
    if len(old) == 3 and len(new) == 3 and len(parts_old) == len(parts_new):
        for i, (a, b) in enumerate(zip(parts_old, parts_new)):
            if a != b:
                if isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b) == 3:
                    what = "shape" if a[0] != b[0] else "dtype"
                    va, vb = (a[0], b[0]) if what == "shape" else (a[1], b[1])
                    return f"argument {i} {what} changed: {va} -> {vb}"
                return f"argument {i} changed: {a} -> {b}"
    for i, (a, b) in enumerate(zip(old[1], new[1])) if len(old) == 4 else ():
        if a != b:
            return f"array argument {i} changed: shape/dtype {a} -> {b}"
    return "the arguments' structure or static values changed"


def _is_grad_capture(tr, val):
    for v, (kind, obj) in tr.captures:
        if v is val:
            return kind == "grad"
    return False


def _same_rng(a, b):
    return a[2] == b[2] and np.array_equal(a[1], b[1])


def _flatten_out(obj, leaves):
    t = type(obj)
    if isinstance(obj, (Variable, np.ndarray, TracedFloat)):
        leaves.append(obj)
        return _VAR
    if t is tuple or t is list:
        return (t.__name__,) + tuple(_flatten_out(x, leaves) for x in obj)
    if t is dict:
        keys = tuple(obj)
        return ("dict", keys) + tuple(_flatten_out(obj[k], leaves) for k in keys)
    leaves.append(obj)
    return _VAR


def _strip(obj):
    """The traced call's result with tracer types replaced by plain ones."""
    if isinstance(obj, TracedArray):
        return np.array(obj.view(np.ndarray))
    if isinstance(obj, TracedFloat):
        return float.__float__(obj)
    if type(obj) in (tuple, list):
        return type(obj)(_strip(x) for x in obj)
    if type(obj) is dict:
        return {k: _strip(v) for k, v in obj.items()}
    return obj


def _arg_names(fn, n):
    import inspect
    try:
        params = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        params = []
    names = []
    for i in range(n):
        names.append(params[i] if i < len(params) and params[i] not in ("args", "kwargs")
                     else f"arg{i}")
    return names


def jit(fn=None, **options):
    """Compile a define-by-run function: `@tj.jit` or `tj.jit(f, static_argnums=...)`."""
    if fn is None:
        return lambda f: Jitted(f, **options)
    return Jitted(fn, **options)
