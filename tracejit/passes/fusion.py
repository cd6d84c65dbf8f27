"""Fusion, Graph -> Graph: `fuse` groups nodes into `Fused` nodes, one per kernel the
code generator emits: elementwise DAGs over one iteration shape (operands may
broadcast), the reductions that consume them (sum((a - b) ** 2) in one pass), 0-d
epilogues after a full reduction (mean = sum / n), and movement ops that read a group
input (broadcast_to, transpose, reshape that only adds or drops size-1 axes, basic
indexing x[1:, 0, None, ..., ::-2] and its gradient, a masked read) folded into index
arithmetic. What each op allows is its facets (ops/primitive.py). After the greedy
walk, an elementwise cone read only by one other group moves into it
(_sink_into_reader), so it is not written to an array and read back; and a part of a
group that reads a computed array of exactly one other group moves into that group
(_join_operand_group: W7's per-step loss gradients, each into its step's loss kernel).
"""
import numpy as np

from tracejit.core import ELEMENTWISE, MOVEMENT, OPAQUE, RANDOM, REDUCTION, Function
from tracejit.ir import Graph, Node, Value
from tracejit.ops.primitive import KERNEL_FLOATS, Primitive
from tracejit.ops.trace_only import GUARD

FUSED = "fused"
# Kinds whose nodes have effects or draw: kept, never merged, kept in order.
_IMPURE = (GUARD, RANDOM, OPAQUE)
# Dtypes a fused kernel reads / writes (bool only from comparisons, where, cast).
_IN_DTYPES = frozenset(np.dtype(d) for d in ("f4", "f8", "b1", "i4", "i8"))
_FLOAT = KERNEL_FLOATS


# What one kernel may contain. numba + LLVM compile time grows faster than linearly in
# a kernel's size: a chain of n transcendental ops (each an inlined vecmath function,
# fused with a multiply) compiled in 0.6 s (n = 8), 1.3 s (16), 2.7 s (32), 6.2 s (64)
# and 41 s (128) on the 2-core project machine (benchmarks/bench_compile_bound.py).
# Past MAX_VECMATH_OPS a group closes and the chain continues in a new kernel, so a
# long chain costs a sum of small compiles (128 ops: ~8 s) instead of one that looks
# hung; a kernel of 16 still amortizes the memory traffic. MAX_GROUP_OPS bounds the
# cheap ops (numba's typing and SSA passes grow with the kernel's length too).
MAX_VECMATH_OPS = 16
MAX_GROUP_OPS = 256


def _cost(n):
    """(vecmath calls, ops) node n adds to a group's kernel (its op's vector_math)."""
    return (1 if n.fn.vector_math else 0), 1


# ---------------------------------------------------------------- the Fused op

class Fused(Function):
    """A fused group: a subgraph the code generator turns into one kernel.

    `graph` holds the member nodes (the same Node and Value objects as the outer
    graph had); `shape` is the iteration shape. Its forward runs the subgraph with
    the interpret backend, so a fused graph still runs everywhere.
    """

    kind = FUSED
    params = ("label",)

    def __init__(self, graph, shape):
        self.graph = graph
        self.shape = tuple(shape)
        self.label = "_".join(_dedup(n.name for n in graph.nodes))[:60]
        self._run = None

    def forward(self, *xs):
        if self._run is None:
            from tracejit.ir import interpret
            self._run = interpret.compile(self.graph)
        ys = self._run(list(xs))
        return tuple(ys) if len(ys) > 1 else ys[0]


def _dedup(names):
    out = []
    for x in names:
        if x not in out:
            out.append(x)
    return out


# ---------------------------------------------------------------- fusion

# What a kernel may compute is asked of the op (its facets, ops/primitive.py). Only a
# Primitive declares them: a user Function of a primitive kind stays a NumPy call.

def _fusable_elementwise(n):
    if n.kind != ELEMENTWISE or n.fn.expr is None or len(n.outputs) != 1 \
            or not isinstance(n.fn, Primitive):
        return False
    if any(v.dtype not in _IN_DTYPES for v in n.inputs):     # Values and literals
        return False
    return n.fn.fuses_for([v.dtype for v in n.inputs], n.out.dtype)


