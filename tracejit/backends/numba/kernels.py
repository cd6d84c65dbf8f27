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

from tracejit.ir import Lit, Value
from tracejit.passes import basic_index_of

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
    """The node's expression template with parameters and literals typed to `dtype`."""
    name = n.op.__name__
    if name in ("Max", "Min"):                      # of a 0-d value: the value itself
        return "{0}"
    if name in ("Sum", "SumTo"):
        # NumPy's sum starts from +0.0: the sum of a lone -0.0 is +0.0 (0.0 + x is x
        # for every other value, nan and inf included).
        zero = lit_text(0.0, dtype) if n.out.dtype.kind == "f" else lit_text(0, n.out.dtype)
        return f"({zero} + {{0}})"
    if name == "Cast":
        out = n.out.dtype
        return "({0} != 0)" if out == np.bool_ else f"{_NP_NAME[out]}({{0}})"
    if name == "Pow":
        c = n.fn.c
        if c == 2:
            return "({0} * {0})"
        if c == 1:
            return "({0})"
        if c == 0.5:
            return "math.sqrt({0})"
        if c == -1:
            return f"({lit_text(1.0, dtype)} / {{0}})"
        return f"({{0}} ** {lit_text(float(c), dtype)})"
    if name == "PowV" and all(d == 1 for d in n.inputs[1].shape):
        # NumPy's power with a one-element exponent of 0.5 is sqrt (its scalar fast
        # path): (-inf) ** 0.5 is nan there, inf from C's pow, and -0.0 keeps its sign.
        return f"(math.sqrt({{0}}) if {{1}} == {lit_text(0.5, dtype)} else {{0}} ** {{1}})"
    if name == "Clip":
        # NumPy's clip propagates NaN; min(max(nan, lo), hi) would give lo.
        expr = "({0} if {0} != {0} else min(max({0}, {x_min}), {x_max}))"
    else:
        expr = n.fn.expr
    if dtype.kind == "f" and dtype != np.float64:
        expr = _FLOAT_LIT.sub(lambda m: f"{_NP_NAME[dtype]}({m.group(1)})", expr)
    params = {p: lit_text(v, dtype) if isinstance(v, (int, float)) and not isinstance(v, bool)
              else v for p, v in zip(n.op.params, n.params)}
    return expr, params


# libm calls in an expression -> tracejit.backends.numba.vecmath (branch-free, inlined: a loop
# of them vectorizes). sin/cos take the fast path, exact for |x| <= vm.TRIG_MAX; the
# kernel counts arguments beyond it and reruns its loops with libm if there are any.
_VECTOR_MATH = {"math.exp(": "vm.exp{b}(", "math.log(": "vm.log{b}(",
                "math.tanh(": "vm.tanh{b}(", "math.sin(": "vm.sin{b}_fast(",
                "math.cos(": "vm.cos{b}_fast("}
_TRIG = ("Sin", "Cos")
_VECTOR_OPS = {"Exp", "Log", "Tanh", "Sigmoid", "Sin", "Cos"}


