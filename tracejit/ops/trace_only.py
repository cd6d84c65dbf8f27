"""Ops that only the tracer creates: guards, and NumPy calls on traced `.data`.

A Guard node records what Python saw while tracing (`bool(v)`, `float(v)`, ...): when
the variant runs, the backend checks it where it stands in the graph and stops at the
first guard whose outcome differs. NumpyCall is a NumPy function applied to traced
data that has no tracejit primitive (an argmax in accuracy()): an opaque node that
runs NumPy between kernels.
"""
import contextlib
import copy
import threading
import weakref

import numpy as np

from tracejit.core import OPAQUE, Function, ShapeDtype, Variable, _state

GUARD = "guard"


class GuardFailure(Exception):
    """A variant met a guard whose outcome differs from the one it was traced under."""

    def __init__(self, index, outcome):
        super().__init__(index, outcome)
        self.index = index        # position among the graph's guards
        self.outcome = outcome    # what the guard saw this time


def _shape(x):
    return tuple(int(d) for d in np.shape(x))


_CONVERT = {"bool": bool, "int": int, "float": float, "index": int, "shape": _shape}


class Guard(Function):
    """`conv(x) == expected` where conv is bool, int, float, index or shape (of a NumPy
    call's result whose shape may depend on the data: np.unique(t))."""

    kind = GUARD
    params = ("conv", "expected")

    def __init__(self, conv, expected):
        self.conv = conv
        self.expected = expected

    def outcome(self, x):
        return _CONVERT[self.conv](x)

    def holds(self, x):
        got = self.outcome(x)
        return got == self.expected or (got != got and self.expected != self.expected)

    def forward(self, x):
        return None

    def describe(self, arg):
        return f"{self.conv}({arg}) == {self.expected!r}"

    def to_onnx(self, b, node):
        """Export (an If-tree of paths): whether the guard holds, a bool the builder
        collects for the path's branch condition."""
        b.guard_holds(node, self.conv, self.expected)

    def shape_rule(self, x):
        return ()


class NumpyCall(Function):
    """A NumPy function or ufunc method applied to traced arrays, replayed as is."""

    kind = OPAQUE
    # consts: (position, value) of Python constants among the positional arguments
    # (2 in np.round(a, 2), 0.3 in a // 0.3, 0.0 in np.where(c, a, 0.0)), passed as the
    # very constants: NumPy takes a Python number weakly (float32 stays float32).
    # seqs: (position, template) of the positional arguments that are lists or tuples
    # of operands (np.concatenate([a, b]), np.stack((a, 2 * a)), np.block([[a], [b]])):
    # the node's inputs hold their operands flattened in order, and the template
    # rebuilds the very sequence: ("list" | "tuple", entries), an entry None for the
    # next operand, ("c", value) for a Python constant, or a nested template.
    # pick: for a call giving several arrays (np.divmod, np.modf, np.nonzero,
    # np.where(c)), which one this node is (one node per result); None: the one result.
    params = ("func", "method", "kwargs", "consts", "seqs", "pick")

    def __init__(self, func, method=None, kwargs=(), consts=(), seqs=(), pick=None):
        self.func = func
        self.method = method
        self.kwargs = kwargs
        self.consts = tuple(tuple(c) for c in consts)
        self.seqs = tuple(tuple(s) for s in seqs)
        self.pick = pick
        self.op_name = "np." + getattr(func, "__name__", str(func)) + (
            "." + method if method and method != "__call__" else "")

    def raw(self, *xs):
        """What NumPy itself returns (a NumPy scalar for a 0-d result)."""
        f = self.func if not self.method or self.method == "__call__" else \
            getattr(self.func, self.method)
        args = list(xs) if not self.seqs else self._with_seqs(xs)
        for pos, value in self.consts:
            args.insert(pos, value)
        y = f(*args, **dict(self.kwargs))
        return y if self.pick is None else y[self.pick]

    def _with_seqs(self, xs):
        """The positional arguments but the constants: the operands with each sequence
        rebuilt from its template (its positions count the constants too)."""
        it = iter(xs)

        def build(t):
            kind, entries = t
            items = [next(it) if e is None else e[1] if e[0] == "c" else build(e)
                     for e in entries]
            return items if kind == "list" else tuple(items)

        seqs, const_pos = dict(self.seqs), {pos for pos, _ in self.consts}
        args, pos = [], 0
        while True:
            if pos in const_pos:
                pos += 1
                continue
            if pos in seqs:
                args.append(build(seqs[pos]))
            else:
                x = next(it, it)
                if x is it:
                    return args
                args.append(x)
            pos += 1

    def forward(self, *xs):
        return np.asarray(self.raw(*xs))

    def shape_rule(self, *specs):
        y = self.forward(*[np.ones(s.shape, s.dtype) for s in specs])
        return ShapeDtype(y.shape, y.dtype)

    def to_onnx(self, b, node):
        """Export: the NumPy functions with a standard ONNX form (_ONNX_CALLS); any
        other call names itself as having none."""
        lower = _ONNX_CALLS.get(self.func) if self.method in (None, "__call__") else None
        if lower is None:
            raise b.unsupported(node, f"{self.op_name} is a NumPy call the tracer kept as "
                                      f"is, with no ONNX form")
        lower(self, b, node)


