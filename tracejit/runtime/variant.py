"""A variant at run time: one traced graph, compiled, and the code that calls it.

A variant reads its inputs (arguments and live captures), runs the compiled forward
graph, replays the effects the trace recorded (in-place updates, new .grad values),
and wraps the outputs in Variables whose one creator, a CompiledFunction, runs the
compiled backward graph. The per-variant Python that does this is generated source
(build_runner), so the hot path is straight-line code.
"""
import os
import weakref
from functools import partial

import numpy as np

from tracejit import core
from tracejit.ir import interpret
from tracejit.core import Config, Constant, RegionFunction, Variable
from tracejit.ir import Graph, Lit, Value
from tracejit.passes import FUSED
from tracejit.trace.pytree import (FLT, PYTHON_SCALAR, SCALAR, VAR, replay_view,
                                   structure_source)
from tracejit.runtime.signature import matcher_lines
from tracejit.ops.trace_only import (GUARD, GuardFailure, UserBackward, UserBackwardMismatch,
                                UserCall, running_backward, take_calls)


class JitWarning(UserWarning):
    """tracejit ran something eagerly, or saw a side effect that only runs while tracing."""


class CompiledFunction(RegionFunction):
    """The one creator of a compiled call's outputs: its backward is a compiled graph."""

    rng = None    # NumPy's random state before the call, if the region draws numbers
    # The .grads eager's Variables inside the call hold (none of the results): id(
    # Value) -> (Value, gradient Variable). A backward with retain_grad keeps them on
    # every intermediate it passes (and a backward inside the function may have left
    # some, stale_init), and a later walk through the call adds each to the gradient
    # flowing past it, as eager's does: that walk is eager's backward replayed.
    stale = None
    # The ones a backward inside the function left, as it left them (stale_init).
    held = None
    # Whether the walk now running this backward keeps its gradients in .grad (set by
    # reached_grads, which every walk reaching a call with stale .grads calls first):
    # only such a walk reads them (one with gradients kept aside, grad(), does not).
    walk_reads_grads = True

    def __init__(self, variant, saved, arrays):
        self.variant = variant
        self.saved = saved
        self.arrays = arrays      # the call's inputs, for a create_graph replay
        # The instances of this call's user Functions with per-call state (UserCall):
        # its backward runs on them, as eager's does.
        self.instances = take_calls(variant.user_calls) if variant.user_calls else None

    def output_grads(self, store=core._AttrGrads):
        """The outputs' gradients, None for one nobody used (not zeros: the backward
        fills those in, and knows which outputs a backward started from)."""
        gys = []
        for ref in self.outputs:
            y = ref()
            gys.append(None if y is None else store.get(y))
        return gys

    def reached_grads(self, store, reached):
        """The outputs' gradients (output_grads) where eager's walk reads them: an
        output the walk did not reach whose .grad was set before it (retained by an
        earlier backward, set by the caller) is read only where a reached output
        depends on it inside the call (`return loss, h`: eager's walk from loss passes
        through h); elsewhere eager never enters that part of the call, and the .grad
        stays as it is (None here: not read, not cleared)."""
        self.walk_reads_grads = store is core._AttrGrads
        gys = self.output_grads(store)
        unreached = [k for k, (ref, g) in enumerate(zip(self.outputs, gys))
                     if g is not None and id(ref()) not in reached]
        if unreached:
            upstream = self.variant.outputs_upstream()
            live = [j for j, g in enumerate(gys) if g is not None and j not in unreached]
            for k in unreached:
                if not any(k in upstream[j] for j in live):
                    gys[k] = None
        return gys

    def stale_init(self):
        """The .grads a backward inside the function left on the call's intermediates
        (Variant.stale_grads): the last outputs of the graph, after what it saved."""
        n = len(self.variant.bwd.saved)
        self.stale = {id(val): (val, Variable(a)) for val, a in
                      zip(self.variant.stale_grads, self.saved[n:])}
        # As the call left them: a create_graph walk reads such a .grad with the
        # history eager's has (_held_twins).
        self.held = {key: sg for key, (_, sg) in self.stale.items()}

    def link_held(self, k, y):
        """The held .grad k (stale_init) is the result y the call returns (`return
        y2.grad` after `loss.backward(retain_grad=True)` inside it): in eager they are
        one Variable, so a walk through the call adds that very Variable to what flows
        past y2, and a later backward through the sum (create_graph) reaches the
        returned y2.grad and sets its .grad. A fresh Variable of the same array would
        take that .grad instead, leaving the result's None."""
        key = id(self.variant.stale_grads[k])
        self.stale[key] = (self.stale[key][0], y)
        self.held[key] = y

    def hold_upstream(self, holds):
        """Hold the results other results of this call are computed from (`S['h'] = h;
        return F.sum(h * 2.0)`, `return loss, h`) while one computed from them lives,
        as eager's graph holds an intermediate: the caller may drop its own reference
        (`S['h'] = None`) before a backward from the other, whose walk through the call
        reads the dropped one's .grad (a backward inside the call retained it, or the
        caller set it) and adds it to what flows on, as eager's walk does. holds: per
        result j, the results it is computed from (Variant.upstream_holds). Each hold
        ends when the last result computed from it dies (a weak reference's callback),
        and with it the cycle result -> creator -> result it makes."""
        outs = self.outputs
        held, refs = {}, {}
        for j, ks in holds:
            y = outs[j]()
            ks = [k for k in ks if outs[k]() is not None]
            if y is None or not ks:
                continue
            for k in ks:
                entry = held.get(k)
                if entry is None:
                    held[k] = [1, outs[k]()]
                else:
                    entry[0] += 1
            refs[j] = (weakref.ref(y, partial(_release_held, held, ks)), ks)
        self.upstream_held = held, refs

    def release_upstream(self, j):
        """Result j is no longer computed from this call (unchained): the results it
        held (hold_upstream) are released as eager's cut graph releases them."""
        held, refs = getattr(self, "upstream_held", (None, {}))
        entry = refs.pop(j, None)
        if entry is not None:
            _release_held(held, entry[1], None)

    def _stale_reached(self, gys):
        """Whether a walk from the outputs with a gradient in gys passes a Variable of
        the call that holds a .grad (stale)."""
        v = self.variant
        if v.bwd.replay_refusal or core._state.trace is not None:
            return False
        anc = v.output_ancestry()
        return any(g is not None and any(k in anc[j] for k in self.stale)
                   for j, g in enumerate(gys))

    def _backward_replayed(self, gys, retain=False):
        """_eager_backward on the call's own user Function instances."""
        if self.instances is None:
            return self._eager_backward(gys, retain)
        with running_backward(self.instances):
            return self._eager_backward(gys, retain)

    def backward(self, *gys):
        v = self.variant
        if self.stale and self.walk_reads_grads and self._stale_reached(gys):
            return self._backward_replayed(gys)
        if self.instances is None and not v.check_backward:
            st = core._state
            if not st.enable_backprop and st.trace is None:
                # The common case, kept one call deep.
                return (v.backward_runner or v.build_backward_runner())(self, gys)
            return self._backward(gys)
        return self._backward_with_instances(gys)

    def _backward_with_instances(self, gys):
        if self.instances is None:
            return self._backward(gys)
        with running_backward(self.instances):
            try:
                return self._backward(gys)
            except UserBackwardMismatch:
                # This call's user backward gives gradients to other inputs (or of
                # other dtypes) than the traced call's did: this backward runs eagerly,
                # on the call's own instances, so the gradients and their None-ness are
                # eager's.
                return self._eager_backward(gys)

    @property
    def sets_output_grads(self):
        """With retain_grad, this call's backward also gives the gradients its results
        end with (backward_retaining): a result another result depends on (`return
        loss, h`) is an intermediate of eager's graph, whose .grad retain_grad keeps
        as the whole cotangent through it, which the compiled backward never forms.
        With create_graph, any call: eager's intermediates keep their gradients, and
        a later backward through the gradients' graphs adds to them (and passes the
        sums on), so the replay's intermediates must keep theirs too. False where the
        region cannot be replayed (a nested trace, a replay refusal)."""
        v = self.variant
        if v.bwd is None or v.bwd.replay_refusal or core._state.trace is not None:
            return False
        if Config.enable_backprop:      # (_backward_step sets it to create_graph)
            return True
        if v.feeding_results is None:
            v.feeding_results = _results_feeding_results(v)
        # Or the call has intermediates: each keeps its gradient (stale), which a
        # later walk through the call (from a result kept as state, the same loss
        # again) adds to what flows past it.
        return v.feeding_results or v.has_intermediates()

    def backward_retaining(self, gys):
        """(input gradients, output gradients) for a backward with retain_grad: eager's
        backward over the region replayed (_eager_backward), whose results keep their
        gradients; an output gradient None where the replay gave the result none (its
        .grad stays as it is, as eager leaves an unreached Variable's)."""
        return self._backward_replayed(gys, retain=True)

    def _eager_backward(self, gys, retain=False):
        """The gradients of this call's inputs by eager's backward over the region
        replayed on Variables. Under create_graph the replay starts from the call's
        own inputs, so the gradients carry the history higher orders need; else fresh
        leaves stand for them. With `retain`, also the gradients the results' twins
        end with (retain_grad: each the cotangent through that result)."""
        v = self.variant
        g = v.forward_graph
        create = bool(Config.enable_backprop)
        diff_pos = v.bwd.joint_diff_position
        leaves = list(self.inputs) if create else [Variable(x._data) for x in self.inputs]
        env = [leaves[diff_pos[i]] if i in diff_pos else
               Constant(current_input(v, i, self.arrays[i])) for i in range(len(g.inputs))]
        inputs, env = v.with_made_leaves(g.inputs, env, leaves)
        user = Graph(g.name, inputs, g.nodes, g.outputs[:v.n_user_outs])
        rng = None
        if self.rng is not None:
            rng = np.random.get_state()
            np.random.set_state(self.rng)
        adopt = None
        if retain and create:
            # The results' gradients carry history through the results themselves,
            # as eager's do: a later backward through h.grad reaches h and adds to
            # the .grad it kept, as eager's does. So the replay's graph is made of
            # this call's own results (as expand() makes it).
            adopt = {}
            for ref, slot in zip(self.outputs, v.var_slots):
                mine = ref()
                if mine is not None and mine.creator is self:
                    adopt[id(user.outputs[slot])] = mine
        of_value = {}
        saved = v.saved_map(self)
        held = self._held_twins(saved) if create and self.held else {}
        # An input rebound since the call (`x.data = ...`, maybe to another shape or
        # dtype): eager's Functions ran their forward on the call's array (a Reshape
        # keeps the shape it had, a view of it is of the call's buffer) and read the
        # new one only in their backward. So the replay's forward runs on the call's
        # array, and the backward walk (after) on the Variable as it is now.
        swapped = []
        for i, k in diff_pos.items():
            x = leaves[k]
            if i < len(self.arrays) and x._data is not self.arrays[i]:
                swapped.append((x, x._data))
                x._data = self.arrays[i]
        try:
            with core.using_config("enable_backprop", True):
                twins = interpret.run_with_variables(user, env, v.bwd.joint_meta,
                                                     saved, self.instances,
                                                     adopt=adopt, twins=of_value,
                                                     leaf_arrays=v.leaf_arrays(self))
        finally:
            for x, data in swapped:
                x._data = data
            if rng is not None:
                np.random.set_state(rng)
        var_slots = v.var_slots
        grads, roots = core.DictGrads(), []
        # The .grads the call's intermediates hold: the walk adds to them, as eager's.
        keeps = self.walk_reads_grads
        for key, (_, sg) in (self.stale or {}).items() if keeps else ():
            grads.set(of_value[key], of_value[held[key]] if key in held else sg)
        for gy, slot in zip(gys, var_slots):
            twin = twins[slot]
            if gy is not None and twin.creator is not None:
                grads.set(twin, gy)
                roots.append(twin)
        if create:
            # Walk only the replayed region: the call's inputs have creators of their
            # own (the graph before the call), which the outer backward visits.
            core.backprop(roots, grads=grads, create_graph=True, retain_grad=retain,
                          within=core.region_between(roots, leaves))
        else:
            with core.no_grad():
                core.backprop(roots, grads=grads, retain_grad=retain)
        gxs = tuple(grads.get(x) for x in leaves)
        if keeps:
            self._keep_stale(grads, of_value, retain)
        if not retain:
            return gxs
        if create:
            # retain_grad keeps every intermediate's gradient in eager, and a later
            # backward through those gradients' graphs adds to them: the replay's
            # intermediates keep theirs as eager's do (the leaves' go to the caller).
            stop = {id(x) for x in leaves}
            for key, (var, g) in grads.items():
                if key not in stop:
                    var._grad = g
        return gxs, tuple(grads.get(twins[slot]) for slot in var_slots)

    def _held_twins(self, saved):
        """For a create_graph replay: id(Value of an intermediate) -> id(Value of the
        .grad the backward inside the call left on it, not changed since by a walk),
        where that .grad is a value of the forward graph. Eager's .grad there has the
        history that backward gave it (create_graph=True: through the call's values
        to its inputs), which a walk adding to it passes on to the gradients it
        gives; so the walk adds the replay's Variable of it, holding the value the
        call computed (put in saved), not a leaf."""
        v = self.variant
        made = {id(val) for n in v.forward_graph.nodes for val in n.outputs}
        stale = self.stale or {}
        out = {}
        for key, sg in self.held.items():
            gv = v.held_grad_values.get(key)
            if gv is None:
                continue
            if stale.get(key, (None, None))[1] is sg and id(gv) in made:
                saved[id(gv)] = sg._data
                out[key] = id(gv)
        return out

    def _keep_stale(self, grads, of_value, retain):
        """The .grads the call's intermediates hold after a replayed walk: with
        retain_grad, each one the walk gave one (the sum); without, those it passed
        cleared, the others as they were. Not the results' (their own .grad) nor the
        inputs'."""
        v = self.variant
        # (A slot eager gives no creator, a dead entry of outputs, is no result of the
        # call: `c = Variable(h.data); return y, c` returns the made leaf c over h's
        # Value, which is eager's intermediate h, whose .grad a later walk adds to; it
        # was not kept, and a second walk through the call gave `h = x * W`'s W less.)
        results = {id(v.forward_graph.outputs[s]) for s, ref in zip(v.var_slots, self.outputs)
                   if ref is not _dead_ref}
        inputs = {id(x) for x in v.forward_graph.inputs}
        stale = dict(self.stale or {})
        values = {id(val): val for n in v.forward_graph.nodes for val in n.outputs}
        for key, twin in of_value.items():
            if key in results or key in inputs or key not in values:
                continue
            g = grads.get(twin)
            if g is not None and (retain or key in stale):
                stale[key] = (values[key], g)
            elif key in stale and g is None:
                del stale[key]
        self.stale = stale or None

    def _from_live_outputs(self, gys, grads):
        """The gradients the backward graph gave (the compiled one, or interpreted) for
        a backward from some of the outputs (the others got no gradient), made eager's.

        The backward graph adds the dead outputs' zero contributions, which eager's
        backward never computes. Their dtype may promote a gradient: each is cast to the
        dtype eager's backward from the live outputs, with gradients of the dtypes they
        have (a float64 one into a float32 output), gives it (casting back is exact).
        And a zero times an infinity is NaN (`0 * x` in tanh(x * W)'s backward with an
        infinite x): a gradient with a non-finite entry is eager's backward over the
        region replayed instead (as exact as eager, rarely needed). Not for a backward
        eager's graph replayed (_eager_backward): it is eager's already."""
        if all(g is not None for g in gys):
            return grads
        table = self.variant.grad_dtypes
        if table is not None:
            live = []
            for k, g in enumerate(gys):
                if g is not None and k in table:
                    row = table[k].get(g.dtype)
                    if row is None:
                        # A gradient of a dtype no row was made for (float16).
                        return self._replayed(gys, grads)
                    live.append(row)
            out = []
            for j, g in enumerate(grads):
                dts = [row[j] for row in live if row[j] is not None]
                if g is not None and dts:
                    want = np.result_type(*dts)
                    if g.dtype != want:
                        from tracejit import functions as F
                        g = F.cast(g, want) if Config.enable_backprop else \
                            Variable(g._data.astype(want))
                out.append(g)
            grads = tuple(out)
        for g in grads:
            if g is not None and not np.isfinite(g._data).all():
                return self._replayed(gys, grads)
        return grads

    def rebound_beside_made_leaves(self):
        """The caller rebound an argument's (or a captured Variable's) .data since the
        call, which made leaves (`c = Variable(x.data)` holds the old array, returned
        or not): eager's backward reads x's uses from the new array and c's from the
        old, where the compiled graph has one value for both. Only eager's backward
        replayed (its leaves of the old array: Variant.leaf_arrays) follows that."""
        v = self.variant
        return v.replay_rebound and (
            any(self.inputs[k]._data is not self.arrays[i]
                for i, k in v.arg_var_pos.items()) or
            any(kind == "var" and current_input(v, i, self.arrays[i]) is not self.arrays[i]
                for i, (kind, _, _) in enumerate(v.sources)))

    def rebound_respecified(self):
        """The caller rebound an argument's (or a captured Variable's) .data since the
        call to an array of another shape or dtype (respecified): eager's backward
        reads it there (`gy * x.data` in a Mul's, a user backward's `self.inputs[0]
        .data`), which the compiled graphs, made for the call's shapes and dtypes,
        cannot (current_input gives them the call's array: silently the old data).
        Only eager's backward replayed follows it. (Not for an input no node of the
        call reads: nothing reads it, and the compiled backward stays exact.)"""
        v = self.variant
        read = v.read_inputs()
        return any(respecified(self.inputs[k]._data, self.arrays[i])
                   for i, k in v.arg_var_pos.items() if i in read) or \
            any(kind == "var" and i in read and respecified(obj._data, self.arrays[i])
                for i, (kind, obj, _) in enumerate(v.sources))

    def _replayed(self, gys, grads):
        """_eager_backward, where the region can be replayed (else `grads`)."""
        if self.variant.bwd.replay_refusal or core._state.trace is not None:
            return grads
        return self._eager_backward(gys)

    def _backward(self, gys):
        v = self.variant
        if v.check_backward:
            # The trace-time check against eager: the backward graph interpreted on
            # what this call saved (wiring and graph checked, no compile it may not need).
            return _backward_other_gy(self, gys)
        if not Config.enable_backprop and core._state.trace is None:
            run = v.backward_runner or v.build_backward_runner()
            return run(self, gys)
        if Config.enable_backprop:
            # create_graph: replay forward and backward on Variables, so the grads
            # carry the history that higher-order derivatives need.
            refusal = v.bwd.replay_refusal
            if refusal:
                raise RuntimeError(
                    f"backward(create_graph=True) through jit({v.forward_graph.name}): "
                    f"{refusal}, which a replay of its graph cannot follow. Run it "
                    f"eagerly (tj.disable_jit()).")
            if len(gys) > 1 and any(g is None for g in gys):
                # Some outputs got no gradient (a threaded state nobody used): eager's
                # backward never walks their part of the call, where the joint graph
                # would add zeros through it, and the gradients would be differentiable
                # (a second-order gradient a Variable) where eager's are not.
                return self._eager_backward(gys)
            if self.rebound_respecified():
                # Rebound to another shape or dtype, which the joint graph's replay
                # reads as the call's array where it is not a differentiable input.
                return self._eager_backward(gys)
            if v.leaf_inputs and v.leaf_arrays(self) is not None:
                # The caller rebound the data of an input the forward read as a fresh
                # leaf (`x.data.sum().item()`, `c = Variable(x.data)`): eager's backward
                # reads the new array where its code reads `.data` then (a user
                # Function's `np.tanh(self.inputs[0].data)`) and the old one through
                # the forward's leaves, which the joint graph, one value for both,
                # cannot tell apart. Eager's backward over the forward replayed can
                # (its forward on the call's arrays), also where the call updated the
                # input in place (`x.data *= 0.9` in f is such a read).
                return self._eager_backward(gys)
            if self.rng is None:
                return v.backward_with_variables(self, gys)
            # The replay draws what the call drew (the same masks), and the global
            # stream goes on from where it is now.
            now = np.random.get_state()
            np.random.set_state(self.rng)
            try:
                return v.backward_with_variables(self, gys)
            finally:
                np.random.set_state(now)
        grads = v.backward_executable()(self.backward_inputs(gys))
        return self._from_live_outputs(gys, tuple(
            None if slot is None else Variable(grads[slot]) for slot in v.bwd_grad_slots))

    def backward_inputs(self, gys):
        """The backward graph's inputs, as the generated backward runner reads them."""
        v = self.variant
        arrays = []
        for kind, i in v.bwd_sources:
            if kind == "saved":
                arrays.append(self.saved[i])
            elif kind == "input":
                arrays.append(current_input(v, i, self.arrays[i], self.inputs))
            elif kind == "madedata":      # a made leaf's data as it is now
                arrays.append(self.inputs[i]._data)
            elif kind != "gy":
                arrays.append(read_capture(kind, i))
            else:
                g = gys[i]
                arrays.append(g._data if g is not None else
                              np.zeros(v.out_specs[i].shape, v.out_specs[i].dtype))
        return arrays

    def output_specs(self):
        # An output that died still needs zeros of its shape for the backward: the
        # variant knows them (the shape rule of a compiled call is the trace).
        return list(self.variant.out_specs)

    def expand(self):
        """Turn this call back into the eager graph it stands for (unchain_backward cuts
        inside a region, which one CompiledFunction cannot express). Returns the
        replay's results: this call's own where they were still chained to it."""
        v = self.variant
        g = v.forward_graph
        if v.has_random:
            raise NotImplementedError(
                f"unchain_backward() on the output of jit({g.name}), which draws random "
                f"numbers: the region cannot be replayed with the same draws. Unchain an "
                f"eager Variable instead, or run the function eagerly (tj.disable_jit()).")
        diff_pos = v.bwd.joint_diff_position
        env = [self.inputs[diff_pos[i]] if i in diff_pos else Constant(self.arrays[i])
               for i in range(len(g.inputs))]
        inputs, env = v.with_made_leaves(g.inputs, env, self.inputs)
        user = Graph(g.name, inputs, g.nodes, g.outputs[:v.n_user_outs])
        # This call's outputs still chained to it become the replay's own: the Functions
        # after them in the call read them, so the walk that cuts the replay cuts them
        # (a result that is also used inside the call, `return loss, h`, is unchained as
        # eager's is, not left with a creator of the replay).
        adopt = {}
        for ref, slot in zip(self.outputs, v.var_slots):
            mine = ref()
            if mine is not None and mine.creator is self:
                adopt[id(user.outputs[slot])] = mine
        with core.using_config("enable_backprop", True):
            return interpret.run_with_variables(user, env, v.bwd.joint_meta,
                                                v.saved_map(self), self.instances,
                                                adopt=adopt, leaf_arrays=v.leaf_arrays(self))

    def reach(self, y):
        """unchain_backward's walk reached this call through its output y (which it
        unchains): (y's output slot, the inputs y's graph reaches, which the walk goes
        on to). What else to cut is settled once the walk is done (finish_cut)."""
        v = self.variant
        k = next((m for m, r in enumerate(self.outputs) if r() is y), None)
        if v.cut_sets is None or k is None:
            self.expand()
            return None
        reach = v.grad_reach
        if reach is None:
            return k, list(self.inputs)
        return k, [x for x, r in zip(self.inputs, reach) if k in r]

    def finish_cut(self, slots):
        """Cut this call as eager's walk cuts the Functions it stands for, the walk
        having reached it through the outputs at `slots`. Eager's walk unchains the
        Variables those come from inside the call (Variant.cut_sets): the outputs among
        them are unchained too, and no longer this call's, like the reached ones
        (their slots dead: a backward from the outputs left gives them no gradient).
        Where an output left chained comes from Variables eager cut, one creator cannot
        express it: the call's eager graph takes its place, cut the same way."""
        v = self.variant
        refs = self.outputs
        position, ancestry = v.cut_sets
        cut = getattr(self, "cut_vars", frozenset()).union(*[ancestry[k] for k in slots])
        self.cut_vars = cut
        for k in slots:
            refs[k] = _dead_ref
            self.release_upstream(k)
        rest = []
        for m, r in enumerate(refs):
            z = r()
            if z is None or z.creator is not self:
                continue
            if position[m] in cut:
                refs[m] = _dead_ref
                self.release_upstream(m)
                z.unchain()
            else:
                rest.append(m)
        if not any(ancestry[m] & cut for m in rest) or not self.inputs:
            return          # (inputless: a backward from it reaches nothing outside)
        twins = self.expand()
        # The replay cut from the reached results, as eager's walk: every input of the
        # Functions they come from unchained, up to the call's inputs (the walk went
        # on from those already).
        stop = {id(x) for x in self.inputs}
        todo = [twins[v.var_slots[k]].creator for k in slots]
        seen = set()
        while todo:
            f = todo.pop()
            if f is None or f in seen:
                continue
            seen.add(f)
            for x in f.inputs:
                if id(x) not in stop and x.creator is not None:
                    todo.append(x.creator)
                x.unchain()


