"""Random DeZero-style programs as Python source text (the fuzzer's generator).

`source_programs()` (also `tracejit.testing.strategies.source_programs`) is a hypothesis
strategy of `SourceProgram`s: a whole module of plain Python -- captured Parameters and
arrays, user `Function` classes, `f` itself, `args(call)` building each call's inputs
from seeded draws, and `PLAN`, the calls -- that the harness runs twice from scratch,
once eagerly and once through `tj.jit`, so both start from identical state. Printed,
it is a reproducer anyone can run.

Values stay in safe domains by construction: every value carries a bound on its
magnitude and ops that would pass `_MAX_BOUND` are not drawn; logs and square roots
take `x * x + 1`; divisions divide by `b * b + 1`. Conditions and loop counts read only
inputs whose sign is set per call (values in +-[0.5, 1.5]) or the float argument, so a
rounding difference between jit and eager can never flip a branch: every difference the
harness reports is a real one.
"""
import numpy as np
from hypothesis import assume, strategies as st

from tracejit.trace.pytree import MAX_DEPTH

__all__ = ["source_programs", "SourceProgram", "AVOIDABLE"]

# Constructs a run can leave out (`--avoid`), to look past known bug classes:
AVOIDABLE = {
    "identity": "no object returned twice, no returned argument or capture",
    "user_state": "no user Function keeping per-call state on self (SignScale)",
    "data_backward": "no user Function reading .data in its backward (TanhData)",
    "size1": "no size-1 extents (batch and feature sides >= 2)",
    "create_graph_inplace": "no create_graph in programs that update state in place",
    "nonfinite": "no inf/-inf entries in inputs",
    "retain_grad": "no retain_grad=True in a backward inside f (a later backward "
                   "through the call's results adds to the .grad it leaves on the "
                   "call's intermediates)",
    "preset": "no results' .grad set before the caller's backward (the class once "
              "found there: a walk through a user Function's backward under "
              "create_graph read a preset .grad of its forward's output, which "
              "eager's walk does not reach; each gradient now links what its graph "
              "reaches)",
}

B = "B"              # the batch side of a symbolic shape: it changes between the phases
_MAX_BOUND = 50.0    # |value| bound: keeps exp, squares and products tame


class SourceProgram:
    """A generated program: `source` (a module) and facts the harness needs."""

    def __init__(self, source, n_calls, has_float32, features, arg_kinds=()):
        self.source = source
        self.n_calls = n_calls
        self.has_float32 = has_float32
        self.features = features        # sorted names of the constructs used
        # What each of f's parameters is, in order (ARG_KINDS): what a caller may do
        # to it between calls (argument_update_programs) depends on its dtype.
        self.arg_kinds = tuple(arg_kinds)

    def __repr__(self):
        return self.source


class Val:
    """One value in scope: its Python name, symbolic shape, dtype and what is known."""

    def __init__(self, name, shape, dtype, bound, var=True, signed=False):
        self.name, self.shape, self.dtype, self.bound = name, tuple(shape), dtype, bound
        self.var = var            # a Variable (else an ndarray)
        self.signed = signed      # every element has the call's sign, |x| >= 0.5

    @property
    def data(self):
        """Source text of the value's ndarray."""
        return f"{self.name}.data" if self.var else self.name


def bcast(s0, s1):
    """Symbolic broadcast of two shapes (B pairs only with B or 1), or None."""
    out = []
    for k in range(1, max(len(s0), len(s1)) + 1):
        a = s0[-k] if k <= len(s0) else 1
        b = s1[-k] if k <= len(s1) else 1
        if a == b or b == 1:
            out.append(a)
        elif a == 1:
            out.append(b)
        else:
            return None
    return tuple(reversed(out))


def shape_src(shape, ref=None):
    """A shape as source text; B becomes `ref.shape[i]` or the runtime variable `nb`."""
    parts = [str(d) if d != B else "nb" for d in shape]
    return "(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")"


def _dt(*vals):
    return "float64" if any(v.dtype == "float64" for v in vals) else "float32"


USER_FUNCTIONS = {
    "Cube": '''class Cube(tj.Function):
    def forward(self, x):
        return x ** 3

    def backward(self, gy):
        x, = self.inputs
        return 3 * x ** 2 * gy
''',
    "SignScale": '''class SignScale(tj.Function):
    # Keeps per-call state on self: this call's sign decides its backward's factor.
    def forward(self, x):
        self.k = 2.0 if x.sum() > 0 else -3.0
        return x * self.k

    def backward(self, gy):
        return gy * self.k
''',
    "SignCube": '''class SignCube(tj.Function):
    # Per-call state: this call's sign sets its backward's factor and depth (one
    # opaque node of the compiled graph, several eager Functions under create_graph).
    def forward(self, x):
        self.k, self.n = (3.0, 1) if x.sum() > 0 else (-2.0, 3)
        return x ** 3

    def backward(self, gy):
        x, = self.inputs
        g = gy * self.k * x * x
        for _ in range(self.n):
            g = g * 0.5
        return g
''',
    "TanhData": '''class TanhData(tj.Function):
    # backward reads .data: detached, so eager has no second derivative through it.
    def forward(self, x):
        return np.tanh(x)

    def backward(self, gy):
        y = np.tanh(self.inputs[0].data)
        return gy * (1 - y * y)
''',
    "MulAdd": '''class MulAdd(tj.Function):
    def forward(self, a, b):
        return a * b + a

    def backward(self, gy):
        a, b = self.inputs
        return gy * (b + 1), gy * a
''',
}

# name -> (source template with {a}, bound of the result given the operand's bound)
UNARY = {
    "tanh": ("F.tanh({a})", lambda b: 1.0),
    "sin": ("F.sin({a})", lambda b: 1.0),
    "cos": ("F.cos({a})", lambda b: 1.0),
    "sigmoid": ("F.sigmoid({a})", lambda b: 1.0),
    "relu": ("F.relu({a})", lambda b: b),
    "exp": ("F.exp({a})", lambda b: float(np.exp(b)) if b < 4 else 1e9),
    "exp_tanh": ("F.exp(F.tanh({a}))", lambda b: np.e),
    "log1p_sq": ("F.log({a} * {a} + 1)", lambda b: float(np.log1p(b * b))),
    "sqrt1p_sq": ("F.sqrt({a} * {a} + 1.0)", lambda b: float(np.sqrt(b * b + 1))),
    "neg": ("-{a}", lambda b: b),
    "scale": ("{a} * 0.5", lambda b: b / 2),
    "square": ("{a} ** 2", lambda b: b * b),
    "rsub": ("1.5 - {a}", lambda b: b + 1.5),
    "rdiv_const": ("{a} / 4.0", lambda b: b / 4),
    "sin_affine": ("F.sin({a}) * 2.0 + 1.0", lambda b: 3.0),
}

# Ops applied to a bare ndarray (an ndarray argument): F.* first, so the result is a
# Variable; `x * x + 1` of a 0-d array would be a NumPy scalar, which F.* rejects.
_ON_ARRAYS = {"tanh", "sin", "cos", "sigmoid", "relu", "exp", "exp_tanh"}

BINARY = {
    "add": ("{a} + {b}", lambda a, b: a + b),
    "sub": ("{a} - {b}", lambda a, b: a + b),
    "mul": ("{a} * {b}", lambda a, b: a * b),
    "div": ("{a} / ({b} * {b} + 1)", lambda a, b: a),
    "tanh_mul": ("F.tanh({a} * {b})", lambda a, b: 1.0),
    "maximum": ("F.maximum({a}, {b})", lambda a, b: max(a, b)),
}


class Builder:
    """Accumulates f's body while tracking the values in scope."""

    def __init__(self, draw, avoid=frozenset()):
        self.draw = draw
        self.avoid = avoid
        self.lines = []
        self.indent = 1
        self.vals = []
        self.n = 0
        self.features = set()
        self.also_return = []     # names a statement has returned (st_invariant_broadcast)
        self.captures = []        # (name, kind, shape, dtype, where)
        self.classes = set()
        self.args = []            # (name, kind, Val or None)
        self.has_float = False    # a Python float argument s0
        self.updated = set()      # captures updated in place by an inner step
        self.rebinds = set()      # captures f updates with an augmented assignment
        self.view_args = {}       # ndarray argument -> how it is a view (_view_of)
        self.layout_flip = set()  # Variable arguments whose memory layout args() varies
        self.buffer_reads = set()  # arguments struct reads (must stay C-contiguous)
        self.extra_args = []      # (name, source of its value in args()): escapes block
        self.extra_kinds = {}     # extra argument name -> its ARG_KINDS entry
        self.returned_views = []  # names of views returned too: returned views block
        # Arguments and captured Parameters whose .grad the caller sets before each call
        # (args()): rebind alias block.
        self.caller_grads = set()
        # What a capture drawn without a kind is (["array"]: a NO_VAR program).
        self.capture_kinds = ["param", "param", "array"]

    # ---- helpers

    def emit(self, text):
        self.lines.append("    " * self.indent + text)

    def fresh(self, prefix="h"):
        self.n += 1
        return f"{prefix}{self.n}"

    def pick(self, pred=lambda v: v.var, recent=4):
        """A value in scope (a Variable unless pred says otherwise), mostly a recent one."""
        cands = [v for v in self.vals if pred(v)]
        if not cands:
            return None
        recent_c = cands[-recent:]
        return self.draw(st.sampled_from(recent_c if self.draw(st.integers(0, 3)) else cands))

    def add(self, name, shape, dtype, bound, var=True, signed=False):
        v = Val(name, shape, dtype, bound, var, signed)
        self.vals.append(v)
        return v

    def capture(self, shape, kind=None, reuse=True, dtype=None):
        """A captured Parameter or array of `shape` (reused when one exists), of
        `dtype` if given.

        Captures are drawn in [-1, 1]; the ones an inner step updates are never reused
        elsewhere (their values grow), nor are arrays updated in place (`*= 0.9` only
        shrinks them, but their sign pattern must not matter)."""
        for c in self.captures:
            if reuse and c[2] == tuple(shape) and (kind is None or c[1] == kind) \
                    and dtype in (None, c[3]) \
                    and c[0] not in self.updated and self.draw(st.booleans()):
                return c
        kind = kind or self.draw(st.sampled_from(self.capture_kinds))
        dtype = dtype or self.draw(st.sampled_from(["float64", "float32"]))
        # (Also, rarely, held where a trace reaches it differently: a default argument
        # of f, a keyword-only default, an item of a tuple in the closure. A write into
        # a default used to be skipped by compiled calls, and plain NumPy on a tuple's
        # item frozen (program 891 of seed 77): trace/pystate.swap_arrays.)
        where = self.draw(st.sampled_from(["global", "closure"] * 6
                                          + ["default", "kwdefault", "tuple"]))
        name = ("W" if kind == "param" else "K") + str(len(self.captures))
        c = (name, kind, tuple(shape), dtype, where)
        self.captures.append(c)
        self.features.add(f"capture_{kind}_{where}")
        return c

    # ---- statements

    def st_unary(self):
        v = self.pick(lambda w: True)
        ops = [o for o, (_, bf) in UNARY.items() if bf(v.bound) <= _MAX_BOUND
               and (v.var or o in _ON_ARRAYS)]
        op = self.draw(st.sampled_from(sorted(ops)))
        tmpl, bf = UNARY[op]
        name = self.fresh()
        self.emit(f"{name} = {tmpl.format(a=v.name)}")
        signed = v.signed and op in ("tanh", "scale", "rdiv_const")
        self.add(name, v.shape, v.dtype, bf(v.bound), signed=signed)

    def st_binary(self):
        a = self.pick(lambda w: True)
        partners = [w for w in self.vals if bcast(a.shape, w.shape) is not None]
        b = self.draw(st.sampled_from(partners))
        if self.draw(st.booleans()):
            a, b = b, a
        ops = [o for o, (_, bf) in BINARY.items() if bf(a.bound, b.bound) <= _MAX_BOUND]
        if not (a.var or b.var):    # ndarray op ndarray may be a NumPy scalar: F.* only
            ops = [o for o in ops if o == "maximum"]
        if not ops:
            return self.st_unary()
        op = self.draw(st.sampled_from(sorted(ops)))
        tmpl, bf = BINARY[op]
        name = self.fresh()
        self.emit(f"{name} = {tmpl.format(a=a.name, b=b.name)}")
        if a is b:
            self.features.add("fanout_same_operand")
        self.add(name, bcast(a.shape, b.shape), _dt(a, b), bf(a.bound, b.bound))

    def st_scalar(self):
        """A Python number: a literal, the float argument, or float()/.item() of data."""
        v = self.pick()
        kinds = ["literal", "float_of_data", "item_of_data"]
        if self.has_float:
            kinds += ["float_arg", "float_arg"]
        kind = self.draw(st.sampled_from(kinds))
        name = self.fresh()
        if kind == "literal":
            c = self.draw(st.sampled_from(["0.75", "1.25", "2.0", "-0.5", "3"]))
            self.emit(f"{name} = {v.name} * {c} + 0.25")
            self.add(name, v.shape, v.dtype, v.bound * 3 + 0.25)
            return
        if kind == "float_arg":
            form = self.draw(st.sampled_from(["{a} * s0", "{a} + s0", "{a} / (1.0 + s0)",
                                              "s0 - {a}"]))
            self.emit(f"{name} = " + form.format(a=v.name))
            self.add(name, v.shape, v.dtype, v.bound + 1)
            self.features.add("float_arg_arith")
            return
        src = self.pick(lambda w: w.var and w.bound <= 10)
        if src is None:
            return self.st_unary()
        conv = (f"float({src.data}.mean())" if kind == "float_of_data"
                else f"{src.data}.sum().item()")
        c = self.fresh("c")
        self.emit(f"{c} = {conv}")
        bound = src.bound * (1 if kind == "float_of_data" else 125)
        if v.bound * (bound + 1) > _MAX_BOUND:
            self.emit(f"{name} = F.tanh({v.name} * {c})")
            self.add(name, v.shape, _dt(v), 1.0)
        else:
            self.emit(f"{name} = {v.name} * {c} + 1.0")
            self.add(name, v.shape, _dt(v), v.bound * bound + 1)
        self.features.add(kind)

    def st_reduce(self):
        v = self.pick(lambda w: len(w.shape) > 0)
        if v is None:
            return self.st_unary()
        op = self.draw(st.sampled_from(["sum", "mean", "max", "min"]))
        nd = len(v.shape)
        axis = self.draw(st.one_of(st.none(), st.integers(-nd, nd - 1)))
        keep = self.draw(st.booleans()) and "size1" not in self.avoid
        if axis is None:
            out = tuple(1 for _ in v.shape) if keep else ()
        else:
            out = tuple(1 if i == axis % nd else d for i, d in enumerate(v.shape))
            if not keep:
                out = out[:axis % nd] + out[axis % nd + 1:]
        reduced = v.shape if axis is None else (v.shape[axis % nd],)
        factor = int(np.prod([5 if d == B else d for d in reduced])) if op == "sum" else 1
        if v.bound * factor > _MAX_BOUND:
            op = self.draw(st.sampled_from(["mean", "max", "min"]))
            factor = 1
        style = self.draw(st.sampled_from(["F", "method"]))
        name = self.fresh()
        if style == "method" and v.var:
            self.emit(f"{name} = {v.name}.{op}(axis={axis}, keepdims={keep})")
        else:
            self.emit(f"{name} = F.{op}({v.name}, axis={axis}, keepdims={keep})")
        self.features.add(f"reduce_{op}")
        self.add(name, out, v.dtype, v.bound * factor)

    def st_movement(self):
        v = self.pick(lambda w: len(w.shape) > 0)
        if v is None:
            return self.st_unary()
        name = self.fresh()
        nd = len(v.shape)
        kinds = ["reshape_flat", "index"] + ([] if "size1" in self.avoid else ["expand"])
        if nd >= 2:
            kinds += ["transpose", "transpose"]
        kind = self.draw(st.sampled_from(kinds))
        if kind == "transpose":
            perm = tuple(self.draw(st.permutations(range(nd))))
            if self.draw(st.booleans()) and nd == 2 and v.var:
                self.emit(f"{name} = {v.name}.T")
                perm = (1, 0)
            else:
                self.emit(f"{name} = F.transpose({v.name}, {perm})")
            self.add(name, tuple(v.shape[p] for p in perm), v.dtype, v.bound)
        elif kind == "expand":
            self.emit(f"{name} = F.reshape({v.name}, {v.name}.shape + (1,))")
            self.add(name, v.shape + (1,), v.dtype, v.bound)
        elif kind == "reshape_flat":
            fixed = [d for d in v.shape if d != B]
            size = int(np.prod(fixed)) if fixed else 1
            if B in v.shape:
                if v.shape[0] != B:
                    return self.st_unary()
                self.emit(f"{name} = F.reshape({v.name}, ({v.name}.shape[0], -1))")
                self.add(name, (B, size), v.dtype, v.bound)
            else:
                new = self.draw(st.sampled_from(
                    [(size,), (-1,)] + ([] if "size1" in self.avoid else [(1, size), (size, 1)])))
                self.emit(f"{name} = F.reshape({v.name}, {new})")
                self.add(name, (size,) if new == (-1,) else new, v.dtype, v.bound)
        else:
            d = v.shape[0]
            if d == B:
                idx = self.draw(st.sampled_from(
                    ["0", "-1"] + ([] if "size1" in self.avoid else [":1", "..., :1"])))
            else:
                k = self.draw(st.integers(0, d - 1))
                last = min(k, v.shape[-1] - 1) if v.shape[-1] != B else 0
                idx = self.draw(st.sampled_from([str(k), f"{k}:", f":{k + 1}", "::-1",
                                                 f"..., {last}"]))
            self.emit(f"{name} = {v.name}[{idx}]" if v.var
                      else f"{name} = F.get_item({v.name}, np.s_[{idx}])")
            # The resulting shape, by NumPy on a concrete stand-in (B = 2 and 3).
            shapes = []
            for nb in (2, 3):
                z = np.zeros([nb if s == B else s for s in v.shape])
                shapes.append(eval(f"z[{idx}]").shape)    # noqa: S307 - our own text
            out = tuple(B if a != b else a for a, b in zip(*shapes))
            if len(shapes[0]) != len(shapes[1]) or any(
                    s != B and a != b for s, a, b in zip(out, *shapes)):
                raise AssertionError("index shape")  # pragma: no cover
            self.features.add("index")
            self.add(name, out, v.dtype, v.bound)

    def st_matmul(self):
        v = self.pick(lambda w: len(w.shape) in (1, 2) and w.shape[-1] != B)
        if v is None:
            return self.st_unary()
        k = v.shape[-1]
        name = self.fresh()
        if self.draw(st.booleans()):
            m = self.draw(st.integers(2 if "size1" in self.avoid else 1, 4))
            c = self.capture((k, m), "param" if self.draw(st.integers(0, 3)) else None)
            scale = 1.0 / k
            self.emit(f"{name} = F.matmul({v.name}, {c[0]}) * {scale!r}")
            self.add(name, v.shape[:-1] + (m,), _dt(v) if c[3] == "float32" else "float64",
                     v.bound)
        else:
            same = [w for w in self.vals if w.shape == v.shape and len(w.shape) == 2]
            if not same:
                w = v
            else:
                w = self.draw(st.sampled_from(same))
            if len(v.shape) == 1:
                self.emit(f"{name} = F.matmul({v.name}, {v.name}) / {k}.0")
                self.add(name, (), v.dtype, v.bound * v.bound)
            else:
                self.emit(f"{name} = F.matmul({v.name}, F.transpose({w.name})) / {k}.0")
                self.add(name, (v.shape[0], w.shape[0]), _dt(v, w), v.bound * w.bound)
        self.features.add("matmul")

    def st_capture_op(self):
        v = self.pick()
        # A captured value that broadcasts against v: its shape is a suffix of v's with
        # B turned into 1.
        nd = self.draw(st.integers(0, len(v.shape)))
        suffix = tuple(1 if d == B else d for d in v.shape[len(v.shape) - nd:])
        c = self.capture(suffix)
        name = self.fresh()
        op = self.draw(st.sampled_from(["mul", "add", "tanh_mul"]))
        tmpl = BINARY[op][0]
        if self.draw(st.booleans()):
            self.emit(f"{name} = " + tmpl.format(a=v.name, b=c[0]))
        else:
            self.emit(f"{name} = " + tmpl.format(a=c[0], b=v.name))
        bound = {"mul": v.bound, "add": v.bound + 1, "tanh_mul": 1.0}[op]
        dt = "float64" if c[3] == "float64" or v.dtype == "float64" else "float32"
        self.add(name, v.shape, dt, bound)

    def condition(self):
        """Source of a condition whose outcome is set by an input's sign or by s0."""
        ins = [v for v in self.vals if v.signed]
        forms = []
        if self.has_float:
            forms += ["s0 > 0.5", "s0 * 2 < 1.0"]
        for v in ins:
            d = v.data
            forms += [f"{d}.sum() > 0", f"float({d}.mean()) > 0", f"{d}.max() > 0",
                      f"bool({d}.min() > 0)", f"{d}.reshape(-1)[0].item() > 0",
                      f"int({d}.sum() > 0) == 1"]
            if v.var:
                forms += [f"F.sum({v.name}).data < 0", f"{v.name}.data.mean() < 0.0"]
            # Traced data handed to NumPy past the tracer (constructors that do not
            # dispatch for an ndarray subclass, NumPy scalars, views, copies): recorded
            # or an escape, never a branch left unguarded.
            forms += [f"np.asarray({d}).mean() > 0", f"np.array({d}).sum() > 0",
                      f"np.ascontiguousarray({d}).max() > 0",
                      f"np.asarray({d}, dtype=np.float32).mean() > 0",
                      f"np.float32({d}.mean()) > 0", f"np.float64({d}.sum()) > 0",
                      f"float(np.float32({d}.mean())) > 0",
                      f"{d}.view(np.ndarray).sum() > 0", f"{d}.copy().sum() > 0",
                      f"np.frombuffer({d}.tobytes(), {d}.dtype).sum() > 0",
                      f"{d}.astype(np.float32).mean() > 0"]
        if not forms:
            return None
        self.features.add("if")
        cond = self.draw(st.sampled_from(forms))
        if cond.startswith(("np.", "float(np.")) or ".view(" in cond or ".copy()" in cond \
                or ".astype(" in cond:
            self.features.add("numpy_entry")
        return cond

    def st_if(self):
        cond = self.condition()
        if cond is None:
            return self.st_unary()
        v = self.pick()
        name = self.fresh()
        ops = sorted(o for o, (_, bf) in UNARY.items() if bf(v.bound) <= _MAX_BOUND)
        op1, op2 = self.draw(st.sampled_from(ops)), self.draw(st.sampled_from(ops))
        self.emit(f"if {cond}:")
        self.emit(f"    {name} = {UNARY[op1][0].format(a=v.name)}")
        self.emit("else:")
        self.emit(f"    {name} = {UNARY[op2][0].format(a=v.name)}")
        self.add(name, v.shape, v.dtype, max(UNARY[op1][1](v.bound), UNARY[op2][1](v.bound)))

    def st_loop(self):
        ins = [v for v in self.vals if v.signed]
        if not ins:
            return self.st_unary()
        src = self.draw(st.sampled_from(ins))
        v = self.pick()
        name = self.fresh()
        kind = self.draw(st.sampled_from(["while_float", "while_np", "for_int", "while_item"]))
        self.emit(f"{name} = {v.name}")
        if kind == "for_int":
            self.emit(f"for _ in range(int(abs(float({src.data}.mean())) * 3) % 4):")
        else:
            init = {"while_float": f"float({src.data}.mean())",
                    "while_np": f"{src.data}.mean()",
                    "while_item": f"{src.data}.mean().item()"}[kind]
            t, k = self.fresh("t"), self.fresh("k")
            self.emit(f"{t}, {k} = {init}, 0")
            self.emit(f"while {t} < 1.2 and {k} < 4:")
            self.emit(f"    {t} = {t} + 0.55")
            self.emit(f"    {k} += 1")
        body = self.draw(st.sampled_from(["F.tanh({a}) * 1.5", "F.sin({a}) + 0.5 * {a}",
                                          "{a} * 0.8 + 0.1"]))
        self.emit(f"    {name} = " + body.format(a=name))
        self.features.add(kind)
        self.add(name, v.shape, v.dtype, max(v.bound, 3.0))

    def st_no_grad(self):
        v = self.pick()
        name = self.fresh()
        self.emit("with tj.no_grad():")
        self.emit(f"    {name} = F.sigmoid({v.name}) * 2.0")
        self.features.add("no_grad")
        self.add(name, v.shape, v.dtype, 2.0)

    def st_dropout(self):
        v = self.pick()
        name = self.fresh()
        if self.draw(st.integers(0, 4)) == 0:
            self.emit("np.random.seed(7)")
            self.features.add("seed_inside")
        self.emit(f"{name} = F.dropout({v.name}, 0.3)")
        self.features.add("dropout")
        self.add(name, v.shape, v.dtype, v.bound / 0.7)

    def st_user_function(self):
        kinds = ["Cube", "MulAdd"] + ([] if "data_backward" in self.avoid else ["TanhData"])
        if any(v.signed for v in self.vals) and "user_state" not in self.avoid:
            kinds.append("SignScale")
        kind = self.draw(st.sampled_from(kinds))
        name = self.fresh()
        if kind == "SignScale":
            v = self.draw(st.sampled_from([w for w in self.vals if w.signed]))
            self.emit(f"{name} = SignScale()({v.name})")
            self.add(name, v.shape, v.dtype, v.bound * 3)
        elif kind == "MulAdd":
            a = self.pick(lambda w: w.bound <= 5)
            if a is None:
                return self.st_unary()
            b = self.draw(st.sampled_from([w for w in self.vals
                                           if w.shape == a.shape and w.bound <= 5]))
            self.emit(f"{name} = MulAdd()({a.name}, {b.name})")
            self.add(name, a.shape, _dt(a, b), a.bound * (b.bound + 1))
        else:
            v = self.pick(lambda w: w.bound <= 3)
            if v is None:
                return self.st_unary()
            self.emit(f"{name} = {kind}()({v.name})")
            self.add(name, v.shape, v.dtype, v.bound ** 3 if kind == "Cube" else 1.0)
        self.classes.add(kind)
        self.features.add(f"user_{kind}")

    def st_inner_step(self, v=None):
        """An inner backward and an SGD update of a captured Parameter (a training step),
        its loss made of `v` (default: a value drawn)."""
        v = v or self.pick(lambda w: w.var)
        if v is None:
            return self.st_unary()
        nd = self.draw(st.integers(0, min(len(v.shape), 2)))
        suffix = tuple(1 if d == B else d for d in v.shape[len(v.shape) - nd:])
        c = self.capture(suffix, "param", reuse=False)
        W = c[0]
        self.updated.add(W)
        loss, name = self.fresh("loss"), self.fresh()
        self.emit(f"{loss} = F.mean(F.tanh({v.name} * {W}) ** 2)")
        self.emit(f"{W}.cleargrad()")
        self.emit(f"{loss}.backward()")
        lr = "s0" if self.has_float and self.draw(st.booleans()) else "0.1"
        self.emit(f"{W}.data -= {lr} * {W}.grad.data")
        self.emit(f"{name} = F.tanh({v.name} * {W})")
        self.features.add("inner_backward_update")
        self.add(name, v.shape, _dt(v), 1.0)

    def st_invariant_broadcast(self):
        """A 0-d value broadcast over a shape (a loop-invariant chain in the fused group:
        backends/numba/plan.split_group copies it into each part that reads it), read by
        two chains and by a value of its own (b * t, invariant too), beside an unrelated
        chain of the same shape: a part made of an invariant value once read the chain
        before it was defined (a KeyError at lowering, the interpret backend)."""
        t = self.pick(lambda w: w.var and w.shape == ())
        v = self.pick(lambda w: w.var and w.shape != ())
        if t is None or v is None:
            return self.st_binary()
        shape, bc, p, q, r = v.shape, self.fresh(), self.fresh(), self.fresh(), self.fresh()
        self.emit(f"{bc} = F.broadcast_to(F.reshape({t.name}, (1,) * {len(shape)}), "
                  f"{v.name}.shape)")
        self.emit(f"{p} = {bc} * {t.name}")
        self.emit(f"{q} = F.mean({bc} * {v.name}) * {t.name}")
        self.emit(f"{r} = {v.name} * 2.0 - 1.0")
        dt = _dt(t, v)
        self.add(p, shape, _dt(t), t.bound * t.bound)
        self.add(q, (), dt, t.bound * t.bound * v.bound)
        self.add(r, shape, _dt(v), v.bound * 2.0 + 1.0)
        # Returned, so each is an output of the fused group whatever reads it later.
        self.also_return += [p, q, r]
        self.features.add("invariant_broadcast")

    def st_inplace_arg(self):
        arrs = [a for a in self.args if a[1] == "array"]
        caps = [c for c in self.captures if c[1] == "array"]
        if not arrs and not caps:
            return self.st_unary()
        if arrs and (not caps or self.draw(st.booleans())):
            target = self.draw(st.sampled_from(arrs))[0]
            self.features.add("inplace_arg")
            self.emit(f"{target} += 0.5" if self.draw(st.booleans()) else f"{target} *= 0.9")
        else:
            target = self.draw(st.sampled_from(caps))[0]
            self.rebinds.add(target)
            self.features.add("inplace_capture")
            self.emit(f"{target} *= 0.9")
        for v in self.vals:
            if v.name == target:
                v.bound += 0.5
                v.signed = False


