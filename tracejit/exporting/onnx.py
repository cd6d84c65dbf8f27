"""Exported.to_onnx: the exported graph as an ONNX model (standard operators only).

Each op lowers itself: its class's `to_onnx(b, node)` facet (ops/primitive.py; plain
elementwise ops just declare `onnx_op`) calls the builder `b` below, which knows
ONNX's names, dtypes and the symbolic dimensions. A shape an op needs (a reshape's
target, a sum_to's, a scatter's zeros) is computed in the model from its inputs'
shapes where it follows a dynamic dimension, so the model runs at any batch size.
Operands are cast to the dtype NumPy computes in (ONNX has no type promotion).
"""
import numpy as np

from tracejit.exporting.exported import ExportError
from tracejit.exporting.symbolic import Sym
from tracejit.ir import Lit

DEFAULT_OPSET = 18  # (18: ScatterElements' reduction "max", item assignment's repeats)
MIN_OPSET = 16       # ScatterElements with reduction="add" (the gradient of indexing)
INT64_MAX = np.iinfo(np.int64).max
INT64_MIN = np.iinfo(np.int64).min


def _import_onnx():
    try:
        import onnx
        from onnx import helper, numpy_helper
    except ImportError:
        raise ImportError("Exported.to_onnx needs the onnx package: pip install "
                          "'tracejit[onnx]' (onnx, and onnxruntime to run the model)") from None
    return onnx, helper, numpy_helper