def _onnx_arg_reduce(op_type):
    def lower(call, b, node):
        # np.argmax / np.argmin(x, axis=None, keepdims=False): ONNX's ArgMax / ArgMin
        # with select_last_index=0 give the first extreme, as NumPy's do (a NaN, which
        # NumPy's argmax picks first, has no defined place in ONNX's).
        kw = dict(call.kwargs)
        if set(kw) - {"axis", "keepdims"} or len(node.inputs) != 1 or call.consts \
                or call.seqs or call.pick is not None:
            raise b.unsupported(node, f"{call.op_name} with {sorted(kw)}")
        x, rank = b.x(node, 0), len(node.inputs[0].shape)
        axis, keep = kw.get("axis"), int(bool(kw.get("keepdims", False)))
        if axis is None:
            # The flat index; keepdims: a (1, ..., 1) result.
            flat = b.op("Reshape", [x, b.ints([-1])])
            y = b.op(op_type, [flat], axis=0, keepdims=0)
            if keep:
                y = b.op("Reshape", [y, b.ints([1] * rank)])
        else:
            y = b.op(op_type, [x], axis=int(axis) % rank, keepdims=keep,
                     select_last_index=0)
        b.bind(node, y, dtype=np.int64)
    return lower


def _onnx_ones_like(call, b, node):
    # np.ones_like(y) (backward()'s seed of a traced y): ones of the output's static
    # shape and dtype, a constant (ONNX has no memory order).
    if call.kwargs or call.consts or len(node.inputs) != 1:
        raise b.unsupported(node, f"{call.op_name} with arguments")
    out = node.outputs[0]
    b.bind(node, b.const(np.ones(tuple(out.shape), out.dtype), "ones"))


def _onnx_copy(call, b, node):
    # np.positive(x) (the tracer's record of x.copy(), of np.copy: a new array of the
    # same values; ONNX has no memory to share): the value itself.
    if call.kwargs or call.consts or call.seqs or len(node.inputs) != 1 \
            or node.inputs[0].dtype != node.out.dtype:
        raise b.unsupported(node, f"{call.op_name} with arguments")
    b.bind(node, b.op("Identity", [b.x(node, 0)]))


