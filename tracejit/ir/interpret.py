"""The `interpret` backend: run a Graph with each primitive's own NumPy forward.

It is the reference the numba backend is tested against, the fallback for nodes
codegen does not cover, and (with `run_with_variables`) how create_graph works
through a compiled region. A backend's contract: `compile(graph)` returns a callable
taking the list of input arrays (in graph.inputs order) and returning the list of
output arrays (graph.outputs order), or raising GuardFailure at the first guard that
does not hold. Outputs are fresh arrays the caller may keep and write.
"""
import weakref

import numpy as np

from tracejit.ir import Lit
from tracejit.ops.trace_only import GUARD, GuardFailure, UserBackwardMismatch


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


def compile(g, forward_of=None):
    """g as a function of its input arrays, NumPy op by op. forward_of(node): the
    function a node runs in place of its own forward (None: its own)."""
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
            forward = forward_of(n) if forward_of is not None else None
            steps.append((None, forward or n.fn.forward, reads, writes, n, any(lits)))
    out_slots = [(slot[id(v)] if not isinstance(v, Lit) else v) for v in g.outputs]
    # An output that is an input is copied, as numba's plans do: outputs are fresh
    # arrays, and a runner given the graph that ran (run.graph: runtime.variant's
    # fresh_copies) copies only the outputs it returns twice.
    copied = {j for j, o in enumerate(out_slots) if not isinstance(o, Lit) and o < n_inputs}

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
            except UserBackwardMismatch:
                raise       # the caller runs that backward eagerly
            except Exception as e:
                raise NodeError(f"{n.name} failed at {n.line or '?'}: {e}") from e
            if len(writes) == 1:
                y = ys if not isinstance(ys, tuple) else ys[0]
                # NumPy reductions give scalars; results are always arrays.
                env[writes[0]] = y if type(y) is np.ndarray else np.asarray(y)
            else:
                for w, y in zip(writes, ys):
                    env[w] = y if type(y) is np.ndarray else np.asarray(y)
        return [(np.asarray(o.value) if isinstance(o, Lit) else
                 np.array(env[o]) if j in copied else env[o]) for j, o in enumerate(out_slots)]

    return run


