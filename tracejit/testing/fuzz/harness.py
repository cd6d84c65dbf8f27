"""Run one generated program eagerly and through `tj.jit`, and compare call by call.

The program is a module (see tracejit/fuzz_gen.py) defining `f`, `CAPTURES` (the
Parameters and arrays f reads), `args(call)`, `PLAN` and `BACKWARD` (and optionally `RETAIN`:
the backward with retain_grad=True; `PRESET`: every result Variable but the first gets
the .grad 0.25 first, and the backward starts from the first alone; `SQUARE`: the loss
is `sum_k sum(leaf_k * leaf_k * c_k)`), and optionally
`BETWEEN(call, args)`, which the caller runs after each call and before its backward
(updating the arguments there). The module runs
twice from scratch, so eager and jit start from identical state (their own captured
Parameters and arrays, equal values). Before call k both sides seed NumPy's global
stream with the same seed. What is compared after every call, in this order:

- exceptions (type; an exception in eager makes the program invalid, not a jit bug,
  unless jit behaves differently),
- the result: tuple structure, each leaf's kind (Variable, Parameter, ndarray, the
  NumPy scalar type, Python float/int/bool), dtype, shape, value, and identity (the
  leaf is argument i, capture W, the `.data` of one of those, or the same object as an
  earlier leaf),
- gradients of `sum_k sum(leaf_k * c_k)` (seeded cotangents c_k) over the Variable
  leaves, for every Variable argument, captured Variable and result Variable (None vs
  not None: a leaf the function made and returns has one), and with create_graph, the
  second-order gradients of `sum(g * g)` over those gradients,
- the state after the call: arguments (an in-place `a += 1`) and captures (data, grad).

Values compare with a tolerance scaled to the array's magnitude: `rtol_for(program)`
(1e-3 when any float32 is involved, else 1e-7, plus 8 ulps absolute); NaN must match NaN,
inf must match inf. Float values beyond it, and nothing else, are judged by the
computation's condition, measured (`rounding_only`: runs under one rounding of noise
per operation), float32 and float64 alike: a program within it is "rounding".
`check_file(path)` is what a written reproducer calls.
"""
import dataclasses
import linecache
import os
import random
import re
import sys
import time
import traceback
import warnings

import numpy as np

import tracejit as tj
from tracejit import functions as F
from tracejit.core import Constant, Parameter, Variable
# One rounding probe for the runtime's checks and the fuzzer: the twin under
# float32-sized noise, thread-local (tracejit.core's round_hook).
# NOISE_FACTOR: how many times the noisy twins' largest move a float32 result may be off
# the twin (one run is one sample of float32's rounding, which a float32 run can exceed
# by a small factor): the runtime's rule.
from tracejit.runtime.checking import NOISE_FACTOR, float32_noise, rounding_noise  # noqa: F401

__all__ = ["load", "run_side", "compare_sides", "run_program", "check_file", "PLANTS"]

# Deliberate faults the fuzzer's own tests plant in the jit side's results, to check that
# each comparison can fail (harness option plant=...). Each acts from call 3 on.
PLANTS = ("value", "grad", "identity", "dtype", "raise", "state")


def load(source, path):
    """Run the program's module text as file `path` (warnings and tracebacks show lines)."""
    with open(path, "w") as fh:
        fh.write(source)
    linecache.checkcache(path)
    ns = {"__name__": "fuzz_program", "__file__": path}
    exec(compile(source, path, "exec"), ns)     # noqa: S102 - our own generated program
    return ns


# ---------------------------------------------------------------- observing a call

def _kind(x):
    if isinstance(x, Parameter):
        return "Parameter"
    if isinstance(x, Constant):
        return "Constant"      # (a create_graph seed returned: eager's class)
    if isinstance(x, Variable):
        return "Variable"
    if isinstance(x, np.ndarray):
        return "ndarray"
    return type(x).__name__        # float64, float32, float, int, bool, NoneType, ...


