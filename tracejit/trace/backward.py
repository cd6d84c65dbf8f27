"""The backward of a traced region: the eager backward, traced, split from the forward
(trace_backward); tracejit.passes.remat chooses which forward values it recomputes
rather than saves.
"""
import numpy as np

from tracejit import core, passes
from tracejit.core import MOVEMENT, DictGrads, Variable, backprop
from tracejit.ir import Graph, Node, Value
from tracejit.ops.trace_only import GUARD
from tracejit.passes import remat
from tracejit.trace.pytree import (FLT, VAR, _BasicIndex, input_arrays, _overlaps, _plain,
                                   _replays, _view_step)
from tracejit.trace.records import BackwardEscape, BackwardPlan


def trace_backward(tr, out_raw, out_leaves, made=()):
    """Trace the eager backward over the traced forward: (the BackwardPlan, or a
    BackwardEscape, or None when nothing is differentiable; the trace's own Variables at
    the region's boundary, for the caller's use now, never to be kept: they would keep
    the first call's arguments alive). made: (source, Variable) of the leaves of
    eager's graph the call made that outlive it (trace.call._made_leaves)."""
    # Variables at the region's boundary: arguments and captures, of every dtype (eager
    # gives an int Variable the float gradient of `x + w`; primitives return None for
    # most int inputs, and then so does the compiled backward).
    boundary = []
    leaf_of = {id(val): i for i, val in tr.arg_inputs}
    for var, val in tr.arg_vars.values():
        boundary.append((("arg", leaf_of[id(val)]), var))
    grad_owner = {id(v): obj for v, (kind, obj) in tr.captures if kind == "grad"}
    for var, val in tr.captured_vars.values():
        owner = grad_owner.get(id(val))
        if owner is None:
            boundary.append((("var", var), var))
        else:
            # A .grad used as an operand (F.sum(W.grad * x)): eager gives that .grad
            # Variable a gradient of its own. The compiled backward gives it to the .grad
            # the call read, found through its owner at call time (the runner), as the
            # forward reads its data (variant.read_capture), not the traced call's.
            leaf = tr.arg_leaf.get(id(owner))
            boundary.append((("arggrad", leaf) if leaf is not None else ("grad", owner),
                             var))
    # Leaves of eager's graph made inside the call that it returns (`c = Variable(
    # np.ones(3)); return x * c, c`): eager's backward from the results gives them
    # their gradient, so each is an input of the compiled call too, the one its runner
    # makes anew every call (a ("made", result leaf) source), or the .grad a
    # backward in the call set and an op then read (("effgrad", grad effect)).
    for src, var in made:
        boundary.append((src, var))
    outs = [x for x in out_raw if isinstance(x, Variable)]
    roots = [y for y in outs if y.creator is not None and y.creator in tr.functions
             and y.dtype.kind in "fc"]
    # With nothing differentiable from outside, a backward still matters where one
    # result is computed from another (`return h * 2.0, h`): eager's walk from the first
    # passes the second, whose .grad it reads (set by the caller) and keeps (retain_grad).
    if not roots or not (boundary or _results_feed_results(tr, roots, outs)):
        return None, []
    retained = tr.held_grads
    if not isinstance(retained, list):
        return BackwardEscape(*retained), []
    g = tr.graph
    n_nodes = len(g.nodes)
    n_inputs = len(g.inputs)
    grads = _FinalGrads()
    gy_values = {}
    out_index = {}
    # gys are numbered like the compiled call's output Variables (its creator's outputs).
    k = 0
    for x, (kind, _, b) in zip(out_raw, out_leaves):
        if kind == "out" and b == VAR:
            out_index.setdefault(id(x), k)
            k += 1
    roots = [y for y in roots if id(y) in out_index]
    for y in roots:
        gy = Variable(np.ones_like(y._data))
        gv = tr.add_input(y.shape, y.dtype, f"g{out_index[id(y)]}")
        gy._tv = gv
        tr.owner[id(gv)] = gy
        gy_values[id(gv)] = out_index[id(y)]
        grads.set(y, gy)
    # Traced as backward(create_graph=True) computes (the same values as a plain
    # backward): the nodes then say what a create_graph replay differentiates, as
    # eager would (a .data read in a user backward is a leaf, not a path).
    tr.region_backward = True
    backprop(roots, grads=grads, within=tr.functions, create_graph=True)
    tr.bwd_line = None
    bwd_nodes = g.nodes[n_nodes:]
    if any(n.kind == GUARD for n in bwd_nodes) or tr.escapes:
        # A guard: the backward branches on values. (An escape: the call runs eagerly
        # for its own reason, which comes first.)
        return BackwardEscape("the backward pass inspects values"), []
    in_place_states, live_states = _read_live(tr, bwd_nodes)
    replay_reads = _replay_reads(tr, grads, bwd_nodes, boundary)
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

    # Inputs the call updates in place (param.data -= ...) hold new values by the time
    # the backward runs. The backward reads such an input's buffer as it is then, as
    # eager's backward reads the Variable's data; but nothing computed from the input is
    # recomputed from that buffer (those values are saved).
    mutated = mutated_inputs(tr)
    fwd_pos = {id(v): i for i, v in enumerate(fwd_inputs)}
    # What the backward reads, counted over live nodes only: a dead one (the gradient
    # of a literal operand, x * 0.5) would make the forward save what it reads.
    outs_b = [v for v in grad_values if v is not None]
    bwd_nodes = passes.eliminate_dead_code(Graph("", (), bwd_nodes, outs_b)).nodes
    needed = [v for n in bwd_nodes for v in n.inputs] + outs_b
    # Captured state (a Parameter) may also be updated in place between this call and
    # its backward (an optimizer step on another loss): eager's backward then still has
    # the intermediates computed from the old values, so none computed from captured
    # state is recomputed from its buffer either.
    live = {id(v) for v, _ in tr.captures}
    # A made leaf's computed value is read as the leaf's data at backward time (need):
    # like a capture's, the caller may change it, so nothing is recomputed from it.
    made_data = {}        # id(forward value) -> diff position of the made leaf it is
    for k, (src, var) in enumerate(boundary):
        if src[0] in ("made", "effgrad") and isinstance(var._tv, Value) and \
                tr.is_mine(var._tv) \
                and id(var._tv) not in fwd_pos:
            made_data.setdefault(id(var._tv), k)
    live |= set(made_data)
    # Arguments: the caller may change them before the backward too (`x.data += 1`,
    # `x.data = ...`), and eager's backward reads them as they are then but the values
    # computed from them as they were. So the backward reads an argument directly (live,
    # variant.current_input) where eager's backward reads the Variable, and recomputes
    # only from a copy the forward saves of it (a snapshot, weighed by the cut). A float
    # argument's array is the call's own: nobody else can change it.
    args = [v for leaf, v in tr.arg_inputs
            if tr.leaf_kinds[leaf] != FLT and id(v) not in mutated]
    arg_ids = {id(v) for v in args}
    recompute = recompute_rule(g.nodes[:n_nodes], needed, mutated | live, snapshot=args)
    recomputed = {}
    snap_of = {}          # id(argument input) -> the backward's Value of its snapshot
    # Values eager's backward reads as views of an argument's or a captured buffer
    # (F.transpose(x), F.reshape(x)): rebuilt on the call's buffer when it runs.
    views = _argument_views(tr, g.nodes[:n_nodes], mutated,
                            {id(u) for n in bwd_nodes for u in n.inputs}, in_place_states)
    if isinstance(views, BackwardEscape):
        return views, []
    saved_views = {}      # index into saved -> (forward input position, view steps)
    live_of = {}          # id(forward value) -> the backward's Value of its live view
    for n in bwd_nodes:
        for u in n.inputs:
            if isinstance(u, Value) and id(u) in views and id(u) not in live_of:
                live_of[id(u)] = lv = Value(u.shape, u.dtype, f"{u.name or 't'}_view")
                seen.add(id(lv))
                bwd_inputs.append(lv)
                sources.append(("saved", len(saved)))
                saved_views[len(saved)] = views[id(u)]
                saved.append(u)    # the forward's copy, for a call whose replay copies
    if live_of:
        # The backward's own copies of the nodes that read them (the joint graph, which
        # a create_graph replay runs, keeps the forward's Values: Variant.saved_map).
        bwd_nodes = [Node(n.fn, [live_of.get(id(u), u) if isinstance(u, Value) else u
                                 for u in n.inputs], n.outputs, n.line)
                     if any(isinstance(u, Value) and id(u) in live_of for u in n.inputs)
                     else n for n in bwd_nodes]

    def need_snapshot(u):
        if id(u) not in snap_of:
            snap_of[id(u)] = s = Value(u.shape, u.dtype, f"{u.name or 'x'}_at_call")
            bwd_inputs.append(s)
            sources.append(("saved", len(saved)))
            saved.append(u)       # the forward outputs its input: a copy (every backend)

    def need(v):
        if not isinstance(v, Value) or id(v) in defined or id(v) in seen:
            return
        seen.add(id(v))
        if id(v) in made_data:
            # A made leaf's computed value (`Variable(x.data * 2)` returned): eager's
            # backward reads the leaf's data as it is then (`c.data *= 3` since), as
            # the compiled one does, from the call's own made leaf.
            bwd_inputs.append(v)
            sources.append(("madedata", made_data[id(v)]))
            return
        node = recompute.get(id(v))
        if node is not None:
            # Cheaper to recompute in the backward kernel than to store and reload.
            recomputed[node[0]] = node[1]
            for u in node[1].inputs:
                if isinstance(u, Value) and id(u) in arg_ids:
                    need_snapshot(u)
                else:
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
    for i, n in recomputed.items():
        if any(id(u) in snap_of for u in n.inputs):
            # The backward's own copy of the node, reading the snapshot (the forward's
            # node reads the argument itself).
            recomputed[i] = Node(n.fn, [snap_of.get(id(u), u) for u in n.inputs],
                                 n.outputs, n.line)
    bwd_nodes = [recomputed[i] for i in sorted(recomputed)] + bwd_nodes
    tainted = _tainted(g.nodes[:n_nodes], mutated | live | arg_ids)
    replay_made = {}
    if tr.replay_refusal is None:
        replay_made = _save_for_replay(replay_reads, tainted, saved, seen, defined,
                                       views, made_data, g.nodes[:n_nodes])
    slot, grad_slots = 0, []
    for v in grad_values:
        if v is None:
            grad_slots.append(None)
        else:
            grad_slots.append(slot)
            slot += 1
    bgraph = Graph(g.name + "_backward", bwd_inputs, bwd_nodes, outs_b,
                   [v.name for v in bwd_inputs])
    # The joint graph (for create_graph): all inputs, all nodes, and an input of its
    # own for each made leaf, which no node reads: a replay's operands that are the
    # made leaf in eager's graph are linked to it (_link_made_leaves), so the replay
    # differentiates the call's own made leaf, as eager does.
    made_values = _link_made_leaves(tr, made)
    joint = Graph(g.name + "_joint", list(g.inputs) + made_values, g.nodes,
                  outs_b, list(g.input_names) + [v.name for v in made_values])
    pos = {id(v): i for i, v in enumerate(joint.inputs)}
    made_value = {id(var): v for (_, var), v in zip(made, made_values)}
    joint_diff = []
    for src, var in boundary:
        val = tr.arg_vars[id(var)][1] if src[0] == "arg" else \
            made_value[id(var)] if src[0] in ("made", "effgrad") else \
            tr.captured_vars[id(var)][1]
        joint_diff.append(pos[id(val)])
    joint_gy = {pos[id(v)]: gy_values[id(v)] for v in g.inputs if id(v) in gy_values}
    recomputed_bytes = sum(v.nbytes for n in recomputed.values() for v in n.outputs)
    joint_captures = {pos[id(v)]: cap_source[id(v)] for v in g.inputs if id(v) in new_caps}
    # A create_graph replay recomputes the forward with NumPy from the inputs as they
    # are at backward time: right for values computed from inputs nothing changes (as
    # eager computed them, bit for bit), wrong for those computed from an input the call
    # updates in place or live captured state, which may have changed since. Those the
    # backward reads were saved (remat never recomputes them): the replay takes them
    # from the call. Only those: a saved value next to a NumPy-recomputed one could
    # differ by rounding, and a max's mask (x == max) would then lose its gradient.
    # Arguments too, which the caller may change: what the replay computes from them it
    # computes from their snapshots where the call saved one (Variant.saved_map).
    saved_pos = {id(v): k for k, v in enumerate(saved)}
    # The other saved values are the forward's: one the forward's code gives as a view
    # of an input (a reshape the numba plan does not copy) is copied at call time.
    unaliased = {}
    if views is not None:
        bases = _view_bases(tr, mutated)
        producer = {id(o): n for n in g.nodes[:n_nodes] for o in n.outputs}
        for k, v in enumerate(saved):
            if k in saved_views:
                continue
            u = v
            while id(u) in producer and producer[id(u)].kind == MOVEMENT:
                u = producer[id(u)].inputs[0]
            i = pos.get(id(u)) if u is not v else None
            if i in bases:
                unaliased[k] = i
    plan = BackwardPlan(
        graph=bgraph, sources=sources, grad_slots=grad_slots, saved=saved,
        saved_bytes=sum(v.nbytes for v in saved), recomputed_bytes=recomputed_bytes,
        diff_sources=diff_sources, joint=joint, joint_diff_inputs=joint_diff,
        joint_gy_inputs=joint_gy, joint_grad_slots=grad_slots,
        joint_captures=joint_captures, joint_meta=tr.grad_meta,
        replay_saved=[k for k, v in enumerate(saved) if id(v) in tainted],
        replay_made=replay_made,
        saved_views=saved_views, saved_unaliased=unaliased,
        snapshots={pos[id(v)]: saved_pos[id(v)] for v in args if id(v) in snap_of},
        fixed_inputs=frozenset(pos[id(v)] for leaf, v in tr.arg_inputs
                               if tr.leaf_kinds[leaf] == FLT),
        grad_dtypes=_grad_dtypes(tr, roots, out_index, boundary),
        replay_refusal=tr.replay_refusal, held_grads=retained,
        # The states of a buffer the call updates in place, which the backward reads as
        # the buffer (_read_live): the replay's forward nodes too. Eager's graph holds
        # each such operand as the buffer itself (`view = W1.data` before `W1.data *=
        # 0.9`, a Constant aliasing it; the Parameter), so at backward time its
        # Functions read the buffer as it is then; recomputing the state from the
        # already-updated buffer would apply the update twice. What was computed from
        # a state keeps the forward's value where the backward reads it (replay_saved).
        replay_live={k: pos[id(inp)] for k, inp in live_states.items()})
    # The trace's own Variables at the boundary (a .grad source names its owner).
    return plan, [var for _, var in boundary]


