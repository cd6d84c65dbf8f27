"""gradcheck and assert_jit_matches_eager: checks of differentiable code, yours and ours.

`assert_jit_matches_eager` calls tracejit.jit(f) and f side by side, call after call, and
compares results (values, kinds, dtypes, identity, creators), gradients and state;
`assert_call_matches_eager` compares one call the same way, for tests that drive a
jitted function themselves. `gradcheck` compares the analytic gradient of a function
(from `backward()`) with central differences in float64, contracting the outputs with
seeded random cotangents (all-ones cotangents miss gradients that are permuted or summed
in the wrong order).
`strategies` holds hypothesis strategies for arrays, shapes and random programs; it is
imported lazily, so gradcheck works without hypothesis installed.

This module sits beside the pipeline (eager -> trace -> IR -> passes -> codegen): it
only calls the public eager API and, when present, `tracejit.jit`.
"""
import numpy as np

from tracejit.core import Variable, as_variable
from tracejit import functions as F
from tracejit.runtime.checking import layout_copy

__all__ = ["gradcheck", "assert_jit_matches_eager", "assert_call_matches_eager"]


# ---------------------------------------------------------------- helpers

def _is_float(a):
    return isinstance(a, np.ndarray) and a.dtype.kind == "f"


def _unwrap(x):
    """(array or None, name) of one gradcheck input; non-arrays give (None, None)."""
    if isinstance(x, Variable):
        return x.data, x.name
    if isinstance(x, np.ndarray):
        return x, None
    return None, None


def _outputs(ys):
    if isinstance(ys, (tuple, list)):
        return [as_variable(y) for y in ys]
    if not isinstance(ys, (Variable, np.ndarray)):
        raise TypeError(f"gradcheck: f must return a Variable or a tuple of Variables, "
                        f"got {type(ys).__name__}")
    return [as_variable(ys)]


class _Problem:
    """The inputs of one check: which are checked, their float64 copies, their names."""

    def __init__(self, inputs):
        self.originals = list(inputs)
        self.arrays, self.names, self.checked = [], [], []
        for i, x in enumerate(inputs):
            a, name = _unwrap(x)
            self.names.append(name)
            self.arrays.append(a)
            if _is_float(a):
                self.checked.append(i)

    def call(self, fn, arrays, dtype=np.float64):
        """Call fn on fresh Variables; checked inputs get `arrays[i]` cast to dtype.

        dtype=None keeps each input's own dtype. Returns (input Variables, outputs).
        """
        args, xs = [], {}
        for i, x in enumerate(self.originals):
            if i in self.checked:
                a = arrays[i] if dtype is None else arrays[i].astype(dtype, copy=True)
                v = Variable(a, name=self.names[i])
                xs[i] = v
                args.append(v)
            else:
                args.append(x)          # labels, index arrays, Python numbers: as given
        return xs, _outputs(fn(*args))

    def describe(self, i):
        name = f" ({self.names[i]!r})" if self.names[i] else ""
        return f"input {i}{name} with shape {self.arrays[i].shape}"


def _loss(ys, cotangents):
    total = None
    for y, c in zip(ys, cotangents):
        cv = Variable(c.astype(y.dtype) if y.dtype.kind == "f" else c)
        term = F.sum(y * cv)
        total = term if total is None else total + term
    return total


def _numeric_loss(ys, cotangents):
    return float(sum(np.sum(np.asarray(y.data, dtype=np.float64) * c)
                     for y, c in zip(ys, cotangents)))


def _grad_array(v):
    if v.grad is None:
        return np.zeros(v.shape, np.float64)
    return np.asarray(v.grad.data)


def _analytic(problem, fn, arrays, cotangents, dtype=np.float64):
    """Outputs and gradients of sum(y * c) with respect to the checked inputs."""
    xs, ys = problem.call(fn, arrays, dtype)
    _loss(ys, cotangents).backward()
    grads = {}
    for i, v in xs.items():
        if v.grad is not None and v.grad.shape != v.shape:
            raise AssertionError(
                f"gradcheck: the gradient of {problem.describe(i)} has shape "
                f"{v.grad.shape}; a gradient must have its input's shape (a missing "
                f"sum_to under broadcasting?)")
        grads[i] = v.grad
    return ys, grads


