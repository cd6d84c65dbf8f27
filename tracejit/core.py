"""The eager define-by-run core: Variable, Function, Config and the backward pass.

This is the bottom layer of tracejit (eager -> trace -> IR -> passes -> codegen).
It mirrors DeZero's core. The active trace (a TraceHooks: the methods core calls on
it) sees what happens while tracing: `Function.__call__` reports every primitive call
to it, and `Variable.data` (a property) hands out a recording view of the array, so
Python code that inspects values (`if v.data > 0`) becomes a guard instead of a frozen
constant. When no trace is active each hook costs one thread-local attribute read.
"""
import contextlib
import heapq
import itertools
import math
import threading
import weakref

import numpy as np


class _Mode:
    """What a jitted call must know of its thread: may jit run (no trace active, jit
    not switched off), Config.enable_backprop, Config.train. One object per
    combination, so the hot path compares one thread-local read by identity."""

    __slots__ = ("compiled", "backprop", "train", "grad", "nograd")

    def __repr__(self):
        return f"mode(compiled={self.compiled}, backprop={self.backprop}, train={self.train})"


_MODES = {}
for _c in (False, True):
    for _b in (False, True):
        for _t in (False, True):
            _m = _MODES[_c, _b, _t] = _Mode()
            _m.compiled, _m.backprop, _m.train = _c, _b, _t
for _m in _MODES.values():
    # The same mode with grad on / off: the backward steps switch enable_backprop
    # without the cost of reading the other fields again.
    _m.grad, _m.nograd = _MODES[_m.compiled, True, _m.train], _MODES[_m.compiled, False, _m.train]


def call_mode(compiled, backprop, train):
    """The mode object of (jit may run, Config.enable_backprop, Config.train)."""
    return _MODES[bool(compiled), bool(backprop), bool(train)]


class _ThreadState(threading.local):
    # Per thread: DeZero's Config, the active tracing.Trace (None: eager), and whether
    # jit is switched off (tj.disable_jit). Thread-local so that one thread tracing, or
    # in no_grad(), never changes what another thread records or computes. `mode` sums
    # up the other four: whoever writes one of them updates it (set_backprop, refresh_mode).
    enable_backprop = True
    train = True
    trace = None
    jit_off = False
    mode = call_mode(True, True, True)
    # The float64 twin's rounding probe (runtime/checking.float32_noise): called with
    # each Function's input arrays and output Variables. Thread-local: only the
    # checking thread's eager runs are probed.
    round_hook = None

    def set_backprop(self, value):
        # Only the grad field of the mode changes: no need to read the others again.
        self.enable_backprop = value
        self.mode = self.mode.grad if value else self.mode.nograd

    def refresh_mode(self):
        self.mode = call_mode(self.trace is None and not self.jit_off,
                              self.enable_backprop, self.train)


_state = _ThreadState()


def set_trace(trace):
    """Make `trace` (a TraceHooks, or None: eager) this thread's active trace; returns
    the previous one."""
    if trace is not None and not isinstance(trace, TraceHooks):
        # Checked once here, so the hooks core calls on every op need no probing.
        raise TypeError(f"set_trace: expected a TraceHooks or None, got "
                        f"{type(trace).__name__}")
    prev = _state.trace
    _state.trace = trace
    _state.refresh_mode()
    return prev


class _ConfigType(type):
    # Config.enable_backprop reads and writes a per-thread value: one thread's
    # no_grad() (or a trace's backward) never switches gradients off in another.
    @property
    def enable_backprop(cls):
        return cls._local.enable_backprop

    @enable_backprop.setter
    def enable_backprop(cls, value):
        cls._local.set_backprop(value)

    @property
    def train(cls):
        return cls._local.train

    @train.setter
    def train(cls, value):
        cls._local.train = value
        cls._local.refresh_mode()


class Config(metaclass=_ConfigType):
    """DeZero's Config: `Config.enable_backprop`, `Config.train` (per thread)."""

    _local = _state


@contextlib.contextmanager
def using_config(name, value):
    old_value = getattr(Config, name)
    setattr(Config, name, value)
    try:
        yield
    finally:
        setattr(Config, name, old_value)


def no_grad():
    return using_config("enable_backprop", False)


def test_mode():
    return using_config("train", False)


def active_trace():
    return _state.trace


