"""numba source for one fused group (loop kernel) or a whole scalar graph.

Part of codegen (trace -> IR -> passes -> codegen): reads a `Fused` node's subgraph and
writes readable Python/numba source from each primitive's `expr`. The source depends on
structure only (ops, parameters, literals, dtypes, ranks, which operand axes broadcast),
never on sizes: loop extents are arguments, so a new shape reuses the kernel.

Numerics follow NumPy: literals and parameters are typed to the array dtype (numba
types a bare 1.5 as float64, which would silently compute float32 kernels in float64),
each intermediate is cast to its IR dtype, float32 sums accumulate in float64, and
error_model='numpy' gives inf/nan for x / 0 instead of an exception. fastmath is off.
A sum's accumulator add is vm.acc_add, the one instruction with 'reassoc' (so the sum
vectorizes; LLVM keeps a callee's flags when inlining): 'reassoc' on the whole kernel
also reassociated the fused producers ((x * 3.0) * (1 / 3.0) became x). Not 'contract'
either: an FMA makes x * 1000 - y in a reduction kernel differ from the same value
computed elsewhere (eager, or the backward's recompute), and max's gradient mask
(x == max) then matched nothing: a lost gradient.
"""
import hashlib
import re

import numpy as np

from tracejit.backends.numba import cache as _cache
from tracejit.ir import Lit, Value

_FLOAT_LIT = re.compile(r"(?<![\w.])(\d+\.\d*(?:[eE][-+]?\d+)?)")
_NP_NAME = {np.dtype("f4"): "np.float32", np.dtype("f8"): "np.float64"}


def lit_text(value, dtype):
    """A literal of `dtype` as numba source (typed: float32 stays float32)."""
    dtype = np.dtype(dtype)
    if dtype.kind == "b":
        return "True" if bool(value) else "False"
    if dtype.kind in "iu":
        return repr(int(value))
    x = float(value)
    if x != x:
        s = "np.nan"
    elif x in (float("inf"), float("-inf")):
        s = "np.inf" if x > 0 else "(-np.inf)"
    else:
        s = repr(x)
    if dtype == np.float32:
        return f"np.float32({s})"
    return f"({s})" if s.startswith("-") else s


def _template(n, dtype):
    """The op's kernel template for node n (Primitive.kernel_template), its float
    literals and numeric parameters typed to `dtype`."""
    expr, params = n.fn.kernel_template(n)
    if dtype.kind == "f" and dtype != np.float64:
        expr = _FLOAT_LIT.sub(lambda m: f"{_NP_NAME[dtype]}({m.group(1)})", expr)
    params = {p: lit_text(v, dtype) if isinstance(v, (int, float)) and not isinstance(v, bool)
              else v for p, v in params.items()}
    return expr, params


# libm calls in an expression -> tracejit.backends.numba.vecmath (branch-free, inlined: a loop
# of them vectorizes). sin/cos take the fast path, exact for |x| <= vm.TRIG_MAX; the
# kernel counts arguments beyond it and reruns its loops with libm if there are any.
_VECTOR_MATH = {"math.exp(": "vm.exp{b}(", "math.log(": "vm.log{b}(",
                "math.tanh(": "vm.tanh{b}(", "math.sin(": "vm.sin{b}_fast(",
                "math.cos(": "vm.cos{b}_fast("}


def node_expr(n, operands, vector_math=False):
    """Source of node n's value from operand source strings, cast to its dtype.
    vector_math: float libm calls become tracejit.backends.numba.vecmath calls."""
    dtype = n.out.dtype
    calc_dtype = dtype if dtype.kind == "f" else _operand_float(n)
    if vector_math and calc_dtype in _NP_NAME and n.fn.vector_math:
        # vecmath takes floats only (libm's math.tanh took an int64 too)
        operands = [o if isinstance(v, Value) and v.dtype == calc_dtype
                    else f"{_NP_NAME[calc_dtype]}({o})" for v, o in zip(n.inputs, operands)]
    expr, params = _template(n, calc_dtype)
    body = expr.format(*operands, **params)
    if vector_math and calc_dtype in _NP_NAME:
        bits = "32" if calc_dtype == np.float32 else "64"
        for libm, vm in _VECTOR_MATH.items():
            body = body.replace(libm, vm.format(b=bits))
    if dtype.kind == "f" and not _typed_as(n, expr, dtype):
        return f"{_NP_NAME[dtype]}({body})"
    return f"({body})"