def _second_order_analytic(problem, fn, arrays, cotangents, vectors):
    """Gradient of sum_i (grad_i . v_i) through backward(create_graph=True)."""
    xs, ys = problem.call(fn, arrays)
    _loss(ys, cotangents).backward(create_graph=True)
    gxs = {i: v.grad for i, v in xs.items()}
    for v in xs.values():
        v.cleargrad()
    total = None
    for i, g in gxs.items():
        if g is None:
            continue
        term = F.sum(g * Variable(vectors[i]))
        total = term if total is None else total + term
    if total is not None:
        total.backward()
    return {i: _grad_array(v) for i, v in xs.items()}


def _first_order_dot(problem, fn, arrays, cotangents, vectors):
    """sum_i (grad_i . v_i) with first-order gradients only: the numeric side."""
    _, grads = _analytic(problem, fn, arrays, cotangents)
    return float(sum(np.sum((np.zeros(arrays[i].shape) if g is None else g.data) * vectors[i])
                     for i, g in grads.items()))


def _numeric(problem, scalar_fn, eps):
    """Central differences of scalar_fn(arrays) for every element of the checked inputs."""
    # Each element is perturbed in place by its index into the array scalar_fn reads,
    # never through a reshaped alias: reshape(-1) copies an F-ordered or strided array
    # (astype keeps the input's memory order), and writes into a copy perturb nothing.
    arrays = [np.array(a, dtype=np.float64) if i in problem.checked else a
              for i, a in enumerate(problem.arrays)]
    grads = {}
    for i in problem.checked:
        x = arrays[i]
        g = np.zeros(x.shape, np.float64)
        for idx in np.ndindex(x.shape):
            old = x[idx]
            x[idx] = old + eps
            plus = scalar_fn(arrays)
            x[idx] = old - eps
            minus = scalar_fn(arrays)
            x[idx] = old
            g[idx] = (plus - minus) / (2 * eps)
        grads[i] = g
    return grads


def _compare(problem, i, analytic, numeric, rtol, atol, what):
    analytic = np.asarray(analytic, dtype=np.float64)
    numeric = np.asarray(numeric, dtype=np.float64)
    if analytic.shape != numeric.shape:
        raise AssertionError(f"{what} failed for {problem.describe(i)}: analytic gradient has "
                             f"shape {analytic.shape}, expected {numeric.shape}")
    if analytic.size == 0:
        return
    excess = np.abs(analytic - numeric) - (atol + rtol * np.abs(numeric))
    # A NaN on one side only is a failure; NaN on both sides is reported too (the check
    # point is outside the function's domain, so nothing was verified).
    excess = np.where(np.isnan(excess), np.inf, excess)
    if np.all(excess <= 0):
        return
    k = int(np.argmax(excess))
    idx = np.unravel_index(k, analytic.shape) if analytic.ndim else ()
    bad = int(np.count_nonzero(excess > 0))
    where = tuple(int(d) for d in idx)
    a, n = float(analytic.flat[k]), float(numeric.flat[k])
    raise AssertionError(
        f"{what} failed for {problem.describe(i)}: worst element at index "
        f"{where}: analytic={a!r}, numeric={n!r}, |diff|={abs(a - n):.3g} "
        f"({bad} of {analytic.size} elements outside tolerance; rtol={rtol}, atol={atol})")


# ---------------------------------------------------------------- gradcheck