class TraceHooks:
    """The protocol between core and the active trace (set_trace): every method core
    calls on `_state.trace`, which is None (eager) or an instance of a subclass.

    tracejit.trace.record.Trace records a graph while the function computes its real
    result; tracejit.trace.abstract._AbstractTrace (eval_shape) computes shapes alone.
    Core sits below both, so the protocol is declared here, where its caller is. The
    `abstract` flag chooses what Function.__call__ does: True, the trace takes the call
    over (call); False, forward runs on real data and the trace records it
    (before_forward, record). Every other hook applies to both kinds. Core calls the
    hooks only while this trace is active; the eager path reads one thread-local.
    """

    # Plain methods, not abc: isinstance on an ABCMeta class costs more, and
    # tests/trace/test_traced_value_protocol.py checks that each trace implements its hooks.
    abstract = False

    def new_variable(self, var, data):
        """Variable(data) made while tracing (its other fields are set, `_data` is None):
        store the data in var._data (an ndarray, not a tracer view) and give var its
        place in the trace. Returns nothing."""
        raise NotImplementedError

    def read_data(self, var):
        """`var.data` read while tracing (var._data is not None): returns what the user
        sees, a view that records what Python and NumPy do with it (or, abstract, one
        that has a shape and no values)."""
        raise NotImplementedError

    def write_data(self, var, value):
        """`var.data = value` while tracing (an np.generic already made a 0-d array):
        returns the array core stores in var._data."""
        raise NotImplementedError

    def read_grad(self, var):
        """`var.grad` read while tracing: returns the gradient the user sees (var._grad,
        or what the trace knows of it)."""
        raise NotImplementedError

    def write_grad(self, var, value):
        """`var.grad = value` while tracing, before core stores value in var._grad.
        Returns nothing."""
        raise NotImplementedError

    def literal(self, var, value):
        """A plain Python number `value` became the Constant `var`, an operand of an
        array operator (x * 2.0): the trace may record it as a literal. Returns
        nothing."""
        raise NotImplementedError

    def scalar_input(self, value, like_dtype):
        """A traced Python number (ScalarTracer) is an operand of arrays of dtype
        like_dtype (x * float(m)): returns the Variable to use, of the dtype NumPy 2
        gives for a Python scalar there (weak: a float32 array stays float32)."""
        raise NotImplementedError

    def before_forward(self, fn):
        """(abstract False) Function fn's forward is about to run: returns a token
        (fn's state, or None) that core hands back to record()."""
        raise NotImplementedError

    def record(self, fn, inputs, outputs, before):
        """(abstract False) fn's forward ran: `inputs` are its input Variables,
        `outputs` the fresh output Variables (made through new_variable, no creator
        yet), `before` what before_forward returned. Returns nothing."""
        raise NotImplementedError

    def call(self, fn, inputs):
        """(abstract True) Function fn is called on the input Variables `inputs`,
        instead of its forward: returns what Function.__call__ returns (one output
        Variable, or a list of them)."""
        raise NotImplementedError

    def backward_of(self, fn, deferrable=False):
        """backprop is about to run fn's backward step (None: the backward pass ended):
        for what the trace reports about the lines it records. Returns True to leave
        fn's step out of this walk (a Function from before the call, in the caller's
        graph; only when `deferrable`, a walk keeping gradients in .grad): backprop then
        hands the Functions left out to backward_outside once the walk is done."""
        raise NotImplementedError

    def backward_outside(self, fns, retain_grad, create_graph):
        """A backward inside the traced function reached the Functions `fns` from
        before the call (backward_of returned True for them), its own walk is done:
        the trace goes on into the caller's graph as eager's walk would. Returns
        nothing."""
        raise NotImplementedError

    def input_grads(self, fn, gys, retain_grad=False):
        """fn's backward on its outputs' gradients `gys` while tracing, in a walk with
        `retain_grad`: returns one gradient (or None) per input of fn, as
        core._input_grads does eagerly."""
        raise NotImplementedError

    def unchaining(self, var, backward):
        """var.unchain_backward() (backward) or var.unchain() is about to run while
        tracing: a cut of Variables from outside the call is an effect on the caller's
        graph that compiled calls repeat. Returns nothing."""
        raise NotImplementedError


# Kinds of primitive, read by the optimizer and the code generator.
ELEMENTWISE = "elementwise"
REDUCTION = "reduction"
MOVEMENT = "movement"
MATMUL = "matmul"
RANDOM = "random"
OPAQUE = "opaque"