# ---------------------------------------------------------------- identity and in-place
# state (issue 9's soundness classes): a .grad no op computed (a seed passed through),
# in-place updates of argument views, a buffer updated after an op read it and before
# a backward, and eval_shape of a function that writes state. Statements of Builder,
# drawn from STATE_STEPS (weights); `focus="state"` draws mostly these.

def _st_seed_through(self):
    """A backward whose seed passes through unchanged to an argument's or a captured
    Parameter's .grad, which is then a value (eager: the seed Variable itself)."""
    vars_ = [a for a in self.args if a[1] == "var"]
    use_param = not vars_ or self.draw(st.booleans())
    if use_param:
        v = self.pick(lambda w: w.var)
        nd = self.draw(st.integers(0, min(len(v.shape), 2)))
        shape = tuple(1 if d == B else d for d in v.shape[len(v.shape) - nd:])
        c = self.capture(shape, "param", reuse=False)
        self.updated.add(c[0])
        target, shape, dtype = c[0], c[2], c[3]
    else:
        a = self.draw(st.sampled_from(vars_))
        target, shape, dtype = a[0], a[2].shape, a[2].dtype
    y, g = self.fresh("y"), self.fresh("g")
    chain = self.draw(st.sampled_from(["{t} + 0.5", "{t} - 0.25", "({t} + 0.5) - 0.25",
                                       "F.reshape({t}, {t}.shape)"]))
    self.emit(f"{target}.cleargrad()")
    self.emit(f"{y} = " + chain.format(t=target))
    retain = self.draw(st.booleans())
    # A create_graph seed is a Constant in eager, and stays one.
    graph = self.draw(st.booleans())
    self.emit(f"{y}.backward(retain_grad={retain}, create_graph={graph})")
    if graph:
        self.features.add("seed_through_create_graph")
    self.emit(f"{g} = {target}.grad")
    self.features.add("seed_through_" + ("param" if use_param else "arg"))
    self.add(g, shape, dtype, 1.0)
    if retain:
        self.add(self.fresh(), shape, dtype, 1.0)
        self.emit(f"{self.vals[-1].name} = {y}.grad")
        self.features.add("seed_through_retained")
        if self.draw(st.booleans()):
            # y itself too: its .grad is that returned seed object (eager: y.grad is
            # the result returned before it, sharing its memory).
            self.add(y, shape, dtype, 2.0)
            self.features.add("seed_through_retained_holder")
    if self.draw(st.booleans()):
        # A view of the passed-through (or retained) .grad returned, maybe with it: eager's
        # is a view of the .grad's array, which the caller holds as target.grad.
        _return_view_of(self, self.vals[-1].name, len(shape), "seed_through")


def _return_view_of(b, name, nd, feature):
    """Return a view (Variable or array, maybe a view of a view) of Variable `name`
    (of nd dimensions), and sometimes `name` itself beside it."""
    forms = [f"F.transpose({name})", f"{name}.T", f"F.reshape({name}, (-1,))",
             f"{name}.data.T", f"{name}.data.reshape(-1)",
             f"F.transpose(F.reshape({name}, (-1, 1)))", f"{name}.data.T.reshape(-1)"]
    if nd >= 1:
        forms += [f"{name}.data[::-1]", f"{name}.data[1:]", f"{name}.data[..., ::2].T",
                  f"{name}.data[0]"]
    view = b.fresh("gview")
    b.emit(f"{view} = {b.draw(st.sampled_from(forms))}")
    if b.draw(st.booleans()):
        b.returned_views.append(name)
    b.returned_views.append(view)
    b.features.add(f"returned_view_of_{feature}")


def _st_inplace_view_arg(self):
    """An ndarray argument that is a view of a bigger buffer (a batch slice), updated in
    place: eager writes through it."""
    arrs = [a for a in self.args if a[1] == "array"]
    if not arrs:
        return self.st_unary()
    name = self.draw(st.sampled_from(arrs))[0]
    self.view_args[name] = self.draw(st.sampled_from(["rows", "strided"]))
    form = self.draw(st.sampled_from(["{a} *= 0.9", "{a} += 0.5",
                                      "np.multiply({a}, 0.75, out={a})"]))
    self.emit(form.format(a=name))
    self.features.add("inplace_view_arg")
    for v in self.vals:
        if v.name == name:
            v.bound += 0.5
            v.signed = False


def _st_update_before_backward(self):
    """An op reads a captured array (or a Parameter's .data), the buffer is updated in
    place, then a backward inside: eager's backward reads the updated buffer."""
    v = self.pick(lambda w: w.var and w.bound <= 10)
    if v is None:
        return self.st_unary()
    nd = self.draw(st.integers(0, min(len(v.shape), 2)))
    suffix = tuple(1 if d == B else d for d in v.shape[len(v.shape) - nd:])
    W = self.capture(suffix, "param", reuse=False)[0]
    self.updated.add(W)
    loss, name = self.fresh("loss"), self.fresh()
    if self.draw(st.booleans()):
        K = self.capture(suffix, "array", reuse=False)[0]
        self.updated.add(K)
        self.rebinds.add(K)
        self.emit(f"{loss} = F.mean(F.tanh({v.name} * {W}) * {K})")
        self.emit(f"{K} *= 0.9")
        self.features.add("capture_updated_before_backward")
    else:
        d = self.fresh("d")
        self.emit(f"{d} = {W}.data")
        self.emit(f"{loss} = F.mean(F.tanh({v.name} * {W}) * {d})")
        self.emit(f"{W}.data *= 0.5")
        self.features.add("data_held_across_update")
    self.emit(f"{W}.cleargrad()")
    self.emit(f"{loss}.backward()")
    self.emit(f"{W}.data -= 0.1 * {W}.grad.data")
    self.emit(f"{name} = F.tanh({v.name} * {W})")
    self.add(name, v.shape, _dt(v), 1.0)


def _st_eval_shape_writes(self):
    """eval_shape of a helper that writes captured state (a Parameter's data and grad,
    an array in place, a draw): none of it may happen, eager or compiled."""
    v = self.pick(lambda w: w.var)
    nd = self.draw(st.integers(0, min(len(v.shape), 2)))
    suffix = tuple(1 if d == B else d for d in v.shape[len(v.shape) - nd:])
    Wc, Kc = self.capture(suffix, "param"), self.capture(suffix, "array")
    W, K = Wc[0], Kc[0]
    fn, name = self.fresh("es"), self.fresh()
    self.emit(f"def {fn}(a):")
    writes = self.draw(st.lists(st.sampled_from([
        f"{W}.data -= 0.5 * {W}.data", f"{W}.data[...] = 3.0", f"{W}.grad = a",
        f"np.multiply({K}, 0.5, out={K})", "np.random.rand(2)",
        f"{W}.data = {W}.data * 0.0"]), min_size=1, max_size=3, unique=True))
    for w in writes:
        self.emit("    " + w)
    self.emit("    return F.tanh(a) * 2.0")
    self.emit(f"_ = tj.eval_shape({fn}, {v.name})")
    self.emit(f"{name} = {v.name} * {W} + {K}")
    self.features.add("eval_shape_writes")
    dt = "float64" if "float64" in (v.dtype, Wc[3], Kc[3]) else "float32"
    self.add(name, v.shape, dt, v.bound + 1)


Builder.st_seed_through = _st_seed_through
Builder.st_inplace_view_arg = _st_inplace_view_arg
Builder.st_update_before_backward = _st_update_before_backward
Builder.st_eval_shape_writes = _st_eval_shape_writes
STATE_STEPS = [("st_seed_through", 1), ("st_inplace_view_arg", 1),
               ("st_update_before_backward", 1), ("st_eval_shape_writes", 1)]


def _view_of(name, how):
    """Source making argument `name` a view of a bigger buffer (`how`: "rows", a
    contiguous slice; "strided", every other element)."""
    if how == "rows":
        return f"    {name} = np.stack([{name} * 0.0, {name}])[1, ...]"
    return f"    {name} = np.stack([{name}, {name} * 0.0], axis=-1)[..., 0]"


# ---------------------------------------------------------------- escapes (helper "escapes")
# Views of a captured Parameter taken before an in-place update, index arrays passed as
# arguments (mixed with slices, negative steps, None, Ellipsis), NumPy scalar arguments,
# and buffer reads of traced data (struct), each a statement of its own. Extra arguments
# are (name, source of its value in args(call), with nb, sign and s in scope).

def _escapes_view_then_update(b):
    """A view of a captured Parameter (F.reshape, F.transpose, a reversed slice, `.data`,
    `.data.T`) read by an op, the Parameter (or another) updated in place, the view used
    again: eager's view shows the update, in the forward and in the backward."""
    v = b.pick(lambda w: w.var)
    if v is None:
        return b.st_unary()
    nd = b.draw(st.integers(0, min(len(v.shape), 2)))
    suffix = tuple(1 if d == B else d for d in v.shape[len(v.shape) - nd:])
    c = b.capture(suffix, "param", reuse=False)
    W = c[0]
    b.updated.add(W)
    kinds = ["reshape", "data"] + (["transpose", "data_T"] if nd == 2 else []) + \
        (["reverse"] if nd >= 1 else [])
    kind = b.draw(st.sampled_from(kinds))
    r = b.fresh("view")
    undo = {"reshape": (f"F.reshape({W}, (-1,))", f"F.reshape({r}, {W}.shape)"),
            "transpose": (f"F.transpose({W})", f"F.transpose({r})"),
            "reverse": (f"{W}[..., ::-1]", f"{r}[..., ::-1]"),
            "data": (f"{W}.data", r), "data_T": (f"{W}.data.T", f"{r}.T")}[kind]
    b.emit(f"{r} = {undo[0]}")
    y1, name = b.fresh(), b.fresh()
    b.emit(f"{y1} = F.tanh({v.name} * {undo[1]})")
    # (A `.data` view carries no gradient: W.grad stays None, no SGD step from it.)
    how = b.draw(st.sampled_from(["scale", "other"] + (["sgd"] if kind not in (
        "data", "data_T") else [])))
    if how == "scale":
        b.emit(f"{W}.data *= 0.9")
    elif how == "sgd":
        loss = b.fresh("loss")
        b.emit(f"{loss} = F.mean({y1} ** 2)")
        b.emit(f"{W}.cleargrad()")
        b.emit(f"{loss}.backward()")
        b.emit(f"{W}.data -= 0.1 * {W}.grad.data")
    else:
        o = b.capture(suffix, "param", reuse=False)
        b.updated.add(o[0])
        b.emit(f"{o[0]}.data -= 0.05 * {o[0]}.data")
        b.emit(f"{y1} = {y1} * {o[0]}")
    b.emit(f"{name} = {y1} + F.tanh({v.name} * {undo[1]})")
    b.features.add(f"view_then_update_{kind}")
    b.add(name, v.shape, _dt(v), 2.0)


def _escapes_index_argument(b):
    """x[i, ::-1] with i an int ndarray argument: one advanced index among slices (any
    step), ints, None and Ellipsis."""
    v = b.pick(lambda w: w.var and len(w.shape) >= 1)
    if v is None:
        return b.st_unary()
    nd = len(v.shape)
    axis = b.draw(st.integers(0, nd - 1))
    small = 2 if "size1" in b.avoid else 1
    k = b.draw(st.integers(small, 3))
    i = f"i{len(b.extra_args)}"
    d = v.shape[axis]
    bound = "nb" if d == B else str(d)
    b.extra_args.append((i, f"rng.integers(-{bound}, {bound}, size={k})"))
    b.extra_kinds[i] = "int_array"
    key = []
    for ax, dim in enumerate(v.shape):
        if ax == axis:
            key.append(i)
        elif dim == B or "size1" in b.avoid:
            key.append(b.draw(st.sampled_from([":", "::-1"])))
        else:
            key.append(b.draw(st.sampled_from([":", "::-1", "::2", "-1", "0"])))
    if "size1" not in b.avoid and b.draw(st.integers(0, 3)) == 0:
        key.insert(b.draw(st.integers(0, len(key))), "None")
    if b.draw(st.integers(0, 3)) == 0:
        while len(key) > 1 and key[-1] == ":":
            key.pop()
        key.append("...")
    # The result's shape, from NumPy on two batch sides (what changes is B).
    shapes = []
    for nb in (5, 7):
        concrete = tuple(nb if dim == B else dim for dim in v.shape)
        idx = tuple(np.zeros(k, np.int64) if e == i else None if e == "None" else
                    Ellipsis if e == "..." else eval(f"np.s_[{e}]") for e in key)
        shapes.append(np.zeros(concrete)[idx].shape)
    out = tuple(B if a != c else a for a, c in zip(*shapes))
    if "size1" in b.avoid and 1 in out:
        return b.st_unary()
    name = b.fresh()
    b.emit(f"{name} = {v.name}[{', '.join(key)}] * 1.5")
    b.features.add("index_argument")
    b.add(name, out, v.dtype, v.bound * 1.5)


def _escapes_numpy_scalar_argument(b):
    """An np.float32 / np.float64 argument: arithmetic with Variables and Python floats,
    and sometimes grad with respect to it (eager's leaf is float64)."""
    v = b.pick(lambda w: w.var)
    if v is None:
        return b.st_unary()
    n = f"n{len(b.extra_args)}"
    dtype = b.draw(st.sampled_from(["float32", "float64"]))
    b.extra_args.append((n, f"np.{dtype}(0.5 + s)"))
    b.extra_kinds[n] = "other"
    name = b.fresh()
    if b.draw(st.booleans()):
        g = b.fresh("g")
        b.emit(f"{g} = tj.grad(lambda u: F.sum(F.tanh(u * {v.name})))({n})")
        b.emit(f"{name} = {v.name} * {g} + {n} * 0.5")
        b.features.add("numpy_scalar_argument_grad")
        b.add(name, v.shape, "float64", v.bound * 6 + 1)
    else:
        b.emit(f"{name} = {v.name} * {n} + ({n} * 2.0 - 1.0)")
        b.features.add("numpy_scalar_argument")
        b.add(name, v.shape, "float64" if dtype == "float64" else _dt(v), v.bound * 1.5 + 2)


def _escapes_buffer_read(b):
    """A branch on bytes C code reads from traced data (struct.unpack_from): runs eagerly
    (warned), never a frozen branch."""
    # struct reads a C-contiguous buffer only (else eager raises ValueError): never an
    # argument whose layout args() varies (_argument_view's flattened slice).
    ins = [w for w in b.vals if w.signed and w.var and w.name.startswith("x")
           and w.name not in b.layout_flip]
    v = b.pick(lambda w: w.var)
    if not ins or v is None:
        return b.st_unary()
    src = b.draw(st.sampled_from(ins))
    b.buffer_reads.add(src.name)
    fmt = "d" if src.dtype == "float64" else "f"
    name = b.fresh()
    b.emit(f"if struct.unpack_from({fmt!r}, {src.name}.data)[0] > 0:")
    b.emit(f"    {name} = F.tanh({v.name})")
    b.emit("else:")
    b.emit(f"    {name} = F.sin({v.name}) * 0.5")
    b.features.add("buffer_read")
    b.add(name, v.shape, v.dtype, 1.0)


ESCAPES_STEPS = [(_escapes_view_then_update, 1), (_escapes_index_argument, 1),
                 (_escapes_numpy_scalar_argument, 1), (_escapes_buffer_read, 1)]
# ---------------------------------------------------------------- end of escapes block


# ======================================================== nested grad (grad of grad)
# Functional transforms inside f: grad, value_and_grad, grad of grad, grad of
# value_and_grad, an inner function closing over a value of f. The harness's backward
# (plain or create_graph) then differentiates through their results: the outer pass
# goes through grad's identity link to the argument (autodiff._as_diff_variable).
# focus="nested_grad" (--focus nested_grad) draws this statement far more often.

# form -> (source template with {a} the argument and {c} a closure value, bound)
NESTED_GRAD = {
    "grad": ("tj.grad(lambda z: F.sum(F.sin(z) * z))({a})", lambda b, c: b + 1),
    "grad_closure": ("tj.grad(lambda z: F.sum(F.tanh(z) * {c}))({a})", lambda b, c: c),
    "grad_grad": ("tj.grad(lambda z: F.sum(tj.grad(lambda u: F.sum(F.sin(u) * u))(z)"
                  " * z))({a})", lambda b, c: (2 + b) * b + b + 1),
    "value_and_grad": ("tj.value_and_grad(lambda z: F.sum(F.tanh(z) * z))({a})[1]",
                       lambda b, c: b + 1),
    "grad_of_value_and_grad": ("tj.grad(lambda z: F.sum(tj.value_and_grad("
                               "lambda u: F.sum(u ** 3) * 0.5)(z)[1]))({a})",
                               lambda b, c: 3 * b),
    "grad_argnums": ("tj.grad(lambda z, y: F.sum(F.tanh(z * y)), argnums=(0, 1))"
                     "({a}, {c})[0]", lambda b, c: c),
}


def _st_nested_grad(b):
    a = b.pick()
    if a is None:
        return b.st_unary()
    # A closure value (or grad_argnums' second argument) that broadcasts to a's shape,
    # so the gradient keeps a's shape.
    cs = [w for w in b.vals if w.var and w.bound <= 5 and bcast(a.shape, w.shape) ==
          a.shape]
    forms = [f for f, (_, bf) in NESTED_GRAD.items()
             if (cs or "{c}" not in NESTED_GRAD[f][0]) and bf(a.bound, 5.0) <= _MAX_BOUND]
    if not forms:
        return b.st_unary()
    form = b.draw(st.sampled_from(sorted(forms)))
    tmpl, bf = NESTED_GRAD[form]
    c = b.draw(st.sampled_from(cs)) if "{c}" in tmpl else None
    name = b.fresh()
    b.emit(f"{name} = {tmpl.format(a=a.name, c=c.name if c else '')}")
    dtype = _dt(a, c) if c is not None else a.dtype
    b.add(name, a.shape, dtype, bf(a.bound, c.bound if c else 0.0))
    b.features.add(f"nested_grad_{form}")


NESTED_GRAD_STEPS = [(_st_nested_grad, 1)]


# ---- nested grad through user Functions (block: nested grad of user Functions) ----------
# grad and grad of grad inside f through a user Function: one with per-call state
# (SignScale; the compiled create_graph backward must keep each call's own self.k), one
# whose backward reads .data (TanhData: detached, eager misses a term and so must jit).

# form -> (source template with {a} the argument, bound given a's bound, its class)
NESTED_GRAD_USER = {
    "grad_signscale": ("tj.grad(lambda z: F.sum(SignScale()(z) * z))({a})",
                       lambda b: 6 * b, "SignScale"),
    "grad_grad_signscale": ("tj.grad(lambda z: F.sum(tj.grad(lambda u: F.sum(SignScale()(u)"
                            " * u))(z) * z))({a})", lambda b: 12 * b, "SignScale"),
    "grad_tanhdata": ("tj.grad(lambda z: F.sum(TanhData()(z) * z))({a})",
                      lambda b: 1 + b, "TanhData"),
    "grad_grad_cube": ("tj.grad(lambda z: F.sum(tj.grad(lambda u: F.sum(Cube()(u)))(z)"
                       " * z))({a})", lambda b: 9 * b * b, "Cube"),
}


# the avoidable construct (AVOIDABLE) each class is
_NESTED_GRAD_USER_AVOID = {"SignScale": "user_state", "TanhData": "data_backward"}


