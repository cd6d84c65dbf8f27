"""The numba backend: `compile(graph)` -> run(list of input arrays) -> list of outputs.

Last stage of trace -> IR -> passes -> codegen. Same contract as `tracejit.ir.interpret`:
inputs in graph.inputs order, outputs in graph.outputs order, GuardFailure(index,
outcome) at the first failing guard (index = position among the graph's guards).

The JIT runs passes.PIPELINE first (passes.optimize), so this backend only lowers (a
graph that has not been through the passes, a direct caller's, goes through them
here). The graph becomes a *plan*: generated Python source that runs, in order, one
numba kernel per fused group (kernels.py), NumPy calls for matmul / opaque / random /
movement nodes, and guard checks; a concatenation's result is allocated at the plan's
start and the kernels making its operands write them into its blocks (_plan_joins). A
graph of 0-d ops and guards (dispatch-bound scalar code) instead becomes one njit
function that checks the guards inside and returns the first failing index.
`graph.source` holds the plan and every kernel; graph.notes counts kernels, NumPy
calls and materialized intermediates, so `graph.summary()` reports them.

Static rules, fixed by measurement (benchmarks/bench_kernels.py, bench_vecmath.py;
2-core Xeon, AVX-512, numba 0.68, NumPy 2.4; 4e6 elements):
  numba lowers math.exp/tanh/... to scalar libm calls, 4-10x slower per element than
  NumPy's SIMD ufuncs. float64 kernels call tracejit.backends.numba.vecmath instead (branch-free,
  inlined, vectorized; <= 1.5 ulp): the 10-op tanh/sin/exp chain runs in ~50 ms against
  187-199 ms with libm and ~100 ms as NumPy ufuncs on threaded blocks.
  float32: NumPy's float32 SIMD math is as fast as vecmath's, so float32 groups that
  contain exp/log/tanh/sigmoid/sin/cos and have at least NUMPY_MATH_MIN elements run as
  NumPy ufuncs on cache-sized blocks (BLOCK elements): fused memory traffic, NumPy's math.
Everything else is a fused numba loop.
"""
import builtins
import concurrent.futures
import linecache
import os
import threading
import time

import numpy as np

from tracejit import passes
from tracejit.passes import fusion
from tracejit.backends.numba import background as _background
from tracejit.backends.numba import cache as _cache
from tracejit.backends.numba import kernels as K
from tracejit.ir import Graph, Lit, Node, Value
from tracejit.ops.primitive import Primitive
from tracejit.ops.trace_only import GUARD, GuardFailure

# prange pays above this many elements per kernel. Measured on the idle 2-core machine,
# 10-op add/mul chain, serial vs prange: 4k 6.0 vs 8.4 us, 16k 11.4 vs 10.4 us,
# 64k 38.6 vs 21.5 us, 131k 136 vs 42 us. Graphs with a matmul stay serial (jit.py).
PARALLEL_MIN = 1 << 14
# NumPy ufuncs beat a libm loop once a call's ~1 us overhead is amortized.
NUMPY_MATH_MIN = 256
BLOCK = 16384
# Blocked NumPy groups this large run their blocks on all cores (threads: NumPy's
# ufuncs release the GIL). Measured: see the transcendental chain in README.
THREADED_BLOCKS_MIN = 1 << 17
# Kernels write strided blocks of a concatenation buffer through the buffer
# (_plan_block_writes); False: through the blocks' views (benchmarks/ab_w7_sink.py).
COLUMN_BLOCK_WRITES = True
_POOL = None
_POOL_LOCK = threading.Lock()