class Variable:
    """An ndarray with an autodiff history (DeZero's Variable)."""

    __slots__ = ("_data", "name", "_grad", "creator", "generation", "_tv", "__weakref__")
    __array_priority__ = 200

    def __init__(self, data, name=None):
        if data is not None:
            if not isinstance(data, np.ndarray):
                raise TypeError(
                    f"Variable data must be a numpy.ndarray or None, got {type(data).__name__}"
                    " (wrap scalars with np.array(...))")
            if data.dtype.kind in "OUSV":
                # strings, objects and records: no op computes on them (NumPy's own
                # error would come from deep inside an op, or a numba kernel).
                raise TypeError(f"Variable data has dtype {data.dtype}; tracejit supports "
                                "numeric and bool arrays only")
        self._tv = None
        self._data = None
        self._grad = None
        self.name = name
        self.creator = None
        self.generation = 0
        tr = _state.trace
        if tr is None:
            self._data = data
        else:
            tr.new_variable(self, data)

    @property
    def grad(self):
        tr = _state.trace
        if tr is None:
            return self._grad
        return tr.read_grad(self)

    @grad.setter
    def grad(self, value):
        tr = _state.trace
        if tr is not None:
            tr.write_grad(self, value)
        self._grad = value

    @property
    def data(self):
        tr = _state.trace
        if tr is None or self._data is None:
            return self._data
        return tr.read_data(self)

    @data.setter
    def data(self, value):
        if isinstance(value, np.generic):
            # `x.data = x.data - g` on a 0-d array gives a NumPy scalar: keep an array.
            value = np.asarray(value)
        tr = _state.trace
        if tr is not None:
            value = tr.write_data(self, value)
        self._data = value

    # A Variable whose data is None (DeZero allows it) has no shape or value: asked for
    # one, a NoDataError naming it (an AttributeError too, as DeZero's x.shape gives).
    @property
    def shape(self):
        try:
            return self._data.shape
        except AttributeError:
            raise self._no_data(".shape") from None

    @property
    def ndim(self):
        try:
            return self._data.ndim
        except AttributeError:
            raise self._no_data(".ndim") from None

    @property
    def size(self):
        try:
            return self._data.size
        except AttributeError:
            raise self._no_data(".size") from None

    @property
    def dtype(self):
        try:
            return self._data.dtype
        except AttributeError:
            raise self._no_data(".dtype") from None

    def _no_data(self, what):
        if self._data is not None:      # not ours to explain
            return AttributeError(f"{type(self._data).__name__} data has no {what}")
        what = f"has no {what}" if what.startswith(".") else f"cannot be used in {what}"
        return NoDataError(f"{_described(self)} whose data is None {what} (assign an array "
                           f"to .data before using it)")

    def __len__(self):
        if self._data is None:
            raise self._no_data("len()")
        return len(self._data)

    def __repr__(self):
        if self._data is None:
            return "variable(None)"
        p = str(self._data).replace("\n", "\n" + " " * 9)
        return "variable(" + p + ")"

    # Python looks at a value: while tracing, `self.data` records a guard.
    def __bool__(self):
        if self._data is None:
            raise self._no_data("bool()")
        return bool(self.data)

    def __float__(self):
        if self._data is None:
            raise self._no_data("float()")
        return float(self.data)

    def __int__(self):
        if self._data is None:
            raise self._no_data("int()")
        return int(self.data)

    def __index__(self):
        if self._data is None:
            raise self._no_data("use as an index")
        return self.data.__index__()

    # math.floor/ceil of a Variable are those of its data (float() of it, as they
    # were through __float__): while tracing, a recorded int, not a value guard.
    # (round() and math.trunc stay TypeErrors, as in DeZero.)
    def __floor__(self):
        if self._data is None:
            raise self._no_data("math.floor")
        return math.floor(self.data)

    def __ceil__(self):
        if self._data is None:
            raise self._no_data("math.ceil")
        return math.ceil(self.data)

    def set_creator(self, func):
        self.creator = func
        self.generation = func.generation + 1

    def cleargrad(self):
        self.grad = None

    def unchain(self):
        tr = _state.trace
        if tr is not None:
            tr.unchaining(self, False)
        _creator_slot.__set__(self, None)    # reported above (not again by the trace's
                                             # Variable.creator: trace.record)

    def unchain_backward(self):
        tr = _state.trace
        if tr is not None:
            tr.unchaining(self, True)
        if self.creator is None:
            return
        if isinstance(self.creator, RegionFunction):
            # A compiled call: the root keeps its creator, whose inputs eager unchains,
            # inside the call: its eager graph takes its place.
            self.creator.expand()
        _unchain_walk(list(self.creator.inputs), {self.creator})

    def backward(self, retain_grad=False, create_graph=False):
        if self.grad is None:
            d = self._data
            if d is None:
                raise self._no_data("backward")
            # np.ones_like costs 1.5 us; a 0-d seed (a loss) is the common case.
            # With create_graph a Constant: a later backward through the graph that
            # reads the seed must not give the seed a gradient (a cycle; see Constant).
            # Else a Variable, as in DeZero: backward passes it through unchanged to
            # x.grad (y = x + 1) and retain_grad keeps it as y.grad, where the user
            # sees its type; no graph reads it, so no cycle can form through it.
            seed = np.array(1, d.dtype) if d.ndim == 0 else np.ones_like(d)
            if d.ndim and _state.trace is not None and not _state.trace.abstract:
                # Traced: a node on y's value, laid out as y's data is at each call
                # (np.ones_like keeps its memory order), not a constant laid out as it
                # was when traced.
                seed = np.ones_like(self.data)
            g = Constant(seed) if create_graph else Variable(seed)
            if d.ndim and _state.trace is not None and not _state.trace.abstract:
                # (The Variable the seed's value is made as: a view of it, `y.grad.data.T`,
                # is rebuilt on it as on a node's output.)
                _state.trace.owner.setdefault(id(g._tv), g)
            self.grad = g
        if self.creator is not None:
            backprop([self], retain_grad=retain_grad, create_graph=create_graph)

    # Methods DeZero users call; the operators are attached by tracejit.functions.
    def reshape(self, *shape):
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = shape[0]
        from tracejit import functions as F
        return F.reshape(self, shape)

    def transpose(self, *axes):
        if len(axes) == 0:
            axes = None
        elif len(axes) == 1 and (isinstance(axes[0], (tuple, list)) or axes[0] is None):
            axes = axes[0]
        from tracejit import functions as F
        return F.transpose(self, axes)

    @property
    def T(self):
        from tracejit import functions as F
        return F.transpose(self)

    def sum(self, axis=None, keepdims=False):
        from tracejit import functions as F
        return F.sum(self, axis, keepdims)

    def mean(self, axis=None, keepdims=False):
        from tracejit import functions as F
        return F.mean(self, axis, keepdims)

    def max(self, axis=None, keepdims=False):
        from tracejit import functions as F
        return F.max(self, axis, keepdims)

    def min(self, axis=None, keepdims=False):
        from tracejit import functions as F
        return F.min(self, axis, keepdims)

    def astype(self, dtype):
        from tracejit import functions as F
        return F.cast(self, dtype)

    def to_cpu(self):
        # Data is always a NumPy array already (DeZero converts a CuPy one here).
        return self

    def to_gpu(self):
        from tracejit import cuda
        raise cuda.no_gpu("Variable.to_gpu")