def _fusable_reduction(n):
    return (n.kind == REDUCTION and isinstance(n.fn, Primitive)
            and n.fn.reduction_combine is not None
            and len(n.inputs) == 1 and isinstance(n.inputs[0], Value)
            and n.inputs[0].dtype in _FLOAT and n.out.dtype == n.inputs[0].dtype)


def _index_movement(n):
    """Movement ops that are pure index arithmetic on one input."""
    if n.kind != MOVEMENT or len(n.inputs) != 1 or not isinstance(n.inputs[0], Value):
        return False
    if n.inputs[0].dtype not in _IN_DTYPES:
        return False
    return isinstance(n.fn, Primitive) and n.fn.index_foldable(n)


class _Group:
    __slots__ = ("gid", "shape", "nodes", "values", "role", "first", "vecmath", "ops")

    def __init__(self, gid, shape, first):
        self.gid = gid
        self.shape = shape
        self.nodes = []
        self.values = {}      # id(value) -> role: "main" | "load" | "red" | "epi"
        self.first = first
        self.vecmath = 0      # kernel size, bounded by MAX_VECMATH_OPS / MAX_GROUP_OPS
        self.ops = 0


def fuse(g, horizontal=True):
    """Group fusable nodes into Fused nodes (one kernel each); see the module docstring.

    Greedy, in topological order. A node joins one existing group (the group of one
    of its inputs, else, with `horizontal`, any open group of the same iteration
    shape) if that creates no cycle: `deps[v]` is the bitset of groups value v
    depends on, through any path, including the order edges that chain impure nodes.
    """
    deps = {}                 # id(value) -> bitset of group ids
    group_of = {}             # id(value) -> _Group producing it
    groups = []
    # What each group depends on. A value that depends on group G also depends on
    # everything G absorbs later, so cycle checks use the closure over these.
    gdeps = []

    def closure(bits):
        seen = frontier = bits
        while frontier:
            new = 0
            b = frontier
            while b:
                low = b & -b
                new |= gdeps[low.bit_length() - 1]
                b ^= low
            frontier = new & ~seen
            seen |= frontier
        return seen
    by_shape = {}             # iteration shape -> open groups (horizontal candidates)
    effect_dep = 0            # deps of the last impure node (order edges)
    placement = []            # (node or group, first position)

    def input_deps(n):
        d = 0
        for v in n.inputs:
            if isinstance(v, Value):
                d |= deps.get(id(v), 0)
        return d

    def can_join(grp, n, role):
        bit = 1 << grp.gid
        vm, ops = _cost(n)
        if grp.vecmath + vm > MAX_VECMATH_OPS or grp.ops + ops > MAX_GROUP_OPS:
            return False
        for v in n.inputs:
            if not isinstance(v, Value):
                continue
            r = grp.values.get(id(v))
            if r is not None:
                if role == "load":
                    return False
                if role == "main" and r not in ("main", "load"):
                    return False
                if role == "red" and r != "main" and r != "load":
                    return False
                if role == "epi" and r not in ("red", "epi"):
                    return False
                continue
            if closure(deps.get(id(v), 0)) & bit:
                return False
            if role == "load":
                continue
            if role == "epi" and v.shape != ():
                return False
        return True

    def add(grp, n, role, d):
        gdeps[grp.gid] |= d & ~(1 << grp.gid)
        grp.nodes.append(n)
        vm, ops = _cost(n)
        grp.vecmath += vm
        grp.ops += ops
        for v in n.outputs:
            grp.values[id(v)] = role
            group_of[id(v)] = grp
            deps[id(v)] = d | (1 << grp.gid)

    def new_group(shape, n, role, d, pos):
        grp = _Group(len(groups), shape, pos)
        groups.append(grp)
        gdeps.append(0)
        placement.append((grp, pos))
        by_shape.setdefault(shape, []).append(grp)
        add(grp, n, role, d)

    for pos, n in enumerate(g.nodes):
        d = input_deps(n)
        if n.kind in _IMPURE:
            d |= effect_dep
            effect_dep = d
            for v in n.outputs:
                deps[id(v)] = d
            placement.append((n, pos))
            continue
        if _fusable_elementwise(n):
            role = "main"
        elif _index_movement(n):
            role = "load"
        elif _fusable_reduction(n):
            role = "red"
        else:
            role = None
        if role is None:
            for v in n.outputs:
                deps[id(v)] = d
            placement.append((n, pos))
            continue
        if role == "red" and n.inputs[0].shape == ():
            role = "main"         # a reduction of one element is the element itself
        shape = n.inputs[0].shape if role == "red" else n.out.shape
        cands = []
        for v in n.inputs:
            grp = group_of.get(id(v)) if isinstance(v, Value) else None
            if grp is not None and grp not in cands:
                cands.append(grp)
        joined = False
        for grp in cands:
            r = "epi" if (role == "main" and grp.shape != shape and shape == ()) else role
            if grp.shape != shape and r != "epi":
                continue
            if r == "load" and any(grp.values.get(id(v)) for v in n.inputs
                                   if isinstance(v, Value)):
                continue          # a load reads group inputs only
            if can_join(grp, n, r):
                add(grp, n, r, d)
                joined = True
                break
        if not joined and horizontal:
            for grp in reversed(by_shape.get(shape, ())):
                if can_join(grp, n, role):
                    add(grp, n, role, d)
                    joined = True
                    break
        if not joined:
            new_group(shape, n, role, d, pos)

    if SINK_INTO_READER:
        _sink_into_reader(g, groups, group_of, deps, closure, gdeps)
    if JOIN_OPERAND_GROUP:
        _join_operand_group(g, groups, group_of, deps, closure, gdeps, placement)
    _absorb_loads(g, groups, group_of, deps, closure, gdeps)
    readers = _readers(g)
    _detach_escaping_loads(groups, group_of, readers, placement)
    fused_nodes = {grp.gid: _make_fused_node(g, grp, readers) for grp in groups if grp.nodes}
    items = []
    for obj, pos in placement:
        if not isinstance(obj, _Group):
            items.append((pos, obj))
        elif not obj.nodes:
            continue
        elif fused_nodes[obj.gid] is not None:
            items.append((pos, fused_nodes[obj.gid]))
        else:                     # a lone movement op: a NumPy call, as before
            items.extend((pos, n) for n in obj.nodes)
    return g.replace(nodes=_schedule(items))