def node_expr(n, operands, vector_math=False):
    """Source of node n's value from operand source strings, cast to its dtype.
    vector_math: float libm calls become tracejit.backends.numba.vecmath calls."""
    dtype = n.out.dtype
    calc_dtype = dtype if dtype.kind == "f" else _operand_float(n)
    if vector_math and calc_dtype in _NP_NAME and n.op.__name__ in _VECTOR_OPS:
        # vecmath takes floats only (libm's math.tanh took an int64 too)
        operands = [o if isinstance(v, Value) and v.dtype == calc_dtype
                    else f"{_NP_NAME[calc_dtype]}({o})" for v, o in zip(n.inputs, operands)]
    t = _template(n, calc_dtype)
    if isinstance(t, tuple):
        expr, params = t
        body = expr.format(*operands, **params)
    else:
        body = t.format(*operands)
    if vector_math and calc_dtype in _NP_NAME:
        bits = "32" if calc_dtype == np.float32 else "64"
        for libm, vm in _VECTOR_MATH.items():
            body = body.replace(libm, vm.format(b=bits))
    if dtype.kind == "f" and not (dtype == np.float64 and all(
            v.dtype == np.float64 for v in n.inputs)):
        # float64 in, float64 out needs no cast (numba's arithmetic on float64 stays
        # float64); each cast costs compile time (typing a call).
        return f"{_NP_NAME[dtype]}({body})"
    return f"({body})"


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

    def __init__(self, name, source, inputs, outputs, reductions, epilogue_outputs, shape):
        self.name = name
        self.source = source
        self.inputs = inputs                  # ext input Values, argument order
        self.outputs = outputs                # main outputs (shape = iteration shape)
        self.reductions = reductions          # (node, kind, axes, init) per reduction
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
    name = n.op.__name__
    if name == "SumTo":
        target = n.fn.shape
        lead = rank - len(target)
        axes = set(range(lead)) | {k + lead for k, d in enumerate(target) if d == 1}
        out_index = [None if d == 1 else k + lead for k, d in enumerate(target)]
        return axes, out_index
    axis, keepdims = n.fn.axis, n.fn.keepdims
    axes = set(range(rank)) if axis is None else set(axis)
    out_index = []
    for k in range(rank):
        if k in axes:
            if keepdims:
                out_index.append(None)
        else:
            out_index.append(k)
    return axes, out_index


def _index(idx):
    return "[" + ", ".join(idx) + "]" if idx else "[()]"


