"""Eager beside compiled: snapshot live state, compare results, restore.

Every variant's first call (check=True: its first three) runs the eager function and
the compiled variant from the same state; a difference demotes the variant to eager.
Results are compared on values (floats within a tolerance, NumPy scalars as arrays),
kinds, dtypes and identity; the trace-time check compares gradients too.

float32 (and float16) values get a second opinion before a difference counts. A
compiled graph may sum in another order than eager's NumPy calls (a conv's per-image
GEMMs, a fused reduction), and where the terms of a sum cancel, two correct float32
results differ by far more than RTOL of the element (a conv's input gradient: 7e-5
of the element, 3 float32 ulps of the array's largest value). The comparison collects
those differences (`soft`), the caller runs the function once more eagerly on float64
copies of the arguments (the float64 twin, as the fuzzer's harness does) and compares
again with it as the reference (`ref`): compiled passes where it is, element by element,
no farther from the twin than twice eager's own rounding error plus TWIN_ULPS ulps of
the value's magnitude plus NOISE_FACTOR times how far the twin moves when run again
under float32-sized noise (float32_noise: the computation's float32 condition,
measured; eager's own error alone is one sample of it, and where eager's roundings
happen to cancel it allows nothing). A wrong compiled value (a frozen constant, a 1%
error) is farther from the twin than rounding moves it and still differs. A call that
reads a float32 array has its float64 values (a float32 input times a np.float64, a
float64 gradient of float32 intermediates) judged the same way (Soft.mixed).
"""
import contextlib
import copy
import dataclasses
import weakref

import numpy as np

from tracejit.core import (Constant, DictGrads, Parameter, RegionFunction, Variable,
                           _state, backprop, graph_reach)
from tracejit.trace.pytree import _is_namedtuple

RTOL, ATOL = 1e-5, 1e-7
# The dtypes whose value differences the float64 twin judges (float64 itself has no
# more precise twin: RTOL/ATOL alone).
LOW_PRECISION = frozenset(np.dtype(d) for d in ("f2", "f4", "c8"))
TWIN_ULPS = 8
NOREF = object()      # no twin run: low-precision differences are collected or count
# The twin's rounding probe: NOISE_RUNS more runs of the twin under float32_noise, and a
# compiled value may be off the twin by NOISE_FACTOR times the farthest they moved
# (module docstring of the fuzzer's harness: one float32 rounding of a saturated tanh
# becomes hundreds of ulps of 1 - y * y, which twice eager's distance cannot allow
# when eager's own roundings happen to cancel).
NOISE_RUNS = 2
NOISE_FACTOR = 4


def float32_noise(seed):
    """In this thread, every float64 result of a Function (forward, and the backward's
    own Functions) multiplied by 1 +- eps32, a random sign per element: the float64
    twin run under it rounds, in effect, where a float32 run rounds and by as much, so
    how far it moves is the computation's float32 condition, measured."""
    return rounding_noise(seed, np.float32)


@contextlib.contextmanager
def rounding_noise(seed, dtype):
    """In this thread, every float64 result of a Function (forward, and the backward's
    own Functions) multiplied by 1 +- eps of `dtype`, a random sign per element: one
    rounding of `dtype` per operation (float64: a move of one or two ulps, which
    multiplying by 1 +- eps64 always makes). Views of an operand (reshape, transpose)
    are left alone: they round nothing, and changing them would change the operand.
    The generator is private: NumPy's global stream (dropout) is untouched."""
    rng = np.random.default_rng(seed)
    eps = float(np.finfo(dtype).eps)

    def hook(xs, outputs):
        for y in outputs:
            d = y._data
            if (isinstance(d, np.ndarray) and d.dtype == np.float64 and d.base is None
                    and d.flags.writeable and d.size
                    and not any(isinstance(x, np.ndarray) and np.may_share_memory(d, x)
                                for x in xs)):
                d *= 1.0 + eps * rng.choice((-1.0, 1.0), d.shape)

    old, _state.round_hook = _state.round_hook, hook
    try:
        yield
    finally:
        _state.round_hook = old


class TwinArray(np.ndarray):
    """A twin's value with `noise`: how far the noisy twins moved it (elementwise).
    Arithmetic on it gives plain arrays (the twin's backward runs on its results): only
    the value itself carries a noise."""
    noise = None

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        plain = tuple(np.asarray(x) if isinstance(x, TwinArray) else x for x in inputs)
        if "out" in kwargs:
            kwargs["out"] = tuple(np.asarray(o) if isinstance(o, TwinArray) else o
                                  for o in kwargs["out"])
        return getattr(ufunc, method)(*plain, **kwargs)