class Builder:
    """What an op's to_onnx facet calls: operands, ops, constants, shapes."""

    def __init__(self, ex, opset):
        self.onnx, self.helper, self.numpy_helper = _import_onnx()
        self.ex = ex
        self.opset = opset
        self.nodes = []
        self.initializers = []
        self.names = {}           # id(Value) -> ONNX tensor name
        self.counter = 0
        self.sym_source = {}      # symbol -> (ONNX input name, axis)
        self._cache = {}
        self.reserved = set(ex.input_names) | set(ex.output_names) | {"traced_path"}
        self.conds = []           # the current path's guard conditions (guard_holds)
        # Initializer name -> its array: a later path's same constant shares it.
        self.declared = {}
        self.paths_first = ex     # b.ex while no path's node is lowered (_if_tree)

    # ---- names and ops

    def fresh(self, hint="t"):
        # Never one of the model's own input, initializer or output names.
        while True:
            self.counter += 1
            name = f"{hint}_{self.counter}"
            if name not in self.reserved:
                return name

    def op(self, op_type, inputs, n_out=1, **attrs):
        """Append an ONNX node; its output name (a list of them if n_out > 1)."""
        outs = [self.fresh(op_type.lower()) for _ in range(n_out)]
        self.nodes.append(self.helper.make_node(op_type, list(inputs), outs, **attrs))
        return outs if n_out > 1 else outs[0]

    def const(self, array, hint="c"):
        array = np.asarray(array)
        key = (array.dtype.str, array.shape, array.tobytes())
        if key not in self._cache:
            name = self.fresh(hint)
            self.initializers.append(self.numpy_helper.from_array(array, name))
            self._cache[key] = name
        return self._cache[key]

    def ints(self, values):
        return self.const(np.array(list(values), np.int64), "ints")

    def elem_type(self, dtype):
        try:
            return self.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
        except (KeyError, ValueError, TypeError):
            raise ExportError(f"to_onnx: ONNX has no dtype {np.dtype(dtype).name}") from None

    def cast(self, name, from_dtype, to_dtype):
        if np.dtype(from_dtype) == np.dtype(to_dtype):
            return name
        return self.op("Cast", [name], to=self.elem_type(to_dtype))

    def unsupported(self, node, why=None):
        return ExportError(f"to_onnx: op {node.name} ({node.line or 'no line'}) has no "
                           f"ONNX lowering{': ' + why if why else ''}")

    # ---- operands and results

    def x(self, node, i, dtype=None):
        """Operand i of node as an ONNX name, cast to `dtype` when given."""
        v = node.inputs[i]
        if isinstance(v, Lit):
            want = np.dtype(dtype or v.dtype)
            value = self.ex.lit(node, i)
            if isinstance(value, Sym):
                return self.scalar_of(value, want)
            return self.const(np.array(value, dtype=v.dtype).astype(want), "lit")
        name = self.names[id(v)]
        return self.cast(name, v.dtype, dtype) if dtype is not None else name

    def bind(self, node, name, k=0, dtype=None):
        """Output k of node is `name` (of `dtype`, cast to the output's dtype)."""
        v = node.outputs[k]
        self.names[id(v)] = self.cast(name, dtype, v.dtype) if dtype is not None else name

    @staticmethod
    def is_lit(v):
        return isinstance(v, Lit)

    def params(self, node):
        """node's params, a Sym where one follows a dynamic dimension."""
        return self.ex.node_params(node)

    def dims(self, v):
        return tuple(self.ex.shape_of(v))

    # ---- shapes

    def sym_dim(self, name):
        """A 1-element int64 tensor holding symbol `name`'s size."""
        key = ("sym", name)
        if key not in self._cache:
            src, axis = self.sym_source[name]
            shape = self.op("Shape", [src])
            self._cache[key] = self.op("Gather", [shape, self.ints([axis])], axis=0)
        return self._cache[key]

    def shape(self, dims):
        """dims (ints and Syms) as a 1-D int64 tensor, computed from the inputs' shapes
        where a dim follows a dynamic dimension."""
        dims = list(dims)
        if not any(isinstance(d, Sym) for d in dims):
            return self.ints([int(d) for d in dims])
        parts = []
        for d in dims:
            if isinstance(d, Sym):
                t = None
                for n in d.names:
                    s = self.sym_dim(n)
                    t = s if t is None else self.op("Mul", [t, s])
                if d.coef != 1:
                    t = self.op("Mul", [t, self.ints([int(d.coef)])])
                parts.append(t)
            else:
                parts.append(self.ints([int(d)]))
        return self.op("Concat", parts, axis=0)

    def scalar_of(self, sym, dtype):
        """A 0-d tensor of dtype holding sym's value (a literal such as a mean's N)."""
        t = self.shape([Sym(1, sym.names)])
        t = self.op("Reshape", [t, self.ints([])])
        t = self.cast(t, np.int64, dtype)
        if sym.coef != 1:
            t = self.op("Mul", [t, self.const(np.array(sym.coef, dtype))])
        return t

    # ---- helpers the op facets share

    def guard_holds(self, node, conv, expected):
        """A guard's `conv(x) == expected` as a bool scalar, collected in self.conds."""
        if conv == "shape":
            raise self.unsupported(node, "a guard on the shape of a NumPy call's result "
                                         "(one that depends on the data)")
        x = self.op("Reshape", [self.x(node, 0), self.ints([])])    # one element
        dt = node.inputs[0].dtype
        if conv == "bool":
            t = self.cast(x, dt, np.bool_)
            holds = t if expected else self.op("Not", [t])
        elif conv in ("int", "index"):
            # int() truncates toward zero, as ONNX's Cast from a float does.
            t = self.cast(x, dt, np.int64)
            holds = self.op("Equal", [t, self.const(np.array(int(expected), np.int64))])
        else:
            t = self.cast(x, dt, np.float64)
            e = float(expected)
            holds = self.op("IsNaN", [t]) if e != e else \
                self.op("Equal", [t, self.const(np.array(e, np.float64))])
        self.conds.append(holds)

    def elementwise(self, node, op_type, operand_dtype=None, **attrs):
        """op_type on all operands cast to operand_dtype (default: the result's dtype,
        as NumPy computes), the result cast to the node's dtype."""
        dt = np.dtype(operand_dtype or node.out.dtype)
        ins = [self.x(node, i, dt) for i in range(len(node.inputs))]
        out = self.op(op_type, ins, **attrs)
        result_dtype = np.bool_ if op_type in _BOOL_OPS else dt
        self.bind(node, out, dtype=result_dtype)

    def reduce(self, name, op_type, axes, keepdims):
        """op_type (ReduceSum, ReduceMax, ...) of tensor `name` over `axes`."""
        if not axes:
            return self.op("Identity", [name])
        if op_type == "ReduceSum" or self.opset >= 18:
            return self.op(op_type, [name, self.ints(axes)], keepdims=int(keepdims))
        return self.op(op_type, [name], axes=list(axes), keepdims=int(keepdims))


_BOOL_OPS = {"Greater", "Less", "Equal", "GreaterOrEqual", "LessOrEqual", "Not", "And",
             "Or", "Xor"}


