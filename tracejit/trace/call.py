"""One traced call of a jitted function: tracers for its arguments, the function run
under a Trace, its backward traced, and everything the runtime needs read off the Trace
into a TracedCall (trace.records). The one writer of a Trace's call-level fields; the
runtime (runtime.jitted) decides what to do with the record and never touches a Trace.
"""
import functools
import random

import numpy as np

from tracejit.core import Config, Constant, Variable
from tracejit.trace import buffers, opaque, pystate, sites
from tracejit.trace import made as made_arrays
from tracejit.trace import record as tracing
from tracejit.trace.backward import held_grads, mutated_inputs, trace_backward
from tracejit.trace.pytree import (ARR, FLT, MAX_DEPTH, VAR, arg_at, arg_names,
                                   container_depth, flatten_result, input_arrays,
                                   rebind_views, replay_view, result_leaves, result_views,
                                   share_arrays, strip_tracers, unflatten)
from tracejit.trace.record import (TracedArray, TracedFloat, Trace, _user_functions,
                                   wrapped_function)
from tracejit.trace.records import (BackwardEscape, BackwardPlan, Effect, Escape, SideEffect,
                                    Source, Target, TracedCall)


def trace_call(fn, name, args, kwargs, static_argnums=frozenset(),
               static_argnames=frozenset()):
    """Run fn(*args, **kwargs) once under a new Trace: the TracedCall. Its result is the
    call's own (eager's objects: an argument, a captured array; computed arrays as plain
    copies); its escapes, first one first, say why compiled calls could not stand for it.
    Raises what the traced function raises (the state it changed is the caller's to put
    back)."""
    def_line = tracing.def_line(fn)
    tr = Trace(name)
    leaves = []
    # Probes for the iterators and memoized functions the call reaches (trace.opaque):
    # its arguments' here, its state's below.
    probes = []
    targs, tkwargs = _tracer_args(tr, fn, args, kwargs, leaves, static_argnums,
                                  static_argnames, probes)
    # The arguments' .grad as the call found them (part of the signature): the
    # perturbation check's copies start from these, not from what the call set.
    grads_before = {id(x): x._grad for x in leaves if isinstance(x, Variable)}
    rng_before = np.random.get_state()
    py_rng_before = random.getstate()
    arg_objects = pystate.argument_objects(args, kwargs)
    locs = pystate.locations(fn, arg_objects)
    snap_before = pystate.snapshot(locs)
    for loc in locs:
        val = loc.read()
        if isinstance(val, (Variable, np.ndarray)) and id(val) not in tr.names:
            tr.names[id(val)] = (val, loc.label)   # breadth first: the shortest path
    # State reached through the arguments (a model passed as `m`, a method's `self`):
    # a rebinding there is not threaded (the Jitted threads captured state only), so
    # a change there is an escape, never a variant that leaves it undone.
    arg_locs = pystate.argument_locations(list(enumerate(args)) + list(kwargs.items()))
    arg_snap = pystate.snapshot(arg_locs)
    # (A list of an argument's the function appends to: a side effect, as a capture's.)
    sizes_before = pystate.sizes(locs + arg_locs)
    grad_mode = Config.enable_backprop
    prev = tracing.start(tr)
    # Everything from here on is undone in the finally blocks below, whatever raises
    # (a user __getattr__ our probes meet, the function itself): a trace left active,
    # or a user array left swapped for a traced view, would run every later call of
    # every function, eager or jitted, under this dead trace.
    swaps, code_swaps, hook, probe_swaps, reached, unswapped = [], [], None, [], [], []
    try:
        try:
            # (An argument's arrays too: an in-place update of `m.buf` is an effect of
            # the call.)
            swaps = pystate.swap_arrays(locs + arg_locs, tr.capture_view, unswapped)
            tr.unswapped = {id(a): loc for loc, a, _ in unswapped}
            probe_swaps = opaque.swap_probes(locs + arg_locs)
            # float()/int() in the function's own code, and in the user functions it
            # reads (helpers, a Model's forward), give traced Python numbers.
            # (The call's arguments and what they reach, and a partial's own, for the
            # classes that may hold NumPy's constructors: `self.make(...)`.)
            code_swaps = tracing.swap_scalar_code(
                locs, fn, list(args) + list(kwargs.values()) + _partial_values(fn) +
                [v for _, v, _ in arg_snap])
            for label, t in buffers.reachable_buffer_types(locs):
                tr.escapes.append((f"{t.__name__} is reachable as {label}: a call of it "
                                   f"reads traced data through the buffer protocol, past "
                                   f"the tracer", def_line))
            # C functions that read buffers (struct.unpack_from, zlib.crc32, ...) called
            # by the user's code: escapes (trace.buffers).
            # (A function passed as an argument is scanned too: float() in it is not
            # followed, but a reader it calls is seen.)
            reached = tracing.reached_user_functions(locs, fn) + [
                f for a in list(args) + list(kwargs.values()) for f in _user_functions(a)]
            hook = buffers.install(reached, locs,
                                   list(args) + list(kwargs.values()))
            result = tracing.symbolic_scalars(fn)(*targs, **tkwargs)
            # The arrays it made are plain ndarrays outside the trace (trace/made.py).
            result = made_arrays.plain_tree(result)
        finally:
            if hook is not None:
                buffers.uninstall(hook)
            tracing.unswap_scalar_code(code_swaps)
            pystate.unswap(probe_swaps)
            pystate.unswap(swaps)
        written = pystate.written_unswapped(unswapped)
        if written is not None:
            tr.escapes.append((f"the function writes into {written.describe()}, "
                               f"{pystate.UNSWAPPED}: compiled calls would not repeat "
                               f"the write", def_line))
        for data, before, line in tr.made_leaf_uses:
            if data.tobytes() != before.tobytes():
                tr.escapes.append(("an array made inside the function that a Variable "
                                   "holds (tj.Variable(buf)) is written after the "
                                   "Variable's use here (buf[...] = ..., buf += ...): "
                                   "eager's use read the values before the write, a "
                                   "compiled call's would read them after", line))
                break
        out_leaves_raw = []
        # An argument's list, dict or tuple returned as the call got it is that
        # object (eager returns the caller's), not a new one of its contents.
        keep = {id(c): path for c, items, path in tr.arg_containers.values()
                if _unchanged_container(c, items)}
        changed_arg = [path for c, items, path in tr.arg_containers.values()
                       if id(c) not in keep]
        if changed_arg:
            # The function changed a list or dict it was passed: it runs eagerly
            # (below); this traced call changed copies, which go into the caller's.
            _write_back(tr, (args, kwargs))
            keep = {id(c): path for c, items, path in tr.arg_containers.values()}
        # An np.float32 argument returned as it came is that object (not written in
        # place: `s += 1` rebinds eager's s to a new scalar).
        keep.update((id(t), path) for t, v, path in tr.scalar_args.values() if t._tv is v)
        # (What the call could reach when it started: a dataclass there is returned as
        # that object; one the call made is rebuilt.)
        before = {id(v) for _, v, _ in snap_before} | {id(v) for _, v, _ in arg_snap} | \
            {id(a) for a in list(args) + list(kwargs.values())}
        out_tree = flatten_result(result, out_leaves_raw, keep=keep, before=before)
        if container_depth(result, MAX_DEPTH, before) > MAX_DEPTH:
            tr.escapes.append((f"the result nests lists, tuples or dicts more than "
                               f"{MAX_DEPTH} levels deep: compiled calls do not rebuild "
                               f"one that deep", def_line))
        out_leaves, result_objects = result_leaves(tr, out_leaves_raw)
        # Results eager returns as views of a buffer from outside or of another result:
        # the variant rebuilds them on the live buffer; one it cannot rebuild runs eagerly.
        out_views, unexpressed = result_views(tr, out_leaves_raw, out_leaves)
        # (A result that is an input's array object itself, `x.grad.data` of a .grad
        # the caller set: that object.)
        inputs = input_arrays(tr)
        for i, ((where, j), steps) in sorted(out_views.items(),
                                             key=lambda e: (e[1][0][0] == "leaf", e[0])):
            base = result_objects[j] if where == "leaf" else \
                inputs.get(j) if where == "input" and not steps else None
            base = base._data if isinstance(base, Variable) else base
            if isinstance(result_objects[i], Variable):
                # A Variable view of another result (`return h.data, h.T`): its data
                # rebuilt on that result's array, which strip_tracers may have copied.
                view = replay_view(base, steps) if isinstance(base, np.ndarray) and \
                    not np.shares_memory(base, result_objects[i]._data) else None
                if view is not None:
                    result_objects[i]._data = view
                continue
            # The traced call's own result: the view itself, not strip_tracers' copy
            # (of the traced call's own result j, when it is a view of that).
            view = replay_view(base, steps) if isinstance(base, np.ndarray) else None
            result_objects[i] = view if view is not None else \
                out_leaves_raw[i].view(np.ndarray)
        share_arrays(out_leaves_raw, out_leaves, result_objects)
        for i in unexpressed:
            if not isinstance(result_objects[i], Variable):
                # This call runs eagerly: its result is the view eager gives.
                result_objects[i] = out_leaves_raw[i].view(np.ndarray)
        if unexpressed:
            tr.escapes.append((
                f"result {unexpressed[0]} is a view of an argument's, a captured array's "
                f"or another result's buffer that compiled calls cannot rebuild (they "
                f"would return an unaliased copy)", def_line))
        # Arrays `W.data = ...` stores that eager shares with an argument, a .grad or a
        # result (`W.data = x.data[:, ::-1]`): rebuilt on that buffer when applied.
        bound_views, unbound = rebind_views(tr, out_leaves_raw, out_leaves, out_views)
        if unbound:
            var = tr.effects[unbound[0]][1]
            tr.escapes.append((
                f"`{_var_label(tr, var)}.data = ...` stores a view of an argument's, a "
                f"captured array's, a .grad's or a result's buffer that compiled calls "
                f"cannot rebuild (they would store an unaliased copy)",
                tr.rebind_lines.get(unbound[0], def_line)))
        # A computed array a rebind stored and the call returns (`W.data = a; a += 1;
        # return a`): eager's result is W.data itself, in this traced call too (where
        # compiled calls cannot rebuild that, the escape above sends later calls to
        # eager; the traced call's own result must still be eager's object).
        for e, t in tr.rebind_tracers.items():
            arr = tr.rebind_arrays.get(e)
            if tr.effects[e][1]._data is not arr:
                continue
            for i, raw in enumerate(out_leaves_raw):
                if raw is t and not isinstance(result_objects[i], Variable):
                    result_objects[i] = arr
        # A .grad that a backward going on into the caller's graph touched after: the
        # one that walk started from (it is repeated at call time, after these).
        grad_of = _grads_before_walks(tr)
        tr.grad_effects = [(var, None if grad_of(var) is None else tr.value_of(grad_of(var)))
                           for var in tr.grad_writes.values()]
        # A later backward in the call that gave such a .grad a .grad of its own
        # (x.grad.grad: x.grad a leaf of it): set on the .grad the runner sets.
        nested, refused = _nested_grads(tr, grad_of, out_leaves_raw, out_leaves)
        if refused is not None:
            tr.escapes.append((
                "a backward inside the function sets the .grad of a .grad the call set "
                "(x.grad.grad, x.grad a leaf of a later backward) that compiled calls "
                f"cannot set as eager does ({refused[0]})", refused[1] or def_line))
        # The .grad backward left on a result made inside the call (retain_grad, or
        # the loss's own): the variant sets it on the new result (variant.py).
        if tr.reseed:
            tr.escapes.append((
                "a backward inside the function sets the .grad of a Variable after an "
                "earlier backward went on from it into the graph from before the call, "
                "and no later one goes on from it; compiled calls cannot order the two",
                def_line))
        tr.made_grads = [(x, x._grad, None if x._grad is None else tr.value_of(x._grad))
                         for x, leaf in zip(out_leaves_raw, out_leaves)
                         if leaf[0] == "out" and leaf[2] == VAR]
        # (Before the backward adds to the graph: a seed's Value may be a new input.)
        tr.held_grads = held_grads(tr, out_leaves_raw, out_leaves) if grad_mode else []
        # The .grad a backward inside the call gave a leaf it made and returns
        # (`c = Variable(np.ones(3)); F.sum(x * c).backward(); return c`): result leaf
        # -> its Value, set on the runner's new leaf. Only a .grad of its own (not a
        # Constant, not another Variable's .grad or a result): the others stay the
        # first-call check's to refuse.
        others = {id(var._grad) for var in tr.grad_writes.values()} | \
            {id(g) for _, g, _ in tr.made_grads} | {id(x) for x in out_leaves_raw}
        tr.wrap_grads, counted = {}, {}
        for i, (x, leaf) in enumerate(zip(out_leaves_raw, out_leaves)):
            if leaf[0] == "wrap" and isinstance(x, Variable) and x._grad is not None:
                counted[id(x._grad)] = counted.get(id(x._grad), 0) + 1
        for i, (x, leaf) in enumerate(zip(out_leaves_raw, out_leaves)):
            g = x._grad if leaf[0] == "wrap" and isinstance(x, Variable) else None
            if g is not None and type(g) is not Constant and id(g) not in others \
                    and counted[id(g)] == 1 and isinstance(g._data, np.ndarray):
                tr.wrap_grads[i] = tr.value_of(g)
        # A made leaf's .grad that is another object the call returns or leaves as a
        # .grad (`return v.grad, v`; `F.tanh(v + x).backward()`, where Add gives v and
        # x one gradient object): that object, set on the runner's new leaf last
        # (eager's identities, read before _unshare_grads copies any).
        tr.wrap_grad_alias = {}
        result_at = {}
        for j, o in enumerate(out_leaves_raw):
            result_at.setdefault(id(o), j)
        for i, (x, leaf) in enumerate(zip(out_leaves_raw, out_leaves)):
            g = x._grad if leaf[0] == "wrap" and isinstance(x, Variable) else None
            if g is None or i in tr.wrap_grads:
                continue
            if id(g) in result_at and result_at[id(g)] != i:
                tr.wrap_grad_alias[i] = ("result", result_at[id(g)])
                continue
            for gi, (var, _) in enumerate(tr.grad_effects):
                if grad_of(var) is g:
                    tr.wrap_grad_alias[i] = ("effect", gi)
                    break
            else:
                # A computed result's .grad (`F.tanh(c + g).backward()` with g = w.grad
                # returned: c.grad is w.grad.grad, set as made result m's .grad).
                for m, (_, xg, _) in enumerate(tr.made_grads):
                    if xg is g:
                        tr.wrap_grad_alias[i] = ("made", m)
                        break
        copied = _unshare_grads(tr, list(tr.grad_writes.values()) +
                                [x for x, g, _ in tr.made_grads if g is not None] +
                                [grad_of(tr.grad_effects[gi][0]) for gi, _, _ in nested] +
                                [out_leaves_raw[i] for i in tr.wrap_grads], grad_of)
        # A result that is such a .grad's array (`return y.grad, y.grad.data`) is its
        # copy, the array the traced call's .grad now holds.
        result_objects = [copied[id(o)][1] if id(o) in copied and copied[id(o)][0] is o
                          else o for o in result_objects]
        # A result wrapping such a .grad's array (`Variable(x.grad.data)`) holds the
        # copy too, as eager's holds the .grad's own array.
        for x, leaf in zip(out_leaves_raw, out_leaves):
            if leaf[0] == "wrap" and id(x._data) in copied and \
                    copied[id(x._data)][0] is x._data:
                x._data = copied[id(x._data)][1]
        _rebind_on_grads(tr, bound_views)
        _rebuild_owned_views(tr, out_leaves_raw, out_leaves, out_views, result_objects)
        # One object in several places (`return h, h` of a view `h = x.data.T`; one
        # array at L[0] and L[-1]; `return c, c.data` of a c given a .grad's copy
        # above): the one rebuilt above, in each.
        share_arrays(out_leaves_raw, out_leaves, result_objects)
        if _unreturned_grad_graph(tr, out_leaves_raw, grad_of):
            tr.escapes.append((
                "backward(create_graph=True) inside the function leaves a .grad with "
                "graph history that it does not return: compiled calls would give it "
                "none (a backward through it would reach nothing); return the .grad "
                "to compile", def_line))
        n_inputs = len(tr.graph.inputs)
        n_nodes = len(tr.graph.nodes)
        backward = None
        boundary = []
        cut = _cut_in_call(tr, n_nodes)
        made_leaves = _made_leaves(tr, out_leaves_raw, out_leaves) if grad_mode else []
        if grad_mode:
            backward, boundary = trace_backward(tr, out_leaves_raw, out_leaves,
                                                made_leaves)
        if not isinstance(backward, BackwardPlan):
            made_leaves = []
        made_inputs = _made_inputs(tr, made_leaves, out_leaves)
        # The class and name of each result Variable the runner makes (a Parameter or
        # a Constant made in the call, `Variable(a, name="c")`): eager's.
        leaf_class = {i: (type(x), x.name) for i, (x, leaf) in
                      enumerate(zip(out_leaves_raw, out_leaves))
                      if leaf[0] in ("wrap", "out") and isinstance(x, Variable)
                      and (type(x) is not Variable or x.name is not None)}
        made_leaves = [src for src, _ in made_leaves]
        tr.leaf_operands = None     # (Variables of the traced call: not kept)
        if cut:
            _unlink_cut(tr, cut)
        made = [x for x, leaf in zip(out_leaves_raw, out_leaves)
                if leaf[0] == "out" and leaf[2] == VAR]
        # Which result Variables eager gives a creator (computed by a recorded op, not
        # under no_grad, not a new Variable of plain data): only those get the
        # CompiledFunction as theirs. And a result that is the .grad the call sets
        # is that .grad (`loss.backward(); return x.grad`).
        made_pos = {}
        for k, x in enumerate(made):
            made_pos.setdefault(id(x), k)
        has_creator = [x.creator is not None and x.creator in tr.functions
                       for x in made]
        # A result that is a create_graph seed (`y = x + w; y.backward(create_graph=
        # True); return x.grad`) is a Constant in eager: so is the compiled call's.
        made_constant = [type(x) is Constant for x in made]
        # One .grad object on several Variables (`y = x + w; y.backward()`: x.grad is
        # w.grad, the seed) is one object in compiled calls too: every grad effect
        # whose .grad is a result is that result, one whose .grad an earlier effect
        # set is that effect's (grad_same), and a result's .grad that is one of them
        # is that one (made_grad_effect).
        grad_alias, grad_same, first_set = {}, {}, {}
        for gi, (var, _) in enumerate(tr.grad_effects):
            g = grad_of(var)
            if g is None:
                continue
            if id(g) in made_pos:
                grad_alias[gi] = made_pos[id(g)]
            elif id(g) in first_set:
                grad_same[gi] = first_set[id(g)]
            first_set.setdefault(id(g), gi)
        made_grad_effect = {m: first_set[id(xg)] for m, (x, xg, _) in enumerate(tr.made_grads)
                            if xg is not None and id(xg) in first_set
                            and id(xg) not in made_pos}
        # A result's .grad that is another result the graph does not compute (the
        # seed of `y.backward(retain_grad=True); return y.grad, y`): that object.
        made_grad_leaf = {}
        for m, (x, xg, _) in enumerate(tr.made_grads):
            if xg is None or id(xg) in made_pos or m in made_grad_effect:
                continue
            j = next((j for j, o in enumerate(out_leaves_raw) if o is xg), None)
            if j is not None and out_leaves[j][0] == "wrap":
                made_grad_leaf[m] = j
        # A create_graph seed is a Constant (it stores no gradient): a .grad that is
        # one stays one.
        grad_constant = frozenset(gi for gi, (var, _) in enumerate(tr.grad_effects)
                                  if type(grad_of(var)) is Constant)
        # The traced call's Variables (boundary): used here, never kept (they would
        # keep the first call's arguments alive).
        grad_reach = _grad_reach(tr, made, has_creator, boundary) \
            if backward is not None and not isinstance(backward, BackwardEscape) else None
        cut_sets = _cut_sets(tr, made, has_creator) if any(has_creator) else None
        boundary = made = None
    finally:
        tracing.stop(tr, prev)
        tracing.plain_numbers(locs)
        tr.arg_views = None       # tracers hold the trace: no cycle left behind
        tr.rebind_owners = tr.rebind_arrays = tr.rebind_tracers = None  # (nor its arrays)
        tr.made_of_data = None
        tr.scalar_args = None
        tr.arg_containers = None
        for x in leaves:
            if isinstance(x, Variable):
                x._tv = None
    # The traced call's own result: eager's objects (an argument, a captured array,
    # one object twice), computed arrays as plain copies.
    result = unflatten(out_tree, result_objects, argv=(args, kwargs))
    # A change seen only after the call (a draw, a value or a container's size): the
    # line of the function (or of a user function it reaches) that made it, found in
    # the source (trace.sites), else the def line.
    def site(loc=None, container=None, stream=None, skip=()):
        if stream is not None:
            line = sites.draw_line(fn, args, kwargs, reached, stream, skip)
        else:
            line = sites.change_line(fn, args, kwargs, reached, loc, container,
                                     sites.branch_outcomes(tr.graph))
        return line or def_line
    _check_rng(tr, rng_before, site)
    if random.getstate() != py_rng_before:
        tr.escapes.append(("a draw from Python's random module: compiled calls would "
                           "replay it; draw with tracejit functions (F.dropout) or "
                           "NumPy's global stream", site(stream="python")))
    if changed_arg:
        # The traced call changed a copy; eager changes the caller's container.
        p = changed_arg[0]
        where = (f"argument {p[1]}" if p[0] == "a" else f"argument {p[1]!r}") + \
            "".join(f"[{k!r}]" for k in p[2:])
        tr.escapes.append((f"the function changes the list or dict {where} it is "
                           f"passed (item assignment, append, pop); compiled calls "
                           f"would not", site(container=arg_at((args, kwargs), p))))
    # Why it must run eagerly, in the order the reasons are reported: what the tracer
    # saw, then a Python value the function changed, then a backward it cannot compile.
    tr.check_walk_reads()
    escapes = [Escape(*e) for e in tr.escapes + tr.late_escapes]
    # An outside iterator the call advanced, a memoized function it called with traced
    # data: escapes; the memoized calls it made with plain arguments: guarded locations.
    probe_escapes, cached = opaque.findings(probes + [p for _, _, p in probe_swaps])
    escapes += [Escape(*e) for e in probe_escapes]
    locs = locs + (pystate.locations_below(fn, arg_objects, cached) if cached else [])
    # Python values the function changed: a Variable rebound (an RNN's `self.h = h`)
    # is state the runtime can thread through the call (pystate.threaded), anything
    # else compiled calls cannot replay.
    rebound = []
    refused = None
    for loc, old, new in pystate.all_changed(snap_before):
        why = pystate.state_refusal(loc, old, new)
        if why is None:
            rebound.append(loc)
            continue
        if refused is None:
            refused = (loc, old, new, why)
    if refused is not None:
        # Reported whether or not some other state is threadable: the runtime threads
        # that first (call.rebound), and its warm-up may make this change (a lazy
        # Layer's in_size, set by its first call) before the threaded trace.
        loc, old, new, why = refused
        line = tr.line_of.get(new.creator) if isinstance(new, Variable) else None
        line = line or site(loc)
        escapes.append(Escape(
            f"the function changes the Python value {loc.describe()} "
            f"({pystate.describe_value(old)} -> {pystate.describe_value(new)}); "
            f"compiled calls would not" +
            (f" (a rebound Variable is threaded as state, but {why})"
             if isinstance(old, Variable) or isinstance(new, Variable) else ""), line))
    for loc, old, new in pystate.all_changed(arg_snap)[:1]:
        line = tr.line_of.get(new.creator) if isinstance(new, Variable) else None
        line = line or site(loc)
        escapes.append(Escape(
            f"the function changes the Python value {loc.describe()}, reached "
            f"through an argument ({pystate.describe_value(old)} -> "
            f"{pystate.describe_value(new)}); compiled calls would not (state is "
            f"threaded where the function captures it, not through an argument)",
            line))
    if isinstance(backward, BackwardEscape):
        escapes.append(Escape(backward.reason, backward.line))
    # A captured Variable at no location the variant guards (deeper than pystate walks,
    # behind a custom __getattr__ or a property, in a set): a later call would use it
    # even after the user rebinds the path it came by. Eager reads the path anew.
    captured = {id(var): var for _, (kind, var) in tr.captures if kind == "var"}
    unguarded = pystate.unguarded_captures(snap_before + pystate.snapshot(locs), captured)
    if unguarded:
        # Found further out: guarded along their paths (the variant's snapshot).
        locs = locs + pystate.paths_to(fn, arg_objects, {id(v): v for v in unguarded})
        unguarded = pystate.unguarded_captures(pystate.snapshot(locs), captured)
    for var in unguarded:
        label = tr.name_of(var) or var.name or "unnamed"
        escapes.append(Escape(
            f"the function reads a captured Variable ({label}, shape {var.shape}) "
            f"through a path jit does not guard (deeper "
            f"than {pystate._MAX_DEPTH} attribute/item levels, a custom __getattr__, a "
            f"property or a set); compiled calls would not see it rebound",
            tr.capture_lines.get(id(var))))
        break
    # An argument Variable or array that is also captured state (f(x, W) with W the
    # closure's; a captured Parameter or array stored as threaded state): the graph
    # reads it as the argument, so the variant holds while that argument is this object.
    captured_args = {tr.arg_leaf[id(val)]: val for _, val, _ in snap_before
                     if isinstance(val, (Variable, np.ndarray)) and id(val) in tr.arg_leaf}
    side_effects = [SideEffect(*e) for e in tr.side_effects]
    if not escapes:
        grown = pystate.grown(sizes_before)
        if grown is not None:
            loc, container = grown
            side_effects.append(SideEffect(f"changing the size of {loc.label} (append, "
                                           f"insert, pop)", site(loc, container)))
    parts = _forward_parts(tr, n_inputs) if not escapes else {}
    made_grads = tr.made_grads
    tr.made_grads = None          # the trace keeps no result Variable alive
    wrap_grads = tr.wrap_grads if not escapes else {}
    wrap_grad_alias = tr.wrap_grad_alias if not escapes else {}
    return TracedCall(
        graph=tr.graph, n_inputs=n_inputs, n_nodes=n_nodes, grad_mode=grad_mode,
        leaf_forms=tr.leaf_kinds, out_tree=out_tree, out_leaves=out_leaves,
        made_grads=made_grads, has_random=bool(tr.random_nodes), has_creator=has_creator,
        grad_alias=grad_alias, grad_same=grad_same, made_grad_effect=made_grad_effect,
        made_grad_leaf=made_grad_leaf or None, nested_grads=nested if not escapes else [],
        grad_constant=grad_constant, made_constant=made_constant, grad_reach=grad_reach,
        cut_sets=cut_sets, escapes=escapes, made_leaves=made_leaves,
        made_inputs=made_inputs, leaf_class=leaf_class, wrap_grads=wrap_grads,
        wrap_grad_alias=wrap_grad_alias,
        side_effects=side_effects, result=result, grads_before=grads_before,
        # (With the arguments': an object argument keys the variant by identity, and
        # what the caller rebinds on it between calls (`m.buf = new`) is guarded.)
        locations=locs + arg_locs, backward=backward, out_views=out_views,
        rebind_views=bound_views,
        captured_args=sorted(captured_args.items(), key=lambda e: e[0]),
        rebound=rebound or [],
        mutated=frozenset(mutated_inputs(tr)) if backward is not None else frozenset(),
        sources=parts.get("sources", []), effects=parts.get("effects", []),
        grad_effects=parts.get("grad_effects", []), grad_none=parts.get("grad_none", []),
        grad_args=parts.get("grad_args", []),
        leaf_required=parts.get("leaf_required", []), cuts=parts.get("cuts", []),
        walk_untouched=parts.get("walk_untouched", []), walk_undo=tr.walk_undo,
        walk_checks=parts.get("walk_checks", []), walk_reads=parts.get("walk_reads", []),
        grad_late=parts.get("grad_late", {}))