def _unchain_walk(todo, seen):
    """unchain_backward's walk: unchain every Variable in todo and every one upstream of
    them (the inputs of the Functions they come from, recursively), compiled calls cut
    as the Functions they stand for. (Also a compiled call's repeat of a cut that an
    unchain_backward inside the function made of the caller's Variables.)"""
    reached = {}        # compiled call -> the output slots the walk reached it by
    while todo:
        x = todo.pop()
        f = x.creator
        if f is None:
            continue
        if isinstance(f, RegionFunction):
            # Reached through one of a compiled call's outputs: the walk goes on to
            # the inputs that output comes from; what to cut inside the call waits
            # for every output the walk reaches it by (RegionFunction.finish_cut).
            r = f.reach(x)
            if r is not None:
                reached.setdefault(f, []).append(r[0])
                x.creator = None
                todo.extend(r[1])
                continue
            f = x.creator            # expanded: x's creator in the call's eager graph
        if f not in seen:
            seen.add(f)
            todo.extend(f.inputs)
        # Not x.unchain(): under a trace that is a cut the function asked for itself.
        x.creator = None
    for f, slots in reached.items():
        f.finish_cut(slots)


def repeat_cut(kind, xs):
    """A compiled call repeats a cut its function made of the caller's Variables (the
    trace's unchain events, in their order): "root", xs[0].unchain_backward(); "walk",
    the Variables an unchain_backward inside the function reached through the call's
    own graph, unchained with everything upstream; "unchain", x.unchain() each."""
    if kind == "root":
        xs[0].unchain_backward()
    elif kind == "walk":
        _unchain_walk(list(xs), set())
    else:
        for x in xs:
            x.creator = None


def backward_from(xs, retain_grad=False, seeds=()):
    """Go on with a backward from the Variables xs, whose .grad holds what a walk
    that stopped at them gave them (a compiled call's backward inside the function,
    reaching into the caller's graph from its arguments and captured Variables): one
    walk from all of them, as eager's from the loss would go on. seeds: per x, the
    array that walk left in its .grad (None: the .grad it has)."""
    for x, g in zip(xs, seeds):
        if g is not None:
            x._grad = wrap_array(g)
    roots = [x for x in xs if x.creator is not None]
    if roots:
        # (create_graph: the trace refuses it, the seeds have no history here.)
        backprop(roots, retain_grad=retain_grad)


def graph_reach(xs, inputs_only=False):
    """id -> Variable, for the Variables a backward from xs can read or change the
    .grad of: xs and the inputs and (live) outputs of every Function upstream of them
    (inputs_only: those Functions' inputs alone, the ones it adds to)."""
    found = {} if inputs_only else {id(x): x for x in xs}
    todo, seen = [x.creator for x in xs], set()
    while todo:
        f = todo.pop()
        if f is None or id(f) in seen:
            continue
        seen.add(id(f))
        if not inputs_only:
            for r in getattr(f, "outputs", ()):
                y = r()
                if y is not None:
                    found.setdefault(id(y), y)
        for x in getattr(f, "inputs", ()):
            found.setdefault(id(x), x)
            todo.append(x.creator)
    return found


def walk_keeps_dtype(reach, dtype):
    """Whether a backward over the Variables `reach` (graph_reach's) leaves a leaf's
    .grad of float dtype `dtype` that dtype: each Function there is tracejit's (a user
    Function's backward may give any dtype) and every array there (data, .grad) is one
    whose gradients, added to it, keep it: for float64 any real number of at most 64
    bits (no complex, no long double), for float32 float32 and float16. A compiled call
    reading such a .grad after the walk (Trace._walk_read) runs the rest of its graph
    for that dtype."""
    dtype = np.dtype(dtype)
    if dtype == np.float64:
        def keeps(a):
            return a.dtype.kind in "biuf" and a.dtype.itemsize <= 8
    elif dtype == np.float32:
        def keeps(a):
            return a.dtype == np.float32 or a.dtype == np.float16
    else:
        return False
    for x in reach.values():
        a = x._data
        if a is None or not keeps(a):
            return False
        g = x._grad
        if g is not None and (g._data is None or not keeps(g._data)):
            return False
        f = x.creator
        if f is not None and not type(f).__module__.startswith("tracejit."):
            return False
    return True


