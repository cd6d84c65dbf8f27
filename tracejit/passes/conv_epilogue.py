"""Conv epilogue fusion, Graph -> Graph (before fusion.fuse, which would otherwise
group the bias add and the ReLU into an elementwise kernel between the conv call and
the pooling call).

Forward: conv2d(x, W) -> + bias -> ReLU -> max pooling (any prefix of the steps after
the conv, at least one) becomes one ConvEpilogue node (ops/conv_fused.py): the conv's
output is never written, and the pre-activation and the ReLU's output only when
another node or the graph's outputs read them. With a bias the conv's output must have
no other reader; without one it is the pre-activation.

Backward: Pooling2DGrad(x, gy) * (a > 0), then optionally its sum_to over the batch
and pixels (the bias's gradient), becomes one PoolGradMasked node, which finds each
window's argmax in x, reads a there only and writes the masked gradient once. The
pooling gradient must have no other reader; the mask's comparison is dropped when
nothing else reads it. When x is relu(a) in this graph (a forward and backward traced
together), x > 0 exactly where a > 0 (NaN and -0.0 included), so the mask is read
from x and a need not be kept.

Which op is which is each op's epilogue_part facet (ops/primitive.py).
"""
from tracejit.ir import Node, Value
from tracejit.ops.conv_fused import ConvEpilogue, PoolGradMasked
from tracejit.ops.primitive import KERNEL_FLOATS, Primitive


def _part(n):
    if n is None or not isinstance(n.fn, Primitive) or len(n.outputs) != 1:
        return None, None
    return n.fn.epilogue_part(n) or (None, None)


class _Uses:
    """Readers of each value (graph outputs count as a reader None)."""

    def __init__(self, g):
        self.readers = g.users()
        self.out_ids = {id(v) for v in g.outputs if isinstance(v, Value)}
        self.producer = g.producers()
        self.order = g.nodes

    def of(self, v):
        return self.readers.get(id(v), [])

    def only_reader(self, v, n):
        """Is n the one node reading v, and v no output?"""
        rs = self.of(v)
        return id(v) not in self.out_ids and len(rs) == 1 and rs[0] is n

    def read_besides(self, v, n):
        """Does anything but node n read v (an output counts)?"""
        return id(v) in self.out_ids or any(r is not n for r in self.of(v))

    def one_reader_as(self, v, role):
        """The one node reading v whose epilogue role is `role`, else None."""
        rs = [r for r in self.of(v) if _part(r)[0] == role and r.inputs[0] is v]
        return rs[0] if len(rs) == 1 else None


def fuse_conv_epilogues(g):
    """Rewrite the backward prologues, then the forward epilogues (see the module
    docstring); nodes in the original order, each fused node where its chain began."""
    g = _rewrite(g, _match_pool_grad)
    return _rewrite(g, _match_conv)


def _rewrite(g, match):
    uses = _Uses(g)
    at, drop = {}, set()
    for i, n in enumerate(g.nodes):
        m = match(n, uses)
        if m is None or any(id(x) in drop for x in m[1]):
            continue
        node, removed, where = m
        drop.update(id(x) for x in removed)
        at[id(where)] = node
    if not at:
        return g
    nodes = []
    for n in g.nodes:
        if id(n) in at:
            nodes.append(at[id(n)])
        if id(n) not in drop:
            nodes.append(n)
    return g.replace(nodes=nodes)


def _float4d(*vs):
    d = vs[0].dtype
    return d in KERNEL_FLOATS and all(v.dtype == d and len(v.shape) == 4 for v in vs)


# ---------------------------------------------------------------- forward

def _bias_operand(add, v):
    """The bias the add `add` adds to the 4-D value v: another value of v's dtype with
    one element per channel, broadcast along N, H, W; else None."""
    if len(add.inputs) != 2 or add.out.shape != v.shape or add.out.dtype != v.dtype:
        return None
    b = add.inputs[1] if add.inputs[0] is v else add.inputs[0]
    if b is v or not isinstance(b, Value) or b.dtype != v.dtype:
        return None
    if b.shape not in ((v.shape[1], 1, 1), (1, v.shape[1], 1, 1)):
        return None
    return b


