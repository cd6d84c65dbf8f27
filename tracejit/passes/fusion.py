"""Fusion, Graph -> Graph: `fuse` groups nodes into `Fused` nodes, one per kernel the
code generator emits: elementwise DAGs over one iteration shape (operands may
broadcast), the reductions that consume them (sum((a - b) ** 2) in one pass), 0-d
epilogues after a full reduction (mean = sum / n), and movement ops that read a group
input (broadcast_to, transpose, reshape that only adds or drops size-1 axes, basic
indexing x[1:, 0, None, ..., ::-2] and its gradient, a masked read) folded into index
arithmetic. What each op allows is its facets (ops/primitive.py).
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

    _absorb_loads(g, groups, group_of, deps, closure, gdeps)
    readers = _readers(g)
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
    users = {}
    for n in g.nodes:
        for v in n.inputs:
            if isinstance(v, Value):
                users.setdefault(id(v), []).append(n)
    out_ids = {id(v) for v in g.outputs if isinstance(v, Value)}
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