def _identity(x, args, captures, earlier):
    """What object a result leaf is, in terms both sides share."""
    for j, e in enumerate(earlier):
        if x is e:
            return f"the same object as result leaf {j}"
        if isinstance(e, Variable) and e.grad is not None and x is e.grad:
            return f"result leaf {j}'s .grad"
        if isinstance(x, Variable) and x.grad is not None and x.grad is e:
            # (`return y.grad, y`: y's .grad is the object returned before it)
            return f"a Variable whose .grad is result leaf {j}"
    for i, a in enumerate(args):
        if x is a:
            return f"argument {i}"
        if isinstance(a, Variable) and x is a.data:
            return f"argument {i}'s .data"
        if isinstance(a, Variable) and a.grad is not None and x is a.grad:
            return f"argument {i}'s .grad"
    for name, c in captures.items():
        if x is c:
            return f"capture {name}"
        if isinstance(c, Variable) and x is c.data:
            return f"capture {name}'s .data"
        if isinstance(c, Variable) and c.grad is not None and x is c.grad:
            return f"capture {name}'s .grad"
    return "new"


def _buffer(x):
    d = x.data if isinstance(x, Variable) else x
    return d if isinstance(d, np.ndarray) and d.size else None


def _aliases(x, args, captures, earlier):
    """The buffers (arguments', captures', their .grads', earlier results') a result
    leaf shares memory with: eager returns views (`x.data[0:2]`, F.reshape(x),
    F.transpose(x.grad) of a seed passed through), a copy would not alias; and, for each
    buffer it shares, which of that buffer's elements each of its elements is (_probe):
    the view as an index map, which a wrong view (another slice, a transpose too many)
    changes and the memory layout of a computed result (C or Fortran order, NumPy's K
    rule, not part of the contract) does not."""
    d = _buffer(x)
    if d is None:
        return ()
    named = [(f"argument {i}", a) for i, a in enumerate(args)]
    named += [(f"capture {n}", c) for n, c in captures.items()]
    named += [(f"argument {i}'s .grad", a.grad) for i, a in enumerate(args)
              if isinstance(a, Variable)]
    named += [(f"capture {n}'s .grad", c.grad) for n, c in captures.items()
              if isinstance(c, Variable)]
    named += [(f"result leaf {j}", e) for j, e in enumerate(earlier)]
    shared = [(label, _buffer(o)) for label, o in named
              if _buffer(o) is not None and np.shares_memory(d, _buffer(o))]
    return tuple(label for label, _ in shared) + tuple(
        f"as {label}: {_probe(d, b)}" for label, b in shared)


def _probe(d, base):
    """Which element of `base` each element of `d` (a view sharing its memory) is:
    base filled with 0, 1, 2, ... in its logical (C index) order, d read back, both
    put back exactly as they were. -1 marks an element of d outside base. Arrays that
    cannot be written (a broadcast view) or hold no numbers give their strides."""
    if not (d.flags.writeable and base.flags.writeable) or d.dtype.kind not in "iuf" \
            or base.dtype.kind not in "iuf" or base.size >= 2 ** 24:
        return f"strides {d.strides}"
    keep_d, keep_b = d.copy(), base.copy()
    try:
        d[...] = -1
        base[...] = np.arange(base.size).reshape(base.shape)
        image = d.astype(np.int64)
    finally:
        base[...] = keep_b
        d[...] = keep_d
    return f"{d.shape} {image.ravel().tolist()}"


def _leaf(x, ident=None):
    """A snapshot of one value: kind, dtype, shape, a copy of the value, identity."""
    kind = _kind(x)
    if isinstance(x, Variable):
        arr = None if x.data is None else np.array(x.data, copy=True)
    elif isinstance(x, (np.ndarray, np.generic, float, int, bool)):
        arr = np.array(x, copy=True)
    else:
        arr = None
    return dict(kind=kind, dtype=None if arr is None else str(arr.dtype),
                shape=None if arr is None else arr.shape, value=arr, ident=ident,
                repr=None if arr is not None else repr(x)[:80])