def run_blocks(fn, n, rows):
    """Call fn(start, stop) over [0, n) in one chunk per core, chunks a multiple of rows."""
    global _POOL
    k = os.cpu_count() or 1
    if k < 2 or n <= rows:
        fn(0, n)
        return
    if _POOL is None:
        with _POOL_LOCK:
            if _POOL is None:
                _POOL = concurrent.futures.ThreadPoolExecutor(k, thread_name_prefix="tracejit")
    chunk = -(-n // k)
    chunk = -(-chunk // rows) * rows
    futures = [_POOL.submit(fn, lo, min(n, lo + chunk)) for lo in range(chunk, n, chunk)]
    try:
        fn(0, min(n, chunk))
    finally:
        for f in futures:
            f.result()
__all__ = ["compile", "optimize", "PARALLEL_MIN", "NUMPY_MATH_MIN", "stats"]


def optimize(graph):
    """passes.optimize (kept here for callers of the backend's old name)."""
    return passes.optimize(graph)


def stats():
    """Kernels built, numba compilations, disk-cache loads and errors (this process)."""
    out = dict(_cache.STATS)
    out["numba_compilations"] = _cache.compiled_signatures()
    return out


def compile(graph, parallel=None, cache=True):
    """Lower `graph` to run(arrays) -> outputs; parallel None = by size, True/False force.

    The graph is lowered as it is when its passes ran (the JIT's graphs:
    passes.optimize before any backend); a graph that has not been through them (a
    direct caller's) goes through passes.optimize first.
    cache=False skips the disk cache (the in-process structural cache always applies).
    Sets graph.source and graph.notes (kernels, numpy_calls, materialized,
    compile_seconds: the lowering's; pass_seconds has the passes').
    """
    g = optimize(graph)
    t0 = time.perf_counter()
    flat = _flatten(g)
    if _scalar_graph(g, flat):
        run, source, notes = _compile_scalar(g, flat, cache)
    else:
        run, source, notes = _compile_plan(g, parallel, cache)
    notes["compile_seconds"] = round(time.perf_counter() - t0, 6)
    for target in (graph, g):
        target.source = source
        target.notes.update(notes)
    run.graph = g
    run.source = source
    return run


def _flatten(g):
    out = []
    for n in g.nodes:
        if n.kind == passes.FUSED:
            out.extend(n.fn.graph.nodes)
        else:
            out.append(n)
    return out


# ---------------------------------------------------------------- scalar graphs

def _scalar_graph(g, flat):
    if not flat or not all(isinstance(v, Value) and v.shape == () and
                           v.dtype in fusion._IN_DTYPES for v in g.inputs):
        return False
    for n in flat:
        if n.kind == GUARD:
            if n.fn.conv not in ("bool", "float", "int", "index"):
                return False
            continue
        if len(n.outputs) != 1 or n.out.shape != ():
            return False
        if fusion._fusable_elementwise(n):
            continue
        if (n.kind == "reduction" and isinstance(n.fn, Primitive)
                and n.fn.reduction_combine is not None
                and n.inputs[0].shape == () and n.out.dtype == n.inputs[0].dtype
                and n.out.dtype.kind == "f"):
            continue
        return False
    return True


def _compile_scalar(g, flat, use_disk):
    name, source, out_vals = K.scalar_kernel(flat, g.inputs, g.outputs)
    kern = _cache.kernel(source, name, disk=use_disk)
    # Compiled now for the inputs' dtypes, and called through that overload's entry
    # point: numba's dispatcher resolves types on every call (0.3 of a 1 us call here).
    # The entry point unboxes each argument as a scalar of its type (float(x), int(x),
    # bool(x)), so a 0-d array goes in as it is, with no .item(), and nothing can be
    # misread: the plan's inputs are 0-d arrays of these dtypes (the signature key and
    # the captured-state checks see to it).
    import numba
    entry = kern.compile(tuple(numba.from_dtype(v.dtype) for v in g.inputs))
    guards = [n.fn for n in flat if n.kind == GUARD]
    in_pos = {id(v): j for j, v in enumerate(g.inputs)}
    env = {"np": np, "_k": entry, "_fail": _fail_factory(guards), "_arr": np.array}
    for j, v in enumerate(g.outputs):
        if isinstance(v, Lit):
            env[f"_c{j}"] = v

    def lines(args, env_out, results):
        """The plan's body on inputs named `args`, leaving output k in `results[k]`:
        the variant's runner writes it into its own frame (one call fewer per call)."""
        env_out.update(env)
        rets = []
        for j, v in enumerate(g.outputs):
            if isinstance(v, Lit):
                rets.append(f"_arr(_c{j}.value)")
            elif id(v) in in_pos:
                rets.append(f"_arr({args[in_pos[id(v)]]}, np.{v.dtype.name})")
            else:
                # numba returns a float64 as a Python float, which np.array keeps exactly.
                dt = "" if v.dtype == np.float64 else f", np.{v.dtype.name}"
                rets.append(f"_arr(_r{out_vals.index(v)}{dt})")
        targets = (["_g", "_gv"] if guards else []) + [f"_r{k}" for k in range(len(out_vals))]
        call = f"_k({', '.join(args)})"
        if targets:
            call = f"{', '.join(targets)}{',' if len(targets) == 1 else ''} = {call}"
        body = [f"{call}     # {name}: the whole graph" + (", guards inside" if guards else "")]
        if guards:
            body.append("if _g >= 0: _fail(_g, _gv)")
        return body + [f"{res} = {ret}" for res, ret in zip(results, rets)]

    args = [f"x{j}" for j in range(len(g.inputs))]
    outs = [f"y{k}" for k in range(len(g.outputs))]
    plan = f"def plan({', '.join(args)}):\n" + "".join(
        f"    {line}\n" for line in lines(args, {}, outs)) + f"    return [{', '.join(outs)}]\n"
    run = _make_run(g, plan, env)
    run.plan.inline = lines
    notes = {"kernels": 1, "distinct_kernels": 1, "numpy_calls": 0, "materialized": 0,
             "mode": "scalar"}
    return run, f"# plan\n{plan}\n# kernel\n{source}", notes


def _fail_factory(guards):
    def fail(i, value):
        raise GuardFailure(int(i), guards[int(i)].outcome(value))
    return fail


def _make_run(g, plan_source, env):
    code = compile_source(plan_source, f"<tracejit-plan {g.name}>")
    exec(code, env)
    plan = env["plan"]
    n_inputs = len(g.inputs)
    name = g.name

    def run(arrays):
        if len(arrays) != n_inputs:
            raise ValueError(f"graph {name} takes {n_inputs} inputs, got {len(arrays)}")
        return plan(*arrays)

    run.plan = plan
    return run


def compile_source(source, filename):
    """Python code of generated source, registered with linecache for tracebacks."""
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    return builtins.compile(source, filename, "exec")


# ---------------------------------------------------------------- general plans

class _PlanWriter:
    def __init__(self, g):
        self.g = g
        self.env = {"np": np, "GuardFailure": GuardFailure}
        self.lines = []
        self.names = {}
        self.kernel_sources = []
        self.notes = {"kernels": 0, "numpy_calls": 0, "materialized": 0, "blocked_groups": 0}
        self.out_ids = {id(v) for v in g.outputs if isinstance(v, Value)}
        for j, v in enumerate(g.inputs):
            self.names[id(v)] = f"x{j}"
        self.blocks, self.joins = _plan_joins(g, self.out_ids)
        self.in_place = set()          # ids of blocks their producer wrote in place

    def const(self, obj, prefix="_c"):
        name = f"{prefix}{len(self.env)}"
        self.env[name] = obj
        return name

    def val(self, v):
        if isinstance(v, Lit):
            return self.const(v.value)
        return self.names[id(v)]

    def define(self, v):
        name = f"v{len(self.names)}"
        self.names[id(v)] = name
        if id(v) not in self.out_ids:
            self.notes["materialized"] += 1
        return name

    def emit(self, line):
        self.lines.append("    " + line)

    def block_view(self, v, contiguous):
        """Source of the view of its concatenation's result that `v` may be written
        into (a block, _plan_joins), None if it is none or not C-contiguous where
        `contiguous` is asked (a flat kernel's reshape(-1) would copy the view)."""
        b = self.blocks.get(id(v))
        if b is None:
            return None
        c = v
        while id(c) in self.blocks:            # a block of a block: all of them contiguous
            parent, _, contig = self.blocks[id(c)]
            if contiguous and not contig:
                return None
            c = parent
        parent, idx, _ = b
        return f"{self.names[id(parent)]}[{self.const(idx, '_ix')}]"


def _compile_plan(g, parallel, use_disk):
    w = _PlanWriter(g)
    gi = 0
    numpy_0d = set()
    # A NumPy call's result whose shape the trace guards (record._SHAPE_STATIC): the
    # guard's index, for the check right after the call (_emit_call).
    w.shape_guards = {id(n.inputs[0]): (k, n.fn) for k, n in enumerate(
        n for n in g.nodes if n.kind == GUARD) if n.fn.conv == "shape"}
    _emit_join_buffers(w)
    parts = {id(n): split_group(n) for n in g.nodes if n.kind == passes.FUSED}
    _plan_block_writes(w, parts, parallel)
    _plan_widened(w, parts, parallel)
    for n in g.nodes:
        if id(n) in w.joins:
            _emit_join(w, n)
        elif n.kind == GUARD:
            x = w.val(n.inputs[0])
            gname = w.const(n.fn, "_g")
            w.emit(f"if not {gname}.holds({x}):{_where(n)}")
            w.emit(f"    raise GuardFailure({gi}, {gname}.outcome({x}))")
            gi += 1
        elif n.kind == passes.FUSED:
            for part in parts[id(n)]:
                if part.kind != passes.FUSED:
                    _emit_call(w, part, numpy_0d)
                elif _no_kernel(part.fn):
                    for m in part.fn.graph.nodes:
                        _emit_call(w, m, numpy_0d)
                else:
                    _emit_group(w, *w.widened.get(id(part), (part, w.block_writes.get(
                        id(part), {}))), parallel, use_disk)
        else:
            _emit_call(w, n, numpy_0d)
    rets = []
    in_ids = {id(v) for v in g.inputs}
    for v in g.outputs:
        if isinstance(v, Lit):
            rets.append(f"np.array({w.const(v.value)})")
        elif id(v) in in_ids:
            rets.append(f"np.array({w.val(v)})")     # results are fresh arrays
        elif id(v) in numpy_0d:
            rets.append(f"np.asarray({w.val(v)})")
        else:
            rets.append(w.val(v))
    args = ", ".join(f"x{j}" for j in range(len(g.inputs)))
    plan = f"def plan({args}):\n" + "\n".join(w.lines) + \
        f"\n    return [{', '.join(rets)}]\n"
    run = _make_run(g, plan, w.env)
    source = "# plan\n" + plan + "".join(f"\n# kernel\n{s}" for s in w.kernel_sources)
    # kernels counts the plan's kernel calls; this, the numba functions they call (the
    # 30 cells of an unrolled loop: 30 calls of one kernel).
    w.notes["distinct_kernels"] = len(w.kernel_sources)
    return run, source, w.notes


def _plan_joins(g, out_ids):
    """The blocks of concatenations (ops whose joins_operands is an axis) that their
    producers may write in place: id(operand) -> (the concatenation's result, the
    block's index, the block is C-contiguous in it), and the ids of the
    concatenations with such blocks or whose result is one.

    Why: a concatenation copies its operands (W7's window: the four gate gradients of
    each step joined for one (30, 400) product, and the steps' blocks joined for the
    weight gradients, 39 copies, 1.5 of its 11.7 ms); a kernel can write its outputs
    into the result's blocks as cheaply as into arrays of their own. An operand is a
    block at most once (the first concatenation reading it claims it; a later one
    copies it) and never a graph input or output (results are arrays of their own, as
    eager's are); the result's buffer is allocated at the plan's start, and the
    concatenation copies in only the blocks their producers did not write
    (_emit_join)."""
    in_ids = {id(v) for v in g.inputs}
    # Blocks a kernel or a joined concatenation may write: a view (a transpose) or a
    # NumPy call's result is copied in anyway.
    made = {id(v) for n in g.nodes if n.kind == passes.FUSED or (
        isinstance(n.fn, Primitive) and n.fn.joins_operands(n) is not None)
        for v in n.outputs}
    blocks, owners = {}, []
    for n in g.nodes:
        if n.kind == passes.FUSED or not isinstance(n.fn, Primitive):
            continue
        axis = n.fn.joins_operands(n)
        if axis is None:
            continue
        seen = {}
        for v in n.inputs:
            if isinstance(v, Value):
                seen[id(v)] = seen.get(id(v), 0) + 1
        once = {k for k, c in seen.items() if c == 1}
        contig = all(d == 1 for d in n.out.shape[:axis])
        start, owns = 0, False
        for v in n.inputs:
            stop = start + v.shape[axis]
            if (id(v) in once and id(v) in made and id(v) not in blocks
                    and id(v) not in in_ids and id(v) not in out_ids
                    and v.dtype == n.out.dtype):
                blocks[id(v)] = (n.out, (slice(None),) * axis + (slice(start, stop),),
                                 contig)
                owns = True
            start = stop
        owners.append((n, owns))
    joins = {id(n) for n, owns in owners if owns or id(n.out) in blocks}
    return blocks, joins


def _emit_join_buffers(w):
    """The buffers of the joined concatenations, at the plan's start (their blocks'
    producers write into them): an array, or a view of the concatenation it is a block
    of (defined first: the later concatenation)."""
    for n in reversed(w.g.nodes):
        if id(n) not in w.joins:
            continue
        view = w.block_view(n.out, contiguous=False)
        name = w.define(n.out)
        if view is None:
            w.emit(f"{name} = np.empty({n.out.shape!r}, np.{n.out.dtype.name})"
                   f"   # {n.name}: its blocks are written in place")
        else:
            w.emit(f"{name} = {view}   # {n.name}, a block of a concatenation")
            w.in_place.add(id(n.out))


def _emit_join(w, n):
    """A joined concatenation: the blocks their producers did not write, copied in."""
    name = w.names[id(n.out)]
    axis = n.fn.joins_operands(n)
    done = [isinstance(v, Value) and id(v) in w.in_place
            and w.blocks.get(id(v), (None,))[0] is n.out for v in n.inputs]
    if not any(done):                 # one call, as the concatenation is
        ins = ", ".join(w.val(v) for v in n.inputs)
        w.emit(f"np.concatenate(({ins},), {axis}, out={name})   # {n.name}")
        w.notes["numpy_calls"] += 1
        return
    start = 0
    for v, d in zip(n.inputs, done):
        stop = start + v.shape[axis]
        if not d:
            idx = w.const((slice(None),) * axis + (slice(start, stop),), "_ix")
            w.emit(f"{name}[{idx}] = {w.val(v)}   # {n.name}: a block not written in place")
            w.notes["numpy_calls"] += 1
        start = stop


def _no_kernel(fn):
    """True when a fused part runs as its members' own forwards (NumPy), as eager does.

    Why: each kernel costs a numba compilation (0.05-0.1 s of CPU for a small one), and
    these parts gain nothing from one: 0-d ops on 0-d values (Adam's step-size
    arithmetic) have no loop, 1 us a NumPy call; one elementwise op without libm math on
    operands of one dtype and of the part's shape (a cast of a weight) is one SIMD ufunc
    pass in NumPy too. W6's step: 3 of its 12 kernels; W7's window: 2 of 14. Kept as
    kernels: a broadcast or mixed-dtype operand (NumPy's casting and broadcasting loops:
    W7's x * w, (30, 1) float64 by (1, 100) float32, 7 us against the kernel's 1.5), an
    index read (x[i] of an array, folded into the kernel), a lone transcendental op
    (vecmath's one pass against a composite NumPy forward), reductions (float64
    accumulation) and parts of two or more ops."""
    nodes = fn.graph.nodes
    if all(v.shape == () for n in nodes for v in list(n.inputs) + list(n.outputs)
           if isinstance(v, Value)):
        return True
    if len(nodes) != 1 or nodes[0].kind != "elementwise" or nodes[0].fn.vector_math:
        return False
    ins = [v for v in nodes[0].inputs if isinstance(v, Value)]
    return (all(v.shape == fn.shape for v in ins)
            and len({v.dtype for v in ins}) == 1)


def _emit_call(w, n, numpy_0d):
    f = w.const(n.fn.forward, "_f")
    ins = ", ".join(w.val(v) for v in n.inputs)
    outs = [w.define(v) for v in n.outputs]
    lhs = outs[0] if len(outs) == 1 else ", ".join(outs)
    w.emit(f"{lhs} = {f}({ins})   # {n.name}{_where(n, short=True)}")
    if not isinstance(n.fn, Primitive):
        # A NumPy call or a user Function replayed as is may give a result whose shape
        # depends on the data (np.unique(t), np.bincount(t), x[x > 0] in a forward):
        # the graph after it was traced for one shape (len(np.unique(t)) is a constant
        # of it), and a kernel reading another would read out of bounds. Checked.
        check = w.const(_check_result, "_chk")
        for v, o in zip(n.outputs, outs):
            if not all(isinstance(d, (int, np.integer)) for d in v.shape):
                continue                 # a symbolic extent: no one shape to hold
            guard = w.shape_guards.get(id(v))
            if guard is not None:
                # The trace's guard on this shape fails here, before anything reads
                # the result: another variant, or a trace for the new shape.
                gname = w.const(guard[1], "_g")
                w.emit(f"if not {gname}.holds({o}):")
                w.emit(f"    raise GuardFailure({guard[0]}, {gname}.outcome({o}))")
                continue
            what = f"{n.name}{' (' + n.line.strip() + ')' if n.line else ''}"
            w.emit(f"{check}({o}, {w.const(v.shape, '_shp')}, "
                   f"{w.const(v.dtype, '_dt')}, {w.const(what, '_what')})")
    w.notes["numpy_calls"] += 1
    # A NumPy function on 0-d arrays returns a NumPy scalar; eager's Function
    # makes it an array again (as_array), so a 0-d result is one here too.
    numpy_0d.update(id(v) for v in n.outputs if v.shape == ())


# A chain of one op longer than this (gradient accumulation g1 + g2 + ... + gN of an
# unrolled loop's weights) is cut into pieces of this many links and a remainder of 4,
# 2 and 1 links: one of a few structures each, so the kernels do not grow with N. The
# order of the operations is kept (bitwise the same values).
CHAIN_PIECE = 8


def split_group(node):
    """A fused group as its independent parts: one Fused node per part (in an order
    that respects what one reads of another), or the lone movement node of a part that
    is only a read of an input.

    Why: horizontal fusion puts unrelated chains of one iteration shape into one group
    (Adam's update of four parameters, the 30 steps' loss gradients of an unrolled
    loop), and numba + LLVM compile time grows faster than linearly in a kernel's size
    (a 16-output Adam kernel: 5.8 s; one parameter's: 0.6 s). Split, the parts are
    structurally identical, so they share one kernel (one source text: one dispatcher,
    in process and on disk) and compile once. Parts stay joined where fusion saves
    memory traffic: through a value one computes in its loops and the other reads, or
    an input both read whole at the iteration shape (sin(x) and cos(x) read x once).
    Reads of 0-d inputs, broadcast operands and indexed reads (xs[i]) do not join; a
    0-d epilogue (loss = loss + mean(...) of each step) goes with the part of its last
    operand and reads the others' scalars as inputs; a loop-invariant chain (the
    backward's seed, broadcast) is copied into each part that reads it.
    """
    fn = node.fn
    sub = fn.graph
    nodes = sub.nodes
    if len(nodes) < 2:
        return [node]
    roles = K._roles(fn)
    role = [roles[id(n)] for n in nodes]
    parent = list(range(len(nodes)))

    def find(i):
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    def union(i, j):
        parent[find(i)] = find(j)

    producer = {id(v): i for i, n in enumerate(nodes) for v in n.outputs}

    def made(n):
        return [producer[id(v)] for v in n.inputs if isinstance(v, Value) and id(v) in producer]
    invariant = set()
    for i, n in enumerate(nodes):
        if role[i] in ("main", "load") and all(
                (producer[id(v)] in invariant) if id(v) in producer else v.shape == ()
                for v in n.inputs if isinstance(v, Value)):
            invariant.add(i)
    whole_readers = {}
    for i, n in enumerate(nodes):
        inner = [j for j in made(n) if j not in invariant or i in invariant]
        if role[i] == "epi":
            if inner:
                union(i, max(inner))
            continue
        for j in inner:
            union(i, j)
        for v in n.inputs:
            if (isinstance(v, Value) and id(v) not in producer and v.shape == fn.shape
                    and v.shape != () and n.kind != "movement"):
                union(i, whole_readers.setdefault(id(v), i))
    out_ids = {id(v) for v in sub.outputs}
    comps = {}
    for i in range(len(nodes)):
        if i not in invariant:
            comps.setdefault(find(i), []).append(i)
    pieces = []
    for members in comps.values():
        pieces.extend(_chain_pieces(nodes, members, producer, out_ids))
    if len(pieces) <= 1:
        return [node]
    part_of = {}
    for p, members in enumerate(pieces):
        for i in members:
            part_of[i] = p
    # What a part reads of another: 0-d epilogue operands, a chain piece's partial result.
    needs = [set() for _ in pieces]
    exported = set()
    for i, n in enumerate(nodes):
        if i in invariant:
            continue
        for j in made(n):
            if j not in invariant and part_of[j] != part_of[i]:
                needs[part_of[i]].add(part_of[j])
                exported.update(id(v) for v in nodes[j].outputs)
    order = _topo(pieces, needs)
    if order is None:
        return [node]
    def with_invariants(members):
        """members and the invariant chains they read (copied into each part that does:
        a part reads no value of another part but the exported ones)."""
        members = set(members)
        todo = list(members)
        while todo:
            for j in made(nodes[todo.pop()]):
                if j in invariant and j not in members:
                    members.add(j)
                    todo.append(j)
        return members
    parts_nodes = [with_invariants(pieces[p]) for p in order]
    # Invariant values no part reads (a group output such as broadcast(s) * t): a part
    # of their own, with the chains they read, even those other parts copy too.
    unread = invariant.difference(*parts_nodes)
    if unread:
        parts_nodes.insert(0, with_invariants(unread))
    out_ids |= exported
    written = set()                         # an output shared by parts: the first writes it
    parts = []
    for idx in parts_nodes:
        members = [nodes[i] for i in sorted(idx)]
        own = {id(v) for n in members for v in n.outputs}
        inputs, seen = [], set()
        for n in members:              # first-use order, as fusion orders a group's
            for v in n.inputs:
                if isinstance(v, Value) and id(v) not in own and id(v) not in seen:
                    seen.add(id(v))
                    inputs.append(v)
        outputs = [v for n in members for v in n.outputs
                   if id(v) in out_ids and id(v) not in written]
        written.update(id(v) for v in outputs)
        if not outputs:
            continue                   # nothing of it is used (fusion keeps no such part)
        if len(members) == 1 and members[0].kind == "movement":
            parts.append(members[0])   # a lone read of an input: a NumPy call (a view)
            continue
        g = Graph(f"{sub.name}_{len(parts)}", inputs, members, outputs)
        parts.append(Node(fusion.Fused(g, fn.shape), inputs, outputs, node.line))
    return parts


def _chain_pieces(nodes, members, producer, out_ids):
    """members (node indices, in order) as pieces: each chain of more than CHAIN_PIECE
    links of one elementwise op (each link reads the one before and inputs of the group,
    and is the only reader of the one before) in pieces of CHAIN_PIECE, 4, 2 and 1
    links, the last of them with the rest of the members."""
    if len(members) <= CHAIN_PIECE:
        return [members]
    mset = set(members)
    readers = {}
    for i in members:
        for v in nodes[i].inputs:
            if isinstance(v, Value) and id(v) in producer:
                readers.setdefault(producer[id(v)], []).append(i)
    prev = {}
    for i in members:
        n = nodes[i]
        inner = [producer[id(v)] for v in n.inputs if isinstance(v, Value) and id(v) in producer]
        if n.kind != "elementwise" or len(inner) != 1 or len(n.outputs) != 1:
            continue
        a = inner[0]
        m = nodes[a]
        if (a in mset and m.kind == "elementwise" and m.op is n.op and m.params == n.params
                and readers.get(a) == [i] and id(m.out) not in out_ids
                and len(m.outputs) == 1):
            prev[i] = a
    heads = set(prev.values()) - set(prev)
    nxt = {a: i for i, a in prev.items()}
    cut = []
    for h in sorted(heads):
        chain = [h]
        while chain[-1] in nxt:
            chain.append(nxt[chain[-1]])
        if len(chain) <= CHAIN_PIECE or any(
                producer.get(id(v)) not in (None, p) for p, c in zip([None] + chain, chain)
                for v in nodes[c].inputs if isinstance(v, Value)):
            continue      # short, or a link reads another member: stays with the rest
        k = 0
        while True:
            size = CHAIN_PIECE
            while size > len(chain) - k:
                size //= 2
            if k + size >= len(chain):
                break                           # the last piece stays with the rest
            cut.append(chain[k:k + size])
            k += size
    if not cut:
        return [members]
    taken = {i for piece in cut for i in piece}
    return cut + [[i for i in members if i not in taken]]


def _topo(pieces, needs):
    """An order of the parts in which each comes after those it reads (the first
    member's position breaks ties), or None if they read each other in a cycle."""
    import heapq
    succ = [[] for _ in pieces]
    indeg = [len(ns) for ns in needs]
    for p, ns in enumerate(needs):
        for q in ns:
            succ[q].append(p)
    heap = [(pieces[p][0], p) for p in range(len(pieces)) if indeg[p] == 0]
    heapq.heapify(heap)
    out = []
    while heap:
        _, p = heapq.heappop(heap)
        out.append(p)
        for q in succ[p]:
            indeg[q] -= 1
            if indeg[q] == 0:
                heapq.heappush(heap, (pieces[q][0], q))
    return out if len(out) == len(pieces) else None


class ResultChanged(RuntimeError):
    """A NumPy call or user Function replayed in a compiled call gave a result of
    another shape or dtype than when traced: the variant cannot run this call (it is
    demoted: the signature runs eagerly, warned)."""


def _check_result(y, shape, dtype, what):
    got_shape, got_dtype = np.shape(y), np.asarray(y).dtype
    if got_shape != shape or got_dtype != dtype:
        raise ResultChanged(f"{what} gave a result of shape {got_shape} and dtype "
                            f"{got_dtype} where the traced call's was {shape} {dtype}: "
                            f"its result's shape depends on the data")


def _where(n, short=False):
    if not n.line:
        return ""
    return f"  # {n.line}" if not short else f"  {n.line}"


def _numpy_math_group(fn):
    size = int(np.prod(fn.shape, dtype=np.int64))
    if not fn.shape or size < NUMPY_MATH_MIN:
        return False
    if any(n.kind == "movement" and not _view_load(fn, n) for n in fn.graph.nodes):
        return False
    # float64 kernels call tracejit.backends.numba.vecmath (vectorized, fused): no NumPy
    # blocks. float32 ones keep NumPy's ufuncs, whose float32 SIMD math is as fast
    # (bench_vecmath).
    return any(n.out.dtype == np.float32 and n.fn.vector_math for n in fn.graph.nodes)


def _view_load(fn, n):
    """A basic-index read of a group input that the blocked path takes as a NumPy view."""
    sub = fn.graph
    return (n.fn.view_index(n) is not None
            and any(n.inputs[0] is v for v in sub.inputs)
            and not any(n.out is v for v in sub.outputs))


def _emit_group(w, node, out_blocks, parallel, use_disk):
    fn = node.fn
    if _numpy_math_group(fn):
        _emit_blocked(w, node, parallel)
        return
    spec = w.specs.get(id(node)) or K.loop_kernel(fn, _parallel(fn, parallel), out_blocks)
    kern = _cache.kernel(spec.source, spec.name, disk=use_disk)
    kname = w.const(kern, "_k")
    if _background.enabled() and not kern.signatures:
        w.env[kname] = _background.Tiered(w.env, kname, kern, spec, fn)
    if spec.source not in w.kernel_sources:
        w.kernel_sources.append(spec.source)
    w.notes["kernels"] += 1
    args = []
    # A flat kernel (K.flat_elementwise) takes every array flattened: a view, or a copy
    # of an input that is not C-contiguous.
    flat = ".reshape(-1)" if spec.flat else ""
    for v in spec.inputs:
        if isinstance(v, Lit):      # a lifted epilogue literal (K._lift_epilogue_literals)
            # writable, as the 0-d inputs it stands for (numba types a read-only array
            # as another signature: a second compile); the kernel only reads it
            args.append(w.const(np.asarray(v.value), "_lit"))
            continue
        x = w.val(v)
        args.append(f"np.asarray({x})" if v.shape == () else x + flat)
    for v in spec.outputs:
        view = w.block_view(v, contiguous=spec.flat)
        o = w.define(v)
        if view is None:
            w.emit(f"{o} = np.empty({v.shape!r}, np.{v.dtype.name})")
        else:
            w.emit(f"{o} = {view}   # written in place: a block of a concatenation")
            w.in_place.add(id(v))
        if id(v) in w.strided:        # the kernel writes the buffer at the block
            args.append(w.names[id(w.blocks[id(v)][0])])
        else:
            args.append(o + flat)
    finals = []
    for rn, combine, axes, acc in spec.reductions:
        a = f"{acc}_{len(w.names)}"
        out = rn.out
        w.emit(f"{a} = {_acc_init(rn, out.shape)}")
        if combine.identity is None and any(fn.shape[k] == 0 for k in axes) and out.size:
            w.emit(_no_identity(combine))
        args.append(a)
        finals.append((rn, a))
    for v in spec.epilogue_outputs:
        e = w.define(v)
        w.emit(f"{e} = np.empty((), np.{v.dtype.name})")
        args.append(e)
    args += [str(c) for c in spec.statics]   # int indices, slice starts
    args += [str(d) for d in spec.shape]     # loop extents (flattened: the size)
    args += [str(c) for c in spec.consts]    # index constants for this call's shapes
    call = f"{kname}({', '.join(args)})   # {fn.label}{_where(node, short=True)}"
    if spec.name.find("_par_") >= 0 and not _cache.THREADSAFE_PARALLEL:
        w.env["_plock"] = _cache.PARALLEL_LOCK
        w.emit("with _plock:")
        w.emit("    " + call)
    else:
        w.emit(call)
    for rn, a in finals:
        if id(rn.out) not in {id(v) for v in node.outputs}:
            continue
        r = w.define(rn.out)
        if rn.out.dtype == np.float64:
            w.emit(f"{r} = {a}")
        else:
            w.emit(f"{r} = {a}.astype(np.{rn.out.dtype.name})")


def _parallel(fn, parallel):
    """prange for this group's kernel: by size (parallel None), else as forced."""
    size = int(np.prod(fn.shape, dtype=np.int64))
    return ((size >= PARALLEL_MIN) if parallel is None else bool(parallel)) and \
        len(fn.shape) > 0


def _strided_block(w, v, shape):
    """(axis, start) when output v of a group of iteration shape `shape` is a strided
    block (not C-contiguous) of a C-contiguous concatenation buffer, else None. Blocks
    of a block that is itself strided keep their view."""
    b = w.blocks.get(id(v))
    if b is None or b[2] or v.shape != shape:
        return None
    parent, idx, _ = b
    if id(parent) in w.blocks and w.block_view(parent, contiguous=True) is None:
        return None
    axis = len(idx) - 1
    return axis, idx[axis].start


WIDEN_MISSING_ADDENDS = True    # False: no group takes another's kernel (_plan_widened)
_MAX_SLOTS = 3                  # addends per structure tried (2**3 - 1 subsets)


def _plan_widened(w, parts, parallel):
    """Groups run with the kernel of a larger group of the plan that is their structure
    plus additions of inputs: w.widened[id(part)] = (the part with those additions,
    each of a -0.0 array, its out_blocks).

    Why: an unrolled loop's backward adds the gradient flowing from the next step
    (dh + ..., dc + ...) in every step but the last, whose gate-gradient group is the
    others' without those adds: a second structure, a second numba compile (W7: 0.5 s
    of CPU) for one call a window. x + (-0.0) is x bitwise for every x (+0.0, -0.0,
    NaN included; + 0.0 would turn -0.0 into +0.0), so that group computes the same
    values with the general kernel given -0.0 for the missing addends, at the cost of
    reading them. Taken only where the larger structure has more groups in the plan,
    and only when the widened group's source is that kernel's source, text for text."""
    w.widened = {}
    w.specs = {}                   # id(part) -> its KernelSpec (_emit_group takes it)
    if not WIDEN_MISSING_ADDENDS:
        return
    found = []                     # (part, out_blocks, source)
    count = {}
    for ps in parts.values():
        for part in ps:
            fn = part.fn
            if part.kind != passes.FUSED or _no_kernel(fn) or _numpy_math_group(fn):
                continue
            blocks = w.block_writes.get(id(part), {})
            spec = w.specs[id(part)] = K.loop_kernel(fn, _parallel(fn, parallel), blocks)
            src = spec.source
            found.append((part, blocks, src))
            count[src] = count.get(src, 0) + 1
    reduced = {}                   # source of a structure less some adds -> (B, slots)
    seen = set()
    for part, blocks, src in found:
        if src in seen:
            continue
        seen.add(src)
        slots = _addend_slots(part.fn)[:_MAX_SLOTS]
        for mask in range(1, 1 << len(slots)):
            drop = [sl for k, sl in enumerate(slots) if mask >> k & 1]
            r = _without_adds(part.fn, drop)
            rsrc = K.loop_kernel(r, _parallel(r, parallel), blocks).source
            reduced.setdefault(rsrc, (part, drop, src))
    for part, blocks, src in found:
        hit = reduced.get(src)
        if hit is None or hit[2] == src or count[hit[2]] <= count[src]:
            continue
        wide = _with_adds(part, hit[0].fn, hit[1])
        if wide is None:
            continue
        spec = K.loop_kernel(wide.fn, _parallel(wide.fn, parallel), blocks)
        if spec.source != hit[2]:
            continue
        w.specs[id(wide)] = spec
        own = {id(v) for v in part.fn.graph.inputs}
        for z in wide.fn.graph.inputs:
            if id(z) not in own:
                w.names[id(z)] = w.const(np.full(z.shape, -0.0, z.dtype), "_negzero")
        w.widened[id(part)] = (wide, blocks)


def _addend_slots(fn):
    """(node index, operand index) of the adds of group fn that add a group input read
    by that add alone, of the add's shape (the iteration shape) and float dtype, to a
    value of that shape and dtype, the add's result not being a group output."""
    sub = fn.graph
    readers = {}
    for n in sub.nodes:
        for v in n.inputs:
            readers[id(v)] = readers.get(id(v), 0) + 1
    ins = {id(v) for v in sub.inputs}
    outs = {id(v) for v in sub.outputs}
    slots = []
    for i, n in enumerate(sub.nodes):
        if (n.kind != "elementwise" or len(n.inputs) != 2 or len(n.outputs) != 1
                or n.fn.kernel_template(n)[0] != "{0} + {1}" or id(n.out) in outs
                or n.out.dtype.kind != "f" or n.out.shape != fn.shape):
            continue
        for k in (0, 1):
            x, u = n.inputs[k], n.inputs[1 - k]
            if (isinstance(x, Value) and isinstance(u, Value) and id(x) in ins
                    and readers[id(x)] == 1 and x.shape == u.shape == n.out.shape
                    and x.dtype == u.dtype == n.out.dtype):
                slots.append((i, k))
                break
    return slots


def _without_adds(fn, drop):
    """Group fn with the adds `drop` ((node index, operand index of the input)) removed:
    their readers read the add's other operand; the inputs they added are gone."""
    sub = fn.graph
    nodes = sub.nodes
    repl = {}
    for i, k in drop:               # in order: an add of an add dropped reads its operand
        u = nodes[i].inputs[1 - k]
        repl[id(nodes[i].out)] = repl.get(id(u), u)
    gone = {id(nodes[i].inputs[k]) for i, k in drop}
    kept = []
    for i, n in enumerate(nodes):
        if id(n.out) in repl:
            continue
        ins = [repl.get(id(v), v) if isinstance(v, Value) else v for v in n.inputs]
        kept.append(Node(n.fn, ins, n.outputs, n.line))
    r = Graph(sub.name, [v for v in sub.inputs if id(v) not in gone], kept, sub.outputs)
    return fusion.Fused(r, fn.shape)


def _with_adds(part, big, drop):
    """Group `part` rebuilt as the structure of group `big` (part is big without the
    adds `drop`, node for node and input for input, as their kernel sources say): its
    own nodes, values and literals, and big's adds of new inputs (-0.0 arrays of part's
    iteration shape). None when the correspondence does not hold."""
    fn, sub, bsub = part.fn, part.fn.graph, big.graph
    drop_nodes = {i: k for i, k in drop}
    gone = {id(bsub.nodes[i].inputs[k]) for i, k in drop}
    kept_nodes = [i for i in range(len(bsub.nodes)) if i not in drop_nodes]
    kept_ins = [v for v in bsub.inputs if id(v) not in gone]
    if len(kept_nodes) != len(sub.nodes) or len(kept_ins) != len(sub.inputs):
        return None
    phi = {id(b): a for b, a in zip(kept_ins, sub.inputs)}
    for p, q in enumerate(kept_nodes):
        a, b = sub.nodes[p], bsub.nodes[q]
        if a.op is not b.op or len(a.outputs) != len(b.outputs) or len(a.inputs) != len(b.inputs):
            return None
        phi.update({id(bv): av for bv, av in zip(b.outputs, a.outputs)})
    nodes, new_ins = [], {}
    added = {}                     # id(an added -0.0 sum) -> the part's value it equals
    it = iter(sub.nodes)
    for q, b in enumerate(bsub.nodes):
        if q in drop_nodes:
            x = b.inputs[drop_nodes[q]]
            z = new_ins[id(x)] = phi[id(x)] = Value(fn.shape, x.dtype)
            out = phi[id(b.out)] = Value(fn.shape, b.out.dtype)
            ins = [phi.get(id(v)) for v in b.inputs]
            if any(v is None for v in ins):
                return None
            u = ins[1 - drop_nodes[q]]
            added[id(out)] = added.get(id(u), u)
            nodes.append(Node(b.fn, ins, [out], b.line))
            continue
        a = next(it)
        ins = []
        for bv, av in zip(b.inputs, a.inputs):
            if isinstance(bv, Value) != isinstance(av, Value):
                return None
            ins.append(phi.get(id(bv)) if isinstance(bv, Value) else av)
        # the soundness check, whatever the sources say: with the adds of -0.0 skipped,
        # each node reads what it read in part
        if any(v is None for v in ins) or any(
                added.get(id(v), v) is not av for v, av in zip(ins, a.inputs)):
            return None
        nodes.append(Node(a.fn, ins, a.outputs, a.line))
    if len(bsub.outputs) != len(sub.outputs) or any(
            phi.get(id(b)) is not a for b, a in zip(bsub.outputs, sub.outputs)):
        return None
    inputs = [phi[id(v)] for v in bsub.inputs]
    g = Graph(sub.name, inputs, nodes, sub.outputs)
    return Node(fusion.Fused(g, fn.shape), list(part.inputs) + list(new_ins.values()),
                part.outputs, part.line)


def _plan_block_writes(w, parts, parallel):
    """Which outputs each loop kernel writes through a buffer at a block
    (K.loop_kernel's out_blocks): w.block_writes[id(part)] = {id(output): (axis,
    start)}, and w.strided, the outputs whose argument is their concatenation's buffer.

    Why: a strided block's view costs numba its vector stores (kernels._unsigned), so
    the kernel takes the buffer and writes it at start + i. Groups of one structure
    must stay one kernel source: an output position that is a strided block in any
    group of a structure is written at start + i in all of them, the others passing
    their own array (or contiguous block) with start 0 (the small LSTM's cells, whose
    gate gradients are column blocks in some steps and row blocks in others)."""
    w.block_writes, w.strided = {}, {}
    if not COLUMN_BLOCK_WRITES:
        return
    groups = []                    # (part, base source, outputs, strided positions)
    union = {}                     # base source -> {position: axis}
    labels = set()                 # (label, rank) of those structures: a cheap filter
    for ps in parts.values():
        for part in ps:
            fn = part.fn
            if part.kind != passes.FUSED or _no_kernel(fn) or _numpy_math_group(fn):
                continue
            if K.flat_elementwise(fn) or not any(
                    _strided_block(w, v, fn.shape) for v in part.outputs):
                groups.append((part, None, None, None))
                continue
            base = K.loop_kernel(fn, _parallel(fn, parallel))
            found = {j: _strided_block(w, v, fn.shape) for j, v in enumerate(base.outputs)}
            found = {j: b for j, b in found.items() if b is not None}
            pos = union.setdefault(base.source, {})
            labels.add((fn.label, len(fn.shape)))
            for j, (axis, _) in found.items():
                pos[j] = axis if pos.get(j, axis) == axis else None
            groups.append((part, base.source, base.outputs, found))
    # Groups with no strided output whose structure has some: their base source.
    for i, (part, src, outs, found) in enumerate(groups):
        if src is None and (part.fn.label, len(part.fn.shape)) in labels:
            base = K.loop_kernel(part.fn, _parallel(part.fn, parallel))
            if base.source in union:
                groups[i] = (part, base.source, base.outputs, {})
    for part, src, outs, found in groups:
        if src is None:
            continue
        writes = {}
        for j, axis in union[src].items():
            if axis is None:
                continue
            v = outs[j]
            if j in found and found[j][0] == axis:
                writes[id(v)] = found[j]
                w.strided[id(v)] = found[j]
            else:
                writes[id(v)] = (axis, 0)     # its own array (or a contiguous block)
        w.block_writes[id(part)] = writes


def _acc_init(n, shape):
    """Source of a float64 accumulator array for reduction node n, at its identity."""
    x = n.fn.reduction_identity
    if x == 0:
        return f"np.zeros({shape!r})"
    return f"np.full({shape!r}, {K.float_text(x)})"


def _no_identity(combine):
    # NumPy's error for max / min over zero elements.
    return (f"raise ValueError('zero-size array to reduction operation "
            f"{combine.__name__} which has no identity')")


def _emit_blocked(w, node, parallel=None):
    """A group as NumPy ufuncs on blocks of rows: each member's own forward."""
    fn = node.fn
    sub = fn.graph
    shape = fn.shape
    rows = max(1, BLOCK // max(1, int(np.prod(shape[1:], dtype=np.int64))))
    w.notes["blocked_groups"] += 1
    out_ids = {id(v) for v in node.outputs}
    roles = K._roles(fn)
    w.notes["numpy_calls"] += sum(roles[id(n)] != "load" for n in sub.nodes)
    local = {}
    w.emit(f"# {fn.label}: NumPy ufuncs on blocks of {rows} rows (SIMD math, "
           f"cache-resident temporaries){_where(node)}")
    acc_of = {}
    for n in sub.nodes:
        role = roles[id(n)]
        for v in n.outputs:
            if id(v) in out_ids and role == "main":
                o = w.define(v)
                w.emit(f"{o} = np.empty({v.shape!r}, np.{v.dtype.name})")
        if role == "red":
            axes, _ = K.reduced_axes(n, len(shape))
            a = f"acc{len(w.names)}_{len(acc_of)}"
            combine = n.fn.reduction_combine
            if 0 in axes:
                init = _acc_init(n, n.out.shape)
            else:
                init = f"np.empty({n.out.shape!r}, np.{n.out.dtype.name})"
            if combine.identity is None and shape[0] == 0 and n.out.size:
                w.emit(_no_identity(combine))
            w.emit(f"{a} = {init}")
            acc_of[id(n)] = (a, 0 in axes, combine)
    # Blocks split across threads when the group is large and no accumulator is shared
    # (NumPy's ufuncs release the GIL, so the two halves run on two cores).
    threaded = (parallel is not False and shape[0] >= 2 * rows
                and int(np.prod(shape, dtype=np.int64)) >= THREADED_BLOCKS_MIN
                and not any(over0 for _, over0, _ in acc_of.values()))
    # x[1:] and friends: basic indexing is a view (no copy), blocked like an input.
    views = []
    for n in sub.nodes:
        if roles[id(n)] == "load":
            key = w.const(n.fn.view_index(n), "_ix")
            name = f"view{len(w.env)}"
            w.emit(f"{name} = {w.val(n.inputs[0])}[{key}]   # {n.name}, a view")
            views.append((n.out, name))
    if threaded:
        blk = f"_blk{len(w.env)}"
        w.emit(f"def {blk}(start, stop):")
        w.emit(f"    for lo in range(start, stop, {rows}):")
        pad = "        "
    else:
        w.emit(f"for lo in range(0, {shape[0]}, {rows}):")
        pad = "    "
    for v, x in [(v, w.val(v)) for v in sub.inputs] + views:
        if len(v.shape) == len(shape) and v.shape[0] == shape[0] and shape[0] != 1:
            local[id(v)] = f"b_{x}"
            w.emit(pad + f"b_{x} = {x}[lo:lo + {rows}]")
        else:
            local[id(v)] = x
    for i, n in enumerate(sub.nodes):
        role = roles[id(n)]
        if role in ("epi", "load"):
            continue
        f = w.const(n.fn.forward, "_f")
        ins = ", ".join(local[id(v)] if isinstance(v, Value) else w.const(v.value)
                        for v in n.inputs)
        if role == "red":
            a, over0, combine = acc_of[id(n)]
            if not over0:
                w.emit(pad + f"{a}[lo:lo + {rows}] = {f}({ins})")
            elif combine is np.add:
                w.emit(pad + f"{a} += {f}({ins})")
            else:
                w.emit(pad + f"np.{combine.__name__}({a}, {f}({ins}), out={a})")
            continue
        t = f"b{i}"
        local[id(n.out)] = t
        w.emit(pad + f"{t} = {f}({ins})   # {n.name}")
        if id(n.out) in out_ids:
            w.emit(pad + f"{w.names[id(n.out)]}[lo:lo + {rows}] = {t}")
    if threaded:
        w.emit(f"{w.const(run_blocks, '_rb')}({blk}, {shape[0]}, {rows})")
    for n in sub.nodes:
        if roles[id(n)] == "red":
            a, _, _ = acc_of[id(n)]
            v = n.out
            expr = a if v.dtype == np.float64 or not acc_of[id(n)][1] else \
                f"{a}.astype(np.{v.dtype.name})"
            r = w.define(v) if id(v) in out_ids else f"red{len(local)}"
            w.emit(f"{r} = {expr}")
            local[id(v)] = r
    for n in sub.nodes:
        if roles[id(n)] != "epi":
            continue
        f = w.const(n.fn.forward, "_f")
        ins = ", ".join(local[id(v)] if isinstance(v, Value) else w.const(v.value)
                        for v in n.inputs)
        r = w.define(n.out) if id(n.out) in out_ids else f"ep{len(local)}"
        local[id(n.out)] = r
        # NumPy gives a scalar for an op on 0-d arrays; a result's .data is a 0-d array
        # (mean of float32 tanh: .data was np.float32 where eager's is an ndarray)
        call = f"np.asarray({f}({ins}))" if n.out.shape == () else f"{f}({ins})"
        w.emit(f"{r} = {call}   # {n.name}")