def _results_feed_results(tr, roots, outs):
    """Whether eager's walk from a result (a root) over the call's Functions passes
    another result Variable: an intermediate of its graph."""
    results = {id(y) for y in outs}
    todo, seen = [y.creator for y in roots], set()
    while todo:
        f = todo.pop()
        if f is None or f in seen or f not in tr.functions:
            continue
        seen.add(f)
        for x in f.inputs:
            if id(x) in results:
                return True
            todo.append(x.creator)
    return False


def _link_made_leaves(tr, made):
    """A joint graph input per made leaf (trace_backward's `made`), and every operand
    of a node recorded with grad on that is that Variable in eager's graph linked to
    it (tr.grad_meta, which a replay reads): unlinked it would be a fresh Constant (a
    leaf nothing reads the gradient of), linked to the value it was computed as (a
    result of no_grad, unchained in the call) a Variable of the replay's own."""
    if not made:
        return []
    values = {id(var): tr.new_value(var.shape, var.dtype, var.name or f"made{k}")
              for k, (_, var) in enumerate(made)}
    for key, uses in tr.leaf_operands.items():
        meta = tr.grad_meta.get(key)
        if meta is None or not any(id(x) in values for _, x in uses):
            continue
        links = list(meta[1])
        for k, x in uses:
            if id(x) in values:
                links[k] = values[id(x)]
        tr.grad_meta[key] = (meta[0], tuple(links))
    return [values[id(var)] for _, var in made]