def _flatten(result, args, captures):
    """(structure, leaves): tuples/lists kept as structure, everything else a leaf."""
    leaves, objs = [], []

    def walk(x):
        if isinstance(x, (tuple, list)):
            return (type(x).__name__, [walk(y) for y in x])
        if dataclasses.is_dataclass(x) and not isinstance(x, type):
            return (type(x).__name__, {k: walk(v) for k, v in vars(x).items()})
        leaves.append(_leaf(x, _identity(x, args, captures, objs)))
        leaves[-1]["alias"] = _aliases(x, args, captures, objs)
        objs.append(x)
        return "leaf"

    return walk(result), leaves, objs


def _grads(targets):
    return {label: (None if v.grad is None else _leaf(v.grad)) for label, v in targets}


def _grad_grads(targets, when):
    """x.grad.grad of each argument and capture (a backward in the call gave x.grad, a
    leaf of a later one, a .grad of its own): right after the call, before the caller's
    backward replaces x.grad, and at the end (that backward through x.grad adds to it)."""
    return {f"{label}.grad.grad {when}": None if v.grad is None or v.grad.grad is None
            else _leaf(v.grad.grad) for label, v in targets}


def observe(f, args, captures, backward, call, plant=None, between=None, state=None,
            retain=False, preset=False, square=False):
    """Call f once as a user would, then differentiate; a dict of snapshots.
    `between(call, args)`, if given, runs after the call and before the backward (the
    caller changing its arguments there). `state`: the program's STATE (the state f
    rebinds, read after the call), if it has one."""
    rec = dict(raised=None, stage=None)
    targets = [(f"argument {i}", a) for i, a in enumerate(args) if isinstance(a, Variable)]
    targets += [(f"capture {n}", c) for n, c in captures.items() if isinstance(c, Variable)]
    try:
        rec["stage"] = "call"
        out = f(*args)
        rec["grad_grads"] = _grad_grads(targets, "after the call")
        owners = list(targets)       # (targets grows by the result Variables below)
        if plant == "raise" and call >= 3:
            raise RuntimeError("planted fault")
        if plant == "identity" and call >= 3:     # argument 0 itself, not a new Variable
            out = _replace_first_leaf(out, lambda x: args[0])
        if plant == "dtype" and call >= 3:
            out = _replace_first_leaf(out, lambda x: Variable(x.data.astype(np.float16))
                                      if isinstance(x, Variable) else x)
        if plant == "value" and call >= 3:
            out = _replace_first_leaf(out, lambda x: Variable(x.data * 1.01)
                                      if isinstance(x, Variable) else x)
        structure, leaves, objs = _flatten(out, args, captures)
        rec["structure"], rec["result"] = structure, leaves
        rec["objs"] = objs
        # The result Variables' gradients too: a leaf the function made and returns
        # (`c = Variable(np.ones(3)); return x * c, c`) gets one from eager's backward,
        # which a comparison over the arguments and captures alone never looks at.
        # Each result Variable by its position (an argument returned too: the two
        # sides then have the same labels when their identities differ); the second
        # order differentiates each Variable's gradient once.
        results = [(f"result leaf {k}", y) for k, y in enumerate(objs)
                   if isinstance(y, Variable)]
        labelled = targets + results          # the gradients compared
        known = {id(v) for _, v in targets}
        for label, y in results:              # the Variables differentiated again
            if id(y) not in known:
                known.add(id(y))
                targets.append((label, y))
        if between is not None:
            rec["stage"] = "update between the call and the backward"
            between(call, args)
        if backward:
            rec["stage"] = "backward"
            rng = np.random.default_rng(1000 + call)
            loss = None
            for k, y in enumerate(objs):
                if isinstance(y, Variable) and y.data is not None and y.dtype.kind == "f":
                    if preset and loss is not None:
                        if y.grad is None:     # (not one the call left: its own)
                            y.grad = Variable(np.full(y.shape, 0.25, y.dtype))
                        continue
                    c = rng.uniform(-1.0, 1.0, y.shape).astype(y.dtype)
                    term = F.sum((y * y if square else y) * c)
                    loss = term if loss is None else loss + term
            if loss is not None:
                loss.backward(retain_grad=retain,
                              create_graph=(backward == "create_graph"))
            if plant == "grad" and call >= 3:
                for _, v in targets:
                    if v.grad is not None:
                        v.grad = Variable(v.grad.data * 1.01)
                        break
            rec["grads"] = _grads(labelled)
            if backward == "create_graph" and loss is not None:
                rec["stage"] = "second-order backward"
                gs = [v.grad for _, v in targets if v.grad is not None]
                for _, v in targets:
                    v.cleargrad()
                loss2 = None
                for g in gs:
                    term = F.sum(g * g)
                    loss2 = term if loss2 is None else loss2 + term
                if loss2 is not None:
                    loss2.backward()
                rec["grads2"] = _grads(labelled)
        rec["stage"] = None
    except Exception as e:  # noqa: BLE001 - compared between the sides
        rec["raised"] = (type(e).__name__, str(e)[:300],
                         "".join(traceback.format_exception(e)[-6:]))
    if plant == "state" and call >= 3:
        for c in captures.values():
            if isinstance(c, Variable):
                c.data = c.data + 0.01
                break
    rec["state"] = rec.pop("grad_grads", {})
    if rec["state"]:
        rec["state"].update(_grad_grads(owners, "at the end"))
    results = rec.pop("objs", [])

    def data_leaf(d, owner):
        # A Variable's .data the call may have rebound (`W.data = x.data[:, ::-1]`,
        # `x.data = W.data`): which object it is and what it shares memory with, in
        # terms of the others (its own Variable left out: the same on both sides).
        others = [a for a in args if a is not owner]
        caps = {n: c for n, c in captures.items() if c is not owner}
        leaf = _leaf(d, None if d is None else _identity(d, others, caps, results))
        leaf["alias"] = _aliases(d, others, caps, results)
        return leaf
    for i, a in enumerate(args):
        rec["state"][f"argument {i}"] = data_leaf(a.data, a) if isinstance(a, Variable) \
            else _leaf(a)
        if isinstance(a, Variable):
            # What a backward inside f left (also without the harness's backward): one
            # going on into the caller's graph gives the caller's leaves gradients.
            rec["state"][f"argument {i}.grad"] = None if a.grad is None else _leaf(a.grad)
    for n, c in captures.items():
        if isinstance(c, Variable):
            rec["state"][f"capture {n}.data"] = data_leaf(c.data, c)
            rec["state"][f"capture {n}.grad"] = None if c.grad is None else _leaf(c.grad)
        else:
            rec["state"][f"capture {n}"] = _leaf(c)
    for n, v in (state() if state is not None else {}).items():
        # (Which object: an argument, a capture's .data or .grad, a result.)
        rec["state"][f"state {n}"] = None if v is None else \
            _leaf(v, _identity(v, args, captures, results))
        if v is not None:
            # The buffers the stored state shares memory with: the call's results,
            # arguments, captures (a result the passes merged with it must not).
            rec["state"][f"state {n}"]["alias"] = _aliases(v, args, captures, results)
        if isinstance(v, Variable):
            # (A leaf made in the call and stored as state gets eager's gradient.)
            rec["state"][f"state {n}.grad"] = None if v.grad is None else _leaf(v.grad)
            # Compared exactly (repr), not as a number a float32 tolerance could excuse.
            rec["state"][f"state {n} has a creator"] = dict(
                kind="bool", dtype=None, shape=None, value=None, ident=None,
                repr=repr(v.creator is not None))
    for c in captures.values():      # each call starts with clean gradients
        if isinstance(c, Variable):
            c.cleargrad()
    return rec