def gradcheck(f, *inputs, rtol=1e-4, atol=1e-6, eps=1e-6, second_order=False, seed=0,
              jit=False, cotangents=None, check_dtype=True):
    """Check f's analytic gradients against central differences; return True or raise.

    f maps Variables to a Variable or a tuple of Variables. Float inputs (Variables or
    ndarrays, any shape, 0-d included) are checked in float64; other inputs (int
    labels, index arrays, Python numbers) are passed through unchanged. The outputs
    are contracted with random cotangents drawn from np.random.default_rng(seed), or
    with `cotangents` (one array per output). An element passes when
    |analytic - numeric| <= atol + rtol * |numeric|.

    second_order=True also checks the gradient of (gradient . v), for random v, from
    backward(create_graph=True) against central differences of the first-order
    gradient. check_dtype=True checks that float32 inputs get float32 gradients that
    agree with the float64 ones to float32 precision. jit=True repeats the check
    through tracejit.jit(f) when tracejit has a jit (otherwise that part is skipped).

    A failure raises AssertionError naming the input (index, name, shape), the worst
    element, both values and the tolerances.
    """
    problem = _Problem(inputs)
    rng = np.random.default_rng(seed)

    _, ys = problem.call(f, problem.arrays)
    if cotangents is None:
        cotangents = [rng.standard_normal(y.shape) for y in ys]
    else:
        if isinstance(cotangents, np.ndarray):
            cotangents = [cotangents]
        cotangents = [np.asarray(c, dtype=np.float64) for c in cotangents]
        if len(cotangents) != len(ys) or any(c.shape != y.shape
                                             for c, y in zip(cotangents, ys)):
            raise ValueError(f"gradcheck: cotangents have shapes "
                             f"{[c.shape for c in cotangents]}, outputs have shapes "
                             f"{[y.shape for y in ys]}")

    def loss_value(fn):
        return lambda arrays: _numeric_loss(problem.call(fn, arrays)[1], cotangents)

    numeric = _numeric(problem, loss_value(f), eps)
    variants = [("eager", f)]
    if jit:
        import tracejit
        if hasattr(tracejit, "jit"):
            variants.append(("jit", tracejit.jit(f)))

    eager_ys = None
    for label, fn in variants:
        ys, grads = _analytic(problem, fn, problem.arrays, cotangents)
        if eager_ys is None:
            eager_ys = ys
        else:
            for k, (y, ye) in enumerate(zip(ys, eager_ys)):
                if y.shape != ye.shape or y.dtype != ye.dtype or not np.allclose(
                        y.data, ye.data, rtol=1e-6, atol=1e-9, equal_nan=True):
                    raise AssertionError(f"gradcheck: {label} output {k} ({y.dtype}"
                                         f"{list(y.shape)}) differs from eager ({ye.dtype}"
                                         f"{list(ye.shape)})")
        for i in problem.checked:
            g = np.zeros(problem.arrays[i].shape) if grads[i] is None else grads[i].data
            _compare(problem, i, g, numeric[i], rtol, atol, f"gradcheck ({label})")

        if second_order:
            vectors = {i: rng.standard_normal(problem.arrays[i].shape)
                       for i in problem.checked}
            numeric2 = _numeric(
                problem, lambda arrays, fn=fn: _first_order_dot(problem, fn, arrays,
                                                                cotangents, vectors), eps)
            analytic2 = _second_order_analytic(problem, fn, problem.arrays, cotangents,
                                               vectors)
            for i in problem.checked:
                _compare(problem, i, analytic2[i], numeric2[i], rtol, atol,
                         f"second-order gradcheck ({label})")

    if check_dtype and any(problem.arrays[i].dtype == np.float32 for i in problem.checked):
        _check_float32(problem, f, cotangents, numeric)
    return True


def _check_float32(problem, f, cotangents, numeric):
    """float32 inputs keep float32 gradients, equal to the float64 ones within float32 error."""
    _, grads = _analytic(problem, f, problem.arrays, cotangents, dtype=None)
    for i in problem.checked:
        a = problem.arrays[i]
        g = grads[i]
        if g is None:
            continue
        if g.dtype != a.dtype:
            raise AssertionError(f"gradcheck: the gradient of {problem.describe(i)} and dtype "
                                 f"{a.dtype} has dtype {g.dtype}")
        if a.dtype == np.float32:
            scale = max(1.0, float(np.max(np.abs(numeric[i]), initial=0.0)))
            _compare(problem, i, g.data, numeric[i], 1e-3, 1e-3 * scale,
                     "gradcheck (float32)")


# ---------------------------------------------------------------- jit vs eager

_CREATORS = ("always", "with float arguments")


