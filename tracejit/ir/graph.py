"""The graph IR: values, nodes and graphs, and how they print.

Sits between tracing (which builds a Graph) and the passes / backends (which read
and rewrite it). A Graph is a list of nodes in topological order; every value has a
static shape and dtype. Guards are ordinary nodes (op `Guard`), kept in order, so a
backend checks them where they stand and stops at the first one that fails.

Printing is deterministic (values are numbered in order of definition), so two
traces of the same code print the same text.
"""
import re

import numpy as np

from tracejit.core import ELEMENTWISE, MOVEMENT, OPAQUE, ShapeDtype


# An input's printed name: an identifier or a Python path to it (model.l1.W, cfg['k']).
_NAME = re.compile(r"[A-Za-z_][\w.]*(\[('[^'\s]*'|-?\d+)\][\w.]*)*$")


class Value:
    """One array in a graph: shape, dtype, and an optional user-facing name."""

    __slots__ = ("shape", "dtype", "name", "graph")

    def __init__(self, shape, dtype, name=None, graph=None):
        self.shape = tuple(shape)
        self.dtype = np.dtype(dtype)
        self.name = name
        self.graph = graph

    @property
    def spec(self):
        return ShapeDtype(self.shape, self.dtype)

    @property
    def ndim(self):
        return len(self.shape)

    @property
    def size(self):
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def nbytes(self):
        return self.size * self.dtype.itemsize

    def __repr__(self):
        return f"Value({self.spec}, name={self.name!r})"


class Lit:
    """A literal constant operand (a Python scalar of a fixed dtype)."""

    __slots__ = ("value", "dtype")

    def __init__(self, value, dtype):
        self.dtype = np.dtype(dtype)
        self.value = self.dtype.type(value)

    shape = ()
    ndim = 0
    size = 1

    @property
    def spec(self):
        return ShapeDtype((), self.dtype)

    def __repr__(self):
        return f"Lit({self.value!r}, {self.dtype})"

    def __eq__(self, other):
        return (isinstance(other, Lit) and self.dtype == other.dtype
                and _same_scalar(self.value, other.value))

    def __hash__(self):
        return hash((self.dtype, float(self.value) if self.dtype.kind in "fc" else self.value))


def _same_scalar(a, b):
    # NaN literals are equal to each other for CSE; -0.0 and 0.0 are not.
    if a != a and b != b:
        return True
    return a == b and np.signbit(a) == np.signbit(b)


class Node:
    """One operation: `outputs = fn(*inputs)`, with fn an instance of `op`.

    `params` are the op's static parameters (hashable), `line` the user's source line
    the op came from ("file.py:12  y = x * 2"), used in printing and in errors.
    """

    __slots__ = ("op", "fn", "params", "inputs", "outputs", "line")

    def __init__(self, fn, inputs, outputs, line=None):
        self.op = type(fn)
        self.fn = fn
        self.params = fn.param_values()
        self.inputs = tuple(inputs)
        self.outputs = tuple(outputs)
        self.line = line

    @property
    def kind(self):
        return getattr(self.op, "kind", OPAQUE)

    @property
    def name(self):
        return getattr(self.fn, "op_name", None) or _snake(self.op.__name__)


    @property
    def out(self):
        return self.outputs[0]

    def __repr__(self):
        return f"Node({self.name}, {len(self.inputs)} in, {len(self.outputs)} out)"


def _snake(name):
    out = []
    for i, c in enumerate(name):
        if c.isupper() and i and not name[i - 1].isupper():
            out.append("_")
        out.append(c.lower())
    return "".join(out)


