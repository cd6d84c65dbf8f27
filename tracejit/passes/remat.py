"""Save or recompute: which forward values a compiled backward keeps, chosen by min cut.

The backward reads some forward values. Each one is either saved (the forward writes
it out and the call holds it until the backward runs) or recomputed inside the backward
kernel from other values, which are in turn saved or recomputed. As in PyTorch
AOTAutograd's min-cut rematerialization, the choice is a minimum s-t cut in a graph of
values: every value is split into an in- and an out-vertex joined by an edge whose
capacity is the value's size, so the cut edges are the values saved and the cut's
capacity is the memory a call holds for its backward.

- source -> v_in for values the backward cannot recompute (reductions, matmuls,
  movement, random and opaque nodes, costly elementwise math, multi-output nodes,
  anything computed from an input the call mutates in place);
- u_out -> v_in for every forward value u a recomputable v is computed from;
- v_out -> sink for every value the backward reads.

Graph inputs the backward reads directly are not vertices: it reads the call's own
arrays for free, as they are when it runs (a mutated input too, as the eager backward
reads the Variable's updated data; nothing is recomputed from it). But a value
recomputed from an input is the forward's value only if the input is as the forward
saw it: an argument the caller may change between the call and its backward
(`x.data += 1`) is, for recomputation, a vertex of its own (`snapshot`): saving it
means the forward keeps a copy of it, of the argument's size, which the cut weighs
against saving the values computed from it. On graphs of 0-d values the cost is the
call, not the memory, so everything recomputable is recomputed (from snapshots).
"""
from collections import deque

from tracejit import core
from tracejit.ir import Value


class Plan:
    """The partition: `saved` values (snapshot inputs first, then forward values in
    forward order), `recompute` as (index, node)."""

    def __init__(self, saved, recompute):
        self.saved = saved
        self.recompute = recompute

    @property
    def saved_bytes(self):
        return sum(v.nbytes for v in self.saved)

    def recompute_map(self):
        """id(value) -> (index, node) for the values the backward recomputes."""
        return {id(n.outputs[0]): (i, n) for i, n in self.recompute}

    def __repr__(self):
        return (f"Plan(saved={len(self.saved)} arrays, {self.saved_bytes} bytes, "
                f"recompute={[n.name for _, n in self.recompute]})")


def is_scalar_graph(fwd_nodes):
    return all(v.ndim == 0 for n in fwd_nodes for v in n.outputs)


def recomputable(fwd_nodes, mutated=frozenset()):
    """id(value) -> (index, node) for forward values the backward may recompute.

    `mutated` holds ids of graph inputs the call updates in place: by the time the
    backward runs their buffers hold new values, so nothing computed from them (the
    taint spreads through every later node) is recomputed.
    """
    scalar = is_scalar_graph(fwd_nodes)
    out = {}
    tainted = set(mutated)
    for i, n in enumerate(fwd_nodes):
        if any(isinstance(v, Value) and id(v) in tainted for v in n.inputs):
            tainted.update(id(v) for v in n.outputs)
            continue
        if n.kind != core.ELEMENTWISE or len(n.outputs) != 1:
            continue
        if scalar or not _costly(n):
            out[id(n.outputs[0])] = (i, n)
    return out


def _costly(n):
    # The op says (Primitive.cheap_to_recompute); a user Function of elementwise kind
    # declares nothing and counts as cheap, as it always did.
    cheap = getattr(n.fn, "cheap_to_recompute", None)
    return cheap is not None and not cheap()


def partition(fwd_nodes, needed, mutated=frozenset(), min_cut=True, snapshot=()):
    """The Plan for a backward that reads the values `needed` (forward values among
    them matter; inputs, literals and the backward's own values are ignored).

    `snapshot` lists graph inputs a recomputation may read only as a copy the forward
    saves (arguments the caller may change before the backward): among the values
    saved they come first. Without it, inputs are read as the backward finds them.
    min_cut=False recomputes everything recomputable, transitively: the rule before
    the cut, and what graphs of 0-d values always do.
    """
    cand = recomputable(fwd_nodes, mutated)
    # id(value) -> index of its producing node: forward values, in forward order.
    produced = {id(v): i for i, n in enumerate(fwd_nodes) for v in n.outputs}
    needed = _unique(v for v in needed if isinstance(v, Value) and id(v) in produced)
    # Snapshot inputs are vertices too, none recomputable, ordered before every node.
    snapshot = _unique(snapshot)
    produced.update((id(v), k - len(snapshot)) for k, v in enumerate(snapshot))
    if min_cut and not is_scalar_graph(fwd_nodes):
        cut = _min_cut(needed, cand, produced)
    else:
        cut = set()
    return _walk(needed, cand, produced, cut)


def _unique(values):
    seen, out = set(), []
    for v in values:
        if id(v) not in seen:
            seen.add(id(v))
            out.append(v)
    return out