def to_onnx(ex, path=None, opset=None):
    """The ONNX ModelProto of `ex` (written to path if given)."""
    onnx, helper, numpy_helper = _import_onnx()
    opset = DEFAULT_OPSET if opset is None else int(opset)
    latest = onnx.defs.onnx_opset_version()
    if not MIN_OPSET <= opset <= latest:
        raise ValueError(f"to_onnx: opset {opset} is outside {MIN_OPSET}..{latest} (the "
                         f"installed onnx's newest)")
    if ex.guards and not ex.paths:
        lines = "; ".join(f"guard {t} at {line}" for t, line in ex.guards)
        raise ExportError(f"to_onnx: {ex.name} was exported with its guards ({lines}); "
                          f"ONNX export of guarded graphs (If nodes) is not supported")
    b = Builder(ex, opset)
    paths = ex.paths or [ex]
    graph_inputs = _declare_inputs(b, ex)
    for k, p in enumerate(paths[1:], 1):
        _declare_inputs(b, p, prefix=f"path{k}.")
    if len(paths) == 1:
        _lower(b, ex.nodes)
        outs = [_output_name(b, o) for o in ex.outputs]
        names, dims_of = ex.output_names, [_dims_of(ex, o) for o in ex.outputs]
    else:
        outs = _if_tree(b, paths)
        names = ex.output_names + ["traced_path"]
        dims_of = [_common_dims([_dims_of(p, p.outputs[j]) for p in paths])
                   for j in range(len(ex.outputs))] + [()]
    dtypes = [o.dtype for o in ex.outputs] + ([np.bool_] if len(paths) > 1 else [])
    outputs = []
    for src, nm, dims, dt in zip(outs, names, dims_of, dtypes):
        b.nodes.append(helper.make_node("Identity", [src], [nm]))
        outputs.append(helper.make_tensor_value_info(nm, b.elem_type(dt),
                                                     [_dim(d) for d in dims]))
    # A Parameter the function reads but no op needs (dead code) is no initializer: ONNX
    # Runtime warns about unused ones.
    used = _used_names(b.nodes)
    inits = [t for t in b.initializers if t.name in used]
    graph = helper.make_graph(b.nodes, ex.name, graph_inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                              producer_name="tracejit")
    # ONNX Runtime reads IR versions up to the one its release knows; the oldest one
    # that has this opset keeps the model loadable by older runtimes too.
    model.ir_version = min(model.ir_version, 8 if opset <= 18 else model.ir_version)
    onnx.checker.check_model(model, full_check=True)
    if path is not None:
        onnx.save(model, str(path))
    return model


def _used_names(nodes):
    out = set()
    for n in nodes:
        out.update(n.input)
        for a in n.attribute:
            if a.g is not None:
                out |= _used_names(a.g.node)
    return out


def _common_dims(all_dims):
    """The dims the paths agree on; None (unknown) where they differ."""
    first = all_dims[0]
    if any(len(d) != len(first) for d in all_dims):
        raise ExportError("to_onnx: the paths' outputs have different ranks")
    return tuple(d if all(str(e[i]) == str(d) for e in all_dims) else None
                 for i, d in enumerate(first))


def _dims_of(ex, o):
    return () if isinstance(o, Lit) else ex.shape_of(o)


def _output_name(b, o):
    return b.const(np.array(o.value, o.dtype)) if isinstance(o, Lit) else b.names[id(o)]


def _declare_inputs(b, ex, prefix=""):
    """Names of ex's inputs; the model's inputs (value infos) and initializers. A later
    path (prefix) shares the first's inputs and Parameters, its constants are its own."""
    helper, numpy_helper = b.helper, b.numpy_helper
    graph_inputs = []
    for v, kind, nm in zip(ex.inputs, ex.input_kinds, ex.input_names):
        b.names[id(v)] = nm
        if kind == "input":
            dims = ex.shape_of(v)
            graph_inputs.append(helper.make_tensor_value_info(
                nm, b.elem_type(v.dtype), [_dim(d) for d in dims]))
            for axis, d in enumerate(dims):
                if isinstance(d, Sym) and d.coef == 1 and len(d.names) == 1:
                    b.sym_source.setdefault(d.names[0], (nm, axis))
        elif kind == "init" and prefix and nm in b.declared:
            pass                          # the same Parameter as the first path's
        elif kind == "const" and prefix and nm in b.declared and \
                _same_param(np.asarray(b.declared[nm]), np.asarray(ex.arrays[nm])):
            pass                          # the same constant as the first path's
        elif kind not in ("range", "fill"):
            b.names[id(v)] = prefix + nm
            b.declared[prefix + nm] = ex.arrays[nm]
            b.initializers.append(numpy_helper.from_array(
                np.array(ex.arrays[nm], order="C"), prefix + nm))
    for v, kind, nm in zip(ex.inputs, ex.input_kinds, ex.input_names):
        if kind == "range":
            n = b.op("Reshape", [b.shape(ex.shape_of(v)[:1]), b.ints([])])
            r = b.op("Range", [b.const(np.array(0, np.int64)), n,
                               b.const(np.array(1, np.int64))])
            b.names[id(v)] = b.cast(r, np.int64, v.dtype)
        elif kind == "fill":            # one value, expanded to the symbolic shape
            one = np.array(ex.arrays[nm].reshape(-1)[0], v.dtype)
            b.names[id(v)] = b.op("Expand", [b.const(one), b.shape(ex.shape_of(v))])
    return graph_inputs