class PartialCompiledFunction(CompiledFunction):
    """The creator of a call whose outputs do not all depend on all its inputs
    (Variant.grad_reach): a backward from some outputs leaves None the gradients of
    inputs only the others depend on, as eager's does; the backward graph gives zeros.
    A class of its own so that the common call pays nothing for it."""

    def backward(self, *gys):
        grads = CompiledFunction.backward(self, *gys)
        if any(g is None for g in gys):
            live = {k for k, g in enumerate(gys) if g is not None}
            grads = tuple(None if not (r & live) else g
                          for g, r in zip(grads, self.variant.grad_reach))
        return grads


class InputlessCompiledFunction(CompiledFunction):
    """The creator of a compiled call's outputs when nothing outside the call is
    differentiable (every argument an ndarray or float, nothing captured) and no
    result is computed from another: eager's outputs still have creators (`F.tanh(x)`
    wraps x in a Variable of its own), which graph walkers read (get_dot_graph,
    unchain_backward), and a backward from them reaches nothing outside the call; so
    does this one's."""

    inputs = ()
    generation = 0

    def __init__(self, variant):
        self.variant = variant

    def backward(self, *gys):
        return ()

    def reached_grads(self, store, reached):
        # No result is computed from another (that call has a backward plan: trace.
        # backward._results_feed_results), so eager's walk reads the .grads of the
        # results it reached only; another's (set by the caller) stays as it is.
        return [g if id(ref()) in reached else None
                for ref, g in zip(self.outputs, self.output_grads(store))]

    def expand(self):
        pass            # nothing outside the call to cut: eager's inputs have no creator


def _release_held(held, ks, _ref):
    """A result computed from results ks died (or was unchained): one hold of each
    fewer (CompiledFunction.hold_upstream)."""
    for k in ks:
        entry = held[k]
        entry[0] -= 1
        if not entry[0]:
            del held[k]


def _upstream_holds(v):
    """Per output Variable j of the creator that others are upstream of: (j, those
    outputs), for CompiledFunction.hold_upstream. Two outputs upstream of each other
    (one Value in two slots) are not held by each other: neither would ever die."""
    ups = v.outputs_upstream()
    return tuple((j, tuple(k for k in sorted(up) if j not in ups[k]))
                 for j, up in enumerate(ups)
                 if any(j not in ups[k] for k in up))


def _results_feeding_results(v):
    """Whether a result Variable of the variant is upstream of another result (an
    input of a node an output depends on): its eager twin is an intermediate of the
    other's graph."""
    g = v.forward_graph
    outs = g.outputs[:v.n_user_outs]
    slots = v.var_slots
    results = {id(outs[s]) for s in slots if not isinstance(outs[s], Lit)}
    if len(slots) < 2 or not results:
        return False
    producer = {id(o): n for n in g.nodes for o in n.outputs}
    for s in slots:
        # The nodes the result in slot s depends on, past itself.
        todo, seen = [outs[s]], set()
        while todo:
            n = producer.get(id(todo.pop()))
            if n is None or id(n) in seen:
                continue
            seen.add(id(n))
            for x in n.inputs:
                if isinstance(x, Lit):
                    continue
                if id(x) in results and x is not outs[s]:
                    return True
                todo.append(x)
    return False


def _eager_ancestry(v, value):
    """ids of the forward graph's Values behind `value` in eager's graph: through
    the nodes recorded with history (the trace's grad_meta), along the operands they
    link to (a no_grad node or a `.data` read is no path)."""
    g = v.forward_graph
    producer = {id(o): (n, j) for n in g.nodes for j, o in enumerate(n.outputs)}
    meta = v.bwd.joint_meta
    out, todo, walked = set(), [value], set()
    while todo:
        n, j = producer.get(id(todo.pop()), (None, 0))
        if n is None or (id(n), j) in walked:
            continue
        walked.add((id(n), j))
        out.add(id(n))
        grad, links = meta.get(id(n), (False, ())) if meta is not None else (True, n.inputs)
        if not grad:
            continue
        per_output = getattr(n.fn, "links", None) if isinstance(n.fn, UserBackward) else None
        if per_output is not None:
            # A user backward's gradient j links only what its own graph reaches.
            mine = per_output[j] if j < len(per_output) else ()
            links = [u if i in mine else None for i, u in enumerate(links)]
        for u in links:
            if isinstance(u, Value) and id(u) not in out:
                out.add(id(u))
                todo.append(u)
    return out


def _leaf_read_inputs(v):
    """Positions of the forward inputs some forward node reads as a fresh leaf of
    eager's graph (no link in the trace's grad_meta: `Variable(x.data)`, `.data`
    arithmetic), not a user backward's `.data` read (made at backward time)."""
    g = v.forward_graph
    pos = {id(x): i for i, x in enumerate(g.inputs)}
    meta = v.bwd.joint_meta
    out = set()
    for n in g.nodes:
        if n.kind == GUARD or isinstance(n.fn, UserBackward):
            continue
        _, links = meta.get(id(n), (False, (None,) * len(n.inputs)))
        out.update(pos[id(u)] for u, link in zip(n.inputs, links)
                   if link is None and id(u) in pos)
    return tuple(sorted(out))