def assert_jit_matches_eager(f=None, *args, calls=4, rtol=1e-6, atol=1e-9, seed=0,
                             make_args=None, params=(), second_order=False, jitted=None,
                             allow_fallback=False, context=None, backward=True,
                             creators="always", captures=None, make_function=None,
                             identity=True, **jit_options):
    """Assert that tracejit.jit(f) gives eager's results and gradients, call after call.

    The jitted function is called `calls` times beyond its warm-up and trace, each
    time with new values (the float arguments perturbed, shapes kept). Each result, in
    any tree of tuples, lists and dicts, is compared with the eager function's on its
    structure (the containers' types and dict keys), kind (Variable, Parameter, ndarray,
    NumPy or Python scalar, anything else by ==), dtype, shape and value; on identity
    (a result that is an argument, a params or captures object, or the .data or .grad of
    one before or after the call, is that object; one Variable, array, list or dict in
    two places is one object in both); on whether a float Variable has a creator; and the
    Variable and ndarray arguments' data after the call (an in-place update). Then the
    gradients of sum(output * random cotangent) over the float Variable results, with
    respect to the float Variable / ndarray arguments (and params, captures, state), are
    compared: kind, dtype, shape and value, None where eager gives None. A fallback to eager (a
    JitWarning) fails the assertion: it would hide what jit does. Returns the jitted
    function's cache_info().

    Each call is compared as assert_call_matches_eager compares one: that function is
    for tests that drive the jitted function themselves between comparisons.

    Options, for programs the defaults do not reach:
      make_args: a function of the call's number (0, 1, ...) giving that call's
        arguments (a tuple or list), instead of `*args` and their perturbations. They
        are passed as given (an ndarray stays an ndarray, a Parameter a Parameter), each
        side its own copy of the Variables and ndarrays among them (one object twice is
        one copy twice); gradients are those of the Variables. It may also change
        captured state: both sides of the call see the change.
      params: captured Parameters f reads or updates. Each call starts both sides from
        the same data with no gradient; afterwards their data and gradients (first and,
        with second_order, second order) are compared like the arguments'.
      captures: a dict naming the objects f reads from outside without updating them
        (Variables, Parameters, arrays): a result that is one of them, or its .data or
        .grad (before or after the call), must be that object on both sides, and the
        gradients the Variables among them get are compared (their gradients are
        cleared before each side's call).
        Unlike params, their data is left as it is (make_args may update it in place).
      make_function: for a function with state of its own (a closure that writes a
        Parameter, appends to a list...): a function of no arguments returning a new
        `(f, state)`, where state is a tree (tuples, lists, dicts) of the objects f
        writes. It is called once per side, so each side runs on its own state from the
        start: the jitted side calls jit of its f (f itself is not given). After each
        call the two states are compared like results (Variables also on their
        gradients; leaves that are not Variables, arrays or numbers are the caller's to
        check), and results identical to state objects must be so on both sides.
      second_order: backward(create_graph=True), then the backward of the sum of the
        squares of the float first-order gradients (arguments' and params'): the
        second-order gradients are compared too.
      context: a function of the call's number giving a context manager that each
        side's call runs in (once per side), e.g. `lambda k: tj.no_grad()` or a grad
        mode, tj.test_mode(), tj.disable_jit() that changes from call to call. The
        backward runs outside it.
      backward: False compares no gradients, so no backward is compiled or run (for
        tests of what a forward-only loop compiles).
      creators: "always" compares whether each float Variable result has a creator;
        "with float arguments" only on calls with a float Variable argument (without one
        a compiled call records no graph, where eager records one that leads to no
        input).
      identity: False leaves out the identity comparison (values, kinds, creators and
        gradients are still compared). Eager's identities are part of jit's contract:
        for a test of something else while an identity bug is open, named in the test.
      jitted: the jitted function to check (default tracejit.jit(f, **jit_options)),
        for a caller that inspects it afterwards or drives it between checks. Its cache
        is the caller's: a function already warm gets no warm-up calls.
      allow_fallback: a fallback to eager does not fail the assertion (JitWarnings
        are left to the caller's warning filters); the results are still compared with
        eager's on every call. For tests of fallbacks, which check the warnings.
    """
    import warnings

    import tracejit
    if make_args is not None and args:
        raise TypeError("assert_jit_matches_eager: pass the arguments either as *args or "
                        "as make_args, not both")
    if creators not in _CREATORS:
        raise ValueError(f"assert_jit_matches_eager: creators must be one of {_CREATORS}, "
                         f"got {creators!r}")
    if make_function is not None:
        if f is not None or jitted is not None:
            raise TypeError("assert_jit_matches_eager: make_function makes the function; "
                            "pass no f and no jitted")
        f_jit, state_jit = make_function()
        f, state_eager = make_function()
    elif f is None:
        raise TypeError("assert_jit_matches_eager: no function to check")
    else:
        f_jit, state_jit = f, None
        state_eager = None
    rng = np.random.default_rng(seed)
    if jitted is None:
        jitted = tracejit.jit(f_jit, **jit_options)
    elif jit_options:
        raise TypeError(f"assert_jit_matches_eager: jit options {sorted(jit_options)} "
                        f"with an already jitted function")
    params = list(params)
    captures = dict(captures or {})
    with warnings.catch_warnings():
        if not allow_fallback:
            warnings.simplefilter("error", tracejit.JitWarning)
        for call in range(calls + 2):
            if make_args is not None:
                new_args = list(make_args(call))
            else:
                new_args = [_perturb(a, rng) if call else a for a in args]
            start = [p.data.copy() for p in params]
            sides = []
            for fn, state in ((jitted, state_jit), (f, state_eager)):
                for p, d in zip(params, start):
                    p.data = d.copy()
                    p.cleargrad()
                for c in captures.values():
                    if isinstance(c, Variable):
                        c.cleargrad()
                sides.append(_results_and_grads(
                    fn, new_args, seed + call, params, second_order, make_args is None,
                    context=None if context is None else context(call), backward=backward,
                    creators=creators, captures=captures, state=state))
            _assert_results_match(sides[0], sides[1], rtol, atol, f"call {call}", identity)
    info = jitted.cache_info()
    if info["fallbacks"] and not allow_fallback:
        raise AssertionError(f"jit fell back to eager: {info}")
    return info