def _lower(b, nodes):
    for n in nodes:
        lower = getattr(n.fn, "to_onnx", None)
        if lower is None:
            raise b.unsupported(n, "no to_onnx facet (a NumPy call or user Function the "
                                   "tracer kept as is, or an op not lowered yet)")
        lower(b, n)


def _if_tree(b, paths):
    """The paths as a tree of If nodes. Paths agree op for op up to a guard whose
    outcome tells them apart: the ops before it are lowered once, in the enclosing
    graph (the first guard's: the main graph), and each outcome gets an If whose
    then-branch holds only the ops of the paths with that outcome, so only the taken
    path's ops run (a branch reads the enclosing graph's values by name). The last
    else gives zeros and traced_path False: the inputs took no traced path."""
    for name in b.sym_source:
        b.sym_dim(name)                   # in the main graph: every branch sees them
    first = paths[0]
    dims = [_common_dims([_dims_of(p, p.outputs[j]) for p in paths])
            for j in range(len(first.outputs))] + [()]
    dtypes = [o.dtype for o in first.outputs] + [np.bool_]
    orders = [_guards_first(p.nodes) for p in paths]
    return _branch(b, paths, orders, list(range(len(paths))), 0, (dims, dtypes))


def _guards_first(nodes):
    """nodes with each guard moved up to just after the ops it depends on (the
    optimized graph may schedule a branch's ops before the guard that selects it),
    the rest in their order: only a guard's own inputs run before it decides."""
    producer = {id(o): n for n in nodes for o in n.outputs}
    out, done = [], set()

    def emit_with_inputs(n):
        stack, need = [n], []
        while stack:
            m = stack.pop()
            if id(m) in done or m in need:
                continue
            need.append(m)
            stack.extend(producer[id(v)] for v in m.inputs if id(v) in producer)
        pos = {id(m): i for i, m in enumerate(nodes)}
        for m in sorted(need, key=lambda m: pos[id(m)]):
            done.add(id(m))
            out.append(m)

    for n in nodes:
        if n.kind == "guard":
            emit_with_inputs(n)
    for n in nodes:
        if id(n) not in done:
            done.add(id(n))
            out.append(n)
    return out


def _lower_as(b, p, node):
    # A node of path p: its symbolic shapes, params and literals are p's.
    b.ex = p
    try:
        _lower(b, [node])
    finally:
        b.ex = b.paths_first


def _branch(b, paths, orders, group, i, specs):
    """Lower the nodes from position i on of the paths in `group` (which agree on every
    node before i) into b.nodes; the names of their outputs and of the flag."""
    while True:
        ended = [i >= len(orders[k]) for k in group]
        if all(ended):
            p = paths[group[0]]
            return [_output_name(b, o) for o in p.outputs] + [b.const(np.array(True))]
        nodes = [orders[k][i] if i < len(orders[k]) else None for k in group]
        if any(ended) or any(n.kind != nodes[0].kind for n in nodes[1:]):
            raise _diverged(paths, group, i)
        if nodes[0].kind == "guard":
            break
        p0, n0 = paths[group[0]], nodes[0]
        for k, n in zip(group[1:], nodes[1:]):
            if not _same_node(b, p0, n0, paths[k], n):
                raise _diverged(paths, group, i)
        _lower_as(b, p0, n0)
        for n in nodes[1:]:               # the same op in the other paths: its names
            for o0, o in zip(n0.outputs, n.outputs):
                b.names[id(o)] = b.names[id(o0)]
        i += 1
    # A guard: the group's paths by its outcome, each outcome an If on whether it holds.
    outcomes = {}
    for k, n in zip(group, nodes):
        if n.params[0] != nodes[0].params[0] or _operand(b, paths[k], n, 0) != \
                _operand(b, paths[group[0]], nodes[0], 0):
            raise _diverged(paths, group, i)
        outcomes.setdefault(_outcome_key(n.params), []).append(k)
    parts = [(ks, None) for ks in outcomes.values()]
    # A bool guard whose two outcomes were both traced: one If, the second outcome its
    # else (no test for it, no zeros branch).
    both = nodes[0].params[0] == "bool" and {k[1] for k in outcomes} == {True, False}
    for j, (ks, _) in enumerate(parts[:-1] if both else parts):
        b.conds = []
        _lower_as(b, paths[ks[0]], orders[ks[0]][i])
        parts[j] = (ks, b.conds[0])
    if both:
        saved, b.nodes = b.nodes, []
        else_graph = _subgraph(b, _branch(b, paths, orders, parts[-1][0], i + 1, specs),
                               specs)
        b.nodes = saved
        parts = parts[:-1]
    else:
        else_graph = _none_graph(b, paths[group[0]], specs)
    for j in range(len(parts) - 1, -1, -1):
        ks, cond = parts[j]
        saved, b.nodes = b.nodes, []
        then_graph = _subgraph(b, _branch(b, paths, orders, ks, i + 1, specs), specs)
        b.nodes = saved
        outs = [b.fresh("if") for _ in specs[0]]
        node = b.helper.make_node("If", [cond], outs, then_branch=then_graph,
                                  else_branch=else_graph)
        if j == 0:
            b.nodes.append(node)
            return outs
        else_graph = _wrap_graph(b, [node], outs, specs)