# Module flag (benchmarks toggle it for an interleaved A/B in one process).
SINK_INTO_READER = True


def _sink_into_reader(g, groups, group_of, deps, closure, gdeps):
    """Move an elementwise cone into the one group that reads it.

    The greedy walk puts a node into the group of one of its inputs, or horizontally
    into any open group of its shape; neither need be the group that reads it. Then
    the node's value is an output of its group, written to an array, and read back by
    its reader's kernel. W7's window (an unrolled LSTM's forward and backward): the
    backward's dy @ W_fc.T (a (30, 1) x (1, 100) product of contraction 1, an
    elementwise mul) joined the previous step's backward group horizontally, so
    split_group ran it as a kernel of its own each step; the forward cell computed
    1 - tanh(c) ** 2 and 1 - sigmoid(.) for the backward, five arrays a step that only
    the step's backward kernel reads. Moved into that reader they are computed in its
    loop from values it reads anyway.

    A cone, per source group G and target T: the nodes of G (elementwise, or index
    loads) every reader of which is in T or in the cone, none a graph output (a
    value the caller or a separate backward graph reads, the values saved for it
    included, stays materialized). It moves when it is legal as can_join would
    judge it node by node (roles: a main node reads main or load values of T, a
    load reads no value of T; T's readers of the cone are main or reduction nodes, not
    loads or 0-d epilogues; a main node's shape is T's iteration shape, so nothing is
    computed at a larger shape than before (a (30, 1) value read broadcast by a
    (30, 100) group stays where it is); no cycle; T's size bounds), and when it saves
    memory traffic: the bytes T read of the cone and G wrote, against those G would
    newly write (values of G the cone reads, internal before) and T newly read. Nothing
    is computed twice: the cone leaves G. The exception is split_group's
    loop-invariant chains (nodes reading only 0-d values), copied into each part of a
    group that reads them: a cone with such a node that is not cheap_to_recompute
    (vector math) stays.
    """
    users, out_ids = _users(g)
    pos = {id(n): i for i, n in enumerate(g.nodes)}
    reads = {}

    def grp_of_node(n):
        return group_of.get(id(n.outputs[0])) if n.outputs else None

    def movable(n, role):
        # Reductions and 0-d epilogues stay: their loops are their group's.
        return role in ("main", "load") and len(n.outputs) == 1

    # Consumers first; then again over the groups holding what the moved cones read
    # (a moved cone may free its producers' cones), a few rounds at most.
    todo = list(reversed(groups))
    for _ in range(4):
        again = {}
        for grp in todo:
            if not grp.nodes:
                continue
            # target[id(node)]: the one group the node's readers are in (through cone
            # members), consumers first.
            target = {}
            members = {id(m) for m in grp.nodes}
            for n in reversed(grp.nodes):
                role = grp.values.get(id(n.out)) if len(n.outputs) == 1 else None
                if not movable(n, role) or id(n.out) in out_ids:
                    continue
                t = None
                ok = bool(users.get(id(n.out)))
                for r in users.get(id(n.out), ()):
                    if id(r) in members:
                        rt = target.get(id(r))
                    else:
                        rt = grp_of_node(r)
                        if rt is grp:
                            rt = None
                    if rt is None or (t is not None and rt is not t):
                        ok = False
                        break
                    t = rt
                if ok:
                    target[id(n)] = t
            cones = {}
            for n in grp.nodes:
                t = target.get(id(n))
                if t is not None:
                    cones.setdefault(t.gid, (t, []))[1].append(n)
            for t, cone in cones.values():
                for part in _components(cone):
                    if _try_sink(grp, t, part, users, out_ids, deps, closure, gdeps,
                                 group_of, pos, reads):
                        for n in part:
                            for v in n.inputs:
                                src = group_of.get(id(v)) if isinstance(v, Value) else None
                                if src is not None and src is not t:
                                    again[src.gid] = src
        if not again:
            break
        todo = sorted(again.values(), key=lambda x: -x.gid)