def with_noise(value, noisy):
    """`value` (an array, a twin's) as a TwinArray whose noise is the largest distance
    of the arrays in `noisy` from it (those of another shape ignored)."""
    if not isinstance(value, np.ndarray) or value.dtype.kind not in "fc":
        return value
    noise = np.zeros(value.shape)
    with np.errstate(all="ignore"):
        for n in noisy:
            if isinstance(n, np.ndarray) and n.shape == value.shape:
                d = np.abs(np.asarray(n, np.complex128 if n.dtype.kind == "c"
                                      else np.float64) - value)
                noise = np.maximum(noise, np.where(np.isfinite(d), d, 0.0))
    out = value.view(TwinArray)
    out.noise = noise
    return out


class Soft(list):
    """The low-precision differences a first comparison collects (`soft`), and whether
    the call computes in low precision anywhere (`mixed`: a float32 argument or
    captured array): then a float64 value too (a float32 input times a float64 scalar,
    a float64 gradient of float32 intermediates) carries float32 rounding, and is
    judged by the twin as float32 values are."""

    def __init__(self, mixed=False):
        super().__init__()
        self.mixed = mixed


def low_precision_involved(leaves, state):
    """Does a call on `leaves` (arguments) with captured `state` (a LiveState) read a
    low-precision float array?"""
    arrays = [x._data if isinstance(x, Variable) else x for x in list(leaves) + state.vars]
    arrays += list(state.arrays)
    return any(isinstance(a, np.ndarray) and a.dtype in LOW_PRECISION for a in arrays)


def walks_into_caller(v):
    """Does a backward inside variant v's call go on into the caller's graph?"""
    return any(ev[0] == "backward" for ev in getattr(v, "cuts", ()))


class LiveState:
    """Snapshot and restore of everything a variant reads or writes outside its args."""

    def __init__(self, v, leaves):
        self.vars, self.arrays = [], []
        seen = set()
        objs = [(kind, obj) for kind, obj, _ in v.sources if kind not in ("arg", "arggrad")]

        def resolve(w, t):
            # A target (trace.records.Target): an argument's .grad is this call's.
            if w != "leafgrad":
                return t
            return leaves[t]._grad if t < len(leaves) and isinstance(leaves[t], Variable) \
                else None
        targets = [("var", w, t) for w, t in getattr(v, "grad_none", ())]
        targets += [("var" if kind != "inplace_array" else "array", w, t)
                    for kind, (w, t), _ in v.effects]
        targets += [("var", w, var) for (w, var), _ in v.grad_effects]
        objs += [(kind, resolve(w, t)) for kind, w, t in targets if w != "leaf"]
        objs = [(kind, o) for kind, o in objs if o is not None]
        # A backward inside the call that goes on into the caller's graph changes the
        # .grad of Variables there (and the call's outputs' creators' inputs): the
        # caller's graph from the Variables it goes on from is state too.
        # (With such a backward, also the graph a cut reaches: a backward after a cut
        # goes on through the graph as the cut left it, each run's cut from the same.)
        cuts = getattr(v, "cuts", ())
        walks = walks_into_caller(v)
        roots = [resolve(w, t) if w != "leaf" else
                 (leaves[t] if t < len(leaves) else None)
                 for ev in cuts if walks for w, t in ev[1]]
        roots = [x for x in roots if isinstance(x, Variable)]
        # (And their creators: an unchain_backward after that backward cuts them.)
        self.graph = list(graph_reach(roots).values()) if roots else []
        objs += [("var", x) for x in self.graph]
        objs += [("var", x) for x in leaves if isinstance(x, Variable)]
        objs += [("array", x) for x in leaves if isinstance(x, np.ndarray)]
        for kind, obj in objs:
            if kind == "grad":
                kind = "var"
            if id(obj) in seen:
                continue
            seen.add(id(obj))
            (self.vars if kind == "var" else self.arrays).append(obj)
        self.initial = self.capture()

    def capture(self):
        vs = [(var._data, None if var._data is None else var._data.copy(), var._grad,
               None if var._grad is None else var._grad._data.copy(), _grad_grad(var))
              for var in self.vars]
        arrs = [a.copy() for a in self.arrays]
        if self.graph:
            return vs, arrs, [(x.creator, x.generation) for x in self.graph]
        return vs, arrs

    def restore(self, snap):
        vs, arrs = snap[:2]
        for x, (creator, generation) in zip(self.graph, snap[2] if len(snap) > 2 else ()):
            x.creator, x.generation = creator, generation
        for var, (data, data_copy, grad, grad_copy, gg) in zip(self.vars, vs):
            if data is not None:
                np.copyto(data, data_copy)
            var._data = data
            if grad is not None:
                np.copyto(grad._data, grad_copy)
                grad._grad = None if gg is None else gg[0]
                if gg is not None:
                    np.copyto(gg[0]._data, gg[1])
            var._grad = grad
        for a, c in zip(self.arrays, arrs):
            np.copyto(a, c)

    def restore_initial(self):
        self.restore(self.initial)

    def difference(self, snap, soft=None, ref=NOREF):
        """The first difference of the state now from snapshot `snap` (eager's); soft
        and ref as in array_difference, ref a snapshot of the float64 twin's run."""
        vs, arrs = snap[:2]
        ref_vs, ref_arrs = ref[:2] if ref is not NOREF else (None, None)
        for k, (var, (_, data_copy, _, grad_copy, gg)) in enumerate(zip(self.vars, vs)):
            data_now = var._data
            grad_now = None if var._grad is None else var._grad._data
            r = ref_vs[k] if ref_vs is not None else (None,) * 5
            name = var.name or "a captured Variable"
            d = array_difference(data_copy, data_now, f"{name}.data", soft=soft,
                                 ref=NOREF if ref is NOREF else r[1])
            if d:
                return d
            if (grad_copy is None) != (grad_now is None):
                return f"{name}.grad is {'None' if grad_now is None else 'set'} compiled"
            if grad_copy is not None:
                d = array_difference(grad_copy, grad_now, f"{name}.grad", soft=soft,
                                     ref=NOREF if ref is NOREF else r[3])
                if d:
                    return d
                # x.grad.grad (a backward in the call gave x.grad a .grad of its own).
                gg_now = _grad_grad(var)
                if (gg is None) != (gg_now is None):
                    return f"{name}.grad.grad is {'None' if gg_now is None else 'set'} compiled"
                if gg is not None:
                    ref_gg = r[4] if ref is not NOREF and r[4] is not None else None
                    d = array_difference(gg[1], gg_now[1], f"{name}.grad.grad", soft=soft,
                                         ref=NOREF if ref is NOREF else
                                         (None if ref_gg is None else ref_gg[1]))
                    if d:
                        return d
        for k, (c, now) in enumerate(zip(arrs, self.arrays)):
            d = array_difference(c, now, "a captured array", soft=soft,
                                 ref=NOREF if ref is NOREF else ref_arrs[k])
            if d:
                return d
        return None