class Variant:
    """One traced graph for one signature and one sequence of guard outcomes.

    Built from the records tracing hands over (trace.records): the TracedCall, its
    BackwardPlan (None: no backward), and what compiling needs, passed in:
    `backend_compile` (Graph -> executable, the backend chosen), the `lock` a lazy
    backward compile takes and `checks` (how many first calls are checked against
    eager). It keeps no reference to the record (whose result Variables would stay
    alive)."""

    def __init__(self, call, backward, backend_compile, lock, checks=1):
        self.backend_compile = backend_compile
        self.lock = lock
        self.grad_mode = call.grad_mode     # traced in (the key's): creators made
        g = call.graph
        n_fwd_inputs, n_fwd_nodes = call.n_inputs, call.n_nodes
        self.guard_outcomes = [n.fn.expected for n in g.nodes[:n_fwd_nodes] if n.kind == GUARD]
        self.has_random = call.has_random
        self.calls = 0
        self.demoted = None
        # Where each forward input comes from at call time (records.Source).
        self.sources = list(call.sources)
        fwd_inputs = g.inputs[:n_fwd_inputs]
        out_tree, out_leaves = call.out_tree, call.out_leaves
        self.out_tree = out_tree
        # It returns an argument's list, dict or tuple itself: its runner reads the call's
        # args and kwargs (pytree.flatten_result's "argobj").
        self.needs_argv = "'argobj'" in repr(out_tree)
        self.out_leaves = out_leaves         # as pytree.result_leaves describes them
        # Results eager returns as views of an input's buffer or of another result:
        # rebuilt on it at return time (pytree.result_views).
        self.out_views = call.out_views or {}
        # Arrays a rebind effect stores that eager shares with a buffer from outside, a
        # .grad or a result: rebuilt on it (pytree.rebind_views).
        self.rebind_views = call.rebind_views or {}
        # Per output Variable: whether eager gives it a creator (it gets ours), and
        # the grad effects whose new .grad is one of them (the same object).
        self.has_creator = call.has_creator
        self.grad_alias = call.grad_alias
        self.grad_same = call.grad_same
        self.grad_constant = call.grad_constant
        # Made results eager gives as Constants (a create_graph seed): indices.
        self.made_constant = frozenset(m for m, c in enumerate(call.made_constant or ()) if c)
        self.grad_reach = call.grad_reach    # trace.call._grad_reach
        # Leaves of eager's graph the call makes and returns (`Variable(np.ones(3))`):
        # inputs of its CompiledFunction ("made" diff sources, by result leaf index);
        # made_inputs: those whose new array the graph reads in place of the traced
        # constant (result leaf -> forward input position).
        self.made_inputs = dict(call.made_inputs or {}) if backward else {}
        # Result leaf -> (class, name) of a Variable the runner makes, where eager's is
        # no plain unnamed Variable (a Parameter, a Constant seed, `name="c"`).
        self.leaf_class = dict(call.leaf_class or {})
        self.cut_sets = call.cut_sets        # trace.call._cut_sets
        user_outs = [v for kind, v, _ in out_leaves if kind == "out"]
        # Effects on live state, replayed after the graph ran and every guard held:
        # (kind, target, output slot of the value written).
        effect_values = []
        # Variables from outside whose .grad the trace found None: the variant holds
        # while it is None.
        self.grad_none = list(call.grad_none)
        # Variables from outside whose .grad was an argument when traced (the graph
        # reads it as that argument): the variant holds while it is.
        self.grad_args = list(call.grad_args)
        # Arguments that were Variables or arrays the function also captures: the graph
        # reads them as the argument (one object), so the variant holds while they are.
        self.captured_args = list(call.captured_args)
        # Variables from outside a backward inside the call stopped at (leaves when
        # traced): the variant holds while they have no creator.
        self.leaf_required = list(call.leaf_required)
        # Cuts of the caller's graph the function made (unchain_backward inside it
        # reaching an argument), repeated after the graph ran: (kind, [Targets]).
        self.cuts = list(call.cuts)
        # Variables whose .grad the function touched after a backward of it went on
        # into the caller's graph: the variant holds while that walk leaves them.
        self.walk_untouched = list(getattr(call, "walk_untouched", ()))
        self.effects = []
        for kind, target, v in call.effects:
            self.effects.append((kind, target, len(user_outs) + len(effect_values)))
            effect_values.append(v)
        self.grad_effects = []
        for target, gv in call.grad_effects:
            if gv is None:
                self.grad_effects.append((target, None))
            else:
                self.grad_effects.append((target, len(user_outs) + len(effect_values)))
                effect_values.append(gv)
        # x.grad.grad: per nested grad (trace.call._nested_grads), (grad effect index,
        # output slot, is a Constant).
        self.nested_grads = []
        for gi, gv, constant in call.nested_grads:
            self.nested_grads.append((gi, len(user_outs) + len(effect_values), constant))
            effect_values.append(gv)
        # The .grad backward left on a result made in the call (`loss.backward(
        # retain_grad=True); return loss, y`): per made result, None, ("out", slot) or
        # ("same", m) when it is made result m itself (`return y, y.grad`).
        triples = call.made_grads or []
        made_ids = {id(x): m for m, (x, _, _) in enumerate(triples)}
        self.made_grads = []
        for m, (x, xg, gv) in enumerate(triples):
            if xg is None:
                self.made_grads.append(None)
            elif m in call.made_grad_effect:
                # The .grad a grad effect sets (`y.backward(retain_grad=True)` with
                # `y = x + 1.0`: y.grad is x.grad, the seed): that object.
                self.made_grads.append(("effect", call.made_grad_effect[m]))
            elif id(xg) in made_ids:
                self.made_grads.append(("same", made_ids[id(xg)]))
            elif m in (call.made_grad_leaf or ()):
                # Another result the graph does not compute (the seed's ones Variable,
                # returned as y.grad): that result object.
                self.made_grads.append(("leaf", call.made_grad_leaf[m]))
            else:
                # A Constant (create_graph's seed: it stores no gradient) stays one.
                self.made_grads.append(("out", len(user_outs) + len(effect_values),
                                        type(xg) is core.Constant))
                effect_values.append(gv)
        if not any(self.made_grads):
            self.made_grads = None
        # The .grad a backward inside the call gave a made leaf it returns: result
        # leaf -> output slot.
        self.wrap_grad_alias = dict(call.wrap_grad_alias or {})
        self.wrap_grads = {}
        for i, gv in sorted((call.wrap_grads or {}).items()):
            self.wrap_grads[i] = len(user_outs) + len(effect_values)
            effect_values.append(gv)
        # The values returned views are views of that no result holds (pytree.
        # result_views' "value" roots): outputs of the graph, the views replayed on them.
        self.view_base_slots = {}
        for (where, r), _ in self.out_views.values():
            if where == "value" and id(r) not in self.view_base_slots:
                self.view_base_slots[id(r)] = len(user_outs) + len(effect_values)
                effect_values.append(r)
        # A backward inside the function that goes on into the caller's graph: its
        # roots' seeds are graph outputs. (targets, retain_grad, effects before it,
        # seed slots or None.)
        # A cut before such a backward is repeated right before it (the walk goes on
        # through the graph as the cut left it); the cuts after the last one, at the
        # end of the call, as without one.
        self.walks = []
        pending = []
        for ev in self.cuts:
            if ev[0] != "backward":
                pending.append(ev[:2])
                continue
            slots = []
            for sv in ev[4]:
                slots.append(None if sv is None else len(user_outs) + len(effect_values))
                if sv is not None:
                    effect_values.append(sv)
            self.walks.append((ev[1], ev[2], ev[3], slots, pending))
            pending = []
        self.late_cuts = pending
        self.walk_checks = list(getattr(call, "walk_checks", ()))
        # Backward: what the forward saves, and where each backward input comes from.
        # diff_sources: sources (as in self.sources) of the creator's inputs.
        self.diff_sources = backward.diff_sources if backward else []
        saved_values = backward.saved if backward else []
        # The .grads a backward inside the call left on its intermediates: outputs
        # after the saved values, which each call's CompiledFunction keeps (stale_init).
        held = list(backward.held_grads) if backward else []
        self.stale_grads = [x for x, _, _, _ in held]
        # Only the held .grads with history (the backward inside ran with
        # create_graph=True): a create_graph walk reads those as the replay's Variables
        # of their values (CompiledFunction._held_twins); the others are leaves in
        # eager, which a later backward stops at.
        self.held_grad_values = {id(x): gv for x, gv, _, hist in held if hist}
        # (position in stale_grads, result leaf index): a held .grad the call returns,
        # linked to that result (CompiledFunction.link_held).
        self.held_results = [(k, i) for k, (_, _, i, _) in enumerate(held) if i is not None]
        self.n_user_outs = len(user_outs)
        self.n_effect_outs = len(effect_values)
        fwd_nodes = g.nodes[:n_fwd_nodes]
        self.forward_graph = Graph(g.name, fwd_inputs, fwd_nodes,
                                   user_outs + effect_values + saved_values
                                   + [gv for _, gv, _, _ in held],
                                   g.input_names[:n_fwd_inputs])
        self.forward_graph.output_roles = (["result"] * len(user_outs)
                                           + ["effect"] * len(effect_values)
                                           + ["saved"] * (len(saved_values) + len(held)))
        # Specs of the output Variables, in the order of the creator's outputs.
        self.out_specs = [v.spec for kind, v, b in out_leaves if kind == "out" and b == VAR]
        # The output slot (among the "out" leaves) of each output Variable.
        self.var_slots = [slot for slot, (kind, _, b) in enumerate(
            [leaf for leaf in out_leaves if leaf[0] == "out"]) if b == VAR]
        if backward:
            # What a call keeps for its backward, and what recomputation spared it.
            self.forward_graph.notes["saved_for_backward_bytes"] = backward.saved_bytes
            self.forward_graph.notes["recomputed_instead_bytes"] = backward.recomputed_bytes
        self.bwd = backward
        # User Functions with per-call state: each call's instances go to its backward.
        self.user_calls = [n.fn for n in fwd_nodes if isinstance(n.fn, UserCall)]
        self.grad_dtypes = backward.grad_dtypes if backward else None
        # Forward input position -> index among the creator's inputs of the Variable
        # whose data it is, for an argument Variable and a .grad operand (a captured
        # Variable's is read through the capture): the backward reads its data as it
        # is then, rebound or not, as eager's does.
        self.arg_var_pos = {}
        if backward:
            for k, (kind, o) in enumerate(backward.diff_sources):
                if kind == "made" and o in self.made_inputs:
                    # (A made leaf's array, rebound since the call: its new array.)
                    self.arg_var_pos[self.made_inputs[o]] = k
                if kind not in ("arg", "arggrad", "grad"):
                    continue
                for i, (skind, obj, _) in enumerate(self.sources):
                    if skind == kind and (obj is o if kind == "grad" else obj == o):
                        self.arg_var_pos[i] = k
                        break
            self.bwd_sources = backward.sources
            self.bwd_grad_slots = backward.grad_slots
            self.joint_graph = backward.joint
        leaf_pos = {id(x): i for i, x in enumerate(fwd_inputs)}
        mutated = call.mutated if backward else ()
        # Inputs the call changes in place: a create_graph replay cannot start from them.
        self.mutated_positions = [leaf_pos[i] for i in mutated if i in leaf_pos]
        self.state = ()
        self.state_changed = _unchanged
        self.checks_left = checks
        # The compiled backward's first runs are checked against the backward graph
        # interpreted (checked_backward); a difference sets `demoted` (the reason).
        self.backward_checks_left = checks
        self.warn = None          # (message) -> None: a JitWarning at the user's line
        self.exe = backend_compile(self.forward_graph)
        self.copy_outputs = fresh_copies(self.forward_graph, self.exe, self.fresh_slots())
        # Eager's memory order of the arrays the runner hands out (eager_layouts).
        outs, ins = self.forward_graph.outputs, self.forward_graph.inputs
        self.layout_slots = sorted({s for s in self.fresh_slots()
                                    if not isinstance(outs[s], Lit) and len(outs[s].shape) > 1})
        self.layout_inputs = [k for k, x in enumerate(ins) if len(x.shape) > 1] \
            if self.layout_slots else []
        self.layouts = {}             # the layout inputs' strides -> {slot: axis order}
        self._layout_run = None
        self.check_backward = False     # the trace-time check: backward interpreted
        # Forward inputs a node reads as a fresh leaf (`c = Variable(x.data)`), which
        # holds the array the input had at the call (a replay's leaf_arrays).
        self.leaf_inputs = _leaf_read_inputs(self) if backward is not None else ()
        # A backward after the caller rebinds an argument's .data replays eager's when
        # the call made leaves (CompiledFunction.rebound_beside_made_leaves).
        self.replay_rebound = backward is not None and not backward.replay_refusal and (
            any(kind == "made" for kind, _ in self.diff_sources) or
            any(i in self.arg_var_pos or self.sources[i][0] == "var"
                for i in self.leaf_inputs))
        self.leaf_kinds = call.leaf_forms
        self.feeding_results = None   # _results_feeding_results, found at first need
        self._outputs_upstream = None  # outputs_upstream, found at first need
        self._output_ancestry = None   # output_ancestry, found at first need
        self._read_inputs = None       # read_inputs, found at first need
        # The results each call's creator holds for the others (hold_upstream).
        self.upstream_holds = _upstream_holds(self) if backward is not None else ()
        # A .grad the function reads after a backward inside it went on into the
        # caller's graph and added to it: the part of the graph it feeds runs again
        # right after that walk, on what the walk left (_walk_read_part).
        self.walk_read, self.walk_read_refusal = None, None
        reads = list(getattr(call, "walk_reads", ()))
        if reads:
            self.walk_read_refusal = _walk_read_part(self, reads, backward, backend_compile)
        # Grad effects set right after a walk (Trace._walk_reset), not before the walks.
        self.grad_late = dict(getattr(call, "grad_late", None) or {})
        late_shared = set(self.grad_same) | set(self.grad_same.values()) | \
            {gi for gi, _, _ in self.nested_grads} | \
            set((getattr(call, "made_grad_effect", None) or {}).values())
        if self.walk_read_refusal is None and late_shared & set(self.grad_late):
            self.walk_read_refusal = "another .grad or a result's is that .grad"
        self.runner = build_runner(self, call.leaf_forms)
        self._hot_runner = None
        self._bexe = None
        self._interp_bwd = None
        self.backward_runner = None
        self.input_ids = None

    def read_inputs(self):
        """The positions of the forward inputs some node of the joint graph (forward
        or traced backward) reads, found at first need."""
        if self._read_inputs is None:
            g = self.bwd.joint if self.bwd is not None else self.forward_graph
            used = {id(u) for n in g.nodes for u in n.inputs}
            self._read_inputs = frozenset(i for i, x in enumerate(self.forward_graph.inputs)
                                          if id(x) in used)
        return self._read_inputs

    def output_ancestry(self):
        """Per output Variable of the creator: the ids of the Values behind it in
        eager's graph of the call (_eager_ancestry)."""
        if self._output_ancestry is None:
            outs = self.forward_graph.outputs
            self._output_ancestry = [
                _eager_ancestry(self, outs[s]) if isinstance(outs[s], Value) else set()
                for s in self.var_slots]
        return self._output_ancestry

    def has_intermediates(self):
        """Whether eager's graph of the call has a Variable behind a result that is
        neither a result nor an input (one a backward with retain_grad leaves a
        .grad on)."""
        g = self.forward_graph
        skip = {id(x) for x in g.inputs} | {id(g.outputs[s]) for s in self.var_slots}
        values = {id(val) for n in g.nodes for val in n.outputs}
        return any(k in values and k not in skip for anc in self.output_ancestry()
                   for k in anc)

    def outputs_upstream(self):
        """Per output Variable of the creator (var_slots' order), the outputs upstream
        of it in eager's graph of the call (another result it is computed from, with
        history): a walk reaching it passes through those."""
        if self._outputs_upstream is None:
            outs = self.forward_graph.outputs
            vals = [outs[s] for s in self.var_slots]
            ups = []
            for j, (y, anc) in enumerate(zip(vals, self.output_ancestry())):
                ups.append(frozenset(k for k, u in enumerate(vals) if k != j and
                                     isinstance(u, Value) and (id(u) in anc or u is y)))
            self._outputs_upstream = ups
        return self._outputs_upstream

    def output_depths(self):
        """Per output slot of the forward graph, the longest chain of nodes from the
        call's inputs to it: a bound on how far above the call's inputs eager's
        Variable of it is in generation. A result is given cf.generation + its depth
        (not cf's + 1): a replay that adopts it (retain_grad with create_graph,
        unchain_backward's expand) gives it the replay's creator, whose generation is
        eager's, and the Functions the caller made of the result before that (`x.grad
        + gx` in the walk that replays) must not come before it in a later walk."""
        g = self.forward_graph
        depth = {}
        for n in g.nodes:
            d = 1 + max([depth.get(id(x), 0) for x in n.inputs], default=0)
            for val in n.outputs:
                depth[id(val)] = d
        return [depth.get(id(val), 0) for val in g.outputs]

    def fresh_slots(self):
        """The outputs of the forward graph the runner hands out as arrays of their
        own, each a distinct buffer in eager (fresh_copies): the computed results not
        rebuilt as views (a replay on a buffer replaces the graph's array), the arrays
        a rebind effect stores (`W.data = ...`), the .grads grad effects set and the
        retained .grads of results and of made leaves (wrap_grads), and the values
        returned views are rebuilt on."""
        slots, k = [], 0
        for i, (kind, _, _) in enumerate(self.out_leaves):
            if kind == "out":
                if i not in self.out_views:
                    slots.append(k)
                k += 1
        slots += [slot for e, (kind, _, slot) in enumerate(self.effects)
                  if kind == "rebind" and self.rebind_views.get(e, (0, 1))[1] != ()]
        slots += [slot for gi, (_, slot) in enumerate(self.grad_effects)
                  if slot is not None and gi not in self.grad_alias
                  and gi not in self.grad_same]
        slots += [slot for _, slot, _ in self.nested_grads]
        slots += [mg[1] for mg in self.made_grads or () if mg is not None and mg[0] == "out"]
        slots += list(self.wrap_grads.values())
        slots += list(self.view_base_slots.values())
        return slots

    def hot_runner(self, key):
        """The runner with the signature test in front (build_runner); a variant has one
        key, so it is built once."""
        if self._hot_runner is None:
            self._hot_runner = build_runner(self, self.leaf_kinds, key)
        return self._hot_runner

    def build_backward_runner(self):
        """The plain (not create_graph) backward of one call, generated: read the
        backward's inputs, run its compiled graph, wrap the gradients."""
        bexe = self.backward_executable()
        plan = getattr(bexe, "plan", None)
        env = {"np": np, "bexe": bexe, "plan": plan, "wrap": core.wrap_array,
               "read_capture": read_capture, "other_gy": _backward_other_gy,
               "current_input": current_input, "rebound": rebound,
               "respecified": respecified, "v": self}
        body, names = [], []
        replay_rebound = self.replay_rebound
        for j, (kind, i) in enumerate(self.bwd_sources):
            n = f"b{j}"
            names.append(n)
            if kind == "saved":
                body.append(f"{n} = cf.saved[{i}]")
            elif kind == "input":
                body.append(f"{n} = cf.arrays[{i}]")
                if self.sources[i][0] == "var":
                    env[f"o{j}"] = self.sources[i][1]
                    # Rebound to another shape or dtype: eager's backward replayed
                    # (CompiledFunction.rebound_respecified).
                    body.append(f"if o{j}._data is not {n} and respecified(o{j}._data, {n}): "
                                f"return cf._eager_backward(gys)")
                    body.append(f"{n} = current_input(v, {i}, {n})")
                    if replay_rebound:
                        # Rebound since the call, which made leaves (as below, for an
                        # argument).
                        body.append(f"if {n} is not cf.arrays[{i}]: "
                                    f"return cf._eager_backward(gys)")
                elif i in self.arg_var_pos:
                    # An argument Variable's data as it is now (rebound since the call:
                    # its new array, as eager's backward reads it): one identity test.
                    k = self.arg_var_pos[i]
                    body.append(f"if cf.inputs[{k}]._data is not {n}:")
                    if replay_rebound:
                        # A made leaf (`c = Variable(x.data)`) may hold the array the
                        # argument had: eager's backward reads c's uses from it and x's
                        # from the new one, where the graph has one value for both. The
                        # replay reads each from its own Variable.
                        body.append("    return cf._eager_backward(gys)")
                    # Another shape or dtype than the call's, which the compiled
                    # graph cannot read (CompiledFunction.rebound_respecified).
                    body.append(f"    if respecified(cf.inputs[{k}]._data, {n}): "
                                f"return cf._eager_backward(gys)")
                    body.append(f"    {n} = rebound(cf.inputs[{k}]._data, {n})")
            elif kind == "madedata":
                body.append(f"{n} = cf.inputs[{i}]._data")    # a made leaf's, now
                env[f"m{j}"] = self.bwd.graph.inputs[j]     # (its shape, dtype)
                body.append(f"if {n} is not None and ({n}.shape != m{j}.shape or "
                            f"{n}.dtype != m{j}.dtype): return cf._eager_backward(gys)")
            elif kind == "gy":
                spec = self.out_specs[i]
                env[f"d{j}"] = spec.dtype
                body.append(f"{n} = gys[{i}]")
                # A dead output (no gradient): zeros, and the gradients made eager's
                # after (CompiledFunction._from_live_outputs).
                body += [f"if {n} is None:",
                         f"    {n} = np.zeros({spec.shape!r}, d{j})",
                         "    dead = True",
                         "else:",
                         f"    {n} = {n}._data"]
                # Another dtype (a float64 gradient into a float32 output): NumPy's
                # promotion, as eager, not a cast to the compiled dtype.
                body.append(f"if ({n}.dtype is not d{j} and {n}.dtype != d{j}) or "
                            f"{n}.shape != {spec.shape!r}: return other_gy(cf, gys)")
            else:
                env[f"c{j}"] = i
                body.append(f"{n} = read_capture({kind!r}, c{j})")
        call = f"plan({', '.join(names)})" if plan is not None else f"bexe([{', '.join(names)}])"
        body.append(f"grads = {call}")
        outs = ["None" if slot is None else f"wrap(grads[{slot}])"
                for slot in self.bwd_grad_slots]
        body.append(f"grads = ({', '.join(outs)}{',' if len(outs) == 1 else ''})")
        body.append("return cf._from_live_outputs(gys, grads) if dead else grads")
        body.insert(0, "dead = False")
        src = "def backward(cf, gys):\n" + "".join(f"    {line}\n" for line in body)
        exec(compile(src, f"<tracejit-backward {self.forward_graph.name}>", "exec"), env)
        real = env["backward"]
        real.source = src
        if self.backward_checks_left > 0:
            def checked(cf, gys):
                return checked_backward(cf, gys, real)
            checked.source = src
            self.backward_runner = checked
        else:
            self.backward_runner = real
        return self.backward_runner

    def backward_executable(self):
        if self._bexe is None:
            with self.lock:
                if self._bexe is None:
                    self._bexe = self.backend_compile(self.bwd.graph)
        return self._bexe

    def guard_line(self, index):
        guards = [n for n in self.forward_graph.nodes if n.kind == GUARD]
        return guards[index].line if index < len(guards) else "?"

    def saved_map(self, cf):
        """id(Value) -> array: forward values as call cf computed them, which a replay
        must not recompute from the inputs as they are now (which may have changed):
        those it saved for its backward, and with snapshots of its arguments (remat),
        those NumPy computes from them."""
        bwd = self.bwd
        saved = bwd.saved
        snaps = bwd.snapshots
        views = bwd.saved_views
        out = {id(saved[k]): cf.saved[k] for k in bwd.replay_saved if k not in views}
        # A value a made leaf holds (`c = Variable(h.data)`): eager's h and c share that
        # array, so the replay's h is c's data now, as the plain backward reads it, not
        # a recompute from inputs the call may have updated in place since.
        for (kind, i), val in zip(bwd.sources, bwd.graph.inputs):
            if kind == "madedata":
                out[id(val)] = cf.inputs[i]._data
        for key, i in (bwd.replay_made or {}).items():
            out[key] = cf.inputs[i]._data
        if bwd.replay_live:
            # A state of a buffer the call updated in place: the buffer as it is now, as
            # eager's graph holds it (BackwardPlan.replay_live); never fed to the NumPy
            # recompute below (what the forward computed from it is the forward's).
            # The buffer, not the input's Variable's array now: a replay reads such a
            # value only as a fresh leaf (`v = W.data` before `W.data *= 0.9`, a
            # Constant aliasing the buffer), which a caller's rebind of W.data since
            # leaves on the buffer (a use of W itself reads W, linked).
            live = {k: cf.arrays[i] for k, i in bwd.replay_live.items()}
        else:
            live = {}
        if not snaps and not views:
            out.update(live)
            return out
        # The forward again with NumPy, from what is known as the call saw it: the
        # snapshots, the inputs nothing can change, saved values. NumPy's value wherever
        # it can be computed, so a value and one computed from it agree to the bit
        # (a max's mask, x == max(x), keeps its gradient), as in eager.
        g = self.forward_graph
        known = {}
        for i, v in enumerate(g.inputs):
            if i in snaps:
                known[id(v)] = cf.saved[snaps[i]]
            elif i in bwd.fixed_inputs:
                known[id(v)] = cf.arrays[i]
        # The call's random draws (a dropout mask) are known too, else everything after
        # one (the mask times a snapshotted argument) would be left to the replay, which
        # computes it from the argument as it is now (the caller may have updated it:
        # `x.data *= -0.5` before the backward). A draw the call saved is its saved
        # value; one it did not is drawn again from the call's stream (cf.rng), in the
        # forward's order, the global stream restored after. A user Function's forward
        # may draw unseen: after one, the stream cannot be followed.
        saved_rand = {id(v): cf.saved[k] for k, v in enumerate(saved) if k not in views}
        follow = cf.rng is not None
        if follow:
            now = np.random.get_state()
            np.random.set_state(cf.rng)
        try:
            for n in g.nodes:
                if isinstance(n.fn, (UserCall, UserBackward)):
                    follow = False
                if n.kind == core.RANDOM:
                    if follow:
                        # (np.random.seed, an effect with no output, runs too)
                        ys = n.fn.forward(*[u.value if isinstance(u, Lit) else known.get(id(u))
                                            for u in n.inputs])
                    for v in n.outputs:
                        y = saved_rand.get(id(v))
                        if y is None and follow:
                            y = ys if len(n.outputs) == 1 else ys[n.outputs.index(v)]
                            y = y if type(y) is np.ndarray else np.asarray(y)
                        if y is not None:
                            known[id(v)] = out[id(v)] = y
                    continue
                if n.kind != GUARD and \
                        not isinstance(n.fn, (UserCall, UserBackward)) and \
                        all(isinstance(u, Lit) or id(u) in known for u in n.inputs):
                    ys = n.fn.forward(*[u.value if isinstance(u, Lit) else known[id(u)]
                                        for u in n.inputs])
                    ys = (ys,) if len(n.outputs) == 1 and not isinstance(ys, tuple) else ys
                    for v, y in zip(n.outputs, ys):
                        known[id(v)] = out[id(v)] = \
                            y if type(y) is np.ndarray else np.asarray(y)
                else:
                    for v in n.outputs:
                        if id(v) in out:
                            known[id(v)] = out[id(v)]
        finally:
            if cf.rng is not None:
                np.random.set_state(now)
        # A view eager's backward reads through the buffer (saved_views): the replay's
        # backward nodes read it as the buffer is now; what the forward computed from
        # it stays the forward's (known, above).
        out.update((id(saved[k]), cf.saved[k]) for k in views)
        out.update(live)
        return out

    def leaf_arrays(self, cf):
        """id(forward input Value) -> the array call cf read, for an input a node reads
        as a fresh leaf whose Variable was rebound since (`x.data = ...` after `c =
        Variable(x.data)` in the call): eager's c holds the old array, x the new one, and
        a replay reads each from its own (interpret.run_with_variables' leaf_arrays)."""
        ins = self.forward_graph.inputs
        out = {id(ins[i]): cf.arrays[i] for i in self.leaf_inputs
               if current_input(self, i, cf.arrays[i], cf.inputs) is not cf.arrays[i]}
        return out or None

    def with_made_leaves(self, inputs, env, diff_vars):
        """A replay of the forward graph (inputs, env) with the joint graph's inputs
        for the made leaves after them, each the call's made leaf (among its
        differentiable Variables diff_vars): the replay's operands linked to them
        (trace.backward._link_made_leaves) read those."""
        j = self.bwd.joint
        n = len(inputs)
        extra = [i for i in range(len(j.inputs)) if i >= n and
                 i in self.bwd.joint_diff_position]
        if not extra:
            return inputs, env
        pos = self.bwd.joint_diff_position
        return (list(inputs) + [j.inputs[i] for i in extra],
                list(env) + [diff_vars[pos[i]] for i in extra])

    def backward_with_variables(self, cf, gys):
        """Replay the joint forward+backward graph through the primitives on Variables,
        with eager's graph structure (no_grad, fresh leaves) and the call's saved
        forward values (an input updated in place since is read as it is now, as
        eager's backward reads it; what was computed from it is as it was)."""
        inputs, arrays = cf.inputs, cf.arrays
        j = self.joint_graph
        env_vars = []
        diff_pos = self.bwd.joint_diff_position
        for idx, v in enumerate(j.inputs):
            if idx in diff_pos:
                env_vars.append(inputs[diff_pos[idx]])
            elif idx in self.bwd.joint_gy_inputs:
                k = self.bwd.joint_gy_inputs[idx]
                g = gys[k]
                env_vars.append(g if g is not None else Constant(
                    np.zeros(self.out_specs[k].shape, self.out_specs[k].dtype)))
            elif idx in self.bwd.joint_captures:
                env_vars.append(Constant(read_capture(*self.bwd.joint_captures[idx])))
            else:
                env_vars.append(Constant(current_input(self, idx, arrays[idx])))
        outs = interpret.run_with_variables(j, env_vars, self.bwd.joint_meta,
                                            self.saved_map(cf), cf.instances,
                                            leaf_arrays=self.leaf_arrays(cf))
        return tuple(outs[s] if s is not None else None for s in self.bwd.joint_grad_slots)