class Graph:
    """A traced function: inputs, nodes in topological order, outputs."""

    def __init__(self, name="f", inputs=(), nodes=(), outputs=(), input_names=None):
        self.name = name
        self.inputs = list(inputs)
        self.nodes = list(nodes)
        self.outputs = list(outputs)
        self.input_names = list(input_names) if input_names else [None] * len(self.inputs)
        self.source = ""          # generated kernel source, set by a compiling backend
        self.notes = {}           # facts passes and backends report (summary() shows them)
        self.stage = None         # which graph this is, for its header ("forward, optimized")
        # True on the graph passes.run_pipeline returned (not copied by replace: a graph
        # made from it is another graph): passes.optimize returns such a graph as is.
        self.optimized = False
        # Per output, what it is for: "result", "effect" (written back to live state) or
        # "saved" (kept for the backward); None when unknown (a graph built by hand).
        self.output_roles = None

    def replace(self, **changes):
        g = Graph(self.name, self.inputs, self.nodes, self.outputs, self.input_names)
        g.source = self.source
        g.notes = dict(self.notes)
        g.stage = self.stage
        g.output_roles = self.output_roles
        for k, v in changes.items():
            setattr(g, k, list(v) if isinstance(v, (list, tuple)) else v)
        return g

    @property
    def guards(self):
        return [n for n in self.nodes if n.kind == "guard"]

    def producers(self):
        """value -> the node that defines it."""
        return {id(v): n for n in self.nodes for v in n.outputs}

    def users(self):
        """id(value) -> nodes reading it."""
        out = {}
        for n in self.nodes:
            for v in n.inputs:
                if isinstance(v, Value):
                    out.setdefault(id(v), []).append(n)
        return out

    # ------------------------------------------------------------ printing

    def _namer(self):
        names = {}
        counter = [0]
        used = set()

        def name(v):
            if isinstance(v, Lit):
                return _format_lit(v)
            key = id(v)
            if key not in names:
                counter[0] += 1
                base = f"t{counter[0]}"
                names[key] = base
            return names[key]

        for v, n in zip(self.inputs, self.input_names):
            if n and _NAME.match(n) and n not in used:
                names[id(v)] = n
                used.add(n)
        return name

    def __str__(self):
        name = self._namer()
        ins = ", ".join(f"{name(v)}: {v.spec}" for v in self.inputs)
        outs = ", ".join(_spec_str(v) for v in self.outputs)
        lines = [f"graph {self.name}({ins}) -> ({outs})"
                 + (f"    # {self.stage}" if self.stage else "")]
        for n in self.nodes:
            params = _format_params(n)
            args = " ".join(name(v) for v in n.inputs)
            if n.kind == "guard":
                text = f"  guard {n.fn.describe(args)}"
            else:
                lhs = ", ".join(f"{name(v)}: {v.spec}" for v in n.outputs)
                text = f"  {lhs} = {n.name}{params} {args}".rstrip()
            if n.line:
                text = f"{text:<48} # {n.line}"
            lines.append(text)
        ret = "  return " + ", ".join(name(v) for v in self.outputs)
        roles = self._roles()
        notes = [f"{what}: {', '.join(name(v) for v in self.outputs if roles.get(id(v)) == r)}"
                 for r, what in (("effect", "written back"), ("saved", "saved for backward"))
                 if r in roles.values()]
        lines.append(f"{ret:<48} # {'; '.join(notes)}" if notes else ret)
        return "\n".join(lines)

    def _roles(self):
        if not self.output_roles or len(self.output_roles) != len(self.outputs):
            return {}
        out = {}
        for v, r in zip(self.outputs, self.output_roles):
            if isinstance(v, Value):
                out.setdefault(id(v), r)      # a result also saved prints as a result
        return out

    __repr__ = __str__

    def to_dot(self):
        """Graphviz text of what runs: each fused kernel a cluster of its member ops,
        guards as red diamonds with their condition, NumPy calls as boxes, and the
        outputs marked by role (results doubled, saved-for-backward values yellow,
        values written back to live state green)."""
        name = self._namer()
        roles = self._roles()
        out = ["digraph %s {" % _dot_id(self.name), '  node [fontname="monospace"];']
        if self.stage:
            out.append(f'  label="{_q(self.name + ": " + self.stage)}"; labelloc=t;')

        def value(v, indent):
            role = roles.get(id(v))
            label = _q(f"{name(v)}: {v.spec}")
            attrs = ""
            if role == "result":
                attrs = ", peripheries=2"
            elif role == "saved":
                label += "\\nsaved for backward"
                attrs = ", style=filled, fillcolor=lightyellow"
            elif role == "effect":
                label += "\\nwritten back"
                attrs = ", style=filled, fillcolor=palegreen"
            out.append(f'{indent}"{_q(name(v))}" [shape=box, label="{label}"{attrs}];')

        def node(n, nid, indent, in_kernel):
            args = " ".join(name(v) for v in n.inputs)
            if n.kind == "guard":
                attrs = (f'shape=diamond, color=red, label="{_q("guard " + n.fn.describe(args))}"')
            else:
                shape = "ellipse" if in_kernel or n.kind == ELEMENTWISE else "box3d"
                attrs = f'shape={shape}, label="{_q(n.name + _format_params(n))}"'
            if n.line:
                attrs += f', tooltip="{_q(n.line)}"'
            out.append(f"{indent}{nid} [{attrs}];")
            for v in n.inputs:
                if isinstance(v, Value):
                    out.append(f'{indent}"{_q(name(v))}" -> {nid};')
            for v in n.outputs:
                value(v, indent)
                out.append(f'{indent}{nid} -> "{_q(name(v))}";')

        for v in self.inputs:
            value(v, "  ")
        kernel = 0
        for i, n in enumerate(self.nodes):
            sub = getattr(n.fn, "graph", None) if n.kind == "fused" else None
            if sub is None:
                node(n, f"n{i}", "  ", False)
                continue
            kernel += 1
            out.append(f"  subgraph cluster_{i} {{")
            out.append(f'    label="kernel {kernel}: {_q(n.fn.label)}"; style=rounded; '
                       f'color=blue;')
            for j, m in enumerate(sub.nodes):
                node(m, f"n{i}_{j}", "    ", True)
            out.append("  }")
        out.append("}")
        return "\n".join(out)

    def summary(self):
        """Counts a reader and a benchmark care about: ops, kernels, memory."""
        counts = {}
        for n in self.nodes:
            # A fused kernel counts as the ops it computes, a node standing for others
            # (passes/conv_epilogue.py) as those: an optimized graph (what trace()
            # gives) and the traced one count the same ops.
            sub = getattr(n.fn, "graph", None) if n.kind == "fused" else None
            inner = sub.nodes if sub is not None else getattr(n.fn, "replaces", None)
            for m in (inner or (n,)):
                counts[m.name] = counts.get(m.name, 0) + 1
        produced = [v for n in self.nodes if n.kind != "guard" for v in n.outputs]
        out_ids = {id(v) for v in self.outputs}
        info = {
            "nodes": len(self.nodes),
            "guards": len(self.guards),
            "ops": counts,
            "inputs": len(self.inputs),
            "outputs": len(self.outputs),
            "input_bytes": int(sum(v.nbytes for v in self.inputs)),
            "output_bytes": int(sum(v.nbytes for v in self.outputs if isinstance(v, Value))),
            "intermediate_bytes": int(sum(v.nbytes for v in produced if id(v) not in out_ids)),
            "kernels": self.notes.get("kernels", 0),
            "numpy_calls": self.notes.get("numpy_calls", len(
                [n for n in self.nodes if n.kind != "guard"])),
            "materialized": self.notes.get("materialized", len(
                [v for v in produced if id(v) not in out_ids])),
        }
        for k, v in self.notes.items():
            info.setdefault(k, v)
        return Summary(info)