def _walk(needed, cand, produced, cut):
    # From what the backward reads, through recomputed nodes, to what the forward saves.
    saved, recompute, seen = {}, {}, set()
    stack = list(needed)
    while stack:
        v = stack.pop()
        if id(v) in seen:
            continue
        seen.add(id(v))
        entry = cand.get(id(v))
        if entry is None or id(v) in cut:
            saved[id(v)] = v
            continue
        recompute[entry[0]] = entry[1]
        stack.extend(_operands(entry[1], produced))
    return Plan(sorted(saved.values(), key=lambda v: produced[id(v)]),
                [(i, recompute[i]) for i in sorted(recompute)])


def _min_cut(needed, cand, produced):
    """ids of the values a minimum cut saves."""
    values = _closure(needed, cand, produced)
    vid = {id(v): k for k, v in enumerate(values)}
    # Integer capacities: bytes scaled above the count of values, plus one per value,
    # so among cuts of equal bytes the one with fewer arrays wins, and never otherwise.
    scale = len(values) + 1
    weight = [v.nbytes * scale + 1 for v in values]
    inf = sum(weight) + 1
    source, sink = 2 * len(values), 2 * len(values) + 1
    net = _Network(2 * len(values) + 2)
    for k, v in enumerate(values):
        net.add(2 * k, 2 * k + 1, weight[k])
        entry = cand.get(id(v))
        if entry is None:
            net.add(source, 2 * k, inf)
        else:
            for u in _operands(entry[1], vid):
                net.add(2 * vid[id(u)] + 1, 2 * k, inf)
    for v in needed:
        net.add(2 * vid[id(v)] + 1, sink, inf)
    net.max_flow(source, sink)
    # The minimum cut nearest the sink: on ties, save late values, recompute less.
    sink_side = net.reaching(sink)
    return {id(v) for k, v in enumerate(values)
            if 2 * k + 1 in sink_side and 2 * k not in sink_side}


def _closure(needed, cand, produced):
    # The values the decision involves: what the backward reads, and what a
    # recomputable value among them could be recomputed from, transitively.
    out, seen, stack = [], set(), list(needed)
    while stack:
        v = stack.pop()
        if id(v) in seen:
            continue
        seen.add(id(v))
        out.append(v)
        entry = cand.get(id(v))
        if entry is not None:
            stack.extend(_operands(entry[1], produced))
    return out


def _operands(node, produced):
    # What recomputing node reads from the forward (inputs and literals come free).
    return [u for u in node.inputs if isinstance(u, Value) and id(u) in produced]


class _Network:
    """A flow network for Dinic's algorithm (edge e's reverse is e ^ 1)."""

    def __init__(self, n):
        self.adj = [[] for _ in range(n)]
        self.to = []
        self.cap = []

    def add(self, u, v, c):
        self.adj[u].append(len(self.to))
        self.to.append(v)
        self.cap.append(c)
        self.adj[v].append(len(self.to))
        self.to.append(u)
        self.cap.append(0)

    def max_flow(self, s, t):
        flow = 0
        while True:
            level = self._levels(s)
            if level[t] < 0:
                return flow
            it = [0] * len(self.adj)
            while True:
                pushed = self._augment(s, t, level, it)
                if not pushed:
                    break
                flow += pushed

    def _levels(self, s):
        level = [-1] * len(self.adj)
        level[s] = 0
        queue = deque([s])
        while queue:
            u = queue.popleft()
            for e in self.adj[u]:
                w = self.to[e]
                if self.cap[e] > 0 and level[w] < 0:
                    level[w] = level[u] + 1
                    queue.append(w)
        return level

    def _augment(self, s, t, level, it):
        # One augmenting path along the level graph; iterative, since value graphs
        # can be deeper than Python's recursion limit.
        path, u = [], s
        while u != t:
            adj = self.adj[u]
            while it[u] < len(adj):
                e = adj[it[u]]
                if self.cap[e] > 0 and level[self.to[e]] == level[u] + 1:
                    break
                it[u] += 1
            else:
                if not path:
                    return 0
                level[u] = -1          # a dead end: no path to t through u this phase
                e = path.pop()
                u = self.to[e ^ 1]
                it[u] += 1
                continue
            path.append(e)
            u = self.to[e]
        pushed = min(self.cap[e] for e in path)
        for e in path:
            self.cap[e] -= pushed
            self.cap[e ^ 1] += pushed
        return pushed

    def reaching(self, t):
        """Vertices with a residual path to t."""
        seen = {t}
        queue = deque([t])
        while queue:
            w = queue.popleft()
            for e in self.adj[w]:
                # e runs w -> u; its reverse e ^ 1 runs u -> w with capacity cap[e ^ 1].
                u = self.to[e]
                if self.cap[e ^ 1] > 0 and u not in seen:
                    seen.add(u)
                    queue.append(u)
        return seen