# Binary arithmetic templates: numba types a + b, a - b, a * b, a / b of a float64 and a
# float32 (or int, bool) operand as float64, computed in float64, as NumPy does.
_ARITHMETIC = frozenset(("{0} + {1}", "{0} - {1}", "{0} * {1}", "{0} / {1}"))


def _typed_as(n, expr, dtype):
    """True when numba already types node n's expression as its IR dtype, so no cast is
    written: each cast costs compile time (typing a call; W7's 10 kernels had 47).
    float64 in, float64 out (numba's arithmetic on float64 stays float64); binary
    arithmetic with a float64 operand (a float64 literal is a bare float, typed
    float64); a cast's own template (np.float32(x) is not cast twice)."""
    if dtype == np.float64 and all(v.dtype == np.float64 for v in n.inputs):
        return True
    if dtype == np.float64 and expr in _ARITHMETIC and any(
            v.dtype == np.float64 for v in n.inputs):
        return True
    return dtype in _NP_NAME and expr == f"{_NP_NAME[dtype]}({{0}})"


def _operand_float(n):
    for v in n.inputs:
        if v.dtype.kind == "f":
            return v.dtype
    return np.dtype("f8")


def operand_text(v, names):
    if isinstance(v, Lit):
        return lit_text(v.value, v.dtype)
    return names[id(v)]


# ---------------------------------------------------------------- loop kernels

class KernelSpec:
    """What the plan needs to call a loop kernel: source, name and argument roles."""

    consts = ()                               # index constants (kernel args c0, c1, ...)
    flat = False                              # arrays passed as x.reshape(-1)
    statics = ()                              # shape-free ones (s0, s1, ...: before n0)
    out_blocks = {}                           # id(output) -> (axis, start): buffer passed

    def __init__(self, name, source, inputs, outputs, reductions, epilogue_outputs, shape):
        self.name = name
        self.source = source
        self.inputs = inputs                  # ext input Values, argument order
        self.outputs = outputs                # main outputs (shape = iteration shape)
        self.reductions = reductions          # (node, combine ufunc, axes, acc name)
        self.epilogue_outputs = epilogue_outputs
        self.shape = shape


def _roles(fused):
    sub = fused.graph
    shape = fused.shape
    roles = {}
    for n in sub.nodes:
        if n.kind == "reduction" and n.inputs[0].shape != ():
            roles[id(n)] = "red"
        elif n.kind == "movement":
            roles[id(n)] = "load"
        elif n.out.shape != shape:
            roles[id(n)] = "epi"
        else:
            roles[id(n)] = "main"
    return roles


def reduced_axes(n, rank):
    """Axes of the iteration space a reduction node sums over, and its output index."""
    return n.fn.reduced_axes(rank)


def float_text(x):
    """A float constant of a reduction's accumulator as source (0.0, np.inf, -np.inf)."""
    return "np.inf" if x == np.inf else "-np.inf" if x == -np.inf else repr(float(x))


def _index(idx):
    return "[" + ", ".join(idx) + "]" if idx else "[()]"