def _onnx_joined(stack):
    def lower(call, b, node):
        # np.stack / np.concatenate of one flat sequence of operands and Python
        # constants (np.array([m, s]) of traced numbers is recorded as np.stack):
        # each cast to the result's dtype (NumPy's promotion, done at trace time), a
        # constant as an array of an operand's shape; Unsqueeze for stack; Concat.
        kw = dict(call.kwargs)
        seqs = dict(call.seqs)
        if set(kw) - {"axis", "dtype"} or call.consts or list(seqs) != [0] \
                or any(e is not None and e[0] != "c" for e in seqs[0][1]):
            raise b.unsupported(node, f"{call.op_name} with {sorted(kw)} or a nested "
                                      f"sequence")
        out = node.outputs[0]
        dtype = out.dtype
        if not node.inputs:
            raise b.unsupported(node, f"{call.op_name} of constants only")
        item_shape = tuple(node.inputs[0].shape)
        consts = any(e is not None for e in seqs[0][1])
        if consts and not all(isinstance(d, (int, np.integer))
                              for d in b.dims(node.inputs[0])):
            raise b.unsupported(node, f"{call.op_name} of a constant beside operands of "
                                      f"a dynamic shape")
        if kw.get("axis", 0) is None:
            raise b.unsupported(node, f"{call.op_name} with axis=None")
        rank = len(out.shape)
        axis = int(kw.get("axis", 0)) % rank
        parts, k = [], 0
        for e in seqs[0][1]:
            if e is None:
                x = b.x(node, k, dtype)
                k += 1
            else:
                x = b.const(np.full(item_shape, e[1], dtype=dtype), "c")
            parts.append(b.op("Unsqueeze", [x, b.ints([axis])]) if stack else x)
        b.bind(node, b.op("Concat", parts, axis=axis))
    return lower


_ONNX_CALLS = {np.argmax: _onnx_arg_reduce("ArgMax"), np.argmin: _onnx_arg_reduce("ArgMin"),
               np.ones_like: _onnx_ones_like, np.positive: _onnx_copy,
               np.stack: _onnx_joined(True), np.concatenate: _onnx_joined(False)}


# ------------------------------------------------------------ user Functions with state

class _Calls(threading.local):
    """Per thread: the per-call instances of stateful user Functions.

    `forward` maps a UserCall node to (instance, outputs) of its latest run in this
    thread: a compiled call's CompiledFunction takes its own entries right after its
    forward ran (variant.CompiledFunction), and a UserBackward node of the same forward
    graph (a backward run inside the function) reads them there. `stack` holds the
    instances of the compiled calls whose backward is running now, innermost last.
    """

    def __init__(self):
        self.forward = {}
        self.stack = []


_calls = _Calls()


def take_calls(user_calls):
    """The (instance, outputs) of each UserCall in `user_calls` from this thread's
    latest forward run, removed there (the caller, a compiled call, keeps them)."""
    fwd = _calls.forward
    return {c: fwd.pop(c) for c in user_calls if c in fwd}


@contextlib.contextmanager
def running_backward(instances):
    """While a compiled call's backward runs, its UserBackward nodes find the
    instances of that call here."""
    _calls.stack.append(instances)
    try:
        yield
    finally:
        _calls.stack.pop()


def _instance_of(call):
    for instances in reversed(_calls.stack):
        entry = instances.get(call)
        if entry is not None:
            return entry
    entry = _calls.forward.get(call)
    if entry is None:
        raise RuntimeError(f"tracejit: the backward of {call.op_name} ran without the "
                           f"forward call it belongs to")
    return entry


def _copy_state(state):
    # A fresh instance's __dict__: containers made by __init__ are the instance's own
    # in eager (a new one per call), so each call gets copies of them.
    return {k: (copy.copy(v) if type(v) in (list, dict, set) else v)
            for k, v in state.items()}


class UserBackwardMismatch(RuntimeError):
    """A user backward gave gradients to other inputs than on the traced call."""


class UserCall(Function):
    """A user Function whose forward keeps state on self (`self.k = ...`, a mask):
    every run makes a fresh instance from the state __init__ left (as eager constructs
    one per call), runs its forward there, and records it, so that the call's backward
    (UserBackward) runs on that same instance."""

    kind = OPAQUE
    params = ()
    # Its backward also runs inside the function (grad() of it, a backward() in a
    # training step): the forward's instance is kept for it even under no_grad.
    backward_in_forward = False

    def __init__(self, template, state):
        self.template = template      # the user's class, as an empty shell
        self.state = state            # its __dict__ before the traced forward ran
        self.op_name = type(template).__name__

    def new_instance(self):
        inst = copy.copy(self.template)
        inst.__dict__.update(_copy_state(self.state))
        return inst

    def forward(self, *xs):
        inst = self.new_instance()
        ys = inst.forward(*xs)
        if self.backward_in_forward or _state.enable_backprop:
            # No backward can ask for it otherwise: nothing is kept.
            _calls.forward[self] = (inst, ys if isinstance(ys, tuple) else (ys,))
        return ys