def _st_nested_grad_user(b):
    a = b.pick()
    if a is None:
        return b.st_unary()
    # SignScale only on a signed value (one whose sum is away from 0, its sign flipping
    # between calls), as st_user_function does.
    forms = [f for f, (_, bf, kind) in NESTED_GRAD_USER.items()
             if bf(a.bound) <= _MAX_BOUND and _NESTED_GRAD_USER_AVOID.get(kind) not in b.avoid
             and (kind != "SignScale" or a.signed)]
    if not forms:
        return b.st_unary()
    form = b.draw(st.sampled_from(sorted(forms)))
    tmpl, bf, kind = NESTED_GRAD_USER[form]
    name = b.fresh()
    b.emit(f"{name} = {tmpl.format(a=a.name)}")
    b.add(name, a.shape, a.dtype, bf(a.bound))
    b.classes.add(kind)
    b.features.add(f"nested_grad_{form}")


NESTED_GRAD_STEPS.append((_st_nested_grad_user, 1))
# ---- end of block: nested grad of user Functions -----------------------------------------

# ==================================================== end of nested grad (grad of grad)


# ---------------------------------------------------------------- returned views (helper
# "views"). A result eager returns as a view of an argument's, a capture's or another
# value's buffer (`x.data[::-1]`, `.data.T`, `.reshape(-1)`, F.reshape, F.transpose, a
# captured array's slice): the harness compares which buffers each result shares
# memory with. Each step emits the view and adds it to the returned values.

def _views_returned(b):
    v = b.pick(lambda w: True, recent=8)
    if v is None:
        return b.st_unary()
    nd = len(v.shape)
    data = f"{v.name}.data" if v.var else v.name
    forms = [f"{data}.T", f"{data}.reshape(-1)"]
    if nd >= 1:
        forms += [f"{data}[::-1]", f"{data}[..., 1:]", f"{data}[None]"]
    if nd >= 2:
        # A reshape NumPy answers with a copy (of a transposed view): a new array each
        # time, twice two (program 254: the graph's one array came back for both).
        forms += [f"{data}.T.reshape(-1)"]
    if v.var:
        forms += [f"F.reshape({v.name}, (-1,))", f"F.transpose({v.name})"]
    cap = None
    if b.draw(st.integers(0, 3)) == 0:
        suffix = tuple(d for d in v.shape if d != B)[:2]
        cap = b.capture(suffix, reuse=True)
        W = cap[0] + (".data" if cap[1] == "param" else "")
        forms = [f"{W}.T", f"{W}.reshape(-1)"] + ([f"{W}[::-1]"] if suffix else [])
    form = b.draw(st.sampled_from(forms))
    name = b.fresh("view")
    b.emit(f"{name} = {form}")
    b.returned_views.append(name)
    if b.draw(st.integers(0, 3)) == 0:
        # The same view twice (two objects in eager; empty of a size-1 batch, so no
        # memory to rebuild them on: the passes merged them, program 3298).
        twin = b.fresh("view")
        b.emit(f"{twin} = {form}")
        b.returned_views.append(twin)
        b.features.add("returned_view_twice")
    b.features.add("returned_view_capture" if cap is not None else
                   "returned_view_" + ("variable" if form.startswith("F.") else "array"))


def _views_of_grads(b):
    """A backward inside f, then a view of a .grad returned: a seed passed through to an
    argument's or a captured Parameter's .grad (shared by two: `y = x + w`), a retained
    .grad, or a computed one (views of it are views of the .grad's array in eager)."""
    vars_ = [a for a in b.args if a[1] == "var"]
    v = b.pick(lambda w: w.var and w.bound <= 10)
    if v is None:
        return b.st_unary()
    if vars_ and b.draw(st.booleans()):
        a = b.draw(st.sampled_from(vars_))
        target, shape = a[0], a[2].shape
    else:
        suffix = tuple(d for d in v.shape if d != B)[-2:]
        c = b.capture(suffix, "param", reuse=False)
        b.updated.add(c[0])
        target, shape = c[0], c[2]
    y = b.fresh("y")
    kind = b.draw(st.sampled_from(["seed", "shared_seed", "retained", "computed"]))
    if kind == "shared_seed" and B in shape:
        kind = "seed"           # (a capture has no batch dimension)
    b.emit(f"{target}.cleargrad()")
    if kind == "seed":
        b.emit(f"{y} = F.reshape({target}, {target}.shape)")
    elif kind == "shared_seed":
        # x.grad is w.grad: add's backward gives both the seed.
        other = b.capture(tuple(shape), "param", reuse=False)
        b.updated.add(other[0])
        b.emit(f"{other[0]}.cleargrad()")
        b.emit(f"{y} = {target} + {other[0]}")
    elif kind == "retained":
        h = b.fresh("h")
        b.emit(f"{h} = {target} * 2.0")
        b.emit(f"{y} = {h} + 1.0")
    else:
        b.emit(f"{y} = F.sum(F.tanh({target}) * {target})")
    b.emit(f"{y}.backward(retain_grad={kind == 'retained'})")
    g = b.fresh("g")
    b.emit(f"{g} = {h}.grad" if kind == "retained" else f"{g} = {target}.grad")
    b.add(g, tuple(shape), _target_dtype(b, target), 1.0)
    _return_view_of(b, g, len(shape), f"{kind}_grad")


def _target_dtype(b, target):
    for a in b.args:
        if a[0] == target:
            return a[2].dtype
    for c in b.captures:
        if c[0] == target:
            return c[3]
    return "float64"


# Merged values: equal computations (one value after CSE), one value returned twice,
# results a pass may simplify into an input (`x * 1.0`, eager: a new array) and a
# result equal to the state the call stores, each returned as it is or through a view.
# Eager's arrays of distinct values are distinct buffers: the harness compares which
# buffers each result (and each stored state) shares memory with.
_MERGED = [("F.sin({a}) * 0.5", lambda a: 0.5), ("F.tanh({a}) + 1.0", lambda a: 2.0),
           ("F.exp({a} * 0.25) * 0.5", lambda a: 0.5 * float(np.exp(0.25 * a))),
           ("{a} * {a} - 0.5", lambda a: a * a + 0.5)]
_SIMPLIFIABLE = ["{a} * 1.0", "{a} + 0.0", "{a} - 0.0", "{a} / 1.0"]


def _merged_view_forms(name, nd):
    forms = [name, name, f"F.reshape({name}, (-1,))", f"F.transpose({name})",
             f"{name}.T", f"{name}.data", f"{name}.data.T"]
    forms += [f"{name}.data[..., 1:]", f"{name}.data[::-1]"] if nd else [f"{name}.data[...]"]
    return forms


def _merged_views(b):
    v = b.pick(lambda w: w.var and w.bound <= 10, recent=8)
    if v is None:
        return b.st_unary()
    kind = b.draw(st.sampled_from(["cse", "cse", "twice", "simplifiable", "stored"]))
    if kind == "stored":
        got = st_rebound_state(b)
        if got is None:
            return None
        w, prev, term = got
        m = b.fresh("m")
        # The state's own expression again: CSE makes one value of the two.
        b.emit(f"if {prev} is None:")
        b.emit(f"    {m} = F.tanh({w.name} * 0.5)")
        b.emit("else:")
        b.emit(f"    {m} = F.tanh({w.name} * 0.5 + {term})")
        b.add(m, w.shape, _dt(w), 1.0)
        names, nd = [m], len(w.shape)
    elif kind == "simplifiable":
        names = []
        for tmpl in b.draw(st.lists(st.sampled_from(_SIMPLIFIABLE), min_size=1,
                                    max_size=2)):
            m = b.fresh("m")
            b.emit(f"{m} = {tmpl.format(a=v.name)}")
            b.add(m, v.shape, v.dtype, v.bound, signed=v.signed)
            names.append(m)
        if b.draw(st.booleans()):
            names.append(v.name)     # the input of the identity too
        nd = len(v.shape)
    else:
        tmpl, bf = b.draw(st.sampled_from([t for t in _MERGED if t[1](v.bound) <= _MAX_BOUND]))
        bound = bf(v.bound)
        m1 = b.fresh("m")
        b.emit(f"{m1} = {tmpl.format(a=v.name)}")
        b.add(m1, v.shape, v.dtype, bound)
        names = [m1, m1]
        if kind == "cse":
            m2 = b.fresh("m")
            b.emit(f"{m2} = {tmpl.format(a=v.name)}")
            b.add(m2, v.shape, v.dtype, bound)
            names[1] = m2
        nd = len(v.shape)
    for name in names:
        form = b.draw(st.sampled_from(_merged_view_forms(name, nd)))
        if form == name:
            b.returned_views.append(name)
            continue
        view = b.fresh("mview")
        b.emit(f"{view} = {form}")
        b.returned_views.append(view)
    b.features.add(f"merged_{kind}")


def _views_of_laid_out(b):
    """A value NumPy computes from a transposed operand, laid out as that operand
    (order='K': F.tanh(F.transpose(x, (1, 2, 0))) has x's memory order, not C order),
    returned with its .data or a view of it: the harness compares the strides of what
    shares memory (the kernels write C order; the runner must lay it out as eager's)."""
    v = b.pick(lambda w: w.var and len(w.shape) >= 2 and w.bound <= 10, recent=8)
    if v is None:
        return b.st_unary()
    nd = len(v.shape)
    perm = tuple(b.draw(st.permutations(range(nd))))
    if perm == tuple(range(nd)):
        perm = perm[::-1]
    shape = tuple(v.shape[d] for d in perm)
    name = b.fresh("lay")
    tmpl = b.draw(st.sampled_from(["F.tanh({t} * 0.5)", "F.sin({t}) + 1.0",
                                   "{t} * 2.0 + 0.5"]))
    b.emit(f"{name} = {tmpl.format(t=f'F.transpose({v.name}, {perm})')}")
    b.add(name, shape, v.dtype, 2.0 * v.bound + 1.0)
    b.returned_views.append(name)
    form = b.draw(st.sampled_from([f"{name}.data", f"{name}.data.reshape(-1)",
                                   f"{name}.data.T", f"F.reshape({name}, (-1,))",
                                   f"{name}.data[..., 1:]"]))
    view = b.fresh("lview")
    b.emit(f"{view} = {form}")
    b.returned_views.append(view)
    b.features.add("returned_view_laid_out")


def _one_buffer_many_ways(b):
    """One buffer returned as several kinds of result, made and returned in drawn
    orders: the Variable holding it (or not returned: its `.data` read once, `a`), its
    `.data`, a view of it (`.reshape(-1)`, a reshape to its own shape for a 1-d value:
    no op, the Variable's own Value), `Variable(a)`, `Variable(Variable(a).data)`,
    `Variable(a.T)` and that one's .data; a new Variable sometimes read by a later
    result. Eager's are that one array or views of it whatever the order; compiled
    calls rooted the rebuild on the first, so a view returned before h made h a view
    of it, and `Variable(h.data)` held an array the view did not see."""
    v = b.pick(lambda w: w.var and w.bound <= 10, recent=8)
    if v is None:
        return b.st_unary()
    a = b.fresh("a")
    returned = b.draw(st.booleans())
    b.emit(f"{a} = {v.name}.data")
    forms = {"data": a, "view": f"{a}.reshape(-1)",
             "wrap": f"tj.Variable({a})", "wrap2": f"tj.Variable(tj.Variable({a}).data)",
             "wrapT": f"tj.Variable({a}.T)"}
    if v.shape:
        forms["rev"] = f"{a}[::-1]"
    kinds = b.draw(st.lists(st.sampled_from(sorted(forms)), min_size=2, max_size=4,
                            unique=True))
    names = {}
    for k in kinds:
        names[k] = b.fresh("o")
        b.emit(f"{names[k]} = {forms[k]}")
    out = [names[k] for k in kinds]
    if "wrapT" in names and b.draw(st.booleans()):
        out.append(f"{names['wrapT']}.data")
    if returned:
        out.append(v.name)
    wraps = [names[k] for k in kinds if k.startswith("wrap") and k != "wrapT"]
    if wraps and b.draw(st.booleans()):
        # A new Variable an op reads: an input of the compiled Function, made before
        # the results (the fuzzer's reproducer).
        h = b.fresh()
        b.emit(f"{h} = F.sin({v.name} * {wraps[0]})")
        b.add(h, v.shape, v.dtype, 1.0)
        out.append(h)
    for name in b.draw(st.permutations(out)):
        b.returned_views.append(name)
    b.features.add("one_buffer_" + ("with_owner" if returned else "owner_not_returned"))


VIEWS_STEPS = [(_views_returned, 1), (_views_of_grads, 1), (_merged_views, 1)]
# Drawn by focus="views" only (the other profiles keep their programs).
VIEWS_FOCUS_STEPS = [(_views_of_laid_out, 12), (_one_buffer_many_ways, 12)]
# ---------------------------------------------------------------- end of returned views


def _start_states(b):
    """The program's first state: its list, and the calls that reset it (0, 6 and up
    to two more), drawn once."""
    if not hasattr(b, "states"):
        b.states = []
        b.state_resets = sorted({0, 6} | set(b.draw(st.lists(st.integers(1, 9),
                                                             max_size=2))))


# --------------------------------------------------- mixed-dtype cotangents (helper
# "gydtype"). A float32 value reaches a float64 state through a float64 captured
# Parameter (so the state's gradient would be float64) and a float32 result (so its
# gradient would be float32): the harness's backward adds each float result's term, so
# beside the float64 result returned here the float32 result gets a float64 gradient,
# which eager promotes down to the input, while the state, threaded to the next call,
# gets none (a dead output, whose zeros the compiled backward adds). Deep run seed
# 40000, program 139: the compiled backward cast the input's gradient to the float32
# eager gives from a float32 gradient. The float32 result is returned as itself or as a
# view (rebuilt on it outside the compiled call, the cotangent arriving through it).

def _st_mixed_dtype_cotangents(b):
    v = b.pick(lambda w: w.var and w.dtype == "float32", recent=8)
    if v is None:
        return b.st_unary()
    _start_states(b)
    shape = tuple(1 if d == B else d for d in v.shape[-1:])
    # A float64 Parameter of its own (capture() draws the dtype).
    W = ("W" + str(len(b.captures)), "param", shape, "float64",
         b.draw(st.sampled_from(["global", "closure"])))
    b.captures.append(W)
    b.features.add(f"capture_param_{W[4]}")
    k = len(b.states)
    holder = b.draw(st.sampled_from(["object", "layer", "dict", "global"]))
    ref = {"object": f"STATE{k}.h", "layer": f"LAYER{k}.h", "dict": f"STATED{k}['h']",
           "global": f"H{k}"}[holder]
    prev, st64, t32, r64 = b.fresh("p"), b.fresh(), b.fresh(), b.fresh()
    b.emit(f"{prev} = {ref}")
    b.emit(f"if {prev} is None:")
    b.emit(f"    {st64} = F.tanh({v.name} * {W[0]})")
    b.emit("else:")
    b.emit(f"    {st64} = F.tanh({v.name} * {W[0]} + 0.5 * {prev})")
    b.emit(f"{ref} = {st64}")
    b.states.append((holder, ref, k))
    b.emit(f"{t32} = F.sin({v.name}) * 0.5")
    form = b.draw(st.sampled_from(["itself", "transpose", "reshape"]))
    if form == "itself":
        out32 = t32
    else:
        out32 = b.fresh("view")
        b.emit(f"{out32} = " + (f"F.transpose({t32})" if form == "transpose" else
                                f"F.reshape({t32}, (-1,))"))
    # A float64 result not reached from v: the loss is float64, the state stays dead.
    b.emit(f"{r64} = F.tanh({W[0]}) * 2.0")
    b.returned_views += [out32, r64]
    b.add(st64, v.shape, "float64", 1.0)
    b.add(t32, v.shape, "float32", 0.5)
    b.features.add("mixed_dtype_cotangent_" + form)


MIXED_DTYPE_STEPS = [(_st_mixed_dtype_cotangents, 1)]
# ----------------------------------------------------- end of mixed-dtype cotangents


# ---------------------------------------------------------- argument views (helper
# "argviews"). An intermediate eager holds as a view of an argument's buffer
# (F.transpose(x), F.reshape(x), a view of a view, x.data.T wrapped), read by the
# backward of what consumes it: a caller's update between the call and the backward
# (argument_update_programs) reaches it through the buffer. Drawn only with
# focus="argument_views", which argument_update_programs picks for half its programs.

def _argument_view(b):
    args = [v for _, _, v in b.args if v is not None and len(v.shape) > 0]
    if not args:
        return b.st_unary()
    v = b.draw(st.sampled_from(args))
    nd = len(v.shape)
    x = v.name
    forms = [(f"F.reshape({x}, {x}.shape + (1,))", v.shape + (1,))]
    if nd >= 2:
        rev = tuple(reversed(v.shape))
        forms += [(f"F.transpose({x})", rev),
                  (f"F.reshape(F.transpose({x}), {x}.shape[::-1])", rev)]
        if v.var:
            forms.append((f"tj.Variable({x}.data.T)", rev))
    if B not in v.shape:
        forms.append((f"F.reshape({x}, (-1,))", (int(np.prod(v.shape)),)))
    fixed = int(np.prod([d for d in v.shape if d != B]))
    if v.var and nd >= 2 and fixed >= 2 and x not in b.buffer_reads:
        # Flattened and sliced: a view of a C-contiguous buffer, a copy of any other
        # (args() changes the argument's layout between calls: issue 9's helper task
        # 5), so the result aliases the argument on some calls only.
        forms.append((f"tj.Variable({x}.data.reshape(-1)[0:2])", (2,)))
    form, shape = b.draw(st.sampled_from(forms))
    flip = form.endswith("reshape(-1)[0:2])")
    if flip:
        b.layout_flip.add(x)
        b.features.add("argument_layout_flip")
    t = b.fresh("av")
    b.emit(f"{t} = {form}")
    if flip and b.draw(st.booleans()):
        # The argument updated in place after: the view shows it, the copy (the
        # layouts where the reshape copies) does not; a variant traced on one layout
        # must not run the other (and the checks must rerun on copies of this layout).
        b.emit(f"{x}.data += 0.25")
        b.features.add("argument_layout_flip_update")
    if flip and b.draw(st.booleans()):
        # Returned too: the harness compares what each result aliases.
        b.returned_views.append(t)
        b.features.add("argument_layout_flip_returned")
    name = b.fresh()
    use = b.draw(st.sampled_from(["pow", "div", "mul", "tanh_mul"]))
    other = b.pick(lambda w: w.var and w.shape == shape and w.name != t)
    o = other.name if other is not None else "1.5"
    if other is None and use == "tanh_mul":
        use = "mul"                 # F.tanh of a Python float raises
    b.emit(f"{name} = " + {"pow": f"{t} ** 2",
                           "div": f"{o} / ({t} * {t} + 1)",
                           "mul": f"{o} * {t}",
                           "tanh_mul": f"F.tanh({o}) * {t}"}[use])
    bound = max(v.bound, other.bound if other is not None else 1.5)
    b.add(name, shape, v.dtype, bound * bound if use == "pow" else
          bound if use == "div" else bound * v.bound)
    b.features.add("argument_view")


ARGUMENT_VIEW_STEPS = [(_argument_view, 1)]
# ------------------------------------------------------------ end of argument views


# ---------------------------------------------------------------- unchain inside f (helper
# "unchain"). An argument with a creator (u = F.tanh(x0 * 0.5), made by the caller in
# args()) and an unchain_backward() or unchain() inside f on a value that depends on it
# and the other values in scope: eager's walk goes on through u into the caller's graph
# and cuts it, so the harness's backward gives x0 no gradient through u; every compiled
# call must cut the same (and its own graph, for the backward and create_graph).

UNCHAIN_FORMS = ("of_a_later_value", "of_the_value", "of_the_argument", "unchain_argument")


def _unchain_inside(b):
    x0 = b.args[0][2]
    v = b.pick()
    if v is None or not x0.var:
        return b.st_unary()
    u = f"u{len(b.extra_args)}"
    b.extra_args.append((u, "F.tanh(x0 * 0.5)"))
    b.extra_kinds[u] = "var"
    b.add(u, x0.shape, x0.dtype, 1.0)
    shape = bcast(v.shape, x0.shape)
    name = b.fresh()
    if shape is None:
        b.emit(f"{name} = F.sin({u}) * 2.0")
        shape, dtype = x0.shape, x0.dtype
    else:
        b.emit(f"{name} = F.sin({v.name} * {u})")
        dtype = _dt(v, x0)
    form = b.draw(st.sampled_from(UNCHAIN_FORMS))
    b.emit({"of_a_later_value": f"F.tanh({name}).unchain_backward()",
            "of_the_value": f"{name}.unchain_backward()",
            "of_the_argument": f"{u}.unchain_backward()",
            "unchain_argument": f"{u}.unchain()"}[form])
    b.add(name, shape, dtype, 1.0)
    b.features.add(f"unchain_inside_{form}")


UNCHAIN_STEPS = [(_unchain_inside, 1)]
# ---------------------------------------------------------------- end of unchain inside f


# ---------------------------------------------------------------- matmul batching
# What passes/matmul_batching.py rewrites: sums of products (A1 @ W1 + A2 @ W2 + a
# term), products sharing an operand (A @ W1, A @ W2), a recurrence whose weight
# gradient sums over time steps (h = tanh(h @ W) in a loop), contractions of length 1
# ((n, 1) @ (1, m)). The operands are scaled before the product, not after it, so the
# products feed the sum directly. focus="matmul" (--focus matmul) draws these.

def _draw_matrix(b):
    """One of _matrix_values(b), drawn (None when there is none), and the candidates."""
    vs = _matrix_values(b)
    return (b.draw(st.sampled_from(vs)) if vs else None), vs


def _matrix_values(b):
    return [v for v in b.vals if v.var and len(v.shape) == 2 and v.shape[1] != B]


def _st_sum_of_products(b):
    v, vs = _draw_matrix(b)
    if v is None:
        return b.st_matmul()
    others = [w for w in vs if w.shape[0] == v.shape[0]]
    terms = [v] + [b.draw(st.sampled_from(others)) for _ in range(b.draw(st.integers(1, 3)))]
    m = b.draw(st.integers(1, 4))
    parts, dts = [], []
    for w in terms:
        c = b.capture((w.shape[1], m), "param" if b.draw(st.integers(0, 3)) else None)
        parts.append(f"F.matmul({w.name} * {1.0 / w.shape[1]!r}, {c[0]})")
        dts.append(c[3])
    if b.draw(st.booleans()):
        c = b.capture((m,), "param")
        parts.insert(b.draw(st.integers(0, len(parts))), c[0])
        dts.append(c[3])
    name = b.fresh()
    b.emit(f"{name} = " + " + ".join(parts))
    dtype = "float64" if "float64" in dts or _dt(*terms) == "float64" else "float32"
    b.add(name, (v.shape[0], m), dtype, sum(w.bound for w in terms) + 1.0)
    b.features.add("matmul_sum")


def _st_shared_operand(b):
    v, vs = _draw_matrix(b)
    if v is None:
        return b.st_matmul()
    k, m = v.shape[1], b.draw(st.integers(1, 4))
    names, dts = [], []
    for _ in range(b.draw(st.integers(2, 3))):
        c = b.capture((k, m), "param")
        name = b.fresh()
        b.emit(f"{name} = F.matmul({v.name} * {1.0 / k!r}, {c[0]})")
        names.append(name)
        dts.append(c[3])
    out = b.fresh()
    b.emit(f"{out} = " + " * ".join(f"F.tanh({n})" for n in names))
    dtype = "float64" if "float64" in dts or v.dtype == "float64" else "float32"
    b.add(out, (v.shape[0], m), dtype, 1.0)
    b.features.add("matmul_shared")


def _st_recurrence(b):
    v, vs = _draw_matrix(b)
    if v is None:
        return b.st_matmul()
    k = v.shape[1]
    c = b.capture((k, k), "param")
    name = b.fresh()
    b.emit(f"{name} = F.tanh({v.name} * {1.0 / (k * v.bound)!r})")
    b.emit(f"for _ in range({b.draw(st.integers(2, 4))}):")
    b.indent += 1
    b.emit(f"{name} = F.tanh(F.matmul({name}, {c[0]}) * {1.0 / k!r} + {name})")
    b.indent -= 1
    b.add(name, v.shape, "float64" if c[3] == "float64" or v.dtype == "float64"
          else "float32", 1.0)
    b.features.add("matmul_recurrence")