def flat_elementwise(fused):
    """True when the group is elementwise ops only over an iteration shape of rank >= 2
    that every non-0-d input and every value has: its kernel is then written as one
    loop over the flattened (C-order) arrays (loop_kernel), and the plan passes
    x.reshape(-1) of each (a view of a C-contiguous array, a copy otherwise: correct
    either way; it also means one layout, so no second numba specialization for a
    strided input).

    Why: the kernel's source is then that of a 1-d group of the same structure, so
    Adam's update of a weight matrix and of a bias vector, or the 2-d and the 1-d
    gradient accumulations of an unrolled loop, are one kernel (one numba compile, in
    process and on disk); and a 1-d loop compiles faster than nested ones (a 4-add
    kernel: 0.11 s against 0.18 s of CPU). W7's window went from 15 to 12 distinct
    kernels. Broadcast reads, index reads and reductions keep their loops."""
    shape = fused.shape
    if len(shape) < 2:
        return False
    sub = fused.graph
    if not sub.nodes or any(n.kind != "elementwise" or any(v.shape != shape for v in n.outputs)
                            for n in sub.nodes):
        return False
    return all(v.shape in ((), shape) for v in sub.inputs)


def _unsigned(e):
    """An index source as numba reads it without negative-index wraparound: computed
    indices (s0 + i1, a block's start plus the loop index) as uint64.

    Why: numba wraps a signed index that may be negative (idx + dim if idx < 0), and
    that select made LLVM give up the contiguous vector loads and stores: an LSTM
    gate-gradient kernel writing four column blocks of a (30, 400) buffer ran 4.3 us
    a call against 2.2 us with unsigned indices (the contiguous arrays' 1.8 us). Sound:
    an index a basic-index plan or a block computes is in [0, dim) wherever it is read
    (a masked read's index is read only where its conditions hold)."""
    return e if not UNSIGNED_INDEX or _PLAIN_INDEX.fullmatch(e) else f"np.uint64({e})"


_PLAIN_INDEX = re.compile(r"i\d+|\d+")
UNSIGNED_INDEX = True       # False: signed computed indices (benchmarks/ab_w7_sink.py)