def _grad_grad(var):
    """(var.grad.grad, a copy of its array), or None."""
    g = var._grad
    gg = None if g is None else g._grad
    return None if gg is None else (gg, gg._data.copy())


def array_difference(expected, got, what, scaled=False, soft=None, ref=NOREF):
    """Where two arrays (or scalars) differ: dtype and shape exactly, values within
    RTOL/ATOL (floats), exactly (the rest). scaled: atol relative to the largest
    expected magnitude (gradients: sums whose order differs between backends).
    A low-precision float difference (LOW_PRECISION) is judged by the float64 twin's
    value `ref` of the same leaf (see the module docstring; None: the twin has none,
    the difference counts); with no twin run (ref is NOREF) and a list `soft`, it is
    appended there instead (the caller runs the twin) and not reported."""
    if expected is None or got is None:
        return None if expected is got else f"{what} is None in one run"
    expected, got = np.asarray(expected), np.asarray(got)
    if expected.shape != got.shape or expected.dtype != got.dtype:
        return (f"{what}: eager {expected.dtype}{list(expected.shape)}, compiled "
                f"{got.dtype}{list(got.shape)}")
    if expected.dtype.kind in "fc":
        atol = ATOL
        if scaled and expected.size:
            with np.errstate(all="ignore"):
                big = np.max(np.abs(expected[np.isfinite(expected)]), initial=0.0)
            atol = max(ATOL, RTOL * float(big))
        ok = np.isclose(got, expected, rtol=RTOL, atol=atol, equal_nan=True)
    else:
        ok = got == expected
    if np.all(ok):
        return None
    # Judged by the twin: a low-precision value, or any float value of a call that
    # computes in low precision (Soft.mixed; on the second pass its twin's value
    # carries the measured noise).
    low = expected.dtype in LOW_PRECISION or expected.dtype.kind in "fc" and (
        getattr(soft, "mixed", False) or isinstance(ref, TwinArray))
    if low and np.array_equal(np.isfinite(expected), np.isfinite(got)):
        if ref is NOREF and soft is not None:
            soft.append(what)
            return None
        if ref is not NOREF:
            return _twin_difference(expected, got, ref, ok, what)
    i = np.unravel_index(np.argmin(ok), ok.shape) if ok.ndim else ()
    where = list(int(k) for k in i) if i else ""
    return f"{what}{where}: eager {expected[i]}, compiled {got[i]}"