def assert_call_matches_eager(jitted, f, *args, kwargs=None, eager_args=None, states=None,
                              context=None, backward=True, creators="always", params=(),
                              captures=None, second_order=False, rtol=1e-6, atol=1e-9,
                              seed=0, what="the call", identity=True):
    """One call of `jitted` beside one of f, compared as assert_jit_matches_eager compares
    each of its calls; returns the jitted side's result.

    For tests that drive a jitted function themselves between the comparisons (a mode
    or an argument form switched on some calls, an exception raised inside a block, a
    helper jitted elsewhere), where assert_jit_matches_eager's loop does not fit. The
    caller does what the loop does for it: calling at least 3 times with new values,
    and making a fallback an error (a JitWarning filter) and checking cache_info().

    args and kwargs are the call's arguments, passed as given, each side its own copy
    (as make_args's). eager_args: eager's own positional arguments; args are then the
    jit side's, and neither is copied, nor are kwargs (for arguments that are a side's
    own state, a Parameter of its model passed to its function). states: (the jit side's state,
    eager's), trees compared after the call like make_function's states (values,
    Variables' gradients; a result that is a state object must be on both sides).
    context: a function of no arguments giving the context manager each side's call
    runs in. backward, creators, params, captures, identity,
    second_order, rtol, atol: as for assert_jit_matches_eager; seed draws the
    cotangents; `what` starts the failure message.
    """
    if creators not in _CREATORS:
        raise ValueError(f"assert_call_matches_eager: creators must be one of "
                         f"{_CREATORS}, got {creators!r}")
    state_jit, state_eager = (None, None) if states is None else states
    start = [p.data.copy() for p in params]
    sides, outs = [], []
    copy = eager_args is None
    for fn, state, given in ((jitted, state_jit, args),
                             (f, state_eager, args if copy else eager_args)):
        for p, d in zip(params, start):
            p.data = d.copy()
            p.cleargrad()
        for c in (captures or {}).values():
            if isinstance(c, Variable):
                c.cleargrad()
        record, out = _run_call(fn, given, seed, params, second_order, False,
                                None if context is None else context(), backward,
                                creators, captures, state, kwargs, copy)
        sides.append(record)
        outs.append(out)
    _assert_results_match(sides[0], sides[1], rtol, atol, what, identity)
    return outs[0]