class _FinalGrads(DictGrads):
    """DictGrads that also keeps each Variable's last gradient (`final`): the walk
    (no retain_grad) clears an intermediate's once its creator passed it on, but a
    replay with retain_grad keeps it, and reads what it is computed from
    (_replay_reads)."""

    def __init__(self):
        super().__init__()
        self.final = {}

    def set(self, v, g):
        if g is not None:
            self.final[id(v)] = (v, g)
        super().set(v, g)


def _replay_reads(tr, grads, bwd_nodes, boundary):
    """The Values eager's backward reads (the traced one, before dead code goes) for
    the gradients it keeps on Variables someone can reach: the boundary's, the call's
    results and intermediates (retain_grad keeps theirs), its made leaves. Not the
    gradient of a temporary Variable wrapping an input array (`F.sin(x)` of an ndarray
    x, a captured array), which nobody reaches. A replay of eager's backward (retain_grad,
    create_graph) reads these where the compiled backward, which gives the boundary's
    gradients only, may read none of them (`h * Variable(h.data)` with h computed
    from an ndarray argument: h's retained .grad reads h)."""
    inputs = {id(v) for v in tr.graph.inputs}
    reached = {id(var) for _, var in boundary}
    kept = [gv._tv for _, (var, gv) in grads.final.items()
            if gv is not None and isinstance(getattr(gv, "_tv", None), Value)
            and (id(var) in reached or not (isinstance(var._tv, Value)
                                            and id(var._tv) in inputs))]
    live = passes.eliminate_dead_code(Graph("", (), bwd_nodes, kept)).nodes
    return [u for n in live for u in n.inputs if isinstance(u, Value)]