def _twin_difference(expected, got, ref, ok, what):
    """None if compiled is, element by element, as close to the float64 twin `ref` as
    eager's rounding allows; else where it is not, with the three values."""
    if ref is None or np.shape(ref) != expected.shape:
        i = np.unravel_index(np.argmin(ok), ok.shape) if ok.ndim else ()
        return (f"{what}{list(int(k) for k in i) if i else ''}: eager {expected[i]}, "
                f"compiled {got[i]} (the float64 twin has no value here to tell rounding "
                f"from an error)")
    eps = float(np.finfo(expected.dtype).eps)
    noise = getattr(ref, "noise", None)
    with np.errstate(all="ignore"):
        r = np.asarray(ref).astype(np.complex128 if expected.dtype.kind == "c"
                                   else np.float64)
        e, g = expected.astype(r.dtype), got.astype(r.dtype)
        fin = np.isfinite(r) & np.isfinite(e) & np.isfinite(g)
        scale = float(np.max(np.abs(r[fin]), initial=0.0))
        err_jit, err_eager = np.abs(g - r), np.abs(e - r)
        allowed = 2 * err_eager + TWIN_ULPS * eps * (scale + np.abs(r))
        if noise is not None:
            allowed = allowed + NOISE_FACTOR * noise
        good = ok | (fin & (err_jit <= allowed))
    if np.all(good):
        return None
    i = np.unravel_index(np.argmin(good), good.shape) if good.ndim else ()
    where = list(int(k) for k in i) if i else ""
    return (f"{what}{where}: eager {expected[i]}, compiled {got[i]}, the float64 twin "
            f"{r[i]}: compiled is {float(err_jit[i]):.3g} from the twin where "
            f"{expected.dtype.name} rounding allows {float(allowed[i]):.3g} (twice "
            f"eager's {float(err_eager[i]):.3g} + {TWIN_ULPS} ulps of {scale:.3g}"
            + ("" if noise is None else
               f" + {NOISE_FACTOR} times the {float(noise[i]):.3g} float32-sized noise "
               f"moved the twin") + ")")