# Module flag (benchmarks/ab_w7_dy.py toggles it for an interleaved A/B in one process).
JOIN_OPERAND_GROUP = True


def _join_operand_group(g, groups, group_of, deps, closure, gdeps, placement):
    """Move a part of a group into the group that computes the array it reads.

    W7's window (an unrolled LSTM's forward and backward): the backward's seed is a
    0-d value broadcast to the loss's (30, 1) shape (reshape, broadcast_to: loads).
    The broadcast_to had no group of its input's shape, so the greedy walk put it into
    the open group of its shape, the last step's loss group; then each step's loss
    gradient dy_k = seed * (2 / n * diff_k) joined the group of its first operand, that
    one, as did its sum_to (the bias's gradient): step k's own loss group, which
    computes 2 / n * diff_k, would read the broadcast of the last group, a cycle (the
    last group depends on step k's through the loss's sum). split_group then ran each
    step's dy_k and sum_to as a kernel of its own (29 kernel calls), and 2 / n * diff_k
    was written to an array and read back.

    Per group t: its parts (weakly connected, as split_group cuts them), t's loads of a
    size-1 value (a broadcast scalar: split_group copies them into each part) left out.
    A part that reads a computed (main) array of t's shape of exactly one other group G
    moves into G when that is legal as can_join would judge it node by node (the roles
    of what each node reads in G and of G's readers of the part, an epilogue reading
    only 0-d values from outside; the size bounds; no cycle, the broadcast scalar then a
    NumPy view outside both groups) and saves memory traffic (the bytes G wrote and t
    read against those G newly reads), as _sink_into_reader judges it.
    """
    users, out_ids = _users(g)
    pos = {id(n): i for i, n in enumerate(g.nodes)}
    ok_read = {"main": ("main", "load"), "red": ("main", "load"), "epi": ("red", "epi")}
    for t in list(reversed(groups)):      # (detached loads append groups)
        if len(t.nodes) < 2:
            continue
        inv = {}                          # id(load node) -> its input deps, detached
        for n in t.nodes:
            if (t.values.get(id(n.out)) == "load" and len(n.outputs) == 1
                    and id(n.out) not in out_ids
                    and all(v.size == 1 and id(v) not in t.values
                            for v in n.inputs if isinstance(v, Value))):
                d = 0
                for v in n.inputs:
                    if isinstance(v, Value):
                        d |= deps.get(id(v), 0)
                inv[id(n)] = d
        inv_out = {id(n.out): inv[id(n)] for n in t.nodes if id(n) in inv}
        rest = [n for n in t.nodes if id(n) not in inv]
        parts = _components(rest)
        if len(parts) < 2 and not inv:
            continue
        detach = set()                    # inv loads a moved part reads
        for part in parts:
            moved_ids = _move_part(t, part, inv_out, users, out_ids, deps, closure, gdeps,
                                   group_of, pos, ok_read)
            if moved_ids is not None:
                detach |= moved_ids
        for n in [m for m in t.nodes if id(m) in detach]:
            # A broadcast scalar read by a moved part: its own lone movement group (a
            # NumPy view), so G does not depend on t; t reads it as an input.
            grp = _detach_load(n, t, groups, group_of, placement, pos[id(n)])
            gdeps.append(inv[id(n)])
            deps[id(n.out)] = inv[id(n)] | (1 << grp.gid)
            # Its readers (t, the groups the parts moved into) depend on the new group
            # (and so on a group _absorb_loads may move it into).
            for u in users.get(id(n.out), ()):
                r = group_of.get(id(u.outputs[0])) if u.outputs else None
                if r is not None and r is not grp:
                    gdeps[r.gid] |= 1 << grp.gid