class Summary(dict):
    def __str__(self):
        ops = ", ".join(f"{k} x{v}" for k, v in sorted(self["ops"].items()))
        rest = "\n".join(f"  {k}: {v}" for k, v in self.items() if k != "ops")
        return f"ops: {ops}\n{rest}"


def _spec_str(v):
    return str(v.spec)


def _format_lit(v):
    x = v.value
    if v.dtype.kind == "b":
        return str(bool(x))
    if v.dtype.kind in "iu":
        return str(int(x))
    return repr(float(x))


def _format_params(n):
    if not n.params or n.kind == "guard":
        return ""
    parts = []
    for name, val in zip(n.op.params, n.params):
        parts.append(f"{name}={_short(val)}")
    return "[" + ", ".join(parts) + "]"


def _short(val):
    if isinstance(val, tuple) and len(val) > 8:
        return f"({', '.join(map(repr, val[:6]))}, ...)"
    if callable(val):
        return getattr(val, "__name__", repr(val))
    return repr(val)


def _q(text):
    return str(text).replace("\\", "\\\\").replace('"', '\\"')


def _dot_id(name):
    return "".join(c if c.isalnum() else "_" for c in name) or "g"


def check(g):
    """Verify single assignment, topological order and types (run after passes in tests)."""
    defined = {id(v) for v in g.inputs}
    for i, n in enumerate(g.nodes):
        for v in n.inputs:
            if isinstance(v, Value) and id(v) not in defined:
                raise AssertionError(f"node {i} ({n.name}) reads an undefined value {v}")
        for v in n.outputs:
            if id(v) in defined:
                raise AssertionError(f"node {i} ({n.name}) redefines a value {v}")
            defined.add(id(v))
        if n.kind in (ELEMENTWISE,) and n.outputs:
            try:
                spec = n.fn.shape_rule(*[v.spec for v in n.inputs])
            except Exception as e:  # noqa: BLE001 - report, not hide
                raise AssertionError(f"node {i} ({n.name}): shape rule failed: {e}") from e
            if spec.shape != n.out.shape or spec.dtype != n.out.dtype:
                raise AssertionError(f"node {i} ({n.name}) has {n.out.spec}, shape rule "
                                     f"says {spec}")
        if n.kind == "fused":
            _check_fused(i, n)
    for v in g.outputs:
        if isinstance(v, Value) and id(v) not in defined:
            raise AssertionError(f"output {v} is not defined")
    return True


def _check_fused(i, n):
    """A fused group's kernel writes an elementwise or movement output at the loop
    index: it must have the iteration shape (else the loop writes past its end). A
    0-d one is an epilogue's (mean = sum / n), written once after the loops."""
    sub = n.fn.graph
    check(sub)
    producer = {id(v): m for m in sub.nodes for v in m.outputs}
    for v in n.outputs:
        m = producer.get(id(v))
        if m is not None and m.kind in (ELEMENTWISE, MOVEMENT) and v.shape != () \
                and tuple(v.shape) != tuple(n.fn.shape):
            raise AssertionError(f"node {i} ({n.name}) writes {v} ({m.name}) of another "
                                 f"shape than its iteration shape {n.fn.shape}")