def _perturb(a, rng):
    # np.asarray: a 0-d array plus a 0-d array is a NumPy scalar, which Variable refuses
    if isinstance(a, Variable) and _is_float(a.data):
        return Variable(np.asarray(a.data + (0.1 * rng.standard_normal(a.shape))
                                   .astype(a.dtype)))
    if isinstance(a, np.ndarray) and _is_float(a):
        return np.asarray(a + (0.1 * rng.standard_normal(a.shape)).astype(a.dtype))
    return a


def _copy_args(args):
    """Each side's own arguments: Variables (of their own class, name and gradient) and
    ndarrays copied, one object given twice copied once, a Variable's .data given beside
    it the copy's .data (aliasing is part of the call), arrays laid out as the caller's
    (checking.layout_copy)."""
    memo = {}

    def copy(a):
        if a is None or id(a) in memo:
            return memo.get(id(a))
        if isinstance(a, Variable):
            c = type(a)(copy(a.data), name=a.name)
            if a.grad is not None:
                c.grad = copy(a.grad)
        elif isinstance(a, np.ndarray):
            # Its strides, and views of one buffer stay views of one copy: a reshape
            # copies on each side exactly where the caller's would.
            c = layout_copy(a, memo)
        else:
            return a
        memo[id(a)] = c
        return c
    return [copy(a) for a in args]


def _containers(obj, path="output", out=None, seen=None):
    """(path, type, length or keys) of each tuple, list, NamedTuple and dict of a result
    tree, in the order leaves_with_paths walks it: the leaves' paths do not tell a tuple
    from a list. A container met again (a DAG) is listed as that, not walked again."""
    out = [] if out is None else out
    seen = {} if seen is None else seen        # id -> the path it was met at first
    is_seq = type(obj) in (tuple, list) or (isinstance(obj, tuple) and hasattr(obj, "_fields"))
    if (is_seq or type(obj) is dict) and id(obj) in seen:
        out.append((path, type(obj), ("again", seen[id(obj)])))
        return out
    if is_seq:
        seen[id(obj)] = path
        out.append((path, type(obj), len(obj)))
        for i, x in enumerate(obj):
            _containers(x, f"{path}[{i}]", out, seen)
    elif type(obj) is dict:
        seen[id(obj)] = path
        out.append((path, type(obj), list(obj)))
        for k, x in obj.items():
            _containers(x, f"{path}[{k!r}]", out, seen)
    return out


def _after_the_call(what, data):
    # The kind goes into the label, which must match: a 0-d array where eager leaves a
    # NumPy scalar (or the reverse) is a difference even when the values agree.
    return f"{what} after the call (a {type(data).__name__})", np.array(data)


def _grads_of(variables, what):
    out = []
    for name, w in variables:
        g = w.grad if isinstance(w, Variable) else None
        if g is None:
            out.append((f"{what} of {name}", None))
        else:       # the kinds go into the label: a Parameter or a NumPy scalar differs
            out.append((f"{what} of {name} (a {type(g).__name__} of "
                        f"{type(g.data).__name__})", np.array(g.data)))
    return out


def _mutable(x):
    return isinstance(x, (Variable, np.ndarray, list, dict))


def _known_objects(named):
    """(object, name) of what existed before the call: each named object, and the .data
    and .grad of the Variables among them."""
    known = []
    for name, w in named:
        known.append((w, name))
        if isinstance(w, Variable):
            known.append((w.data, f"{name}.data"))
            known.append((w.grad, f"{name}.grad"))
    return known


def _identities(out, known):
    """Per object of a result tree (each leaf and container, and each Variable's .data),
    what it is: a known object by name, the object of an earlier place, or None (a new
    object). Two calls agree on identity when these lists are equal."""
    from tracejit.runtime.checking import leaves_with_paths
    places = []
    for path, x in leaves_with_paths(out, containers=True):
        places.append((path, x))
        if isinstance(x, Variable) and x.data is not None:
            places.append((f"{path}.data", x.data))
    first, idents = {}, []
    for path, x in places:
        name = next((n for k, n in known if k is x and x is not None), None)
        if name is None and _mutable(x):    # identity matters for mutable ones
            same = first.setdefault(id(x), path)
            name = f"the object of {same}" if same != path else None
        idents.append((path, name))
    return idents