def _walk_read_part(v, reads, backward, backend_compile):
    """Compile the part of v's forward graph that depends on the "walkgrad" inputs
    (reads: (input position, Target, walk)): the .grad of leaves of the caller's graph
    as a backward inside the call left them after going on into that graph, which
    compiled calls run after their graph (core.backward_from). The runner runs the
    whole graph first on the traced .grad (placeholders), then this part again on the
    .grad the walk left, right after it, and takes its outputs from that run. Sets
    v.walk_read = (walk, [(input position, Target, spec)], output slots, executable,
    inputs copied before the effects, fresh_copies of its outputs); returns why the
    call cannot run so (a refusal), or None."""
    g = v.forward_graph
    walk = reads[0][2]
    dep = {id(g.inputs[pos]) for pos, _, _ in reads}
    for node in g.nodes:
        if any(id(x) in dep for x in node.inputs):
            if node.kind == GUARD:
                return "a branch or Python number depends on it"
            dep.update(id(o) for o in node.outputs)
    if v.has_random:
        return "the call draws random numbers (the part after the walk would draw again)"
    if backward is not None and any(
            isinstance(src, tuple) and src and src[0] == "walkgrad"
            for src in list(backward.sources) + list(backward.joint_captures.values())):
        return "its backward reads it"
    slots = [k for k, o in enumerate(g.outputs) if id(o) in dep]
    effect_of = {slot: (i, kind) for i, (kind, _, slot) in enumerate(v.effects)}
    result_leaf = [i for i, (kind, _, _) in enumerate(v.out_leaves) if kind == "out"]
    producer = {id(o): n for n in g.nodes for o in n.outputs}
    # The seeds of later walks (a root's .grad a later backward added to: read when
    # that walk starts, after this part ran).
    seeds = {s for m, w in enumerate(v.walks) if m > walk for s in w[3] if s is not None}

    def view_of_input(x):
        while True:
            n = producer.get(id(x))
            if n is None:
                return True
            ins = [u for u in n.inputs if not isinstance(u, Lit)]
            if n.kind != core.MOVEMENT or len(ins) != 1:
                return False
            x = ins[0]
    for k in slots:
        i, kind = effect_of.get(k, (None, None))
        role = g.output_roles[k]
        if kind in ("inplace", "inplace_array"):
            continue        # copied into the buffer it updates: a value, no array
        if view_of_input(g.outputs[k]):
            # (The .grad itself or a view of its buffer: eager's shares that buffer.)
            return "a result, a .data or state holds it or a view of it"
        if kind == "rebind" and i not in v.rebind_views or role == "saved" or \
                role == "result" and result_leaf[k] not in v.out_views or k in seeds:
            continue        # a new array of its own, as eager's; what the backward reads
        return "a .grad or a view depends on it (only results, in-place updates and " \
            "rebinds of .data to a new array may)"
    need = {id(g.outputs[k]) for k in slots}
    keep = []
    for node in reversed(g.nodes):
        if any(id(o) in need for o in node.outputs):
            keep.append(node)
            need.update(id(x) for x in node.inputs)
    part = Graph(g.name + "_after_walk", list(g.inputs), keep[::-1],
                 [g.outputs[k] for k in slots], list(g.input_names))
    # The inputs it reads as the call found them: an in-place update before the walk
    # (applied by then) writes into its buffer, so the runner keeps a copy from before.
    first = v.walks[walk][2]
    updated = any(kind in ("inplace", "inplace_array") for kind, _, _ in v.effects[:first])
    pw = {pos for pos, _, _ in reads}
    kept = [pos for pos, x in enumerate(g.inputs) if id(x) in need and pos not in pw] \
        if updated else []
    exe2 = backend_compile(part)
    # Its arrays share memory exactly where eager's do (as the first run's,
    # v.copy_outputs): positions among its outputs.
    fresh = set(v.fresh_slots())
    copies = fresh_copies(part, exe2, [j for j, k in enumerate(slots) if k in fresh])
    v.walk_read = (walk, [(pos, t, (g.inputs[pos].shape, g.inputs[pos].dtype))
                          for pos, t, _ in reads], slots, exe2, kept, copies)
    return None


