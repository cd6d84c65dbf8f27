"""tj.export: the optimized graph of one variant, as a model that leaves Python.

`export(f, *example_args, dynamic=...)` selects the variant these arguments select (what
`tj.jit(f).trace(*args)` shows), and describes it without the process that traced it:
its inputs (the array arguments, with the dimensions named in `dynamic` symbolic), its
initializers (the Parameters and arrays it reads from outside its arguments, by the
names the trace gave them: model.l0.W), its outputs (the results, then the gradients a
`loss.backward()` in it left on captured Parameters, as NAME.grad) and its ops with
every fused group inlined back into its member ops.

Refused, with an ExportError (a ValueError) that says why and where:
  - data-dependent control flow: a guard (an `if` or `while` on traced data, float(v))
    would make the model follow the one traced path silently; each guard is listed
    with its line. `paths=[...]` exports the paths other examples take as an ONNX
    If-tree; `allow_guards=True` keeps one path's guards, checked when it runs (a
    saved file too: another path raises);
  - random draws (dropout in train mode, np.random): ONNX's RandomUniform has no seed
    stream matching NumPy's, and a saved file would replay one fixed draw;
  - effects on live state (an optimizer's in-place Parameter update, `W.data = ...`)
    and reads of live `.grad`s: a model has no state to update;
  - ops without a lowering (NumPy calls the tracer kept as is, user Functions).
"""
import inspect

import numpy as np

from tracejit.core import Variable
from tracejit.exporting.symbolic import GraphMismatch, Sym, flatten, merge
from tracejit.ir import Lit, Value

# The newest format this tracejit writes and reads. A file says the oldest that reads
# it: 1 unless it holds a constant of kind "fill" (2), so files older tracejits read
# stay readable by them.
FORMAT_VERSION = 2


class ExportError(ValueError):
    """The function's traced graph cannot be exported as a model (see tj.export)."""


class Exported:
    """One exported graph: specs, initializers, flat op-level nodes, symbolic dims.

    Attributes: name; inputs (graph inputs, in order), input_kinds ("input", "init",
    "const", "range" or "fill"), input_names; arrays (name -> ndarray of an initializer or
    constant); nodes (op-level Nodes, fused groups inlined); outputs, output_names;
    shape_of(v) (dims: ints and Syms); node_params(n) (params with Syms); lit(n, i);
    symbols (name -> the example's size); guards ([(text, line)]); graph (the
    optimized Graph as traced, for printing; None for a loaded file).
    """

    def __init__(self, name, inputs, input_kinds, input_names, arrays, nodes, outputs,
                 output_names, shapes, params, lits, symbols, guards, graph=None):
        self.name = name
        self.inputs = inputs
        self.input_kinds = input_kinds
        self.input_names = input_names
        self.arrays = arrays
        self.nodes = nodes
        self.outputs = outputs
        self.output_names = output_names
        self._shapes = shapes
        self._params = params
        self._lits = lits
        self.symbols = dict(symbols)
        self.guards = guards
        self.graph = graph
        self.paths = None         # export(paths=...): one Exported per traced path
        self._runners = {}

    # ---- symbolic facts (ints where nothing follows a dynamic dimension)

    def shape_of(self, v):
        return self._shapes.get(id(v), v.shape)

    def node_params(self, n):
        return self._params.get(id(n), n.params)

    def lit(self, n, i):
        """Input i of node n when a Lit: a Python number or a Sym."""
        s = self._lits.get((id(n), i))
        return s if s is not None else n.inputs[i].value

    # ---- specs

    def _spec(self, v, name):
        return {"name": name, "shape": tuple(self.shape_of(v)), "dtype": v.dtype}

    @property
    def input_specs(self):
        return [self._spec(v, n) for v, n, k in
                zip(self.inputs, self.input_names, self.input_kinds) if k == "input"]

    @property
    def output_specs(self):
        return [self._spec(v, n) for v, n in zip(self.outputs, self.output_names)]

    @property
    def initializers(self):
        return {n: self.arrays[n] for n, k in zip(self.input_names, self.input_kinds)
                if k == "init"}

    def __str__(self):
        def spec(s):
            dims = ", ".join(str(d) for d in s["shape"])
            return f"{s['name']}: {np.dtype(s['dtype']).name}[{dims}]"
        head = [f"exported {self.name}  (tracejit export format {FORMAT_VERSION})",
                "  inputs:  " + (", ".join(spec(s) for s in self.input_specs) or "-"),
                "  outputs: " + ", ".join(spec(s) for s in self.output_specs)]
        inits = self.initializers
        if inits:
            head.append("  initializers: " + ", ".join(
                f"{n}: {a.dtype.name}{list(a.shape)}" for n, a in inits.items()))
        for text, line in self.guards:
            head.append(f"  guard {text}    # {line}")
        if self.paths:
            head.append(f"  paths: {len(self.paths)} (an If-tree in ONNX); the first:")
        if self.graph is not None:
            return "\n".join(head) + "\n" + str(self.graph)
        return "\n".join(head) + "\n" + _flat_text(self)

    __repr__ = __str__

    # ---- backends

    def to_onnx(self, path=None, opset=None):
        """The ONNX model (an onnx.ModelProto, checked by onnx.checker), written to
        `path` when given. Needs `pip install 'tracejit[onnx]'`."""
        from tracejit.exporting.onnx import to_onnx
        return to_onnx(self, path, opset)

    def save(self, path):
        """Write a self-contained file (graph as JSON, arrays, a format version) that
        tj.load reads in a process without the function's source."""
        from tracejit.exporting.saved import save
        save(self, path)

    def __call__(self, *arrays):
        """Run the graph on the model's inputs (in input_specs order) through the numba
        backend; dynamic dimensions take the sizes these arrays have."""
        from tracejit.exporting.saved import PathMissed, run
        for p in self.paths or [self]:
            try:
                return run(p, arrays)
            except PathMissed:
                if self.paths is None or p is self.paths[-1]:
                    raise