def _tainted(fwd_nodes, changing):
    """ids of the inputs `changing` and of every forward value computed from them."""
    tainted = set(changing)
    for n in fwd_nodes:
        if any(isinstance(u, Value) and id(u) in tainted for u in n.inputs):
            tainted.update(id(o) for o in n.outputs)
    return tainted


def _save_for_replay(reads, tainted, saved, seen, defined, views, made_data, fwd_nodes):
    """Make the forward save (appended to `saved`, read by no backward input) each
    forward value a replay of eager's backward reads (`reads`, _replay_reads) that the
    compiled backward neither reads nor recomputes and that is computed from an input
    that may have changed by the time the backward runs (`tainted`: updated in place
    by the call, captured, an argument): a replay recomputing it from the input as it
    is then (`x1 += 0.5` in the call after `h = F.sin(x1)`) would read another value
    than eager's graph holds. A view eager reads through a buffer is rebuilt on it
    (saved_views), not saved. A made leaf's value (`c = Variable(h.data)`) is the
    made leaf's data then, as the compiled backward reads it: {id(Value): its
    differentiable input position} (BackwardPlan.replay_made)."""
    produced = {id(v) for n in fwd_nodes for v in n.outputs}
    made = {}
    for u in reads:
        k = id(u)
        if k in seen or k in defined or k not in produced or k not in tainted \
                or k in views:
            continue
        seen.add(k)
        if k in made_data:
            made[k] = made_data[k]
        else:
            saved.append(u)
    return made