def _forward_parts(tr, n_inputs):
    """Where each forward input comes from at call time, and what the call's effects
    write into, as the next call finds it: an argument is the current call's argument,
    not the traced call's."""
    sources = []
    arg_pos = {id(v): i for i, v in tr.arg_inputs}
    cap_src = {id(v): src for v, src in tr.captures}
    for v in tr.graph.inputs[:n_inputs]:
        if id(v) in arg_pos:
            sources.append(Source("arg", arg_pos[id(v)], None))
        else:
            kind, obj = cap_src[id(v)]
            if kind == "grad" and id(obj) in tr.arg_leaf:
                # An argument's .grad: this call's argument's (the signature says
                # it is set, and its shape and dtype), not the traced call's.
                kind, obj = "arggrad", tr.arg_leaf[id(obj)]
            sources.append(Source(kind, obj, (v.shape, v.dtype)))
    # The .grad Variable of an argument (read in the call, so captured): this call's
    # argument's .grad, not the traced call's.
    grad_var = {id(val): g for g, val in tr.captured_vars.values()}
    arg_grad_leaf = {id(grad_var[id(val)]): tr.arg_leaf[id(var)]
                     for val, (kind, var) in tr.captures
                     if kind == "grad" and id(var) in tr.arg_leaf}

    def target(obj):
        leaf = tr.arg_leaf.get(id(obj))
        if leaf is not None:
            return Target("leaf", leaf)
        leaf = arg_grad_leaf.get(id(obj))
        return Target("leafgrad", leaf) if leaf is not None else Target("obj", obj)

    return dict(
        sources=sources,
        # Variables from outside whose .grad the trace found None (backward set it
        # where it would add now, or the function read None): the variant holds while
        # it is None. (An argument's is in the signature.)
        grad_none=[target(var) for var, was_none in tr.grad_reads.values() if was_none],
        # Variables from outside whose .grad was an argument: it must be that one.
        grad_args=[(target(var), tr.arg_leaf[id(g)]) for var, g in tr.grad_args.values()],
        effects=[Effect(kind, target(obj), v) for kind, obj, v in tr.effects],
        leaf_required=[target(var) for var in tr.backward_leaves.values()],
        cuts=[(ev[0], [target(x) for x in ev[1]]) + tuple(ev[2:])
              for ev in tr.unchain_events],
        # Variables from outside the function touched the .grad of after a backward
        # that went on into the caller's graph, which that walk did not touch: the
        # variant holds while the walk at call time does not either.
        walk_untouched=[(target(var), n) for var, n in tr.after_walk.values()],
        walk_checks=[(target(var), kind, n) for key, (var, kind, n) in tr.walk_checks.items()
                     if tr.walk_check_needed(key)],
        grad_effects=[(target(var), gv) for var, gv in tr.grad_effects],
        # Grad effects set after a walk into the caller's graph (Trace._walk_reset):
        # grad effect index -> that walk.
        grad_late={gi: tr.walk_resets[id(var)][1] for gi, (var, _) in
                   enumerate(tr.grad_effects) if id(var) in tr.walk_resets and
                   tr.walk_resets[id(var)][0] is var},
        # Leaves' .grad read after a backward that went on into the caller's graph
        # added to them: (forward input position, Target, walk) (Trace._walk_read).
        walk_reads=[(pos, target(var), n) for var, _, tv, n in tr.walk_reads.values()
                    for pos, v in enumerate(tr.graph.inputs[:n_inputs]) if v is tv])


