"""Autodiff beyond the eager backward: functional transforms (grad, value_and_grad,
usable eagerly and under jit), eval_shape, and the backward of a traced region
(trace_backward: the eager backward, traced, split from the forward; tracejit.remat
chooses which forward values it recomputes rather than saves).

grad collects gradients aside (DictGrads) instead of in `.grad`, so transforming a
function never touches the `.grad` of captured Parameters. The backward is built with
create_graph, so grad(grad(f)) works, and under jit the whole thing is one trace.
"""
import numpy as np

from tracejit import core, passes, remat
from tracejit.core import DictGrads, ShapeDtype, Variable, backprop
from tracejit.ir import Graph, Value
from tracejit.pytree import VAR
from tracejit.trace_ops import GUARD


def _as_diff_variable(x):
    tr = core.active_trace()
    if isinstance(x, Variable):
        return Variable(x.data)   # a fresh leaf: the user's Variable keeps its .grad
    if isinstance(x, core.ScalarTracer):
        if tr is not None and x._trace is tr:
            # A float argument (or a number computed from traced data) under jit: a
            # traced 0-d float64 leaf, as eager makes Variable(np.asarray(x, float64)).
            return tr.scalar_var(x)
        x = x._value        # left over from another trace: the number it is
    if isinstance(x, (float, int, np.generic)):
        return Variable(np.asarray(x, dtype=np.result_type(x, np.float64)))
    if isinstance(x, np.ndarray):
        return Variable(x)
    raise TypeError(f"grad: cannot differentiate with respect to a {type(x).__name__}")


def value_and_grad(fn, argnums=0):
    """f -> (x... -> (f(x...), df/dx[argnums])); f must return a scalar Variable."""
    single = isinstance(argnums, int)
    nums = (argnums,) if single else tuple(argnums)

    def value_and_grad_fn(*args, **kwargs):
        args = list(args)
        for i in nums:
            if i >= len(args):
                raise TypeError(f"grad: argnums {i} but the function got {len(args)} "
                                f"positional arguments")
        xs = [_as_diff_variable(args[i]) for i in nums]
        for i, x in zip(nums, xs):
            args[i] = x
        f = fn
        if core.active_trace() is not None:
            # Under jit: float()/int() in the differentiated function's own code give
            # traced numbers, as in a jitted function's (one guard per outcome).
            from tracejit.tracing import symbolic_scalars
            f = symbolic_scalars(fn)
        with core.using_config("enable_backprop", True):
            y = f(*args, **kwargs)
        if not isinstance(y, Variable):
            raise TypeError(f"grad: the function must return a Variable, got "
                            f"{type(y).__name__}")
        if y.size != 1:
            raise ValueError(f"grad: the function must return a scalar, got shape {y.shape}")
        grads = DictGrads()
        grads.set(y, Variable(np.ones(y.shape, y.dtype)))
        backprop([y], create_graph=core.Config.enable_backprop, grads=grads)
        gs = []
        for x in xs:
            g = grads.get(x)
            gs.append(g if g is not None else Variable(np.zeros(x.shape, x.dtype)))
        return y, (gs[0] if single else tuple(gs))

    value_and_grad_fn.__name__ = f"value_and_grad_{getattr(fn, '__name__', 'f')}"
    value_and_grad_fn._tracejit_wrapper = True     # pystate: look through to fn
    return value_and_grad_fn


def grad(fn, argnums=0):
    vg = value_and_grad(fn, argnums)

    def grad_fn(*args, **kwargs):
        return vg(*args, **kwargs)[1]

    grad_fn.__name__ = f"grad_{getattr(fn, '__name__', 'f')}"
    grad_fn._tracejit_wrapper = True
    return grad_fn