class UserBackward(Function):
    """The backward of a UserCall node, run by the user's own backward on the instance
    that ran the forward of the same call. Inputs: the forward's inputs, its outputs,
    then the output gradients; outputs: the gradients of the inputs marked in `mask`
    (those the traced call's backward gave)."""

    kind = OPAQUE
    params = ()

    def __init__(self, call, n_in, n_out, mask, specs):
        self.call = call
        self.n_in = n_in
        self.n_out = n_out
        self.mask = tuple(mask)
        self.specs = tuple(specs)     # ShapeDtype of each gradient it returns
        self.op_name = f"{call.op_name}.backward"

    def bind(self, inst, xs, ys):
        """Set inst's inputs and outputs as Function.__call__ would; returns the
        output Variables (the caller keeps them alive: inst.outputs are weak)."""
        import weakref
        from tracejit.core import as_variable
        inst.inputs = [as_variable(x) for x in xs]
        outs = [as_variable(y) for y in ys]
        inst.outputs = [weakref.ref(y) for y in outs]
        inst.generation = max([x.generation for x in inst.inputs], default=0)
        return outs

    def forward(self, *arrays):
        from tracejit.core import Variable, _input_grads, no_grad
        inst, _ = _instance_of(self.call)
        n, m = self.n_in, self.n_out
        var = lambda a: Variable(np.asarray(a))   # noqa: E731
        keep = self.bind(inst, [var(a) for a in arrays[:n]],    # noqa: F841
                         [var(a) for a in arrays[n:n + m]])
        with no_grad():
            gxs = _input_grads(inst, [var(g) for g in arrays[n + m:]])
        return self.results(gxs)

    def results(self, gxs):
        """The gradient arrays in the traced call's layout, or a clear error."""
        out = []
        for i, (gx, want) in enumerate(zip(gxs, self.mask)):
            if (gx is None) != (not want):
                raise UserBackwardMismatch(
                    f"{self.call.op_name}.backward returned "
                    f"{'None' if gx is None else 'a gradient'} for input {i}, where the "
                    f"traced call's backward returned "
                    f"{'a gradient' if want else 'None'}: a compiled backward cannot "
                    f"change which inputs get gradients. Run it eagerly "
                    f"(tj.disable_jit()).")
            if gx is None:
                continue
            a = np.asarray(getattr(gx, "data", gx))
            spec = self.specs[len(out)]
            if a.shape != spec.shape or a.dtype != spec.dtype:
                raise UserBackwardMismatch(
                    f"{self.call.op_name}.backward returned a {a.dtype}{list(a.shape)} "
                    f"gradient for input {i}, where the traced call's was {spec}: run "
                    f"it eagerly (tj.disable_jit())")
            out.append(a)
        return tuple(out) if len(out) != 1 else out[0]

    def shape_rule(self, *specs):
        return self.specs if len(self.specs) != 1 else self.specs[0]