def _tracer_args(tr, fn, args, kwargs, leaves, static_argnums, static_argnames, probes):
    """The arguments as the traced function gets them: a Variable is itself (its _tv
    set), an ndarray a TracedArray view, a float a TracedFloat, each a new graph input;
    lists, dicts and tuples are copies of tracers. Fills the Trace's argument tables."""
    seen = {}     # f(x, x): one tracer for both, so an update of one shows in the other
    arg_inputs = []

    def convert(x, name, path):
        if isinstance(x, (Variable, np.ndarray)) and id(x) in seen:
            leaves.append(x)
            tr.leaf_kinds.append(VAR if isinstance(x, Variable) else ARR)
            return seen[id(x)]
        t = convert_new(x, name, path)
        if isinstance(x, (Variable, np.ndarray)):
            seen[id(x)] = t
        elif type(x) in (tuple, list, dict):
            tr.arg_containers[id(t)] = (t, _items(t), path)
        return t

    def convert_new(x, name, path):
        if isinstance(x, Variable):
            leaves.append(x)
            tr.own(x._data)
            tr.leaf_kinds.append(VAR)
            tr.arg_leaf[id(x)] = len(leaves) - 1
            v = tr.add_input(x.shape, x.dtype, x.name or name)
            arg_inputs.append((len(leaves) - 1, v))
            x._tv = v
            tr.arg_vars[id(x)] = (x, v)
            tr.read_arrays[id(v)] = x._data
            return x
        if isinstance(x, np.ndarray):
            leaves.append(x)
            tr.own(x)
            tr.leaf_kinds.append(ARR)
            tr.arg_leaf[id(x)] = len(leaves) - 1
            v = tr.add_input(x.shape, x.dtype, name)
            arg_inputs.append((len(leaves) - 1, v))
            t = x.view(TracedArray)
            t._tv = v
            t._trace = tr
            tr.arg_arrays[id(x)] = (x, v)
            tr.arg_views[id(t)] = (t, len(leaves) - 1, x)
            return t
        if type(x) is float:
            leaves.append(x)
            tr.leaf_kinds.append(FLT)
            v = tr.add_input((), np.float64, name)
            arg_inputs.append((len(leaves) - 1, v))
            t = TracedFloat(x, v, tr)
            tr.arg_views[id(t)] = (t, len(leaves) - 1, x)
            return t
        if isinstance(x, np.generic) and x.dtype.kind == "f":
            t = convert(np.asarray(x), name, path)
            # Its leaf is a new 0-d array each call, not the scalar eager returns.
            tr.arg_views.pop(id(t), None)
            # Traced data standing for the NumPy scalar eager has (isinstance, type,
            # np.isscalar, grad's float64 leaf, a NumPy scalar when returned).
            t._numpy_scalar = True
            tr.scalar_args[id(t)] = (t, t._tv, path)
            return t
        if type(x) in (tuple, list):
            return type(x)(convert(y, f"{name}_{i}", path + (i,)) for i, y in enumerate(x))
        if type(x) is dict:
            return {k: convert(y, f"{name}_{k}", path + (k,)) for k, y in x.items()}
        probe = opaque.probe_for(x, f"argument {name}")
        if probe is not None:
            probes.append(probe)
            return probe
        return x

    named = fn
    while pystate.probe(named, "_tracejit_wrapper", False) is True and wrapped_function(named):
        named = wrapped_function(named)    # grad(f)'s arguments are f's: f's names
    names = arg_names(named, len(args))
    targs = [a if i in static_argnums else convert(a, names[i], ("a", i))
             for i, a in enumerate(args)]
    tkwargs = {k: (a if k in static_argnames else convert(a, k, ("k", k)))
               for k, a in sorted(kwargs.items())}
    tr.arg_inputs = arg_inputs      # (leaf index, input Value)
    # convert and convert_new call each other: a cycle through their cells that would
    # keep the Trace (and the traced call's whole graph) alive until gc runs.
    convert = convert_new = None  # noqa: F841
    return targs, tkwargs