def held_grads(tr, out_raw, out_leaves):
    """The .grads a backward inside the call left (retain_grad=True) on the Variables
    of the call behind its results, not results themselves (their .grad is theirs,
    tr.made_grads): eager's later walk through the call adds to each and propagates
    the sum past it, so the compiled call keeps them (CompiledFunction.stale): a list
    of (Value of the Variable, Value of its .grad, the result leaf index of that .grad
    where the function returns it else None, whether that .grad has a creator). The caller cannot reach such a
    Variable to change its .grad (a compiled call's results have the call as their
    creator, not eager's graph), so each is held as the call left it. Or (reason,
    line) for one the compiled call does not keep: on a view of a buffer the call
    updates in place (_views_of_updated)."""
    results = {id(x) for x, (kind, _, b) in zip(out_raw, out_leaves)
               if kind == "out" and b == VAR}
    # A .grad the function returns (`return y2.grad` after a backward that retained it
    # on intermediate y2): eager's walk through y2 and the caller's result are one
    # Variable, so a later backward through what the walk gave reaches the result.
    # result Variable id -> its result leaf index.
    result_leaf = {id(x): i for i, (x, (kind, _, b)) in enumerate(zip(out_raw, out_leaves))
                   if kind == "out" and b == VAR}
    roots = [x for x in out_raw if isinstance(x, Variable) and id(x) in results
             and x.creator is not None and x.creator in tr.functions]
    views = _views_of_updated(tr)
    held, done, seen, stack = [], set(), set(), [y.creator for y in roots]
    while stack:
        f = stack.pop()
        if f is None or f in seen or f not in tr.functions:
            continue
        seen.add(f)
        for x in f.inputs:
            if x.creator is None or x.creator not in tr.functions:
                continue
            stack.append(x.creator)
            if id(x) in results or x._grad is None or id(x) in done:
                continue
            done.add(id(x))
            v = getattr(x, "_tv", None)
            if not isinstance(v, Value) or not tr.is_mine(v) or id(x) in views:
                line = next((n.line for n in tr.graph.nodes if v is not None
                             and any(o is v for o in n.outputs)), None)
                return _HELD_REFUSAL, line or "an unknown line"
            # (Whether that .grad has history: a backward with create_graph=False
            # left one without, which a later backward does not pass through.)
            held.append((v, tr.value_of(x._grad), result_leaf.get(id(x._grad)),
                         x._grad.creator is not None))
    return held