def first_difference(expected, got, path="output", soft=None, ref=NOREF, _done=None):
    """The first difference of compiled's result `got` from eager's `expected` (a
    message naming where), None if they agree. soft and ref: see array_difference; ref
    is the float64 twin's result, walked beside the two."""
    # A result is a DAG, not always a tree (`r = [r, r]` a hundred times: 2**100 paths,
    # which eager returns at once): a pair of containers compared once is not again.
    if isinstance(expected, (tuple, list, dict)):
        _done = set() if _done is None else _done
        key = (id(expected), id(got), id(ref))
        if key in _done:
            return None
        _done.add(key)
    # The kind of object first: a Parameter returned as itself, a NumPy scalar or a
    # Python bool where eager gives one, a tuple's length.
    if type(expected) is not type(got):
        return (f"{path}: eager gives a {type(expected).__name__}, compiled a "
                f"{type(got).__name__}")
    if isinstance(expected, (tuple, list, dict)) and len(expected) != len(got):
        return f"{path}: eager gives {len(expected)} items, compiled {len(got)}"

    def sub(r, k):
        # The twin's part k of r; None (no value to judge by) where its shape differs.
        if r is NOREF:
            return NOREF
        if type(r) is type(expected) and len(r) == len(expected) and \
                (not isinstance(r, dict) or k in r):
            return r[k]
        return None

    if isinstance(expected, Variable):
        # A result's .grad too: a backward inside the call (retain_grad) leaves one.
        eg, gg = expected._grad, got._grad
        rv = ref if ref is NOREF else ref if isinstance(ref, Variable) else None
        rd = rv if rv is NOREF else None if rv is None else rv._data
        rg = rv if rv is NOREF else None if rv is None or rv._grad is None else \
            rv._grad._data
        return array_difference(expected._data, got._data, path, soft=soft, ref=rd) or \
            array_difference(None if eg is None else eg._data,
                             None if gg is None else gg._data, f"{path}.grad", scaled=True,
                             soft=soft, ref=rg)
    if isinstance(expected, np.ndarray):
        return array_difference(expected, got, path, soft=soft,
                                ref=ref if ref is NOREF or isinstance(ref, np.ndarray)
                                else None)
    if isinstance(expected, (tuple, list)):
        for i, (e, g) in enumerate(zip(expected, got)):
            d = first_difference(e, g, f"{path}[{i}]", soft, sub(ref, i), _done)
            if d:
                return d
        return None
    if dataclasses.is_dataclass(expected) and got is not expected and \
            not isinstance(expected, type):
        # A dataclass the call made (rebuilt by compiled calls): attribute by attribute.
        names = list(getattr(expected, "__dict__", None) or
                     [f.name for f in dataclasses.fields(expected)])
        for n in names:
            r = getattr(ref, n, None) if ref is not NOREF else NOREF
            if not hasattr(got, n):
                return f"{path}.{n}: eager sets it, compiled does not"
            d = first_difference(getattr(expected, n), getattr(got, n), f"{path}.{n}",
                                 soft, r, _done)
            if d:
                return d
        return None
    if isinstance(expected, dict):
        if list(expected) != list(got):
            return f"{path}: eager gives the keys {list(expected)}, compiled {list(got)}"
        for k in expected:
            d = first_difference(expected[k], got[k], f"{path}[{k!r}]", soft, sub(ref, k),
                                 _done)
            if d:
                return d
        return None
    if isinstance(expected, (np.generic, float, complex)):
        # A NumPy scalar (a reduction's `.sum()`) or a Python float: the arrays'
        # tolerance, not equality (one ulp apart in float32 is a match); the same
        # dtype exactly (the type is the same already).
        return array_difference(expected, got, path, soft=soft,
                                ref=ref if ref is NOREF or isinstance(
                                    ref, (np.generic, float, complex)) else None)
    if got is not expected and not isinstance(expected, (str, bytes, int, bool)) and \
            type(expected).__eq__ is object.__eq__ or isinstance(expected, _ITERATORS):
        # An object of the user's (a dataclass, a generator) is a leaf: compiled calls
        # return the traced call's one again.
        return (f"{path}: a {type(expected).__name__} is returned by the traced call again "
                f"(results are rebuilt only as Variables, arrays and numbers in tuples, "
                f"lists, dicts, NamedTuples and dataclasses)")
    try:
        same = bool(expected == got)
    except Exception:  # noqa: BLE001 - an __eq__ on Variables (a dataclass of them)
        same = False
    if not same and hasattr(expected, "__dataclass_fields__"):
        return (f"{path}: a {type(expected).__name__} is returned by the traced call again "
                f"(results are rebuilt only as Variables, arrays and numbers in tuples, "
                f"lists, dicts, NamedTuples and dataclasses)")
    return None if same else f"{path}: eager {expected!r}, compiled {got!r}"


_ITERATORS = (type(x for x in ()), type(iter(())), type(iter([])), type(map(abs, ())))


def leaves_with_paths(obj, path="output", out=None, containers=False, _seen=None):
    """(path, leaf) for each leaf of a result tree of tuples, lists and dicts (with
    containers=True, each list and dict too, before what it holds). A container met
    again (the result is a DAG: `r = [r, r]`) is not walked again: its leaves are
    listed once, at their first path (with containers=True the container is listed
    again, so a sharing compiled calls lose still shows); two results with the same
    sharing list their leaves in the same order."""
    out = [] if out is None else out
    _seen = set() if _seen is None else _seen
    if type(obj) in (tuple, list, dict) or _is_namedtuple(type(obj)):
        if id(obj) in _seen:
            if containers and type(obj) in (list, dict):
                out.append((path, obj))
            return out
        _seen.add(id(obj))
    if type(obj) in (tuple, list) or _is_namedtuple(type(obj)):
        if containers and type(obj) is list:
            out.append((path, obj))
        for i, x in enumerate(obj):
            leaves_with_paths(x, f"{path}[{i}]", out, containers, _seen)
    elif type(obj) is dict:
        if containers:
            out.append((path, obj))
        for k, x in obj.items():
            leaves_with_paths(x, f"{path}[{k!r}]", out, containers, _seen)
    else:
        out.append((path, obj))
    return out


def result_objects(result):
    """(path, object) of every Variable, its .data, array, list and dict in a result:
    taken of eager's right after its run (a captured Variable it returns is the same
    object in both runs, whose .data the compiled run may rebind: `W.data = x.data`)."""
    objs = []
    for path, x in leaves_with_paths(result, containers=True):
        if isinstance(x, Variable):
            objs.append((path, x))
            objs.append((f"{path}.data", x._data))
        elif isinstance(x, (np.ndarray, list, dict)):
            objs.append((path, x))
    return objs