def _check_rng(tr, before, site):
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
        tr.escapes.append(("a random draw the tracer does not see (np.random.* on "
                           "something other than traced data); use tracejit functions "
                           "for random draws",
                           site(stream="numpy", skip=[n.line for n in tr.random_nodes])))


def _same_rng(a, b):
    return a[2] == b[2] and np.array_equal(a[1], b[1])


def _write_back(tr, argv):
    """Make the caller's containers what the traced call made of their copies (as eager
    would have changed them): tracers replaced by the objects they stand for."""
    orig_of = {id(t): arg_at(argv, path) for t, _, path in tr.arg_containers.values()}

    def plain(x):
        if id(x) in orig_of:
            return orig_of[id(x)]
        view = tr.arg_views.get(id(x))
        if view is not None and view[0] is x:
            return view[2]          # an ndarray or float argument itself
        return strip_tracers(x)
    for t, items, path in tr.arg_containers.values():
        if _unchanged_container(t, items):
            continue
        o = orig_of[id(t)]
        if type(o) is list:
            o[:] = [plain(x) for x in t]
        elif type(o) is dict:
            new = {k: plain(x) for k, x in t.items()}
            o.clear()
            o.update(new)


def _items(c):
    return list(c.items()) if type(c) is dict else list(c)


def _unchanged_container(c, items):
    """The traced copy of an argument container still holds what it was made with (the
    same objects): returning the caller's container is returning it."""
    now = _items(c)
    if len(now) != len(items):
        return False
    if type(c) is dict:
        return all((k1 is k2 or k1 == k2) and v1 is v2
                   for (k1, v1), (k2, v2) in zip(now, items))
    return all(a is b for a, b in zip(now, items))