def laid_out(a, perm):
    """a, or a copy of it laid out in the axis order perm (outermost first), as NumPy
    lays out a new array whose operands have that order."""
    if not isinstance(a, np.ndarray) or a.ndim != len(perm):
        return a
    strides, step = [0] * a.ndim, a.itemsize
    for d in reversed(perm):
        strides[d] = step
        step *= a.shape[d]
    if tuple(strides) == a.strides:
        return a
    b = np.empty([a.shape[d] for d in perm], a.dtype).transpose(np.argsort(perm))
    np.copyto(b, a)
    return b


def _axis_order(a):
    """The axes of a, outermost first (by stride; an axis of extent 1 has the stride of
    the one inside it, so on a tie the longer axis is outside)."""
    return tuple(sorted(range(a.ndim), key=lambda d: (-abs(a.strides[d]), -a.shape[d], d)))


def _user_layout_stand_in(n):
    """For eager_layouts' run: a user Function's node gives zeros of its outputs'
    shapes and dtypes, each laid out as its first operand of that shape (the output
    gradients first, for a user backward: `gy * self.k`), else in C order."""
    if not isinstance(n.fn, (UserCall, UserBackward)):
        return None
    specs = [(tuple(o.shape), o.dtype) for o in n.outputs]
    backward = isinstance(n.fn, UserBackward)
    # A forward whose output was laid out otherwise when traced (`x.copy()` of a
    # transposed x is C order): that output's axis order, as then (UserCall.layouts).
    rules = getattr(n.fn, "layouts", None) or [None] * len(specs)

    def forward(*xs):
        arrays = [x for x in (reversed(xs) if backward else xs) if isinstance(x, np.ndarray)]
        ys = []
        for (shape, dtype), order in zip(specs, rules):
            like = next((x for x in arrays if x.shape == shape), None)
            if order is not None:
                ys.append(laid_out(np.zeros(shape, dtype), order))
            else:
                ys.append(np.zeros(shape, dtype) if like is None else
                          np.zeros_like(like, dtype=dtype))
        return ys[0] if len(ys) == 1 else tuple(ys)
    return forward


def eager_layouts(v, key, arrays):
    """{fresh output slot: axis order} of the arrays eager makes for these inputs, where
    not C order, remembered for the inputs' strides (`key`). The signature does not key
    on strides, and NumPy lays a new array out as its operands are (order='K':
    F.tanh(F.transpose(x, (1, 2, 0))) of a C-ordered x, or F.exp(x) of an F-ordered x,
    is not C-ordered): the layout is observable (`y.data.strides`, whether
    `y.data.reshape(-1)` is a view the caller writes through, the strides of a returned
    view `y.data.T` and of the state the call stores). The graph the trace recorded, run
    by the reference interpreter (NumPy op by op, as eager) on this call's inputs once
    per layout, says which."""
    if len(v.layouts) >= 16:
        v.layouts.clear()          # (a caller cycling through many layouts: bounded)
    run = v._layout_run
    if run is None:
        # A user Function's forward (or backward) is the user's code, run once per call
        # as in eager: not a second time for its layout. Its stand-in gives arrays laid
        # out as an elementwise NumPy op of its operands gives them (`x * self.k`),
        # so the layouts after it follow as eager's do.
        run = v._layout_run = interpret.compile(v.forward_graph, _user_layout_stand_in)
    rng = np.random.get_state()
    try:
        with np.errstate(all="ignore"):
            outs = run(list(arrays))
    except Exception:  # noqa: BLE001 - a guard the reference sees otherwise: C order
        outs = None
    finally:
        np.random.set_state(rng)
    if outs is None:
        v.layouts[key] = {}
        return {}
    lay = {}
    for s in v.layout_slots:
        a = outs[s]
        if isinstance(a, np.ndarray) and a.ndim > 1 and a.size and not a.flags.c_contiguous:
            perm = _axis_order(a)
            if perm != tuple(range(a.ndim)):
                lay[s] = perm
    v.layouts[key] = lay
    return lay


def _unchanged():
    return False


def fresh_copies(g, exe, slots):
    """Which outputs of g (among `slots`, the outputs a runner hands out as arrays of
    their own, Variant.fresh_slots) the runner copies, decided once per variant, so
    that the arrays share memory exactly where eager's do.

    The graph that runs computes each value as eager did, a movement as the same NumPy
    view or copy of the same base, so its arrays alias as eager's do, except where the
    passes made one value of several: common subexpressions merged (`a = F.sin(x) *
    0.5; b = F.sin(x) * 0.5; return F.reshape(a, (-1,)), b.T` would rebuild both views
    on one array), a value folded or simplified into an input or another value. So each
    buffer of the graph that runs (an output followed back through movements, which may
    be views) is claimed by the base eager's array is a view of or a copy from (the
    traced output followed back through movements; a graph input claims its own
    buffer); an output whose base is another gets a copy, in the buffer's own layout
    (as eager's new array has it), one per traced value: slots holding the same traced
    value (one eager array) share that copy.

    Returns [(slot, None)] (copy the slot's array) and [(slot, earlier)] (the slot is
    the copy already made for slot `earlier`), in slot order."""
    opt = getattr(exe, "graph", None)
    if opt is not None and len(opt.outputs) != len(g.outputs):
        opt = None
    outs = g.outputs if opt is None else opt.outputs

    def producers(graph):
        out = {}
        for n in graph.nodes:
            for m in (n.fn.graph.nodes if n.kind == FUSED else (n,)):
                for o in m.outputs:   # (a fused group's members may run as NumPy views)
                    out[id(o)] = m
        return out
    traced_producer = producers(g)
    run_producer = traced_producer if opt is None else producers(opt)

    def base(x, producer):
        while True:
            n = producer.get(id(x))
            ins = [u for u in n.inputs if not isinstance(u, Lit)] if n is not None else ()
            if n is None or n.kind != core.MOVEMENT or len(ins) != 1:
                return x
            x = ins[0]
    # The caller's buffers: claimed by the input itself (a movement of it is eager's
    # view or copy of it, made by the same NumPy call).
    claimed = {id(x): x for x in g.inputs}
    if opt is not None:
        claimed.update((id(x), x) for x in opt.inputs)
    inputs = {id(x) for x in g.inputs}
    copies, copied = [], {}
    handed = {}         # id(value that runs) -> id(the traced value its array is)
    for s in sorted(slots):
        traced, x = g.outputs[s], outs[s]
        if isinstance(x, Lit) or isinstance(traced, Lit):
            continue        # made into a new array at each return
        if id(traced) in copied:
            copies.append((s, copied[id(traced)]))
            continue
        origin = base(traced, traced_producer)
        owner = claimed.setdefault(id(base(x, run_producer)), origin)
        # Two traced values the passes merged into one array object (two equal empty
        # views `m.data[..., 1:]`: no memory, so no view to rebuild, and CSE made one
        # of them) are two objects in eager: the second is a copy.
        twice = handed.setdefault(id(x), id(traced)) != id(traced)
        # (A graph run without its graph, opt None, may return an input array itself.)
        if owner is not origin or twice or (opt is None and id(x) in inputs):
            copied[id(traced)] = s
            copies.append((s, None))
    return copies


def _dead_ref():
    """The creator's entry for an output it did not make (eager gives it no creator)."""
    return None


def _backward_other_gy(cf, gys):
    """The backward of a call whose output gradient has another dtype or shape than the
    traced output (a float64 gradient into a float32 call): the backward graph run by
    the interpret backend on the same saved values, inputs and captures as the
    compiled one reads, so NumPy promotes as eager's backward does; where some outputs
    got no gradient, eager's (CompiledFunction._from_live_outputs: the dead outputs'
    zeros may promote, or make a NaN of an infinity). After a rebind beside made
    leaves, eager's backward replayed (CompiledFunction.rebound_beside_made_leaves):
    this graph, like the compiled one, has one value for both."""
    v = cf.variant
    if core._state.trace is None and (cf.rebound_beside_made_leaves() or
                                       cf.rebound_respecified()):
        return cf._eager_backward(gys)
    if v._interp_bwd is None:
        v._interp_bwd = interpret.compile(v.bwd.graph)
    grads = v._interp_bwd(cf.backward_inputs(gys))
    return cf._from_live_outputs(gys, tuple(
        None if slot is None else core.wrap_array(np.asarray(grads[slot]))
        for slot in v.bwd_grad_slots))


def checked_backward(cf, gys, real):
    """The backward runner of a variant's first backward calls: the compiled kernels
    (`real`, what later calls run) and, beside them, the backward graph interpreted
    with NumPy on the same inputs (the reference the trace-time check compared with
    eager's backward). The interpreter never runs a generated kernel, so only this
    catches a code generation error in one. On a difference the reference gradients
    are returned (so this backward is eager's), the variant is demoted (`demoted`:
    the dispatch drops it and the signature runs eagerly from its next call) and a
    JitWarning says why. float32 differences are judged by the graph interpreted
    on float64 copies of its inputs, as checking.py's float64 twin judges values."""
    v = cf.variant
    got = real(cf, gys)
    if v.demoted is not None:
        return _backward_other_gy(cf, gys)
    if cf.rebound_beside_made_leaves():
        return got      # eager's backward replayed (no kernel ran): nothing to check
    try:
        ref = _backward_other_gy(cf, gys)
        diff = _kernel_difference(v, cf, gys, got, ref)
    except Exception:  # noqa: BLE001 - no reference run: nothing to compare with
        diff, ref = None, None
    v.backward_checks_left -= 1
    if diff is None:
        if v.backward_checks_left <= 0 and v.backward_runner is not real:
            v.backward_runner = real
        return got
    reason = (f"the compiled backward kernels differ from the backward graph run "
              f"with NumPy (the reference the trace-time check compared with eager's "
              f"backward) on a backward through a compiled call: {diff}")
    v.demoted = reason
    v.checks_left = max(v.checks_left, 1)    # the next call goes to the dispatch
    if v.warn is not None:
        v.warn(f"jit({v.forward_graph.name}): {reason}; that backward gave the "
               f"reference gradients, and the function runs eagerly from its next call")
    return ref


def _kernel_difference(v, cf, gys, got, ref):
    from tracejit.runtime.checking import LOW_PRECISION, array_difference
    soft, pairs = [], []
    for k, (g, r) in enumerate(zip(got, ref)):
        if (g is None) != (r is None):
            return f"the gradient of input {k} is None in one run"
        if g is not None:
            pairs.append((k, r._data, g._data))
    for k, r, g in pairs:
        d = array_difference(r, g, f"the gradient of input {k}", scaled=True, soft=soft)
        if d:
            return d
    if not soft:
        return None
    try:
        ins = [a.astype(np.float64) if isinstance(a, np.ndarray) and a.dtype in
               LOW_PRECISION and a.dtype.kind == "f" else a for a in cf.backward_inputs(gys)]
        with np.errstate(all="ignore"):
            twin = v._interp_bwd(ins)
        slots = [slot for slot in v.bwd_grad_slots if slot is not None]
        twin = {k: np.asarray(twin[slot]) for k, slot in zip(
            [k for k, slot in enumerate(v.bwd_grad_slots) if slot is not None], slots)}
    except Exception:  # noqa: BLE001 - no twin: the difference stands
        twin = {}
    for k, r, g in pairs:
        d = array_difference(r, g, f"the gradient of input {k}", scaled=True,
                             ref=twin.get(k))
        if d:
            return d
    return None