def _replace_first_leaf(out, fn):
    if isinstance(out, tuple):
        return (fn(out[0]),) + out[1:]
    return fn(out)


def run_side(source, path, jit, progress=None, plant=None):
    """All calls of one side: (records, JitWarning messages, cache_info or None)."""
    ns = load(source, path)
    f, captures = ns["f"], ns["CAPTURES"]
    jf = tj.jit(f) if jit else f
    records, jit_warnings = [], []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for call in range(len(ns["PLAN"])):
            if progress:
                progress(f"{'jit' if jit else 'eager'} call {call}")
            np.random.seed(call)
            random.seed(call)
            args = ns["args"](call)
            with np.errstate(all="ignore"):
                rec = observe(jf, args, captures, ns["BACKWARD"], call,
                              plant if jit else None, ns.get("BETWEEN"),
                              ns.get("STATE"), retain=ns.get("RETAIN", False),
                              preset=ns.get("PRESET", False),
                              square=ns.get("SQUARE", False))
            records.append(rec)
            if rec["raised"]:
                break
        for w in caught:
            if issubclass(w.category, tj.JitWarning):
                jit_warnings.append(str(w.message))
    info = jf.cache_info() if jit else None
    return records, jit_warnings, info


# ---------------------------------------------------------------- comparing