def _st_outer_product(b):
    v = b.pick(lambda w: w.var and len(w.shape) == 2)
    if v is None:
        return b.st_matmul()
    m = b.draw(st.integers(1, 4))
    c = b.capture((1, m), "param")
    name = b.fresh()
    b.emit(f"{name} = F.matmul(F.sum({v.name}, axis=1, keepdims=True), {c[0]})")
    b.add(name, (v.shape[0], m), "float64" if c[3] == "float64" or v.dtype == "float64"
          else "float32", v.bound * (v.shape[1] if v.shape[1] != B else 8))
    b.features.add("matmul_outer")


def _st_lone_op_parts(b):
    # Parts with no kernel of their own (backends/numba/plan._no_kernel): a captured
    # weight cast to the other float dtype that only a matmul reads (W7's float32
    # weights), and 0-d arithmetic (Adam's step size) on a 0-d argument, both NumPy
    # calls between kernels; the scale after them fuses.
    v, vs = _draw_matrix(b)
    if v is None:
        return b.st_matmul()
    k, m = v.shape[1], b.draw(st.integers(1, 4))
    c = b.capture((k, m), "param" if b.draw(st.integers(0, 3)) else None)
    other = "float32" if c[3] == "float64" else "float64"
    p, name = b.fresh(), b.fresh()
    b.emit(f"{p} = F.matmul({v.name}, F.Cast({other!r})({c[0]}))")
    dtype = "float64" if "float64" in (other, v.dtype) else "float32"
    t = b.pick(lambda w: w.var and w.shape == () and w.name.startswith("x"))
    scale = f"{1.0 / k!r}"
    if t is not None:
        q = f"({t.name} * {0.5 / t.bound!r})"          # in [-0.5, 0.5]
        scale = f"(0.1 * (1 - 0.9 ** {q}) / (1 - 0.999 ** ({q} + 2.0)) * {1.0 / k!r})"
        dtype = "float64" if "float64" in (dtype, t.dtype) else "float32"
    b.emit(f"{name} = {p} * {scale}")
    b.add(name, (v.shape[0], m), dtype, v.bound * 8.0)
    b.features.add("lone_op_parts")


def _st_gate_weight_sums(b):
    # The gates' weight gradients of an unrolled LSTM: sum_t a_t^T @ g_it for each gate
    # i, every operand a kernel's result. Rewrite 2 joins each sum's blocks (the a_t^T
    # as the transpose of their join), rewrite 3b joins the gates' products where the
    # contraction (steps x rows) reaches JOIN_MIN_CONTRACTION, and the backend has the
    # kernels write their results into the joined buffers (plan._plan_joins): blocks
    # side by side (strided), stacked (contiguous), nested, one operand in two joins.
    v = b.pick(lambda w: w.var)
    if v is None:
        return b.st_matmul()
    steps, rows = b.draw(st.integers(2, 3)), b.draw(st.sampled_from([3, 5, 130]))
    k, m, gates = b.draw(st.integers(1, 4)), b.draw(st.integers(1, 3)), b.draw(st.integers(2, 3))
    s = b.fresh()
    b.emit(f"{s} = F.tanh(F.sum({v.name}) * 0.01)")
    sums, dts = [[] for _ in range(gates)], {v.dtype}
    for t in range(steps):
        c = b.capture((rows, k), None)
        a = b.fresh()
        b.emit(f"{a} = F.tanh({c[0]} * {s} + {0.1 * t!r})")
        dts.add(c[3])
        for i in range(gates):
            d = b.capture((rows, m), None)
            g = b.fresh()
            b.emit(f"{g} = F.sin({d[0]} * {s} - {0.2 * i!r})")
            dts.add(d[3])
            sums[i].append(f"F.matmul(F.transpose({a}), {g})")
    names = []
    for terms in sums:
        y = b.fresh()
        b.emit(f"{y} = ({' + '.join(terms)}) * {1.0 / (steps * rows)!r}")
        names.append(y)
    out = b.fresh()
    b.emit(f"{out} = " + " * ".join(names))
    b.add(out, (k, m), "float64" if "float64" in dts else "float32", 1.0)
    b.features.add("matmul_gate_sums")


MATMUL_STEPS = [(_st_sum_of_products, 3), (_st_shared_operand, 2), (_st_recurrence, 2),
                (_st_outer_product, 1), (_st_lone_op_parts, 1)]
# focus="gate_sums" (--focus gate_sums): these and MATMUL_STEPS (focus="matmul" draws
# as it did).
GATE_SUM_STEPS = [(_st_gate_weight_sums, 1)]
# ---------------------------------------------------------------- end of matmul batching
# ------------------------------------------------------------------ conv epilogues
# What passes/conv_epilogue.py rewrites: conv2d (+ bias) -> ReLU -> max pooling, with
# windows the fused kernel computes (2x2, stride 2) and others, and sometimes another
# reader of the conv's output, the pre-activation or the ReLU's output (which must
# stay materialized, or keep the chain from fusing). The image is a captured array
# shifted by a value of f, so gradients reach f's arguments through the chain.
# focus="conv" (--focus conv) draws these.