def loop_kernel(fused, parallel, out_blocks=None):
    """KernelSpec of a loop kernel for `fused` (prange over one axis when parallel);
    spec.flat when its arrays are passed flattened (flat_elementwise).

    out_blocks: {id(output Value): (axis, start)} for outputs the plan writes into a
    column block of a C-contiguous concatenation buffer (plan._PlanWriter.blocks): the
    kernel takes the buffer and writes o[..., start + i_axis, ...] (start an argument
    s_k), a contiguous store, where the block's strided view cost numba its vector
    stores (kernels._unsigned; the 29 gate-gradient kernels of W7's window)."""
    sub = fused.graph
    out_blocks = out_blocks or {}
    flat = flat_elementwise(fused)
    if flat:
        out_blocks = {}
    shape = (int(np.prod(fused.shape, dtype=np.int64)),) if flat else fused.shape
    r = len(shape)
    roles = _roles(fused)
    names = {}
    in_names = {}
    inputs, lifted = _lift_epilogue_literals(sub, roles)
    for j, v in enumerate(inputs):
        in_names[id(v)] = f"a{j}"
    out_ids = {id(v) for v in sub.outputs}
    main_outs = [v for n in sub.nodes if roles[id(n)] in ("main", "load")
                 for v in n.outputs if id(v) in out_ids]
    epi_outs = [v for n in sub.nodes if roles[id(n)] == "epi"
                for v in n.outputs if id(v) in out_ids]
    reds = [n for n in sub.nodes if roles[id(n)] == "red"]
    red_info = []
    for k, n in enumerate(reds):
        axes, out_index = reduced_axes(n, r)
        red_info.append((n, axes, out_index, f"r{k}"))

    # Loop order and the prange axis. A prange iteration must own the slots it writes:
    # prange over an axis no reduction sums over (sum_to over a batch axis runs the
    # output axis outside), or, for full sums, over axis 0 with scalar reduction vars.
    order = list(range(r))
    prange_ok = False
    if parallel and r:
        free = [a for a in range(r) if all(a not in ax for _, ax, _, _ in red_info)]
        if free:
            order = [free[0]] + [a for a in range(r) if a != free[0]]
            prange_ok = True
        # Full sums stay serial: the prange loop's reduction variable is numba's parfor,
        # which wants +=, and the kernel has no 'reassoc' for it (see acc_add below);
        # in order it did not vectorize (mean(tanh(x)) of 4M: 4 times slower). Serial,
        # sum(x * x) of 4M float64 takes 1.0 ms (prange with reassoc: 0.6-0.7 ms).

    def ext_index(v):
        # "0" only on an axis that broadcasts (size 1 against a longer extent): an axis
        # whose extent is 1 is read at the loop index like any other, so the source of
        # a (1,) group is that of a (3,) one (see hoisting below for why that matters).
        if flat:
            return ["i0"] if v.shape else []
        q = len(v.shape)
        return [("0" if v.shape[k] == 1 and shape[k + r - q] != 1 else f"i{k + r - q}")
                for k in range(q)]

    def load_index(n, out_idx):
        """Index source of a movement chain down to a group input (Primitive.index_read:
        the op maps its output index to its input's, with conditions for a masked read)."""
        u = n.inputs[0]
        idx, conds = n.fn.index_read(n, out_idx, const, leaf_name(u))
        inner = read(u, idx)
        if not conds:
            return inner
        return f"({inner} if {' and '.join(conds)} else {lit_text(0, n.out.dtype)})"

    def read(u, idx):
        """u at index idx: a group input or the chain of loads below u. A 0-d input
        is the scalar read before the loops (a 0-d array in a prange body fails to
        type)."""
        if id(u) not in in_names:
            return load_index(producer[id(u)], idx)
        if u.shape == ():
            return names[id(u)]
        return in_names[id(u)] + _index([_unsigned(e) for e in idx])

    def leaf_name(u):
        """The kernel argument a chain of loads starting at value u reads."""
        while id(u) not in in_names:
            u = producer[id(u)].inputs[0]
        return in_names[id(u)]

    # Index constants (slice starts and lengths, int indices) depend on the shapes, so
    # they are kernel arguments c0, c1, ... resolved against the group's shapes (a new
    # shape reuses the kernel; the plan passes that shape's values). Steps are the
    # user's constants: part of the source, so unit strides stay unit strides.
    # Constants that do not depend on the shape (int indices, slice starts: xs[i] of an
    # unrolled loop) are arguments s0, s1, ... too: as literals, each i compiled its
    # own kernel (the 30 steps of an LSTM window: 30 kernels of one structure).
    consts = []          # (value, meaning)
    statics = []

    def const(value, what, shape_free=False):
        into, prefix = (statics, "s") if shape_free else (consts, "c")
        into.append((int(value), what))
        return f"{prefix}{len(into) - 1}"

    producer = {id(v): n for n in sub.nodes for v in n.outputs}
    # Loads that only other loads read (x.T[1:]: the transpose) are links of an index
    # chain: never read at the loop index, so no line of their own.
    readers = {}
    for n in sub.nodes:
        for v in n.inputs:
            if isinstance(v, Value):
                readers.setdefault(id(v), []).append(n)
    links = {id(n) for n in sub.nodes if roles[id(n)] == "load" and id(n.out) not in out_ids
             and readers.get(id(n.out)) and all(roles[id(m)] == "load"
                                                for m in readers[id(n.out)])}
    body = []            # innermost loop body (at depth r)
    hoisted = []         # before the loops
    used_inputs = set()
    for n in sub.nodes:
        role = roles[id(n)]
        if role in ("main", "red"):
            for v in n.inputs:
                if isinstance(v, Value) and id(v) in in_names:
                    used_inputs.add(id(v))
    for j, v in enumerate(inputs):
        if id(v) not in used_inputs:
            continue
        if v.shape == ():
            hoisted.append(f"x{j} = a{j}[()]")
        else:
            body.append(f"x{j} = a{j}{_index(ext_index(v))}")
        names[id(v)] = f"x{j}"
    for j, v in enumerate(inputs):
        if id(v) not in names and v.shape == ():
            hoisted.append(f"x{j} = a{j}[()]")
            names[id(v)] = f"x{j}"
    checked = set()
    for i, n in enumerate(sub.nodes):
        role = roles[id(n)]
        if role == "main":
            names[id(n.out)] = f"v{i}"
            ops = [operand_text(v, names) for v in n.inputs]
            body.append(f"v{i} = {node_expr(n, ops, vector_math=True)}")
            if n.fn.checks_trig_range and n.out.dtype in _NP_NAME and ops[0] not in checked:
                checked.add(ops[0])       # sin(x) and cos(x) (a gradient): one check
                body.append(f"nbad += 1 if vm.trig_out_of_range({ops[0]}) else 0" + _TRIG_TAG)
        elif role == "load":
            if id(n) in links:
                continue
            names[id(n.out)] = f"v{i}"
            body.append(f"v{i} = {load_index(n, ext_index(n.out))}")
    for j, v in enumerate(main_outs):
        if not flat and tuple(v.shape) != tuple(shape):
            # Written at the loop index, an output of another shape would be written
            # past its end (fusion._detach_escaping_loads keeps this from happening).
            raise AssertionError(f"fused group output {v} is not of the iteration "
                                 f"shape {shape}")
        idx = [f"i{k}" for k in range(r)]
        if id(v) in out_blocks:
            axis, start = out_blocks[id(v)]
            s_k = const(start, f"start of o{j}'s block in its concatenation, axis {axis}",
                        shape_free=True)
            idx[axis] = _unsigned(f"{s_k} + i{axis}")
        body.append(f"o{j}{_index(idx)} = {names[id(v)]}")

    # Reductions: a scalar accumulator opened at the depth where the summed axes
    # start (so the inner loops vectorize), folded into the accumulator array after.
    opens = {d: [] for d in range(r + 1)}
    closes = {d: [] for d in range(r + 1)}
    for n, axes, out_index, acc in red_info:
        val = names[id(n.inputs[0])]
        # float64 accumulators: a float64 value is added as it is (no call to type)
        val = val if n.inputs[0].dtype == np.float64 else f"np.float64({val})"
        combine = n.fn.reduction_combine
        d = _k(axes, order)
        oidx = _index(["0" if k is None else f"i{k}" for k in out_index])
        if d == r:
            body.append(_combine(combine, f"{acc}{oidx}", val))
            continue
        s = f"s_{acc}"
        opens[d].append(f"{s} = {float_text(n.fn.reduction_identity)}")
        if combine is np.add:
            # The one add that may be reordered (so the sum vectorizes): the kernel has
            # no fastmath, since 'reassoc' on the whole kernel also rewrote the fused
            # producers ((x * 3.0) * (1 / 3.0) became x, (x * 1e300) * 1e10 * 1e-10 inf).
            body.append(f"{s} = vm.acc_add({s}, {val})")
        else:
            body.append(_combine(combine, s, val))
        closes[d].append(_combine(combine, f"{acc}{oidx}", s))

    ind = "    "
    out = list(ind + h for h in hoisted)
    at_depth = _hoist(body, order)
    for depth, a in enumerate(order):
        out += [ind * (depth + 1) + x for x in opens[depth] + at_depth[depth]]
        rng = "numba.prange" if prange_ok and depth == 0 else "range"
        out.append(ind * (depth + 1) + f"for i{a} in {rng}(n{a}):")
    out += [ind * (r + 1) + x for x in at_depth[r]]
    if r == 0:
        out += [ind + x for x in opens[0]]
    for depth in reversed(range(r + 1)):
        if depth < r or r == 0:
            out += [ind * (depth + 1) + x for x in closes[depth]]
    if checked:
        out = _with_libm_rerun(out, red_info)
    # Epilogue: 0-d ops on full reductions (mean = sum / n), after the loops.
    red_scalar = {}
    for n, axes, out_index, acc in red_info:
        if n.out.shape == ():
            red_scalar[id(n.out)] = f"{_NP_NAME[n.out.dtype]}({acc}[()])"
    for i, n in enumerate(sub.nodes):
        if roles[id(n)] != "epi":
            continue
        ops = []
        for v in n.inputs:
            if isinstance(v, Value) and id(v) in red_scalar:
                ops.append(red_scalar[id(v)])
            elif id(v) in lifted:
                ops.append(names[id(v)])
            else:
                ops.append(operand_text(v, names))
        if (len(ops) == 2 and id(n.inputs[1]) in lifted and id(n.inputs[0]) not in lifted
                and n.fn.kernel_template(n)[0] in _COMMUTATIVE):
            ops.reverse()       # lifted literal first: see _lift_epilogue_literals
        names[id(n.out)] = f"v{i}"
        out.append(ind + f"v{i} = {node_expr(n, ops)}")
    for j, v in enumerate(epi_outs):
        out.append(ind + f"e{j}[()] = {names[id(v)]}")
    if not out:
        out.append(ind + "pass")

    args = [f"a{j}" for j in range(len(inputs))] + [f"o{j}" for j in range(len(main_outs))]
    args += [acc for _, _, _, acc in red_info] + [f"e{j}" for j in range(len(epi_outs))]
    args += [f"s{k}" for k in range(len(statics))]
    args += [f"n{k}" for k in range(r)]
    args += [f"c{k}" for k in range(len(consts))]
    label = fused.label[:40]
    # noalias: the arrays the kernel writes are fresh (cache._noalias_option says why
    # and when that is sound). no_cfunc_wrapper: the plan calls the dispatcher, never a C
    # entry point; numba's cfunc wrapper was 0.3 s of CPU over W7's 14 kernels.
    head = (f"@numba.njit(cache=True, nogil=True, error_model='numpy', "
            f"parallel={prange_ok}, fastmath=False, no_cfunc_wrapper=True"
            f"{', noalias=True' if _cache.NOALIAS else ''})")
    text = "\n".join(out)
    digest = hashlib.sha256((head + text + repr(args)).encode()).hexdigest()[:8]
    name = f"k_{label}_{r}d{'_par' if prange_ok else ''}_{digest}"
    mat = [id(v) for v in main_outs]
    doc = (f"    # {len(sub.nodes)} ops; writes {len(main_outs)} arrays, "
           f"{len(red_info)} reductions; {len(sub.nodes) - len(mat) - len(red_info)} "
           f"values stay in registers")
    doc += "".join(f"\n    # s{k}: {what}" for k, (_, what) in enumerate(statics))
    doc += "".join(f"\n    # c{k}: {what}" for k, (_, what) in enumerate(consts))
    imports = "import math\nimport numpy as np\nimport numba\n"
    if "vm." in text:
        imports += "from tracejit.backends.numba import vecmath as vm\n"
    source = f"{imports}\n\n{head}\ndef {name}({', '.join(args)}):\n{doc}\n{text}\n"
    reductions = [(n, n.fn.reduction_combine, axes, acc) for n, axes, _, acc in red_info]
    spec = KernelSpec(name, source, inputs, main_outs, reductions, epi_outs, shape)
    spec.consts = [v for v, _ in consts]
    spec.statics = [v for v, _ in statics]
    spec.flat = flat
    spec.out_blocks = {k: v for k, v in out_blocks.items() if k in {id(u) for u in main_outs}}
    return spec