def _made_leaves(tr, raw, leaves):
    """(("made", result leaf index), Variable) per Variable the call made that is a leaf of
    eager's graph when it returns and that a node recorded with grad on reads
    (`c = Variable(np.ones(3)); return x * c, c`; `Variable(x.data)`; a result of
    no_grad or one unchained, used after): eager's backward from the results gives
    it a gradient. Not a Constant (backward stores none), once per object."""
    used = {id(x) for uses in tr.leaf_operands.values() for _, x in uses}
    out, seen = [], set()
    for i, (x, leaf) in enumerate(zip(raw, leaves)):
        if leaf[0] not in ("wrap", "out") or leaf[2] != VAR or not isinstance(x, Variable) \
                or type(x) is Constant or x.creator is not None or id(x) not in used \
                or id(x) in seen:
            continue
        seen.add(id(x))
        out.append((("made", i), x))
    # A .grad a backward inside the call sets on an argument or a captured Variable,
    # then used as an operand (`g = x.grad; return g * c`): a leaf too, that outlives
    # the call on its owner, returned or not ("effgrad": the grad effect's .grad).
    for gi, (var, _) in enumerate(tr.grad_effects):
        g = var._grad
        if g is None or type(g) is Constant or g.creator is not None or \
                id(g) not in used or id(g) in seen:
            continue
        seen.add(id(g))
        out.append((("effgrad", gi), g))
    return out