def _st_conv_epilogue(b):
    v = b.pick()
    if v is None:
        return b.st_unary()
    n, ch, oc = b.draw(st.integers(1, 2)), b.draw(st.integers(1, 2)), b.draw(st.integers(1, 3))
    hw = (b.draw(st.integers(4, 7)), b.draw(st.integers(4, 7)))
    k, stride, pad = b.draw(st.sampled_from([(3, 1, 1), (3, 2, 0), (1, 1, 0), (2, 1, 1)]))
    # One dtype mostly (the fused forms need it); sometimes the bias's differs.
    # An inner training step (backward and SGD in f) puts the pooling's gradient in
    # f's own graph, where the ReLU's mask is read from the ReLU's output.
    inner = b.draw(st.booleans())
    img = b.capture((n, ch) + hw, "array")
    W = b.capture((oc, ch, k, k), "param", dtype=img[3], reuse=not inner)
    bias = b.capture((oc,), "param", dtype=None if b.draw(st.integers(0, 3)) == 0
                     else img[3], reuse=not inner) if b.draw(st.booleans()) else None
    reader = b.draw(st.sampled_from(["none", "none", "conv", "pre", "act"]))
    out_hw = [(d + 2 * pad - k) // stride + 1 for d in hw]
    pools = [None, (3, 1, 1)] + [(2, 2, 0), (2, 2, 0), (2, 1, 0)] * (min(out_hw) >= 2)
    pool = b.draw(st.sampled_from(pools))
    c, pre, act, out = b.fresh("c"), b.fresh("pre"), b.fresh("act"), b.fresh("p")
    b.emit(f"{c} = F.conv2d({img[0]} + F.mean({v.name}) * 0.5, {W[0]}, None, "
           f"stride={stride}, pad={pad})")
    b.emit(f"{pre} = {c} + F.reshape({bias[0]}, (1, -1, 1, 1))" if bias else f"{pre} = {c}")
    b.emit(f"{act} = F.relu({pre})")
    b.emit(f"{out} = F.pooling({act}, {pool[0]}, stride={pool[1]}, pad={pool[2]})" if pool
           else f"{out} = {act}")
    extra = {"none": "", "conv": f" + F.mean({c}) * 0.25", "pre": f" + F.mean({pre} * {pre})",
             "act": f" + F.mean({act}) * 0.5"}[reader]
    loss, name = b.fresh("loss"), b.fresh()
    # Not out * out: its gradient is 0 where a window pools a 0, which hides a mask.
    b.emit(f"{loss} = F.mean(F.tanh({out} * 0.5 + 0.25) ** 2){extra}")
    if inner:
        for p in [W] + ([bias] if bias else []):
            b.updated.add(p[0])
            b.emit(f"{p[0]}.cleargrad()")
        b.emit(f"{loss}.backward()")
        for p in [W] + ([bias] if bias else []):
            b.emit(f"{p[0]}.data -= 0.1 * {p[0]}.grad.data")
        b.features.add("inner_backward_update")
    b.emit(f"{name} = {v.name} * F.tanh({loss})")
    dts = [img[3], W[3]] + ([bias[3]] if bias else [])
    b.add(name, v.shape, "float64" if "float64" in dts or v.dtype == "float64"
          else "float32", v.bound)
    b.features.add("conv_epilogue")


CONV_STEPS = [(_st_conv_epilogue, 1)]
# ------------------------------------------------------------------ made leaves (helper
# "madeleaf"). A Variable made inside f that is a leaf of eager's graph when f returns
# (`c = tj.Variable(np.full(x.shape, 0.5))`, a Parameter, `Variable(h.data)`, a result
# of no_grad) used by an op and then outliving the call: returned (alone, in a list or
# a tuple) or stored as state the function rebinds. Eager's backward from the results
# gives it a gradient; the harness compares the .grad of every result Variable and of
# state Variables, which is how compiled calls that gave it None were found.

MADE_LEAF_KINDS = ("variable", "parameter", "named", "of_data", "of_data_times",
                   "no_grad")
MADE_LEAF_ESCAPES = ("returned", "in_list", "in_tuple", "state")


def _made_leaf(b):
    v = b.pick(lambda w: w.bound <= 10, recent=6)
    if v is None:
        return b.st_unary()
    kind = b.draw(st.sampled_from(MADE_LEAF_KINDS))
    how = b.draw(st.sampled_from(MADE_LEAF_ESCAPES))
    c = b.fresh("c")
    full = f"np.full({v.name}.shape, {b.draw(st.sampled_from([0.5, -0.75, 1.25]))!r}, " \
        f"dtype={v.name}.dtype)"
    if kind == "variable":
        b.emit(f"{c} = tj.Variable({full})")
        bound = 1.25
    elif kind == "parameter":
        b.emit(f"{c} = tj.Parameter({full})")
        bound = 1.25
    elif kind == "named":
        b.emit(f"{c} = tj.Variable({full}, name={c!r})")
        bound = 1.25
    elif kind == "of_data":
        b.emit(f"{c} = tj.Variable({v.data})")
        bound = v.bound
    elif kind == "of_data_times":
        # np.asarray: `d * 0.5` of a 0-d ndarray is a NumPy scalar, which Variable
        # rejects (DeZero's too): without it the program is invalid in eager.
        b.emit(f"{c} = tj.Variable(np.asarray({v.data} * 0.5))")
        bound = v.bound * 0.5
    else:
        if not v.var:
            return b.st_unary()
        b.emit("with tj.no_grad():")
        b.emit(f"    {c} = F.tanh({v.name}) * 0.5")
        bound = 0.5
    use = b.draw(st.sampled_from(["mul", "sin_mul", "square_add"]))
    h = b.fresh()
    if use == "mul" or v.bound * bound > 10:
        b.emit(f"{h} = {v.name} * {c}")
        hb = v.bound * bound
    elif use == "sin_mul":
        b.emit(f"{h} = F.sin({v.name} * {c}) + {c}")
        hb = 1 + bound
    else:
        b.emit(f"{h} = {v.name} + {c} * {c}")
        hb = v.bound + bound * bound
    b.add(h, v.shape, v.dtype, hb)
    if how == "state":
        _start_states(b)
        k = len(b.states)
        holder = b.draw(st.sampled_from(("object", "layer", "dict", "global")))
        ref = {"object": f"STATE{k}.h", "layer": f"LAYER{k}.h", "dict": f"STATED{k}['h']",
               "global": f"H{k}"}[holder]
        b.emit(f"{ref} = {c}")
        b.states.append((holder, ref, k))
    else:
        b.returned_views.append({"returned": c, "in_list": f"[{c}]",
                                 "in_tuple": f"({c},)"}[how])
    b.features.add(f"made_leaf_{kind}")
    b.features.add(f"made_leaf_{how}")


def _parameter_state(b, form=None):
    """A Parameter stored as state (threaded through compiled calls as a Variable is,
    the state after the call a Parameter, eager's object where eager keeps one): made
    in f from a value in scope, carried from the previous call's (an RNN's h as a
    Parameter), or a captured Parameter rebound into the holder; also on a Layer, which
    registers it (its params() are eager's after the call). Found: every such program
    fell back, the threading refused Parameters (on a Layer too)."""
    v = b.pick(lambda w: w.bound <= 4, recent=6)
    if v is None:
        return b.st_unary()
    _start_states(b)
    k = len(b.states)
    holder = b.draw(st.sampled_from(("object", "dict", "global", "layer")))
    ref = {"object": f"STATE{k}.h", "dict": f"STATED{k}['h']", "global": f"H{k}",
           "layer": f"LAYER{k}.h"}[holder]
    form = form or b.draw(st.sampled_from(("made", "carried", "captured")))
    p, h = b.fresh("p"), b.fresh()
    dtype = v.dtype
    if form == "made":
        # (np.asarray: a 0-d value's product is a NumPy scalar, which Parameter refuses)
        b.emit(f"{p} = tj.Parameter(np.asarray({v.data} * 0.5))")
    elif form == "carried":
        prev = b.fresh("p")
        b.emit(f"{prev} = {ref}")
        b.emit(f"{p} = tj.Parameter(np.asarray({v.data} * 0.5 if {prev} is None else "
               f"{prev}.data * 0.5 + {v.data} * 0.5))")
    else:
        c = b.capture(tuple(1 if d == B else d for d in v.shape[-1:]), "param")
        b.emit(f"{p} = {c[0]}")
        dtype = "float64" if c[3] == "float64" or v.dtype == "float64" else "float32"
    b.emit(f"{ref} = {p}")
    b.states.append((holder, ref, k))
    b.emit(f"{h} = F.tanh({v.name} * {p})")
    b.features.add(f"parameter_state_{form}")
    return b.add(h, v.shape, dtype, 1.0)


def _parameter_state_trained(b):
    """A captured Parameter stored as state (threaded: from the call that finds it
    stored, the variant reads it as an argument), then a training step whose loss reads
    it: the inner backward adds to the stored Parameter's .grad. Found: the trace-time
    check reran from the .grad the traced call's own backward left there, so eager's
    rerun added its gradient a second time and a correct variant was demoted; with the
    Parameter only captured, the variant's grad-None guard failed in the rerun and the
    check passed without comparing."""
    h = _parameter_state(b, form="captured")
    if isinstance(h, Val) and h.var:     # (else no value to store it for: a unary)
        b.st_inner_step(h)
        b.features.add("parameter_state_trained")


def _made_leaves_sharing(b):
    """Several Variables made of one array: `Variable(h.data)` again, or `Variable(c.data)`
    of such a leaf, in a chain of two to six, returned in a drawn order (some in a list
    or a tuple). Eager's are leaves holding that one array, each with its gradient;
    each compiled leaf naming another as the array's owner was a cycle that made
    tracing raise RecursionError."""
    v = b.pick(lambda w: w.var and w.bound <= 5 and not w.name.startswith("x"), recent=6) \
        or b.pick(lambda w: w.var and w.bound <= 5, recent=6)
    if v is None:
        return b.st_unary()
    n = b.draw(st.integers(2, 6))
    arrs = [a for a in b.args if a[1] == "array" and a[2] is not None]
    if arrs and b.draw(st.booleans()):
        # v computed from an ndarray argument, which is then updated in place: a
        # create_graph replay recomputed v from the updated buffer, where eager's
        # leaves hold v's array as it was (their .grad silently wrong).
        a = b.draw(st.sampled_from(arrs))[2]
        v = b.add(b.fresh(), a.shape, a.dtype, 0.5)
        b.emit(f"{v.name} = F.sin({a.name}) * 0.5")
        b.emit(f"{a.name} += 0.5")
        a.bound += 0.5
        a.signed = False
        b.features.add("made_leaves_sharing_after_inplace")
    cs = []
    for k in range(n):
        c = b.fresh("c")
        src = v if not cs or b.draw(st.booleans()) else None
        b.emit(f"{c} = tj.Variable({v.data if src is not None else cs[-1] + '.data'})")
        cs.append(c)
    h = b.fresh()
    b.emit(f"{h} = {v.name} * {cs[0]} + {cs[-1]} * 0.5")
    b.add(h, v.shape, v.dtype, v.bound * v.bound + v.bound * 0.5)
    order = b.draw(st.permutations(cs))
    for c in order[:b.draw(st.integers(1, n))]:
        b.returned_views.append(b.draw(st.sampled_from([c, c, f"[{c}]", f"({c},)"])))
    if b.draw(st.booleans()):
        # The owner returned after them: the leaves the graph uses (inputs of the
        # compiled Function, made before its results) hold the array of a result made
        # after them, down a chain (`Variable(c.data)`): the runner named that result's
        # Variable before it existed (UnboundLocalError, a fallback every call).
        b.returned_views.append(v.name)
        b.features.add("made_leaves_sharing_a_result")
    b.features.add("made_leaves_sharing")
    if v.name in {name for name, _, _ in b.args}:
        b.features.add("made_leaves_sharing_an_argument")


def _made_leaf_grad_inside(b):
    """A made leaf a backward inside f gives a .grad that is another object of the
    call: returned beside it (`return c.grad, c`), or the .grad of the value it is
    added to (Add gives both operands one gradient: c.grad is v.grad), that value maybe
    a captured Parameter's .grad computed by an earlier backward and returned (c.grad
    is W.grad.grad). Compiled calls gave c no .grad there, and the first-call check ran
    them eagerly (programs 3247, 1809)."""
    v = b.pick(lambda w: w.var and w.bound <= 10, recent=6)
    if v is None:
        return b.st_unary()
    form = b.draw(st.sampled_from(["returned_grad", "shared", "grad_of_grad"]))
    if form == "grad_of_grad":
        # v becomes W.grad (of v's trailing shape), returned: c + v gives both one
        # gradient, so c.grad is W.grad.grad.
        nd = b.draw(st.integers(0, min(len(v.shape), 2)))
        p = b.capture(tuple(1 if d == B else d for d in v.shape[len(v.shape) - nd:]),
                      "param", reuse=False)
        b.updated.add(p[0])
        g = b.fresh("g")
        b.emit(f"{p[0]}.cleargrad()")
        b.emit(f"F.sum(F.tanh({p[0]}) * {p[0]}).backward()")
        b.emit(f"{g} = {p[0]}.grad")
        b.add(g, p[2], p[3], 2.0)
        b.returned_views.append(g)
        v = b.vals[-1]
    c = b.fresh("c")
    b.emit(f"{c} = tj.Variable(np.full({v.name}.shape, 0.5, dtype={v.name}.dtype))")
    if form == "returned_grad":
        b.emit(f"F.sum(F.tanh({v.name} * {c})).backward()")
        b.returned_views += [c, f"{c}.grad"]
    else:
        b.emit(f"F.sum(F.tanh({c} + {v.name})).backward()")
        b.returned_views.append(c)
    h = b.fresh()
    b.emit(f"{h} = F.sin({v.name} * {c})")
    b.add(h, v.shape, v.dtype, 1.0)
    b.features.add(f"made_leaf_grad_{form}")


MADE_LEAF_STEPS = [(_made_leaf, 1), (_parameter_state, 1), (_made_leaves_sharing, 1),
                   (_parameter_state_trained, 1), (_made_leaf_grad_inside, 1)]


def _made_leaves_of_an_input(b):
    """Leaves made in f of an argument Variable's (or a captured Parameter's) data, in
    a chain of one to three (`c1 = Variable(x.data)`, then `Variable(x.data)` again or
    `Variable(c1.data)`), used beside the input itself and returned or not (none, some,
    all). Eager's leaves hold the array the input had at the call; a caller rebinding
    `x.data` before the backward (--generator argument_updates) makes x's uses read the
    new one. Found: the create_graph replay made the leaves of the new array, and the
    compiled backward read one array for both (gradients silently wrong)."""
    args = [w for _, kind, w in b.args if kind == "var" and w is not None and w.bound <= 5]
    w = None
    if args and b.draw(st.integers(0, 3)):
        x = b.draw(st.sampled_from(args))
        name, data, shape, dtype, bound = x.name, x.data, x.shape, x.dtype, x.bound
    else:
        w = b.pick(lambda u: u.var and u.bound <= 5, recent=6)
        if w is None:
            return b.st_unary()
        c = b.capture(tuple(1 if d == B else d for d in w.shape[-1:]), "param")
        name, data, shape, bound = c[0], f"{c[0]}.data", w.shape, w.bound * 2.0
        dtype = "float64" if c[3] == "float64" or w.dtype == "float64" else "float32"
        b.features.add("made_leaves_of_a_parameter")
    cs = []
    for _ in range(b.draw(st.integers(1, 3))):
        c = b.fresh("c")
        src = data if not cs or b.draw(st.booleans()) else cs[-1] + ".data"
        b.emit(f"{c} = tj.Variable({src})")
        cs.append(c)
    h = b.fresh()
    use = f"{name} * {cs[0]} + F.sin({cs[-1]}) * {name}"
    # (a Parameter's chain times a value of the arguments: their gradients through it)
    b.emit(f"{h} = {use}" if w is None else f"{h} = ({use}) * {w.name}")
    b.add(h, shape, dtype, bound * bound + bound if w is None else bound)
    for c in b.draw(st.lists(st.sampled_from(cs), unique=True, max_size=len(cs))):
        b.returned_views.append(b.draw(st.sampled_from([c, f"[{c}]"])))
    b.features.add("made_leaves_of_an_input")


# (focus "input_leaves", with --generator argument_updates to rebind the arguments.)
INPUT_LEAF_STEPS = [(_made_leaves_of_an_input, 1)]


# ------------------------------------------------------------- rebinds to an existing buffer
# (focus "rebind_alias"). `W.data = x.data[::-1]`, `S['h'] = x.grad.data`: in eager the
# rebound .data, or the stored array, is that buffer (or a view of it), and writes to
# one show in the other; a compiled call must store the same buffer (rebuilt on it at
# call time), or run eagerly. The harness compares what each capture's and argument's
# .data and each stored state is and shares memory with.

def _rebind_source(b, v):
    """(source text, shape, dtype, bound) of an existing buffer of v's shape, or of a
    captured one: v's data or a view of it, an argument's .grad (a seed passed through
    or computed, or the one the caller set) or a view of it, a captured Parameter's
    data or the .grad the caller set on it, a captured array."""
    how = b.draw(st.sampled_from(("data", "view", "seed", "grad", "grad_view",
                                  "caller_grad", "caller_grad_view", "capture_grad",
                                  "capture_data", "capture_array")))
    flip = "[::-1]" if v.shape else ""
    if how in ("caller_grad", "caller_grad_view"):
        # The .grad the caller set on an argument before the call: a buffer from
        # outside, read as an input (found: a rebind to it stored a copy, unwarned).
        args = [w for name, kind, w in b.args if kind == "var" and w is not None]
        a = b.draw(st.sampled_from(args))
        b.caller_grads.add(a.name)
        b.features.add(f"rebind_alias_{how}")
        return (f"{a.name}.grad.data" + (flip if how == "caller_grad_view" and a.shape
                                         else "")), a.shape, a.dtype, 1.0
    if how == "capture_grad":
        # The .grad the caller set on a captured Parameter.
        shape = tuple(1 if d == B else d for d in v.shape)
        c = b.capture(shape, "param")
        b.caller_grads.add(c[0])
        b.features.add(f"rebind_alias_{how}")
        return f"{c[0]}.grad.data" + (flip if shape else ""), shape, c[3], 1.0
    if how in ("seed", "grad", "grad_view"):
        args = [w for name, kind, w in b.args if kind == "var" and w is not None]
        a = b.draw(st.sampled_from(args))
        if how == "seed":
            b.emit(f"F.reshape({a.name}, {a.name}.shape).backward()")   # the seed's ones
        else:
            b.emit(f"F.sum({a.name} * {a.name}).backward()")
        src = f"{a.name}.grad.data" + (flip if how == "grad_view" and a.shape else "")
        b.features.add(f"rebind_alias_{how}")
        return src, a.shape, a.dtype, 2 * a.bound + 1.0
    if how in ("capture_data", "capture_array"):
        shape = tuple(1 if d == B else d for d in v.shape)
        c = b.capture(shape, "param" if how == "capture_data" else "array")
        b.features.add(f"rebind_alias_{how}")
        return (f"{c[0]}.data" if c[1] == "param" else c[0]), shape, c[3], 1.0
    b.features.add(f"rebind_alias_{how}")
    return v.data + (flip if how == "view" else ""), v.shape, v.dtype, v.bound


def _rebind_alias(b):
    """A rebind to an existing buffer: a captured Parameter's .data (a capture of its
    own, used only here), or an ndarray stored as state (in an object, a Layer, a dict,
    a module global), set to one, or the buffer itself as a value (returned); then
    used. Found: the compiled call stored a copy (W.data) or refused the state (`a
    ndarray object -> a TracedArray object`); with a .grad the caller set, stored or
    returned a copy, unwarned."""
    v = b.pick(lambda w: w.var and w.bound <= 4, recent=6)
    if v is None:
        return b.st_unary()
    src, shape, dtype, bound = _rebind_source(b, v)
    h = b.fresh()
    where = b.draw(st.sampled_from(("capture", "state", "result")))
    if where == "result":
        # The buffer itself, returned (or used) as an ndarray, or a new Variable of it
        # (`Variable(x.grad.data)`): eager's result is it, or holds it.
        wrap = b.draw(st.booleans())
        b.emit(f"{h} = " + (f"tj.Variable({src})" if wrap else src))
        b.add(h, shape, dtype, bound, var=wrap)
        b.features.add("rebind_alias_result" + ("_wrapped" if wrap else ""))
        return
    if where == "capture":
        # A Parameter of its own (its shape follows what it is rebound to).
        W = "W" + str(len(b.captures))
        c = (W, "param", tuple(1 if d == B else d for d in shape), dtype,
             b.draw(st.sampled_from(["global", "closure"])))
        b.captures.append(c)
        b.updated.add(W)              # (never reused: its data is rebound)
        b.emit(f"{W}.data = {src}")
        b.emit(f"{h} = F.tanh({W} * 0.5)")
        b.features.add("rebind_alias_capture")
    else:
        _start_states(b)
        k = len(b.states)
        holder = b.draw(st.sampled_from(("object", "layer", "dict", "global")))
        ref = {"object": f"STATE{k}.h", "layer": f"LAYER{k}.h", "dict": f"STATED{k}['h']",
               "global": f"H{k}"}[holder]
        prev = b.fresh("p")
        # The previous call's array read too (None after a reset_state()).
        b.emit(f"{prev} = {ref}")
        b.emit(f"{ref} = {src}")
        # (np.asarray: a 0-d array's product is a NumPy scalar, which F.tanh refuses)
        b.emit(f"{h} = F.tanh(np.asarray({ref} * 0.5 if {prev} is None else "
               f"{ref} * 0.5 + {prev} * 0.25))")
        b.states.append((holder, ref, k))
        b.features.add(f"rebind_alias_state_{holder}")
    b.add(h, shape, dtype, 1.0)


REBIND_ALIAS_STEPS = [(_rebind_alias, 1)]


# --------------------------------------- user backwards beside in-place updates (focus)
# (focus "rebind_inplace", with --generator rebind_inplace to rebind the data between
# call and backward.) A user Function applied to an argument Variable or a captured
# Parameter that f also updates in place, before or after it (`x0.data *= 0.9`, `W.data
# -= 0.05 * W.data`): its backward reads `self.inputs[0].data` (TanhData: detached,
# as eager's own rule is) or differentiates the input (Cube). Eager's backward reads
# the Variable's data as it is then; a caller that rebinds it after the call (a new
# array, maybe of another dtype) makes that the new one. Found: the create_graph
# replay of such a call (its joint graph: an input updated in place) gave the traced
# user backward's `.data` read the call's array; a rebind to another dtype or shape
# was read as the call's array by every compiled backward (silently the old data).

def _user_backward_beside_update(b):
    kinds = ["Cube"] + ([] if "data_backward" in b.avoid else ["TanhData", "TanhData"])
    kind = b.draw(st.sampled_from(kinds))
    args = [w for _, k, w in b.args if k == "var" and w is not None and w.bound <= 3]
    v = None
    if args and b.draw(st.booleans()):
        x = b.draw(st.sampled_from(args))
        name, shape, dtype = x.name, x.shape, x.dtype
        update = f"{name}.data *= 0.9"
        x.signed = False         # (|x| may drop under 0.5: no branch reads it)
        b.features.add("user_backward_beside_update_of_an_argument")
    else:
        v = b.pick(lambda w: w.var and w.bound <= 3, recent=6)
        if v is None:
            return b.st_unary()
        suffix = tuple(1 if d == B else d for d in v.shape[-1:])
        c = b.capture(suffix, "param", reuse=False)
        b.updated.add(c[0])
        name, shape, dtype = c[0], v.shape, _dt(v) if c[3] == "float32" else "float64"
        update = f"{name}.data -= 0.05 * {name}.data"
        b.features.add("user_backward_beside_update_of_a_parameter")
    before = b.draw(st.booleans())
    h = b.fresh()
    if before:
        b.emit(update)
    b.emit(f"{h} = {kind}()({name})")
    if not before:
        b.emit(update)
    bound = 27.0 if kind == "Cube" else 1.0
    if v is not None:
        # (the Parameter's result times a value of the arguments: gradients reach both)
        h2 = b.fresh()
        b.emit(f"{h2} = {h} * {v.name}")
        h, bound = h2, bound * v.bound
    b.add(h, shape, dtype, bound)
    b.classes.add(kind)
    b.features.add(f"user_{kind}")
    b.features.add("update_" + ("before" if before else "after") + "_user_function")


REBIND_INPLACE_STEPS = [(_user_backward_beside_update, 1)]
# ------------------------------------------------------------------ end of made leaves
# ------------------------------------------- backward inside f into the caller's graph
# (focus "backward_into"). Arguments with a creator, made by the caller in args() from
# x0 (u = F.tanh(x0 * 0.5); sometimes a second one sharing u's creator, F.exp(u * 0.5)),
# and a backward inside f of a loss that reaches them (or, on a guard, one or the
# other): eager's walk goes on past them into the caller's graph, giving x0 (which the
# loss may also reach directly) its gradient, each upstream Function run once; every
# compiled call must do the same (the harness compares every argument's .grad after
# the call), with the backward's retain_grad.

# The last: made from x0 on most calls, from another Variable on every third (the
# first-call check's copies of the arguments are unrelated leaves too): the walk reaches
# x0 on some calls, not on others, and x0.grad's dtype (a float32 x0 given a float64
# gradient by the walk) must be eager's on both.
BACKWARD_INTO_SOURCES = ("F.tanh(x0 * 0.5)", "F.sin(x0) * 2.0",
                         "F.sin(x0 if call % 3 else tj.Variable(np.asarray(x0.data * 0.75))) * 2.0",
                         # (every other call: a caller alternating between the two kinds
                         # of call, each with its own compiled variant, not a retrace at
                         # every switch)
                         "F.sin(x0 if call % 2 else tj.Variable(np.asarray(x0.data * 0.5))) * 2.0")


def _backward_into_caller(b):
    x0 = b.args[0][2]
    v = b.pick()
    if v is None or not x0.var:
        return b.st_unary()
    k = len(b.extra_args)
    us = [f"u{k}"]
    b.extra_args.append((us[0], b.draw(st.sampled_from(BACKWARD_INTO_SOURCES))))
    if b.draw(st.booleans()):
        us.append(f"u{k + 1}")
        b.extra_args.append((us[1], f"F.exp({us[0]} * 0.5)"))
    for u in us:
        b.add(u, x0.shape, x0.dtype, 3.0, signed=True)
    shape = bcast(v.shape, x0.shape)
    dtype = _dt(v, x0) if shape is not None else x0.dtype

    def term(u):
        return f"F.mean(F.tanh({v.name} * {u}))" if shape is not None else \
            f"F.mean(F.sin({u}))"
    loss = b.fresh("loss")
    if len(us) == 2 and b.draw(st.booleans()):
        # Which argument the backward goes on from is data (a guard).
        b.emit(f"if F.sum({us[0]}).data > 0:")
        b.emit(f"    {loss} = {term(us[0])}")
        b.emit("else:")
        b.emit(f"    {loss} = {term(us[1])} * 2.0")
        b.features.add("backward_into_caller_guarded")
    else:
        b.emit(f"{loss} = {' + '.join(term(u) for u in us)}")
    retain = "retain_grad" not in b.avoid and b.draw(st.booleans())
    if b.draw(st.integers(0, 2)) == 0:
        # x0.grad seeded inside f first, then read after the walk, which reaches x0 on
        # some calls only: checked on each call (Mismatch: the other kind's variant).
        g = b.fresh("g")
        b.emit("x0.cleargrad()")
        b.emit("F.reshape(x0, x0.shape).backward()")
        b.emit(f"{loss}.backward(retain_grad={retain})")
        b.emit(f"{g} = x0.grad * 0.5")
        b.add(g, x0.shape, x0.dtype, 3.0)
        b.features.add("backward_into_caller_grad_read")
    else:
        b.emit(f"{loss}.backward(retain_grad={retain})")
    b.add(loss, (), dtype, 2.0 * len(us))
    b.features.add("backward_into_caller" + ("_retain" if retain else ""))


BACKWARD_INTO_STEPS = [(_backward_into_caller, 1)]
# ------------------------------------ end of backward inside f into the caller's graph
# ------------------------------------------ .grads retained inside f on intermediates
# (focus "retain_grad"). A backward inside f with retain_grad=True leaves a .grad on the
# intermediates of its loss (h = tanh(v * W), k = h * h), which f goes on using: the
# caller's backward passes through them, and eager's walk adds each retained .grad to
# the gradient flowing on (the caller cannot reach them through a compiled call's
# results: compiled calls hold them as the call left them). The loss is returned or
# not (a result whose own .grad was retained, or none); the backward runs on one side
# of a data branch only, or always; with create_graph=True the retained .grads have
# history, which the caller's create_graph backward differentiates (its loss starts at
# an argument then, whose .grad, and the capture's, f returns: with history, kept).


def _retained_inside(b):
    if "retain_grad" in b.avoid:
        return b.st_unary()
    cg = b.draw(st.booleans())
    args = [a[2] for a in b.args if a[1] == "var"]
    v = b.draw(st.sampled_from(args)) if cg else b.pick(lambda w: w.var and w.bound <= 10)
    if v is None:
        return b.st_unary()
    suffix = tuple(d for d in v.shape if d != B)[-2:]
    W, _, _, wdt, _ = b.capture(suffix, "param", reuse=False)
    b.updated.add(W)
    h, k, loss, name = b.fresh("h"), b.fresh("k"), b.fresh("loss"), b.fresh()
    b.emit(f"{h} = F.tanh({v.name} * {W})")
    b.emit(f"{k} = {h} * {h}")
    b.emit(f"{loss} = F.sum(F.sin({k}) + {h})")
    b.emit(f"{W}.cleargrad()")
    call = f"{loss}.backward(retain_grad=True, create_graph={cg})"
    conds = [w for w in b.vals if w.signed]
    if conds and b.draw(st.booleans()):
        # A later call on the other side of the branch runs no backward inside.
        c = b.draw(st.sampled_from(conds))
        b.emit(f"if {c.data}.sum() > 0:")
        b.emit(f"    {call}")
        b.features.add("retained_inside_branch")
    else:
        b.emit(call)
    if cg:
        # (A .grad with history f does not return runs eagerly: return them.)
        b.also_return += [f"{v.name}.grad", f"{W}.grad"]
        b.features.add("retained_inside_create_graph")
    if b.draw(st.booleans()):
        b.also_return.append(loss)
        b.features.add("retained_inside_loss_returned")
    b.emit(f"{name} = {k} * 2.0 + {h}" if b.draw(st.booleans()) else f"{name} = F.exp({h})")
    b.add(name, v.shape, "float64" if wdt == "float64" else _dt(v), 3.0)
    b.features.add("retained_inside")


# A backward with create_graph=True inside f through a user Function with per-call
# state (SignCube): f returns the argument's .grad, whose eager graph is the Functions
# the user's backward made. The caller's retain_grad + create_graph backward keeps a
# .grad on each, which its second-order walk adds to: the tracing call's result (one
# opaque UserGrad) must be walked as that graph, and a compiled call's replay, deeper
# than the node's depth in the graph, must keep the caller's Functions made of the
# result before its new creator in the walk order.


def _user_backward_inside(b):
    if "retain_grad" in b.avoid or "user_state" in b.avoid:
        return b.st_unary()
    args = [a[2] for a in b.args if a[1] == "var" and a[2] is not None and a[2].bound <= 3]
    if not args:
        return b.st_unary()
    v = b.draw(st.sampled_from(args))
    y, name = b.fresh("y"), b.fresh()
    b.emit(f"{y} = SignCube()({v.name})")
    retain = b.draw(st.booleans())
    b.emit(f"F.sum({y}).backward(retain_grad={retain}, create_graph=True)")
    # (A .grad with history f does not return runs eagerly: return them.)
    b.also_return += [f"{v.name}.grad"] + ([f"{y}.grad"] if retain else [])
    b.emit(f"{name} = {v.name}.grad * 0.5")
    b.classes.add("SignCube")
    b.add(y, v.shape, v.dtype, v.bound ** 3)
    b.add(name, v.shape, v.dtype, 1.5 * v.bound ** 2)
    b.features.add("user_backward_inside")


RETAINED_INSIDE_STEPS = [(_retained_inside, 1), (_user_backward_inside, 1)]
# -------------------------------------- end of .grads retained inside f on intermediates
# ------------------------------ stored state dropped or rebound before the caller's backward
# (focus "dropped_state"). f stores a value the result goes on from as state (`S['h'] =
# h`), after a backward inside f left a .grad on it (retain_grad=True) or not; after the
# call the caller drops or rebinds the state, maybe changing, setting or clearing its
# .grad first (DROP_STATE, run by the harness's BETWEEN), then runs its backward. Eager's
# graph keeps h alive, and its walk adds h's .grad to the gradient flowing on. Found:
# compiled calls held their results weakly and lost the .grad of a dropped one.
DROP_ACTIONS = {
    "drop": [],
    "rebind": [],        # (the holder gets a new Variable in place of None)
    "scale": ["if h.grad is not None:", "    h.grad = h.grad * 3.0"],
    "set": ["h.grad = tj.Variable(np.full(h.shape, 0.5, h.dtype))"],
    "clear": ["h.cleargrad()"],
    "keep": None,        # (h stays stored: the control)
}


def _dropped_state(b):
    v = b.pick(lambda w: w.var and w.bound <= 10)
    if v is None:
        return b.st_unary()
    _start_states(b)
    suffix = tuple(d for d in v.shape if d != B)[-2:]
    W, _, _, wdt, _ = b.capture(suffix, "param", reuse=False)
    k = len(b.states)
    holder = b.draw(st.sampled_from(["object", "layer", "dict", "global"]))
    ref = {"object": f"STATE{k}.h", "layer": f"LAYER{k}.h", "dict": f"STATED{k}['h']",
           "global": f"H{k}"}[holder]
    h, name = b.fresh("h"), b.fresh()
    b.emit(f"{h} = F.tanh({v.name} * {W})")
    if "retain_grad" not in b.avoid and b.draw(st.booleans()):
        b.updated.add(W)
        b.emit(f"F.sum({h} * {h}).backward(retain_grad=True)")
        b.emit(f"{W}.cleargrad()")
        b.features.add("dropped_state_retained")
    b.emit(f"{ref} = {h}")
    b.states.append((holder, ref, k))
    action = b.draw(st.sampled_from(sorted(DROP_ACTIONS)))
    if not hasattr(b, "drops"):
        b.drops = []
    b.drops.append((holder, ref, action))
    b.emit(f"{name} = {h} * 2.0 + {v.name}" if b.draw(st.booleans())
           else f"{name} = F.exp({h}) * 0.5")
    b.add(name, v.shape, "float64" if wdt == "float64" else _dt(v), v.bound + 2.0)
    b.features.add(f"dropped_state_{action}")


def _drop_state_lines(b):
    """DROP_STATE(call, args): what the caller does to the state _dropped_state stored,
    after the call and before its backward (the harness's BETWEEN runs it)."""
    drops = [d for d in getattr(b, "drops", ()) if DROP_ACTIONS[d[2]] is not None]
    if not drops:
        return []
    out = ["", "", "def DROP_STATE(call, args):",
           "    \"\"\"The caller drops or rebinds the state f stored, before its "
           "backward.\"\"\""]
    out += [f"    global {ref}" for holder, ref, _ in drops if holder == "global"]
    for holder, ref, action in drops:
        out.append(f"    h = {ref}")
        out.append("    if h is not None:")
        out += [f"        {line}" for line in DROP_ACTIONS[action]]
        out.append(f"        {ref} = " + ("tj.Variable(np.ones(2))" if action == "rebind"
                                          else "None"))
    return out + ["", "", "BETWEEN = DROP_STATE"]


DROPPED_STATE_STEPS = [(_dropped_state, 1)]
# --------------------------- end of stored state dropped or rebound before the backward
# ------------------------------------- values computed before an in-place update, replayed
# (focus "replay_reads"). A value h computed from a buffer the call then updates in
# place (an ndarray argument, a captured array, an argument Variable's .data), from
# which no differentiable path leads on, so the compiled backward reads nothing of
# it; a later op reads h beside a Variable (`h * Variable(h.data) + w`, `h * h + w`)
# and f returns h. The caller's backward with retain_grad (always, in this focus) or
# create_graph replays eager's backward over the call, and h's .grad reads h as the
# call computed it, which a recompute from the updated buffer is not (fuzz seed 0,
# program 4372: h = F.sin(x1) * 0.5, then x1 += 0.5).


def _value_before_update(b):
    arrs = [a for a in b.args if a[1] == "array"]
    vars_ = [a for a in b.args if a[1] == "var"]
    form = b.draw(st.sampled_from((["array"] if arrs else []) + ["capture", "data"]))
    if form == "array":
        src, _, val = b.draw(st.sampled_from(arrs))
        shape, dtype = val.shape, val.dtype
    elif form == "data":
        name, _, val = b.draw(st.sampled_from(vars_))
        src, shape, dtype = f"{name}.data", val.shape, val.dtype
    else:
        w = b.pick(lambda w: w.var)
        val = None
        src, _, shape, dtype, _ = b.capture(tuple(d for d in w.shape if d != B)[-2:],
                                            "array", reuse=False)
        b.updated.add(src)
        b.rebinds.add(src)        # (`K0 += 0.5` rebinds the name)
    h, k = b.fresh(), b.fresh()
    b.emit(f"{h} = " + b.draw(st.sampled_from(["F.sin({s}) * 0.5", "F.tanh({s})"]))
           .format(s=src))
    if b.draw(st.booleans()):
        # A made leaf sharing h's array (eager: the same buffer).
        c = b.fresh("c")
        b.emit(f"{c} = tj.Variable({h}.data)")
        b.features.add("replay_made_leaf")
    else:
        c = h
    b.emit(b.draw(st.sampled_from(["{s} += 0.5", "np.multiply({s}, 0.75, out={s})"]))
           .format(s=src))
    if val is not None:
        val.bound += 0.5
        val.signed = False
    hv = b.add(h, shape, dtype, 1.0)
    partners = [w for w in b.vals if w.var and w is not hv and bcast(shape, w.shape)]
    w = b.draw(st.sampled_from(partners)) if partners else None
    expr = f"{h} * {c}" + (f" + {w.name}" if w is not None else "")
    if b.draw(st.booleans()):
        expr = f"F.relu({expr})"
    b.emit(f"{k} = {expr}")
    b.add(k, bcast(shape, w.shape) if w is not None else shape,
          _dt(hv, w) if w is not None else dtype, 1.0 + (w.bound if w is not None else 0))
    b.also_return.append(h)
    b.features.add(f"replay_reads_{form}")


REPLAY_READ_STEPS = [(_value_before_update, 1)]
# --------------------------------- end of values computed before an in-place update
# ---------------------------- a .grad of a .grad; grad() going on into the caller's graph
# (focus "grad_grads"). A backward inside f that leaves an argument's or a captured
# Parameter's .grad a leaf (reshape's seed, a seed passed through, a computed one), then
# a later backward through that .grad: eager sets x.grad.grad (the harness compares it
# right after the call; the caller's backward through the .grad, a leaf of the call's
# graph, adds to it); sometimes one level more (x.grad.grad.grad: a refusal). And
# grad()/value_and_grad() of a function closing over an argument with a creator (made
# by the caller in args()): eager's walk kept aside goes on into the caller's graph.

GRAD_OF_GRAD_FIRST = ("F.reshape({t}, {t}.shape)", "({t} + 0.5) - 0.25", "F.sum(F.sin({t}))")


def _grad_of_a_grad(b):
    v = b.pick(lambda w: w.var and w.bound <= 10)
    if v is None:
        return b.st_unary()
    vars_ = [a for a in b.args if a[1] == "var"]
    if vars_ and b.draw(st.booleans()):
        a = b.draw(st.sampled_from(vars_))
        target, shape = a[0], tuple(a[2].shape)
    else:
        c = b.capture(tuple(d for d in v.shape if d != B)[-2:], "param", reuse=False)
        b.updated.add(c[0])
        target, shape = c[0], tuple(c[2])
    dtype = _target_dtype(b, target)
    y, g = b.fresh("y"), b.fresh("g")
    b.emit(f"{target}.cleargrad()")
    b.emit(f"{y} = " + b.draw(st.sampled_from(GRAD_OF_GRAD_FIRST)).format(t=target))
    retain = "retain_grad" not in b.avoid and b.draw(st.booleans())
    b.emit(f"{y}.backward(retain_grad={retain})")
    b.emit(f"{g} = {target}.grad")
    b.add(g, shape, dtype, 1.0)
    src = g
    if b.draw(st.integers(0, 7)) == 0:
        # g.grad a leaf too (reshape's seed), then given a .grad of its own.
        y2, src = b.fresh("y"), b.fresh("g")
        b.emit(f"{y2} = F.reshape({g}, {g}.shape)")
        b.emit(f"{y2}.backward()")
        b.emit(f"{src} = {g}.grad")
        b.features.add("grad_of_grad_three_levels")
    loss = b.fresh("loss")
    if bcast(v.shape, shape) is not None:
        b.emit(f"{loss} = F.mean(F.tanh({src} * {v.name}) ** 2)")
        dtype = "float64" if "float64" in (dtype, v.dtype) else "float32"
    else:
        b.emit(f"{loss} = F.mean(F.tanh({src}) ** 2)")
    b.emit(f"{loss}.backward()")
    b.add(loss, (), dtype, 1.0)
    b.features.add("grad_of_grad" + ("_retain" if retain else ""))


def _grad_into_caller(b):
    x0 = b.args[0][2]
    v = b.pick(lambda w: w.var and w.bound <= 10)
    if v is None or not x0.var or bcast(v.shape, x0.shape) is None:
        return b.st_unary()
    u = f"u{len(b.extra_args)}"
    b.extra_args.append((u, b.draw(st.sampled_from(BACKWARD_INTO_SOURCES))))
    uv = b.add(u, x0.shape, x0.dtype, 3.0, signed=True)
    name = b.fresh("g")
    form = b.draw(st.sampled_from(["grad", "value_and_grad", "grad_grad"]))
    if form == "grad":
        b.emit(f"{name} = tj.grad(lambda z: F.sum(F.tanh(z * {u})))({v.name})")
    elif form == "value_and_grad":
        val = b.fresh("v")
        b.emit(f"{val}, {name} = tj.value_and_grad(lambda z: F.sum(F.sin(z * {u})))"
               f"({v.name})")
        b.add(val, (), _dt(v, uv), 50.0)
    else:
        b.emit(f"{name} = tj.grad(lambda z: F.sum(tj.grad(lambda w: F.sum(F.sin(w * {u})))"
               f"(z) * {u}))({v.name})")
    b.add(name, v.shape, _dt(v, uv), 9.0)
    b.features.add(f"grad_into_caller_{form}")


GRAD_GRAD_STEPS = [(_grad_of_a_grad, 2), (_grad_into_caller, 1)]
# ------------------------------------------------------------------- end of grad grads


# ---------------------------------------------------------------- rounding (focus)
# (focus "rounding"). Python numbers read from data and rounded: round(), math.floor,
# ceil, trunc, int(), float(), .item() of float data (scaled by powers of two, so halves
# occur, or past int64: 2**62, 1e19) and of unsigned data (uint64 from 2**62 to past
# 2**63, where an int64 wraps; uint32), then used as operands, branch conditions and
# loop trip counts. They read signed inputs only (finite, |x| in [0.5, 1.5], the sign
# set per call) through max/min, which both sides compute exactly, so a rounding
# boundary is never a float-precision accident.


def _rounding_source(b, src):
    """(source of a Python number from src's data, "int" or "float")."""
    d = src.data
    kind = b.draw(st.sampled_from(["float", "float", "uint64", "uint32"]))
    red = b.draw(st.sampled_from(["max", "min"]))
    if kind != "float":
        scale = "2.0 ** 63" if kind == "uint64" else "2.0 ** 31"
        u = b.fresh("u")
        b.emit(f"{u} = (np.abs({d}) * {scale}).astype(np.{kind})")
        red = b.draw(st.sampled_from(["max", "min", "sum"]))     # sum: uint64 wraps
        conv = b.draw(st.sampled_from(["int({u}.{r}())", "{u}.{r}().item()",
                                       "round({u}.{r}())", "math.floor(int({u}.{r}()))"]))
        b.features.add(f"rounding_{kind}")
        return conv.format(u=u, r=red), "int"
    reading = b.draw(st.sampled_from(
        ["float({d}.{r}())", "{d}.{r}().item()", "{d}.{r}()"] +
        (["F.{r}({v})"] if src.var else [])))
    reading = reading.format(d=d, r=red, v=src.name)
    scale = b.draw(st.sampled_from(["1.0", "4.0", "8.0", "2.0 ** 62", "1e19"]))
    x = f"{reading} * {scale}" if not reading.startswith("F.") else reading
    if not reading.startswith("F.") and scale in ("4.0", "8.0") and b.draw(st.booleans()):
        x = f"math.floor({x}) / 2"              # a multiple of 0.5: round()'s halves
    numpy_scalar = reading.startswith(f"{d}.") and not reading.endswith(".item()")
    rounders = ["math.floor({x})", "math.ceil({x})", "round({x})", "int({x})",
                "round({x}, 1)", "float({x})"]
    if not numpy_scalar and not reading.startswith("F."):
        rounders.append("math.trunc({x})")     # a float32 NumPy scalar has none
    if reading.startswith("F."):
        rounders = ["math.floor({x})", "math.ceil({x})", "int({x})", "float({x})"]
    r = b.draw(st.sampled_from(rounders))
    b.features.add("rounding_" + r.split("(")[0].replace("math.", ""))
    out = "float" if r.startswith(("float", "round({x}, 1")) else "int"
    return r.format(x=x), out


def _st_rounding(b):
    ins = [v for v in b.vals if v.signed]
    if not ins:
        return b.st_unary()
    src = b.draw(st.sampled_from(ins))
    expr, kind = _rounding_source(b, src)
    n = b.fresh("n")
    b.emit(f"{n} = {expr}")
    v = b.pick()
    name = b.fresh()
    small = f"({n} % 4)" if kind == "int" else f"min(abs({n}), 3.0)"
    use = b.draw(st.sampled_from(["operand", "branch", "loop"]))
    if use == "operand":
        b.emit(f"{name} = {v.name} * {small} * 0.25 + 0.5")
        b.add(name, v.shape, v.dtype, v.bound * 0.75 + 0.5)
    elif use == "branch":
        cond = f"{n} % 2 == 0" if kind == "int" else f"{n} > 1.0"
        b.emit(f"if {cond}:")
        b.emit(f"    {name} = F.tanh({v.name}) * 1.5")
        b.emit("else:")
        b.emit(f"    {name} = {v.name} * 0.5 + 0.25")
        b.add(name, v.shape, v.dtype, max(1.5, v.bound * 0.5 + 0.25))
    else:
        trips = f"{n} % 3" if kind == "int" else f"min(abs(round({n})), 2)"
        b.emit(f"{name} = {v.name}")
        b.emit(f"for _ in range({trips}):")
        b.emit(f"    {name} = {name} * 0.8 + 0.1")
        b.add(name, v.shape, v.dtype, max(v.bound, 3.0))
    b.features.add(f"rounding_{use}")


ROUNDING_STEPS = [(_st_rounding, 1)]
# ------------------------------------------------------------------- end of rounding


# ------------------------------------------------------------- made arrays (focus)
# (focus "made_arrays"; in the default profile too, rarely.) Arrays f makes itself
# (np.zeros, np.empty, np.full) written with an input's data by item assignment,
# np.copyto, fill() or `+=`, wrapped in a Variable before the write, or indexed by a
# traced mask; a computed array written by item assignment; an input's own data
# written in place (x.data[mask] = ...). NumPy copied traced data into a made array as
# plain values, and a branch on it was frozen on the traced call's side, silently
# (trace/made.py); item assignment into traced data ran eagerly (AssignItem now).

def _st_made_array(b):
    ins = [w for w in b.vals if w.signed and w.var and w.name.startswith("x")]
    if not ins:
        return b.st_unary()
    src = b.draw(st.sampled_from(ins))
    buf, name = b.fresh("buf"), b.fresh()
    d, dt = src.data, f"{src.data}.dtype"
    makes = [f"np.zeros({d}.shape, {dt})", f"np.full({d}.shape, 0.5, {dt})"]
    form = b.draw(st.sampled_from(["branch", "operand", "variable_first", "temp_mask",
                                   "input_write", "made_mask", "variable_used_first"] +
                                  (["slice_write"] if src.shape else [])))
    if form in ("branch", "operand"):
        writes = {"setitem": "{buf}[...] = {d}", "copyto": "np.copyto({buf}, {d})",
                  "setitem_product": "{buf}[...] = {d} * 0.5", "iadd": "{buf} += {d}",
                  "fill": "{buf}.fill({d}.ravel()[0])",
                  # (escapes, warned: these copied traced values as plain ones)
                  "flat": "{buf}.flat[:] = {d}", "put": "{buf}.put(np.arange({buf}.size), {d})"}
        tag = b.draw(st.sampled_from(sorted(writes)))
        # (np.empty and np.ndarray only where the write covers it all: their values
        # are garbage, which `+=` read: an invalid program, fuzz seed 19 program 840.)
        if tag != "iadd":
            makes += [f"np.empty({d}.shape, {dt})", f"np.ndarray({d}.shape, {dt})"]
        # np.zeros reached through a dict (not the module's attribute the trace swaps),
        # and NumPy's C code making a plain array of made ones: frozen writes before.
        makes.append(f"NP_MAKERS['zeros']({d}.shape, {dt})")
        if src.shape:     # (of d's shape: two slices of a made array joined again)
            makes.append(f"np.concatenate([np.zeros({d}.shape, {dt})[:1], "
                         f"np.zeros({d}.shape, {dt})[1:]])")
        # A constructor held as a class attribute (classes are not walked as state),
        # np.ndarray(...) itself, and NumPy's other functions, whose C code made plain
        # arrays of made operands or of Python numbers: frozen writes before.
        makes += [f"Maker.make({d}.shape, {dt})", f"Maker().make({d}.shape, {dt})",
                  f"np.where(np.ones({d}.shape) > 0, 0.0, 1.0).astype({dt})",
                  f"np.resize(np.zeros(1, {dt}), {d}.shape)",
                  f"np.fromfunction(lambda *i: i[0] * 0.0, {d}.shape, dtype={dt})"
                  if src.shape else f"np.zeros({d}.shape, {dt})"]
        if src.shape:
            makes.append(f"np.pad(np.zeros({d}.shape, {dt}), 1)"
                         f"[(slice(1, -1),) * {d}.ndim].copy()")
        make = b.draw(st.sampled_from(makes))
        if "NP_MAKERS" in make:
            b.features.add("made_via_dict")
        if "Maker" in make:
            b.features.add("made_via_class")
        elif not make.startswith(("np.zeros", "np.full", "np.empty", "NP_", "np.concat")):
            b.features.add(f"made_via_{make[3:make.index('(')]}")
        b.emit(f"{buf} = {make}")
        b.emit(writes[tag].format(buf=buf, d=d))
        b.features.add(f"made_{form}_{tag}")
        if form == "branch":
            v = b.pick(lambda w: w.var) or src
            b.emit(f"if {buf}.ravel()[0] > 0:")
            b.emit(f"    {name} = F.tanh({v.name})")
            b.emit("else:")
            b.emit(f"    {name} = F.sin({v.name}) * 0.5")
            b.add(name, v.shape, v.dtype, 1.0)
            return
        b.emit(f"{name} = {src.name} * tj.Variable({buf})")
    elif form == "variable_first":
        vb = b.fresh("vb")
        b.emit(f"{buf} = {b.draw(st.sampled_from(makes))}")
        b.emit(f"{vb} = tj.Variable({buf})")
        b.emit(f"{buf}[...] = {d} * 0.5")
        b.emit(f"{name} = {src.name} * {vb}")
        b.features.add("made_variable_first")
        if b.draw(st.booleans()):
            # returned beside the Variable: eager's buf is vb.data, one object
            b.returned_views += [vb, buf]
            b.features.add("made_variable_first_returned")
    elif form == "variable_used_first":
        # A plain write after the Variable's use: eager's use read the values before
        # it, the graph read the buffer after the trace (compiled 15.0 for eager's
        # 11.0, no warning until the first-call check). An escape now, warned.
        vb, w = b.fresh("vb"), b.fresh()
        b.emit(f"{buf} = {b.draw(st.sampled_from(makes))}")
        b.emit(f"{vb} = tj.Variable({buf})")
        b.emit(f"{w} = {src.name} * {vb}")
        b.emit(b.draw(st.sampled_from([f"{buf}[...] = 0.25", f"{buf} += 1.0",
                                       f"{buf}.reshape(-1)[:1] = -0.5"])))
        b.emit(f"{name} = {w} + {vb}")
        b.features.add("made_variable_used_first")
    elif form == "temp_mask":
        b.emit(f"{buf} = {d}.copy()")          # (an array also of a 0-d d; d * 1.0 is not)
        b.emit(f"{buf}[{buf} > 0] = 0.25")
        b.emit(f"{name} = {src.name} * tj.Variable({buf})")
        b.features.add("made_temp_mask")
    elif form == "made_mask":
        b.emit(f"{buf} = {b.draw(st.sampled_from(makes))}")
        b.emit(f"{buf}[{d} > 0] = 1.0")
        b.emit(f"{name} = {src.name} * tj.Variable({buf})")
        b.features.add("made_mask")
    elif form == "slice_write":
        # A write through a slice view of the input's data (x.data[..., ::2] *= 0.5).
        b.emit(f"{buf} = {d}[..., ::2]")
        b.emit(f"{buf} *= 0.5")
        b.emit(f"{name} = {src.name} * 1.0")
        b.features.add("made_slice_write")
    else:
        # The input's own data, in place (its later readers see the write, in eager).
        b.emit(f"{d}[{d} < -1.0] = -1.0")
        b.emit(f"{name} = {src.name} * 1.0")
        b.features.add("made_input_write")
    b.add(name, src.shape, src.dtype, src.bound * 1.5 + 1.0)


MADE_ARRAY_STEPS = [(_st_made_array, 1)]


# (focus "broadcast_views"; in the default profile too, rarely.) A captured Parameter
# with a size-1 axis read through a view (W.T.T, a reshape there and back, a reversed
# slice) by several ops of a larger shape, with backwards inside f between the reads,
# the second reaching W through the first's result. Fusion put the view into the
# kernel of one reader; a later move took another reader out, and the view became an
# output of a kernel of the larger shape, which wrote past the (1, n) array's end:
# heap corruption (program 9112 of a 10,000-program run; fusion._detach_escaping_loads).

def _st_broadcast_view(b):
    v = b.pick(lambda w: w.var and w.shape and w.bound <= 10)
    if v is None:
        return b.st_unary()
    nd = b.draw(st.integers(1, min(len(v.shape), 2)))
    tail = tuple(1 if d == B else d for d in v.shape[len(v.shape) - nd:])
    shape = (1,) + tail[1:]
    c = b.capture(shape, "param", reuse=False)
    W = c[0]
    b.updated.add(W)
    forms = {"transpose2": f"F.transpose(F.transpose({W}))",
             "reshape2": f"F.reshape(F.reshape({W}, (-1,)), {shape!r})",
             "reversed": f"{W}[..., ::-1]"}
    form = b.draw(st.sampled_from(sorted(forms)))
    view, a, loss, h, loss2, name = (b.fresh("view"), b.fresh(), b.fresh("loss"),
                                     b.fresh(), b.fresh("loss"), b.fresh())
    u = v.name
    if b.draw(st.booleans()):
        # read beside values computed in the readers' kernel (program 9112's exp(tanh(x)))
        u = b.fresh()
        b.emit(f"{u} = F.exp(F.tanh({v.name}))")
        b.features.add("broadcast_view_computed_operand")
    b.emit(f"{view} = {forms[form]}")
    b.emit(f"{a} = F.tanh({u} * {view})")
    b.emit(f"{loss} = F.mean({a} ** 2)")
    if b.draw(st.booleans()):
        b.emit(f"{W}.cleargrad()")
    else:
        # W.grad goes on from the last call (the gradient is W.grad + the new one: the
        # sum joins the view's reader's kernel; program 9112 without its cleargrad)
        b.features.add("broadcast_view_accumulated_grad")
    b.emit(f"{loss}.backward()")
    b.emit(f"{W}.data -= 0.1 * {W}.grad.data")
    b.emit(f"{h} = {a} + F.tanh({u} * {view})")
    last = view
    dt = "float64" if "float64" in (c[3], v.dtype) else "float32"      # h's, view's
    if b.draw(st.booleans()):
        # A second backward, reaching W through h (its .grad accumulates), through
        # two captures of their own (the gradient of h then joins another kernel).
        c1 = b.capture(tail, "param", reuse=False)
        c2 = b.capture((), "param", reuse=False)
        b.updated.add(c2[0])
        g = b.fresh()
        b.emit(f"{g} = F.tanh({h} * {c1[0]})")
        b.emit(f"{loss2} = F.mean(F.tanh({g} * {c2[0]}) ** 2)")
        b.emit(f"{loss2}.backward()")
        if b.draw(st.booleans()):
            b.emit(f"{W}.data -= 0.1 * {W}.grad.data")
        last = g
        dt = "float64" if "float64" in (dt, c1[3]) else "float32"        # g's
        b.features.add("broadcast_view_second_backward")
    b.emit(f"{name} = F.tanh({h} * {last})")
    b.features.add(f"broadcast_view_{form}")
    b.add(name, v.shape, dt, 1.0)


BROADCAST_VIEW_STEPS = [(_st_broadcast_view, 1)]
# -------------------------------------------------------------- end of made arrays


# ------------------------------------------------------------- numpy calls (focus)
# (focus "numpy_calls"). NumPy functions and ndarray methods applied to an input's data
# with Python constants as arguments (np.round(d, 1), d.clip(-0.75, 0.75), np.where(d >
# 0, d, 0.0), np.cumsum(d, -1), round(d.max(), 2), len(np.unique(...)) whose shape
# depends on the data), their result an operand of the graph. The tracer records each call (it used to escape them, and recorded ndarray.round
# as only its first multiply: x * 10). Inputs only (signed, |x| in [0.5, 1.5]): a
# rounding or a threshold at 0 reads the same data on both sides. Rarely, a plain
# array made in f and written with out= (an escape, the tracer cannot follow it).
_NUMPY_CALLS = ["np.round({d}, {k})", "{d}.round({k})", "np.around({d}, {k})",
                "np.clip({d}, -0.75, 0.75)", "{d}.clip(-0.75, 0.75)", "{d}.clip(max=0.75)",
                "np.clip({d}, {d}.min() * 0.5, 0.9)", "np.where({d} > 0, {d}, 0.0)",
                "np.where({d} > 0, 0.5, {d})", "np.cumsum({d}, -1)", "np.roll({d}, 1, -1)",
                "np.flip({d}, -1)", "np.nan_to_num({d}, nan=0.0)", "round({d}.max(), {k})",
                "{d}.sum().round({k})", "round(float({d}.sum()), {k})",
                "{d}.cumsum(-1)", "np.heaviside({d}, 0.5)", "{d} // 0.5",
                "np.copysign(0.5, {d})", "np.cumprod({d} * 0.5, -1)",
                # results whose shape depends on the data (guarded)
                "{d} * len(np.unique(np.round({d} * 2)))",
                "{d} * np.bincount(np.abs(np.round({d} * 2)).astype(np.int64).ravel())[-1]",
                # calls taking a list or tuple of arrays (NumpyCall.seqs), back to d's shape
                "np.concatenate([{d}, {d} * 0.5], -1)[..., ::2]",
                "np.concatenate(({d} * 0.5, {d}), axis=-1)[..., 1::2]",
                "np.stack([{d}, {d} * 2]).sum(0)", "np.stack(({d}, {d} + 0.5), -1).mean(-1)",
                "np.hstack(({d}, 0.5 * {d})).reshape((2,) + {d}.shape).sum(0)",
                "np.vstack([{d}, {d} * 0.5]).reshape((-1,) + {d}.shape)[1]",
                "np.column_stack([{d}.ravel(), {d}.ravel() * 2])[:, 1].reshape({d}.shape)",
                "np.block([{d}.ravel(), {d}.ravel()])[::2].reshape({d}.shape)",
                "np.concatenate([{d}, [0.5]], axis=None)[:-1].reshape({d}.shape)"
                ".astype({d}.dtype)",
                # calls giving several arrays (one node per result)
                "np.modf({d} * 3)[0]", "np.divmod({d}, 0.7)[1]", "sum(np.divmod({d}, 0.7))",
                "{d} * len(np.nonzero({d}.ravel() > 0)[0])",
                "{d} * np.where({d}.ravel() > 0)[0].size",
                # constructors of traced numbers (trace/sequences.py: each number was
                # guarded by value, so every new input retraced), and of rows of traced
                # data (copied from their buffers: frozen, caught by the first-call check)
                "{d} * np.array([{d}.mean(), float({d}.max())]).sum()",
                "{d} - np.stack([float({d}.min()), 0.5])[0]",
                "{d} * np.asarray(({d}.std(), 1.0), dtype={d}.dtype)[0]",
                "{d} + np.hstack((float({d}.sum()), [0.25]))[0]",
                "np.full({d}.shape, float({d}.mean())) + {d}",
                "np.full_like({d}, {d}.max()) * {d}",
                "np.array([{d}, {d} * 0.5]).sum(0)",
                # NumPy functions of lists of traced floats where no argument is traced
                # data (NumPy's C code read each value: retraced on every new input)
                "{d} * np.mean([{d}.max(), {d}.min()])",
                "{d} - np.median(({d}.sum(), float({d}.max()), 0.25))",
                "{d} * np.polyval([{d}.mean(), 0.5], 2.0)",
                # NumPy's C iterators over the buffer, and a list of traced data NumPy
                # reads as plain values (frozen, silently: escapes now)
                "{d} * sum(float(v) for v in np.nditer({d}))",
                "{d} * np.interp(0.5, [0.0, 1.0], [{d}.min(), {d}.max()])",
                # np.ndarray's C methods called unbound (the traced values, frozen)
                "{d} * np.ndarray.item({d}.reshape(-1), 0)",
                "np.ndarray.flatten({d}).reshape({d}.shape) * 0.5"]


def _st_numpy_call(b):
    ins = [v for v in b.vals if v.signed]
    if not ins:
        return b.st_unary()
    src = b.draw(st.sampled_from(ins))
    r = b.fresh("r")
    form = b.draw(st.integers(0, 79))
    if form < 8 and src.shape:
        # A NumPy call's view of a buffer the function then writes in place: eager's
        # view shows the write.
        c = b.fresh("c")
        b.emit(f"{c} = {src.data} * 1.0")
        view = b.draw(st.sampled_from(["np.flip({c}, -1)", "{c}.ravel().reshape({c}.shape)",
                                       "np.expand_dims({c}, 0)[0]"]))
        b.emit(f"{r} = " + view.format(c=c))
        b.emit(f"{c} += 0.5")
        b.features.add("numpy_call_view_then_write")
    elif form == 8:
        b.emit(f"{r} = np.empty({src.data}.shape, {src.data}.dtype)")
        b.emit(f"np.multiply({src.data}, 0.5, out={r})")
        b.emit(f"{r} += 0.25")
        b.features.add("numpy_call_out_temp")
    else:
        calls = _NUMPY_CALLS if src.shape else [c for c in _NUMPY_CALLS if "-1)" not in c]
        call = b.draw(st.sampled_from(calls))
        b.emit(f"{r} = " + call.format(d=src.data, k=b.draw(st.sampled_from([0, 1, 2]))))
        b.features.add("numpy_call_" + call.split("(")[0].replace("{d}", "d"))
    name = b.fresh()
    b.emit(f"{name} = {src.name} * np.tanh({r})")
    b.add(name, src.shape, src.dtype, src.bound, var=src.var)


NUMPY_CALL_STEPS = [(_st_numpy_call, 1)]
# --------------------------------------------------------------- end of numpy calls


@st.composite
def source_programs(draw, max_inputs=3, max_steps=9, avoid=(), focus=None):
    """A random program as source text (see the module docstring); `avoid` names
    constructs to leave out (AVOIDABLE); focus="state" draws mostly STATE_STEPS,
    focus="nested_grad" mostly NESTED_GRAD_STEPS;
    focus="rebound" mostly st_rebound_state (state rebound on a holder across calls);
    focus="unchain" mostly UNCHAIN_STEPS (unchain_backward inside f);
    focus="mixed_dtypes" mostly MIXED_DTYPE_STEPS (float32 results with float64
    cotangents beside a dead float64 state);
    focus="nesting" returns the results nested up to and past pytree.MAX_DEPTH;
    focus="matmul" mostly MATMUL_STEPS (what passes/matmul_batching.py rewrites);
    focus="gate_sums" mostly GATE_SUM_STEPS (joined products of kernels' results);
    focus="conv" mostly CONV_STEPS (conv -> bias -> ReLU -> pooling: what
    passes/conv_epilogue.py rewrites);
    focus="made_leaves" mostly MADE_LEAF_STEPS (leaves made in f that outlive it);
    focus="input_leaves" mostly INPUT_LEAF_STEPS (leaves of an input's data beside it);
    focus="rebind_inplace" mostly REBIND_INPLACE_STEPS (a user Function of an input f
    updates in place, before or after it: rebind_inplace_programs rebinds the data);
    focus="rebind_alias" mostly REBIND_ALIAS_STEPS (a captured Parameter's .data or
    stored ndarray state rebound to an existing buffer);
    focus="scalar_dropout" mostly 0-d inputs and dropout (argument_update_programs);
    focus="backward_into" mostly BACKWARD_INTO_STEPS (a backward inside f going on
    into the caller's graph through arguments with a creator);
    focus="grad_grads" mostly GRAD_GRAD_STEPS (x.grad.grad set by a backward inside f;
    grad() of a function closing over an argument with a creator);
    focus="retain_grad" returns earlier values the last depends on, and the caller's
    backward (always one) keeps the intermediates' gradients (RETAIN); and mostly
    RETAINED_INSIDE_STEPS (a backward inside f leaving .grads on intermediates the
    caller's backward passes); a third of its programs have no Variable argument and
    capture arrays (NO_VAR: nothing differentiable from outside but what state steps
    capture);
    focus="dropped_state" mostly DROPPED_STATE_STEPS (a value stored as state, dropped
    or rebound by the caller before its backward, which is always one);
    focus="replay_reads" mostly REPLAY_READ_STEPS (a value computed before an in-place
    update of the buffer it reads, returned, read by a later op), the caller's backward
    (always one) with retain_grad;
    focus="numpy_calls" mostly NUMPY_CALL_STEPS (NumPy calls with constant arguments
    on an input's data);
    focus="made_arrays" mostly MADE_ARRAY_STEPS (arrays f makes, written with an
    input's data, and item assignment into traced data);
    focus="broadcast_views" mostly BROADCAST_VIEW_STEPS (a captured Parameter with a
    size-1 axis read through a view by ops of a larger shape, backwards inside f
    between the reads);
    focus="rounding" mostly ROUNDING_STEPS (round/floor/ceil/trunc/int/float/.item() of
    data-derived numbers, float, uint64 and uint32, small and past int64, as operands,
    branch conditions and loop trip counts)."""
    avoid = frozenset(avoid)
    unknown = avoid - set(AVOIDABLE)
    if unknown:
        raise ValueError(f"source_programs: unknown avoid {sorted(unknown)}; "
                         f"known: {sorted(AVOIDABLE)}")
    b = Builder(draw, avoid)
    side = 2 if "size1" in avoid else 1
    feat = tuple(draw(st.lists(st.integers(side, 5), min_size=0, max_size=2)))
    n_in = draw(st.integers(1, max_inputs))
    # (focus "retain_grad") Sometimes no argument is a Variable and captures are arrays
    # (NO_VAR): nothing differentiable from outside, yet the results the focus returns
    # are computed from one another, so the caller's walk from one passes the others
    # and gives them .grads (retain_grad, a preset .grad, create_graph).
    no_var = focus == "retain_grad" and draw(st.integers(0, 2)) == 0
    if no_var:
        b.features.add("no_variable_input")
        b.capture_kinds = ["array"]
    inputs = []
    for i in range(n_in):
        forms = ["batched", "batched", "fixed", "scalar"]
        if focus == "scalar_dropout":
            # 0-d arguments (compiled as one scalar kernel, cut differently by remat).
            forms += ["scalar"] * 4
        if "size1" not in avoid:
            forms.append("batched_ones")
        form = draw(st.sampled_from(forms))
        if form == "batched":
            shape = (B,) + feat
        elif form == "fixed":
            shape = feat
        elif form == "batched_ones":
            shape = (B,) + tuple(draw(st.sampled_from([1, d])) for d in feat)
        else:
            shape = ()
        # x0 is a Variable, so every statement finds one to work on (but in a
        # no_var program, which makes one of x0 first).
        kind = "array" if no_var else \
            draw(st.sampled_from(["var", "var", "var", "array"])) if i else "var"
        dtype = draw(st.sampled_from(["float64", "float32"]))
        # (focus "rounding": x0 signed, the finite input its steps read.)
        signed = draw(st.booleans()) or (focus in ("rounding", "numpy_calls", "made_arrays")
                                          and i == 0)
        name = f"x{i}"
        v = b.add(name, shape, dtype, 1.5 if signed else 2.0, var=(kind == "var"),
                  signed=signed)
        b.args.append((name, "var" if kind == "var" else "array", v))
        inputs.append((name, kind, shape, dtype, signed))
    b.has_float = draw(st.booleans())
    if b.has_float:
        b.features.add("float_arg")
    if not any(s for *_, s in inputs) and draw(st.booleans()):
        pass
    if no_var:
        b.st_unary()            # F.* of an ndarray argument: a Variable to work on
    steps = draw(st.integers(2, max_steps))
    table = [(b.st_unary, 6), (b.st_binary, 6), (b.st_scalar, 2), (b.st_reduce, 3),
             (b.st_movement, 2), (b.st_matmul, 1), (b.st_capture_op, 3), (b.st_if, 2),
             (b.st_loop, 1), (b.st_no_grad, 1),
             (b.st_dropout, 8 if focus == "scalar_dropout" else 1), (b.st_user_function, 2),
             (b.st_inner_step, 1), (b.st_inplace_arg, 1), (b.st_invariant_broadcast, 1)]
    table += [(getattr(b, m), w * (12 if focus == "state" else 1)) for m, w in STATE_STEPS]
    table += [(lambda g=g: g(b), w) for g, w in ESCAPES_STEPS]     # escapes block
    table += [(lambda g=g: g(b), w * (30 if focus == "nested_grad" else 1))
              for g, w in NESTED_GRAD_STEPS]                         # nested grad block
    table += [(lambda g=g: g(b), w * (12 if focus == "views" else 1))  # returned views
              for g, w in VIEWS_STEPS]
    if focus == "views":
        table += [(lambda g=g: g(b), w) for g, w in VIEWS_FOCUS_STEPS]
    table.append((lambda: st_rebound_state(b), 12 if focus == "rebound" else 1))
    table += [(lambda g=g: g(b), w * (12 if focus == "mixed_dtypes" else 1))
              for g, w in MIXED_DTYPE_STEPS]                         # mixed-dtype cotangents
    table += [(lambda g=g: g(b), w * (8 if focus == "argument_views" else 0))
              for g, w in ARGUMENT_VIEW_STEPS]                       # argument views
    if focus in (None, "made_leaves"):   # (the other focuses draw as they did)
        table += [(lambda g=g: g(b), w * (12 if focus == "made_leaves" else 1))
                  for g, w in MADE_LEAF_STEPS]                       # made leaves
    if focus == "rebind_alias":  # (only then, as unchain's)
        table += [(lambda g=g: g(b), w * 12) for g, w in REBIND_ALIAS_STEPS]
    if focus == "unchain":      # (only then: the default profile's draws stay as they were)
        table += [(lambda g=g: g(b), w * 12) for g, w in UNCHAIN_STEPS]  # unchain inside
    if focus == "matmul":       # (only then, as unchain's)
        table += [(lambda g=g: g(b), w * 6) for g, w in MATMUL_STEPS]     # matmul batching
    if focus == "gate_sums":    # (only then, as unchain's)
        table += [(lambda g=g: g(b), w * 6) for g, w in MATMUL_STEPS + [
            (g, 24 * w) for g, w in GATE_SUM_STEPS]]
    if focus == "conv":         # (only then, as unchain)
        table += [(lambda g=g: g(b), w * 40) for g, w in CONV_STEPS]     # conv epilogues
    if focus == "backward_into":  # (only then, as unchain)
        table += [(lambda g=g: g(b), w * 12) for g, w in BACKWARD_INTO_STEPS]
    if focus == "grad_grads":  # (only then, as unchain)
        table += [(lambda g=g: g(b), w * 12) for g, w in GRAD_GRAD_STEPS]
    if focus == "input_leaves":  # (only then, as unchain)
        table += [(lambda g=g: g(b), w * 12) for g, w in INPUT_LEAF_STEPS]
    if focus == "rebind_inplace":  # (only then, as unchain)
        table += [(lambda g=g: g(b), w * 30) for g, w in REBIND_INPLACE_STEPS]
    if focus == "retain_grad" and not no_var:  # (only then, as unchain; NO_VAR's
        # backward inside f would be onto a captured Parameter)
        table += [(lambda g=g: g(b), w * 12) for g, w in RETAINED_INSIDE_STEPS]
    if focus == "dropped_state":  # (only then, as unchain)
        table += [(lambda g=g: g(b), w * 12) for g, w in DROPPED_STATE_STEPS]
    if focus == "replay_reads":  # (only then, as unchain)
        table += [(lambda g=g: g(b), w * 12) for g, w in REPLAY_READ_STEPS]
    if focus == "rounding":  # (only then, as unchain)
        table += [(lambda g=g: g(b), w * 60) for g, w in ROUNDING_STEPS]
    if focus == "numpy_calls":  # (only then, as unchain)
        table += [(lambda g=g: g(b), w * 60) for g, w in NUMPY_CALL_STEPS]
    if focus in (None, "made_arrays"):    # (the other focuses draw as they did)
        table += [(lambda g=g: g(b), w * (40 if focus == "made_arrays" else 1))
                  for g, w in MADE_ARRAY_STEPS]
    if focus in (None, "broadcast_views"):   # (the other focuses draw as they did)
        table += [(lambda g=g: g(b), w * (40 if focus == "broadcast_views" else 1))
                  for g, w in BROADCAST_VIEW_STEPS]
    weighted = [fn for fn, w in table for _ in range(w)]
    for _ in range(steps):
        draw(st.sampled_from(weighted))()
    outputs = _outputs(b, retain_focus=(focus == "retain_grad"))
    if focus == "nesting":
        outputs = _nested_outputs(b, outputs)
    elif focus is None and draw(st.integers(0, 9)) == 0:
        outputs = _dataclass_outputs(b, outputs)
    if "size1" in avoid:
        # What the sites above cannot rule out (a capture broadcast over B, x[:1]).
        assume(all(1 not in v.shape for v in b.vals)
               and all(1 not in c[2] for c in b.captures))

    # Calls: phase A (batch nb_a) then phase B (a new shape), signs flip branches.
    nb_a = draw(st.integers(side, 5))
    nb_b = draw(st.integers(side, 5).filter(lambda k: k != nb_a))
    sign = draw(st.sampled_from([1.0, -1.0]))
    signs = [sign, sign, -sign, sign, -sign, sign] + [sign, sign, -sign, sign]
    nbs = [nb_a] * 6 + [nb_b] * 4
    svals = draw(st.lists(st.sampled_from([0.125, 0.25, 0.375, 0.625, 0.75, 0.875]),
                          min_size=10, max_size=10))
    plan = [(nb, sg, s) for nb, sg, s in zip(nbs, signs, svals)]
    backward = draw(st.sampled_from([None, "plain", "plain", "create_graph"]))
    if backward == "create_graph" and "create_graph_inplace" in avoid and (
            b.features & {"inner_backward_update", "inplace_arg", "inplace_capture"}):
        backward = "plain"
    if focus in ("retain_grad", "dropped_state", "replay_reads") and backward is None:
        backward = "plain"
    if backward == "create_graph":
        b.features.add("create_graph")
    # The caller's backward keeps the intermediates' gradients (retain_grad=True): a
    # returned value another result depends on (`return loss, h`) is one of eager's
    # intermediates, whose .grad the harness compares (the cotangent through it).
    # (Drawn in the default profile only: the other focuses draw as they did.)
    retain = backward is not None and (focus in ("retain_grad", "replay_reads") or (
        focus is None and draw(st.integers(0, 3)) == 0))
    if retain:
        b.features.add("retain_grad")
    # The caller's loss squares the results (SQUARE): its backward then makes Functions
    # of them (`gy * y`) before the walk reaches the call, which a create_graph walk
    # with retain_grad replays, and the second-order walk passes those Functions and
    # the replay's graph both (the order of a walk: the results' generations).
    square = retain and backward == "create_graph" and draw(st.booleans())
    if square:
        b.features.add("square_loss")
    # The caller sets .grad on every result Variable but the first before a backward
    # from the first alone (PRESET): eager's walk adds a preset .grad where it passes
    # (a result the first depends on) and leaves the others' alone.
    preset = backward is not None and "preset" not in avoid and draw(
        st.integers(0, 1 if focus == "retain_grad" else 7)) == 0
    if preset:
        b.features.add("preset_result_grads")
    base_seed = draw(st.integers(0, 10_000))
    # Sometimes one entry of the unsigned inputs is inf or -inf on the last call of phase
    # A (a compiled variant exists by then): NumPy's results must come out of every
    # fusion and backward rule. Signed inputs stay finite: conditions read them.
    nonfinite = None
    if "nonfinite" not in avoid and any(not s for *_, s in inputs) \
            and draw(st.integers(0, 3)) == 0:
        nonfinite = draw(st.sampled_from(["np.inf", "-np.inf"]))
        b.features.add("nonfinite_input")
    src = _render(b, inputs, outputs, plan, backward, base_seed, nonfinite, retain,
                  preset, square)
    has32 = any(d == "float32" for *_, d, _ in inputs) or any(
        c[3] == "float32" for c in b.captures)
    arg_kinds = ["var" if kind == "var" else "float_array" for _, kind, *_ in inputs]
    arg_kinds += ["other"] if b.has_float else []
    arg_kinds += [b.extra_kinds.get(n, "other") for n, _ in b.extra_args]
    return SourceProgram(src, len(plan), has32, sorted(b.features), arg_kinds)


def _outputs(b, retain_focus=False):
    """The return expression: the last value plus maybe fan-out, kinds and identities.
    `retain_focus`: the last value and one to three earlier values it may depend on
    (intermediates of its graph, as a retain_grad backward from outside sees them)."""
    last = b.vals[-1]
    outs = [last.name] + [n for n in b.also_return if n != last.name]
    if retain_focus:
        cands = [v.name for v in b.vals[:-1] if v.var]
        if cands:
            outs += b.draw(st.lists(st.sampled_from(cands), min_size=1, max_size=3))
            b.features.add("return_intermediate")
    extra = b.draw(st.integers(0, 2))
    kinds = ["same", "earlier", "data", "np_scalar", "py_scalar", "arg", "capture"]
    inputs = {a[0] for a in b.args}
    if "identity" in b.avoid:
        kinds = ["earlier", "data", "np_scalar", "py_scalar"]
    for _ in range(extra):
        kind = b.draw(st.sampled_from(kinds))
        if "identity" in b.avoid and kind == "data" and f"{last.name}.data" in outs:
            continue
        if kind == "same":
            outs.append(last.name)
        elif kind == "earlier":
            cands = [v.name for v in b.vals if "identity" not in b.avoid
                     or (v.name not in outs and v.name not in inputs)]
            if cands:
                outs.append(b.draw(st.sampled_from(cands)))
        elif kind == "data" and last.var:
            outs.append(f"{last.name}.data")
            b.features.add("return_ndarray")
        elif kind == "np_scalar" and last.var:
            outs.append(f"{last.name}.data.sum()")
            b.features.add("return_np_scalar")
        elif kind == "py_scalar" and last.var:
            outs.append(f"float({last.name}.data.sum())")
            b.features.add("return_py_scalar")
        elif kind == "arg":
            outs.append(b.draw(st.sampled_from(b.args))[0])
            b.features.add("return_arg")
        elif kind == "capture" and b.captures:
            outs.append(b.draw(st.sampled_from(b.captures))[0])
            b.features.add("return_capture")
    outs += b.returned_views                            # returned views block
    if len(set(outs)) < len(outs):
        b.features.add("return_twice")
    if len(outs) == 1 and b.draw(st.booleans()):
        return outs[0]
    return ", ".join(outs) + ("," if len(outs) == 1 else "")


def _dataclass_outputs(b, outputs):
    """The results in a dataclass f makes (Res(outs=..., tag=...)), sometimes frozen:
    rebuilt per compiled call (they were a leaf: compiled calls returned the traced
    call's object, and the first-call check ran them eagerly)."""
    r = b.fresh("r")
    b.emit(f"{r} = Res(({outputs}), 'res')")
    b.features.add("dataclass_result")
    return r


def _nested_outputs(b, outputs):
    """The results nested lists and tuples deep around pytree.MAX_DEPTH: up to it they
    compile, deeper they run eagerly, warned (a result nested ~1000 deep once raised
    RecursionError in the trace; the harness's own walks stay recursive, so not that
    deep here)."""
    depth = b.draw(st.sampled_from([1, 3, MAX_DEPTH - 1, MAX_DEPTH, MAX_DEPTH + 1, 150]))
    r = b.fresh("r")
    b.emit(f"{r} = ({outputs})")
    b.emit(f"for i in range({depth}):")
    b.emit(f"    {r} = [{r}] if i % 2 else ({r},)")
    b.features.add("nested_result" if depth <= MAX_DEPTH else "nested_result_too_deep")
    return r


def _render(b, inputs, outputs, plan, backward, seed, nonfinite=None, retain=False,
            preset=False, square=False):
    out = ["import numpy as np", "import tracejit as tj", "import tracejit.functions as F",
           "", ""]
    if "buffer_read" in b.features:
        out.insert(0, "import struct")
    if any(f.startswith("rounding_") for f in b.features):
        out.insert(0, "import math")
    for k in sorted(b.classes):
        out += [USER_FUNCTIONS[k], ""]
    if "made_via_dict" in b.features:
        out += ["NP_MAKERS = {'zeros': np.zeros}", "", ""]
    if "made_via_class" in b.features:
        out += ["class Maker:", "    make = staticmethod(np.zeros)", "", ""]
    if "dataclass_result" in b.features:
        out.insert(0, "import dataclasses")
        out += ["@dataclasses.dataclass(frozen=True)", "class Res:", "    outs: object",
                "    tag: str", "", ""]
    glob = [c for c in b.captures if c[4] == "global"]
    clos = [c for c in b.captures if c[4] != "global"]   # (and the ones f's defaults,
    held = {}                                            # or a tuple, hold: made there)
    for c in clos:
        # A capture f rebinds is read through the closure (nonlocal), whatever was drawn.
        held[c[0]] = "closure" if c[0] in b.rebinds else c[4]

    def cap_line(c, k):
        name, kind, shape, dtype, _ = c
        draw = (f"np.random.default_rng({seed + 17 * k + 1}).uniform(-1.0, 1.0, "
                f"{shape_src(shape)}).astype(np.{dtype})")
        return f"{name} = tj.Parameter({draw})" if kind == "param" else f"{name} = {draw}"

    if glob:
        out.append("# captured state, read as module globals")
    for c in glob:
        out.append(cap_line(c, b.captures.index(c)))
    if glob:
        out += ["", ""]
    out += _state_module_lines(b)
    params = [n for n, *_ in inputs] + (["s0"] if b.has_float else []) + \
        [n for n, _ in b.extra_args]
    out.append("def make():")
    if clos:
        out.append("    # captured state, read through the closure")
    for c in clos:
        out.append("    " + cap_line(c, b.captures.index(c)))
        if held[c[0]] == "tuple":
            out.append(f"    hold_{c[0]} = ({c[0]}, 'held')")
    out.append("")
    defaults = [f"{n}={n}" for n, w in held.items() if w == "default"]
    kwdefaults = [f"{n}={n}" for n, w in held.items() if w == "kwdefault"]
    signature = params + defaults + (["*"] + kwdefaults if kwdefaults else [])
    out.append(f"    def f({', '.join(signature)}):")
    for c in b.captures:
        if c[0] in b.rebinds:
            out.append(f"        {'global' if c[4] == 'global' else 'nonlocal'} {c[0]}")
    out += [f"        {n} = hold_{n}[0]" for n, w in held.items() if w == "tuple"]
    out += [f"        global {g}" for g in _state_globals(b)]
    for line in b.lines:
        out.append("    " + line)
    out.append(f"        return {outputs}")
    out.append("")
    out.append("    return f, {" + ", ".join(f"{c[0]!r}: {c[0]}" for c in clos) + "}")
    out += ["", ""]
    out.append("f, _closure = make()")
    out.append("CAPTURES = {" + ", ".join(f"{c[0]!r}: {c[0]}" for c in glob)
               + (", " if glob else "") + "**_closure}")
    out += ["# (batch side nb, sign of the signed inputs, s0) for each call; the last calls",
            "# use a new batch side", f"PLAN = {plan!r}",
            f"BACKWARD = {backward!r}   # None, 'plain' or 'create_graph'",
            f"RETAIN = {retain!r}   # the caller's backward with retain_grad",
            f"PRESET = {preset!r}   # results' .grad set, the backward from the first",
            f"SQUARE = {square!r}   # the caller's loss squares the results",
            f"NONFINITE = {nonfinite}   # on call 5, entry 0 of the unsigned inputs",
            "", ""]
    out.append("def args(call):")
    out.append("    \"\"\"Fresh arguments for call `call` (new objects, the same values for "
               "eager and jit).\"\"\"")
    out.append("    nb, sign, s = PLAN[call]")
    out += _state_reset_lines(b)
    out.append(f"    rng = np.random.default_rng({seed} + call)")
    names = []
    for name, kind, shape, dtype, signed in inputs:
        draw = (f"rng.uniform(-0.5, 0.5, {shape_src(shape)}) + sign" if signed
                else f"rng.uniform(-2.0, 2.0, {shape_src(shape)})")
        arr = f"np.asarray({draw}, dtype=np.{dtype})"
        if nonfinite is not None and not signed:
            out.append(f"    a = {arr}")
            out.append("    if call == 5:")
            out.append("        a.reshape(-1)[0] = NONFINITE")
            arr = "a"
        out.append(f"    {name} = tj.Variable({arr})" if kind == "var"
                   else f"    {name} = {arr}")
        if name in b.caller_grads:
            out.append(_caller_grad_line(name, seed))
        if name in b.view_args:
            out.append(_view_of(name, b.view_args[name]))
        if name in b.layout_flip:
            # Other memory layouts, the same values, one key: Fortran order (a flattening
            # reshape copies), every other element of a wider buffer (non-contiguous,
            # and a flattening reshape is a view).
            out.append("    if call % 3 == 1:")
            out.append(f"        {name}.data = np.asfortranarray({name}.data)")
            out.append("    elif call % 3 == 2:")
            out.append(f"        {name}.data = np.stack([{name}.data, {name}.data * 0], "
                       f"axis=-1)[..., 0]")
        names.append(name)
    for c in b.captures:
        if c[0] in b.caller_grads:
            out.append(_caller_grad_line(f"CAPTURES[{c[0]!r}]", seed))
    if b.has_float:
        out.append("    s0 = s")
        names.append("s0")
    for name, src in b.extra_args:
        out.append(f"    {name} = {src}")
        names.append(name)
    out.append(f"    return ({', '.join(names)}{',' if len(names) == 1 else ''})")
    out += _drop_state_lines(b)
    return "\n".join(out) + "\n"


def _caller_grad_line(var, seed):
    """args(): the caller sets var's .grad before the call (its own stream: the
    arguments' draws stay as they were)."""
    return (f"    {var}.grad = tj.Variable(np.random.default_rng({seed + 7919} + call)"
            f".uniform(-1.0, 1.0, {var}.shape).astype({var}.dtype))")


# ------------------------------------------------------------------ argument updates
# Programs whose caller changes an argument between the call and its backward (the
# DeZero form `y = f(x); x.data += 1; y.backward()`): eager's backward reads each
# Function's input Variables as they are then, and the values computed from them as
# the forward computed them; a compiled call's backward must do the same (remat and
# the create_graph replay must not recompute from the changed data).

# What the caller does to one argument, by the argument's kind (SourceProgram.arg_kinds):
# {kind of update: {kind of argument: source acting on `a`}}. An update is drawn for an
# argument only where its kind has one: a float update of an int ndarray raises in eager
# (`a += 0.25` on int64: UFuncTypeError), which made the program invalid, not a test of
# jit. An int index array's updates keep every index in range ([-n, n) -> [-n, n)).
ARG_UPDATES = {
    "none": {},
    "iadd": {"var": "a.data += 0.25", "float_array": "a += 0.25"},
    "imul": {"var": "a.data *= -0.5", "float_array": "a *= -0.5",
             "int_array": "np.invert(a, out=a)"},          # -a - 1
    "rebind": {"var": "a.data = a.data * 0.5 + 0.125", "float_array": "a *= 0.5"},
    "rebind_copy": {"var": "a.data = a.data.copy()"},
    "entry": {"var": "a.data.reshape(-1)[:1] = 0.375",
              "float_array": "a.reshape(-1)[:1] = 0.375", "int_array": "a.reshape(-1)[:1] = 0"},
    "fill": {"var": "a.data[...] = 0.625", "float_array": "a[...] = 0.625",
             "int_array": "a[...] = 0"},
}
# How BETWEEN tells the kinds apart at run time (a Python float or NumPy scalar
# argument, a holder object: left alone).
_ARG_KIND_TESTS = (("var", "isinstance(a, tj.Variable)"),
                   ("float_array", "isinstance(a, np.ndarray) and a.dtype.kind == 'f'"),
                   ("int_array", "isinstance(a, np.ndarray) and a.dtype.kind in 'iu'"))


def updates_for(arg_kind):
    """The update kinds valid for an argument of kind `arg_kind` ("none" always)."""
    return sorted(k for k, by in ARG_UPDATES.items() if k == "none" or arg_kind in by)


@st.composite
def argument_update_programs(draw, avoid=(), focus=None):
    """A `source_programs` program with a backward, whose caller updates its arguments
    after each call and before the backward (harness: `BETWEEN(call, args)`): in place
    (`x.data += c`, an entry, a fill), or rebinding `x.data`, per argument and call,
    each update one its argument's dtype allows."""
    if focus is None:
        # argument views block: a third of the programs; 0-d arguments with dropout
        # (a mask drawn in the forward, which the create_graph replay must take from
        # the call, not recompute from the updated argument): a third.
        focus = draw(st.sampled_from([None, "argument_views", "scalar_dropout"]))
    p = draw(source_programs(avoid=avoid, focus=focus))
    backward = draw(st.sampled_from(["plain", "create_graph"] +
                                    ["create_graph"] * (focus == "scalar_dropout")))
    if backward == "create_graph" and "create_graph_inplace" in avoid:
        backward = "plain"
    src = p.source
    for old in ("None", "'plain'", "'create_graph'"):
        src = src.replace(f"BACKWARD = {old}   #", f"BACKWARD = {backward!r}   #")
    # Per call, per argument position (the first 4): one update valid for its kind.
    kinds = [p.arg_kinds[j] if j < len(p.arg_kinds) else "other" for j in range(4)]
    row = st.tuples(*(st.sampled_from(updates_for(k)) for k in kinds)).map(list)
    table = draw(st.lists(row, min_size=p.n_calls, max_size=p.n_calls))
    assume(any(k != "none" for r in table for k in r))
    used = sorted({k for r in table for k in r})
    lines = ["", "",
             f"ARG_UPDATES = {table!r}   # per call, per argument",
             "", "",
             "def BETWEEN(call, args):",
             "    \"\"\"The caller changes its arguments after the call, before the "
             "backward.\"\"\"",
             "    for a, kind in zip(args, ARG_UPDATES[call]):"]
    for j, (arg_kind, test) in enumerate(_ARG_KIND_TESTS):
        lines += [f"        {'if' if j == 0 else 'elif'} {test}:", "            pass"]
        lines += [f"            {line}" for kind in used if arg_kind in ARG_UPDATES[kind]
                  for line in (f"if kind == {kind!r}:",
                               f"    {ARG_UPDATES[kind][arg_kind]}")]
    if "def DROP_STATE(" in src:
        lines.append("    DROP_STATE(call, args)")     # (the state dropped too)
    src = src + "\n".join(lines) + "\n"
    features = sorted(set(p.features) | {"argument_update", backward == "create_graph"
                                         and "create_graph" or "plain_backward"})
    return SourceProgram(src, p.n_calls, p.has_float32, features, p.arg_kinds)


# What rebind_inplace_programs' caller does to a Variable (an argument, a captured
# Parameter) after a call, before its backward: rebind its data to a new array, of
# its dtype or of the other float dtype, or update it in place.
REBIND_UPDATES = {
    "none": "pass",
    "rebind": "a.data = a.data * 0.5 + 0.125",
    "rebind_dtype": "a.data = (a.data * 0.5 + 0.125).astype("
                    "np.float32 if a.data.dtype == np.float64 else np.float64)",
    "imul": "a.data *= -0.5",
}


@st.composite
def rebind_inplace_programs(draw, avoid=(), focus=None):
    """A `source_programs` program of focus "rebind_inplace" (a user Function of an
    input f updates in place: REBIND_INPLACE_STEPS) with a backward, plain or (mostly)
    create_graph, whose caller changes the argument Variables and the captured
    Parameters after each call, before the backward (harness: `BETWEEN(call, args)`):
    REBIND_UPDATES, per argument and call, one for all the Parameters per call."""
    p = draw(source_programs(avoid=avoid, focus=focus or "rebind_inplace"))
    backward = draw(st.sampled_from(["plain", "create_graph", "create_graph"]))
    if backward == "create_graph" and "create_graph_inplace" in avoid:
        backward = "plain"
    src = p.source
    for old in ("None", "'plain'", "'create_graph'"):
        src = src.replace(f"BACKWARD = {old}   #", f"BACKWARD = {backward!r}   #")
    kinds = sorted(REBIND_UPDATES)
    row = st.lists(st.sampled_from(kinds), min_size=4, max_size=4)
    table = draw(st.lists(row, min_size=p.n_calls, max_size=p.n_calls))
    params = draw(st.lists(st.sampled_from(kinds), min_size=p.n_calls, max_size=p.n_calls))
    assume(any(k != "none" for r in table for k in r) or any(k != "none" for k in params))

    def chain(indent):
        out = []
        for j, k in enumerate(kinds):
            out += [f"{indent}{'if' if j == 0 else 'elif'} kind == {k!r}:",
                    f"{indent}    {REBIND_UPDATES[k]}"]
        return out
    lines = ["", "",
             f"ARG_UPDATES = {table!r}   # per call, per argument",
             f"PARAM_UPDATES = {params!r}   # per call, every captured Parameter",
             "", "",
             "def BETWEEN(call, args):",
             "    \"\"\"The caller changes its arguments and captured Parameters after the "
             "call, before the backward.\"\"\"",
             "    for a, kind in zip(args, ARG_UPDATES[call]):",
             "        if isinstance(a, tj.Variable):"] + chain(" " * 12) + [
             "    kind = PARAM_UPDATES[call]",
             "    for a in CAPTURES.values():",
             "        if isinstance(a, tj.Parameter):"] + chain(" " * 12)
    if "def DROP_STATE(" in src:
        lines.append("    DROP_STATE(call, args)")     # (the state dropped too)
    src = src + "\n".join(lines) + "\n"
    features = sorted(set(p.features) | {"argument_update", "parameter_update",
                                         backward == "create_graph" and "create_graph"
                                         or "plain_backward"})
    return SourceProgram(src, p.n_calls, p.has_float32, features, p.arg_kinds)


# The generators the fuzzer's command line offers (`--generator`).
GENERATORS = {"programs": source_programs, "argument_updates": argument_update_programs,
              "rebind_inplace": rebind_inplace_programs}


# ------------------------------------------------------------- rebound state (threaded)
#
# State a step rebinds where it reaches it, across calls: an RNN's `self.h = h_new`.
# The holder is a module global's attribute (a plain object or a tj Layer), a dict
# item or a module global itself; the state starts as None (the first step after a
# reset_state() has no h term) and is reset before call 0, before the phase with the
# new batch side, and sometimes between. The state carries its graph from call to
# call (the harness's backward after each call reaches the calls before), unless the
# step unchains it. STATE() gives the harness the state after each call, compared
# like captures.

_STATE_HOLDERS = ("object", "layer", "dict", "global", "arg")
# "arg": the holder object is passed to f as an argument (a model passed as `m`), the
# same object on every call: such state runs eagerly, warned, and must match eager.


def st_rebound_state(b):
    """Read the state, compute the new one from a value in scope, rebind it."""
    _start_states(b)
    v = b.pick(lambda w: w.var)
    if v is None:
        return b.st_unary()
    k = len(b.states)
    holder = b.draw(st.sampled_from(_STATE_HOLDERS))
    ref = {"object": f"STATE{k}.h", "layer": f"LAYER{k}.h", "dict": f"STATED{k}['h']",
           "global": f"H{k}", "arg": f"STATE{k}.h"}[holder]
    inner = ref                   # the state as f names it
    if holder == "arg":
        inner = f"hold{k}.h"
        b.extra_args.append((f"hold{k}", f"STATE{k}"))
        b.extra_kinds[f"hold{k}"] = "other"
    mix = b.draw(st.sampled_from(["add", "param", "add"]))
    prev, name = b.fresh("p"), b.fresh()
    if mix == "param":
        c = b.capture(tuple(1 if d == B else d for d in v.shape[-1:]), "param")
        term = f"{prev} * {c[0]}"
    else:
        term = f"0.5 * {prev}"
    b.emit(f"{prev} = {inner}")
    b.emit(f"if {prev} is None:")
    b.emit(f"    {name} = F.tanh({v.name} * 0.5)")
    b.emit("else:")
    b.emit(f"    {name} = F.tanh({v.name} * 0.5 + {term})")
    b.emit(f"{inner} = {name}")
    if b.draw(st.integers(0, 3)) == 0:
        # The window form: the carried state's graph cut inside the step.
        b.emit(f"{inner}.unchain_backward()")
        b.features.add("rebound_state_unchained")
    b.states.append((holder, ref, k))
    b.features.add(f"rebound_state_{holder}")
    b.add(name, v.shape, _dt(v), 1.0)
    return v, prev, term


def _state_module_lines(b):
    states = getattr(b, "states", ())
    if not states:
        return []
    out = ["# state f rebinds (an RNN's h), None until its first call",
           "class Holder:",
           "    def __repr__(self):     # passed as an argument: compared by repr",
           "        return 'Holder()'   # (its h: by STATE())", ""]
    for holder, ref, k in states:
        if holder in ("object", "arg"):
            out += [f"STATE{k} = Holder()", f"STATE{k}.h = None"]
        elif holder == "layer":
            out += [f"LAYER{k} = tj.layers.Layer()", f"LAYER{k}.h = None"]
        elif holder == "dict":
            out.append(f"STATED{k} = {{'h': None}}")
        else:
            out.append(f"H{k} = None")
    out += ["", "", "def STATE():",
            "    \"\"\"The state after a call (the harness compares it).\"\"\"",
            "    return {" + ", ".join(f"{ref!r}: {ref}" for _, ref, _ in states) + "}",
            "", ""]
    return out


def _state_globals(b):
    return [ref for holder, ref, _ in getattr(b, "states", ()) if holder == "global"]


def _state_reset_lines(b):
    states = getattr(b, "states", ())
    if not states:
        return []
    out = [f"    if call in {b.state_resets!r}:    # reset_state()"]
    out += [f"        global {g}" for g in _state_globals(b)]
    out += [f"        {ref} = None" for _, ref, _ in states]
    return out


# ------------------------------------------------------- deep captures, rebound between calls
#
# A value the function reads through a path of attributes, dict items and list items
# (one to nine levels below a module global, a closure cell or an argument object), which
# the caller changes between calls (harness: `BETWEEN(call, args)`, here acting on the
# program's own globals): the leaf (a Variable, a Parameter, an ndarray or a float)
# rebound, or changed in place, or a level in between rebound (`ROOT.a = <a new
# subtree>`), or the leaf replaced by a new Variable before every call. A level is read
# as an attribute, a @property, a __getattr__ that raises KeyError for unknown names, a
# __slots__ attribute, a slots dataclass field, a dict item (a string or a tuple key), a
# list item (the first, or one past a long list's first 64), a deque's last item, a
# ContextVar's value (`.get()`), a memoized zero-argument function's result (`()`, an
# lru_cache the caller clears when it rebinds what it returns). The
# argument object may compare by value (its class's __eq__ / __hash__, or a mutable
# dataclass's). The function may cut its argument's creator (`x.creator = None`,
# `x.unchain()`), whose graph the caller built from a captured Variable U. Eager reads the path anew on each call; a compiled call must
# too, select another variant, or run eagerly with a warning.

_DEEP_LEAVES = ("variable", "parameter", "array", "float")
# a attribute, p property, g __getattr__ (KeyError), s __slots__, c slots dataclass,
# d dict item, t tuple-keyed dict item, l list item, L item 70 of a 100-item list,
# q the last item of a deque, v a ContextVar's value, m an lru_cache'd function's result,
# S a set member's attribute, K a class attribute, y a ctypes.py_object's value, M a
# module's attribute, X item 70 of a 100-item list read at a computed index.
_DEEP_STEPS = "apgscdtlLqwrovmSKyMX"
# Levels kept in C (trace.opaque): focus="c_state" puts one in every path.
_DEEP_C_STEPS = "vm"
# Levels pystate guards beyond an object's __dict__ and a container's first items (sets,
# classes, C fields, modules, a long list's contents): focus="hidden_state".
_DEEP_HIDDEN_STEPS = "SKyMX"
_DEEP_OBJECT_STEPS = "apgsc"


def _deep_leaf_src(kind, k):
    v = f"np.full(SHAPE, {0.5 + 0.25 * k!r})"
    return {"variable": f"tj.Variable({v})", "parameter": f"tj.Parameter({v})",
            "array": v, "float": f"{0.5 + 0.25 * k!r}"}[kind]


def _deep_tree_src(steps, leaf, root_class="_deep_obj"):
    """Source of the object at a path's start, holding leaf at the path's end."""
    if not steps:
        return leaf
    inner = _deep_tree_src(steps[1:], leaf)
    s = steps[0]
    return {"a": f"{root_class}(n={inner})", "p": f"_deep_prop({inner})",
            "g": f"_deep_get({inner})", "s": f"_deep_slots({inner})",
            "c": f"_deep_dc({inner})", "d": f"{{'n': {inner}}}",
            "t": f"{{(1, 'n'): {inner}}}", "l": f"[{inner}]",
            "L": f"_deep_long({inner})",
            "q": f"collections.deque([0.0, {inner}], maxlen=4)",
            "w": f"_deep_weak_table({inner})", "r": f"_deep_weak_ref({inner})",
            "o": f"collections.OrderedDict(n={inner})",
            "v": f"_deep_ctx({inner})", "m": f"_deep_memo({inner})",
            "S": f"{{_deep_obj(n={inner})}}", "K": f"_deep_class({inner})",
            "y": f"ctypes.py_object({inner})", "M": f"_deep_module({inner})",
            "X": f"_deep_long({inner})"}[s]


_DEEP_READ = {"a": ".n", "p": ".n", "g": ".n", "s": ".n", "c": ".n", "d": "['n']",
              "t": "[(1, 'n')]", "l": "[0]", "L": "[70]", "q": "[-1]",
              "w": "['n'].n", "r": "().n", "o": "['n']", "v": ".get()", "m": "()",
              "S": "", "K": ".n", "y": ".value", "M": ".n", "X": ""}
# Reads that wrap the path so far (a set's member: `next(iter(<path>)).n`; a computed
# index, which names no constant the walk could follow: `<path>[len(<path>) - 30]`).
_DEEP_WRAP = {"S": "next(iter({})).n", "X": "{0}[len({0}) - 30]"}


def _deep_ref(steps, root="ROOT"):
    ref = root
    for s in steps:
        ref = _DEEP_WRAP[s].format(ref) if s in _DEEP_WRAP else ref + _DEEP_READ[s]
    return ref


_DEEP_CLASSES = [
    "class _deep_obj:", "    def __init__(self, **kw):", "        self.__dict__.update(kw)",
    "",
    "    def __repr__(self):   # the harness compares an argument's state by repr",
    "        return '_deep_obj'", "", "",
    "class _deep_vobj(_deep_obj):",
    "    \"\"\"Compares by value: every one equal to every other (the signature must not",
    "    take one for another: they hold other state).\"\"\"", "",
    "    def __eq__(self, other):", "        return isinstance(other, _deep_vobj)", "",
    "    def __hash__(self):", "        return 7", "", "",
    "class _deep_prop:", "    def __init__(self, n):", "        self._n = n", "",
    "    @property", "    def n(self):", "        return self._n", "", "",
    "class _deep_get:", "    def __init__(self, n):", "        self.d = {'n': n}", "",
    "    def __getattr__(self, k):", "        return self.d[k]      # KeyError, not AttributeError",
    "", "",
    "class _deep_slots:", "    __slots__ = ('n', 'other')", "",
    "    def __init__(self, n):", "        self.n = n", "", "",
    "@dataclasses.dataclass(slots=True)", "class _deep_dc:", "    n: object", "", "",
    "@dataclasses.dataclass(repr=False)",
    "class _deep_mdc:", "    \"\"\"A mutable dataclass: compares by value, unhashable.\"\"\"",
    "    n: object", "",
    "    def __repr__(self):", "        return '_deep_mdc'", "", "",
    "def _deep_long(n):", "    out = [0.0] * 100", "    out[70] = n", "    return out", "", "",
    "_DEEP_KEEP = []   # what the weak holders below refer to, kept alive", "", "",
    "def _deep_weak_table(n):",
    "    o = _deep_obj(n=n)", "    _DEEP_KEEP.append(o)",
    "    return weakref.WeakValueDictionary({'n': o})", "", "",
    "def _deep_weak_ref(n):",
    "    o = _deep_obj(n=n)", "    _DEEP_KEEP.append(o)", "    return weakref.ref(o)", "", "",
    "def _deep_ctx(n):",
    "    cv = contextvars.ContextVar('n')", "    cv.set(n)", "    return cv", "", "",
    "def _deep_class(n):",
    "    return type('_deep_cls', (), {'n': n})   # a new class: n a class attribute", "", "",
    "def _deep_module(n):",
    "    m = types.ModuleType('_deep_mod')", "    m.n = n", "    return m", "", "",
    "def _deep_memo(n):",
    "    box = [n]", "",
    "    @functools.lru_cache(maxsize=None)", "    def get():", "        return box[0]", "",
    "    get.box = box", "    return get", "", "",
]


@st.composite
def deep_capture_programs(draw, avoid=(), focus=None):
    """One value read through a deep path, changed (leaf or a level between) between
    calls; the function combines it with its argument (and its gradient is compared)."""
    depth = draw(st.integers(1, 9))
    steps = "".join(draw(st.lists(st.sampled_from(_DEEP_STEPS), min_size=depth,
                                  max_size=depth)))
    if steps[0] not in _DEEP_OBJECT_STEPS and draw(st.booleans()):
        steps = "a" + steps[1:]
    for name, kinds in (("c_state", _DEEP_C_STEPS), ("hidden_state", _DEEP_HIDDEN_STEPS)):
        if focus == name and not set(steps) & set(kinds):
            at = draw(st.integers(1 if depth > 1 else 0, depth - 1))
            steps = steps[:at] + draw(st.sampled_from(kinds)) + steps[at + 1:]
    kinds = draw(st.lists(st.sampled_from(_DEEP_LEAVES), min_size=1, max_size=2,
                          unique=True))
    root = draw(st.sampled_from(["global", "closure", "argument", "vargument",
                                 "dargument"]))
    if root.endswith("argument") and steps[0] != "a":
        steps = "a" + steps[1:]      # an argument object: a dict or list would be a pytree
    op = draw(st.sampled_from(["mul", "tanh", "both"]))
    n_calls = draw(st.integers(6, 9))
    cut = draw(st.sampled_from([None, None, "assign", "unchain"]))
    # Per call after the first: None (no change), ("r", level, leaf kind) to rebind,
    # ("i", k) to change the leaf in place; mostly None, so compiled calls run between
    # the changes (each rebinding retraces). fresh: the leaf is a new Variable before
    # every call (read as an argument once seen replaced: compiled all the same).
    fresh = "variable" in kinds and draw(st.integers(0, 3)) == 0
    rebind = st.tuples(st.just("r"), st.integers(0, depth - 1), st.sampled_from(kinds))
    inplace = st.tuples(st.just("i"), st.integers(1, 9))
    if fresh:
        table = [None] + [("r", depth - 1, "variable")] * (n_calls - 1)
    else:
        table = [None] + [draw(st.sampled_from([None, None, "r", "i"]))
                          for _ in range(n_calls - 1)]
        table = [t and draw(rebind if t == "r" else inplace) for t in table]
        assume(any(t is not None for t in table[1:]))
    backward = draw(st.sampled_from([None, "plain"]))
    if cut is not None:
        backward = "plain"           # the cut shows in U's gradient
    ref = _deep_ref(steps, "c" if root.endswith("argument") else "ROOT")
    body = {"mul": f"F.sum(x * {ref})", "tanh": f"F.sum(F.tanh(x + {ref}))",
            "both": f"F.sum(F.tanh(x * {ref}) * {ref})"}[op]
    root_class = {"vargument": "_deep_vobj", "dargument": "_deep_mdc"}.get(root, "_deep_obj")
    cut_line = {None: [], "assign": ["x.creator = None"], "unchain": ["x.unchain()"]}[cut]
    out = ["import collections", "import contextvars", "import ctypes", "import dataclasses",
           "import functools", "import types", "import weakref", "",
           "import numpy as np", "import tracejit as tj",
           "import tracejit.functions as F", "", "", "SHAPE = (3,)", "", ""]
    out += _DEEP_CLASSES
    out += [f"STEPS = {steps!r}   # {_DEEP_LEGEND}",
            f"ROOT = {_deep_root_src(steps, _deep_leaf_src(kinds[0], 0), root_class)}",
            "U = tj.Variable(np.full(SHAPE, 0.5))   # the caller's graph of x comes from U",
            "CAPTURES = {'U': U}" if cut else "CAPTURES = {}",
            f"PLAN = [None] * {n_calls}",
            f"BACKWARD = {backward!r}   # the harness's backward after each call",
            f"CHANGE = {table!r}   # per call: ('r', level, leaf kind), ('i', k) or None",
            "", ""]
    if root == "closure":
        # The closure holds ROOT's object; every rebinding is at a level below it.
        out += ["def _make():", "    root = ROOT", "", "    def f(x):"]
        out += [f"        {line}" for line in cut_line]
        out += [f"        return {body.replace('ROOT', 'root')}", "",
                "    return f", "", "", "f = _make()"]
    elif root.endswith("argument"):
        out += ["def f(c, x):"] + [f"    {line}" for line in cut_line] + \
            [f"    return {body}"]
    else:
        out += ["def f(x):"] + [f"    {line}" for line in cut_line] + [f"    return {body}"]
    x_src = "U * 1.0 + tj.Variable(rng.uniform(-1.0, 1.0, SHAPE))" if cut else \
        "tj.Variable(rng.uniform(-1.0, 1.0, SHAPE))"
    out += ["", "", "def args(call):",
            "    rng = np.random.default_rng(100 + call)",
            f"    x = {x_src}",
            "    return (ROOT, x)" if root.endswith("argument") else "    return (x,)", "", "",
            "def _node(level):",
            "    v = ROOT",
            "    for s in STEPS[:level]:",
            "        v = _read(v, s)",
            "    return v", "", "",
            "def _read(v, s):",
            "    if s in 'apgscKM':",
            "        return v.n",
            "    if s == 'S':",
            "        return next(iter(v)).n",
            "    if s == 'y':",
            "        return v.value",
            "    if s == 'X':",
            "        return v[len(v) - 30]",
            "    if s == 'w':",
            "        return v['n'].n",
            "    if s == 'r':",
            "        return v().n",
            "    if s == 'v':",
            "        return v.get()",
            "    if s == 'm':",
            "        return v()",
            "    return v['n'] if s in 'do' else v[(1, 'n')] if s == 't' else "
            "v[0] if s == 'l' else v[-1] if s == 'q' else v[70]", "", "",
            "def _put(h, s, v):",
            "    if s == 'p':",
            "        h._n = v",
            "    elif s == 'g':",
            "        h.d['n'] = v",
            "    elif s in 'ascKM':",
            "        h.n = v",
            "    elif s == 'S':",
            "        next(iter(h)).n = v",
            "    elif s == 'y':",
            "        h.value = v",
            "    elif s == 'X':",
            "        h[70] = v",
            "    elif s in 'do':",
            "        h['n'] = v",
            "    elif s == 'w':",
            "        h['n'].n = v",
            "    elif s == 'r':",
            "        h().n = v",
            "    elif s == 'v':",
            "        h.set(v)",
            "    elif s == 'm':",
            "        h.box[0] = v",
            "        h.cache_clear()",
            "    elif s == 't':",
            "        h[(1, 'n')] = v",
            "    else:",
            "        h[0 if s == 'l' else -1 if s == 'q' else 70] = v", "", "",
            "_SUBTREES = {"]
    for k, t in enumerate(table):
        if t is not None and t[0] == "r":
            _, level, kind = t
            tree = _deep_tree_src(steps[level + 1:], _deep_leaf_src(kind, k))
            out.append(f"    {k}: lambda: {tree},")
    out += ["}", "", "",
            "def BETWEEN(call, args):",
            "    \"\"\"The caller changes the path's leaf or a level of it for the next "
            "call.\"\"\"",
            "    nxt = call + 1",
            "    if nxt >= len(CHANGE) or CHANGE[nxt] is None:",
            "        return",
            "    if CHANGE[nxt][0] == 'i':",
            "        leaf = _node(len(STEPS))",
            "        value = 0.25 * CHANGE[nxt][1]",
            "        if isinstance(leaf, tj.Variable):",
            "            leaf.data[...] = value",
            "        elif isinstance(leaf, np.ndarray):",
            "            leaf[...] = value",
            "        return",
            "    level = CHANGE[nxt][1]",
            "    _put(_node(level), STEPS[level], _SUBTREES[nxt]())"]
    features = sorted({"deep_capture", f"deep_capture_{root}", f"depth_{depth}"}
                      | {f"deep_leaf_{k}" for k in kinds}
                      | {f"deep_step_{c}" for c in set(steps)}
                      | ({f"deep_cut_{cut}"} if cut else set())
                      | ({"deep_fresh_variable"} if fresh else set())
                      | ({"deep_inplace"} if any(t and t[0] == "i" for t in table)
                         else set()))
    return SourceProgram("\n".join(out) + "\n", n_calls, False, features)


_DEEP_LEGEND = ("a attribute, p property, g __getattr__, s slots, c slots dataclass, "
                "d dict item, t tuple key, l list item, L item 70, q deque's last, "
                "w WeakValueDictionary item's attribute, r weakref.ref's referent's "
                "attribute, o OrderedDict item, v ContextVar's value, m lru_cache'd "
                "function's result, S a set member's attribute, K class attribute, "
                "y ctypes.py_object's value, M module attribute, X item 70 at a "
                "computed index")


def _deep_root_src(steps, leaf, root_class):
    """ROOT's source: the first level of an argument object may compare by value."""
    if steps[0] == "a":
        return f"{root_class}(n={_deep_tree_src(steps[1:], leaf)})"
    return _deep_tree_src(steps, leaf)


GENERATORS["deep_captures"] = deep_capture_programs
