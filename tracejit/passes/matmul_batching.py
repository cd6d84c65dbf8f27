"""Batching of matrix products, Graph -> Graph: fewer, larger BLAS calls.

An unrolled recurrent step (DeZero's LSTM: eight Linears a time step, thirty steps a
window) is hundreds of small products; each BLAS call costs its dispatch, and the
smallest are all dispatch. Three rewrites, each asking the ops' facets
(`elementwise_form`, `matrix_operands`, `sums_operands`), never their names:

1. A product over a contraction of length 1 ((M, 1) @ (1, N), the LSTM's input
   projections of a 1-feature input and the output layer's input gradient) is the
   broadcast product, exactly: an elementwise multiply (and + 0.0, the sum's start:
   a -0.0 product is +0.0, as BLAS gives it), which fusion puts in the kernel that
   reads it.
2. A sum of products, `A1 @ B1 + A2 @ B2 + ... (+ other terms)`, is one product
   `[A1 A2 ...] @ [B1; B2; ...]` (+ the other terms): the backward's weight gradient
   accumulated over the time steps (sum_t h_t^T @ g_t) and an input gradient summed over
   the gates (sum_i g_i @ W_i^T) become one call each. The blocks are concatenated
   (a copy of each operand, once per call for the same Values: the concatenation of the
   same operands is made once and shared, as the four transposed weights every step
   reads; the blocks are ordered as the products stand in the graph, and transposes
   of computed values are joined as the transpose of their join: see _Concats).
3b. Products sharing the left operand whose right operands are concatenations of the
   same row blocks, `A @ [B11; ...; B1T], A @ [B21; ...; B2T]` (the gates' weight
   gradients after rewrite 2), are one product `A @ [B11 B21; ...; B1T B2T]` over long
   contractions (its rows the per-step concatenations rewrite 2 made: shared), and
   its column blocks.
3. Independent products sharing an operand, `A @ B1, A @ B2` (or `A1 @ B, A2 @ B`),
   with the other operands graph inputs (weights, their casts: joined once per call), are one product
   `A @ [B1 B2]` (`[A1; A2] @ B`) and its column (row) blocks; a cast or transpose of an
   input made after the first of them (the first LSTM step's casts, each at its
   product) is made before the joined product.
0. (First) a float32 operand of a float64 product, which NumPy casts on every call, is
   cast once per value (a weight every time step reads: once per call).

Measured (2-core Xeon, OpenBLAS 1 thread, float64, batch 30, hidden 100; one process,
interleaved, medians): the gate input gradients of 30 steps (4 x (30,100)@(100,100)^T
+ sums) 2.70 -> 2.29 ms as one (30,400)@(400,100) a step; the weight gradients over 30
steps (30 x (100,30)@(30,100) + sums, each gate) 2.34 -> 2.08 ms; (1,30)@(30,100) x 30
summed, 0.61 -> 0.28 ms; but 4 x (30,100)@(100,100) with one left operand 1.82 ms
against 1.94 ms as one (30,100)@(100,400) (BLAS is no faster on the larger product,
and its blocks are strided): rewrite 3 was for products of at most 2**15
multiply-adds, where the call's dispatch is the cost ((30,1)@(1,100) x 4: 0.65 ->
0.51 ms). Since kernels read and write blocks with unsigned indices (contiguous vector
loads: backends/numba/kernels._unsigned) and the casts of the first step are made first
(no second cell kernel), the four gate products are one again: one (30,100)@(100,400)
product 62 us against 67 us for the four (30,100)@(100,100), W7's window 270 -> 181
NumPy calls, 885 -> 796 materialized values, distinct kernels unchanged (10), thread
CPU 0.97-1.00x interleaved at load 4-5; SMALL_PRODUCT is 2**20 (W4's and W6's graphs
are unchanged by it). The sum of products reassociates the sum: float64 results differ by
rounding; float32 differences are judged against the float64 twin by the runtime
checks (runtime/checking.py), as for a fused reduction.

Every new node is placed where the nodes it replaces stood (a sum at its root, a
shared-operand group at its first product), and a group only takes products whose
operands are defined before that place: no node moves, so no data dependency, guard
or random draw is reordered.
"""
import numpy as np