def region_between(roots, leaves):
    """The Functions between `roots` and `leaves` (not past them)."""
    stop = {id(x) for x in leaves}
    region, todo = set(), [y.creator for y in roots]
    while todo:
        f = todo.pop()
        if f is None or f in region:
            continue
        region.add(f)
        todo.extend(x.creator for x in f.inputs if id(x) not in stop)
    return region

def fit_generations(adopted, boundary):
    """Renumber the replay's Functions behind the adopted results so each result's new
    creator comes before the Functions the caller made of it before the replay (their
    generations are at least the result's old one). The old generation is a bound
    on eager's (a compiled call's: from its graph's depth, Variant.output_depths),
    which a node that replays as several eager Functions (a user backward with
    per-call state, run under create_graph) exceeds; a UserGrad's is its own + 1.
    Each Function gets the replay's inputs' generation plus its longest chain from
    them times a step (a fraction) small enough that every adopted result's creator
    stays below the result's old generation; each result keeps its old one.
    boundary: ids of the replay's input Variables (the caller's graph)."""
    funcs, base, todo = {}, 0, [mine.creator for mine, _ in adopted]
    while todo:
        f = todo.pop()
        if id(f) in funcs:
            continue
        funcs[id(f)] = f
        for x in f.inputs:
            if x.creator is None or id(x) in boundary:
                base = max(base, x.generation)
            else:
                todo.append(x.creator)
    # The replay's generations already order it (each Function above its inputs'
    # creators): in that order, each Function's longest chain.
    rank = {}
    for f in sorted(funcs.values(), key=lambda f: f.generation):
        rank[id(f)] = 1 + max([rank.get(id(x.creator), 0) for x in f.inputs
                               if x.creator is not None and id(x) not in boundary],
                              default=0)
    room = [(old - base) / (rank[id(mine.creator)] + 1) for mine, old in adopted]
    if min(room) <= 0:
        return      # (not reached: a result's old generation is above the call's inputs')
    step = min(room)
    for f in funcs.values():
        f.generation = base + rank[id(f)] * step
        for r in f.outputs:
            y = r()
            if y is not None:
                y.generation = f.generation + step
    for mine, old in adopted:
        mine.generation = old


def wrap_array(data, creator=None):
    """A Variable for a trusted fresh ndarray, skipping __init__'s checks (the
    compiled call's outputs: the hot path of a jitted call)."""
    v = _new_variable(Variable)
    v._data = data
    v._tv = None
    v._grad = None
    v.name = None
    if creator is None:
        v.creator = None
        v.generation = 0
    else:
        v.creator = creator
        v.generation = creator.generation + 1
    return v


_new_variable = object.__new__


class _AttrGrads:
    """Gradients kept in `.grad` (a plain backward)."""

    @staticmethod
    def get(v):
        return v.grad

    @staticmethod
    def set(v, g):
        v.grad = g


class DictGrads(dict):
    """Gradients kept aside, keyed by id(Variable) (the tracer's backward, grad())."""

    def get(self, v):
        entry = dict.get(self, id(v))
        return None if entry is None else entry[1]

    def set(self, v, g):
        self[id(v)] = (v, g)


def backprop(outputs, retain_grad=False, create_graph=False, grads=None, within=None):
    """Run backward from `outputs`, whose gradients are already in `grads`.

    Functions are visited through a heap keyed by -generation: newest first, each
    pushed once, O(log n) per push instead of DeZero's sort per insertion. `within`,
    if given, is the set of functions to walk (a compiled region's own nodes).
    """
    store = _AttrGrads if grads is None else grads
    tr = _state.trace
    if len(outputs) == 1 and tr is None:
        f = outputs[0].creator
        if f is not None and within is None and all(x.creator is None for x in f.inputs):
            # One function whose inputs are leaves (a compiled call's output, a single
            # op): no ordering to do, so no heap.
            if grads is None and not create_graph:
                _plain_backward_step(f, retain_grad, outputs[0])
            else:
                _backward_step(f, store, create_graph, retain_grad, {id(outputs[0])})
            return
    order = itertools.count()
    heap = []
    seen = set()
    # The Variables this walk reached (its roots, those it gave a gradient) among a
    # compiled call's outputs: only those start the call's backward (RegionFunction.
    # reached_grads), as eager's walk only enters the part of the call behind them.
    reached = {id(y) for y in outputs}

    def push(c):
        if c is not None and c not in seen and (within is None or c in within):
            seen.add(c)
            heapq.heappush(heap, (-c.generation, next(order), c))

    for y in outputs:
        push(y.creator)
    outside = []
    deferrable = grads is None and within is None
    while heap:
        f = heapq.heappop(heap)[2]
        if tr is not None and tr.backward_of(f, deferrable):
            # A Function of the caller's graph, reached from a traced call: the trace
            # walks on from there once its own part is done (backward_outside). The
            # Functions from before the call come after every one of the call's that
            # gives them a gradient (their outputs' generations are lower), so one walk
            # of the call's part, then one of the caller's, is eager's one walk.
            # (Gradients kept aside stop there: Trace.backward_of.)
            if deferrable:
                outside.append(f)
            continue
        for x in _backward_step(f, store, create_graph, retain_grad, reached):
            c = x.creator
            if c is not None and isinstance(c, RegionFunction):
                reached.add(id(x))
            push(c)
    if tr is not None:
        tr.backward_of(None)
        if outside:
            tr.backward_outside(outside, retain_grad, create_graph)