def _made_inputs(tr, made, leaves):
    """result leaf index -> forward input position, for the made leaves that are a new
    Variable of an array the function made (`Variable(np.ones(3))`, a "constcopy"):
    the graph reads that array as a constant, and the runner gives it the made leaf's
    own array of the call instead, so a backward reads the leaf's data as it is then
    (`c.data *= 2` after the call), as eager's backward does."""
    pos = {id(v): k for k, v in enumerate(tr.graph.inputs)}
    out = {}
    for (kind, i), x in made:
        leaf = leaves[i] if kind == "made" else None
        if leaf is None or leaf[0] != "wrap" or leaf[1][0] != "constcopy":
            continue
        entry = tr.captured_arrays.get(id(leaf[1][1]))
        k = pos.get(id(entry[1])) if entry is not None else None
        if k is not None and k not in out.values():
            out[i] = k
    return out


def _grad_reach(tr, made, has_creator, diff_traced):
    """Per input of a variant's creator (diff_sources order): the output Variables
    whose eager graph reaches it. A backward from some outputs only leaves the others'
    inputs' gradients None, as eager's does (not zeros). None when every input is
    reached from every output (one output: always), the common case, which costs
    nothing then."""
    if sum(has_creator) < 2:
        return None
    pos = {}
    for j, var in enumerate(diff_traced):
        pos.setdefault(id(var), []).append(j)
    reach = [set() for _ in diff_traced]
    for k, (y, c) in enumerate(zip(made, has_creator)):
        if not c:
            continue
        stack, seen = [y.creator], {id(y.creator)}
        while stack:
            f = stack.pop()
            for x in f.inputs:
                js = pos.get(id(x))
                if js is not None:
                    for j in js:
                        reach[j].add(k)
                elif x.creator is not None and x.creator in tr.functions \
                        and id(x.creator) not in seen:
                    seen.add(id(x.creator))
                    stack.append(x.creator)
    every = {k for k, c in enumerate(has_creator) if c}
    if all(r == every for r in reach):
        return None
    return [frozenset(r) for r in reach]