def _flat_text(ex):
    from tracejit.ir import Graph
    g = Graph(ex.name, ex.inputs, ex.nodes, ex.outputs, ex.input_names)
    return str(g)


# ---------------------------------------------------------------- export

def export(f, *args, dynamic=None, allow_guards=False, paths=None, **kwargs):
    """Export the variant of f these arguments select (see the module docstring).

    dynamic: {argument name or position: {axis: symbol}}, e.g. {"x": {0: "batch"}}:
    those dimensions stay symbolic (arguments sharing a symbol share the size). f is
    traced once more per symbol at another size to find what follows it.
    paths: more example argument tuples (same keyword arguments), each selecting the
    variant of another outcome of the guards (an `if` on data, a while loop's trip
    count). Their guards are kept: to_onnx builds an ONNX If-tree, one branch per
    path, with one more output `traced_path` (False, and zeros, for inputs that take
    none of them); calling the Exported runs the first path whose guards hold.
    """
    from tracejit.runtime.jitted import Jitted, jit
    jf = f if isinstance(f, Jitted) else jit(f)
    if paths:
        first = _export_one(jf, args, kwargs, dynamic, True)
        rest = [_export_one(jf, tuple(p), kwargs, dynamic, True) for p in paths]
        for k, p in enumerate(rest, 1):
            if [(s["name"], s["dtype"], _dims_text(s)) for s in p.input_specs] != \
                    [(s["name"], s["dtype"], _dims_text(s)) for s in first.input_specs]:
                raise ExportError(f"export({jf.__name__}): path {k} has other inputs than "
                                  f"the first: {p.input_specs} vs {first.input_specs}")
            if [s["dtype"] for s in p.output_specs] != \
                    [s["dtype"] for s in first.output_specs]:
                raise ExportError(f"export({jf.__name__}): path {k} has other outputs "
                                  f"than the first")
        first.paths = [first] + rest
        return first
    return _export_one(jf, args, kwargs, dynamic, allow_guards)


def _dims_text(spec):
    return tuple(str(d) for d in spec["shape"])