def identity_difference(expected, got, known=(), expected_objects=None):
    """Where the results' identities differ (the values and the structure are the same
    already): eager returns an object that existed before the call (`known`: the
    arguments, their arrays, captured state) and compiled another, or one object (a
    Variable, an array, a Variable's .data, a list or dict) in two places where
    compiled has two different ones, or the reverse. expected_objects: eager's
    result_objects, taken right after its run (default: taken now)."""
    known = {id(x) for x in known}
    eo = result_objects(expected) if expected_objects is None else expected_objects
    go = result_objects(got)
    # Where the two share differently, the lists part at the first container one side
    # meets again and the other not: the loop names it before their lengths differ.
    first_e, first_g = {}, {}
    for i, ((path, e), (_, g)) in enumerate(zip(eo, go)):
        if e is None:
            continue
        if id(e) in known and e is not g and not path.endswith(".data"):
            return f"{path}: eager returns an object it was given, compiled a new one"
        je, jg = first_e.setdefault(id(e), i), first_g.setdefault(id(g), i)
        if je != jg:
            if je < i:
                return (f"{path}: eager returns the object of {eo[je][0]} again, compiled "
                        f"a different one")
            return f"{path}: compiled returns the object of {go[jg][0]} again, eager not"
    return None


def gradient_difference(expected, got, wrt, seed=0, soft=None, ref=NOREF):
    """Backward from both results with the same random cotangents (each result leaf
    that is a float Variable, a leaf used twice getting both), gradients kept aside
    (no .grad is touched); the first gradient of `wrt` [(name, Variable)] that
    differs, None-ness included. None also when there is nothing to differentiate.
    soft as in array_difference; ref: (the float64 twin's result, its Variables in
    wrt's order), differentiated with the same cotangents."""
    rng = np.random.default_rng(seed)
    seeds_e, seeds_g, seeds_r = DictGrads(), DictGrads(), DictGrads()
    roots_e, roots_g, roots_r = [], [], []
    ref_leaves = leaves_with_paths(ref[0]) if ref is not NOREF else None
    pairs = list(zip(leaves_with_paths(expected), leaves_with_paths(got)))
    for k, ((_, e), (_, g)) in enumerate(pairs):
        if not isinstance(e, Variable) or not isinstance(g, Variable) or e._data is None \
                or e._data.dtype.kind not in "fc":
            continue
        c = np.asarray(rng.standard_normal(e._data.shape), dtype=e._data.dtype)
        sides = [(seeds_e, roots_e, e, c), (seeds_g, roots_g, g, c)]
        r = ref_leaves[k][1] if ref_leaves is not None and k < len(ref_leaves) else None
        if isinstance(r, Variable) and r._data is not None and r._data.shape == c.shape:
            sides.append((seeds_r, roots_r, r, c.astype(r._data.dtype)))
        for store, roots, y, cy in sides:
            old = store.get(y)
            if old is None:
                roots.append(y)
            store.set(y, Variable(cy if old is None else old._data + cy))
    if not any(y.creator is not None for y in roots_e + roots_g):
        return None
    # Only the call's own graph: the walk stops at the arguments and captures (a
    # captured Variable computed before the call has a graph of its own behind it).
    stop = {id(var) for _, var in wrt}
    backprop(roots_e, grads=seeds_e, within=_region(roots_e, stop))
    backprop(roots_g, grads=seeds_g, within=_region(roots_g, stop))
    noisy_grads = []     # per noisy twin: {position in wrt: its gradient's data}
    if ref is not NOREF:
        ref_wrt = list(ref[1])
        stop_r = {id(var) for var in ref_wrt if var is not None}
        if any(y.creator is not None for y in roots_r):
            backprop(roots_r, grads=seeds_r, within=_region(roots_r, stop_r))
        for k, (n_result, n_wrt) in enumerate(ref[2] if len(ref) > 2 else ()):
            # The noisy twin's backward, with the same cotangents, under the same noise.
            crng = np.random.default_rng(seed)
            seeds_n, roots_n = DictGrads(), []
            n_leaves = leaves_with_paths(n_result)
            for j, ((_, e), (_, g)) in enumerate(zip(leaves_with_paths(expected),
                                                     leaves_with_paths(got))):
                if not isinstance(e, Variable) or not isinstance(g, Variable) or \
                        e._data is None or e._data.dtype.kind not in "fc":
                    continue
                c = np.asarray(crng.standard_normal(e._data.shape), dtype=e._data.dtype)
                r = n_leaves[j][1] if j < len(n_leaves) else None
                if isinstance(r, Variable) and r._data is not None and \
                        r._data.shape == c.shape:
                    old = seeds_n.get(r)
                    if old is None:
                        roots_n.append(r)
                    cr = c.astype(r._data.dtype)
                    seeds_n.set(r, Variable(cr if old is None else old._data + cr))
            got_n = {}
            try:
                if any(y.creator is not None for y in roots_n):
                    stop_n = {id(var) for var in n_wrt if var is not None}
                    with float32_noise(k):
                        backprop(roots_n, grads=seeds_n, within=_region(roots_n, stop_n))
                for pos, var in enumerate(n_wrt):
                    gvar = seeds_n.get(var) if var is not None else None
                    if gvar is not None:
                        got_n[pos] = gvar._data
            except Exception:  # noqa: BLE001 - a noisy run that fails measures nothing
                got_n = {}
            noisy_grads.append(got_n)
    # The result Variables that are leaves of eager's graph, made in the call (`c =
    # Variable(np.ones(3)); return x * c, c`): eager's backward gives them gradients.
    known = {id(var) for _, var in wrt}
    made = [(f"{p} (a leaf the call made)", e, g) for (p, e), (_, g) in pairs
            if isinstance(e, Variable) and isinstance(g, Variable) and e.creator is None
            and id(e) not in known and id(g) not in known and type(e) is type(g)]
    for name, e, g in made:
        a, b = seeds_e.get(e), seeds_g.get(g)
        if (a is None) != (b is None):
            return (f"the gradient of {name} is {'None' if b is None else 'set'} compiled, "
                    f"{'None' if a is None else 'set'} in eager")
        if a is not None and a._data is not None and b._data is not None:
            d = array_difference(a._data, b._data, f"the gradient of {name}", scaled=True,
                                 soft=soft)
            if d:
                return d
    for k, (name, var) in enumerate(wrt):
        a, b = seeds_e.get(var), seeds_g.get(var)
        if (a is None) != (b is None):
            return (f"the gradient of {name} is {'None' if b is None else 'set'} compiled, "
                    f"{'None' if a is None else 'set'} in eager")
        if a is not None:
            rr = NOREF
            if ref is not NOREF:
                rv = ref_wrt[k] if k < len(ref_wrt) else None
                rg = seeds_r.get(rv) if rv is not None else None
                rr = None if rg is None else with_noise(
                    rg._data, [n[k] for n in noisy_grads if k in n])
            d = array_difference(a._data, b._data, f"the gradient of {name}", scaled=True,
                                 soft=soft, ref=rr)
            if d:
                return d
    return None