_HELD_REFUSAL = (
    "a backward inside the function left a .grad (retain_grad=True) on a view of a "
    "buffer the function updates in place, and a backward from its results passes "
    "through it: eager adds the retained .grad to the gradient flowing on there; "
    "compiled calls do not follow it through the buffer's states yet")


def _views_of_updated(tr):
    """ids of the call's Variables that stand for more than one Value: a view of a
    buffer the call updates in place (`v = F.reshape(W, ...)` before `W.data -= ...`)
    sees every state of the buffer, each a Value of its own, so a .grad held there
    has no one Value for the walk to add it at."""
    count = {}
    for var in tr.owner.values():
        count[id(var)] = count.get(id(var), 0) + 1
    return {k for k, c in count.items() if c > 1}


def _grad_dtypes(tr, roots, out_index, boundary):
    """Per output k (the gys' numbering), per dtype of its gradient, per boundary
    Variable: the dtype of the gradient eager's backward from that output alone gives
    it (None: none), {k: {gy dtype: row}}. A backward from some of the outputs gets
    eager's dtype from these: the compiled backward also adds the others' zero
    contributions, whose dtype may promote (a float32 input reached through float64
    from one output and float32 from another). The output's gradient need not have the
    output's dtype (a float32 result in a float64 loss gets a float64 one, which
    promotes what eager's backward computes from it), so each row is made for the
    output's dtype and for each float dtype a loss can give it.

    None when no backward from any outputs, with gradients of any of those dtypes, can
    give an input another dtype than the compiled backward's zeros-filled one: when,
    per input, each row's dtype is at least the widest one an output's own-dtype
    gradient gives it (then the dead outputs' zeros, of their outputs' dtypes, promote
    nothing)."""
    if len(roots) < 2:
        return None
    table = {}
    prev = core.set_trace(None)       # eager, unrecorded: only the dtypes are wanted
    try:
        with core.no_grad():
            for y in roots:
                rows = {}
                for dt in dict.fromkeys([y._data.dtype, *_GY_DTYPES]):
                    if y._data.dtype.kind != "f" and dt != y._data.dtype:
                        continue
                    grads = DictGrads()
                    grads.set(y, Variable(np.ones(y._data.shape, dt)))
                    backprop([y], grads=grads, within=tr.functions)
                    rows[dt] = [None if grads.get(var) is None else
                                grads.get(var).dtype for _, var in boundary]
                table[out_index[id(y)]] = rows
    finally:
        core.set_trace(prev)
    for j in range(len(boundary)):
        own = [rows[y._data.dtype][j] for y, rows in
               zip(roots, (table[out_index[id(y)]] for y in roots))]
        own = [d for d in own if d is not None]
        if not own:
            continue
        widest = np.result_type(*own)
        for rows in table.values():
            for row in rows.values():
                if row[j] is not None and np.result_type(row[j], widest) != row[j]:
                    return table
    return None