# Binary templates whose operands may trade places bitwise (IEEE + and * commute; only
# the payload of a NaN from two NaN operands depends on the order, and a lifted literal
# is finite).
_COMMUTATIVE = frozenset(("{0} + {1}", "{0} * {1}"))
LIFT_EPILOGUE_LITERALS = True   # False: epilogue literals stay in the source


def _lift_epilogue_literals(sub, roles):
    """The kernel's inputs: the group's, and each finite float literal operand of a 0-d
    epilogue's + - * / as a 0-d input of its own (the plan passes it as a 0-d array), placed
    where a Value read first by that op would be (before the first input whose first
    reader comes later). Returns (inputs, {id(Lit)}); a lifted literal operand 1 of a
    commutative op is written as operand 0.

    Why: an unrolled loop's `loss = 0` then `loss = loss + mse(...)` makes the first
    step's loss kernel `mse + 0.0` and the later steps' `loss + mse`, two sources of
    one structure, two numba compiles (W7: 0.3 s of CPU). With the literal an input,
    `0.0 + mse` is the later steps' source and one kernel serves all 30 steps. Bitwise
    the same: a literal's value is exact as a 0-d array of its dtype, and 0.0 + x is
    x + 0.0. The epilogue runs once a call (0-d), so the argument costs no loop time."""
    inputs = list(sub.inputs)
    if not LIFT_EPILOGUE_LITERALS:
        return inputs, set()
    first = {}
    for i, n in enumerate(sub.nodes):
        for v in n.inputs:
            first.setdefault(id(v), i)
    lifted = {}
    for i, n in enumerate(sub.nodes):
        # + - * / only: IEEE arithmetic gives the same bits with the operand a literal
        # or a variable (a literal exponent or comparison numba may type or lower
        # otherwise)
        if roles[id(n)] != "epi" or n.fn.kernel_template(n)[0] not in _ARITHMETIC:
            continue
        for v in n.inputs:
            if (isinstance(v, Lit) and v.dtype.kind == "f" and np.isfinite(v.value)
                    and id(v) not in lifted):
                lifted[id(v)] = (i, v)
    for i, v in sorted(lifted.values(), key=lambda t: t[0]):
        at = next((k for k, u in enumerate(inputs)
                   if not isinstance(u, Lit) and first.get(id(u), len(sub.nodes)) > i),
                  len(inputs))
        inputs.insert(at, v)
    return inputs, set(lifted)