def loop_kernel(fused, parallel):
    """KernelSpec of a loop kernel for `fused` (prange over one axis when parallel)."""
    sub = fused.graph
    shape = fused.shape
    r = len(shape)
    roles = _roles(fused)
    names = {}
    in_names = {}
    for j, v in enumerate(sub.inputs):
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
        q = len(v.shape)
        return [("0" if v.shape[k] == 1 and shape[k + r - q] != 1 else f"i{k + r - q}")
                for k in range(q)]

    def load_index(n, out_idx):
        """Index source of a movement chain down to a group input."""
        u = n.inputs[0]
        name = n.op.__name__
        q = len(u.shape)
        if name == "BroadcastTo":
            p = len(n.out.shape)
            idx = [("0" if u.shape[k] == 1 and n.out.shape[k + p - q] != 1
                    else out_idx[k + p - q]) for k in range(q)]
        elif name == "Transpose":
            axes = n.fn.axes if n.fn.axes is not None else tuple(reversed(range(q)))
            idx = ["0"] * q
            for k, a in enumerate(axes):
                idx[a] = out_idx[k]
        elif name == "GetItem":                     # x[key]: an affine read
            src = leaf_name(u)
            idx = []
            for e in basic_index_of(n):
                if e[0] == "slice":
                    _, ia, oa, start, step, _, static = e
                    c = str(static) if static is not None else \
                        const(start, f"start of the slice of {src} axis {ia} (step {step})")
                    idx.append(_affine(c, step, out_idx[oa]))
                elif e[0] == "int":
                    idx.append(str(e[3]) if e[3] is not None else
                               const(e[2], f"index into {src} axis {e[1]}"))
        elif name == "GetItemGrad":                 # zeros with gy at [key]: a masked read
            src = leaf_name(u)
            idx, conds = [], []
            for e in basic_index_of(n):
                if e[0] == "slice":
                    _, ia, oa, start, step, _, static = e
                    c = str(static) if static is not None else \
                        const(start, f"start of the slice {src} fills, axis {ia} (step {step})")
                    m = const(e[5], f"length of the slice {src} fills, axis {ia}")
                    j = out_idx[ia]
                    d = _affine(j, -1, c) if step > 0 else _affine(c, -1, j)
                    if abs(step) == 1:
                        conds.append(f"0 <= {d} < {m}")
                        idx.append(d)
                    else:
                        a = abs(step)
                        conds.append(f"({d}) % {a} == 0 and 0 <= {d} < {a} * {m}")
                        idx.append(f"({d}) // {a}")
                elif e[0] == "int":
                    c = str(e[3]) if e[3] is not None else \
                        const(e[2], f"index {src} fills on axis {e[1]} (zeros elsewhere)")
                    conds.append(f"{out_idx[e[1]]} == {c}")
                else:
                    idx.append("0")
            inner = read(u, idx)
            if not conds:
                return inner
            return f"({inner} if {' and '.join(conds)} else {lit_text(0, n.out.dtype)})"
        else:                                       # reshape adding / dropping size-1 axes
            P = [k for k, d in enumerate(n.out.shape) if d != 1]
            Q = [k for k, d in enumerate(u.shape) if d != 1]
            idx = ["0"] * q
            for pk, qk in zip(P, Q):
                idx[qk] = out_idx[pk]
        return read(u, idx)

    def read(u, idx):
        """u at index idx: a group input or the chain of loads below u. A 0-d input
        is the scalar read before the loops (a 0-d array in a prange body fails to
        type)."""
        if id(u) not in in_names:
            return load_index(producer[id(u)], idx)
        if u.shape == ():
            return names[id(u)]
        return in_names[id(u)] + _index(idx)

    def leaf_name(u):
        """The kernel argument a chain of loads starting at value u reads."""
        while id(u) not in in_names:
            u = producer[id(u)].inputs[0]
        return in_names[id(u)]

    # Index constants (slice starts and lengths, int indices) depend on the shapes, so
    # they are kernel arguments c0, c1, ... resolved against the group's shapes (a new
    # shape reuses the kernel; the plan passes that shape's values). Steps are the
    # user's constants: part of the source, so unit strides stay unit strides.
    consts = []          # (value, meaning)

    def const(value, what):
        consts.append((int(value), what))
        return f"c{len(consts) - 1}"

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
    for j, v in enumerate(sub.inputs):
        if id(v) not in used_inputs:
            continue
        if v.shape == ():
            hoisted.append(f"x{j} = a{j}[()]")
        else:
            body.append(f"x{j} = a{j}{_index(ext_index(v))}")
        names[id(v)] = f"x{j}"
    for v in sub.inputs:
        if id(v) not in names and v.shape == ():
            j = sub.inputs.index(v)
            hoisted.append(f"x{j} = a{j}[()]")
            names[id(v)] = f"x{j}"
    checked = set()
    for i, n in enumerate(sub.nodes):
        role = roles[id(n)]
        if role == "main":
            names[id(n.out)] = f"v{i}"
            ops = [operand_text(v, names) for v in n.inputs]
            body.append(f"v{i} = {node_expr(n, ops, vector_math=True)}")
            if n.op.__name__ in _TRIG and n.out.dtype in _NP_NAME and ops[0] not in checked:
                checked.add(ops[0])       # sin(x) and cos(x) (a gradient): one check
                body.append(f"nbad += 1 if vm.trig_out_of_range({ops[0]}) else 0" + _TRIG_TAG)
        elif role == "load":
            if id(n) in links:
                continue
            names[id(n.out)] = f"v{i}"
            body.append(f"v{i} = {load_index(n, ext_index(n.out))}")
    for j, v in enumerate(main_outs):
        body.append(f"o{j}{_index([f'i{k}' for k in range(r)])} = {names[id(v)]}")

    # Reductions: a scalar accumulator opened at the depth where the summed axes
    # start (so the inner loops vectorize), folded into the accumulator array after.
    opens = {d: [] for d in range(r + 1)}
    closes = {d: [] for d in range(r + 1)}
    for n, axes, out_index, acc in red_info:
        val = names[id(n.inputs[0])]
        kind = n.op.__name__
        d = _k(axes, order)
        oidx = _index(["0" if k is None else f"i{k}" for k in out_index])
        if d == r:
            body.append(_combine(kind, f"{acc}{oidx}", f"np.float64({val})"))
            continue
        s = f"s_{acc}"
        init = "0.0" if kind in ("Sum", "SumTo") else ("-np.inf" if kind == "Max" else "np.inf")
        opens[d].append(f"{s} = {init}")
        if kind in ("Sum", "SumTo"):
            # The one add that may be reordered (so the sum vectorizes): the kernel has
            # no fastmath, since 'reassoc' on the whole kernel also rewrote the fused
            # producers ((x * 3.0) * (1 / 3.0) became x, (x * 1e300) * 1e10 * 1e-10 inf).
            body.append(f"{s} = vm.acc_add({s}, np.float64({val}))")
        else:
            body.append(_combine(kind, s, f"np.float64({val})"))
        closes[d].append(_combine(kind, f"{acc}{oidx}", s))

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
            else:
                ops.append(operand_text(v, names))
        names[id(n.out)] = f"v{i}"
        out.append(ind + f"v{i} = {node_expr(n, ops)}")
    for j, v in enumerate(epi_outs):
        out.append(ind + f"e{j}[()] = {names[id(v)]}")
    if not out:
        out.append(ind + "pass")

    args = [f"a{j}" for j in range(len(sub.inputs))] + [f"o{j}" for j in range(len(main_outs))]
    args += [acc for _, _, _, acc in red_info] + [f"e{j}" for j in range(len(epi_outs))]
    args += [f"n{k}" for k in range(r)]
    args += [f"c{k}" for k in range(len(consts))]
    label = fused.label[:40]
    head = (f"@numba.njit(cache=True, nogil=True, error_model='numpy', "
            f"parallel={prange_ok}, fastmath=False)")
    text = "\n".join(out)
    digest = hashlib.sha256((head + text + repr(args)).encode()).hexdigest()[:8]
    name = f"k_{label}_{r}d{'_par' if prange_ok else ''}_{digest}"
    mat = [id(v) for v in main_outs]
    doc = (f"    # {len(sub.nodes)} ops; writes {len(main_outs)} arrays, "
           f"{len(red_info)} reductions; {len(sub.nodes) - len(mat) - len(red_info)} "
           f"values stay in registers")
    if consts:
        doc += "\n" + "\n".join(f"    # c{k}: {what}" for k, (_, what) in enumerate(consts))
    imports = "import math\nimport numpy as np\nimport numba\n"
    if "vm." in text:
        imports += "from tracejit.backends.numba import vecmath as vm\n"
    source = f"{imports}\n\n{head}\ndef {name}({', '.join(args)}):\n{doc}\n{text}\n"
    reductions = [(n, n.op.__name__, axes, acc) for n, axes, _, acc in red_info]
    spec = KernelSpec(name, source, list(sub.inputs), main_outs, reductions, epi_outs, shape)
    spec.consts = [v for v, _ in consts]
    return spec


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
        kind = n.op.__name__
        init = "0.0" if kind in ("Sum", "SumTo") else ("-np.inf" if kind == "Max" else "np.inf")
        q = len(n.out.shape)       # ndarray.fill does not type for 0-d arrays in numba
        pad = "        "
        for k in range(q):
            resets.append(f"{pad}for j{k} in range({acc}.shape[{k}]):")
            pad += "    "
        resets.append(f"{pad}{acc}{_index([f'j{k}' for k in range(q)])} = {init}")
    return (["    nbad = 0"] + lines + ["    if nbad > 0:"] + resets + exact)


def _affine(c, step, i):
    """Source of c + step * i (c, i: index names or integer literals)."""
    if i == "0":
        return c
    term = i if abs(step) == 1 else f"{abs(step)} * {i}"
    if c == "0":
        return term if step > 0 else f"-{term}"
    return f"{c} {'+' if step > 0 else '-'} {term}"


def _k(axes, order):
    """First loop depth from which every loop sums over (scalar accumulator depth)."""
    d = len(order)
    while d > 0 and order[d - 1] in axes:
        d -= 1
    return d


def _combine(kind, acc, val):
    if kind in ("Sum", "SumTo"):
        return f"{acc} += {val}"
    cmp = ">" if kind == "Max" else "<"
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
    head = "@numba.njit(cache=True, nogil=True, error_model='numpy')"
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