def _input_grads(f, gys):
    """f.backward(*gys) as a tuple with one entry per input of f."""
    gxs = f.backward(*gys)
    if not isinstance(gxs, tuple):
        gxs = (gxs,)
    if len(gxs) != len(f.inputs):
        raise ValueError(f"{type(f).__name__}.backward returned {len(gxs)} gradients "
                         f"for {len(f.inputs)} inputs")
    return gxs


def _plain_backward_step(f, retain_grad, root):
    """_backward_step for the commonest case, `loss.backward()` on a compiled call's
    output, outside any trace: gradients live in `._grad`, no graph is built. root:
    the one Variable the walk starts from."""
    if retain_grad and f.sets_output_grads or f.stale:
        return _backward_step(f, _AttrGrads, False, retain_grad, {id(root)})
    gys = []
    for r in f.outputs:
        y = r()
        g = None if y is None else y._grad
        if g is None or (y is not root and isinstance(f, RegionFunction)):
            # Zeros to make, or another result's .grad, which this walk did not give
            # (the call's backward decides whether eager's walk would read it).
            return _backward_step(f, _AttrGrads, False, retain_grad, {id(root)})
        gys.append(g)
    local = Config._local
    old_mode = local.enable_backprop
    local.set_backprop(False)      # not Config's setter: a metaclass property costs more
    try:
        for x, gx in zip(f.inputs, _input_grads(f, gys)):
            if gx is not None and type(x) is not Constant:
                if type(gx) is not Variable:
                    gx = as_variable(gx)
                old = x._grad
                x._grad = gx if old is None else old + gx
    finally:
        local.set_backprop(old_mode)
    if not retain_grad:
        for r in f.outputs:
            y = r()
            if y is not None:
                y._grad = None


def _backward_step(f, store, create_graph, retain_grad, reached=None):
    """Call f.backward on its outputs' gradients, accumulate into its inputs' gradients;
    return the inputs that received one. reached: ids of the Variables the walk
    reached so far (backprop's), for a compiled call's outputs."""
    region = reached is not None and isinstance(f, RegionFunction)
    gys = f.reached_grads(store, reached) if region else f.output_grads(store)
    local = Config._local
    old_mode = local.enable_backprop
    local.set_backprop(create_graph)
    given = []
    tr = local.trace
    try:
        # While tracing, the trace decides how f's backward is recorded (a user
        # Function with per-call state becomes one opaque backward node).
        ogs = None
        if tr is not None:
            gxs = tr.input_grads(f, gys, retain_grad)
        elif retain_grad and f.sets_output_grads:
            gxs, ogs = f.backward_retaining(gys)
        else:
            gxs = _input_grads(f, gys)
        for x, gx in zip(f.inputs, gxs):
            if gx is not None and type(x) is not Constant:
                gx = as_variable(gx)
                old = store.get(x)
                store.set(x, gx if old is None else old + gx)
                given.append(x)
    finally:
        local.set_backprop(old_mode)
    if ogs is not None:
        # Each result's gradient is the whole cotangent through it, as eager's
        # intermediate keeps it (an unreached one keeps what it had).
        for ref, g in zip(f.outputs, ogs):
            y = ref()
            if y is not None and g is not None:
                store.set(y, g)
    if not retain_grad:
        for y, g in zip(f.outputs, gys):
            y = y()
            # (A compiled call's output eager's walk does not reach keeps its .grad.)
            if y is not None and (g is not None or not region):
                store.set(y, None)
    return given


# The slot itself: unchain() writes it past the descriptor a trace puts in its place
# (trace.record._TracedCreator), having told the trace already.
_creator_slot = Variable.__dict__["creator"]


class Parameter(Variable):
    __slots__ = ()


class Constant(Variable):
    """An operand the user passed as a number or an ndarray (`x * 2.0`, `x + arr`),
    wrapped by the op. Nothing can read its gradient, so backward stores none: a
    create_graph gradient there (whose creator reaches the graph that reads the
    constant) would be a reference cycle no one can clear, which DeZero leaks."""

    __slots__ = ()