def rtol_for(has_float32):
    """(rtol, atol) of a program: float32 anywhere in it makes every value float32-exact
    at best. atol covers one rounding of a cancellation: tanh(z) saturating to 1.0 in
    one side's float32 and 0.99999976 in the other's makes 1 - y * y 0 against 4.8e-7."""
    if has_float32:
        return 1e-3, 8 * float(np.finfo(np.float32).eps)
    return 1e-7, 8 * float(np.finfo(np.float64).eps)


def _close(got, want, rtol, atol):
    """None if the arrays agree within rtol of the array's magnitude, else a message."""
    g = np.asarray(got, dtype=np.float64) if got.dtype.kind in "fiub" else got
    w = np.asarray(want, dtype=np.float64) if want.dtype.kind in "fiub" else want
    if g.dtype.kind != "f":
        return None if np.array_equal(g, w) else f"jit {g!r}, eager {w!r}"
    gn, wn = np.isnan(g), np.isnan(w)
    if not np.array_equal(gn, wn):
        return f"NaN in one only: jit {_short(g)}, eager {_short(w)}"
    gi, wi = np.isinf(g), np.isinf(w)
    if not np.array_equal(gi, wi) or not np.array_equal(g[gi], w[wi]):
        return f"inf in one only: jit {_short(g)}, eager {_short(w)}"
    fin = ~(wn | wi)
    if not fin.any():
        return None
    scale = float(np.max(np.abs(w[fin])))
    err = np.abs(g[fin] - w[fin])
    tol = rtol * (np.abs(w[fin]) + scale) + atol
    if np.all(err <= tol):
        return None
    k = int(np.argmax(err - tol))
    return (f"differs by {float(err[k]):.3g} (jit {float(g[fin][k])!r}, eager "
            f"{float(w[fin][k])!r}; rtol {rtol} of the magnitude {scale:.3g}, atol "
            f"{atol:.2g}); "
            f"jit {_short(g)}, eager {_short(w)}")


def _short(a):
    return np.array2string(np.asarray(a), precision=5, threshold=6, edgeitems=1,
                           separator=", ").replace("\n", "")