# The dtypes an output's gradient may come in besides the output's own: a float32
# result's term added to float64 ones gets float64; a float32 one into a float64 output
# (a .grad the caller set) is rarer, but NumPy's promotion can keep it float32 down to
# the input (`x * 2.0`). Others (float16) replay eager's graph.
_GY_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def _read_live(tr, bwd_nodes):
    """Make the backward read an argument or captured buffer that the call updates as
    it is when the backward runs, as eager's does.

    The traced backward reads each Variable's data as the trace left it: after the
    call's `x.data *= 0.5` that is the update's Value, which the forward would save. But
    eager's backward reads the buffer at backward time, and the caller may have changed
    it again since the call (`x.data += 1`). Every Value that stands for a state of such
    a buffer (in-place updates of a Variable's data or of an ndarray) and the Value a
    rebound Variable's data last got (`x.data = x.data * 2`, a Value of its own, of the
    input's shape and dtype) is read, in the backward only, as the input it replaces:
    the call's buffer, or for a rebound Variable its data then (variant.current_input).
    """
    by_leaf = dict(tr.arg_inputs)
    cap_array = {id(obj): v for v, (kind, obj) in tr.captures if kind == "array"}

    def input_of(obj):
        entry = tr.arg_vars.get(id(obj)) or tr.captured_vars.get(id(obj))
        if entry is not None and entry[0] is obj:
            return entry[1]
        if isinstance(obj, np.ndarray):
            leaf = tr.arg_leaf.get(id(obj))
            return by_leaf.get(leaf) if leaf is not None else cap_array.get(id(obj))
        return None

    subst = {}
    for kind, obj, val in tr.effects:
        inp = input_of(obj)
        if inp is None or not isinstance(val, Value) or val is inp:
            continue
        if val.shape != inp.shape or val.dtype != inp.dtype:
            continue
        if kind == "rebind":
            # Only the data it has now, and only a Value of its own: `x.data = h.data`
            # shares h's array, which h's own reads must keep reading.
            if obj._tv is not val or tr.owner.get(id(val)) not in (None, obj):
                continue
        subst[id(val)] = inp
    # The states of a buffer updated in place (not a rebound Variable's new array): a
    # view of one is a view of the call's buffer (_argument_views).
    states = {k: v for k, v in subst.items()
              if k not in {id(val) for kind, _, val in tr.effects if kind == "rebind"}}
    if not subst:
        return states, subst
    for n in bwd_nodes:
        if any(id(u) in subst for u in n.inputs):
            n.inputs = tuple(subst.get(id(u), u) for u in n.inputs)
            meta = tr.grad_meta.get(id(n))
            if meta is not None:
                # What a create_graph replay links this node's operands to: the same.
                tr.grad_meta[id(n)] = (meta[0], tuple(
                    None if u is None else subst.get(id(u), u) for u in meta[1]))
    return states, subst