from tracejit.core import ELEMENTWISE, MATMUL, MOVEMENT
from tracejit.ir import Lit, Node, Value
from tracejit.ops.arrayops import Concat, GetItem
from tracejit.ops.elementwise import Add, Cast
from tracejit.ops.primitive import Primitive

# Rewrite 3 (shared operand) only for products this small (multiply-adds, M*K*N):
# W7's (30,100)@(100,100) gate products are 3e5 (see the module docstring).
SMALL_PRODUCT = 1 << 20
# Rewrite 3b only over contractions at least this long (see _join_blocked_products).
JOIN_MIN_CONTRACTION = 256
# No concatenation larger than this (bytes): a batch must not cost a large copy.
MAX_CONCAT_BYTES = 1 << 26


def batch_matmuls(g):
    """The rewrites, in order (see the module docstring)."""
    g = _broadcast_products(g)
    g = _cast_operands_once(g)
    g = _batch_sums_of_products(g)
    g = _join_blocked_products(g)
    g = _batch_shared_operands(g, "left")
    g = _batch_shared_operands(g, "right")
    return g


def _primitive(n):
    return isinstance(n.fn, Primitive)


def _matrix_operands(n):
    if n.kind != MATMUL or not _primitive(n) or len(n.outputs) != 1:
        return None
    ops = n.fn.matrix_operands(n)
    if ops is None or not all(isinstance(v, Value) for v in ops):
        return None
    return ops


def _invariants(g):
    """Ids of the graph's inputs and of their casts and transposes (one input,
    elementwise or index arithmetic, of such a value): one value per call, as the
    input is (the weights)."""
    invariant = {id(v) for v in g.inputs}
    for n in g.nodes:
        if (len(n.inputs) == 1 and len(n.outputs) == 1 and n.kind in (ELEMENTWISE, MOVEMENT)
                and _primitive(n) and id(n.inputs[0]) in invariant):
            invariant.add(id(n.out))
    return invariant


def _use_counts(g):
    uses = {}
    for n in g.nodes:
        for v in n.inputs:
            if isinstance(v, Value):
                uses[id(v)] = uses.get(id(v), 0) + 1
    for v in g.outputs:
        if isinstance(v, Value):
            uses[id(v)] = uses.get(id(v), 0) + 1
    return uses


class _Concats:
    """Concatenations made by one pass run, one per (axis, operands): the same
    operands (the weights every time step reads) are joined once and shared.

    Operands that are all one transpose of arrays (the weight gradient's h_t^T of each
    time step) are joined as the transpose of the arrays' concatenation: the same
    values, and the arrays, which kernels make, can be written into the joined buffer
    where they are made (backends/numba/plan.py, _plan_joins), where a transpose is a
    view NumPy copies; the product reads the transposed operand without a copy. Not
    for transposed weights (invariants): their join is one copy a call, and BLAS read
    (30, 400) @ (100, 400)^T slower than the (400, 100) copy (65 against 89 us)."""

    def __init__(self, g):
        self.made = {}
        self.producer = g.producers()
        self.invariant = _invariants(g)

    def get(self, parts, axis, nodes, line):
        if len(parts) == 1:
            return parts[0]
        key = (axis, tuple(id(v) for v in parts))
        v = self.made.get(key)
        if v is None:
            perm, t = self._one_transpose(parts)
            if perm is not None:
                inner = self.get([self.producer[id(p)].inputs[0] for p in parts],
                                 perm[axis], nodes, line)
                v = Value(_joined_shape(parts, axis), parts[0].dtype)
                nodes.append(Node(type(t.fn)(*t.params), (inner,), (v,), line))
            else:
                v = Value(_joined_shape(parts, axis), parts[0].dtype)
                nodes.append(Node(Concat(axis), parts, (v,), line))
            self.made[key] = (v, parts)        # parts kept alive: ids stay unique
            return v
        return v[0]

    def seed(self, g):
        """The graph's own concatenations, to share (the four gate gradients of a time
        step joined for its input gradient's product)."""
        for n in g.nodes:
            if _primitive(n) and isinstance(n.fn, Concat) and len(n.inputs) > 1:
                key = (n.fn.axis, tuple(id(v) for v in n.inputs))
                self.made.setdefault(key, (n.out, n.inputs))

    def _one_transpose(self, parts):
        """(perm, a transposing node) when every part is a transpose by perm of a
        Value, not all of them invariants; else (None, None)."""
        perms, node = set(), None
        for v in parts:
            node = self.producer.get(id(v))
            if (node is None or node.kind != MOVEMENT or not _primitive(node)
                    or not isinstance(node.inputs[0], Value)):
                return None, None
            perm = node.fn.permutes_axes(node)
            if perm is None:
                return None, None
            perms.add(perm)
        if len(perms) != 1 or all(id(self.producer[id(v)].inputs[0]) in self.invariant
                                  for v in parts):
            return None, None
        return perms.pop(), node