def saved_views(saved, arrays, bwd):
    """The saved values with each of bwd.saved_views (index -> (input position,
    steps)) the view of the call's input array those steps give, as eager's backward
    holds it: it aliases the buffer. Where NumPy gives a copy (a reshape of a
    non-contiguous argument, which eager's forward copied too), the forward's saved
    copy. And each of bwd.saved_unaliased (the forward's values) a copy if the forward
    gave it as a view of its input's buffer, which the caller may change."""
    saved = list(saved)
    for k, (i, steps) in bwd.saved_views.items():
        val = replay_view(arrays[i], steps)
        if val is not None:
            saved[k] = val
        elif np.may_share_memory(saved[k], arrays[i]):
            saved[k] = saved[k].copy()
    for k, i in bwd.saved_unaliased.items():
        if np.may_share_memory(saved[k], arrays[i]):
            saved[k] = saved[k].copy()
    return saved


def current_input(v, i, array, inputs=None):
    """Forward input i for the backward: a captured Variable, or an argument Variable
    (given the call's differentiable `inputs`), whose data was rebound since the call
    (`p.data = p.data * 3`) gives its new array, as eager's backward reads `p.data` then
    (an in-place update is the same array either way). Anything computed from it was
    saved, not recomputed (remat), so those stay the call's, as in eager."""
    kind, obj, _ = v.sources[i]
    if kind == "var":
        return rebound(obj._data, array)
    if inputs is not None and i in v.arg_var_pos:
        return rebound(inputs[v.arg_var_pos[i]]._data, array)
    return array


def respecified(cur, array):
    """Whether a Variable's data `cur` is an array of another shape or dtype than the
    call's `array` (rebound since: `x.data = x.data.astype(np.float32)`, `x.data =
    x.data[:1]`): compiled code, made for the call's, cannot read it in its place."""
    return cur is not array and cur is not None and (
        cur.shape != array.shape or cur.dtype != array.dtype)


def rebound(cur, array):
    """The array a Variable holds now if it is one the backward can read in place of
    the call's `array` (same shape and dtype), else the call's."""
    if cur is not array and cur is not None and cur.shape == array.shape \
            and cur.dtype == array.dtype:
        return cur
    return array


def read_capture(kind, obj):
    if kind == "var":
        return obj._data
    if kind == "grad":
        return obj._grad._data
    return obj


def new_leaf(cls, data, name):
    """A new Variable of class cls (a Parameter, a Constant) with no creator: a result
    leaf eager makes of that class in the call (core.wrap_array's fields)."""
    x = object.__new__(cls)
    x._data = data
    x._tv = None
    x._grad = None
    x.name = name
    x.creator = None
    x.generation = 0
    return x


# The sources whose array the runner reads is the caller's buffer itself (an argument's,
# a captured Variable's or array's, a caller-set .grad's): a result, a rebind or stored
# state eager gives as (a view of) it is rebuilt on it (pytree._ViewRoots).
INPUT_BUFFERS = ("arg", "var", "array", "arggrad", "grad")
MISS = object()      # a hot-path runner's answer: the arguments have another signature
SLOW = object()      # ... the signature, but this variant must go through dispatch