def _cut_sets(tr, made, has_creator):
    """What unchain_backward cuts inside the call, per output Variable eager gives a
    creator: (position, ancestry). ancestry[k]: the Variables made in the call (numbered)
    that are inputs of the Functions output k comes from, the ones eager's walk from k
    unchains; position[k]: output k's own number among them (None: no Function in the
    call uses it). A compiled call reached through output k cuts as eager would when
    no output left chained comes from those Variables (CompiledFunction.cut)."""
    number = {}
    ancestry = []
    for y, c in zip(made, has_creator):
        if not c:
            ancestry.append(frozenset())
            continue
        found, stack, seen = set(), [y.creator], {id(y.creator)}
        while stack:
            f = stack.pop()
            for x in f.inputs:
                if x.creator is not None and x.creator in tr.functions:
                    found.add(number.setdefault(id(x), len(number)))
                    if id(x.creator) not in seen:
                        seen.add(id(x.creator))
                        stack.append(x.creator)
        ancestry.append(frozenset(found))
    position = [number.get(id(y)) if c else None for y, c in zip(made, has_creator)]
    return position, ancestry


def _cut_in_call(tr, n_nodes):
    """ids of the forward Values whose Variable the function unchained (unchain_backward
    from something after it, unchain(), `creator = None`): made by a differentiable
    node, they have no creator when the call returns. Eager's graph stops there."""
    cut = set()
    for n in tr.graph.nodes[:n_nodes]:
        meta = tr.grad_meta.get(id(n))
        if meta is None or not meta[0]:
            continue
        for v in n.outputs:
            y = tr.owner.get(id(v))
            if y is not None and y.creator is None:
                cut.add(id(v))
    return cut


def _unlink_cut(tr, cut):
    """A create_graph replay links each node's operands as eager's graph does after the
    call: an operand whose Variable was unchained is a leaf there (the compiled backward
    is traced on the cut graph already; the replay reads grad_meta, recorded before)."""
    for key, (grad, links) in list(tr.grad_meta.items()):
        if any(u is not None and id(u) in cut for u in links):
            tr.grad_meta[key] = (grad, tuple(None if u is not None and id(u) in cut else u
                                             for u in links))