def _export_one(jf, args, kwargs, dynamic, allow_guards):
    name = jf.__name__
    base = _traced(jf, args, kwargs, name)
    dims = _dynamic_dims(jf.fn, args, kwargs, dynamic or {})
    sizes, others = [], []
    for sym, (size, where) in dims.items():
        other = 2 * size + 1          # odd, > 2: no size-1 extents, rarely a coincidence
        a2, k2 = _resized(args, kwargs, where, other)
        sizes.append((sym, size, other))
        try:
            others.append(_traced(jf, a2, k2, name))
        except (ValueError, TypeError, IndexError) as e:
            if isinstance(e, ExportError):
                raise
            # The user's function itself fails at the other size: that dimension is
            # not free (a Parameter of the same size, a reshape to a fixed shape).
            raise ExportError(f"export({name}): {sym} is no dynamic dimension: the "
                              f"function fails at {sym}={other} (the example has "
                              f"{size}): {type(e).__name__}: {e}") from None
    try:
        shapes, params, lits, kinds = _compare(base, others, sizes)
    except GraphMismatch as e:
        raise ExportError(f"export({name}): the graph depends on the size of "
                          f"{', '.join(dims)} in a way a symbolic dimension cannot "
                          f"follow: {e}. Export with fixed sizes (dynamic=None) or "
                          f"avoid the dependency.") from None
    guards = [(n.fn.describe(_arg_text(base, n)), n.line) for n in base["nodes"]
              if n.kind == "guard"]
    if guards and not allow_guards:
        lines = "\n".join(f"  guard {t}    at {line or '?'}" for t, line in guards)
        raise ExportError(
            f"export({name}): the traced graph has {len(guards)} data-dependent guard(s) "
            f"(Python control flow on traced values); a model would follow the traced "
            f"path for every input:\n{lines}\nMake the control flow static; or pass "
            f"paths=[other example arguments] for an ONNX If-tree of the traced paths, "
            f"or allow_guards=True to keep the guards (checked when the export runs).")
    arrays = dict(base["arrays"])
    input_kinds = [kinds.get(i, k) for i, k in enumerate(base["kinds"])]
    return Exported(name, base["inputs"], input_kinds, base["names"], arrays,
                    base["nodes"], base["outputs"], base["out_names"], shapes, params,
                    lits, {s: n for s, (n, _) in dims.items()}, guards, base["graph"])


def _arg_text(base, n):
    # What the guard tests, by the op that computed it: bool(greater(...)) == True.
    x = n.inputs[0] if n.inputs else None
    for m in base["nodes"]:
        if x is not None and any(o is x for o in m.outputs):
            return f"{m.name}(...)"
    return "an input" if x is not None else "?"


def _traced(jf, args, kwargs, name):
    """The flat graph and facts of the variant these arguments select."""
    try:
        g = jf.trace(*args, **kwargs)
        # The same variant trace() just showed: where each input comes from and what the
        # call does besides its results (the runtime's record of the trace).
        v = jf._variant_for(args, kwargs)
    except RuntimeError as e:
        raise ExportError(f"export({name}): {e}") from None
    if jf._threading is not None:
        # The calls thread state (an RNN's `self.h = h`): the variant read what the
        # state holds now, and a model would neither read later values nor store its own.
        locs = ", ".join(loc.describe() for loc in jf._threading[0])
        raise ExportError(f"export({name}): the function stores state that later calls "
                          f"read ({locs}); a model has no state between runs (refused). "
                          f"Pass the state as an argument and return the new one.")
    if v.has_random:
        raise ExportError(f"export({name}): the function draws random numbers; an "
                          f"exported model would replay one draw (refused)")
    if v.effects:
        raise ExportError(f"export({name}): the function updates live state in place "
                          f"(an optimizer step, `x.data = ...`): {len(v.effects)} "
                          f"effect(s); a model has no state to update (refused). Export "
                          f"the loss and gradients, and update outside.")
    fwd = v.forward_graph
    if len(g.inputs) != len(v.sources) or len(g.outputs) != len(fwd.outputs):
        raise ExportError(f"export({name}): the optimized graph does not match its "
                          f"variant (internal error)")
    nodes, res = flatten(g)
    inputs, kinds, names, arrays = list(g.inputs), [], [], {}
    used = set()
    var_name = {}
    for i, ((kind, obj, _), v_in) in enumerate(zip(v.sources, g.inputs)):
        nm = g.input_names[i] if i < len(g.input_names) else None
        if kind == "arg":
            kinds.append("input")
        elif kind == "var":
            kinds.append("init")
            var_name[id(obj)] = nm
        elif kind == "array":
            kinds.append("const")
        else:
            raise ExportError(f"export({name}): the function reads the live .grad of "
                              f"{nm or 'a Variable'}; a model cannot hold it (refused). "
                              f"Clear gradients first (model.cleargrads()).")
        nm = _unique(nm or ("input" if kind == "arg" else "const") + str(i), used)
        names.append(nm)
        if kind == "var":
            arrays[nm] = np.array(obj.data)
        elif kind == "array":
            arrays[nm] = np.array(obj)
    arg_name = {obj: nm for (kind, obj, _), nm in zip(v.sources, names) if kind == "arg"}
    outs = _result_outputs(v, g, res, name)
    out_names = [f"output_{i}" for i in range(len(outs))]
    for target, idx in v.grad_effects:
        if idx is None or res(g.outputs[idx]) in outs:
            continue
        where, obj = target
        label = var_name.get(id(obj)) if where == "obj" else arg_name.get(obj) \
            if where == "leaf" else None
        outs.append(res(g.outputs[idx]))
        out_names.append(_unique(f"{label or 'param'}.grad", used))
    for n in nodes:
        if n.kind == "fused":
            raise ExportError(f"export({name}): a nested fused group (internal error)")
    return {"graph": g, "nodes": nodes, "inputs": inputs, "kinds": kinds, "names": names,
            "arrays": arrays, "outputs": outs, "out_names": out_names,
            "sources": v.sources}