class UserGrad(UserBackward):
    """A UserBackward with a history, for create_graph (grad of grad, a backward with
    create_graph=True inside the function): a Function call whose outputs' creator
    it is, so its own backward exists. Level 0 runs the user's backward on the
    call's instance; level k+1 is the vector-Jacobian product of level k (inputs: level
    k's inputs, then the cotangents of its outputs; outputs: the gradients of the
    inputs marked in `mask`), computed by running level k eagerly with backprop on,
    so the user's backward is differentiated exactly as eager does (a `.data` read in
    it is detached). `inst` is the instance while tracing or replaying; a graph node
    holds none (node_op) and finds the call's instance when it runs."""

    def __init__(self, call, n_in, n_out, level=0, n_args=None, inst=None):
        super().__init__(call, n_in, n_out, (), ())
        self.level = level
        self.n_args = n_in + 2 * n_out if n_args is None else n_args   # level k's inputs
        self.inst = inst
        self.mask = None              # set by the first (traced) forward
        # Per output (gradient), the positions of the arguments its graph reaches in
        # eager (a `.data` read or an argument it never reads is no path): set by the
        # first (traced) forward, the links of eager's graph the trace records
        # (trace.record.record), checked on every later run.
        self.links = None
        if level:
            self.op_name = f"{call.op_name}.backward^{level + 1}"

    def node_op(self):
        op = copy.copy(self)
        for attr in ("inputs", "outputs", "generation"):
            op.__dict__.pop(attr, None)
        op.inst = None
        return op

    def _instance(self):
        return self.inst if self.inst is not None else _instance_of(self.call)[0]

    def forward(self, *arrays):
        from tracejit.core import Variable, set_trace, using_config
        # While tracing: run for real, unrecorded (the gradients' .data too: read
        # under the trace, each would be captured as a constant of the variant).
        prev = set_trace(None)
        try:
            # With a history (dropped here: the results leave as arrays), whose
            # graphs say which arguments each gradient reaches, as eager's links them.
            xs = [Variable(np.asarray(a)) for a in arrays]
            with using_config("enable_backprop", True):
                gxs = self.grads(self._instance(), xs)
            links = _reached_args([g for g in gxs if g is not None], xs)
            if self.mask is None:
                self.mask = tuple(g is not None for g in gxs)
                self.specs = tuple(_spec(g) for g in gxs if g is not None) or \
                    (ShapeDtype((), np.dtype(np.float64)),)
                self.links = links
            out = self.results(gxs)
            if links != self.links:
                # Compiled calls link what the traced call's graph linked: a later
                # walk would pass (or not) through Variables eager's does not.
                raise UserBackwardMismatch(
                    f"{self.call.op_name}.backward under create_graph gave gradients "
                    f"whose graph reaches other arguments (its inputs, outputs or output "
                    f"gradients, a `.data` read being none) than on the traced call "
                    f"(per-call state on self): run it eagerly (tj.disable_jit())")
            # No gradient at all: one dead 0-d output (a Function call has at least one).
            return np.zeros(()) if isinstance(out, tuple) and not out else out
        finally:
            set_trace(prev)

    def grads(self, inst, xs):
        """Level k on Variables xs, with a history if backprop is enabled: one entry
        (a Variable or None) per argument of level k."""
        from tracejit.core import _input_grads
        if self.level == 0:
            n, m = self.n_in, self.n_out
            saved = {a: inst.__dict__[a] for a in ("inputs", "outputs", "generation")
                     if a in inst.__dict__}
            keep = self.bind(inst, xs[:n], xs[n:n + m])    # noqa: F841
            try:
                return _input_grads(inst, xs[n + m:])
            finally:
                # Tracing or replaying, the instance is also the graph's creator.
                inst.__dict__.update(saved)
        return _vjp(self.below, inst, xs[:self.n_args], xs[self.n_args:])

    @property
    def sets_output_grads(self):
        """A walk with retain_grad through the user's backward (a traced call's
        result, x.grad of a create_graph backward inside it) keeps in eager a .grad
        on every Variable that backward made, which a later walk adds to: level 0,
        outside a trace, is then walked as that graph (backward_retaining)."""
        from tracejit.core import _state
        return self.level == 0 and _state.trace is None

    def backward_retaining(self, gys):
        """(input gradients, output gradients) for a retaining walk (with create_graph
        if backprop is enabled): the user's backward run again on this call's
        Variables, with a history, its results made this call's own outputs (as a
        compiled call's replay adopts its results), and walked with retain_grad, so
        its intermediates keep eager's .grads. Where a gradient is no Function's
        output (the user's backward returned a cotangent itself) there is nothing to
        adopt: the opaque backward."""
        from tracejit.core import (DictGrads, _state, backprop, fit_generations,
                                   region_between, using_config)
        create = bool(_state.enable_backprop)
        leaves = list(self.inputs)
        with using_config("enable_backprop", True):
            gxs = self.grads(self._instance(), leaves)
        made = [g for g in gxs if g is not None]
        if len(made) != len(self.outputs) or any(
                g.creator is None or any(g is x for x in leaves) for g in made):
            return self.backward(*gys), None
        adopted, twins = [], []
        for ref, g in zip(self.outputs, made):
            mine = ref()
            if mine is not None:
                f = g.creator
                f.outputs = [weakref.ref(mine) if r() is g else r for r in f.outputs]
                adopted.append((mine, mine.generation))
                mine.creator, mine.generation = f, g.generation
                g = mine
            twins.append(g)
        if any(mine.generation > old for mine, old in adopted):
            fit_generations(adopted, {id(x) for x in leaves})
        grads, roots = DictGrads(), []
        for twin, gy in zip(twins, gys):
            if gy is not None:
                grads.set(twin, gy)
                roots.append(twin)
        backprop(roots, grads=grads, create_graph=create, retain_grad=True,
                 within=region_between(roots, leaves))
        stop = {id(x) for x in leaves} | {id(t) for t in twins}
        for key, (var, g) in grads.items():
            if key not in stop:
                var._grad = g       # an intermediate's, kept (the walk's own are set)
        return tuple(grads.get(x) for x in leaves), tuple(grads.get(t) for t in twins)

    def backward(self, *cts):
        up = UserGrad(self.call, self.n_in, self.n_out, self.level + 1,
                      len(self.inputs), self.inst)
        up.below = self.node_op()
        return up.per_input(up(*self.inputs, *cts))

    def per_input(self, ys):
        """The outputs of a call of this op, one entry (or None) per argument."""
        it = iter(ys if isinstance(ys, (list, tuple)) else [ys])
        return tuple(next(it) if want else None for want in self.mask)