def build_runner(v, leaf_kinds, key=None):
    """Python source for one variant's call: read inputs, run the compiled graph, apply
    the effects, build the outputs. Generated once per variant, so the hot path has no
    loops over descriptors and no isinstance checks.

    With a signature key, the function first tests that the call's arguments have it
    (the caller has compared the grad mode) and that the variant may run unchecked, in
    the same frame (the hot path of a repeated call): it returns MISS when the arguments
    differ, SLOW when the variant has checks left or the Python state it read may have
    changed (jit.py's dispatch sorts those out)."""
    env = {"np": np, "exe": v.exe, "v": v, "Stale": Stale, "GuardFailure": GuardFailure,
           "CompiledFunction": CompiledFunction if v.grad_reach is None else
           PartialCompiledFunction, "Config": Config, "wrap": core.wrap_array,
           "ref": weakref.ref, "new": object.__new__, "Variable": Variable,
           "MISS": MISS, "SLOW": SLOW, "dead": _dead_ref, "replay_view": replay_view}
    consts = []

    def const(obj):
        consts.append(obj)
        name = f"k{len(consts) - 1}"
        env[name] = obj
        return name

    def target(where, obj):
        if where == "leafgrad":
            return f"leaves[{obj}]._grad"
        return f"leaves[{obj}]" if where == "leaf" else const(obj)

    body = []
    if key is not None:
        body += matcher_lines(key, env, "return MISS", grad_mode=False)
        # Built after the variant took its snapshot of the Python state it read.
        env["state_changed"] = v.state_changed
        body.append("if v.checks_left > 0" + (" or state_changed()" if v.state else "")
                    + ": return SLOW")
    names = []
    made_array = {i: j for j, i in v.made_inputs.items()}
    copies = {}       # result leaf -> the local holding this call's new array of it
    for i, (kind, obj, spec) in enumerate(v.sources):
        n = f"a{i}"
        names.append(n)
        if i in made_array:
            # A made leaf's array (`Variable(np.ones(3))` returned): new every call, as
            # eager's, laid out as it; the graph reads it, and so does the backward.
            j = made_array[i]
            body.append(f"c{j} = {const(obj)}.copy(order='K')")
            body.append(f"{n} = c{j}")
            copies[j] = f"c{j}"
        elif kind == "arg":
            lk = leaf_kinds[obj]
            leaf = f"leaves[{obj}]" if key is None else f"l{obj}"   # matcher bound l{i}
            if lk == VAR:
                body.append(f"{n} = {leaf}._data")
            elif lk == FLT:
                body.append(f"{n} = np.asarray({leaf})")
            else:
                body.append(f"{n} = {leaf}")
                if key is None:    # else the matcher saw an ndarray
                    body.append(f"if type({n}) is not np.ndarray: {n} = np.asarray({n})")
        elif kind == "arggrad":
            leaf = f"leaves[{obj}]" if key is None else f"l{obj}"
            if key is None:
                body.append(f"{n} = {leaf}._grad")
                body.append(f"{n} = {n}._data if {n} is not None else None")
                body.append(f"if type({n}) is not np.ndarray or {n}.shape != {spec[0]!r} or "
                            f"{n}.dtype != {const(spec[1])}: "
                            f"raise Stale('an argument .grad changed shape or dtype')")
            else:       # the matcher saw it set, of this shape and dtype
                body.append(f"{n} = {leaf}._grad._data")
        elif kind in ("var", "grad"):
            src = f"{const(obj)}._data" if kind == "var" else \
                f"({const(obj)}._grad._data if {const(obj)}._grad is not None else None)"
            body.append(f"{n} = {src}")
            body.append(f"if {n} is None or {n}.shape != {spec[0]!r} or "
                        f"{n}.dtype != {const(spec[1])}: "
                        f"raise Stale('a captured {kind} changed shape or dtype')")
        else:
            body.append(f"{n} = {const(obj)}")
    # A .grad operand's Variable (a differentiable input of the call): the one the call
    # read, taken before the function's effects run (it may clear or replace the .grad).
    diff_names = {}
    for j, (kind, o) in enumerate(v.diff_sources if v.bwd is not None else ()):
        if kind in ("grad", "arggrad"):
            diff_names[j] = f"dg{j}"
            body.append(f"dg{j} = " + (f"leaves[{o}]._grad" if kind == "arggrad" else
                                       f"{const(o)}._grad"))
    for where, var in v.grad_none:
        t = f"leaves[{var}]._grad" if where == "leafgrad" else const(var)
        msg = f"the .grad of {_label(var)} was None when traced, is set now"
        body.append(f"if {t}._grad is not None: raise Stale({msg!r})")
    for j, var in v.captured_args:
        msg = f"argument {j} was an object the function also captures when traced, is not now"
        body.append(f"if leaves[{j}] is not {const(var)}: raise Stale({msg!r})")
    for (where, var), j in v.grad_args:
        t = f"leaves[{var}]._grad" if where == "leafgrad" else const(var)
        msg = f"the .grad of {_label(var)} was argument {j} when traced, is not now"
        body.append(f"if {t}._grad is not leaves[{j}]: raise Stale({msg!r})")
    for where, var in v.leaf_required:
        t = {"leaf": f"leaves[{var}]", "leafgrad": f"leaves[{var}]._grad"}.get(where) \
            if where != "obj" else const(var)
        msg = (f"{_label(var) if where != 'leaf' else f'argument {var}'} had no creator "
               f"when traced (a backward inside the call stopped at it), has one now")
        body.append(f"if {t}.creator is not None: raise Stale({msg!r})")
    walks = v.walks
    if walks:
        env["backward_from"] = core.backward_from
    if walks and (v.walk_untouched or v.walk_checks):
        # The function sees the .grad of these after its backward went on into the
        # caller's graph: that walk must leave them now as it did when traced (not
        # touched; cleared; kept; a leaf's, added to), or the function would see them
        # otherwise in eager than in the compiled call.
        env["graph_reach"] = core.graph_reach
        stale = "raise Stale('a backward inside the call goes on into the caller\\'s " \
            "graph, which now touches the .grad of a Variable the call sees after it " \
            "otherwise than when traced')"
        for n in sorted({n for _, n in v.walk_untouched}):
            before = ", ".join(target(*t) for w in walks[:n] for t in w[0])
            body.append(f"reach = graph_reach([{before}])")
            for t, m in v.walk_untouched:
                if m == n:
                    body.append(f"if id({target(*t)}) in reach: {stale}")
        for n in sorted({n for _, kind, n in v.walk_checks if kind != "leaf"}):
            roots = ", ".join(target(*t) for t in walks[n][0])
            body.append(f"reach{n} = graph_reach([{roots}])")
            body.append(f"ins{n} = graph_reach([{roots}], True)")
        for t, kind, n in v.walk_checks:
            x = target(*t)
            if kind == "cleared":
                body.append(f"if {x}.creator is None or id({x}) not in reach{n}: {stale}")
            elif kind == "kept":
                body.append(f"if id({x}) in ins{n}: {stale}")
            elif kind == "reached":
                body.append(f"if id({x}) not in reach{n}: {stale}")
            elif kind == "unreached":
                body.append(f"if id({x}) in reach{n}: {stale}")
            elif isinstance(kind, tuple) and kind[0] == "dtype":
                env["walk_keeps_dtype"] = core.walk_keeps_dtype
                body.append(f"if not walk_keeps_dtype(reach{n}, {const(np.dtype(kind[1]))}): "
                            f"{stale}")
            else:
                body.append(f"if {x}.creator is not None: {stale}")
    plan = getattr(v.exe, "plan", None)
    inline = getattr(plan, "inline", None)
    n_outs = len(v.forward_graph.outputs)
    if inline is not None and not v.has_random and v.walk_read is None:
        call = None     # a 0-d graph's plan, written into this function
    elif plan is not None:
        # The numba backend's plan takes the arrays positionally: no list, no extra call.
        env["plan"] = plan
        call = f"plan({', '.join(names)})"
    else:
        call = "exe(arrays)"

    def out(k):
        """The k-th output of the graph: a local of its own when the plan is inline."""
        return f"o{k}" if call is None else f"outs[{k}]"

    if plan is None or v.bwd is not None or v.effects or v.made_grads or v.grad_effects \
            or v.view_base_slots or v.wrap_grads or v.wrap_grad_alias or v.walks:
        body.append(f"arrays = [{', '.join(names)}]")
        body.append("bwd_arrays = arrays")

    effects = [(kind, target(where, obj), slot) for kind, (where, obj), slot in v.effects]
    # The array each in-place effect writes into.
    dest = {i: f"{t}._data" if kind == "inplace" else t
            for i, (kind, t, _) in enumerate(effects) if kind in ("inplace", "inplace_array")}
    # Effects are applied after the graph ran, from values it computed from the inputs
    # as they were: right unless an array updated in place is also another input (a
    # view of it, or the same Parameter as argument and capture), or a Variable whose
    # data is rebound is also an argument; eager would read those after the update.
    # Such a call runs eagerly (InplaceAlias).
    if dest:
        env["inplace_alias"] = inplace_alias
        body.append(f"inplace_alias(({', '.join(dest.values())},), arrays)")
    var_leaves = [f"leaves[{i}]" if key is None else f"l{i}"
                  for i, lk in enumerate(leaf_kinds) if lk == VAR]
    rebound = [t for kind, t, _ in effects if kind == "rebind" and not t.startswith("leaves")]
    if rebound and var_leaves:
        body.append(f"if {' or '.join(f'{t} is {x}' for t in rebound for x in var_leaves)}: "
                    f"raise InplaceAlias('a Variable it rebinds (.data = ...) is also passed "
                    f"as an argument')")
        env["InplaceAlias"] = InplaceAlias
    if v.has_random:
        body += ["rng = np.random.get_state()",
                 "try:",
                 f"    outs = {call}",
                 "except GuardFailure:",
                 "    np.random.set_state(rng)",
                 "    raise"]
    elif call is None:
        body += inline(names, env, [out(k) for k in range(n_outs)])
    else:
        body.append(f"outs = {call}")
    for i, same in v.copy_outputs:
        body.append(f"{out(i)} = {out(i)}.copy(order='K')" if same is None else
                    f"{out(i)} = {out(same)}")
    if v.layout_slots:
        # Eager's memory order (NumPy's order='K' follows the operands' strides; the
        # kernels write C order): before the views rebuilt on these arrays, which then
        # follow it, and before the state the call stores.
        env["laid_out"], env["eager_layouts"] = laid_out, eager_layouts
        shared = {i: same for i, same in v.copy_outputs if same is not None}
        lk = "(" + "".join(f"{names[k]}.strides, " for k in v.layout_inputs) + ")"
        body.append(f"lay = v.layouts.get({lk})")
        body.append(f"if lay is None: lay = eager_layouts(v, {lk}, "
                    f"[{', '.join(names)}])")
        body.append("if lay:")
        for i in v.layout_slots:
            if i not in shared:
                body.append(f"    if {i} in lay: {out(i)} = laid_out({out(i)}, lay[{i}])")
        for i, same in sorted(shared.items()):
            if same in v.layout_slots:
                body.append(f"    {out(i)} = {out(same)}")

    if v.walk_read is not None:
        # The inputs the part run after the walk reads, as they are before the effects
        # update them in place (_walk_read_part).
        for pos in v.walk_read[4]:
            body.append(f"kept{pos} = {names[pos]}.copy(order='K')")
    # Every one must take the write before the first is written: a failure halfway (a
    # read-only argument) would leave some effects applied, and the eager rerun that
    # reports the error would apply them twice.
    if dest:
        body.append(f"if not ({' and '.join(d + '.flags.writeable' for d in dest.values())}): "
                    f"raise ValueError('output array is read-only')")
    # A backward inside the function that went on into the caller's graph goes on
    # from the same Variables here, after the effects the function made before it (an
    # in-place update after it is one eager's walk did not see) and after the .grad
    # values the call sets (what that walk started from: Trace.backward_outside).
    walk_at = {}
    for w in walks:
        walk_at.setdefault(min(w[2], len(effects)), []).append(w)
    grad_lines = []
    effect_lines = []
    # The grad effects whose array a returned `Variable(x.grad.data)` wraps, or a
    # rebind effect stores (`W.data = x.grad.data`): made before the effects, ge{gi}.
    shared_grads = {a[1] for kind, a, _ in v.out_leaves if kind == "wrap"
                    and a[0] == "graddata"} | \
        {r for (where, r), _ in v.rebind_views.values() if where == "grad"}
    slot_of = {}
    for i, (kind, _, _) in enumerate(v.out_leaves):
        if kind == "out":
            slot_of[i] = len(slot_of)
    made_at = [i for i, (kind, _, form) in enumerate(v.out_leaves)
               if kind == "out" and form == VAR]
    for gi in sorted(shared_grads):
        i = made_at[v.grad_alias[gi]] if gi in v.grad_alias else None
        if i is not None and i not in v.out_views:
            # The .grad is a result (`g = x.grad; return g, Variable(g.data)`): that
            # result's array, its own already (fresh_slots), not a copy of it.
            body.append(f"ge{gi} = {out(slot_of[i])}")
        else:
            body += _fresh_lines(f"ge{gi}", out(v.grad_effects[gi][1]))
    for i, (kind, t, slot) in enumerate(effects):
        if i in walk_at:
            effect_lines.append(("walks", walk_at[i]))
        if i in dest:
            effect_lines.append(f"np.copyto({dest[i]}, {out(slot)}, casting='unsafe')")
            continue
        rebuilt = _rebind_view_lines(v, i, effects, names, dest, out, slot_of, const) \
            if i in v.rebind_views else []
        if len(rebuilt) != 1:       # (else that array itself: nothing to fall back to)
            effect_lines.append(f"val = {out(slot)}")
            effect_lines.append(f"{t}._data = val.copy(order='K') if any(val is x for x "
                                f"in arrays) else val")
        effect_lines += rebuilt
    if len(effects) in walk_at:
        effect_lines.append(("walks", walk_at[len(effects)]))
    aliased = {}      # made index -> (grad effect target whose .grad it is, its index)
    standins = set()  # those set to a stand-in before the walks (pre{gi})
    body_before_grads = body
    body = grad_lines
    late_lines = {}   # walk -> the lines of the grad effects set right after it
    early_lines = {}  # walk -> the lines of the grad effects set right before it
    # A .grad a later backward into the caller's graph starts from (a root of walk n >
    # 0: `u0.grad` of `loss3.backward(retain_grad=True)`, u0 an argument with a
    # creator) is set where that backward set it, right before its walk: set with the
    # other effects, before the first walk, an earlier walk passing u0 added to it
    # (eager's u0.grad is None then) and the caller's graph got u0's part twice.
    first_root = {}
    for n, w in enumerate(walks):
        for t in w[0]:
            first_root.setdefault((t.where, t.obj if t.where != "obj" else id(t.obj)), n)
    for gi, ((where, var), slot) in enumerate(v.grad_effects):
        t = target(where, var)
        root_of = first_root.get((where, var if where != "obj" else id(var)), 0)
        if gi in v.grad_late:
            # (Before the walks it holds none: they add to it, what they leave is
            # replaced, and nothing from before the call must meet their gradients.)
            grad_lines.append(f"{t}._grad = None")
            body = late_lines.setdefault(v.grad_late[gi], [])
        elif root_of > 0 and gi not in v.grad_alias and gi not in v.grad_same and \
                gi not in shared_grads:
            body = early_lines.setdefault(root_of, [])
        else:
            body = grad_lines
        if gi in v.grad_alias:
            aliased.setdefault(v.grad_alias[gi], []).append((t, gi))
            i = made_at[v.grad_alias[gi]]
            if walks and i not in v.out_views:
                # The result object is made after the walks into the caller's graph,
                # which start from this .grad (eager's walk adds to g: x.grad = g + gx,
                # a new Variable, and the result stays g): a stand-in on its array
                # until then; the result becomes the .grad only if no walk replaced it.
                body.append(f"pre{gi} = wrap({out(slot_of[i])})")
                body.append(f"{t}._grad = pre{gi}")
                standins.add(gi)
        elif gi in v.grad_same:
            body.append(f"{t}._grad = {target(*v.grad_effects[v.grad_same[gi]][0])}._grad")
        elif slot is None:
            body.append(f"{t}._grad = None")
        else:
            # A new array, as eager's: the graph may give an input here (a seed passed
            # through, `y = x + 1.0`, is a constant array of the trace), which the
            # caller may change in place (ClipGrad) and the next call reads.
            val = f"ge{gi}" if gi in shared_grads else "val"
            if gi not in shared_grads:
                body += _fresh_lines("val", out(slot))
            body.append(f"{t}._grad = " + (f"Constant({val})" if gi in v.grad_constant
                                            else f"wrap({val})"))
            env["Constant"] = core.Constant
    body = grad_lines
    for gi, slot, constant in v.nested_grads:
        # After every grad effect's line: the .grad it sets (that object on each
        # grad effect grad_same gives it) gets its .grad.
        body += _fresh_lines("val", out(slot))
        body.append(f"{target(*v.grad_effects[gi][0])}._grad._grad = " +
                    ("Constant(val)" if constant else "wrap(val)"))
        env["Constant"] = core.Constant
    body = body_before_grads
    grads_done = False
    for line in effect_lines:
        if isinstance(line, str):
            body.append(line)
            continue
        if not grads_done:
            body += grad_lines
            grads_done = True
        for ts, retain, _, slots, cuts in line[1]:
            for kind, cts in cuts:
                env["repeat_cut"] = core.repeat_cut
                body.append(f"repeat_cut({kind!r}, [{', '.join(target(*t) for t in cts)}])")
            # (A new array, as eager's: the graph may give an input or a constant of
            # the trace here, the seed's ones, which the walk may hand on to a .grad.)
            seeds = ", ".join("None" if k is None else f"fresh({out(k)}, arrays)"
                              for k in slots)
            env["fresh"] = _fresh
            wn = next(k for k, w in enumerate(walks) if w[0] is ts)
            body += early_lines.get(wn, [])
            body.append(f"backward_from([{', '.join(target(*t) for t in ts)}], "
                        f"{retain!r}, ({seeds}{',' if len(slots) == 1 else ''}))")
            if v.walk_read is not None and v.walk_read[0] == wn:
                body += _walk_read_lines(v, names, target, const, env)
            body += late_lines.get(wn, [])
    if not grads_done:
        body += grad_lines
    # Outputs: each leaf's expression, then the user's structure around them.
    leaves_ = v.out_leaves
    # The arrays of the results' retained .grads and of returned `Variable(np.ones(3))`
    # made before the views, which may be views of them (pytree.result_views).
    made_grad_arrays = {}
    for m, mg in enumerate(v.made_grads or ()):
        if mg is not None and mg[0] == "out":
            # A new array: the graph may give an input or constant (the seed's ones) here.
            body.append(f"val = {out(mg[1])}")
            body.append("val = val.copy(order='K') if any(val is x for x in arrays) or not "
                        "val.flags.owndata else val")
            body.append(f"mg{m} = val")
            made_grad_arrays[m] = f"mg{m}"
    for j, (kind, a, _) in enumerate(leaves_):
        if kind == "wrap" and a[0] == "constcopy" and j not in copies:
            # An array the call made: new every call, laid out as eager's.
            body.append(f"c{j} = {const(a[1])}.copy(order='K')")
            copies[j] = f"c{j}"
    for r in sorted({r for (where, r), _ in v.out_views.values() if where == "copy"}):
        body.append(f"cp{r} = {names[r]}.copy(order='K')")   # views of one such array
    for slot in sorted(set(v.view_base_slots.values())):
        # A new array (the graph may give an input here, `x * 1.0` simplified away).
        body.append(f"vb{slot} = {out(slot)}")
        body.append(f"if any(vb{slot} is x for x in arrays) or not vb{slot}.flags.owndata: "
                    f"vb{slot} = vb{slot}.copy(order='K')")
    if v.out_views:
        body += _view_lines(v, out, names, dest, const, env, call is not None,
                            target, made_grad_arrays, copies)
    exprs, made = [None] * len(leaves_), []
    out_slot = {}       # result leaf -> its output slot, for the "out" leaves
    k = 0
    for i, (kind, a, b) in enumerate(leaves_):
        if kind == "out":
            out_slot[i] = k
        if kind == "arg":
            exprs[i] = f"leaves[{a}]"
        elif kind == "argdata":
            exprs[i] = f"leaves[{a}]._data"
        elif kind == "const":
            exprs[i] = const(a)
        elif kind == "capdata":
            exprs[i] = f"{const(a)}._data"
        elif kind == "capgrad":
            exprs[i] = f"{const(a)}._grad"
        elif kind == "arggrad":
            exprs[i] = f"leaves[{a}]._grad"
        elif kind == "out":
            if b == VAR:
                name = f"y{len(made)}"
                spec = v.out_specs[len(made)]
                creator = spec.dtype.kind in "fc" and (
                    v.has_creator is None or v.has_creator[len(made)])
                made.append((name, k, creator, i))
                exprs[i] = name
            elif b == FLT:
                exprs[i] = f"float({out(k)})"
            elif b == PYTHON_SCALAR:                     # a Python scalar, as eager returns
                exprs[i] = f"{out(k)}.item()"
            elif b == SCALAR:                     # NumPy's own scalar, as eager returns
                exprs[i] = f"{out(k)}[()]"
            else:
                exprs[i] = out(k)
            k += 1
    def array_expr(kind, a):
        if kind == "argdata":
            return f"leaves[{a}]._data"
        if kind == "arg":
            return f"leaves[{a}]"
        if kind == "capdata":
            return f"{const(a)}._data"
        if kind == "const":
            return const(a)
        if kind == "constcopy":           # an array the call made: new every call
            return f"{const(a)}.copy(order='K')"
        if kind == "graddata":            # the array a grad effect set as a .grad
            return f"ge{a}"
        if kind == "inputdata":           # a caller's .grad's array, as the call read it
            return names[a]
        return data_of(a)                 # vardata: a made or returned Variable's

    def data_of(j):
        """The array of Variable result leaf j, named without that Variable where it
        can be: a made leaf that is an input of the call's CompiledFunction is made
        before the results (`Variable(Variable(y.data).data)`: down the chain to y's
        output slot)."""
        kind, a, b = leaves_[j]
        if kind == "out" and b == VAR:
            return out(out_slot[j])
        if kind == "wrap":
            return copies[j] if j in copies else array_expr(*a[:2])
        return f"{expr_of(j)}._data"

    def expr_of(i):
        if exprs[i] is None:
            kind, a, _ = leaves_[i]
            if kind == "vardata":
                exprs[i] = array_expr(kind, a)
            elif kind == "wrap":          # Variable(y.data): a new Variable, y's array
                arr = copies[i] if i in copies else array_expr(*a[:2])
                if i in v.leaf_class:     # a Parameter, a Constant, a name: eager's
                    cls, nm = v.leaf_class[i]
                    env["new_leaf"] = new_leaf
                    exprs[i] = f"new_leaf({const(cls)}, {arr}, {const(nm)})"
                else:
                    exprs[i] = f"wrap({arr})"
        return exprs[i]
    made_diff = {o for kind, o in (v.diff_sources if v.bwd is not None else ())
                 if kind == "made"}
    for i in sorted(made_diff | set(v.wrap_grads)):
        kind, a, _ = leaves_[i]
        if kind == "wrap":
            # A made leaf that is an input of the call's CompiledFunction: made before
            # it (data_of: a Variable result's array read as its output slot, as that
            # result is made after).
            body.append(f"w{i} = {expr_of(i)}")
            exprs[i] = f"w{i}"
            if i in v.wrap_grads:
                # (A new array: the graph may give an input or a constant here.)
                body.append(f"val = {out(v.wrap_grads[i])}")
                body.append("val = val.copy(order='K') if any(val is x for x in arrays) or not "
                            "val.flags.owndata else val")
                body.append(f"w{i}._grad = wrap(val)")
    for i in range(len(leaves_)):
        expr_of(i)
    # One object in several places (`return y, y`, `return h.data, h.data`): made once.
    late = []
    grad_leaves = {mg[1] for mg in v.made_grads or () if mg is not None and mg[0] == "leaf"}
    aliased_leaves = set(v.wrap_grad_alias) | {
        j for kind, j in v.wrap_grad_alias.values() if kind == "result"}
    for j in sorted({a for kind, a, b in leaves_ if kind == "same"} | grad_leaves |
                    aliased_leaves):
        if not exprs[j].isidentifier():
            late.append(f"r{j} = {exprs[j]}")
            exprs[j] = f"r{j}"
    for i, (kind, a, b) in enumerate(leaves_):
        if kind == "same":
            exprs[i] = exprs[a]
    structure = structure_source(v.out_tree, iter(exprs), const)
    # core.wrap_array written out: three calls of it were a tenth of a 0-d call.
    def cls_of(m, i):
        if m in v.made_constant:
            return "Constant"
        cls = v.leaf_class.get(i, (Variable, None))[0]
        return "Variable" if cls is Variable else const(cls)

    def name_of(i):
        nm = v.leaf_class.get(i, (None, None))[1]
        return "None" if nm is None else const(nm)
    plain = [f"{name} = new({cls_of(m, i)}); "
             f"{name}._data = {out(slot)}; {name}._tv = None; "
             f"{name}._grad = None; {name}.name = {name_of(i)}; {name}.creator = None; "
             f"{name}.generation = 0" for m, (name, slot, _, i) in enumerate(made)]
    if v.made_constant:
        env["Constant"] = core.Constant
    if v.bwd is not None:
        n_saved_from = v.n_user_outs + v.n_effect_outs
        diff = ", ".join(diff_names[j] if j in diff_names else
                         f"leaves[{o}]" if kind == "arg" else
                         exprs[o] if kind == "made" else
                         f"{target(*v.grad_effects[o][0])}._grad" if kind == "effgrad" else
                         const(o)
                         for j, (kind, o) in enumerate(v.diff_sources))
        body.append("if Config.enable_backprop:")
        saved = f"outs[{n_saved_from}:]" if call is not None else \
            f"[{', '.join(out(k) for k in range(n_saved_from, n_outs))}]"
        inner = [f"cf = CompiledFunction(v, {saved}, bwd_arrays)"]
        if v.bwd.saved_views or v.bwd.saved_unaliased:
            # Values eager's backward reads through an argument's or a captured buffer
            # (views of it): rebuilt on the call's buffer, which the caller may change
            # before the backward (trace.backward._argument_views).
            env["saved_views"] = saved_views
            inner.append("cf.saved = saved_views(cf.saved, bwd_arrays, v.bwd)")
        if v.has_random:
            inner.append("cf.rng = rng")      # a create_graph replay draws the same numbers
        if v.stale_grads:
            inner.append("cf.stale_init()")
        # The outputs eager gives no creator first: one may be a made leaf, an input
        # of cf.
        inner += [plain[m] for m, (_, _, creator, _) in enumerate(made) if not creator]
        inner += [
                 f"cf.inputs = ins = [{diff}]",
                 "cf.generation = max([x.generation for x in ins])" if v.diff_sources
                 else "cf.generation = 0"]
        depths = v.output_depths()
        inner += [f"{name} = wrap({out(slot)}, cf)" +
                  (f"; {name}.generation += {depths[slot] - 1}" if depths[slot] > 1
                   else "") +
                  (f"; {name}.name = {name_of(i)}" if i in v.leaf_class else "")
                  for name, slot, creator, i in made if creator]
        # An output eager gives no creator is not ours either: a dead entry keeps the
        # creator's output slots numbered as the backward graph's gys.
        refs = [f"ref({n})" if c else "dead" for n, _, c, _ in made]
        inner.append(f"cf.outputs = [{', '.join(refs)}]")
        inner += [f"cf.link_held({k}, {exprs[i]})" for k, i in v.held_results]
        if v.upstream_holds:
            inner.append(f"cf.hold_upstream({const(v.upstream_holds)})")
        body += ["    " + line for line in inner]
        body.append("else:")
        body += ["    " + line for line in plain] or ["    pass"]
    elif v.grad_mode and any(c for _, _, c, _ in made):
        # Nothing differentiable from outside, no result computed from another (else
        # the call has a backward plan), but eager's outputs have creators.
        # The grad mode is the key's (v.grad_mode): no test of it. Written out as
        # `plain` is: this is the hot path of value_and_grad on ndarrays.
        # The variant as a class attribute: one attribute store less per call.
        env["Inputless"] = type("InputlessCompiledFunction", (InputlessCompiledFunction,),
                                {"variant": v, "__module__": __name__})
        body.append("cf = new(Inputless)")
        body += [line.replace(".creator = None; ", ".creator = cf; ").replace(
                 ".generation = 0", ".generation = 1") if c else line
                 for line, (_, _, c, _) in zip(plain, made)]
        refs = [f"ref({n})" if c else "dead" for n, _, c, _ in made]
        body.append(f"cf.outputs = [{', '.join(refs)}]")
    else:
        body += plain
    late_grads = []           # .grads that are results bound in `late`
    for m, targets in aliased.items():
        body += [f"if {t}._grad is pre{gi}: {t}._grad = {made[m][0]}" if gi in standins
                 else f"{t}._grad = {made[m][0]}" for t, gi in targets]
    for m, mg in enumerate(v.made_grads or ()):
        if mg is not None and mg[0] == "same":
            body.append(f"{made[m][0]}._grad = {made[mg[1]][0]}")
        elif mg is not None and mg[0] == "leaf":
            late_grads.append(f"{made[m][0]}._grad = {exprs[mg[1]]}")
        elif mg is not None and mg[0] == "effect":
            body.append(f"{made[m][0]}._grad = {target(*v.grad_effects[mg[1]][0])}._grad")
        elif mg is not None:
            body.append(f"{made[m][0]}._grad = " +
                        (f"Constant(mg{m})" if mg[2] else f"wrap(mg{m})"))
            env["Constant"] = core.Constant
    if v.late_cuts:
        env["repeat_cut"] = core.repeat_cut
        # (A backward event, and the cuts before it, are placed among the effects.)
        for kind, ts in v.late_cuts:
            body.append(f"repeat_cut({kind!r}, [{', '.join(target(*t) for t in ts)}])")
    for i, (kind, j) in sorted(v.wrap_grad_alias.items()):
        # (Last: the .grad a grad effect sets is its final object only after the walks.)
        late_grads.append(f"{exprs[i]}._grad = " + (
            exprs[j] if kind == "result" else f"{made[j][0]}._grad" if kind == "made"
            else f"{target(*v.grad_effects[j][0])}._grad"))
    body += late + late_grads
    body.append(f"return {structure}")
    # args/kwargs: the call's own, for a result that is an argument's container.
    src = "def run(leaves, args=None, kwargs=None):\n" + \
        "\n".join("    " + line for line in body) + "\n"
    exec(compile(src, f"<tracejit-runner {v.forward_graph.name}>", "exec"), env)
    run = env["run"]
    run.source = src
    return run