def _joined_shape(parts, axis):
    shape = list(parts[0].shape)
    shape[axis] = sum(p.shape[axis] for p in parts)
    return shape


# ---------------------------------------------------------------- 1: broadcast products

def _broadcast_products(g):
    nodes, changed = [], False
    for n in g.nodes:
        if n.kind == MATMUL and _primitive(n) and len(n.outputs) == 1:
            fn = n.fn.elementwise_form(n)
            if fn is not None:
                # + 0.0 after the multiply: BLAS adds the product to +0.0, so a -0.0
                # product is +0.0 in eager's result (x + 0.0 is x for every other x,
                # NaN and infinities included); fusion keeps both in the kernel.
                out = n.outputs[0]
                t = Value(out.shape, out.dtype)
                nodes.append(Node(fn, n.inputs, (t,), n.line))
                n = Node(Add(), (t, Lit(0.0, out.dtype)), n.outputs, n.line)
                changed = True
        nodes.append(n)
    return g.replace(nodes=nodes) if changed else g


# ---------------------------------------------------------------- 0: casts, once

def _cast_operands_once(g):
    """A product of a float32 and a float64 operand: NumPy casts the float32 one on
    every call; cast it once (one Cast node per value and dtype, at its first product),
    shared by every product that reads it (the weights every time step reads)."""
    producer = g.producers()
    made, nodes, changed = {}, [], False

    def cast(v, dt, line):
        c = made.get((id(v), dt))
        if c is not None:
            return c
        p = producer.get(id(v))
        if (p is not None and p.kind == MOVEMENT and _primitive(p) and len(p.inputs) == 1
                and isinstance(p.inputs[0], Value) and p.fn.index_foldable(p)):
            # Index arithmetic commutes with a cast: W.T's cast is the transpose of W's,
            # the cast the forward's products already read (one cast kernel, not two).
            c = Value(v.shape, dt)
            nodes.append(Node(type(p.fn)(*p.params), (cast(p.inputs[0], dt, line),), (c,),
                              p.line))
        else:
            c = Value(v.shape, dt)
            nodes.append(Node(Cast(dt), (v,), (c,), line))
        made[(id(v), dt)] = c
        return c

    for n in g.nodes:
        if n.kind == MATMUL and _primitive(n) and len(n.outputs) == 1:
            dt = n.fn.operand_dtype(n)
            if dt is not None:
                ins = [cast(v, dt, n.line) if isinstance(v, Value) and v.dtype != dt else v
                       for v in n.inputs]
                n = Node(n.fn, ins, n.outputs, n.line)
                changed = True
        nodes.append(n)
    return g.replace(nodes=nodes) if changed else g


# ---------------------------------------------------------------- 2: sums of products

def _is_sum(n):
    return (_primitive(n) and n.fn.sums_operands and len(n.outputs) == 1
            and n.out.dtype.kind == "f")