def _nested_grads(tr, grad_of, raw, leaves):
    """The .grad of a .grad the call set on an argument or captured Variable (x.grad,
    made by one backward, is a leaf of the next: F.sum(x.grad * w)): [(grad effect
    index, Value of x.grad.grad, whether it is a Constant)], one per x.grad object, and
    (why, the user's line or '') for one the runner cannot set as eager does, else None.
    An x.grad the graph computes that is returned has its .grad set as a result's
    (made_grads); one returned as that .grad (a seed passed through: "arggrad",
    "capgrad" leaves) is the object the runner sets it on. x.grad.grad must be an
    object of its own, with no history (a compiled call gives it none), no .grad
    itself, and read by no op (a leaf the compiled backward would give no gradient)."""
    results = {id(x) for x in raw}
    computed = {id(x) for x, leaf in zip(raw, leaves) if leaf[0] == "out"}
    used = {id(x) for uses in tr.leaf_operands.values() for _, x in uses}
    grads = [grad_of(var) for var in tr.grad_writes.values()]
    owners = {}     # id(x.grad.grad) -> the x.grad objects holding it
    for g in grads:
        if g is not None and g._grad is not None:
            owners.setdefault(id(g._grad), set()).add(id(g))
    out, seen = [], set()
    for gi, g in enumerate(grads):
        if g is None or g._grad is None or tr.is_live(g) or id(g) in computed \
                or id(g) in seen:
            continue
        seen.add(id(g))
        gg = g._grad
        why = "it is a result or a .grad elsewhere" if id(gg) in results or \
            len(owners[id(gg)]) > 1 or tr.is_live(gg) or any(gg is h for h in grads) else \
            "it has a history" if gg.creator is not None else \
            "it has a .grad of its own: x.grad.grad.grad" if gg._grad is not None else \
            "an op reads it: a backward through it would give it a .grad" \
            if id(gg) in used else \
            None if isinstance(gg._data, np.ndarray) else "it holds no array"
        if why is not None:
            return [], (why, tr.made_grad_lines.get(id(g), ""))
        out.append((gi, tr.value_of(gg), type(gg) is Constant))
    return out, None


def _grads_before_walks(tr):
    """var -> the .grad the call leaves on var before the walks into the caller's graph
    it repeats (Trace.backward_outside): as the first such walk that touches var found
    it (the function touches it no more after), else the .grad it has."""
    walked = tr.walk_grads

    def grad_of(var):
        entry = walked.get(id(var))
        return entry[1] if entry is not None and entry[0] is var else var._grad
    return grad_of


def _unshare_grads(tr, vars_, grad_of=None):
    """The traced call's .grad objects holding an array the graph reads as a capture
    made in the call (backward's seed: `loss = x + 1.0` gives x.grad the seed itself)
    get a copy: the caller may change them in place (ClipGrad), the graph's must not.
    Returns id(old array) -> (old array, its copy)."""
    copied = {}
    for var in vars_:
        g = var._grad if grad_of is None else grad_of(var)
        if g is not None and id(g._data) in tr.captured_arrays and \
                id(g._data) not in tr.names:
            old = g._data
            g._data = old.copy(order="K")
            copied[id(old)] = (old, g._data)
    return copied


def _rebind_on_grads(tr, views):
    """A Variable the call rebound to (a view of) a .grad it set (`W.data = x.grad.data`),
    or to what such a Variable holds (`V.data = W.data`), holds it on the array that
    .grad holds now: _unshare_grads may have given it a copy of the graph's constant
    (the seed), which the stored array still is."""
    grads = list(tr.grad_writes.values())
    for e, ((where, r), steps) in sorted(views.items()):
        var = tr.effects[e][1]
        if where not in ("grad", "rebind") or var._data is not tr.rebind_arrays[e]:
            continue        # (rebound again since)
        base = grads[r]._grad._data if where == "grad" else tr.effects[r][1]._data
        view = replay_view(base, steps)
        if view is not None:
            var._data = view


def _var_label(tr, var):
    return tr.name_of(var) or var.name or "a captured Variable"


def _rebuild_owned_views(tr, raw, leaves, views, objects):
    """The traced call's own results that are views of a .grad the call set, of a
    result's retained .grad or of a returned `Variable(np.ones(3))` (result_views'
    "grad", "madegrad" and made "leaf" roots), or of an array the function made
    ("copy"), or of what a rebound Variable holds ("rebind": _rebind_on_grads may
    have moved it onto such a copy), and views of those, rebuilt on the array that object holds now (on a
    copy, for "copy"): _unshare_grads and result_leaves gave it a copy of the
    graph's constant, which the views the trace took still point into (a write into
    one would change the constant every later call reads)."""
    grads = list(tr.grad_writes.values())
    made = [x for x, leaf in zip(raw, leaves) if leaf[0] == "out" and leaf[2] == VAR]

    copies = {}
    inputs = tr.graph.inputs
    made_arrays = {id(v): a for a, v in tr.captured_arrays.values()}

    def owned(i):
        (where, r), _ = views[i]
        if where in ("grad", "madegrad", "copy", "rebind"):
            return True
        return where == "leaf" and (leaves[r][0] != "out" or (r in views and owned(r)))
    todo, done = sorted(i for i in views if owned(i)), set()
    while todo:
        later = []
        for i in todo:
            (where, r), steps = views[i]
            if where == "leaf" and r in views and owned(r) and r not in done:
                later.append(i)     # a view of a view: its base rebuilt first
                continue
            done.add(i)
            if where == "copy":     # one new array per made array, as variant's cp{r}
                if r not in copies:
                    a = made_arrays[id(inputs[r])]
                    copies[r] = (a.view(np.ndarray) if type(a) is not np.ndarray
                                 else a).copy(order="K")
                base = copies[r]
            elif where == "rebind":     # the array the rebound Variable holds now
                base = tr.effects[r][1]._data
            else:
                base = grads[r]._grad if where == "grad" else \
                    made[r]._grad if where == "madegrad" else objects[r]
            base = base._data if isinstance(base, Variable) else base
            view = replay_view(base, steps) if isinstance(base, np.ndarray) else None
            if view is None:
                continue
            if isinstance(objects[i], Variable):
                objects[i]._data = view
            else:
                objects[i] = view
        if len(later) == len(todo):
            break
        todo = later


def _unreturned_grad_graph(tr, results, grad_of):
    """A .grad the call set (on a Variable from outside or a result) that has a creator
    from the trace and is not itself a result: the variant's runner sets it as a plain
    Variable, only a result gets the compiled call as its creator."""
    returned = {id(x) for x in results}
    for var in list(tr.grad_writes.values()) + [x for x, _, _ in tr.made_grads]:
        g = grad_of(var)
        if g is not None and g.creator is not None and g.creator in tr.functions and \
                id(g) not in returned:
            return True
    return False


def _partial_values(fn, depth=0):
    """The arguments a functools.partial (nested ones too) holds for fn."""
    if not isinstance(fn, functools.partial) or depth > 8:
        return []
    return list(fn.args) + list(fn.keywords.values()) + _partial_values(fn.func, depth + 1)