_TRIG_TAG = "    # |x| > vm.TRIG_MAX: counted"
_DEF = re.compile(r"([xv]\d+) = ")
_TOKEN = re.compile(r"\b([xv]\d+|i\d+)\b")


def _hoist(body, order):
    """The loop body's lines by the loop depth they run at: a value is computed in the
    innermost loop whose index it reads (through its operands), not deeper.

    Why: a value that does not change in the innermost loop (a broadcast operand's
    chain, e.g. tanh(exp(tanh(x))) of an (n, 1) input) left inside it is hoisted by
    no LLVM pass (vecmath's inlined code has control flow), and LLVM's loop vectorizer
    then takes time exponential in the chain's length: tanh(exp(x)) 2.3 s instead of
    0.5 s, tanh(exp(tanh(x))) more than 15 minutes. Computed before the loop, the same
    code compiles as fast as straight-line code. Stores and reduction updates stay in
    the innermost loop. A line hoisted out of a loop that runs zero times reads only
    size-1 axes at index 0 (broadcast axes), which exist, so hoisting is always safe.
    """
    r = len(order)
    level = {f"i{a}": d + 1 for d, a in enumerate(order)}
    out = [[] for _ in range(r + 1)]
    for line in body:
        m = _DEF.match(line)
        if not (m or line.startswith("nbad +=")):
            out[r].append(line)
            continue
        rhs = line[m.end():] if m else line
        d = max([level.get(t, 0) for t in _TOKEN.findall(rhs)], default=0)
        if m:
            level[m.group(1)] = d
        out[d].append(line)
    return out