def _batch_sums_of_products(g):
    uses = _use_counts(g)
    producer = g.producers()
    position = {id(v): i for i, n in enumerate(g.nodes) for v in n.outputs}
    position.update({id(v): i - len(g.inputs) for i, v in enumerate(g.inputs)})

    def where(v):
        """Where v, or the array v is a transpose of, is made."""
        p = producer.get(id(v))
        while p is not None and _primitive(p) and p.fn.permutes_axes(p) is not None:
            v = p.inputs[0]
            p = producer.get(id(v))
        return position.get(id(v), -1 - len(g.inputs)) if isinstance(v, Value) else 0

    reader = {}                      # id(value) -> the node reading it (single-use values)
    for n in g.nodes:
        for v in n.inputs:
            if isinstance(v, Value):
                reader[id(v)] = n

    def interior(n):
        # A link of a larger sum: a sum read once, by a sum of its shape and dtype.
        if not _is_sum(n) or uses.get(id(n.out)) != 1:
            return False
        u = reader.get(id(n.out))
        return (u is not None and _is_sum(u) and u.out.shape == n.out.shape
                and u.out.dtype == n.out.dtype)

    inner = {id(n) for n in g.nodes if interior(n)}
    plans = {}                       # id(root) -> (links, products, other terms)
    for r in g.nodes:
        if not _is_sum(r) or id(r) in inner:
            continue
        links, terms, stack = [r], [], list(reversed(r.inputs))
        while stack:                 # the sum's terms, left to right
            v = stack.pop()
            p = producer.get(id(v)) if isinstance(v, Value) else None
            if p is not None and id(p) in inner:
                links.append(p)
                stack.extend(reversed(p.inputs))
            else:
                terms.append(v)
        shape, dtype = r.out.shape, r.out.dtype
        if any(t.dtype != dtype if not isinstance(t, Value)
               else (t.dtype.kind != "f" or np.result_type(t.dtype, dtype) != dtype)
               for t in terms):
            continue                 # a term of another kind, or a literal's own dtype
        prods, rest = [], []
        for t in terms:
            p = producer.get(id(t)) if isinstance(t, Value) else None
            if (p is not None and t.shape == shape and uses.get(id(t)) == 1
                    and _matrix_operands(p) is not None):
                prods.append(p)
            else:
                rest.append(t)
        if len(prods) < 2:
            continue
        # The blocks in the order their operands stand in the graph (seen through a
        # transpose), whatever order the sum adds them in: two sums over the same
        # operands then join them in the same order, one concatenation they share.
        prods.sort(key=lambda p: tuple(where(v) for v in _matrix_operands(p)))
        ops = [_matrix_operands(p) for p in prods]
        if len({a.dtype for a, _ in ops}) > 1 or len({b.dtype for _, b in ops}) > 1:
            continue                 # blocks of one operand join in one dtype
        size = sum(a.nbytes + b.nbytes for a, b in ops)
        if size > MAX_CONCAT_BYTES:
            continue
        plans[id(r)] = (links, prods, rest)
    if not plans:
        return g
    dropped = set()
    for links, prods, _ in plans.values():
        dropped.update(id(n) for n in links[1:])
        dropped.update(id(p) for p in prods)
    concats = _Concats(g)
    nodes = []
    for n in g.nodes:
        if id(n) in dropped:
            continue
        plan = plans.get(id(n))
        if plan is None:
            nodes.append(n)
            continue
        _, prods, rest = plan
        a = concats.get([_matrix_operands(p)[0] for p in prods], 1, nodes, n.line)
        b = concats.get([_matrix_operands(p)[1] for p in prods], 0, nodes, n.line)
        final = n.out
        v = final if not rest else Value(final.shape, final.dtype)
        nodes.append(Node(type(prods[0].fn)(*prods[0].params), (a, b), (v,), prods[0].line))
        for k, t in enumerate(rest):
            out = final if k == len(rest) - 1 else Value(final.shape, final.dtype)
            nodes.append(Node(type(n.fn)(*n.params), (v, t), (out,), n.line))
            v = out
    return g.replace(nodes=nodes)


# ---------------------------------------------------------------- 3b: joined blocks