class ScalarTracer:
    """Base of tracejit.trace.values.TracedScalar (a Python number while tracing): the
    type test core, functions and autodiff use. Declared here, below the tracer, so
    they need not probe attributes (`_tv` is also a Variable's, or any user object's)."""

    __slots__ = ()


def static_value(v, what="a static argument (an axis, shape, index or bound)"):
    """v with the traced Python numbers in it (int(...) as an axis, in a slice, a
    shape) replaced by their values, each guarded: static parameters of the graph."""
    if isinstance(v, ScalarTracer):
        return v._seen(what)
    t = type(v)
    if t is tuple or t is list:
        return t(static_value(x, what) for x in v) if any(
            isinstance(x, (ScalarTracer, tuple, list, slice)) for x in v) else v
    if t is slice:
        return slice(static_value(v.start, what), static_value(v.stop, what),
                     static_value(v.step, what))
    return v


def as_array(x, array_module=np):
    if np.isscalar(x):
        return np.array(x)
    return x


def as_variable(obj):
    if isinstance(obj, Variable):
        return obj
    if isinstance(obj, np.ndarray):
        return Variable(obj)
    raise TypeError(f"expected a Variable or numpy.ndarray, got {type(obj).__name__}")


def scalar_variable(value, like_dtype):
    """A Python scalar operand as a Variable: weak, so it takes the array's dtype.

    float32 Variable * 2.0 stays float32 (NumPy 2 semantics for Python scalars);
    DeZero's as_array(2.0) would make a float64 array and promote the result.
    """
    tr = _state.trace
    if tr is not None and isinstance(value, ScalarTracer):
        return tr.scalar_input(value, like_dtype)
    dtype = np.result_type(like_dtype, value)
    var = Constant(np.asarray(value, dtype=dtype))
    if tr is not None:
        tr.literal(var, value)
    return var


def to_operand(other, like):
    """Convert the other operand of a Variable operator to a Variable."""
    if isinstance(other, Variable):
        return other
    if isinstance(other, np.ndarray):
        return Constant(other)
    if isinstance(other, ScalarTracer):
        return scalar_variable(other, like.dtype)       # a traced Python number
    if isinstance(other, (bool, int, float, np.generic)) and not isinstance(other, np.ndarray):
        if isinstance(other, np.generic):
            return Constant(np.asarray(other))
        return scalar_variable(other, like.dtype)
    raise TypeError(f"unsupported operand type for Variable arithmetic: {type(other).__name__}")


class Function:
    """A differentiable operation: forward on ndarrays, backward on Variables.

    Primitives set `kind` (and `expr` for elementwise ops) and list their static
    parameters in `params`, each an attribute of the same name and an argument of
    `__init__`. A user subclass without them is an opaque node under jit.
    """

    kind = OPAQUE
    # A region's (RegionFunction): the .grads eager's Variables inside it hold, which
    # a walk keeping its gradients in .grad adds to (variant.CompiledFunction).
    stale = None
    params = ()
    expr = None
    # With retain_grad, backward_retaining(gys) gives (input grads, output grads): a
    # compiled call whose results feed each other (the cotangents at its results).
    sets_output_grads = False

    def __call__(self, *inputs):
        inputs = [as_variable(x) for x in inputs]
        tr = _state.trace
        if tr is not None and tr.abstract:
            return tr.call(self, inputs)
        if tr is not None and self.params:
            # A traced Python number as a static parameter (F.clip(x, 0, float(m))):
            # the value it is, guarded, before forward uses it.
            for p in self.params:
                v = getattr(self, p, None)
                if isinstance(v, (ScalarTracer, tuple, list, slice)):
                    setattr(self, p, static_value(v))
        # A user Function's state before its forward: the tracer compares it after.
        before = None if tr is None else tr.before_forward(self)
        xs = [x._data for x in inputs]
        for d in xs:
            if d is None:            # not an AttributeError from inside forward
                raise NoDataError(_no_data_message(self, inputs))
        try:
            ys = self.forward(*xs)
        except (ValueError, TypeError, IndexError) as e:
            raise self._input_error(e, inputs) from None
        if not isinstance(ys, tuple):
            ys = (ys,)
        outputs = [Variable(as_array(y)) for y in ys]
        if tr is not None:
            tr.record(self, inputs, outputs, before)
        elif _state.round_hook is not None:
            _state.round_hook(xs, outputs)
        if Config.enable_backprop:
            self.generation = max([x.generation for x in inputs]) if inputs else 0
            for output in outputs:
                output.set_creator(self)
            self.inputs = inputs
            self.outputs = [weakref.ref(output) for output in outputs]
        return outputs if len(outputs) > 1 else outputs[0]

    def forward(self, *xs):
        raise NotImplementedError()

    def backward(self, *gys):
        raise NotImplementedError()

    def param_values(self):
        return tuple(getattr(self, p) for p in self.params)

    def output_grads(self, store=_AttrGrads):
        """The gradients of the outputs; zeros for an output nobody used."""
        gys = []
        for ref in self.outputs:
            y = ref()
            g = None if y is None else store.get(y)
            gys.append(g)
        if any(g is None for g in gys):
            specs = self.output_specs()
            gys = [g if g is not None else Constant(np.zeros(s.shape, s.dtype))
                   for g, s in zip(gys, specs)]
        return gys

    def output_specs(self):
        specs = []
        for ref in self.outputs:
            y = ref()
            specs.append(None if y is None else ShapeDtype(y.shape, y.dtype))
        if any(s is None for s in specs):
            inferred = self.shape_rule(*[ShapeDtype(x.shape, x.dtype) for x in self.inputs])
            if isinstance(inferred, ShapeDtype):
                inferred = (inferred,)
            specs = [s if s is not None else i for s, i in zip(specs, inferred)]
        return specs

    def shape_rule(self, *specs):
        """Output ShapeDtype(s) from input ShapeDtypes, touching no data.

        The default runs forward on zero-filled arrays: right for any user Function,
        but it computes; primitives override it with a formula. It runs on a copy: a
        forward that keeps state on self (a mask) would otherwise overwrite the state
        its backward reads (output_specs asks for a dead output's spec mid-backward).
        """
        import copy
        ys = copy.copy(self).forward(*[np.zeros(s.shape, s.dtype) for s in specs])
        if isinstance(ys, tuple):
            return tuple(ShapeDtype(np.shape(y), np.asarray(y).dtype) for y in ys)
        return ShapeDtype(np.shape(ys), np.asarray(ys).dtype)

    def _input_error(self, error, inputs):
        """Turn a NumPy error into one that names the op, the inputs' shapes and dtypes."""
        specs = [ShapeDtype(x.shape, x.dtype) for x in inputs]
        try:
            self.shape_rule(*specs)
        except (ValueError, TypeError) as shape_error:
            if type(shape_error) in (ValueError, TypeError):      # a shape rule's message
                return type(shape_error)(str(shape_error))
            error = shape_error           # NumPy's, from the dtype probe: named below
        desc = ", ".join(f"x{i}: {s}" for i, s in enumerate(specs))
        # The builtin class: NumPy's subclasses (_UFuncNoLoopError) take other arguments.
        cls = next(c for c in (ValueError, TypeError, IndexError) if isinstance(error, c))
        return cls(f"{type(self).__name__.lower()}({desc}): {error}")