def _values(obj, path):
    """(path, kind, value, creator) of each leaf of a tree, as a result is compared."""
    from tracejit.runtime.checking import leaves_with_paths
    out = []
    for p, y in leaves_with_paths(obj, path):
        if isinstance(y, Variable):
            value = None if y.data is None else np.array(y.data)
            creator = y.creator is not None if _is_float(y.data) else None
        elif isinstance(y, np.ndarray):
            value, creator = np.array(y), None
        else:
            value, creator = y, None
        out.append((p, type(y), value, creator))
    return out


def _state_record(state):
    """A state tree after the call: its leaves' values and its Variables' gradients."""
    from tracejit.runtime.checking import leaves_with_paths
    if state is None:
        return [], []
    values = [(p, t, v, None) for p, t, v, _ in _values(state, "state")
              if issubclass(t, (Variable, np.ndarray, np.generic, int, float, complex))
              or v is None]
    grads = _grads_of([(p, y) for p, y in leaves_with_paths(state, "state")
                       if isinstance(y, Variable)], "gradient")
    return values, grads


def _results_and_grads(fn, args, seed, params=(), second_order=False, as_variables=True,
                       context=None, backward=True, creators="always", captures=None,
                       state=None, kwargs=None):
    return _run_call(fn, args, seed, params, second_order, as_variables, context, backward,
                     creators, captures, state, kwargs)[0]


def _run_call(fn, args, seed, params=(), second_order=False, as_variables=True,
              context=None, backward=True, creators="always", captures=None,
              state=None, kwargs=None, copy=True):
    """What a call gives, in terms two calls on different copies can compare: per
    result leaf (path, kind, value, creator), the identities of the result's objects,
    the results' containers, the gradients of the arguments, params, captures and state
    (and their second order), the params' data and the state after the call.
    as_variables: float ndarray arguments are passed as Variables of them."""
    from tracejit.runtime.checking import leaves_with_paths
    kwargs = dict(kwargs or {})
    given = list(args) + list(kwargs.values())
    copied = _copy_args(given) if copy else given
    args, kwargs = copied[:len(args)], dict(zip(kwargs, copied[len(args):]))
    wrt = [Variable(a) if as_variables and isinstance(a, np.ndarray) and _is_float(a)
           else a for a in args]
    captures = dict(captures or {})
    state_named = [] if state is None else \
        [(p, y) for p, y in leaves_with_paths(state, "state", containers=True)]
    named_before = [(f"argument {k}", w) for k, w in enumerate(wrt)] + \
        [(f"argument {k!r}", w) for k, w in kwargs.items()] + \
        [(f"params[{k}]", p) for k, p in enumerate(params)] + \
        [(f"captures[{k!r}]", c) for k, c in captures.items()] + state_named
    known = _known_objects(named_before)
    if context is None:
        out = fn(*wrt, **kwargs)
    else:
        with context:
            out = fn(*wrt, **kwargs)
    # What exists after the call is known too (a .grad the call set, a .data it
    # rebound): named so only when it is not an object from before the call.
    known += [(x, f"{n} after the call") for x, n in _known_objects(named_before)]
    # the arguments after the call: an in-place update of one is eager's
    updated = [_after_the_call(f"argument {k}", w.data if isinstance(w, Variable) else w)
               for k, w in list(enumerate(wrt)) + list(kwargs.items())
               if isinstance(w, (Variable, np.ndarray))]
    structure = _containers(out)
    identities = _identities(out, known)
    results = _values(out, "output")
    if creators != "always" and not any(isinstance(w, Variable) and _is_float(w.data)
                                        for w in wrt + list(kwargs.values())):
        results = [(p, t, v, None) for p, t, v, _ in results]
    leaves = leaves_with_paths(out)
    cot_rng = np.random.default_rng(seed)
    loss = None
    for path, y in leaves:
        if isinstance(y, Variable) and _is_float(y.data):
            c = np.asarray(cot_rng.standard_normal(y.shape), dtype=y.dtype)
            term = F.sum(y * c)
            loss = term if loss is None else loss + term
    named = [(f"argument {k}", w) for k, w in enumerate(wrt)] + \
        [(f"argument {k!r}", w) for k, w in kwargs.items()] + \
        [(f"params[{k}]", p) for k, p in enumerate(params)] + \
        [(f"captures[{k!r}]", c) for k, c in captures.items()]
    grads = []
    if backward:
        if loss is not None:
            loss.backward(create_graph=second_order)
        grads = _grads_of(named, "gradient")
        if second_order:
            firsts = [w.grad if isinstance(w, Variable) else None for _, w in named]
            for _, w in named:
                if isinstance(w, Variable):
                    w.cleargrad()
            total = None
            for g in firsts:
                if g is not None and g.dtype.kind == "f":
                    term = F.sum(g * g)
                    total = term if total is None else total + term
            if total is not None:
                total.backward()
            grads += _grads_of(named, "second-order gradient")
    grads += updated + [_after_the_call(f"params[{k}].data", p.data)
                        for k, p in enumerate(params)]
    state_values, state_grads = _state_record(state)
    grads += state_grads
    return (results + state_values, grads, structure, identities), out