def _argument_views(tr, fwd_nodes, mutated, read, states=None):
    """id(forward value) -> (forward input position, steps) for the values the traced
    call computed as NumPy views of an argument's or a captured buffer (F.transpose(x),
    F.reshape(x), a view of a view; not F.get_item, which copies): eager's backward
    reads such a value (among those `read`) through the buffer, as it is when the
    backward runs (the caller's `x.data[0] = 5` shows in it; after `x.data = ...` it is
    still the old buffer's), so the compiled backward rebuilds it on the call's buffer
    by the same view operations (pytree.replay_view) rather than read a copy the
    forward saved. A buffer the call updates in place too: `states` (_read_live) maps
    the Values of its states to the input, so a view taken after the update (the
    tracer's new Value) is one of the buffer, which shows the call's update and the
    caller's. A BackwardEscape when a value shares memory with a buffer the call does
    not update but is no chain of view operations from it (a copy would be silently
    stale); memory shared with an updated buffer is not checked (as before: saved)."""
    bases = _view_bases(tr, frozenset())
    unchanged = _view_bases(tr, mutated)
    pos = {id(v): i for i, v in enumerate(tr.graph.inputs)}
    if not bases:
        return {}
    producer = {id(o): n for n in fwd_nodes for o in n.outputs}
    out = {}
    for n in fwd_nodes:
        for v in n.outputs:
            if id(v) not in read:
                continue
            var = tr.owner.get(id(v))
            arr = _plain(var) if isinstance(var, Variable) else None
            if arr is None or arr.size == 0:
                continue
            shared = any(_overlaps(arr, b) for b in unchanged.values())
            steps, u = [], v
            while id(u) not in pos:
                if states and id(u) in states:
                    u = states[id(u)]       # a state of the buffer: the buffer
                    continue
                m = producer.get(id(u))
                if m is None or m.kind != MOVEMENT or len(m.inputs) != 1:
                    break
                steps.append(_view_step(m))
                u = m.inputs[0]
            i = pos.get(id(u))
            steps = tuple(reversed(steps))
            if i in bases and steps:
                if _replays(bases[i], steps, arr):
                    out[id(v)] = (i, steps)
                    continue
                # A copy in the traced call (a reshape of a non-contiguous argument) is
                # a view on calls whose argument's layout allows one, as eager's op
                # decides per call: so does the replay. Not through a basic index:
                # F.get_item copies where NumPy's x.data[k] is a view, the same node.
                if not shared and not any(isinstance(st, _BasicIndex) for st in steps):
                    out[id(v)] = (i, steps)
                    continue
            if shared:
                return BackwardEscape(
                    f"a value the backward reads shares memory with an argument's or a "
                    f"captured buffer but is no view the compiled backward can rebuild "
                    f"on it (it would read a stale copy)", n.line)
    return out


def _view_bases(tr, mutated):
    """Forward input position -> the traced call's array, for the arguments' and
    captured buffers the call does not update in place."""
    bases = input_arrays(tr)
    for i, v in enumerate(tr.graph.inputs):
        if id(v) in mutated:
            bases.pop(i, None)
    return bases


def mutated_inputs(tr):
    """ids of the graph inputs whose objects the trace updates in place."""
    targets = {id(obj) for _, obj, _ in tr.effects}
    out = {id(v) for v, (_, obj) in tr.captures if id(obj) in targets}
    # (A .grad from outside updated in place, `x.grad.data += 1`: the effect's target
    # is the .grad Variable, the capture's object its owner.)
    out |= {id(v) for g, v in tr.captured_vars.values() if id(g) in targets}
    by_leaf = dict(tr.arg_inputs)
    out |= {id(by_leaf[leaf]) for obj_id, leaf in tr.arg_leaf.items()
            if obj_id in targets and leaf in by_leaf}
    return out


def recompute_rule(fwd_nodes, needed, mutated=frozenset(), snapshot=()):
    """id(value) -> (index, node) for forward values the backward recomputes.

    The minimum cut of tracejit.passes.remat: of the values the backward reads (`needed`),
    the forward saves the fewest bytes it can, and the backward recomputes the rest
    from those and from the call's inputs. Reductions, matmuls, random draws, opaque
    nodes, costly elementwise math and values computed from inputs the call mutates
    are never recomputed; on a graph of 0-d values everything else is (the cost is the
    call, not the memory).
    """
    return remat.partition(fwd_nodes, needed, mutated, snapshot=snapshot).recompute_map()

