"""Simplifying passes, Graph -> Graph: dead code, common subexpressions, constants.

Each returns a new Graph whose nodes are the old Node objects (or new ones) and whose
values keep their identity. Impure nodes (random draws, opaque calls, guards) are never
dropped, merged, folded or reordered against each other.
"""
import numpy as np

from tracejit.core import ELEMENTWISE, OPAQUE, RANDOM
from tracejit.ir import Lit, Node, Value
from tracejit.ops.trace_only import GUARD
from tracejit.passes.fusion import _IMPURE, FUSED


# ---------------------------------------------------------------- dead code

def _roots_kind(n):
    return n.kind in (GUARD, RANDOM) or (n.kind == OPAQUE and not n.outputs)


def eliminate_dead_code(g):
    """Drop nodes that no output, guard or random draw reads.

    Guard inputs are roots: dropping them would let a variant run without checking
    the condition it was traced under. Random draws are roots: dropping one would
    shift every later draw of NumPy's global stream.
    """
    live = {id(v) for v in g.outputs if isinstance(v, Value)}
    keep = []
    for n in reversed(g.nodes):
        if _roots_kind(n) or any(id(v) in live for v in n.outputs):
            keep.append(n)
            live.update(id(v) for v in n.inputs if isinstance(v, Value))
    keep.reverse()
    return g.replace(nodes=keep)


# ---------------------------------------------------------------- CSE

def _substitute(n, subst):
    """n with its inputs renamed through subst (a new Node only if something changed)."""
    if not any(isinstance(v, Value) and id(v) in subst for v in n.inputs):
        return n
    ins = [subst.get(id(v), v) if isinstance(v, Value) else v for v in n.inputs]
    m = Node(n.fn, ins, n.outputs, n.line)
    return m


def _finish(g, nodes, subst):
    outs = [subst.get(id(v), v) if isinstance(v, Value) else v for v in g.outputs]
    return g.replace(nodes=nodes, outputs=outs)


def eliminate_common_subexpressions(g):
    """Merge nodes with the same op, parameters and inputs (pure ops only)."""
    seen = {}
    subst = {}
    nodes = []
    for n in g.nodes:
        n = _substitute(n, subst)
        if n.kind in _IMPURE or n.kind in (FUSED, "constant") or not n.outputs:
            nodes.append(n)
            continue
        try:
            key = (n.op, n.params,
                   tuple(("v", id(v)) if isinstance(v, Value) else ("l", v) for v in n.inputs),
                   tuple((v.shape, v.dtype) for v in n.outputs))
            hash(key)
        except TypeError:          # unhashable parameters: leave the node alone
            nodes.append(n)
            continue
        prev = seen.get(key)
        if prev is None:
            seen[key] = n
            nodes.append(n)
        else:
            for old, new in zip(n.outputs, prev.outputs):
                subst[id(old)] = new
    return _finish(g, nodes, subst)


# ---------------------------------------------------------------- constants

def fold_constants(g):
    """Evaluate elementwise nodes whose inputs are all literals, with their own forward.

    The result is NumPy's, NaN and inf included. A folded value that a guard reads
    stays a node: guards read values, and the guard numbering must not change.
    """
    guard_reads = {id(v) for n in g.nodes if n.kind == GUARD for v in n.inputs}
    subst = {}
    nodes = []
    for n in g.nodes:
        n = _substitute(n, subst)
        if (n.kind == ELEMENTWISE and n.inputs and len(n.outputs) == 1
                and all(isinstance(v, Lit) for v in n.inputs)
                and n.out.shape == () and id(n.out) not in guard_reads):
            try:
                with np.errstate(all="ignore"):
                    y = np.asarray(n.fn.forward(*[np.asarray(v.value, v.dtype)
                                                  for v in n.inputs]))
            except Exception:  # noqa: BLE001 - leave it to run (and fail) at run time
                nodes.append(n)
                continue
            if y.shape == () and y.dtype == n.out.dtype:
                subst[id(n.out)] = Lit(y[()], y.dtype)
                continue
        nodes.append(n)
    return _finish(g, nodes, subst)