def _reached_args(gs, xs):
    """Per gradient in gs, the positions in xs of the Variables its graph reaches
    (through creators, stopping at xs): the arguments eager's graph of it links."""
    pos = {id(x): i for i, x in enumerate(xs)}
    out = []
    for g in gs:
        hit, seen, todo = set(), set(), [g]
        while todo:
            v = todo.pop()
            if not isinstance(v, Variable) or id(v) in seen:
                continue
            seen.add(id(v))
            if id(v) in pos:
                hit.add(pos[id(v)])
                continue
            f = v.creator
            if f is not None and id(f) not in seen:
                seen.add(id(f))
                todo.extend(f.inputs)
        out.append(frozenset(hit))
    return tuple(out)


def _spec(g):
    from tracejit.core import ShapeDtype
    a = np.asarray(getattr(g, "data", g))
    return ShapeDtype(a.shape, a.dtype)


def _vjp(low, inst, primals, cts):
    """The gradients of sum(<low(primals)_i, cts_i>) with respect to primals, by
    eager backprop (with a history if backprop is enabled)."""
    from tracejit.core import DictGrads, _state, as_variable, backprop, using_config
    create = _state.enable_backprop
    # primals are leaves already (a forward's Variables of its arrays, or the leaves
    # of the _vjp one level up): kept, so a nested level's result has its history.
    leaves = list(primals)
    with using_config("enable_backprop", True):
        outs = [g for g in low.grads(inst, leaves) if g is not None]
    store = DictGrads()
    roots = []
    for y, ct in zip(outs, cts):
        y = as_variable(y)
        old = store.get(y)
        store.set(y, ct if old is None else old + ct)
        if y.creator is not None and all(r is not y for r in roots):
            roots.append(y)
    if roots:
        backprop(roots, create_graph=create, grads=store)
    return [store.get(leaf) for leaf in leaves]


def split_assign_index(key):
    """An item assignment's key as (template, index arrays): GetItem's template (slices
    as _Slice, ints, None, Ellipsis), each index array or mask an _ArrayIndex of its
    position among the arrays. A mask's count is not part of it: an assignment's shape
    is the target's, whatever the count (NumPy raises where a value does not fit)."""
    from tracejit.ops.arrayops import _split_index
    return _split_index(key, count_masks=False)