def compare_leaf(got, want, tol, section, what):
    """The difference of two snapshots as (category, message), or None."""
    if got is None or want is None:
        if (got is None) != (want is None):
            return (f"{section}: None vs not None",
                    f"{what}: jit gives {'None' if got is None else got['kind']}, eager "
                    f"{'None' if want is None else want['kind']}")
        return None
    for field in ("kind", "dtype", "shape", "ident", "repr", "alias"):
        if got.get(field) != want.get(field):
            return (f"{section}: {field}",
                    f"{what}: {field} differs: jit {got[field]!r}, eager {want[field]!r}")
    if want["value"] is not None:
        msg = _close(got["value"], want["value"], *tol)
        if msg:
            finite = not msg.startswith(("NaN", "inf"))
            return (f"{section}: value" + ("" if finite else " (non-finite)"),
                    f"{what}: value {msg}")
    return None


def compare_call(got, want, tol):
    """Every difference of one call, [(category, message)]; `got` is jit's record.
    ("raise", None) when exactly one side raised or the exceptions differ."""
    if got["raised"] or want["raised"]:
        if got["raised"] and want["raised"] and got["raised"][0] == want["raised"][0] \
                and got["stage"] == want["stage"]:
            return []
        return [("raise", None)]
    if got["structure"] != want["structure"]:
        return [("result: structure",
                 f"result structure: jit {got['structure']}, eager {want['structure']}")]
    diffs = []
    for k, (g, w) in enumerate(zip(got["result"], want["result"])):
        diffs.append(compare_leaf(g, w, tol, "result", f"result leaf {k}"))
    for key, label in (("grads", "gradient"), ("grads2", "second-order gradient")):
        for name in want.get(key, {}):
            if name not in got.get(key, {}):
                diffs.append((label, f"{label} of {name}: not compared on the jit side"))
                continue
            diffs.append(compare_leaf(got[key][name], want[key][name], tol, label,
                                      f"{label} of {name}"))
    for name in want["state"]:
        diffs.append(compare_leaf(got["state"][name], want["state"][name], tol,
                                  "state after the call", f"state after the call: {name}"))
    return [d for d in diffs if d]


def compare_sides(jit_side, eager_side, tol):
    """(class, detail, {category: first message}) of a program's two sides.

    Every call is compared (one difference does not hide another); the detail is the
    first difference in call order, and the categories (result identity, gradient
    value, ...) say which kinds of difference the program shows."""
    jrecs, warns, info = jit_side
    erecs = eager_side[0]
    diffs = {}
    for call, (g, w) in enumerate(zip(jrecs, erecs)):
        found = compare_call(g, w, tol)
        if found == [("raise", None)]:
            if w["raised"] and not g["raised"]:
                msg = (f"call {call}: eager raised {w['raised'][0]} in the {w['stage']} "
                       f"({w['raised'][1]}), jit did not")
                diffs.setdefault("jit does not raise where eager does", msg)
                return "mismatch", next(iter(diffs.values())), diffs
            if g["raised"] and not w["raised"]:
                msg = (f"call {call}: jit raised {g['raised'][0]} in the {g['stage']}: "
                       f"{g['raised'][1]}\n{g['raised'][2]}")
            else:
                msg = (f"call {call}: jit raised {g['raised'][0]} in the {g['stage']} "
                       f"({g['raised'][1]}), eager {w['raised'][0]} in the {w['stage']} "
                       f"({w['raised'][1]})")
            # Differences before the exception are still reported with it.
            return "crash", msg, dict(diffs, crash=msg)
        for cat, msg in found:
            diffs.setdefault(cat, f"call {call}: {msg}")
        if w["raised"] and not diffs:
            return "invalid", (f"call {call}: eager raises {w['raised'][0]} in the "
                               f"{w['stage']}: {w['raised'][1]}"), {}
    if diffs:
        return "mismatch", next(iter(diffs.values())), diffs
    if len(jrecs) != len(erecs):    # pragma: no cover - a side stops only when it raises
        return "mismatch", f"jit made {len(jrecs)} calls, eager {len(erecs)}", {}
    oob = [w for w in warns if OUT_OF_BOUNDS in w]
    if oob:
        # numba's bounds check (fuzz cli: NUMBA_BOUNDSCHECK=1) caught a kernel reading
        # or writing past an array's end: without the check, memory corruption.
        msg = f"a compiled kernel accessed an array out of bounds: {oob[0]}"
        return "crash", msg, {"crash": msg}
    if warns:
        return "fallback", None, {}
    return "match", None, {}


