"""Symbolic dimensions: what of an exported graph changes with a dimension named in
`dynamic`, found by tracing again at other sizes and comparing the graphs.

A traced graph has static shapes; a dimension named dynamic ("batch") must not be
baked into it. Tracing the function once more per symbol, at another size, tells
which shapes, shape parameters (reshape targets, sum_to shapes, slice bounds) and
literals (a mean's 1/N) follow the symbol: each must be `coef * product of symbols`
at both sizes, else export refuses (the graph depends on the size in another way,
x[1:] - x[:-1] with a dynamic axis: its length is N - 1).
"""
import numpy as np

from tracejit.ir import Lit, Node


class Sym(tuple):
    """coef * the product of the named symbols (a dimension, a shape parameter or a
    literal that follows a dynamic dimension)."""

    def __new__(cls, coef, names):
        return super().__new__(cls, (coef, tuple(sorted(names))))

    coef = property(lambda self: self[0])
    names = property(lambda self: self[1])

    def value(self, sizes):
        out = self.coef
        for n in self.names:
            out = out * sizes[n]
        return out

    def __str__(self):
        parts = ([] if self.coef == 1 else [repr(self.coef)]) + list(self.names)
        return "*".join(parts)

    __repr__ = __str__


class GraphMismatch(ValueError):
    pass


def substitute(obj, sizes):
    """obj (a param, a shape) with each Sym replaced by its value at `sizes`."""
    if isinstance(obj, Sym):
        return obj.value(sizes)
    if isinstance(obj, tuple):
        return type(obj)(substitute(x, sizes) for x in obj) if type(obj) is not tuple \
            else tuple(substitute(x, sizes) for x in obj)
    return obj


def _is_int(x):
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def merge(base, others, sizes, what):
    """base (from the example trace) against its counterparts in the other traces
    (one per symbol, `sizes` = [(name, example size, other size)]): base where they
    agree, a Sym where a number follows symbols; GraphMismatch otherwise."""
    if all(_same(base, o) for o in others):
        return base
    num = (float, np.floating) if isinstance(base, (float, np.floating)) else ()
    if (_is_int(base) or num) and all(_is_int(o) or isinstance(o, num or int)
                                      for o in others):
        names, denom = [], 1
        for (name, a, b), o in zip(sizes, others):
            if _same(o, base):
                continue
            if o * a != base * b:
                raise GraphMismatch(f"{what} is {base} at {name}={a} and {o} at "
                                    f"{name}={b}: not a multiple of {name}")
            names.append(name)
            denom *= a
        if _is_int(base):
            if base % denom:
                raise GraphMismatch(f"{what} ({base}) is not a multiple of "
                                    f"{'*'.join(names)}")
            return Sym(int(base) // denom, names)
        return Sym(float(base) / denom, names)
    if isinstance(base, tuple) and all(isinstance(o, tuple) and type(o) is type(base)
                                       and len(o) == len(base) for o in others):
        items = [merge(x, [o[i] for o in others], sizes, what) for i, x in enumerate(base)]
        return type(base)(items) if type(base) is not tuple else tuple(items)
    raise GraphMismatch(f"{what} differs between sizes: {base!r} vs "
                        f"{', '.join(repr(o) for o in others)}")


def _same(a, b):
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return False
    try:
        if isinstance(a, float) and isinstance(b, float) and a != a and b != b:
            return True
        return type(a) is type(b) and bool(a == b)
    except Exception:  # noqa: BLE001 - incomparable params: not the same
        return False


def flatten(graph):
    """graph's nodes with every fused group (and every node standing for others, its
    `replaces`) inlined back into its member ops (new Node objects; Values are the
    graph's own): the op-level graph that ONNX and a saved file hold, independent of
    fusion's (size-dependent) grouping."""
    alias = {}

    def res(v):
        while not isinstance(v, Lit) and id(v) in alias:
            v = alias[id(v)]
        return v

    out = []

    def walk(nodes):
        for n in nodes:
            if getattr(n.fn, "replaces", None):
                # A node a pass put in place of op-level nodes (ops/conv_fused.py): the
                # same values, computed by those nodes.
                walk(n.fn.replaces)
                continue
            sub = getattr(n.fn, "graph", None) if n.kind == "fused" else None
            if sub is None:
                m = Node(n.fn, [res(v) for v in n.inputs], n.outputs, n.line)
                out.append(m)
                continue
            for si, v in zip(sub.inputs, n.inputs):
                if si is not v:
                    alias[id(si)] = v
            walk(sub.nodes)
            for so, v in zip(sub.outputs, n.outputs):
                if so is not v:
                    alias[id(v)] = so
    walk(graph.nodes)
    return out, res