def _walk_read_lines(v, names, target, const, env):
    """Right after the walk v.walk_read names: read the .grad it left on each of those
    leaves and run the part of the graph that depends on them again (_walk_read_part),
    its outputs replacing the first run's (which read the traced .grad)."""
    walk, reads, slots, exe2, kept, copies = v.walk_read
    env["exe2"], env["WalkReadMismatch"] = exe2, WalkReadMismatch
    args = list(names)
    for pos in kept:
        args[pos] = f"kept{pos}"      # (copied before the effects: _walk_read_part)
    lines = []
    for j, (pos, t, (shape, dtype)) in enumerate(reads):
        lines.append(f"pw{j} = {target(*t)}._grad")
        lines.append(f"pw{j} = None if pw{j} is None else pw{j}._data")
        # (The walk checks before the graph ran hold this: a leaf the call gave a .grad,
        # a caller's graph of tracejit's Functions keeping its dtype, core.walk_keeps_dtype.)
        lines.append(f"if type(pw{j}) is not np.ndarray or pw{j}.shape != {shape!r} or "
                     f"pw{j}.dtype != {const(np.dtype(dtype))}: raise WalkReadMismatch("
                     f"{_label(t[1]) if t[0] == 'obj' else 'an argument'!r})")
        args[pos] = f"pw{j}"
    lines.append(f"o2 = exe2([{', '.join(args)}])")
    lines.append("outs = list(outs)")
    for j, k in enumerate(slots):
        lines.append(f"outs[{k}] = o2[{j}]")
    for j, same in copies:
        lines.append(f"outs[{slots[j]}] = " + (f"outs[{slots[j]}].copy(order='K')"
                                               if same is None else f"outs[{slots[same]}]"))
    # What the backward and its replays read as these inputs (bwd_arrays is arrays).
    for j, (pos, _, _) in enumerate(reads):
        lines.append(f"arrays[{pos}] = pw{j}")
    laid = [k for k in slots if k in v.layout_slots]
    if laid:
        # Eager's memory order of these (eager_layouts), for the .grad the walk left
        # (its strides: not the placeholder's the first run's layout was found for).
        env["laid_out"], env["eager_layouts"] = laid_out, eager_layouts
        lk = "('walk', " + "".join(f"{args[k]}.strides, " for k in v.layout_inputs) + \
            "".join(f"pw{j}.strides, " for j in range(len(reads))) + ")"
        lines.append(f"lay2 = v.layouts.get({lk})")
        lines.append(f"if lay2 is None: lay2 = eager_layouts(v, {lk}, [{', '.join(args)}])")
        for k in laid:
            lines.append(f"if {k} in lay2: outs[{k}] = laid_out(outs[{k}], lay2[{k}])")
    return lines


class WalkReadMismatch(RuntimeError):
    """The .grad a backward inside a compiled call left in the caller's graph is not of
    the shape and dtype its graph read it as, though the checks before the graph ran
    held (a Function of tracejit's changing the dtype of a gradient)."""

    def __init__(self, what):
        super().__init__(f"jit: the .grad of {what} after a backward inside the call went "
                         f"on into the caller's graph is not of the shape and dtype the "
                         f"compiled call read it as")


def _fresh(val, arrays):
    """val, or a copy of it where it is an input of the call or a view (in its layout:
    a view laid_out made in eager's order, which a C-order copy would undo)."""
    fresh = any(val is x for x in arrays) or not val.flags.owndata
    return val.copy(order='K') if fresh else val


def _fresh_lines(name, expr):
    """name = the graph's output expr as a new array of its own, as eager's: the graph
    may give an input or a constant of the trace there (a seed passed through)."""
    return [f"{name} = {expr}",
            f"{name} = {name}.copy(order='K') if any({name} is x for x in arrays) or not "
            f"{name}.flags.owndata else {name}"]


def _rebind_view_lines(v, e, effects, names, dest, out, slot_of, const):
    """Rebind effect e stores, as eager does, (a view of) the buffer it is one of
    (v.rebind_views): an input's array as read, an earlier in-place effect's buffer,
    the array a grad effect sets or an earlier rebind stored, a computed result's. A replay NumPy answers with a
    copy keeps the graph's value (stored just before)."""
    (where, r), steps = v.rebind_views[e]
    t = effects[e][1]
    if where == "input":
        if v.sources[r].kind not in INPUT_BUFFERS:
            return []
        base = names[r]
    elif where == "effect":
        base = dest[r]
    elif where == "grad":
        base = f"ge{r}"
    elif where == "rebind":
        base = f"{effects[r][1]}._data"
    else:
        base = out(slot_of[r])
    if not steps:
        return [f"{t}._data = {base}"]      # that array object itself: `W.data = x.data`
    return [f"val = replay_view({base}, {const(steps)})",
            f"if val is not None: {t}._data = val"]


def _view_lines(v, out, names, dest, const, env, listed, target, made_grad_arrays,
                copies):
    """Each result eager returns as a view (v.out_views) replaces the graph's copy of
    it: the same NumPy view operations replayed on the live buffer, after the call's
    effects and grad effects, so it aliases that buffer as eager's does and holds what
    it holds. A replay NumPy answers with a copy (a reshape of a non-contiguous
    argument, as eager copies it) keeps the graph's value, computed from the inputs
    before the effects (as eager's copy was), in an array of its own: eager's copy is
    a new C-ordered array, and the graph's may be one array for two such views (CSE
    merged `h.data.reshape(-1)` twice; fuzz program 254) or a view of its buffer."""
    slot, k = {}, 0
    for i, (kind, _, _) in enumerate(v.out_leaves):
        if kind == "out":
            slot[i] = k
            k += 1
    lines = ["outs = list(outs)"] if listed else []
    # A view of another result after that result: its own replay first.
    order, done = [], set()
    pending = sorted(v.out_views)
    while pending:
        ready = [i for i in pending if v.out_views[i][0][0] != "leaf"
                 or v.out_views[i][0][1] not in v.out_views or v.out_views[i][0][1] in done]
        if not ready:
            break           # (a cycle cannot be traced: each is a view of an earlier one)
        order += ready
        done.update(ready)
        pending = [i for i in pending if i not in done]
    for i in order:
        (where, r), steps = v.out_views[i]
        if where == "input":
            if v.sources[r].kind not in INPUT_BUFFERS:
                continue
            base = names[r]
        elif where == "effect":
            if r not in dest:
                continue
            base = dest[r]          # the buffer effect r wrote into
        elif where == "rebind":     # the array rebind effect r stored, `W.data = h.data`
            base = f"{target(*v.effects[r][1])}._data"
        elif where == "grad":       # the .grad grad effect r set (a seed's copy, ...)
            base = f"{target(*v.grad_effects[r][0])}._grad._data"
        elif where == "value":      # a value no result holds, returned by the graph
            base = f"vb{v.view_base_slots[id(r)]}"
        elif where == "copy":       # this call's copy of an array the function made
            base = f"cp{r}"
        elif where == "madegrad":   # the retained .grad of result Variable r
            if r not in made_grad_arrays:
                continue
            base = made_grad_arrays[r]
        elif r in copies:           # a returned Variable(np.ones(3)): this call's copy
            base = copies[r]
        else:
            base = out(slot[r])
        dst = out(slot[i])
        lines.append(f"val = replay_view({base}, {const(steps)})")
        lines.append(f"{dst} = val if val is not None else {dst}.copy()")
    return lines


def _label(var):
    if isinstance(var, int):
        return f"argument {var}'s .grad"      # a Variable's .grad.grad
    return repr(var.name) if var.name else "a captured Variable"


class InplaceAlias(Exception):
    """An array the call updates in place shares memory with another of its inputs."""


def inplace_alias(updated, arrays):
    """Raise InplaceAlias when an array in `updated` is another input too: the same
    object twice among `arrays`, or memory shared with one of them. Arrays that own
    their memory (base None) and are distinct objects cannot overlap: the common case
    costs an attribute read per array."""
    for d in updated:
        if d is None:
            continue
        seen = 0
        for a in arrays:
            if a is d:
                seen += 1
                if seen > 1:
                    raise InplaceAlias("an array it updates is passed twice")
            elif a is not None and (d.base is not None or a.base is not None) \
                    and _overlap(a, d):
                raise InplaceAlias("an array it updates shares memory with another input")


def _overlap(a, b):
    # may_share_memory compares bounds (x[0::2] and x[1::2] "may"); shares_memory
    # settles it, and a problem too hard for it counts as an overlap.
    if not np.may_share_memory(a, b):
        return False
    try:
        return bool(np.shares_memory(a, b, max_work=10_000))
    except Exception:  # noqa: BLE001 - TooHardError
        return True


class Stale(Exception):
    """A captured input changed shape or dtype, or died: this variant no longer applies."""



def compile_graph(g, backend="auto", parallel=None, cache=True, where=None):
    """backend: "numba" (fused kernels), "interpret" (the reference), or "auto"
    (TRACEJIT_BACKEND, else numba; a graph numba fails on runs interpreted, warned at
    `where`, the user's line). The graph goes through passes.PIPELINE first, whatever
    the backend: backends only lower."""
    from tracejit import passes
    if parallel is None and any(n.kind == core.MATMUL for n in g.nodes):
        # Measured (MLP 784-256-10 step, 2 cores): prange kernels between BLAS calls
        # run 8.4 ms a step, serial ones 0.99 ms. Numba's OpenMP threads and OpenBLAS's
        # threads spin against each other; a graph with a matmul stays serial.
        parallel = False
    auto = backend == "auto"
    if auto:
        backend = os.environ.get("TRACEJIT_BACKEND", "numba")
    if backend not in ("numba", "interpret"):
        raise ValueError(f"jit: unknown backend {backend!r} (use 'numba', 'interpret' or "
                         f"'auto')")
    from tracejit.runtime.jitted import warn_at
    at = f", at {where}" if where else ""
    try:
        opt = passes.optimize(g)
    except passes.PassError as e:
        if not auto:
            raise
        warn_at(f"jit({g.name}): {e}; this graph runs unoptimized on the interpret "
                f"backend{at}", where)
        opt, backend = g, "interpret"
    run = None
    if backend == "numba":
        from tracejit.backends import numba as codegen
        try:
            run = codegen.compile(opt, parallel=parallel, cache=cache)
        except Exception as e:  # noqa: BLE001 - any codegen failure: still correct
            if not auto:
                raise
            warn_at(f"jit({g.name}): the numba backend failed ({type(e).__name__}: {e}); "
                    f"this graph runs on the interpret backend{at}", where)
    if run is None:
        run = interpret.compile(opt)
        # The graph that runs: what trace() shows, and what fresh_copies reads the
        # outputs of (two results the passes merged into one value are copied apart).
        run.graph = opt
    if opt is not g:          # the traced graph reports what it became (summary())
        g.source = opt.source
        g.notes.update(opt.notes)
    return run