def _move_part(t, part, inv_out, users, out_ids, deps, closure, gdeps, group_of, pos,
               ok_read):
    """_join_operand_group's move of one part of t; the ids of the load nodes of t it
    reads that must leave t (inv_out: their values -> their input deps), None if the
    part stays."""
    in_part = {id(n.out) for n in part}
    part_ids = {id(n) for n in part}
    homes = []
    for n in part:
        for v in n.inputs:
            if not isinstance(v, Value) or id(v) in in_part or id(v) in inv_out:
                continue
            G = group_of.get(id(v))
            if (G is not None and G is not t and G.shape == t.shape and v.shape == t.shape
                    and G.values.get(id(v)) == "main" and G not in homes):
                homes.append(G)
    if len(homes) != 1:
        return None
    G = homes[0]
    bit = 1 << G.gid
    vm = sum(_cost(n)[0] for n in part)
    ops = sum(_cost(n)[1] for n in part)
    if G.vecmath + vm > MAX_VECMATH_OPS or G.ops + ops > MAX_GROUP_OPS:
        return None
    t_ids = {id(m) for m in t.nodes}
    g_ids = {id(m) for m in G.nodes}
    counted = set()
    g_reads = {id(v) for m in G.nodes for v in m.inputs if isinstance(v, Value)}
    d = 0
    saved = 0
    new_reads = {}
    detach = set()
    inv_node = {id(m.out): id(m) for m in t.nodes if id(m.out) in inv_out}
    for n in part:
        role = t.values[id(n.out)]
        if role == "load":
            return None                   # a load reads group inputs only: keep it simple
        for v in n.inputs:
            if not isinstance(v, Value) or id(v) in in_part:
                continue
            r = G.values.get(id(v))
            if r is not None:
                if r not in ok_read[role]:
                    return None
                if id(v) not in counted:
                    counted.add(id(v))
                    us = users.get(id(v), ())
                    if all(id(u) not in t_ids or id(u) in part_ids for u in us):
                        saved += v.nbytes         # t read it
                    if id(v) not in out_ids and all(id(u) in g_ids or id(u) in part_ids
                                                    for u in us):
                        saved += v.nbytes         # G wrote it (a graph output stays)
                continue
            if role == "epi" and v.shape != ():
                return None
            if id(v) in inv_out:
                d |= inv_out[id(v)]
                detach.add(inv_node[id(v)])
            else:
                d |= deps.get(id(v), 0)
            if id(v) not in g_reads:
                # A 0-d value is a scalar argument, a broadcast scalar a stride-0 view:
                # one element each, not an array's loop of reads.
                one = v.shape == () or id(v) in inv_out
                new_reads.setdefault(id(v), v.dtype.itemsize if one else v.nbytes)
        for u in users.get(id(n.out), ()):
            ru = G.values.get(id(u.outputs[0])) if u.outputs else None
            if ru is None:
                continue
            if ru not in ok_read or role not in ok_read[ru]:
                return None               # read by a load or epilogue of G
            if id(n.out) not in counted:
                counted.add(id(n.out))
                saved += n.out.nbytes     # G read it
                if id(n.out) not in out_ids and all(
                        id(u) in g_ids or id(u) in part_ids for u in users.get(id(n.out), ())):
                    saved += n.out.nbytes  # t wrote it
    if not sum(new_reads.values()) < saved:
        return None
    if closure(d) & bit:
        return None
    gdeps[G.gid] |= d & ~bit
    _move_nodes(part, t, G, group_of, deps, bit, pos)
    return detach