def _join_blocked_products(g):
    """A @ B1, ..., A @ Bk, each Bi a concatenation of row blocks Bi = [Bi1; ...; BiT]
    with the same rows: one product A @ C, C = [J1; ...; JT] with Jt = [B1t ... Bkt]
    (a time step's gate gradients side by side: the concatenation its input gradient's
    product made already, shared), and the Bi's products its column blocks.

    Why: the weight gradients of an LSTM's four gates over a window, sum_t h_t^T g_t
    after rewrite 2, are four (100, 900) @ (900, 100) products; one (100, 900) @
    (900, 400) product is faster (BLAS runs N = 100 below its best; measured 2.20 ->
    1.44 ms), and C's blocks are the per-step concatenations, which the backend writes
    in place (plan.py: _plan_joins): no copy more than the Bi's. Only over contractions
    of at least JOIN_MIN_CONTRACTION: shorter ones (M = 30, K = 100) ran slower joined.
    The product stands where its operands (A, the blocks, the Jt the graph has) are all
    defined; a group whose results are read before that place is left as it is."""
    producer = g.producers()
    defined = {id(v): -1 for v in g.inputs}
    first_read = {}
    for i, n in enumerate(g.nodes):
        for v in n.outputs:
            defined[id(v)] = i
        for v in n.inputs:
            if isinstance(v, Value):
                first_read.setdefault(id(v), i)
    concats = _Concats(g)
    concats.seed(g)
    groups = {}
    for n in g.nodes:
        ops = _matrix_operands(n)
        if ops is None or ops[0].shape[1] < JOIN_MIN_CONTRACTION:
            continue
        a, b = ops
        c = producer.get(id(b))
        if (c is None or not _primitive(c) or not isinstance(c.fn, Concat) or c.fn.axis != 0
                or not all(isinstance(v, Value) for v in c.inputs)):
            continue
        splits = tuple(v.shape[0] for v in c.inputs)
        key = (id(a), b.dtype, type(n.fn), n.params, splits)
        groups.setdefault(key, []).append(n)
    at = {}                              # node index -> the groups placed before it
    for members in groups.values():
        if len(members) < 2:
            continue
        blocks = [producer[id(_matrix_operands(p)[1])].inputs for p in members]
        ready = defined[id(_matrix_operands(members[0])[0])]
        for parts in zip(*blocks):
            made = concats.made.get((1, tuple(id(v) for v in parts)))
            ready = max([ready] + [defined[id(v)] for v in parts]
                        + ([defined[id(made[0])]] if made else []))
        if any(first_read.get(id(p.out), len(g.nodes)) <= ready for p in members):
            continue
        if sum(_matrix_operands(p)[1].nbytes for p in members) <= MAX_CONCAT_BYTES:
            at.setdefault(ready + 1, []).append((members, blocks))
    if not at:
        return g
    dropped = {id(p) for groups_at in at.values() for m, _ in groups_at for p in m}
    nodes = []
    for i in range(len(g.nodes) + 1):
        for members, blocks in at.get(i, ()):
            _emit_joined_product(members, blocks, concats, nodes)
        if i < len(g.nodes) and id(g.nodes[i]) not in dropped:
            nodes.append(g.nodes[i])
    return _drop_unread(g.replace(nodes=nodes), Concat)


def _emit_joined_product(members, blocks, concats, nodes):
    """Rewrite 3b's nodes for one group: the joined blocks, A @ C, C's column blocks."""
    first = members[0]
    a = _matrix_operands(first)[0]
    rows = [concats.get(list(parts), 1, nodes, first.line) for parts in zip(*blocks)]
    c = concats.get(rows, 0, nodes, first.line)
    y = Value((a.shape[0], c.shape[1]), first.out.dtype)
    nodes.append(Node(type(first.fn)(*first.params), (a, c), (y,), first.line))
    start = 0
    for p in members:
        stop = start + p.out.shape[1]
        nodes.append(Node(GetItem.block(1, start, stop), (y,), (p.out,), p.line))
        start = stop


def _drop_unread(g, cls):
    """g without the nodes of class cls no node or output reads any more (the Bi
    concatenations rewrite 3b replaced)."""
    uses = _use_counts(g)
    keep = [n for n in g.nodes
            if not (_primitive(n) and isinstance(n.fn, cls) and not uses.get(id(n.out)))]
    return g.replace(nodes=keep) if len(keep) != len(g.nodes) else g


# ---------------------------------------------------------------- 3: shared operands