def _match_conv(n, uses):
    role, window = _part(n)
    if role != "conv" or not all(isinstance(v, Value) for v in n.inputs):
        return None
    x, W = n.inputs
    c = n.out
    if not _float4d(x, W, c):
        return None
    nxt = uses.of(c)
    chain, bias, act, pooled = [n], None, None, None
    if len(nxt) == 1 and id(c) not in uses.out_ids and _part(nxt[0])[0] == "add":
        bias = _bias_operand(nxt[0], c)
        if bias is None:
            return None
        chain.append(nxt[0])
        pre = nxt[0].out
    else:
        pre = c             # no bias: the conv's output is the pre-activation
    cur = pre
    r = uses.one_reader_as(cur, "relu")
    if _part(r)[0] == "relu" and r.inputs[0] is cur:
        chain.append(r)
        cur = act = r.out
        r = uses.one_reader_as(cur, "max_pool")
    if _part(r)[0] == "max_pool" and r.inputs[0] is cur:
        chain.append(r)
        pooled = r.out
    if len(chain) == 1:
        return None
    # A step's value is kept when something besides the next step reads it (an output
    # counts); the chain's last value always is.
    step = {id(m.out): chain[i + 1] if i + 1 < len(chain) else None
            for i, m in enumerate(chain)}
    keep_pre, keep_act = [v is not None and (step[id(v)] is None or
                                             uses.read_besides(v, step[id(v)]))
                          for v in (pre, act)]
    fn = ConvEpilogue(window[0], window[1], act is not None,
                      None if pooled is None else _part(chain[-1])[1], keep_pre, keep_act,
                      replaces=chain)
    outs = [v for v, k in ((pre, keep_pre), (act, keep_act)) if k]
    if pooled is not None:
        outs.append(pooled)
    ins = [x, W] if bias is None else [x, W, bias]
    node = Node(fn, ins, outs, chain[-1].line)
    # Where pre-activation was defined (the add, else the conv): the inputs are defined
    # by then (the bias before its add), and every reader of the chain's values after.
    return node, chain, chain[1] if bias is not None else n


# ---------------------------------------------------------------- backward

def _match_pool_grad(n, uses):
    if _part(n)[0] != "mul" or len(n.inputs) != 2:
        return None
    for pg, mask in (n.inputs, n.inputs[::-1]):
        pool = uses.producer.get(id(pg)) if isinstance(pg, Value) else None
        test = uses.producer.get(id(mask)) if isinstance(mask, Value) else None
        if _part(pool)[0] == "max_pool_grad" and _part(test)[0] == "positive":
            break
    else:
        return None
    x, gy = pool.inputs
    a = test.inputs[0]
    if not (isinstance(x, Value) and isinstance(gy, Value) and isinstance(a, Value)):
        return None
    if not uses.only_reader(pg, n) or not _float4d(x, pg, a) or n.out.dtype != pg.dtype \
            or a.shape != x.shape or n.out.shape != x.shape:
        return None
    # x = relu(a) here: x > 0 where a > 0, so the mask is read from x.
    src = uses.producer.get(id(x))
    if _part(src)[0] == "relu" and src.inputs[0] is a:
        a = x
    removed = [pool, n]
    if uses.only_reader(mask, n):
        removed.append(test)
    outs = [n.out]
    sum_shape = None
    C = x.shape[1]
    for s in uses.of(n.out):
        role, shape = _part(s)
        if role == "sum_to" and s.inputs[0] is n.out and s.out.dtype == n.out.dtype and \
                tuple(shape) in ((C, 1, 1), (1, C, 1, 1)):
            sum_shape = tuple(shape)
            removed.append(s)
            outs.append(s.out)
            break
    kernel, stride, pad = _part(pool)[1]
    order = {id(m): i for i, m in enumerate(uses.order)}
    fn = PoolGradMasked(kernel, stride, pad, sum_shape,
                        replaces=sorted(removed, key=lambda m: order[id(m)]))
    node = Node(fn, [x, gy, a], outs, n.line)
    return node, removed, n