def _with_libm_rerun(lines, red_info):
    """The loops twice: with vecmath's fast sin/cos, then, only if some argument was
    beyond the range they reduce exactly (|x| > 1.6e6: they return NaN there), again
    with libm after resetting the reductions. Never a wrong value, rarely a second pass."""
    exact = []
    for line in lines:
        if line.endswith(_TRIG_TAG):
            continue
        for b in ("32", "64"):
            line = line.replace(f"vm.sin{b}_fast(", "math.sin(")
            line = line.replace(f"vm.cos{b}_fast(", "math.cos(")
        exact.append("    " + line)
    resets = []
    for n, _, _, acc in red_info:
        init = float_text(n.fn.reduction_identity)
        q = len(n.out.shape)       # ndarray.fill does not type for 0-d arrays in numba
        pad = "        "
        for k in range(q):
            resets.append(f"{pad}for j{k} in range({acc}.shape[{k}]):")
            pad += "    "
        resets.append(f"{pad}{acc}{_index([f'j{k}' for k in range(q)])} = {init}")
    return (["    nbad = 0"] + lines + ["    if nbad > 0:"] + resets + exact)


def _k(axes, order):
    """First loop depth from which every loop sums over (scalar accumulator depth)."""
    d = len(order)
    while d > 0 and order[d - 1] in axes:
        d -= 1
    return d


