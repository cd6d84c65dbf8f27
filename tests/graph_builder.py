"""Hand-built IR graphs for tests of passes, codegen and remat:
b.op(F.Tanh(), x) appends a node and returns its (first) output."""
import numpy as np

from tracejit.ir import Graph, Node, Value
from tracejit.ops.trace_only import Guard


class Builder:
    def __init__(self):
        self.inputs, self.nodes = [], []

    def input(self, shape, dtype=np.float64):
        v = Value(shape, dtype)
        self.inputs.append(v)
        return v

    def op(self, fn, *ins):
        spec = fn.shape_rule(*[v.spec for v in ins])
        specs = spec if isinstance(spec, tuple) else (spec,)
        outs = [Value(s.shape, s.dtype) for s in specs]
        self.nodes.append(Node(fn, ins, outs))
        return outs[0]

    def guard(self, v, conv="bool", expected=True):
        self.nodes.append(Node(Guard(conv, expected), [v], []))

    def graph(self, *outs):
        return Graph("g", self.inputs, self.nodes, outs)