class _AbstractTrace:
    """Runs a function on shapes alone: each primitive applies its shape rule."""

    abstract = True

    def backward_of(self, fn):
        pass

    def input_grads(self, fn, gys):
        return core._input_grads(fn, gys)

    def call(self, fn, inputs):
        from tracejit.tracing import user_line
        specs = [ShapeDtype(x._data.shape, x._data.dtype) for x in inputs]
        try:
            out = fn.shape_rule(*specs)
        except (ValueError, TypeError, IndexError) as e:
            raise type(e)(f"{e} (at {user_line(3)})") from None
        outs = out if isinstance(out, tuple) else (out,)
        ys = [Variable(_placeholder(s)) for s in outs]
        return ys if len(ys) > 1 else ys[0]

    def new_variable(self, var, data):
        var._data = data.view(np.ndarray) if isinstance(data, _ShapeOnly) else data

    def read_data(self, var):
        # Shapes pass through (Variable(x.data), x.data.shape); a value does not.
        return var._data.view(_ShapeOnly)

    def write_data(self, var, value):
        return value

    def read_grad(self, var):
        return var._grad

    def write_grad(self, var, value):
        pass

    def literal(self, var, value):
        pass


class _ShapeOnly(np.ndarray):
    """`.data` under eval_shape: it has a shape and dtype, and no value to look at."""

    def _no_value(self, *args):
        from tracejit.tracing import user_line
        raise TypeError(f"eval_shape: the function looks at values at {user_line(2)}; "
                        f"only shapes and dtypes are known")

    __bool__ = __float__ = __int__ = __index__ = item = tolist = _no_value


def _placeholder(spec):
    # A zero-stride view: shape and dtype without allocating the array.
    return np.broadcast_to(np.zeros((), spec.dtype), spec.shape)


def eval_shape(fn, *args, **kwargs):
    """Output ShapeDtype(s) of fn for ShapeDtype (or array) arguments, from shape rules."""
    def conv(a):
        if isinstance(a, ShapeDtype):
            return Variable(_placeholder(a))
        return a

    args = [conv(a) for a in args]
    kwargs = {k: conv(v) for k, v in kwargs.items()}
    prev = core.set_trace(_AbstractTrace())
    try:
        with core.no_grad():
            out = fn(*args, **kwargs)
    finally:
        core.set_trace(prev)
    return _specs(out)


def _specs(out):
    if isinstance(out, Variable):
        return ShapeDtype(out._data.shape, out._data.dtype)
    if isinstance(out, np.ndarray):
        return ShapeDtype(out.shape, out.dtype)
    if isinstance(out, (tuple, list)):
        return type(out)(_specs(o) for o in out)
    if isinstance(out, dict):
        return {k: _specs(v) for k, v in out.items()}
    return out