def _result_outputs(v, g, res, name):
    """One model output per leaf of the function's result, as the runtime describes
    them (pytree.result_leaves): computed values, and an argument or another leaf
    returned again; a leaf a graph output cannot stand for is refused, never dropped."""
    computed = iter(res(o) for o in g.outputs[:v.n_user_outs])
    arg_input = {obj: val for (kind, obj, _), val in zip(v.sources, g.inputs)
                 if kind == "arg"}
    grad_of = {id(t[1]): res(g.outputs[i]) for t, i in v.grad_effects
               if i is not None and t[0] == "obj"}
    outs = []

    def leaf(kind, what):
        if kind == "out":
            return next(computed)
        if kind in ("same", "vardata"):
            return outs[what]
        if kind in ("arg", "argdata") and what in arg_input:
            return arg_input[what]
        if kind == "wrap":
            return leaf(what[0], what[1])
        if kind == "capgrad" and id(what) in grad_of:
            return grad_of[id(what)]
        raise ExportError(f"export({name}): the function returns a {kind} leaf (a "
                          f"captured object or a live .grad), which a model output "
                          f"cannot stand for; return values computed from the inputs")

    for kind, what, _ in v.out_leaves:
        outs.append(leaf(kind, what))
    return outs


def _unique(nm, used):
    out, k = nm, 1
    while out in used:
        k += 1
        out = f"{nm}_{k}"
    used.add(out)
    return out


def _signature_names(fn):
    # The user's parameter names, looking through jit and grad / value_and_grad.
    from tracejit.trace.record import wrapped_function
    for _ in range(8):
        inner = getattr(fn, "fn", None) or getattr(fn, "__wrapped__", None)
        if inner is None and getattr(fn, "_tracejit_wrapper", False):
            inner = wrapped_function(fn)
        if inner is None:
            break
        fn = inner
    try:
        return [p.name for p in inspect.signature(fn).parameters.values()]
    except (TypeError, ValueError):
        return []


def _dynamic_dims(fn, args, kwargs, dynamic):
    """symbol -> (example size, [(arg position or kwarg name, axis)])."""
    names = _signature_names(fn)
    out = {}
    for key, axes in dynamic.items():
        if isinstance(key, int):
            pos = key
        elif key in kwargs:
            pos = key
        elif key in names and names.index(key) < len(args):
            pos = names.index(key)
        else:
            raise ExportError(f"export: dynamic names {key!r}, which is not an argument "
                              f"of the call (arguments: {', '.join(names) or '?'})")
        a = kwargs[pos] if isinstance(pos, str) else args[pos] if pos < len(args) else None
        data = a.data if isinstance(a, Variable) else a
        if not isinstance(data, np.ndarray):
            raise ExportError(f"export: dynamic[{key!r}]: the argument is not an array")
        for axis, sym in dict(axes).items():
            if not isinstance(sym, str) or not sym.isidentifier():
                raise ExportError(f"export: dynamic[{key!r}][{axis}]: a symbol is an "
                                  f"identifier string, got {sym!r}")
            if not -data.ndim <= axis < data.ndim:
                raise ExportError(f"export: dynamic[{key!r}]: axis {axis} out of range "
                                  f"for shape {data.shape}")
            size = data.shape[axis]
            if sym in out and out[sym][0] != size:
                raise ExportError(f"export: symbol {sym!r} has size {out[sym][0]} and "
                                  f"{size} in the example arguments")
            out.setdefault(sym, (size, []))[1].append((pos, axis % data.ndim))
    return out