def _hoistable(g):
    """id(value) -> the nodes making it, in order, for values that are casts and index
    arithmetic (transposes) of graph inputs: pure, they cannot fail, and they read only
    inputs, so they may stand earlier than they do (the weights' casts of an LSTM's first
    step stand between its gate products, one cast before each)."""
    chains = {}
    inputs = {id(v) for v in g.inputs}
    for n in g.nodes:
        if not (_primitive(n) and len(n.inputs) == 1 and len(n.outputs) == 1
                and isinstance(n.inputs[0], Value)):
            continue
        if not (isinstance(n.fn, Cast) or (n.kind == MOVEMENT and n.fn.index_foldable(n))):
            continue
        u = n.inputs[0]
        if id(u) in inputs:
            chains[id(n.out)] = [n]
        elif id(u) in chains:
            chains[id(n.out)] = chains[id(u)] + [n]
    return chains


def _batch_shared_operands(g, side):
    """side "left": A @ B1, A @ B2 -> A @ [B1 B2]; "right": A1 @ B, A2 @ B -> [A1; A2] @ B.

    A member's other operand made after the group's first product by a cast or a
    transpose of a graph input (_hoistable) is made before it instead: the only nodes
    this rewrite moves, and they read nothing but inputs."""
    where = {id(v): -1 for v in g.inputs}
    for i, n in enumerate(g.nodes):
        for v in n.outputs:
            where[id(v)] = i
    invariant = _invariants(g)
    hoistable = _hoistable(g)
    shared_k, other_k, axis = (0, 1, 1) if side == "left" else (1, 0, 0)
    groups, open_groups = [], {}
    for i, n in enumerate(g.nodes):
        ops = _matrix_operands(n)
        if ops is None:
            continue
        a, b = ops
        if a.shape[0] * a.shape[1] * b.shape[1] > SMALL_PRODUCT:
            continue
        shared, other = ops[shared_k], ops[other_k]
        if id(other) not in invariant:
            # Only graph inputs (the weights, their casts): joined once per call and
            # shared by every time step. Computed blocks would be joined by a copy per
            # group, and the group's blocks read by kernels as slices compile more kernel
            # variants (the 12-step LSTM window: 17 distinct kernels against 14), for
            # about 1 us a merged call.
            continue
        key = (id(shared), other.shape, other.dtype, type(n.fn), n.params)
        grp = open_groups.get(key)
        # Joins the group only if its other operand exists where the group's product
        # will stand (the first product's place): nothing moves.
        if grp is not None and (where.get(id(other), len(g.nodes)) < grp[0]
                                or id(other) in hoistable):
            grp[1].append(n)
            continue
        grp = (i, [n])
        open_groups[key] = grp
        groups.append(grp)
    groups = [members for _, members in groups if len(members) > 1]
    groups = [m for m in groups
              if sum(_matrix_operands(p)[other_k].nbytes for p in m) <= MAX_CONCAT_BYTES]
    if not groups:
        return g
    first = {id(m[0]): m for m in groups}
    dropped = {id(p) for m in groups for p in m[1:]}
    concats = _Concats(g)
    nodes = []
    placed = set()                 # ids of the nodes already in `nodes`
    for n in g.nodes:
        if id(n) in dropped or id(n) in placed:
            continue
        members = first.get(id(n))
        if members is None:
            nodes.append(n)
            placed.add(id(n))
            continue
        for p in members:          # the other operands made later: made here
            for h in hoistable.get(id(_matrix_operands(p)[other_k]), ()):
                if id(h) not in placed:
                    nodes.append(h)
                    placed.add(id(h))
        shared = _matrix_operands(n)[shared_k]
        joined = concats.get([_matrix_operands(p)[other_k] for p in members], axis, nodes,
                             n.line)
        ins = (shared, joined) if side == "left" else (joined, shared)
        shape = list(n.out.shape)
        shape[axis] = joined.shape[axis]
        y = Value(shape, n.out.dtype)
        nodes.append(Node(type(n.fn)(*n.params), ins, (y,), n.line))
        start = 0
        for p in members:
            stop = start + p.out.shape[axis]
            nodes.append(Node(GetItem.block(axis, start, stop), (y,), (p.out,), p.line))
            start = stop
    return g.replace(nodes=nodes)