def trace_backward(tr, out_raw, out_leaves):
    """Trace the eager backward over the traced forward: the backward graph."""
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
    outs = [x for x in out_raw if isinstance(x, Variable)]
    roots = [y for y in outs if y.creator is not None and y.creator in tr.functions
             and y.dtype.kind in "fc"]
    if not boundary or not roots:
        return None, []
    g = tr.graph
    n_nodes = len(g.nodes)
    n_inputs = len(g.inputs)
    grads = DictGrads()
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
        return "escape", []
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
    recompute = recompute_rule(g.nodes[:n_nodes], needed, mutated | live)
    recomputed = {}

    def need(v):
        if not isinstance(v, Value) or id(v) in defined or id(v) in seen:
            return
        seen.add(id(v))
        node = recompute.get(id(v))
        if node is not None:
            # Cheaper to recompute in the backward kernel than to store and reload.
            recomputed[node[0]] = node[1]
            for u in node[1].inputs:
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
    bwd_nodes = [recomputed[i] for i in sorted(recomputed)] + bwd_nodes
    slot, grad_slots = 0, []
    for v in grad_values:
        if v is None:
            grad_slots.append(None)
        else:
            grad_slots.append(slot)
            slot += 1
    bgraph = Graph(g.name + "_backward", bwd_inputs, bwd_nodes, outs_b,
                   [v.name for v in bwd_inputs])
    # The joint graph (for create_graph): all inputs, all nodes.
    joint = Graph(g.name + "_joint", g.inputs, g.nodes,
                  outs_b, g.input_names)
    pos = {id(v): i for i, v in enumerate(g.inputs)}
    joint_diff = []
    for src, var in boundary:
        val = tr.arg_vars[id(var)][1] if src[0] == "arg" else tr.captured_vars[id(var)][1]
        joint_diff.append(pos[id(val)])
    joint_gy = {pos[id(v)]: gy_values[id(v)] for v in g.inputs if id(v) in gy_values}
    recomputed_bytes = sum(v.nbytes for n in recomputed.values() for v in n.outputs)
    info = dict(graph=bgraph, sources=sources, grad_slots=grad_slots, saved=saved,
                saved_bytes=sum(v.nbytes for v in saved), recomputed_bytes=recomputed_bytes,
                joint=joint, joint_diff_inputs=joint_diff, joint_gy_inputs=joint_gy,
                joint_grad_slots=grad_slots)
    info["joint_captures"] = {pos[id(v)]: cap_source[id(v)] for v in g.inputs
                              if id(v) in new_caps}
    # A create_graph replay recomputes the forward with NumPy from the inputs as they
    # are at backward time: right for values computed from inputs nothing changes (as
    # eager computed them, bit for bit), wrong for those computed from an input the call
    # updates in place or live captured state, which may have changed since. Those the
    # backward reads were saved (remat never recomputes them): the replay takes them
    # from the call. Only those: a saved value next to a NumPy-recomputed one could
    # differ by rounding, and a max's mask (x == max) would then lose its gradient.
    tainted = set(mutated | live)
    for n in g.nodes[:n_nodes]:
        if any(isinstance(u, Value) and id(u) in tainted for u in n.inputs):
            tainted.update(id(o) for o in n.outputs)
    info["replay_saved"] = [k for k, v in enumerate(saved) if id(v) in tainted]
    info["grad_dtypes"] = _grad_dtypes(tr, roots, out_index, boundary)
    info["joint_meta"] = tr.grad_meta
    info["replay_refusal"] = tr.replay_refusal
    # The trace's own Variables at the boundary (a .grad source names its owner).
    info["diff_traced"] = [var for _, var in boundary]
    return info, diff_sources


def _grad_dtypes(tr, roots, out_index, boundary):
    """Per output k (the gys' numbering), per boundary Variable: the dtype of the
    gradient eager's backward from that output alone gives it (None: none). A backward
    from some of the outputs gets eager's dtype from these: the compiled backward also
    adds the others' zero contributions, whose dtype may promote (a float32 input
    reached through float64 from one output and float32 from another). None when every
    output gives every input the same dtype (the common case costs nothing)."""
    if len(roots) < 2:
        return None
    table = {}
    prev = core.set_trace(None)       # eager, unrecorded: only the dtypes are wanted
    try:
        with core.no_grad():
            for y in roots:
                grads = DictGrads()
                grads.set(y, Variable(np.ones_like(y._data)))
                backprop([y], grads=grads, within=tr.functions)
                table[out_index[id(y)]] = [None if grads.get(var) is None else
                                           grads.get(var).dtype for _, var in boundary]
    finally:
        core.set_trace(prev)
    for j in range(len(boundary)):
        if len({row[j] for row in table.values() if row[j] is not None}) > 1:
            return table
    return None


def mutated_inputs(tr):
    """ids of the graph inputs whose objects the trace updates in place."""
    targets = {id(obj) for _, obj, _ in tr.effects}
    out = {id(v) for v, (_, obj) in tr.captures if id(obj) in targets}
    by_leaf = dict(tr.arg_inputs)
    out |= {id(by_leaf[leaf]) for obj_id, leaf in tr.arg_leaf.items()
            if obj_id in targets and leaf in by_leaf}
    return out


def recompute_rule(fwd_nodes, needed, mutated=frozenset()):
    """id(value) -> (index, node) for forward values the backward recomputes.

    The minimum cut of tracejit.remat: of the values the backward reads (`needed`),
    the forward saves the fewest bytes it can, and the backward recomputes the rest
    from those and from the call's inputs. Reductions, matmuls, random draws, opaque
    nodes, costly elementwise math and values computed from inputs the call mutates
    are never recomputed; on a graph of 0-d values everything else is (the cost is the
    call, not the memory).
    """
    return remat.partition(fwd_nodes, needed, mutated).recompute_map()