class RegionFunction(Function):
    """A Function standing for a region of others (the creator of a compiled call's
    outputs). expand() puts the region's eager graph in its place, so unchain_backward
    cuts inside it as eager would. Tested by type: a user Function that happens to define
    a method named expand is not taken for one."""

    def expand(self):
        raise NotImplementedError

    def reach(self, y):
        """unchain_backward's walk reached this region through its output y: (y's slot,
        the inputs to walk on to), with finish_cut(slots) called after the walk; or
        None after expand() (the walk goes on from y's creator in its eager graph)."""
        self.expand()
        return None

    def finish_cut(self, slots):
        pass

    def reached_grads(self, store, reached):
        """output_grads for a walk that reached the outputs whose ids are in reached:
        None for an output whose .grad eager's walk would not read (set before it, on
        a result no reached one depends on)."""
        return self.output_grads(store)


class NoDataError(TypeError, AttributeError):
    """A Variable whose data is None used where its value, shape or dtype is needed (an
    op, float(), a jitted call's argument): named in the message. A TypeError, and an
    AttributeError as DeZero's `x.shape` of one is (hasattr(x, "shape") stays False)."""


def _described(var):
    return f"a Variable {var.name!r}" if var.name else "a Variable"


def _no_data_message(fn, inputs):
    k = next(i for i, x in enumerate(inputs) if x._data is None)
    name = f" {inputs[k].name!r}" if inputs[k].name else ""
    return (f"{type(fn).__name__.lower()}: input x{k} is a Variable{name} whose data is None "
            "(assign an array to .data before using it in an op)")


class ShapeDtype:
    """An array's shape and dtype without its data (for eval_shape and shape rules)."""

    __slots__ = ("shape", "dtype")

    def __init__(self, shape, dtype=np.float64):
        self.shape = tuple(int(d) for d in shape)
        self.dtype = np.dtype(dtype)

    @property
    def ndim(self):
        return len(self.shape)

    @property
    def size(self):
        return int(np.prod(self.shape, dtype=np.int64))

    def __eq__(self, other):
        return (isinstance(other, ShapeDtype) and self.shape == other.shape
                and self.dtype == other.dtype)

    def __hash__(self):
        return hash((self.shape, self.dtype))

    def __repr__(self):
        return f"ShapeDtype({self.shape}, {self.dtype})"

    def __str__(self):
        return f"{dtype_code(self.dtype)}{list(self.shape)}"


_DTYPE_CODES = {"float64": "f64", "float32": "f32", "float16": "f16", "int64": "i64",
                "int32": "i32", "int16": "i16", "int8": "i8", "uint8": "u8", "bool": "bool"}


def dtype_code(dtype):
    name = np.dtype(dtype).name
    return _DTYPE_CODES.get(name, name)