def _combine(combine, acc, val):
    """Source folding val into acc with the reduction's ufunc (np.add, np.maximum,
    np.minimum)."""
    if combine is np.add:
        return f"{acc} += {val}"
    cmp = ">" if combine is np.maximum else "<"
    # NaN propagates as in np.max: once acc is NaN, nothing replaces it.
    return f"{acc} = {val} if ({val} {cmp} {acc} or {val} != {val}) else {acc}"


# ---------------------------------------------------------------- whole scalar graphs

def scalar_kernel(nodes, inputs, outputs):
    """One njit function for a graph of 0-d ops and guards (dispatch-bound code).

    Takes the inputs as scalars, checks guards where they stand and returns
    (index of the first failed guard or -1, the value that guard saw, *outputs), or
    only the outputs when the graph has no guards.
    """
    names = {}
    for j, v in enumerate(inputs):
        names[id(v)] = f"a{j}"
    lines = []
    out_vals = [v for v in outputs if isinstance(v, Value)]
    holders = ", ".join(_zero(v.dtype) for v in out_vals)
    gi = 0
    for i, n in enumerate(nodes):
        if n.kind == "guard":
            x = operand_text(n.inputs[0], names)
            cond = _guard_cond(n.fn, x)
            lines.append(f"if not ({cond}):")
            lines.append(f"    return {gi}, np.float64({x}){', ' if holders else ''}{holders}")
            gi += 1
            continue
        names[id(n.out)] = f"v{i}"
        ops = [operand_text(v, names) for v in n.inputs]
        lines.append(f"v{i} = {node_expr(n, ops)}")
    rets = ", ".join(names[id(v)] for v in out_vals)
    if gi:
        lines.append(f"return -1, np.float64(0.0){', ' if rets else ''}{rets}")
    else:
        lines.append(f"return ({rets}{',' if rets else ''})")    # no guards: the outputs
    text = "\n".join("    " + x for x in lines)
    args = ", ".join(f"a{j}" for j in range(len(inputs)))
    head = "@numba.njit(cache=True, nogil=True, error_model='numpy', no_cfunc_wrapper=True)"
    digest = hashlib.sha256((head + text + args).encode()).hexdigest()[:8]
    name = f"scalar_graph_{len(nodes)}ops_{digest}"
    source = (f"import math\nimport numpy as np\nimport numba\n\n\n{head}\n"
              f"def {name}({args}):\n{text}\n")
    return name, source, out_vals


def _zero(dtype):
    if dtype == np.bool_:
        return "False"
    return f"{_NP_NAME[np.dtype(dtype)]}(0.0)"


def _guard_cond(guard, x):
    exp = guard.expected
    if guard.conv == "bool":
        return f"bool({x}) == {bool(exp)!r}"
    if guard.conv == "float":
        e = float(exp)
        if e != e:
            return f"{x} != {x}"
        return f"np.float64({x}) == {lit_text(e, 'f8')}"
    # int / index: NaN and inf fail here; the plan then raises as int() would.
    return f"({x} == {x} and abs(np.float64({x})) != np.inf and int({x}) == {int(exp)})"
