"""The `interpret` backend: run a Graph with each primitive's own NumPy forward.

It is the reference the numba backend is tested against, the fallback for nodes
codegen does not cover, and (with `run_with_variables`) how create_graph works
through a compiled region. A backend's contract: `compile(graph)` returns a callable
taking the list of input arrays (in graph.inputs order) and returning the list of
output arrays (graph.outputs order), or raising GuardFailure at the first guard that
does not hold. Outputs are fresh arrays the caller may keep and write.
"""
import numpy as np

from tracejit.ir import Lit
from tracejit.trace_ops import GUARD, GuardFailure


class NodeError(Exception):
    pass


def _slots(g):
    """Number every value: inputs first, then node outputs, in order."""
    slot = {}
    for v in g.inputs:
        slot[id(v)] = len(slot)
    for n in g.nodes:
        for v in n.outputs:
            slot[id(v)] = len(slot)
    return slot


def compile(g):
    slot = _slots(g)
    n_inputs = len(g.inputs)
    size = len(slot)
    steps = []
    guard_index = 0
    for n in g.nodes:
        reads = tuple(slot[id(v)] if not isinstance(v, Lit) else v for v in n.inputs)
        lits = tuple(isinstance(v, Lit) for v in n.inputs)
        if n.kind == GUARD:
            steps.append((GUARD, n.fn, reads, guard_index, n))
            guard_index += 1
        else:
            writes = tuple(slot[id(v)] for v in n.outputs)
            steps.append((None, n.fn.forward, reads, writes, n, any(lits)))
    out_slots = [(slot[id(v)] if not isinstance(v, Lit) else v) for v in g.outputs]

    def run(arrays):
        if len(arrays) != n_inputs:
            raise ValueError(f"graph {g.name} takes {n_inputs} inputs, got {len(arrays)}")
        env = list(arrays) + [None] * (size - n_inputs)
        for step in steps:
            if step[0] is GUARD:
                _, fn, reads, index, n = step
                x = env[reads[0]]
                if not fn.holds(x):
                    raise GuardFailure(index, fn.outcome(x))
                continue
            _, forward, reads, writes, n, has_lit = step
            if has_lit:
                xs = [r.value if isinstance(r, Lit) else env[r] for r in reads]
            else:
                xs = [env[r] for r in reads]
            try:
                ys = forward(*xs)
            except Exception as e:
                raise NodeError(f"{n.name} failed at {n.line or '?'}: {e}") from e
            if len(writes) == 1:
                y = ys if not isinstance(ys, tuple) else ys[0]
                # NumPy reductions give scalars; results are always arrays.
                env[writes[0]] = y if type(y) is np.ndarray else np.asarray(y)
            else:
                for w, y in zip(writes, ys):
                    env[w] = y if type(y) is np.ndarray else np.asarray(y)
        return [(np.asarray(o.value) if isinstance(o, Lit) else env[o]) for o in out_slots]

    return run


def run_with_variables(g, variables):
    """Replay g on Variables through the primitives: a differentiable (eager) graph.

    Used for create_graph=True through a compiled region: the result carries the
    autodiff history that higher-order derivatives need. Guards are not checked
    (the variant already passed them).
    """
    from tracejit.core import Constant, as_variable
    env = {id(v): var for v, var in zip(g.inputs, variables)}

    def read(v):
        if isinstance(v, Lit):
            return Constant(np.asarray(v.value))
        return env[id(v)]

    for n in g.nodes:
        if n.kind == GUARD:
            continue
        fn = n.op(*n.params) if n.op.params else _fresh(n)
        ys = fn(*[read(v) for v in n.inputs])
        if not isinstance(ys, (list, tuple)):
            ys = [ys]
        for v, y in zip(n.outputs, ys):
            env[id(v)] = as_variable(y)
    return [read(v) for v in g.outputs]


def _fresh(n):
    try:
        return n.op()
    except TypeError:
        import copy
        return copy.copy(n.fn)