def _components(cone):
    """The cone's weakly connected parts (through the values one reads of another),
    each in the cone's order: each is judged on its own, so a part that saves traffic
    does not carry one that does not (W7: the backward's dy * W_fc, worth moving, and
    dc * f of the same group, which would only trade one array written for another,
    and make the first and last steps' kernels differ from the others)."""
    parent = {id(n): id(n) for n in cone}

    def find(i):
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i
    producer = {id(n.out): id(n) for n in cone}
    for n in cone:
        for v in n.inputs:
            if isinstance(v, Value) and id(v) in producer:
                parent[find(id(n))] = find(producer[id(v)])
    parts = {}
    for n in cone:
        parts.setdefault(find(id(n)), []).append(n)
    return list(parts.values())


def _try_sink(grp, t, cone, users, out_ids, deps, closure, gdeps, group_of, pos, reads):
    """Move `cone` (nodes of grp, in grp's order) into group t if legal and cheaper.
    reads: gid -> ids of the values a group's nodes read (a cache, kept up to date)."""
    if len(t.nodes) == 1 and t.nodes[0].kind == ELEMENTWISE and not t.nodes[0].fn.vector_math:
        # One cheap op may run as the NumPy call eager makes (backends/numba/plan.py,
        # _no_kernel): with the cone it would be a kernel, one more to compile (tanh's
        # gradient gy * (1 - y * y): the forward's tanh kernel writes 1 - y * y and a
        # NumPy multiply reads it, one kernel, against two).
        return False
    in_cone = {id(n.out) for n in cone}
    bit = 1 << t.gid
    vm = sum(_cost(n)[0] for n in cone)
    ops = sum(_cost(n)[1] for n in cone)
    if t.vecmath + vm > MAX_VECMATH_OPS or t.ops + ops > MAX_GROUP_OPS:
        return False
    invariant = set()
    saved = 0
    t_inputs = reads.get(t.gid)
    if t_inputs is None:
        t_inputs = reads[t.gid] = {id(v) for m in t.nodes for v in m.inputs
                                   if isinstance(v, Value)}
    new_reads = {}
    d = 0                                 # what the cone reads from outside t
    cone_ids = {id(n) for n in cone}
    grp_ids = {id(m) for m in grp.nodes}
    for n in cone:
        role = grp.values[id(n.out)]
        if role == "main" and n.out.shape != t.shape:
            return False
        if role == "load" and not _broadcasts_into(n.out.shape, t.shape):
            return False
        vals = [v for v in n.inputs if isinstance(v, Value)]
        if all(v.shape == () or id(v) in invariant for v in vals):
            invariant.add(id(n.out))
            if n.kind != MOVEMENT and not n.fn.cheap_to_recompute():
                return False
        for v in vals:
            if id(v) in in_cone:
                if role == "load":
                    return False          # a load reads group inputs only
                continue
            r = t.values.get(id(v))
            if r is not None:
                if role == "load" or r not in ("main", "load"):
                    return False
                continue
            d |= deps.get(id(v), 0)
            if grp.values.get(id(v)) is not None and id(v) not in out_ids and all(
                    id(u) in grp_ids for u in users.get(id(v), ())):
                new_reads[id(v)] = 2 * v.nbytes       # now written by grp, read by t
            elif id(v) not in t_inputs:
                new_reads.setdefault(id(v), v.nbytes)  # now read by t
        readers_in_t = [u for u in users.get(id(n.out), ()) if id(u) not in cone_ids]
        for u in readers_in_t:
            if t.values.get(id(u.outputs[0])) not in ("main", "red"):
                return False
        if readers_in_t:
            saved += 2 * n.out.nbytes             # grp wrote it, t read it
    if not sum(new_reads.values()) < saved:
        return False
    # t reads the cone's values, so it depends on all the cone reads already: no
    # cycle can arise. Checked all the same, once for the cone (the closure of the
    # union is the union of the closures), as can_join checks each node.
    if closure(d) & bit:
        return False
    # Legal and cheaper: move it. t's members stay in the graph's (topological) order.
    gdeps[t.gid] |= d & ~bit
    t_inputs.update(id(v) for n in cone for v in n.inputs if isinstance(v, Value))
    reads.pop(grp.gid, None)              # grp reads less now
    _move_nodes(cone, grp, t, group_of, deps, bit, pos)
    return True