def _resized(args, kwargs, where, size):
    """The arguments with the given axes resized to `size` (values repeated: labels
    stay labels, so the other trace takes the example's path)."""
    args, kwargs = list(args), dict(kwargs)
    for pos, axis in where:
        box = kwargs if isinstance(pos, str) else args
        a = box[pos]
        data = a.data if isinstance(a, Variable) else a
        new = np.take(data, np.arange(size) % data.shape[axis], axis=axis)
        box[pos] = Variable(new, name=a.name) if isinstance(a, Variable) else new
    return args, kwargs


def _compare(base, others, sizes):
    """Shapes, node params and literals of the base trace that follow symbols."""
    shapes, params, lits, kinds = {}, {}, {}, {}
    if not others:
        return shapes, params, lits, kinds

    def value(v, ovs, what):
        dims = merge(tuple(v.shape), [tuple(o.shape) for o in ovs], sizes, what)
        if any(o.dtype != v.dtype for o in ovs):
            raise GraphMismatch(f"{what}: dtypes differ")
        if any(isinstance(d, Sym) for d in dims):
            shapes[id(v)] = dims

    for o in others:
        if len(o["inputs"]) != len(base["inputs"]) or len(o["nodes"]) != len(base["nodes"]) \
                or len(o["outputs"]) != len(base["outputs"]):
            raise GraphMismatch("the graphs have different numbers of inputs, ops or "
                                "outputs")
    for i, v in enumerate(base["inputs"]):
        nm = base["names"][i]
        value(v, [o["inputs"][i] for o in others], f"the shape of input {nm}")
        if base["kinds"][i] == "const":
            a = base["arrays"][nm]
            obs = [o["arrays"][o["names"][i]] for o in others]
            if all(b.shape == a.shape and np.array_equal(a, b) for b in obs):
                continue
            if id(v) in shapes and a.ndim == 1 and a.dtype.kind in "iu" and all(
                    np.array_equal(b, np.arange(len(b))) for b in [a] + obs):
                kinds[i] = "range"        # np.arange(N): built from N in the model
                continue
            if id(v) in shapes and _filled(a, obs):
                kinds[i] = "fill"         # np.zeros(x.shape), np.full(...): one value
                continue                  # expanded to the symbolic shape in the model
            raise GraphMismatch(f"the constant {nm} (an array the function made) "
                                f"changes with the size")
        elif base["kinds"][i] == "init" and id(v) in shapes:
            raise GraphMismatch(f"the Parameter {nm} has a shape that follows the size")
    for j, n in enumerate(base["nodes"]):
        ons = [o["nodes"][j] for o in others]
        what = f"op {j} ({n.name}, {n.line or 'no line'})"
        if any(m.op is not n.op or len(m.inputs) != len(n.inputs) for m in ons):
            raise GraphMismatch(f"{what}: another op at the other size")
        p = merge(n.params, [m.params for m in ons], sizes, f"the parameters of {what}")
        if p != n.params or any(isinstance(x, Sym) for x in _leaves(p)):
            params[id(n)] = p
        for i, x in enumerate(n.inputs):
            if isinstance(x, Lit):
                oxs = [m.inputs[i] for m in ons]
                if not all(isinstance(y, Lit) for y in oxs):
                    raise GraphMismatch(f"{what}: a literal is a value at the other size")
                lv = merge(_num(x.value), [_num(y.value) for y in oxs], sizes,
                           f"a literal of {what}")
                if isinstance(lv, Sym):
                    lits[(id(n), i)] = lv
        for k, v in enumerate(n.outputs):
            value(v, [m.outputs[k] for m in ons], f"the result of {what}")
    return shapes, params, lits, kinds


def _filled(a, obs):
    """Every element of a and of the other sizes' arrays is one value (bitwise: -0.0
    and NaN stay what they are), so the array is that value at the symbolic shape."""
    if a.size == 0:
        return False
    one = a.reshape(-1)[:1]
    return all(b.size > 0 and (b.reshape(-1).view(np.uint8).reshape(b.size, -1)
                               == one.view(np.uint8)).all() for b in [a] + obs)


def _num(x):
    return x.item() if isinstance(x, np.generic) else x


def _leaves(p):
    if isinstance(p, tuple) and not isinstance(p, Sym):
        for x in p:
            yield from _leaves(x)
    else:
        yield p


__all__ = ["Exported", "ExportError", "export", "FORMAT_VERSION", "Value"]