def _region(roots, stop):
    """The functions behind `roots`, not looking past the Variables in `stop`."""
    seen = set()
    stack = [y.creator for y in roots if y.creator is not None and id(y) not in stop]
    while stack:
        f = stack.pop()
        if f in seen:
            continue
        seen.add(f)
        for x in f.inputs:
            if x.creator is not None and id(x) not in stop:
                stack.append(x.creator)
    return seen


def _float64(a, memo=None):
    if a is None:
        return None
    a = np.asarray(a)
    if a.dtype in LOW_PRECISION:
        return layout_copy(a, memo, np.complex128 if a.dtype.kind == "c" else np.float64)
    return layout_copy(a, memo)


# A base up to this size (or this many times the argument's) is copied whole, so that
# arguments that are views of one buffer stay views of one copy; a view of a bigger
# buffer (a batch of a dataset) gets a copy of its own span.
_WHOLE_BASE_BYTES = 1 << 24


def layout_copy(a, memo=None, dtype=None, values=None):
    """A copy of ndarray `a` for a rerun of the user's function (the checks against
    eager, the float64 twin) laid out as `a` is: the same strides (scaled to `dtype`'s
    itemsize), over a copy of the region of its base buffer it spans, so a reshape of
    the copy copies exactly where one of `a` would (`x.data.reshape(-1)` of a
    non-contiguous argument is a copy, of a contiguous one a view: the function's
    behaviour may depend on it), and arguments that are views of one buffer are views
    of one copy (memo: one copied region per base, for one rerun's arguments).
    `values` (a's shape): what the copy holds instead of a's values (a perturbation).
    A plain C-contiguous copy where the layout cannot be rebuilt."""
    dtype = a.dtype if dtype is None else np.dtype(dtype)
    plain = None
    if a.ndim == 0 or a.size == 0 or a.base is None and a.flags.c_contiguous:
        plain = True
    elif a.dtype.hasobject or dtype.hasobject or a.itemsize == 0:
        plain = True
    if not plain:
        try:
            out = _strided_copy(a, memo, dtype)
        except (ValueError, TypeError):
            out = None
        if out is not None:
            if values is not None:
                out[...] = values
            return out
    if values is not None:
        return np.array(values, dtype=dtype, copy=True)
    return a.astype(dtype, copy=True)