def _none_graph(b, p, specs):
    """The last else: zeros of the outputs' shapes (p's), and traced_path False."""
    saved, b.nodes = b.nodes, []
    b.ex = p
    zeros = [b.op("Expand", [b.const(np.zeros((), o.dtype)), b.shape(_dims_of(p, o))])
             for o in p.outputs]
    b.ex = b.paths_first
    graph = _subgraph(b, zeros + [b.const(np.array(False))], specs)
    b.nodes = saved
    return graph


def _outcome_key(params):
    conv, expected = params
    # NaN == NaN as a guard's outcome (Guard.holds).
    return conv, "nan" if isinstance(expected, float) and expected != expected else expected


def _operand(b, p, n, i):
    """What input i of node n of path p is: an ONNX name, or a literal's value."""
    v = n.inputs[i]
    if isinstance(v, Lit):
        return ("lit", str(v.dtype), repr(p.lit(n, i)))
    return b.names.get(id(v))


def _same_node(b, p0, n0, p, n):
    """Is node n of path p the op node n0 of path p0 computes (same op, parameters,
    operands, result types)?"""
    if n.op is not n0.op or len(n.inputs) != len(n0.inputs) or \
            len(n.outputs) != len(n0.outputs):
        return False
    if not _same_param(p0.node_params(n0), p.node_params(n)):
        return False
    if any(_operand(b, p0, n0, i) != _operand(b, p, n, i) or _operand(b, p, n, i) is None
           for i in range(len(n.inputs))):
        return False
    return all(o.dtype == o0.dtype and str(_dims_of(p, o)) == str(_dims_of(p0, o0))
               for o, o0 in zip(n.outputs, n0.outputs))


def _same_param(a, c):
    if isinstance(a, np.ndarray) or isinstance(c, np.ndarray):
        return isinstance(a, np.ndarray) and isinstance(c, np.ndarray) and \
            a.dtype == c.dtype and np.array_equal(a, c)
    if isinstance(a, (tuple, list)) and not isinstance(a, Sym):
        return type(a) is type(c) and len(a) == len(c) and \
            all(_same_param(x, y) for x, y in zip(a, c))
    try:
        return type(a) is type(c) and bool(a == c)
    except Exception:  # noqa: BLE001 - an object without a plain ==: not the same
        return a is c


def _diverged(paths, group, i):
    return ExportError(f"to_onnx: the traced paths {', '.join(str(k) for k in group)} "
                       f"differ at op {i} without a guard between them (internal error)")


def _subgraph(b, srcs, specs):
    # A branch's outputs: fresh names (a branch may return an outer value or a
    # constant, which a graph output cannot be directly).
    outs = [b.fresh("out") for _ in srcs]
    nodes = b.nodes + [b.helper.make_node("Identity", [s], [o]) for s, o in zip(srcs, outs)]
    return _wrap_graph(b, nodes, outs, specs)


def _wrap_graph(b, nodes, outs, specs):
    dims, dtypes = specs
    infos = [b.helper.make_tensor_value_info(o, b.elem_type(dt), [_dim(x) for x in d])
             for o, dt, d in zip(outs, dtypes, dims)]
    return b.helper.make_graph(nodes, b.fresh("branch"), [], infos)


def _dim(d):
    return None if d is None else str(d) if isinstance(d, Sym) else int(d)