class AssignItem(Function):
    """`a[key] = value` on traced data, as a value: a copy of a with the assignment done
    by NumPy itself (its broadcasting, casting and errors). key: split_assign_index's
    template; the index arrays are inputs after a and value. The tracer writes the
    result into a's buffer as it writes an in-place ufunc's (record._write_into)."""

    kind = OPAQUE
    params = ("key",)

    def __init__(self, key):
        self.key = key

    def forward(self, a, value, *indices):
        from tracejit.ops.arrayops import _join_index
        out = np.array(a, copy=True)
        out[_join_index(self.key, indices)] = value
        return out

    def shape_rule(self, a, value, *indices):
        return ShapeDtype(a.shape, a.dtype)

    def to_onnx(self, b, node):
        # `a[key] = value` as ONNX: a boolean mask over all of a's axes with a value of
        # one element is Where(mask, value, a); otherwise the flat positions a[key]
        # selects (a Range of a's size read at [key], as GetItemGrad's export finds
        # them) get the value broadcast to a[key]'s shape. Index arrays may repeat a
        # position (data, unknown here): NumPy's last write wins, ScatterElements
        # leaves repeats undefined, so with index arrays the last writer of each
        # position is found first (a scatter-max of the writes' order, opset 18) and
        # the result reads each written position from its last write.
        import types

        from tracejit.ops.arrayops import _ArrayIndex, _onnx_index
        a, value, indices = node.inputs[0], node.inputs[1], node.inputs[2:]
        key = b.params(node)[0]
        dtype = node.out.dtype
        av, val = b.x(node, 0), b.x(node, 1, dtype)
        if (len(key) == 1 and isinstance(key[0], _ArrayIndex) and len(indices) == 1
                and indices[0].dtype == np.bool_ and b.dims(indices[0]) == b.dims(a)
                and int(np.prod(value.shape, dtype=np.int64)) == 1):
            one = b.op("Reshape", [val, b.ints([])]) if value.shape else val
            b.bind(node, b.op("Where", [b.x(node, 2), one, av]))
            return
        if any(v.dtype == np.bool_ for v in indices):
            raise b.unsupported(node, "a boolean mask index with a value of more than one "
                                      "element, or not over all axes (the positions it "
                                      "selects depend on the data)")
        repeats = any(isinstance(k, _ArrayIndex) for k in key)
        if repeats and b.opset < 18:
            raise b.unsupported(node, f"an assignment through index arrays needs opset "
                                      f">= 18 (ScatterElements' reduction 'max': the "
                                      f"last of repeated positions wins, as in NumPy), "
                                      f"this export is opset {b.opset}")
        shape = b.shape(b.dims(a))
        count = b.op("ReduceProd", [shape], keepdims=0)
        pos = b.op("Range", [b.const(np.array(0, np.int64)), count,
                             b.const(np.array(1, np.int64))])
        pos = b.op("Reshape", [pos, shape])
        # (_onnx_index reads index array k as input 1 + k: a stand-in for the node
        # with a's positions and the index arrays as its inputs; ops cannot import
        # the IR's Node, a stage above them.)
        shim = types.SimpleNamespace(inputs=[a] + list(indices), outputs=node.outputs,
                                     name=node.name, line=node.line)
        where = _onnx_index(b, shim, pos, key, len(a.shape))
        flat = b.ints([-1])
        updates = b.op("Reshape", [b.op("Expand", [val, b.op("Shape", [where])]), flat])
        a_flat, where = b.op("Reshape", [av, flat]), b.op("Reshape", [where, flat])
        if not repeats:
            out = b.op("ScatterElements", [a_flat, where, updates], axis=0)
        else:
            zero, one = b.const(np.array(0, np.int64)), b.const(np.array(1, np.int64))
            m = b.op("ReduceProd", [b.op("Shape", [where])], keepdims=0)
            order = b.op("Range", [zero, m, one])
            none = b.op("Expand", [b.const(np.array(-1, np.int64)),
                                   b.op("Shape", [a_flat])])
            last = b.op("ScatterElements", [none, where, order], axis=0, reduction="max")
            # (one element more, so that reading at 0 is in range when nothing is
            # written: Where then takes a's element)
            padded = b.op("Concat", [updates, b.op("Slice", [a_flat, b.ints([0]),
                                                             b.ints([1])])], axis=0)
            out = b.op("Where", [b.op("GreaterOrEqual", [last, zero]),
                                 b.op("Gather", [padded, b.op("Max", [last, zero])],
                                      axis=0),
                                 a_flat])
        b.bind(node, b.op("Reshape", [out, shape]))