def run_with_variables(g, variables, meta=None, saved=None, instances=None, adopt=None,
                       twins=None, leaf_arrays=None):
    """Replay g on Variables through the primitives: a differentiable (eager) graph.

    Used for create_graph=True through a compiled region and by unchain_backward: the
    result carries the autodiff history that higher-order derivatives need. Guards are
    not checked (the variant already passed them).

    `meta` (the trace's grad_meta) makes the replay's graph eager's own: a node
    called under no_grad, or any NumPy computation on `.data`, runs without history,
    and an input that was a fresh leaf in eager (Variable(x.data), a `.data` read in a
    user backward) is one here, so exactly what eager differentiates is differentiated.
    `saved` (id(Value) -> array) gives forward values as the compiled call computed
    them: the forward is replayed from the inputs as they are now, which an in-place
    update may have changed since (everything the backward reads from a changed input
    was saved, not recomputed: remat). `instances` (UserCall -> (instance, outputs))
    are the call's own user Functions with per-call state. `adopt` (id(Value) ->
    Variable) makes that Variable the one its node outputs, in the place of a new one:
    the nodes after read it (unchain_backward's expand: the compiled call's own results
    become the eager graph's, so cutting it cuts them). `twins`, a dict, is filled
    with id(Value) -> the replay's Variable of every value. `leaf_arrays` (id(Value) ->
    array) gives the data of a fresh leaf the forward made of that value where it is not
    the replay's (`c = Variable(x.data)` holds the array x had at the call, which the
    caller may have rebound since): not for a user backward's `.data` read, made then.
    """
    from tracejit.core import Constant, as_variable, fit_generations, using_config
    from tracejit.ops.trace_only import UserBackward, UserCall
    env = {id(v): var for v, var in zip(g.inputs, variables)}
    saved = saved or {}
    bound = {}          # UserCall -> the instance this replay's graph holds
    adopted = []        # (adopted Variable, its generation before)

    def read(v):
        if isinstance(v, Lit):
            return Constant(np.asarray(v.value))
        return env[id(v)]

    def leaf(v, made_then):
        # A fresh leaf with v's data and no history. Nothing can read its gradient: a
        # Constant, which backward gives none (no reference cycle through it).
        if isinstance(v, Lit):
            return Constant(np.asarray(v.value))
        if made_then and leaf_arrays and id(v) in leaf_arrays:
            return Constant(leaf_arrays[id(v)])
        return Constant(env[id(v)]._data)

    for n in g.nodes:
        if n.kind == GUARD:
            continue
        if meta is None:
            grad, links = True, n.inputs
        else:
            # Not a Function call (NumPy on .data, a cast of a Python scalar): no history.
            grad, links = meta.get(id(n), (False, (None,) * len(n.inputs)))
        forward = not isinstance(n.fn, UserBackward)
        xs = [leaf(v, forward) if link is None else read(link)
              for v, link in zip(n.inputs, links)]
        with using_config("enable_backprop", grad):
            if isinstance(n.fn, UserCall):
                ys = _replay_call(n.fn, xs, grad, instances, bound)
            elif isinstance(n.fn, UserBackward):
                ys = _replay_backward(n.fn, xs, bound)
            else:
                fn = n.op(*n.params) if n.op.params else _fresh(n)
                ys = fn(*xs)
        if not isinstance(ys, (list, tuple)):
            ys = [ys]
        for v, y in zip(n.outputs, ys):
            y = as_variable(y)
            s = saved.get(id(v))
            if s is not None:
                y._data = s
            mine = adopt.get(id(v)) if adopt else None
            if mine is not None and y.creator is not None:
                f = y.creator
                f.outputs = [weakref.ref(mine) if r() is y else r for r in f.outputs]
                adopted.append((mine, mine.generation))
                mine.creator, mine.generation = f, y.generation
                y = mine
            env[id(v)] = y
    if any(mine.generation > old for mine, old in adopted):
        fit_generations(adopted, {id(x) for x in variables})
    if twins is not None:
        twins.update(env)
    return [read(v) for v in g.outputs]


def _replay_call(call, xs, grad, instances, bound):
    """A stateful user Function's node: the call's own instance, wired to the replay's
    Variables as Function.__call__ would, with the outputs its forward gave."""
    from tracejit.core import Variable
    entry = instances.get(call) if instances else None
    if entry is None:
        inst = call.new_instance()
        bound[call] = inst
        return inst(*xs)
    inst, ys = entry
    outs = [Variable(np.asarray(y)) for y in ys]
    if grad:
        import weakref
        inst.inputs = list(xs)
        inst.outputs = [weakref.ref(y) for y in outs]
        inst.generation = max([x.generation for x in xs], default=0)
        for y in outs:
            y.set_creator(inst)
    bound[call] = inst
    return outs


def _replay_backward(ub, xs, bound):
    from tracejit.core import _input_grads
    inst = bound.get(ub.call)
    if inst is None:
        raise RuntimeError(f"tracejit: replaying {ub.op_name} without its forward call")
    if getattr(ub, "level", 0):
        # A derivative of the user's backward (UserGrad): called as a Function on the
        # replay's Variables, so its outputs have a history too.
        op = ub.node_op()
        op.inst = inst
        ys = op(*xs)
        return ys if isinstance(ys, list) else [ys]
    gxs = _input_grads(inst, xs[ub.n_in + ub.n_out:])
    ub.results([None if g is None else getattr(g, "data", g) for g in gxs])   # checks
    return [g for g in gxs if g is not None]


def _fresh(n):
    import copy
    if not n.op.__module__.startswith("tracejit"):
        # A user Function: its constructor's arguments are unknown (a default one
        # would be wrong), the node's copy has them.
        return copy.copy(n.fn)
    try:
        return n.op()
    except TypeError:
        return copy.copy(n.fn)