def _lowest(a):
    """a's element at its lowest address (negative strides counted), as a 1-d byte array."""
    corner = a[tuple(slice(a.shape[k] - 1, None) if st < 0 else slice(0, 1)
                     for k, st in enumerate(a.strides))]
    return corner.reshape(1).view(np.uint8)       # a view: one element, all axes 1


def _strided_copy(a, memo, dtype):
    from numpy.lib.array_utils import byte_bounds
    root = a
    while isinstance(root.base, np.ndarray):
        root = root.base
    lo, hi = byte_bounds(a)
    at = a
    if root is not a and root.dtype == a.dtype and root.size and (
            root.nbytes <= max(_WHOLE_BASE_BYTES, 4 * a.nbytes)):
        r_lo, r_hi = byte_bounds(root)
        if r_lo <= lo and hi <= r_hi and (lo - r_lo) % a.itemsize == 0:
            lo, hi, at = r_lo, r_hi, root
    size = a.itemsize
    if (hi - lo) % size or any(st % size for st in a.strides):
        return None
    regions = None if memo is None else memo.setdefault(("layout", id(root), dtype.str), [])
    flat = None
    for f_lo, f_hi, f in regions or ():
        # A region copied for another argument of the same base that holds this one.
        if f_lo <= lo and hi <= f_hi and (lo - f_lo) % size == 0:
            lo, flat = f_lo, f
            break
    if flat is None:
        span = np.lib.stride_tricks.as_strided(_lowest(at), (hi - lo,), (1,), writeable=False)
        flat = span.view(a.dtype).astype(dtype, copy=True)
        if regions is not None:
            regions.append((lo, hi, flat))
    offset = (byte_bounds(a)[0] - lo) // size * dtype.itemsize
    strides = tuple(st // size * dtype.itemsize for st in a.strides)
    # (offset: of the lowest-addressed element; np.ndarray wants the first element's)
    first = offset + sum((n - 1) * -st for n, st in zip(a.shape, strides) if st < 0)
    return np.ndarray(a.shape, dtype, buffer=flat, offset=first, strides=strides)


def copy_caller_graph(leaves, copies, memo, copy_var):
    """Give each copy of an argument (copies[k] of leaves[k]) a copy of the caller's
    graph behind it, so a rerun's backward that goes on into the caller's graph walks
    the copy as the call's walks the original, and arguments related there (u =
    F.sin(x) passed beside x) stay related: a walk from u's copy reaches x's copy.
    copy_var(var) copies a Variable of that graph (memo: the copies made so far, the
    arguments' among them; the Functions' are kept under ("fn", id)). A compiled call's
    node (RegionFunction: its backward holds the compiled call's own arrays) is not
    copied: the copy behind it is a leaf, as every argument's copy once was."""
    todo = [(x, y) for x, y in zip(leaves, copies)
            if isinstance(x, Variable) and isinstance(y, Variable) and y is not x]
    while todo:
        x, y = todo.pop()
        f = x.creator
        if f is None or isinstance(f, RegionFunction) or y.creator is not None:
            continue
        fc = memo.get(("fn", id(f)))
        if fc is None:
            fc = memo[("fn", id(f))] = copy.copy(f)
            fc.inputs = [_graph_copy(i, memo, copy_var, todo) for i in f.inputs]
            # (A dead output stays dead: its weakref, as the original's.)
            fc.outputs = [r if r() is None else
                          weakref.ref(_graph_copy(r(), memo, copy_var, todo))
                          for r in f.outputs]
        y.creator, y.generation = fc, x.generation


def _graph_copy(var, memo, copy_var, todo):
    """var's copy (memo keeps it alive: an output only the copied Function names), its
    own creator to copy next (todo)."""
    if id(var) not in memo:
        memo[id(var)] = copy_var(var)
        todo.append((var, memo[id(var)]))
    return memo[id(var)]


def twin_copy(x, memo):
    """The float64 twin's copy of an argument leaf: a float32 (float16, complex64)
    array or Variable's data and .grad made float64; other arrays copied (the twin's
    run must not change the call's objects); anything else as is. memo: one copy per
    object (f(x, x) stays aliased)."""
    if id(x) in memo:
        return memo[id(x)]
    if isinstance(x, Variable):
        # A Constant (backward's seed) and a Parameter stay what they are (the key and
        # the gradient rules tell them apart).
        cls = type(x) if type(x) in (Variable, Parameter, Constant) else \
            Parameter if isinstance(x, Parameter) else Variable
        y = cls(_float64(x._data, memo), x.name)
        if x._grad is not None and cls is not Constant:
            y._grad = Variable(_float64(x._grad._data, memo))
    elif isinstance(x, np.ndarray):
        y = _float64(x, memo)
    else:
        y = x
    memo[id(x)] = y
    return y