def _broadcasts_into(shape, target):
    if len(shape) > len(target):
        return False
    lead = len(target) - len(shape)
    return all(d == 1 or d == target[k + lead] for k, d in enumerate(shape))


def _absorb_loads(g, groups, group_of, deps, closure, gdeps):
    """Move a lone movement op into the one group that reads it (index arithmetic).

    A reshape to (n, 1) or a transpose feeding a broadcasting add of another shape
    is not in that group's iteration shape, so the greedy walk left it alone. A
    movement op read only by movement ops of the group (x.T[1:]) joins as a link of
    their index chain.
    """
    users, out_ids = _users(g)
    # Consumers first: in x.T[1:] * y the slice joins the multiply's group, then the
    # transpose joins it as a link (the other way round both would stay a copy).
    for grp in reversed(groups):
        if len(grp.nodes) != 1 or grp.nodes[0].kind != MOVEMENT:
            continue
        n = grp.nodes[0]
        v = n.out
        readers = users.get(id(v), [])
        if id(v) in out_ids or not readers:
            continue
        targets = {id(group_of.get(id(r.outputs[0]))) if r.outputs else None for r in readers}
        target = group_of.get(id(readers[0].outputs[0])) if readers[0].outputs else None
        if target is None or target is grp or len(targets) != 1:
            continue
        if len(target.nodes) == 1 and target.nodes[0].kind == MOVEMENT:
            continue              # a lone movement op stays a NumPy call (a view)
        rroles = [target.values.get(id(r.outputs[0])) for r in readers]
        if not all(rr in ("main", "red", "load") for rr in rroles):
            continue
        src = n.inputs[0]
        if target.values.get(id(src)) or closure(deps.get(id(src), 0)) & (1 << target.gid):
            continue
        # Read by loads only (x.T[1:], x[:, 1:].T): a link of a chain of index
        # arithmetic, never read at the loop index itself, so any shape will do.
        if any(rr != "load" for rr in rroles) and not _broadcasts_into(v.shape, target.shape):
            continue
        grp.nodes = []
        # What depended on the emptied group now depends on the target, and the
        # target on what the moved node read.
        gdeps[grp.gid] |= 1 << target.gid
        gdeps[target.gid] |= deps.get(id(src), 0) & ~(1 << target.gid)
        target.nodes.insert(0, n)
        target.values[id(v)] = "load"
        group_of[id(v)] = target


def _detach_escaping_loads(groups, group_of, readers, placement):
    """Take out of its group a load of another shape than the group's that is read
    outside it (with the loads of its chain): it runs as a NumPy view, and the group
    reads that view as an input.

    A kernel writes each output at the loop index, so an output must have the
    group's iteration shape. A load of a size-1-axis value (W.T of a (1, 3) W read
    broadcast by a (3, 3) group) has not: it joins a group only while every reader
    is in the group (_sink_into_reader, _absorb_loads), but a later move can take a
    reader away (a node of the group sunk into a third group), and the load became
    an output: the (3, 3) loop wrote rows 1 and 2 of a (1, 3) array, past its end
    (heap corruption: fuzz program 9112). Checked once, here, after every move, so
    no move needs to keep it.
    """
    for grp in list(groups):
        if len(grp.nodes) < 2:
            continue
        members = {id(n) for n in grp.nodes}
        producer = {id(v): n for n in grp.nodes for v in n.outputs}
        out = set()
        for n in grp.nodes:
            if grp.values.get(id(n.out)) == "load" and n.out.shape != grp.shape \
                    and not readers.get(id(n.out), set()) <= members:
                # the load and the links of its index chain down to a group input
                m = n
                while m is not None and id(m) not in out:
                    out.add(id(m))
                    m = producer.get(id(m.inputs[0]))
        if not out:
            continue
        for n in [m for m in grp.nodes if id(m) in out]:
            _detach_load(n, grp, groups, group_of, placement, grp.first)