# numba's IndexError message for an access its bounds check (NUMBA_BOUNDSCHECK) stopped.
OUT_OF_BOUNDS = "IndexError: index is out of bounds"


def float64_twin(source):
    """The program with every float32 made float64: the reference for its rounding.
    Its inputs and captures are the float32 program's, rounded to float32 and then
    widened (`np.asarray(d, dtype=np.float32)` becomes `....astype(np.float64)`): the
    twin computes in float64 from the same numbers, so what separates it from either
    side is their arithmetic's rounding, not the rounding of their inputs."""
    keep = "__FUZZ_F32__"
    src = source.replace("dtype=np.float32)", f"dtype=np.{keep}).astype(np.float64)")
    src = src.replace(".astype(np.float32)", f".astype(np.{keep}).astype(np.float64)")
    return re.sub(r"\bfloat32\b", "float64", src).replace(keep, "float32")


# Runs of the float64 twin with float32-sized noise: how far one float32 rounding per
# operation can move each value of this program (its condition number, measured). One
# more than the runtime's checks make: the fuzzer judges once per suspect program.
NOISE_RUNS = 3


def _float_leaves(rec):
    """{where: float64 array} of one call's finite-checkable float values."""
    out = {}
    for k, leaf in enumerate(rec.get("result") or []):
        out[f"result {k}"] = leaf
    for key in ("grads", "grads2"):
        for name, leaf in (rec.get(key) or {}).items():
            out[f"{key} {name}"] = leaf
    for name, leaf in rec["state"].items():
        out[f"state {name}"] = leaf
    return {w: np.asarray(leaf["value"], np.float64) for w, leaf in out.items()
            if leaf is not None and leaf["value"] is not None
            and np.asarray(leaf["value"]).dtype.kind == "f"}


def rounding_only(jit_recs, eager_recs, ref_recs, noise_recs=(), dtype=np.float32,
                  tol=None):
    """True if jit is, leaf by leaf, no farther from the reference than `dtype`'s
    rounding explains: twice eager's own distance, plus a few ulps of the value's
    magnitude, plus NOISE_FACTOR times the distance `dtype`-sized noise moved the
    reference (`noise_recs`: runs of it under `rounding_noise`). The last term is the
    computation's condition number: 1 - y * y of a saturated tanh turns one ulp of y
    (tracejit's tanh is correctly rounded, NumPy's is not) into hundreds of ulps of the
    gradient, and where eager's rounding happens to land near the reference, twice
    eager's distance alone would call correct rounding a mismatch. A jit bug (a 1e-3
    error of a well-conditioned value) is farther from the reference than rounding
    moves it and stays a mismatch.

    float32: the reference is the float64 twin. float64 has no more precise twin: the
    reference is eager itself (its distance 0), run again under float64-sized noise.
    `tol` (rtol, atol): an element within compare_sides' tolerance of eager is not a
    difference to explain (only the elements compare_sides flagged are judged)."""
    if not (len(jit_recs) == len(eager_recs) == len(ref_recs)):
        return False
    if any(len(n) != len(ref_recs) for n in noise_recs):
        return False
    eps = float(np.finfo(dtype).eps)
    for call, (g, w, r) in enumerate(zip(jit_recs, eager_recs, ref_recs)):
        if g["raised"] or w["raised"] or r["raised"]:
            return False
        gl, wl, rl = _float_leaves(g), _float_leaves(w), _float_leaves(r)
        nls = [_float_leaves(n[call]) for n in noise_recs if not n[call]["raised"]]
        if set(gl) != set(wl) or not set(wl) <= set(rl):
            return False
        for where, ref in rl.items():
            if where not in gl:
                continue
            a, b = gl[where], wl[where]
            if a.shape != ref.shape or b.shape != ref.shape:
                return False
            if not (np.array_equal(np.isfinite(a), np.isfinite(ref))
                    and np.array_equal(np.isfinite(b), np.isfinite(ref))):
                return False
            fin = np.isfinite(ref)
            if not fin.any():
                continue
            noise = np.zeros(int(fin.sum()))
            for nl in nls:
                n = nl.get(where)
                if n is not None and n.shape == ref.shape:
                    with np.errstate(all="ignore"):
                        d = np.abs(n[fin] - ref[fin])
                    noise = np.maximum(noise, np.where(np.isfinite(d), d, 0.0))
            scale = float(np.max(np.abs(ref[fin])))
            err_jit = np.abs(a[fin] - ref[fin])
            err_eager = np.abs(b[fin] - ref[fin])
            allowed = (2 * err_eager + 8 * eps * (scale + np.abs(ref[fin]))
                       + NOISE_FACTOR * noise)
            bad = err_jit > allowed
            if tol is not None:       # within compare_sides' bound of eager (_close's)
                bf = np.abs(b[fin])
                bad &= np.abs(a[fin] - b[fin]) > tol[0] * (bf + np.max(bf)) + tol[1]
            if np.any(bad):
                return False
    return True