def _assert_results_match(got, want, rtol, atol, what, identity=True):
    (got_res, got_grads, got_struct, got_ids) = got
    (want_res, want_grads, want_struct, want_ids) = want
    for g, w in zip(got_struct + [None], want_struct + [None]):
        if g != w:
            g = g or ("output", type(None), None)
            w = w or ("output", type(None), None)
            again = [(side, x[2][1]) for side, x in (("jit", g), ("eager", w))
                     if isinstance(x[2], tuple)]
            if again:       # one side returns a container met before, the other a new one
                side, first = again[0]
                raise AssertionError(f"{what}: {w[0]}: {side} gives the object of {first} "
                                     f"again, {'eager' if side == 'jit' else 'jit'} a "
                                     f"different one")
            raise AssertionError(f"{what}: {w[0]}: jit gave a {g[1].__name__} of {g[2]}, "
                                 f"eager a {w[1].__name__} of {w[2]}")
    got_paths = [r[0] for r in got_res]
    want_paths = [r[0] for r in want_res]
    if got_paths != want_paths:
        raise AssertionError(f"{what}: jit returned the leaves {got_paths}, eager "
                             f"{want_paths}")
    for (path, gi), (_, wi) in zip(got_ids, want_ids):
        if identity and gi != wi:
            raise AssertionError(f"{what}: {path}: jit gave {gi or 'a new object'}, eager "
                                 f"{wi or 'a new object'}")
    for (path, gt, gv, gc), (_, wt, wv, wc) in zip(got_res, want_res):
        where = f"{what}: {path}"
        if gt is not wt:
            raise AssertionError(f"{where}: jit gave a {gt.__name__}, eager a {wt.__name__}")
        if gc != wc:
            raise AssertionError(f"{where}: jit's result {'has' if gc else 'has no'} "
                                 f"creator, eager's {'has' if wc else 'has none'}")
        if isinstance(wv, (np.ndarray, np.generic, float, complex)) or wv is None:
            _assert_close(gv, wv, rtol, atol, where)
        elif not (gv == wv):
            raise AssertionError(f"{where}: jit gave {gv!r}, eager {wv!r}")
    if len(got_grads) != len(want_grads):
        raise AssertionError(f"{what}: jit gave {[g[0] for g in got_grads]}, eager "
                             f"{[w[0] for w in want_grads]}")
    for (label, g), (want_label, w) in zip(got_grads, want_grads):
        if label != want_label:
            raise AssertionError(f"{what}: jit gave {label}, eager {want_label}")
        _assert_close(g, w, rtol, atol, f"{what}: {label}")


def _assert_close(got, want, rtol, atol, what):
    if got is None or want is None:
        if got is not want:
            raise AssertionError(f"{what}: jit gave {got!r}, eager gave {want!r}")
        return
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape or got.dtype != want.dtype:
        raise AssertionError(f"{what}: jit gave {got.dtype}{list(got.shape)}, eager "
                             f"{want.dtype}{list(want.shape)}")
    if want.dtype.kind in "fc":
        ok = np.isclose(got, want, rtol=rtol, atol=atol, equal_nan=True)
    else:
        ok = np.asarray(got == want)
    if not np.all(ok):
        i = np.unravel_index(np.argmin(ok), ok.shape) if ok.ndim else ()
        raise AssertionError(f"{what}: differs at {tuple(int(k) for k in i)}: jit "
                             f"{got[i]!r}, eager {want[i]!r} (rtol={rtol}, atol={atol})")