def _detach_load(n, grp, groups, group_of, placement, first):
    """Move load node n out of grp into a lone movement group of its own (a NumPy
    view), placed at position `first`; grp then reads its value as an input."""
    grp.nodes.remove(n)
    grp.values.pop(id(n.out))
    vm, ops = _cost(n)
    grp.vecmath -= vm
    grp.ops -= ops
    lone = _Group(len(groups), n.out.shape, first)
    groups.append(lone)
    lone.nodes.append(n)
    lone.vecmath, lone.ops = vm, ops
    lone.values[id(n.out)] = "load"
    group_of[id(n.out)] = lone
    placement.append((lone, first))
    return lone


def _schedule(items):
    """Topological order of (position, node) items, original order where possible.

    Impure nodes are chained in their original order (random draws and guards never
    swap); everything else moves only as far as its data dependencies require.
    """
    import heapq
    items = sorted(items, key=lambda it: it[0])
    item_of = {}
    for i, (_, node) in enumerate(items):
        for v in node.outputs:
            item_of[id(v)] = i
    succ = [[] for _ in items]
    indeg = [0] * len(items)
    last_impure = None
    for i, (_, node) in enumerate(items):
        preds = {item_of[id(v)] for v in node.inputs
                 if isinstance(v, Value) and id(v) in item_of}
        if node.kind in _IMPURE:
            if last_impure is not None:
                preds.add(last_impure)
            last_impure = i
        preds.discard(i)
        for p in preds:
            succ[p].append(i)
            indeg[i] += 1
    heap = [(items[i][0], i) for i in range(len(items)) if indeg[i] == 0]
    heapq.heapify(heap)
    out = []
    while heap:
        _, i = heapq.heappop(heap)
        out.append(items[i][1])
        for s in succ[i]:
            indeg[s] -= 1
            if indeg[s] == 0:
                heapq.heappush(heap, (items[s][0], s))
    if len(out) != len(items):
        raise AssertionError("fuse produced a cyclic schedule")
    return out


def _move_nodes(nodes, src, dst, group_of, deps, bit, pos):
    """Move `nodes` from group src to group dst (their roles, costs and dependency
    bit with them), dst's nodes kept in graph order."""
    ids = {id(n) for n in nodes}
    src.nodes = [m for m in src.nodes if id(m) not in ids]
    for n in nodes:
        role = src.values.pop(id(n.out))
        vm_n, ops_n = _cost(n)
        src.vecmath -= vm_n
        src.ops -= ops_n
        dst.vecmath += vm_n
        dst.ops += ops_n
        dst.values[id(n.out)] = role
        group_of[id(n.out)] = dst
        deps[id(n.out)] = deps.get(id(n.out), 0) | bit
    dst.nodes = sorted(dst.nodes + nodes, key=lambda m: pos[id(m)])


def _users(g):
    """id(value) -> the nodes of g reading it, in order; and the ids of g's outputs."""
    users = {}
    for n in g.nodes:
        for v in n.inputs:
            if isinstance(v, Value):
                users.setdefault(id(v), []).append(n)
    return users, {id(v) for v in g.outputs if isinstance(v, Value)}


def _readers(g):
    """id(value) -> ids of the nodes of g reading it; the graph's outputs read by None."""
    out = {}
    for n in g.nodes:
        for v in n.inputs:
            if isinstance(v, Value):
                out.setdefault(id(v), set()).add(id(n))
    for v in g.outputs:
        if isinstance(v, Value):
            out.setdefault(id(v), set()).add(None)
    return out


def _make_fused_node(g, grp, readers):
    """The Fused node of a group: inputs read from outside, outputs used outside
    (readers: _readers(g), built once: scanning the graph per group was quadratic,
    0.2 s of an LSTM window's 100 groups)."""
    if len(grp.nodes) == 1 and grp.nodes[0].kind == MOVEMENT:
        return None
    members = {id(v) for n in grp.nodes for v in n.outputs}
    inputs, seen = [], set()
    for n in grp.nodes:
        for v in n.inputs:
            if isinstance(v, Value) and id(v) not in members and id(v) not in seen:
                seen.add(id(v))
                inputs.append(v)
    member_nodes = set(map(id, grp.nodes))
    outputs = [v for n in grp.nodes for v in n.outputs
               if not readers.get(id(v), set()) <= member_nodes]
    sub = Graph(f"{g.name}_fused{grp.gid}", inputs, grp.nodes, outputs)
    return Node(Fused(sub, grp.shape), inputs, outputs, grp.nodes[-1].line)