ROUNDING_REASON = {
    np.float32: "float32 rounding: jit is as close to the float64 twin as eager",
    np.float64: "float64 rounding: within what one rounding per operation moves eager"}


def run_program(source, path, has_float32, progress=None, plant=None):
    """Both sides of one program; a dict with the class, detail, warnings, cache info."""
    t0 = time.perf_counter()
    eager = run_side(source, path, jit=False, progress=progress)
    jit = run_side(source, path, jit=True, progress=progress, plant=plant)
    tol = rtol_for(has_float32)
    cls, detail, diffs = compare_sides(jit, eager, tol)
    if cls == "mismatch" and diffs and all(cat.endswith(": value") for cat in diffs):
        # Float values differ and nothing else: tell rounding from a wrong answer by the
        # computation's condition, measured (rounding_only). float32: the program's
        # float64 twin is the reference; float64: eager itself.
        dtype = np.float32 if has_float32 else np.float64
        ref_source = float64_twin(source) if has_float32 else source
        ref = run_side(ref_source, path, jit=False, progress=progress) if has_float32 \
            else eager
        noise = []
        for k in range(NOISE_RUNS):
            with rounding_noise(k, dtype):
                noise.append(run_side(ref_source, path, jit=False, progress=progress)[0])
        if rounding_only(jit[0], eager[0], ref[0], noise, dtype, tol):
            cls, detail = "rounding", f"{detail} ({ROUNDING_REASON[dtype]})"
    return dict(cls=cls, detail=detail, diffs=diffs, warnings=sorted(set(jit[1])),
                cache_info=jit[2], seconds=time.perf_counter() - t0)


def check_file(path, plant=None):
    """What a reproducer runs: compare jit with eager, print the verdict, return it."""
    with open(path) as fh:
        source = fh.read()
    has32 = "float32" in source
    scratch = os.path.join(os.path.dirname(os.path.abspath(path)),
                           "_run_" + os.path.basename(path))
    res = run_program(source, scratch, has32, plant=plant)
    print(f"{res['cls']}: {res['detail'] or ''}")
    for cat, msg in list(res["diffs"].items())[1:]:
        print(f"  also ({cat}): {msg}")
    for w in res["warnings"]:
        print(f"  JitWarning: {w}")
    print(f"  cache_info: {res['cache_info']}")
    return res


if __name__ == "__main__":
    sys.exit(0 if check_file(sys.argv[1])["cls"] in ("match", "fallback", "rounding") else 1)
