"""Tracing: run the user's function once with tracer values and record a Graph.

Tracer values carry real data, so the traced call computes its real result while it
records. Three kinds of tracer stand in for what the function receives:
  - Variables (arguments and captured Parameters) get `_tv`, the IR value they are;
  - `.data` of a Variable, and ndarray arguments, are TracedArray views: NumPy
    operations on them become nodes, and `bool()/float()/int()` on them become guards;
  - float arguments are TracedFloat, a float whose arithmetic is recorded; float(),
    int() and .item() of traced data give TracedScalars too (symbolic Python numbers:
    a comparison of them is one guard on its outcome, not on the number).
What the tracer cannot follow (`.tolist()`, a write into a value computed inside the
function, an untracked random draw) is an escape: the variant then runs eagerly.
"""
import builtins
import copy
import dis
import functools
import linecache
import logging
import math
import os
import random
import sys
import sysconfig
import threading
import types
import weakref

import numpy as np

from tracejit import core
from tracejit import functions as F
from tracejit.core import Variable
from tracejit.ir import Graph, Lit, Node, Value
from tracejit.trace import made, pystate, sequences
from tracejit.trace.values import (_PY_OPS, _PY_UNARY, REDUCE_PRIMS, SCALAR_TYPES, UFUNC_PRIMS,
                              TracedArray, TracedFloat, TracedScalar, is_internal,
                              python_round_to, python_rounding, python_value)
from tracejit.ops.trace_only import (AssignItem, Guard, NumpyCall, UserBackward, UserCall,
                                     UserGrad)
from tracejit.ops.trace_only import split_assign_index as AssignItem_split

log = logging.getLogger("tracejit")

# The package root (this file is tracejit/trace/record.py).
_PKG_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_NP_DIR = os.path.dirname(os.path.abspath(np.__file__)) + os.sep


def user_line(skip=2):
    """'file.py:12  source text' of the innermost frame outside tracejit."""
    return frame_line(sys._getframe(skip))


def frame_line(f):
    """user_line from frame f outward."""
    while f is not None:
        fname = f.f_code.co_filename
        # The package's own files (a sibling `tracejit_runs/train.py` is the user's),
        # and NumPy's (x.data.ravel().sum() is noticed inside numpy/_core/_methods.py).
        if (not fname.startswith(_PKG_DIR + os.sep) or fname.endswith("demo.py")) \
                and "hypothesis" not in fname and not fname.startswith(_NP_DIR):
            return source_line(fname, f.f_lineno)
        f = f.f_back
    return None


# tracejit's machinery: code that runs the user's operations. What it runs (NumPy, numba
# compiling an op's kernel) is not the user's effect. tracejit's DeZero modules a user
# calls (utils.gradient_check, datasets) print for the user.
_MACHINERY = ("tracejit.core", "tracejit.functions", "tracejit.ops.", "tracejit.ir.",
              "tracejit.passes.", "tracejit.trace.", "tracejit.backends.", "tracejit.runtime.")


def user_frame(f):
    """The frame of the user's code that made the call running in frame f: f itself, or
    the first frame outward of the libraries it runs in (the standard library and
    installed packages); None when that frame is tracejit's machinery.

    Why: the trace's hooks (print, repr of traced data) are process-wide while it runs,
    and an op's forward runs on the traced call's data: numba compiling the conv
    kernels for a new dtype prints its type annotations into a StringIO (its cache's
    pickling), which was reported as the user's print at numba's line."""
    while f is not None:
        name = f.f_globals.get("__name__", "")
        if name.startswith(_MACHINERY):
            return None
        if not os.path.abspath(f.f_code.co_filename).startswith(_LIBRARY_DIRS) \
                or name.startswith("tracejit"):
            return f
        f = f.f_back
    return None


def wrapped_function(fn):
    """The function a grad / value_and_grad wrapper differentiates (same arguments)."""
    for cell in pystate.probe(fn, "__closure__") or ():
        try:
            v = cell.cell_contents
        except ValueError:          # an empty cell
            continue
        if callable(v) and not isinstance(v, type):
            return v
    return None


def def_line(fn):
    """'file.py:3  def f(x):' of the user's function behind fn (looking through jit,
    grad / value_and_grad wrappers, functools.partial, methods and callable objects):
    where a warning points when no line inside the function caused it."""
    func, _ = unwrap_user_function(fn)
    code = pystate.probe(func, "__code__")
    if code is None:
        return None
    return source_line(code.co_filename, code.co_firstlineno)


def unwrap_user_function(fn):
    """(the user's function behind fn, as def_line finds it; the arguments its call
    gets before the caller's own: a method's object, a partial's arguments, or None
    when they are not known, behind a grad wrapper)."""
    import functools
    import types
    bound = ()
    for _ in range(8):
        if isinstance(fn, functools.partial):
            bound = None if bound is None or fn.keywords else tuple(fn.args) + bound
            fn = fn.func
        elif pystate.probe(fn, "__wrapped__") is not None:
            # (A decorator may call it with other arguments: a threaded function
            # takes its state first.)
            fn, bound = pystate.probe(fn, "__wrapped__"), None
        elif pystate.probe(fn, "_tracejit_wrapper", False) is True:
            inner = wrapped_function(fn)
            if inner is None:
                break
            fn, bound = inner, None
        elif not isinstance(fn, (types.FunctionType, types.MethodType)) and callable(fn):
            obj = fn
            fn = getattr(type(fn), "forward", None) or getattr(type(fn), "__call__")
            bound = None if bound is None else (obj,) + bound
        else:
            break
    if isinstance(fn, types.MethodType):
        owner = pystate.probe(fn, "__self__")
        bound = None if bound is None else (owner,) + bound
    return pystate.probe(fn, "__func__", fn), bound


def source_line(filename, lineno):
    """'file.py:12  source text': how a warning names a line."""
    text = linecache.getline(filename, lineno).strip()
    return f"{os.path.basename(filename)}:{lineno}  {text}"


# -------------------------------------------------------------------- tracer values

class _Pending:
    """_tv of a Variable created during the trace that no node produced yet."""


PENDING = _Pending()



def _array_itself(t):
    """The plain array a tracer stands for: `x.data` (a Variable's data as read), or a
    captured array, is that very object, as eager's `W.data = x.data` stores it; any
    other tracer a plain view of its memory."""
    owner = t._owner
    if owner is not None and isinstance(owner._data, np.ndarray) and \
            type(owner._data) is np.ndarray and _same_layout(t, owner._data):
        return owner._data
    if t._capture is not None and type(t._capture) is np.ndarray and \
            _same_layout(t, t._capture):
        return t._capture
    return t.view(np.ndarray)
class Trace(core.TraceHooks):
    """Everything one tracing run records. One per traced call, thread-local."""

    abstract = False

    def __init__(self, name):
        self.graph = Graph(name)
        self.functions = set()       # Functions this trace called (the region to walk)
        self.created = []            # Variables whose _tv must be cleared afterwards
        # id(Variable made in the call) -> (it, the `v.data` read it was made of, that
        # read's owner v): eager's holds v's array object, the one `v.data` gives
        self.made_of_data = {}
        self.captures = []           # (Value, source) for inputs read from outside the args
        self.capture_lines = {}      # id(Variable) -> the user's line that first used it
        self.captured_vars = {}      # id(Variable) -> (Variable, Value)
        # id(Value) -> the array an argument or captured Variable held when read (its
        # data may be rebound since: `W.data = ...`)
        self.read_arrays = {}
        self.captured_arrays = {}    # id(ndarray) -> (ndarray, current Value)
        # id(MadeArray) -> (it, the copy the graph holds, its Value): _made_value
        self.made_snapshots = {}
        # Variables of an array f made (tj.Variable(buf)), at their first use: (the
        # buffer, a copy of it then, the line). The graph reads that buffer as it is
        # after the trace, eager's uses read it as it was: a plain write into it after
        # the use (buf[0] = 5.0, buf += 1, v.data[0] = 5.0) is an escape (call.py).
        self.made_leaf_uses = []
        self.made_holders = set()    # ids of those Variables (they live while f traces)
        self._writing = "an in-place write"   # what _write_into's escapes call a write
        self.effects = []            # (kind, target, Value) replayed after a run
        self.grad_writes = {}        # id(Variable) -> Variable, live vars whose .grad was set
        self.rebind_arrays = {}      # rebind effect index -> the array it stored
        self.rebind_lines = {}       # ... -> the user's line
        self.rebind_owners = {}      # ... -> the Variable whose .data it stored
        self.rebind_tracers = {}     # ... -> the traced array it stored (a computed one)
        # id(Variable) -> (Variable, argument Variable): a captured Variable whose .grad,
        # read before the call set it, is an argument (`S['h'] = W.grad` threaded)
        self.grad_args = {}
        self.grad_reads = {}         # id(Variable) -> (Variable, was None): captured vars
                                     # whose .grad was read before the call set it
        self.escapes = []            # (reason, line)
        self.side_effects = []       # (what, line)
        self.made_grad_lines = {}    # id(Variable made in the call) -> line its .grad was set
        self.random_nodes = []
        self.arg_arrays = {}         # id(ndarray arg) -> (array, input Value)
        # id(ndarray) -> its Location, for captured arrays no traced view could replace
        # (a tuple's item: pystate.swap_arrays), named when traced data is written there
        self.unswapped = {}
        self.arg_vars = {}           # id(Variable arg) -> (Variable, input Value)
        self.owned = {}              # id(ndarray) -> ndarray, buffers computed in the trace
        self.line_of = {}            # Function -> the user line that called it
        self.bwd_line = None         # while backward runs: the line of the op it differentiates
        self.late_escapes = []       # escapes reported after the others
        # id(buffer) -> line: a view op on it (x.data.reshape(-1)) that copied because
        # of its strides, where an array of the same shape and dtype with other
        # strides gives a view; the key does not hold strides, so after an in-place
        # update of the buffer (which a view shows, a copy does not) the call's
        # result depends on the layout: it runs eagerly (_view_of, record_inplace).
        self.layout_copies = {}
        self.views = {}              # id(buffer) -> [(weakref to a tracer or Variable,
                                     # line, its operand's layout, rebuild)]: views
                                     # NumPy would give of it (_note_view)
        self._rebuilding = False     # recording a view's rebuilt value (_refresh_views)
        self._view_call = None       # (fn, args) of the data op _view_of is given
        self.stale_vars = {}         # id(Variable) -> (weakref, (view line, update line)):
                                     # a Function's output that is a view (reshape) of a
                                     # buffer updated in place since (_stale_views)
        self.buffer_vars = {}        # id(buffer) -> [(weakref, line of a part)]: the
                                     # Variables made of a traced array and the .data
                                     # tracers, holding its buffer as eager's do
                                     # (_follow_write)
        self.names = {}              # id(obj) -> (obj, "model.l1.W"): how the user names
                                     # a captured Variable or array (pystate's labels)
        # What eager autodiff sees, for replays on Variables (create_graph, unchain):
        self.owner = {}              # id(Value) -> the Variable a node (or gy) made it as
        self.grad_meta = {}          # id(Node) -> (grad on?, per input: Value linked or None)
        self.replay_refusal = None   # why the region cannot be replayed on Variables
        self.user_calls = {}         # a user Function with per-call state -> its UserCall
        self.region_backward = False  # tracing the backward of the region (trace_backward)
        self.in_backprop = False      # a backward inside the function is running
        self.unchain_events = []     # (kind, [Variables from outside]): cuts of the
                                     # caller's graph compiled calls repeat (unchaining)
        self.cut_ids = set()         # ids of the Variables from outside those cut
                                     # (and ("backward", roots, retain_grad, effects
                                     # before it): a backward that went on into the
                                     # caller's graph from roots, backward_outside)
        self.walk_touched = {}       # id -> (Variable, kind): a .grad such a walk
                                     # touched, and what the trace knows of it after
                                     # (backward_outside)
        self.walk_grads = {}         # id -> (Variable, the call's own part of its .grad)
                                     # for a leaf such a walk added to (a shadow)
        self.walk_checks = {}        # id -> (Variable, kind): touched ones the function
                                     # sees after: the walk must leave them so at call time
        self.walk_reach_grads = {}   # walk_checks key -> the .grad Variable a reached /
                                     # unreached check is for (needed if the graph reads it)
        self.walk_reads = {}         # id -> (Variable, its .grad, input Value, walk): a
                                     # .grad read after such a walk changed it, an
                                     # input the runner reads after that walk
                                     # (_walk_read)
        self.walk_read_lines = {}    # id -> the user's line that read it
        self.walk_resets = {}        # id -> (Variable, walk): a leaf whose .grad the
                                     # function set after such a walk touched it, the
                                     # last one then (_walk_reset)
        self.reseed = {}             # id -> Variable touched that a later backward set,
                                     # which a later walk must go on from (else escape)
        self.after_walk = {}         # id -> Variable from outside whose .grad the
                                     # function touched after such a walk (untouched)
        self.walk_undo = []          # (Variable, field, value) before such walks (or a
                                     # cut of the caller's graph) changed it
        self.backward_leaves = {}    # id(Variable) -> Variable from outside that such a
                                     # backward gave a .grad: a leaf then, and the
                                     # variant holds while it is one
        # A jitted call's arguments (trace.call fills these; an abstract or nested use of
        # a Trace leaves them empty):
        self.arg_inputs = []         # (leaf index, input Value) per argument leaf
        self.arg_leaf = {}           # id(Variable or ndarray argument) -> its leaf index
        self.leaf_kinds = []         # per argument leaf: its Form (VARIABLE, ARRAY, FLOAT)
        self.arg_views = {}          # id(tracer of an ndarray/float argument) ->
                                     # (tracer, leaf, argument); None after the call
        self.arg_containers = {}     # id(traced container) -> (it, its items, path in args)
        self.scalar_args = {}        # id(tracer of an np.generic argument) -> (tracer,
                                     # its input Value, path in args)
        # Read off the finished call (trace.call): a .grad it set on a Variable from
        # outside, (Variable, Value or None), and on a result it made, (x, x.grad, Value).
        self.grad_effects = []
        self.made_grads = []
        self.held_grads = []
        # id(Node) -> ((operand position, Variable), ...): the operands made in the
        # call of a node recorded with grad on (record); trace.call drops it when the
        # call is read off.
        self.leaf_operands = {}

    # ---- values

    def new_value(self, shape, dtype, name=None):
        return Value(shape, dtype, name, self.graph)

    def add_input(self, shape, dtype, name=None):
        v = self.new_value(shape, dtype, name)
        self.graph.inputs.append(v)
        self.graph.input_names.append(name)
        return v

    def name_of(self, obj):
        entry = self.names.get(id(obj))
        return entry[1] if entry is not None and entry[0] is obj else None

    def is_mine(self, tv):
        return tv is not None and (isinstance(tv, Lit) or getattr(tv, "graph", None)
                                   is self.graph)

    def value_of(self, var):
        """The IR value a Variable stands for, capturing it if it comes from outside."""
        if self.stale_vars:
            self._check_stale_var(var)
        tv = var._tv
        if tv is PENDING:
            # Made inside the function from a plain array: capture the array itself.
            tv = self.array_value(var._data)
            var._tv = tv
            if id(var) in self.made_holders:
                self.made_leaf_uses.append((var._data, var._data.copy(), user_line(3)))
            return tv
        if self.is_mine(tv):
            return tv
        entry = self.captured_vars.get(id(var))
        if entry is not None:
            return entry[1]
        if var._data is None:
            self.escape(f"a Variable with data None ({var.name or 'unnamed'}) was used")
            return Lit(0.0, np.float64)
        v = self.add_input(var.shape, var.dtype, self.name_of(var) or var.name)
        self.own(var._data)
        self.read_arrays[id(v)] = var._data
        self.captured_vars[id(var)] = (var, v)
        self.captures.append((v, ("var", var)))
        self.capture_lines[id(var)] = user_line(3)
        var._tv = v
        self.created.append(var)
        return v

    def array_value(self, arr):
        """The IR value of a plain ndarray operand: an argument, a capture or a constant."""
        if isinstance(arr, TracedArray):
            self.check_stale(arr)
            if self.is_mine(arr._tv):
                return arr._tv
            if arr._capture is not None:
                arr._tv = self.array_value(arr._capture)
                return arr._tv
            self.escape("an array derived from traced data by an operation the tracer "
                        "does not follow")
            arr = arr.view(np.ndarray)
        if type(arr) is made.MadeArray:
            return self._made_value(arr)
        entry = self.captured_arrays.get(id(arr))
        if entry is not None:
            return entry[1]
        entry = self.arg_arrays.get(id(arr))
        if entry is not None:
            return entry[1]
        if self._is_owned(arr):
            # A view of an argument's, a capture's or a computed value's buffer that
            # NumPy handed out without the tracer (np.asarray, .view, the buffer protocol).
            self.escape("traced data reached NumPy without the tracer (np.asarray, the "
                        "buffer protocol or a C extension); its values would be frozen")
        v = self.add_input(arr.shape, arr.dtype, self.name_of(arr))
        # Held strongly: an array built inside the function (np.arange) would die.
        self.captured_arrays[id(arr)] = (arr, v)
        self.captures.append((v, ("array", arr)))
        self.own(arr)      # a plain view of it later is its data leaving the tracer
        return v

    def _made_value(self, arr):
        """An array f made, as an operand: its values now, a constant of the graph (a
        copy the graph holds: the array itself may be written after this use, and
        eager's result is computed from the values it had here). Copied again only
        where it was written since its last use."""
        last = self.made_snapshots.get(id(arr))
        if last is not None and last[0] is arr and last[1].shape == arr.shape and \
                last[1].dtype == arr.dtype and np.array_equal(last[1], arr, equal_nan=True):
            return last[2]
        snap = np.ndarray.view(arr, np.ndarray).copy(order="K")
        v = self.add_input(snap.shape, snap.dtype, self.name_of(arr))
        self.captured_arrays[id(snap)] = (snap, v)
        self.captures.append((v, ("array", snap)))
        self.own(snap)
        self.made_snapshots[id(arr)] = (arr, snap, v)
        return v

    def operand(self, x):
        if isinstance(x, Variable):
            return self.value_of(x)
        if isinstance(x, TracedScalar):
            return x._tv
        if isinstance(x, np.ndarray):
            return self.array_value(x)
        self.escape(f"unsupported operand {type(x).__name__}")
        return Lit(0.0, np.float64)

    # ---- hooks called by core

    def new_variable(self, var, data):
        if type(data) is made.MadeArray:
            # Variable(buf) of an array f made: eager's Variable holds that buffer, a
            # leaf the made-leaf machinery follows as the graph input it is (its data
            # changed by the caller before a backward is what the backward reads). So
            # the plain array, as eager's; a write of traced data into buf before the
            # Variable's first use makes it hold the written value (follow_made).
            data.hold(var)
            self.made_holders.add(id(var))
            data = made.plain_of(data)
        if isinstance(data, TracedArray):
            var._tv = self.array_value(data)
            if data._owner is not None:
                self.made_of_data[id(var)] = (var, data, data._owner)
            data = data.view(np.ndarray)
            # Eager's Variable holds this very buffer (as_variable(K) in `W * K`,
            # Variable(a)): an in-place update of it later is what the Variable's
            # later uses read, a backward's among them.
            # (A part's line, for the warning if the whole buffer is updated.)
            root = _root(data)
            self.buffer_vars.setdefault(id(root), []).append(
                (weakref.ref(var), None if _same_layout(data, root) else user_line(3)))
        else:
            var._tv = PENDING
        var._data = data
        self.created.append(var)

    def before_forward(self, fn):
        """A user Function's state before its forward runs (None for tracejit's own):
        record() compares it with the state after, to find per-call state."""
        if fn.kind != core.OPAQUE or type(fn).__module__.startswith("tracejit"):
            return None
        for k, val in list(fn.__dict__.items()):
            if isinstance(val, (core.ScalarTracer, tuple, list)):
                # A traced Python number given to __init__ (Scale(float(m))): its NumPy
                # forward sees a number, as in eager: the value it is, guarded.
                setattr(fn, k, core.static_value(val, f"{type(fn).__name__}(...).{k}"))
        # Containers copied: the forward may fill them (self.seen.append(x)).
        return {k: (copy.copy(v) if type(v) in (list, dict, set, bytearray) else v)
                for k, v in fn.__dict__.items()}

    def record(self, fn, inputs, outputs, before=None):
        ins = [self.value_of(x) for x in inputs]
        outs = [self.new_value(y.shape, y.dtype) for y in outputs]
        for y, v in zip(outputs, outs):
            y._tv = v
            self.own(y._data)
            self.owner[id(v)] = y
        if isinstance(fn, UserGrad):
            op = fn.node_op()        # finds the call's instance when it runs
        else:
            op = _detached(fn) if before is None else self._user_op(fn, before, outs)
            if isinstance(op, UserCall):
                op.layouts = _user_layouts(inputs, outputs)
        node = Node(op, ins, outs, self.bwd_line or user_line(3))
        for y in outputs:
            if isinstance(y._data, np.ndarray) and y._data.base is not None:
                # Eager's output is a view of a buffer (F.reshape, F.transpose of an
                # ndarray argument or of x): an in-place update of that buffer later
                # changes it. One of tracejit's own ops is rebuilt on the buffer's new
                # value then (_refresh_views); another (a user Function) cannot be.
                own = len(inputs) == 1 and len(outputs) == 1 and before is None \
                    and type(fn).__module__.startswith("tracejit")
                self._note_view(y, inputs[0]._data if own else None,
                                self.bwd_line or user_line(3),
                                self._op_rebuilder(node) if own else None)
        # Eager's graph, not just the values: was the call differentiable (no_grad), and
        # is each input the Variable that made its value (or a live input), or a fresh
        # leaf made from data (Variable(x.data), .data arithmetic)? A replay on
        # Variables differentiates exactly what eager does from this.
        links = tuple(self._link(x, v) for x, v in zip(inputs, ins))
        if isinstance(fn, UserGrad) and fn.links is not None:
            # The user's backward links only what its gradients' graphs reach (not
            # the forward's outputs it never reads, nor a `.data` read): a walk from a
            # gradient reads no other's .grad (runtime.variant._eager_ancestry follows
            # each output's own links, op.links).
            reach = frozenset().union(*fn.links)
            links = tuple(u if i in reach else None for i, u in enumerate(links))
        self.grad_meta[id(node)] = (core._state.enable_backprop, links)
        if core._state.enable_backprop:
            # The operands made inside the call: one that is a leaf of eager's graph
            # when the call returns (`Variable(np.ones(3))`, `Variable(x.data)`, a
            # result of no_grad, one unchained) and outlives it gets its gradient
            # from eager's backward, so the compiled call takes it as an input of
            # its own (trace.call._made_leaves).
            made = tuple((i, x) for i, x in enumerate(inputs)
                         if type(x) is not core.Constant and not isinstance(ins[i], Lit)
                         and not self.is_live(x))
            if made:
                self.leaf_operands[id(node)] = made
        self.line_of[fn] = node.line
        self.graph.nodes.append(node)
        self.functions.add(fn)
        if fn.kind == core.RANDOM:
            self.random_nodes.append(node)

    def _link(self, x, tv):
        """The value whose Variable input x is in eager's graph, or None (a leaf)."""
        if isinstance(tv, Lit):
            return None
        if self.owner.get(id(tv)) is x:
            return tv
        entry = self.arg_vars.get(id(x)) or self.captured_vars.get(id(x))
        if entry is not None and entry[0] is x:
            return entry[1]     # an input; rebound (.data = ...) its Variable still is
        if x.creator is not None and self.replay_refusal is None:
            self.replay_refusal = (f"the data of a Variable computed inside it is replaced "
                                   f"(.data = ...) before it is used at {user_line(4)}")
        return None

    def _user_op(self, fn, before, outs):
        """The node op of a user Function: a detached copy, or, when its forward keeps
        state on self, a UserCall that runs a fresh instance per call."""
        for k, val in before.items():
            if self._traced(val) or (type(val) in (list, tuple) and
                                     any(self._traced(u) for u in val)):
                self.escape(f"{type(fn).__name__}(...) keeps a traced value (self.{k}): "
                            f"its NumPy forward would keep the traced call's value")
        after = fn.__dict__
        changed = [k for k in after if k not in _CALL_ATTRS
                   and (k not in before or after[k] is not before[k])]
        mutable = [k for k, val in before.items()
                   if k not in _CALL_ATTRS and type(val) in (list, dict, set, bytearray)]
        if not changed and not mutable:
            return _detached(fn)
        template = copy.copy(fn)
        template.__dict__.clear()
        call = UserCall(template, {k: v for k, v in before.items() if k not in _CALL_ATTRS})
        self.user_calls[fn] = (call, outs)
        return call

    def _traced(self, val):
        if isinstance(val, Variable):
            return self.is_mine(val._tv) and not self.is_live(val)
        if isinstance(val, TracedArray):
            return val._capture is None and self.is_mine(val._tv)
        return isinstance(val, TracedScalar)    # a type: a user object may define _tv

    def input_grads(self, fn, gys, retain_grad=False):
        """fn.backward(*gys) while tracing. A user Function with per-call state gets
        one opaque UserBackward node: the compiled backward calls the instance that ran
        this call's forward, as eager does, instead of freezing the traced call's state."""
        entry = self.user_calls.get(fn)
        if entry is None:
            if retain_grad and isinstance(fn, UserGrad) and not fn.level:
                # Eager's walk passes through the Functions that user backward made
                # (a gradient with history), keeping a .grad on each, which a later
                # walk adds to; here they are one opaque node, none of them held.
                self.escape("a backward with retain_grad=True inside the function "
                            "passes through a gradient a user Function with per-call "
                            f"state ({type(fn._instance()).__name__}) gave "
                            "under create_graph: eager keeps a .grad on each Variable "
                            "its backward made, which compiled calls do not hold")
                # This call is eager's still: that walk, unrecorded.
                prev = core.set_trace(None)
                try:
                    return fn.backward_retaining(gys)[0]
                finally:
                    core.set_trace(prev)
            return core._input_grads(fn, gys)
        call, fwd_outs = entry
        if not self.region_backward:
            call.backward_in_forward = True
        if core._state.enable_backprop:
            return self._user_grad(fn, call, fwd_outs, gys)
        prev = core.set_trace(None)    # run it for real, unrecorded: which inputs get grads
        try:
            with core.no_grad():
                gxs = core._input_grads(fn, gys)
        finally:
            core.set_trace(prev)
        ins = [self.value_of(x) for x in fn.inputs] + list(fwd_outs) + \
            [self.value_of(g) for g in gys]
        outs, specs, result = [], [], []
        for gx in gxs:
            if gx is None:
                result.append(None)
                continue
            # ._data: the user backward's result, computed for real above; .data would
            # capture it as an input of the call (a Variable no location holds).
            a = np.asarray(gx._data if isinstance(gx, Variable) else gx)
            v = self.new_value(a.shape, a.dtype)
            self.own(a)
            var = Variable(a)
            var._tv = v
            self.owner[id(v)] = var
            outs.append(v)
            specs.append(core.ShapeDtype(a.shape, a.dtype))
            result.append(var)
        if outs:
            op = UserBackward(call, len(fn.inputs), len(fwd_outs),
                              [g is not None for g in gxs], specs)
            node = Node(op, ins, outs, self.bwd_line or user_line(3))
            # A replay reads only the gys from its inputs (the instance has the rest).
            n_fwd = len(ins) - len(gys)
            self.grad_meta[id(node)] = (core._state.enable_backprop, (None,) * n_fwd + tuple(
                self._link(g, v) for g, v in zip(gys, ins[n_fwd:])))
            self.graph.nodes.append(node)
        return tuple(result)

    def _user_grad(self, fn, call, fwd_outs, gys):
        """input_grads under create_graph: the gradients with a history (a UserGrad
        call on the forward's inputs, outputs and gys), so a grad of grad or a second
        backward differentiates the user's backward as eager does."""
        # The outputs as eager's graph has them (the recorded Variable if it died).
        ys = [self.owner[id(v)] if r() is None else r() for r, v in zip(fn.outputs, fwd_outs)]
        op = UserGrad(call, len(fn.inputs), len(fwd_outs), inst=fn)
        return op.per_input(op(*fn.inputs, *ys, *gys))

    def backward_of(self, fn, deferrable=False):
        line = self.line_of.get(fn)
        self.bwd_line = f"grad of {line}" if line and not line.startswith("grad of") else line
        self.in_backprop = fn is not None
        if fn is not None and not self.region_backward and fn not in self.functions:
            # Past a Variable from outside that has a creator (the state an earlier
            # call left, not cut by unchain_backward, a result of the caller's graph):
            # eager's backward goes on into the graph from before the call. A walk
            # keeping gradients in .grad leaves it out and goes on from the call's
            # Variables once its own part is done (backward_outside): an event
            # compiled calls repeat on the caller's graph at call time. One keeping
            # them aside (grad(), value_and_grad: deferrable False) stops here: what
            # it would compute there are gradients of Variables from before the call,
            # which no one reads (it returns those of the Variables it made, which
            # the caller's graph cannot reach) and which touch no .grad.
            return True
        return False

    def backward_outside(self, fns, retain_grad, create_graph):
        """A backward inside the function reached Functions from before the call: it
        goes on from the Variables from outside they made (the call's arguments and
        captured Variables, each .grad what the call's part of the walk gave it) into
        the caller's graph, run for real, unrecorded, as eager's walk goes on (the
        traced call is a real one). Compiled calls repeat it as an event after their
        graph ran (core.backward_from, in the runner's order of effects), seeding each
        of those Variables with the .grad this walk started from (a graph output).
        What the walk touches (its .grad) the function may see after it only where the
        trace knows what it holds (walk_touched: cleared, kept; a leaf's, as the call's
        own part of it, shadowed: added to by a later backward), checked at call time
        (walk_checks); anything else it touches there escapes (_after_walk)."""
        roots = []
        var_values = {id(v) for v, (kind, _) in self.captures if kind == "var"}
        refusal = None
        for f in fns:
            for r in f.outputs:
                y = r()
                if y is None or any(y is z for z in roots) or not self.is_live(y):
                    continue
                if id(y) not in self.arg_vars and id(self.captured_vars[id(y)][1]) \
                        not in var_values:
                    refusal = "through a captured Variable's .grad"
                roots.append(y)
        if create_graph:
            refusal = "with create_graph=True (the gradients it carries there would " \
                      "need a history through the compiled call)"
        elif not roots:
            refusal = "from a Variable the call cannot name"
        walked = roots or [y for f in fns for y in (r() for r in f.outputs) if y is not None]
        reach = core.graph_reach(walked)
        before = {k: x._grad for k, x in reach.items()}
        self.walk_undo += [(x, "_grad", before[k]) for k, x in reach.items()]
        if refusal is not None:
            self.escape("a backward inside the function goes on into the graph from "
                        f"before the call {refusal}; compiled calls cannot go on with it")
        else:
            # Each root's seed: the .grad the call's part of the walk left (a value of
            # the graph), or none (its .grad from before the call, as eager reads it).
            seeds = [self.value_of(x._grad) if x._grad is not None and
                     id(x) in self.grad_writes and (x._grad._tv is PENDING or
                                                    self.is_mine(x._grad._tv)) else None
                     for x in roots]
            self.unchain_events.append(("backward", roots, bool(retain_grad),
                                        len(self.effects), seeds))
            n_walk = sum(ev[0] == "backward" for ev in self.unchain_events) - 1
            for x in roots:
                self.reseed.pop(id(x), None)
        prev = core.set_trace(None)
        try:
            core.backprop(walked, retain_grad=retain_grad, create_graph=create_graph)
        finally:
            core.set_trace(prev)
        if refusal is not None:
            return
        for k, (x, _) in self.walk_resets.items():
            # A leaf whose .grad the function set after an earlier walk (_walk_reset):
            # that .grad is set before this walk at call time, which must not reach it
            # (its .grad, a result perhaps, would be replaced): the variant holds while
            # it does not.
            if k in reach and reach[k] is x:
                self.escape("the function sets the .grad of a Variable after a backward "
                            "inside it goes on into the graph from before the call, and "
                            "a later such backward changes that .grad again; compiled "
                            "calls cannot follow both")
            else:
                self.walk_checks.setdefault((k, n_walk, "unreached"), (x, "unreached", n_walk))
        for k, x in reach.items():
            old, new = before[k], x._grad
            entry = self.walk_touched.get(k)
            if entry is not None and entry[0] is x and entry[1] in ("shadow", "opaque"):
                continue
            if new is None and x.creator is not None:
                kind = "cleared"          # None after it, as the trace sees it
            elif new is old and x.creator is not None:
                kind = "kept"             # retain_grad: as the call's part left it
            elif x.creator is None and new is not old:
                # A leaf the walk added to: the trace goes on with the call's part of
                # its .grad (walk_grads), which a later backward may add to.
                kind = "shadow"
                if not (k in self.walk_grads and self.walk_grads[k][0] is x):
                    self.walk_grads[k] = (x, old)
            else:
                # Not what the trace can follow (the function must not see it again):
                # what the call's part of the walk left is what compiled calls set.
                kind = "opaque"
                if not (k in self.walk_grads and self.walk_grads[k][0] is x):
                    self.walk_grads[k] = (x, old)
            # (A .grad cleared by one walk and kept by a later one is as the later
            # one left it: the checks name the walk the function saw it after.)
            self.walk_touched[k] = (x, kind, n_walk)
            if new is not old and k in self.grad_writes:
                # The call set this .grad before the walk, which replaced it: the
                # Variable the call made is nobody's .grad after the call, so the graph
                # does not link it as one. A call whose walk does not reach x leaves
                # that Variable as x.grad, which eager's later backward through the
                # results adds to: the variant holds while the walk reaches x.
                self.walk_checks.setdefault((k, n_walk, "reached"), (x, "reached", n_walk))
                self.walk_reach_grads[(k, n_walk, "reached")] = old
        for k, x in list(self.grad_writes.items()):
            if k not in reach and (k in self.arg_vars or k in self.captured_vars):
                # And the other way round: a .grad from outside the call set, this walk
                # did not reach; a call whose walk adds to it would leave a new
                # Variable there, not the one the graph links: the variant holds while
                # the walk does not reach it.
                self.walk_checks.setdefault((k, n_walk, "unreached"),
                                            (x, "unreached", n_walk))
                self.walk_reach_grads[(k, n_walk, "unreached")] = x._grad

    def walk_check_needed(self, key):
        """Whether walk_checks' entry `key` guards anything: a reached / unreached
        check matters only where the .grad Variable the call set is read by the graph
        (`g = x.grad; loss = F.sum(g * u)`): otherwise compiled calls give x.grad what
        the walk at call time leaves, either way (no later backward links to it)."""
        if key not in self.walk_reach_grads:
            return True
        g = self.walk_reach_grads[key]
        return g is not None and any(any(i is g for i in getattr(fn, "inputs", ())) for fn in self.functions)

    def _after_walk(self, var, what):
        """The function reads or sets the .grad of a Variable from outside after a
        backward inside it went on into the caller's graph (backward_outside).
        Returns the .grad the trace goes on with (a shadow for a leaf the walk added
        to), or None for the Variable's own."""
        entry = self.walk_touched.get(id(var))
        n_walks = sum(ev[0] == "backward" for ev in self.unchain_events)
        reset = self.walk_resets.get(id(var))
        if (entry is None or entry[0] is not var) and reset is not None and \
                reset[0] is var:
            # Set after a walk (what it left is gone); each walk since did not reach
            # it, and must not at call time (backward_outside's unreached checks).
            return None
        if entry is None or entry[0] is not var:
            # Not touched now: the variant holds while the walk at call time does not
            # touch it either (runner: Stale).
            self.after_walk.setdefault(id(var), (var, sum(
                ev[0] == "backward" for ev in self.unchain_events)))
            return None
        kind = entry[1]
        if kind in ("cleared", "kept") and (what == "reads" or self.in_backprop):
            # What eager's walk left, if it leaves the same at call time (walk_checks);
            # an addition by a backward must be one a later walk goes on from (reseed).
            self.walk_checks.setdefault((id(var), entry[2]), (var, kind, entry[2]))
            if what == "sets":
                self.reseed[id(var)] = var
            return None
        if self.in_backprop and (kind == "shadow" or kind == "opaque" and var.creator is None):
            # (A leaf the walk reached without adding to it when traced is one it may add
            # to at call time: a later backward's addition goes to the call's part too.)
            self.walk_checks.setdefault((id(var), entry[2]), (var, "leaf", entry[2]))
            if what == "reads" and id(var) not in self.grad_writes and \
                    id(var) not in self.arg_vars:
                self.grad_reads.setdefault(id(var), (var, self.walk_grads[id(var)][1] is None))
            return self.walk_grads[id(var)]
        if what == "sets" and not self.in_backprop and var.creator is None and \
                kind in ("shadow", "opaque") and id(var) not in self.walk_reads:
            return self._walk_reset(var, n_walks - 1)
        self.escape(f"the function {what} the .grad of a Variable after a backward "
                    f"inside it goes on into the graph from before the call and "
                    f"changes that .grad there; compiled calls go on with that "
                    f"backward after the call")
        return None

    def _walk_reset(self, var, n):
        """The function sets the .grad of a leaf from outside (`x.cleargrad()`, `x.grad
        = g`) after a backward inside it went on into the caller's graph and touched it:
        what those walks left there is gone, and the .grad the call leaves on var is
        set right after the last of them, walk n (the runner's late grad effects), not
        before the walks as the others are. (The walks do not read a leaf's .grad:
        they only add to it.) The variant holds while var is a leaf (else the walk
        would go on past it, from its .grad)."""
        self.walk_touched.pop(id(var), None)
        self.walk_grads.pop(id(var), None)
        self.walk_resets[id(var)] = (var, n)
        self.walk_checks[(id(var), n, "reset")] = (var, "leaf", n)
        return None

    def _walk_read(self, var):
        """The function reads the .grad of a leaf from outside after a backward inside it
        went on into the caller's graph and added to it (`loss.backward(); W.data -=
        0.1 * W.grad.data`, W in the caller's graph). Compiled calls run that walk after
        their graph (core.backward_from), so the graph cannot compute what it left: the
        .grad is an input of its own ("walkgrad") the runner reads right after that walk,
        running the part of the graph that depends on it then (Variant.walk_read).
        Returns the .grad as the trace goes on with it (the real one, standing for
        that input: the traced call is a real one, whose results and state hold it),
        or None where this does not apply (_after_walk decides: it escapes)."""
        entry = self.walk_touched.get(id(var))
        read = self.walk_reads.get(id(var))
        if read is not None and read[0] is var:
            if entry is not None and entry[0] is var and entry[2] != read[3]:
                # A later walk added to it again: a second read point (not followed).
                self.escape("the function reads the .grad of a Variable after two "
                            "backwards inside it went on into the graph from before the "
                            "call and changed that .grad there; compiled calls cannot "
                            "go on with both")
            g = var._grad
            if g is read[1] or g is not None and (g._tv is PENDING or self.is_mine(g._tv)):
                return g    # (a root's: what a later backward added to it, _walk_read_root)
            return None
        if entry is None or entry[0] is not var or entry[1] not in ("shadow", "opaque"):
            return None
        root = var.creator is not None
        if root and (entry[1] != "opaque" or not self.in_backprop) or \
                not root and self.in_backprop:
            return None
        walks = [ev for ev in self.unchain_events if ev[0] == "backward"]
        real = var._grad
        if len(walks) != 1 or entry[2] != 0 or (id(var), 0) in self.walk_checks or \
                real is None or real._data is None or id(var) not in self.grad_writes \
                or self.walk_grads.get(id(var), (None, None))[1] is None:
            # The one walk so far; a leaf the call gave a .grad before it (so the walk at
            # call time leaves one: it adds to a leaf's), which no later backward added
            # to (the shadow: the call's part then): else not this case.
            return None
        n, walk = 0, walks[0]
        if root and not self._walk_read_root(var, walk):
            return None
        d = real._data.dtype
        part = self.walk_grads[id(var)][1]
        if part._data is None or part._data.dtype != d or \
                not core.walk_keeps_dtype(core.graph_reach(walk[1]), d):
            # (The call's part of the dtype the walk leaves: what the walk adds keeps it.)
            return None
        tv = self.add_input(real._data.shape, d,
                            (self.name_of(var) or var.name or "p") + ".grad")
        # The array the first run of the graph reads there (what the walk left when
        # traced): what depends on it is run again on the walk's .grad after the walk.
        self.captures.append((tv, ("walkgrad", real._data.copy())))
        if real is part:
            # The walk left the call's part itself when traced: the .grads the call
            # sets before the walk (trace.call's grads_before_walks) read it as a
            # Variable of its own, standing for the call's part, not for this input.
            own = Variable.__new__(type(real))
            own._tv, own._data, own._grad = real._tv, real._data, None
            own.name, own.creator, own.generation = real.name, None, real.generation
            self.walk_grads[id(var)] = (var, own)
        real._tv = tv
        self.created.append(real)
        self.walk_reads[id(var)] = (var, real, tv, n)
        self.walk_read_lines[id(var)] = user_line()
        # The variant holds while var is a leaf (else the walk at call time would go on
        # past it and clear its .grad; a root's is the walk's seed, leaf or not) and the
        # walk keeps the .grad's dtype, the one the runner's part after it was built for
        # (core.walk_keeps_dtype).
        if not root:
            self.walk_checks[(id(var), n, "read")] = (var, "leaf", n)
        self.walk_checks[(id(var), n, "dtype")] = (var, ("dtype", d.str), n)
        return real

    def _walk_read_root(self, var, walk):
        """A later backward inside the function reads the .grad of var, one the walk
        `walk` into the caller's graph went on from (an argument with a creator), to add
        to it, then goes on into that graph from var again (a later walk, seeded with
        the sum: reseed). Whether this is followed: the walk kept its roots' .grads
        (retain_grad) and seeded var with a value of the graph, so the .grad it leaves
        on var at call time is that seed plus what it added, never None."""
        roots, retain, seeds = walk[1], walk[2], walk[4]
        k = next((i for i, x in enumerate(roots) if x is var), None)
        return retain and k is not None and seeds[k] is not None

    def check_walk_reads(self):
        """At the end of the call: each .grad read after a walk (_walk_read) is still
        that Variable's .grad, unchanged, with no .grad of its own. Compiled calls read
        it after the walk as a value; a write into its buffer (`W.grad.data *= 0.5`),
        a rebind of its data or a backward giving it a .grad would be a change of the
        caller's state they do not make."""
        for k, (var, g, tv, n) in self.walk_reads.items():
            ph = next(obj for v, (kind, obj) in self.captures if v is tv)
            # (A root's .grad a later backward added to, _walk_read_root: the sum.)
            if var._grad is not g and var.creator is None or g._grad is not None or \
                    g.creator is not None or \
                    g._data is None or g._data.shape != ph.shape or \
                    g._data.dtype != ph.dtype or \
                    not np.array_equal(g._data, ph, equal_nan=True):
                self.escape("the function changes the .grad of a Variable it read after "
                            "a backward inside it went on into the graph from before the "
                            "call and changed that .grad there; compiled calls read it "
                            "as a value", self.walk_read_lines[k])

    def _shadow(self, var, trace_grad):
        """What a backward inside the function adds to, for a leaf an earlier walk into
        the caller's graph added to: the real .grad's data (the traced call is a real
        one), standing in the graph for the call's own part of it (trace_grad)."""
        real = var._grad
        if real is None:
            return None     # cleared since: the function set it (escaped, _after_walk)
        if trace_grad is None:
            # The call's part is none yet: a zero that promotes no gradient it is added
            # to. Not the walk's dtype: a later call whose walk does not reach var
            # (its relation to the other arguments gone) must leave eager's dtype, the
            # later backward's own (float32), not the walk's (float64).
            tv = self.array_value(np.zeros(real.shape, _neutral_zero_dtype(real.dtype)))
        elif trace_grad._tv is PENDING or self.is_mine(trace_grad._tv):
            tv = self.value_of(trace_grad)
        else:
            tv = self._outside_grad_value(var, trace_grad)
        s = Variable.__new__(type(real))
        s._tv = tv          # first: the traced .grad and creator setters read it
        s._data, s._grad, s.name, s.creator, s.generation = real._data, None, None, None, 0
        self.created.append(s)
        return s

    def unchaining(self, var, backward):
        """An unchain_backward (backward) or unchain() of var inside the function: the
        Variables from outside it cuts (an argument, a captured Variable) are recorded
        as an event the compiled call repeats on the caller's graph at call time; which
        ones the walk reaches through the call's own graph is fixed by the trace."""
        if self.region_backward:
            return
        if not backward and var._tv is None and var.creator is not None \
                and not self.is_live(var):
            # From outside and not read yet (`state.h.unchain()` first thing in an RNN
            # step): the cut is of the caller's graph all the same; captured here, it
            # is an input the runner finds and cuts at every call.
            self.value_of(var)
        # What the cut changes in the caller's graph, to put back if the call runs
        # again (a trace that finds state to thread).
        for x in (core.graph_reach([var]) if backward else {id(var): var}).values():
            if x.creator is not None and x.creator not in self.functions:
                self.walk_undo += [(x, "creator", x.creator), (x, "generation", x.generation)]
        if not backward:
            event = ("unchain", [var]) if self.is_live(var) else None
        elif self.is_live(var):
            event = ("root", [var])
        else:
            found, seen = [], set()
            stack = [var.creator] if var.creator in self.functions else []
            while stack:
                f = stack.pop()
                for x in f.inputs:
                    if self.is_live(x):
                        if not any(x is y for y in found):
                            found.append(x)
                    elif x.creator is not None and x.creator in self.functions and \
                            id(x.creator) not in seen:
                        seen.add(id(x.creator))
                        stack.append(x.creator)
            event = ("walk", found) if found else None
        if event is None:
            return
        if self.in_backprop:
            # (A user backward that unchains: no place in the runner's order.)
            self.escape(f"{'unchain_backward' if backward else 'unchain'}() inside a "
                        f"backward cuts Variables from outside the call; compiled calls "
                        f"cannot order the two")
            return
        # The runner repeats it after the graph ran, whatever backward the function ran
        # before or after it: such a backward stops at Variables from outside that are
        # leaves, which a cut of them leaves as they are (one that the cut made a leaf
        # needs not be one at call time); one that goes on into the caller's graph is
        # an event of its own, the cuts before it repeated right before it.
        if event[0] != "root":
            self.cut_ids.update(id(x) for x in event[1])
        self.unchain_events.append(event)

    def literal(self, var, value):
        var._tv = Lit(value, var.dtype)

    def scalar_input(self, value, like_dtype):
        """A traced Python number as an operand of arrays of like_dtype: a Variable of
        the dtype NumPy 2 gives (a Python scalar is weak: float32 array * float stays
        float32, also for a float computed from arguments, `K / (1.0 + lr)`)."""
        tv = self.weak_operand(value, like_dtype)
        var = Variable(np.asarray(value._value, dtype=tv.dtype))
        var._tv = tv
        return var

    def weak_operand(self, value, like_dtype):
        """The IR value of a TracedScalar operand of arrays of like_dtype (None: alone)."""
        if like_dtype is None:
            return value._tv
        dtype = np.result_type(like_dtype, value._value)
        if dtype.kind in "iu" and dtype != np.int64:
            # A narrow integer array: NumPy raises when the number does not fit, which
            # the graph cannot check. The value it is, then.
            return Lit(self.freeze(value, f"an operand of a {dtype} array"), dtype)
        return self.scalar_cast_value(value, dtype)

    def scalar_cast_value(self, value, dtype):
        if value.dtype == dtype:
            return value._tv
        _, v = self._scalar_node(F.Cast(dtype), [value._tv],
                                 [np.asarray(value._value, value.dtype)])
        return v

    def scalar_var(self, value):
        """A Variable for a Python number (traced or not), as a 0-d float64."""
        if isinstance(value, TracedScalar):
            var = Variable(np.asarray(value._value, dtype=np.float64))
            var._tv = self.scalar_cast_value(value, np.dtype(np.float64))
            return var
        var = Variable(np.asarray(float(value)))
        var._tv = Lit(float(value), np.float64)
        return var

    def make_float(self, var):
        return TracedFloat(float(var._data), self.value_of(var), self)

    # ---- Python numbers computed from traced values (TracedScalar)

    def _scalar_node(self, fn, ins, vals):
        """Record fn on 0-d operands (IR values, with their values now): (value, Value)."""
        y = np.asarray(fn.forward(*vals))
        self.own(y)
        v = self.new_value(y.shape, y.dtype)
        self.graph.nodes.append(Node(fn, ins, [v], user_line(2)))
        return y, v

    def _scalar_operand(self, x, dtype):
        """(IR value, value now) of a Python number, traced or literal, as a 0-d dtype."""
        if isinstance(x, TracedScalar):
            return self.scalar_cast_value(x, dtype), np.asarray(x._value, dtype)
        return Lit(x, dtype), np.asarray(x, dtype)

    def _check_guard(self, fn, operands, dtype, expected):
        """A guard that `fn(*operands)` (0-d, in dtype) is `expected` as it is now."""
        ins, vals = zip(*[self._scalar_operand(x, dtype) for x in operands])
        y, v = self._scalar_node(fn(), list(ins), list(vals))
        self.graph.nodes.append(Node(Guard("bool", bool(y)), [v], [], user_line(2)))
        return bool(y) == expected

    def freeze(self, x, what):
        """A use of a traced Python number the tracer cannot follow: its value, behind a
        guard on it (a new value retraces). Logged with the user's line."""
        if not isinstance(x, TracedScalar):
            return x
        if x._trace is not self:
            return x._value     # a number left over from another trace: a constant now
        conv = "float" if x.pytype is float else "bool" if x.pytype is bool else "int"
        line = user_line(2)
        self.graph.nodes.append(Node(Guard(conv, x._value), [x._tv], [], line))
        if log.isEnabledFor(logging.INFO):
            log.info("jit: %s of a Python number computed from traced values, at %s: "
                     "guarded by its value %r (a new value retraces)", what, line, x._value)
        return x._value

    def to_scalar(self, x, pytype):
        """`x.item()` (pytype by dtype), and float(x)/int(x) in the jitted function: a
        TracedScalar of x's value, not a guard on it."""
        plain = x.view(np.ndarray)
        if pytype is None or x.ndim != 0 or plain.dtype.kind not in "biuf":
            # Complex, or an array of ndim > 0 (NumPy's own rules and errors): by value.
            return self.guard(x, "float" if pytype is float else "int" if pytype is int
                              else "bool" if pytype is bool else "item")
        value = pytype(plain)     # raises what Python raises (int(nan))
        src = self.array_value(x)
        if pytype is int and plain.dtype.kind == "f":
            # int() truncates; Python's int is unbounded, int64 is not: in range at every
            # call, or by value.
            a, av = self._scalar_node(F.Abs(), [src], [plain])
            lim = np.asarray(2.0 ** 63, plain.dtype)
            ok, c = self._scalar_node(F.Less(), [av, Lit(lim, plain.dtype)], [a, lim])
            self.graph.nodes.append(Node(Guard("bool", bool(ok)), [c], [], user_line(2)))
            if not ok:
                return self.guard(x, "int")
        elif pytype is int and plain.dtype == np.uint64:
            # Cast to int64 below, a value from 2**63 wraps around (int() of it is
            # positive): below 2**63 at every call (a guard, so a call whose value is
            # not retraces), or by value.
            lim = np.asarray(2 ** 63, np.uint64)
            ok, c = self._scalar_node(F.Less(), [src, Lit(lim, plain.dtype)], [plain, lim])
            self.graph.nodes.append(Node(Guard("bool", bool(ok)), [c], [], user_line(2)))
            if not ok:
                return self.guard(x, "int")
        dtype = _DTYPE_OF[pytype]
        if plain.dtype != dtype:
            _, src = self._scalar_node(F.Cast(dtype), [src], [plain])
        return SCALAR_TYPES[pytype](value, src, self)

    def scalar_convert(self, x, pytype):
        """float(x) / int(x) of a traced Python number, in the jitted function."""
        if x.pytype is pytype:
            return x
        value = pytype(x._value)       # raises what Python raises (int(inf))
        if pytype is int and x.pytype is float:
            if not self._check_guard(F.Less, [abs(x), 2.0 ** 63], np.dtype(np.float64),
                                     True):
                self.freeze(x, "int() of a float beyond int64")
                return value
        return SCALAR_TYPES[pytype](value, self.scalar_cast_value(x, _DTYPE_OF[pytype]),
                                    self)

    def scalar_rounding(self, name, x, ndigits=None):
        """round(x[, ndigits]) / math.floor / ceil / trunc (name) of a traced Python
        number: the int Python gives, recorded as int(x) is (one variant for every
        value, not a guard on each)."""
        if isinstance(ndigits, TracedScalar):
            ndigits = self.freeze(ndigits, "round()'s ndigits")
        result = python_rounding(name, x._value, ndigits)   # raises what Python raises
        if x.pytype is not float:
            if name == "round" and ndigits is not None and ndigits < 0:
                # round(1234, -2): Python's exact decimal rounding of an int. By value.
                self.freeze(x, "round() of an int to negative ndigits")
                return result
            return self.scalar_convert(x, int)     # an int (a bool's 0 or 1) itself
        f8 = np.dtype(np.float64)
        if ndigits is not None:
            # round(v, n) rounds the exact decimal value (round(2.675, 2) is 2.67),
            # which np.round's scaling does not reproduce (2.68): Python's own round,
            # called on each call's value (a float as Python's; inf and nan stay).
            fn = NumpyCall(python_round_to, kwargs=(("ndigits", int(ndigits)),))
            _, v = self._scalar_node(fn, [x._tv], [np.asarray(x._value, f8)])
            return SCALAR_TYPES[float](result, v, self)
        # round() is half to even, as np.rint; each gives an integral float64, which
        # converts to int64 exactly when below 2**63 in magnitude. That is guarded (nan
        # and inf fail it too: a call with one retraces, and raises what Python raises).
        fn = NumpyCall({"round": np.rint, "floor": np.floor, "ceil": np.ceil,
                        "trunc": np.trunc}[name])
        y, v = self._scalar_node(fn, [x._tv], [np.asarray(x._value, f8)])
        a, av = self._scalar_node(F.Abs(), [v], [y])
        lim = np.asarray(2.0 ** 63)
        ok, c = self._scalar_node(F.Less(), [av, Lit(lim, f8)], [a, lim])
        self.graph.nodes.append(Node(Guard("bool", bool(ok)), [c], [], user_line(2)))
        if not ok:
            self.freeze(x, f"{name}() of a float beyond int64")
            return result
        _, iv = self._scalar_node(F.Cast(np.dtype(np.int64)), [v], [y])
        return SCALAR_TYPES[int](result, iv, self)

    def scalar_binary(self, name, a, b):
        """a <op> b for Python numbers, at least one traced: what Python gives, recorded."""
        va, vb = python_value(a), python_value(b)
        result = _PY_OPS[name](va, vb)      # raises what Python raises (ZeroDivisionError)
        rt = type(result)
        if rt not in _DTYPE_OF:       # complex: a negative base to a fractional power
            self.freeze(a, "a power giving a complex number")
            self.freeze(b, "a power giving a complex number")
            return result
        if name in _CMP_OPS:
            work = np.dtype(np.float64) if float in (type(va), type(vb)) else \
                np.dtype(np.int64)
        else:
            work = _DTYPE_OF[rt]       # / and int ** -n compute in float64
        if work.kind == "i" and not all(-2 ** 63 <= v < 2 ** 63 for v in (va, vb)):
            # A Python int literal beyond int64 (n * 10**20, n == 2**64): no int64
            # operand holds it. By value.
            self.freeze(a, f"{name} with an int beyond int64")
            self.freeze(b, f"{name} with an int beyond int64")
            return result
        if name in ("truediv", "floordiv", "mod") and isinstance(b, TracedScalar):
            # Python raises on a zero divisor where NumPy gives inf or nan.
            self._check_guard(F.NotEqual, [b, 0], work if work.kind != "b" else
                              np.dtype(np.int64), True)
        if name == "pow" and rt is int and isinstance(b, TracedScalar):
            self._check_guard(F.GreaterEqual, [b, 0], np.dtype(np.int64), True)
        if work.kind == "f" and (name in _CMP_OPS or name == "truediv") and not all(
                self._exact_in_float64(x, v) for x, v in ((a, va), (b, vb))):
            # Python compares an int with a float exactly, and divides ints with one
            # rounding; in float64 an int beyond 2**53 is rounded first. By value then.
            self.freeze(a, f"{name} of an int beyond 2**53 in float64")
            self.freeze(b, f"{name} of an int beyond 2**53 in float64")
            return result
        (ia, xa), (ib, xb) = self._scalar_operand(a, work), self._scalar_operand(b, work)
        fn = _SCALAR_FNS[name]()
        y, v = self._scalar_node(fn, [ia, ib], [xa, xb])
        if name == "pow" and rt is float:
            # Python raises (0.0 ** -1, overflow) or gives a complex number where NumPy
            # gives inf or nan: a finite result now, and at every call, or by value.
            out = TracedFloat(result, v, self)
            finite = math.isfinite(result) and self._check_guard(
                F.Less, [abs(out), math.inf], np.dtype(np.float64), True)
            if not finite:
                self.freeze(a, "a power with a non-finite result")
                self.freeze(b, "a power with a non-finite result")
                return result
        if rt is int and name in ("add", "sub", "mul", "pow") and \
                not self._int_fits(_SCALAR_FNS[name](), (a, b)):
            # Python's int is unbounded: beyond int64 at this call, by value.
            self.freeze(a, f"{name} of ints beyond int64")
            self.freeze(b, f"{name} of ints beyond int64")
            return result
        if not _same_number(y, result):
            # The graph would not reproduce Python here (rounding).
            self.freeze(a, f"{name} that NumPy computes differently")
            self.freeze(b, f"{name} that NumPy computes differently")
            return result
        return SCALAR_TYPES[rt](result, v, self)

    def _exact_in_float64(self, x, v):
        """Is the number x (value v) exactly a float64, now and (a guard) at every call?
        Floats and bools are; an int is up to 2**53 in magnitude."""
        if type(v) is not int:
            return True
        if not isinstance(x, TracedScalar):
            return abs(v) <= 2 ** 53
        return self._check_guard(F.LessEqual, [abs(x), 2 ** 53], np.dtype(np.int64), True)

    def _int_fits(self, fn, operands):
        """A guard that the int op, done in float64, stays below 2**62 in magnitude (so
        int64 computes it exactly, at every call); whether it does now."""
        f8 = np.dtype(np.float64)
        ins, vals = zip(*[self._scalar_operand(x, f8) for x in operands])
        with np.errstate(all="ignore"):
            y, v = self._scalar_node(fn, list(ins), list(vals))
            ya, va = self._scalar_node(F.Abs(), [v], [y])
            lim = np.asarray(2.0 ** 62)
            ok, c = self._scalar_node(F.Less(), [va, Lit(lim, f8)], [ya, lim])
        self.graph.nodes.append(Node(Guard("bool", bool(ok)), [c], [], user_line(2)))
        return bool(ok)

    def scalar_unary(self, name, x):
        result = _PY_UNARY[name](x._value)
        rt = type(result)
        if name == "pos" and rt is x.pytype:
            return x
        ix, xv = self._scalar_operand(x, _DTYPE_OF[rt])
        if name == "pos":
            return SCALAR_TYPES[rt](result, ix, self)
        y, v = self._scalar_node(_SCALAR_UNARY_FNS[name](), [ix], [xv])
        if not _same_number(y, result):
            self.freeze(x, f"{name} that NumPy computes differently")
            return result
        return SCALAR_TYPES[rt](result, v, self)

    def scalar_truth(self, x):
        """`if x:` / `not x` / `and` on a traced Python number: a guard on the outcome."""
        outcome = bool(x._value)
        if x._trace is not self:
            return outcome
        self.graph.nodes.append(Node(Guard("bool", outcome), [x._tv], [], user_line(2)))
        return outcome

    def capture_view(self, arr):
        """A traced view of a closure/global array, captured when first used."""
        t = arr.view(TracedArray)
        t._capture = arr
        t._trace = self
        return t

    def read_data(self, var):
        tv = self.value_of(var)
        t = var._data.view(TracedArray)
        t._tv = tv
        t._owner = var
        t._trace = self
        # `d = W.data; W.data -= lr * g`: d is W's buffer, updated (_follow_write).
        self.buffer_vars.setdefault(id(_root(var._data)), []).append((weakref.ref(t), None))
        return t

    def write_data(self, var, value):
        """`var.data = value` for a Variable that exists: a live input is reassigned."""
        if type(value) is made.MadeArray and not self.follow_made(value):
            value = made.plain_of(value)              # (as new_variable's)
        if isinstance(value, TracedArray):
            if value._owner is var and _root(value) is _root(var._data):
                # `var.data -= x` assigns back the array it changed in place: nothing new.
                return var._data
            tv = self.array_value(value)
            plain = _array_itself(value)
            owner = value._owner if plain is getattr(value._owner, "_data", None) else None
        else:
            plain, owner = value, None
            tv = self.array_value(value) if value is not None else None
        if var._tv is None:
            # From outside, and written before it was read: capture it now, so it is a
            # live Variable like one read first (effects, gradients, aliasing checks).
            self.value_of(var)
        if self.is_live(var):
            if tv is None:
                self.escape("setting a captured Variable's data to None")
                return plain
            self.effects.append(("rebind", var, tv))
            # The array it stores, whose buffer the runner rebuilds it on (a view of
            # an argument's, a .grad's: pytree.rebind_views).
            self.rebind_arrays[len(self.effects) - 1] = plain
            self.rebind_lines[len(self.effects) - 1] = user_line()
            if owner is not None:
                self.rebind_owners[len(self.effects) - 1] = owner
            elif isinstance(value, TracedArray):
                # A computed array (`a = x.data * 2; W.data = a`): eager's W.data is a,
                # the very object a result `a` is too (pytree._ViewRoots.candidates).
                self.rebind_tracers[len(self.effects) - 1] = value
            var._tv = tv
        else:
            var._tv = tv if tv is not None else PENDING
        return plain

    def read_grad(self, var):
        g = var._grad
        outside = self.is_live(var) or var._tv is None     # an argument, or from outside
        if outside and self.walk_touched and not self.region_backward:
            read = self._walk_read(var)
            if read is not None:
                return read
            shadow = self._after_walk(var, "reads")
            if shadow is not None:
                return self._shadow(var, shadow[1])
        if outside and id(var) not in self.grad_writes and id(var) not in self.arg_vars:
            # The .grad the call found (None or not) is state it reads, as backward reads
            # it to add to: the variant holds while it is None / set again (an
            # argument's is in the signature).
            self.grad_reads.setdefault(id(var), (var, g is None))
            if g is not None and id(g) in self.arg_vars and self.arg_vars[id(g)][0] is g:
                # The graph reads it as that argument: it is one while the variant holds.
                self.grad_args.setdefault(id(var), (var, g))
        if g is None or self.is_mine(g._tv) or g._tv is PENDING:
            return g
        if outside and id(g) not in self.captured_vars:
            self._outside_grad_value(var, g)
        return g

    def _outside_grad_value(self, var, g):
        """The input standing for g, the .grad a Variable from outside had before the
        call (accumulated into by backward): read through its owner at every call, not
        as the object seen now."""
        entry = self.captured_vars.get(id(g))
        if entry is not None and entry[0] is g:
            return entry[1]
        v = self.add_input(g.shape, g.dtype, (self.name_of(var) or var.name or "p") + ".grad")
        # (The buffer the caller's .grad holds: a root a rebind, a result or stored
        # state can be rebuilt on, pytree.input_arrays.)
        self.read_arrays[id(v)] = g._data
        self.captured_vars[id(g)] = (g, v)
        self.captures.append((v, ("grad", var)))
        g._tv = v
        self.created.append(g)
        return v

    def write_grad(self, var, value):
        if self.is_live(var) or var._tv is None:     # a live Variable, or one from outside
            if id(var) not in self.grad_writes:
                # (The .grad before the call, should it run again: walk_undo.)
                self.walk_undo.append((var, "_grad", var._grad))
            followed = False
            if id(var) in self.walk_reads and self.walk_reads[id(var)][0] is var \
                    and not self.region_backward:
                if var.creator is not None and self.in_backprop:
                    # A root a later backward adds to (_walk_read_root): the sum, a
                    # value of the graph, is what a later walk goes on from.
                    self.reseed[id(var)] = var
                    followed = True
                else:
                    # The graph read the walk's .grad at that walk (_walk_read): a
                    # change of it after would be one the runner's later parts must
                    # follow.
                    self.escape("the function sets the .grad of a Variable after it "
                                "read the .grad a backward inside it left there, going "
                                "on into the graph from before the call; compiled calls "
                                "cannot follow it")
            if self.walk_touched and not self.region_backward and not followed:
                shadow = self._after_walk(var, "sets")
                if shadow is not None:
                    # A backward adding to the shadow: the call's part goes on from it.
                    self.walk_grads[id(var)] = (var, value)
            self.grad_writes[id(var)] = var
            if self.in_backprop and not self.region_backward and var.creator is None \
                    and id(var) not in self.cut_ids:
                # Where this backward stopped: with a creator at call time, eager's
                # backward would go on past it (backward_of).
                self.backward_leaves[id(var)] = var
        elif value is not None and id(var) not in self.made_grad_lines:
            # A Variable made in the call: where it first got a .grad (a .grad's own
            # .grad is refused at that line, call._nested_grad_line).
            self.made_grad_lines[id(var)] = user_line(3)

    def is_live(self, var):
        return id(var) in self.captured_vars and self.captured_vars[id(var)][0] is var \
            or id(var) in self.arg_vars

    # ---- NumPy on traced data

    def _np_operand(self, x, like_dtype):
        if isinstance(x, (TracedArray, Variable)):
            return self.operand(x)
        if isinstance(x, TracedScalar):
            return self.weak_operand(x, like_dtype)
        if isinstance(x, np.ndarray):
            return self.array_value(x)
        if isinstance(x, (bool, int, float)):
            return Lit(x, np.result_type(like_dtype, x) if like_dtype is not None else
                       np.asarray(x).dtype)
        if isinstance(x, np.generic):
            return Lit(x, x.dtype)
        self.escape(f"NumPy call with an operand of type {type(x).__name__}")
        return Lit(0.0, np.float64)

    def _wrap(self, y, tv, owner=None):
        y = np.asarray(y)
        t = y.view(TracedArray)
        t._tv = tv
        t._owner = owner
        t._trace = self
        return t

    def ufunc(self, ufunc, method, inputs, kwargs):
        out = kwargs.pop("out", None)
        plain = [np.asarray(x).view(np.ndarray) if isinstance(x, np.ndarray) else
                 (x._value if isinstance(x, TracedScalar) else x) for x in inputs]
        arrays = [x for x in inputs if isinstance(x, np.ndarray)]
        like = np.result_type(*arrays) if arrays else None
        if kwargs.get("where", True) is not True:
            return self._escaped_ufunc(f"np.{ufunc.__name__} with where=", ufunc, method,
                                       plain, kwargs, out)
        if method == "at":
            # np.add.at(buf, idx, v): an unbuffered in-place write into its first operand
            # (the tracer's NumPy call recorded a value and failed on the None NumPy gives).
            self.escape(f"np.{ufunc.__name__}.at(...) with traced data writes in place")
            return getattr(ufunc, method)(*[_plain_deep(x) for x in inputs],
                                          **{k: _plain_deep(v) for k, v in kwargs.items()})
        kw = {k: v for k, v in kwargs.items() if k not in ("casting", "subok")}
        if method == "__call__" and ufunc is np.square and not kw \
                and isinstance(inputs[0], np.ndarray) and inputs[0].dtype.kind in "iuf":
            # x ** 2 on an array is np.square (NumPy's own fast path): the same x * x.
            fn, ins = F.Pow(2), [self._np_operand(inputs[0], like)]
        elif method == "__call__" and ufunc in UFUNC_PRIMS and not kw:
            prim = UFUNC_PRIMS[ufunc]
            ins = [self._np_operand(x, like) for x in inputs]
            fn = prim()
            if prim is F.PowV and isinstance(ins[1], Lit) and ins[1].dtype.kind in "iuf" \
                    and not isinstance(ins[0], Lit):
                fn = F.Pow(ins[1].value.item())
                ins = ins[:1]
        elif method == "reduce" and ufunc in REDUCE_PRIMS and not kw.get("dtype") \
                and kw.get("initial") is None:
            x = inputs[0]
            axis = kw.get("axis", 0)
            fn = REDUCE_PRIMS[ufunc](F._normalize_axis(axis, x.ndim, ufunc.__name__),
                                      kw.get("keepdims", False))
            ins = [self._np_operand(x, None)]
        else:
            return self.numpy_call(ufunc, inputs, kwargs, method=method, out=out)
        # A traced Python number enters in the dtype its node has (weak, as in NumPy).
        y = fn.forward(*[(i.value if isinstance(i, Lit) else
                          np.asarray(p, dtype=i.dtype) if type(p) in (bool, int, float) else
                          np.asarray(p).view(np.ndarray)) for i, p in zip(ins, plain)])
        t = self._emit(fn, ins, y, out)
        if out is None and isinstance(t, TracedArray) and t.ndim == 0:
            t._numpy_scalar = True     # a 0-d ufunc or reduction result is a NumPy scalar
        return t

    def follow_made(self, arr, writing=False):
        """arr, an array f made (a MadeArray), meets traced data (written into it, a
        Variable of it, indexed by it): from here on it is traced data itself, its
        value so far a constant of the graph (array_value's snapshot), so what is
        computed from it later is recorded. False where it cannot be: a view of
        another made array, or one with live views (eager's views show a write)."""
        if arr.is_view() or arr.has_views():
            return False
        # Variables holding it (`v = tj.Variable(buf)`) show a write into it: followed
        # only where none of them was used yet (an earlier use read the values before)
        # and for a write (then each holds the written value, _follow_write, as a
        # Variable of computed data does, `Variable(x.data * 2)`).
        holders = arr.holders()
        if holders and (not writing or any(h._tv is not PENDING for h in holders)):
            return False
        v = self.array_value(arr)
        arr.__class__ = TracedArray
        arr._tv, arr._trace, arr._owner, arr._capture = v, self, None, None
        arr._numpy_scalar = False
        for h in holders:
            h._tv = v
            root = _root(h._data)
            self.buffer_vars.setdefault(id(root), []).append(
                (weakref.ref(h), None if _same_layout(h._data, root) else user_line(3)))
        return True

    def assign_item(self, target, key, value):
        """target[key] = value with target traced data (an argument's or a Parameter's
        .data, a value computed in f, an array f made that the tracer now follows):
        recorded as the whole new array (AssignItem), written into target's buffer as
        an in-place ufunc's result is (_write_into: an update of an argument's or a
        Parameter's data is an effect; views and Variables of the buffer follow)."""
        try:
            template, arrays = AssignItem_split(key)
        except TypeError:
            self.escape("item assignment into traced data with an index the tracer "
                        "does not follow")
            target.view(np.ndarray)[_plain_deep(key)] = _plain_deep(value)
            return
        if type(value) in (list, tuple):
            # (NumPy converts the list as np.asarray does, then casts it to the target's
            # dtype: the same values.) Its traced numbers recorded, not guarded.
            value = sequences.array_of_sequence(self, _NP_ENTRIES["asarray"][0], value,
                                                (), {}) \
                if sequences.holds_traced(value, self) else np.asarray(value)
        if isinstance(value, Variable) or not isinstance(
                value, (np.ndarray, np.generic, TracedScalar, bool, int, float)):
            self.escape(f"item assignment of a {type(value).__name__} into traced data")
            target.view(np.ndarray)[_plain_deep(key)] = _plain_deep(value)
            return
        operands = [target, value] + arrays
        plain = [np.asarray(x).view(np.ndarray) if isinstance(x, np.ndarray) else
                 (x._value if isinstance(x, TracedScalar) else x) for x in operands]
        fn = AssignItem(template)
        y = fn.forward(*plain)           # raises what eager's assignment raises
        ins = [self._np_operand(x, target.dtype) for x in operands]
        self._writing = "item assignment"
        try:
            self._emit(fn, ins, y, target)
        finally:
            self._writing = "an in-place write"

    def _emit(self, fn, ins, y, out):
        y = np.asarray(y)
        self.own(y)
        v = self.new_value(y.shape, y.dtype)
        self.graph.nodes.append(Node(fn, ins, [v], user_line(4)))
        if out is not None:
            target = out[0] if isinstance(out, tuple) else out
            return self._write_into(target, y, v)
        return self._wrap(y, v)

    def _write_into(self, target, y, v):
        """An in-place NumPy op (`param.data -= ...`): the target now holds value v."""
        if type(target) is made.MadeArray and self.follow_made(target, writing=True):
            pass          # `buf += x.data` into an array f made: followed from here on
        if isinstance(target, TracedArray):
            owner = target._owner
            base = target.view(np.ndarray)
            if target._capture is not None and target._tv is None:
                target._tv = self.array_value(target._capture)
        else:
            owner = None
            base = target
        root = _root(base)
        whole = root.shape == base.shape and root.dtype == base.dtype
        layout = _layout(base)
        copy_line = self.layout_copies.get(id(root))
        if copy_line is not None:
            self.late_escapes.append((f"an in-place update of an array a view op copied "
                                      f"(at {copy_line}: its strides do not allow a view; "
                                      f"with other strides it is a view, which shows the "
                                      f"update, and the signature does not hold strides)",
                                      user_line(3)))
        view_line = getattr(target, "_view_line", None)
        src = getattr(target, "_view_src", None)
        if view_line is not None and src is not None and src[0]._trace is self and \
                getattr(src[0], "_stale", None) is None and base.shape == y.shape:
            # `x.data[1:] *= 2`, `W.data[i] -= lr * g`: a write through a basic slice of
            # traced data is that slice assigned the written values (x's buffer then
            # holds them, and this view is rebuilt from x's new value, _refresh_views).
            target._view_src = None
            self.assign_item(src[0], src[1], self._wrap(y, v))
            return target
        if view_line is not None:
            # A NumPy view of an argument's or captured buffer (_view_of), written in
            # place: eager changes that buffer through it; the effects do not.
            # Reported after any other escape (`p.data[1:] *= 2` is item assignment too).
            self.late_escapes.append((f"an in-place update through a view (taken at "
                                      f"{view_line}) of another array (an argument's, a "
                                      f"captured or a computed one)", user_line(3)))
        if base.shape != y.shape:
            self.escape("an in-place operation that broadcasts its output")
        np.copyto(base, y, casting="unsafe")
        if y.dtype != base.dtype:
            # `w -= lr * g` with float32 w and a float64 product stays float32, as in NumPy.
            cast = self.new_value(base.shape, base.dtype)
            self.graph.nodes.append(Node(F.Cast(base.dtype), [v], [cast], user_line(4)))
            v = cast
        if self.views:
            self._refresh_views(root, layout, v if base.shape == y.shape else None)
        # The argument or captured array the target is itself (not a view of part of
        # it): a batch slice X[i:j] passed as the argument is a view, and eager writes
        # through it into the caller's buffer; so do compiled calls (the runner's
        # aliasing check sends a call whose updated view overlaps another input to
        # eager).
        itself, table = None, None
        if owner is None and isinstance(target, TracedArray):
            arg = self.arg_views.get(id(target)) if self.arg_views is not None else None
            if arg is not None and arg[0] is target and id(arg[2]) in self.arg_arrays:
                itself, table = arg[2], self.arg_arrays
            elif target._capture is not None and id(target._capture) in self.captured_arrays:
                itself, table = target._capture, self.captured_arrays
            if itself is not None and not _same_layout(base, itself):
                itself = None
        if owner is not None and self.is_live(owner):
            self.effects.append(("inplace", owner, v))
            owner._tv = v
        elif itself is not None:
            self.effects.append(("inplace_array", itself, v))
            table[id(itself)] = (itself, v)
        elif owner is None and whole and id(root) in self.captured_arrays:
            self.effects.append(("inplace_array", root, v))
            self.captured_arrays[id(root)] = (root, v)
        elif owner is None and whole and id(root) in self.arg_arrays:
            self.effects.append(("inplace_array", root, v))
            self.arg_arrays[id(root)] = (root, v)
        elif owner is None and isinstance(target, TracedArray) and self.is_mine(target._tv):
            pass  # a NumPy temporary written in place (mean() does this): rebind below
        elif owner is None and not isinstance(target, TracedArray):
            # A plain array nothing traced stands for: the caller's captured arrays and
            # the arguments' are traced views, so this is one made inside the call
            # (`buf = np.empty(n); np.multiply(x.data, 2, out=buf)`, or NumPy's C code's
            # own). NumPy reads and writes it later with no traced operand, which the
            # tracer never sees (`buf += 1` was lost: 3.2 for eager's 4.2).
            held = self.unswapped.get(id(target)) or self.unswapped.get(id(root))
            if held is not None:
                self.escape(f"a write of traced data into {held.describe()}, "
                            f"{pystate.UNSWAPPED}: compiled calls would not repeat the "
                            f"write")
            else:
                self.escape("an out= write of traced data into a NumPy array made inside "
                            "the function (np.empty(...)), which the tracer cannot follow")
        else:
            self.escape(f"{self._writing} into a value computed inside the function")
        if self.buffer_vars:
            self._follow_write(base, v, owner)
        if isinstance(target, TracedArray):
            target._tv = v
            return target
        return target

    def _follow_write(self, base, v, owner):
        """An in-place write of value v into base: the Variables made earlier of that
        very buffer (same layout) now hold v, as eager's read the updated buffer; one
        holding part of it, or a view of another layout, is stale: used later, the
        call runs eagerly (the graph cannot split an update of a buffer)."""
        refs = self.buffer_vars.get(id(_root(base)))
        if not refs:
            return
        for entry in list(refs):
            ref, line = entry
            var = ref()
            if var is None:
                refs.remove(entry)
                continue
            d = var if isinstance(var, TracedArray) else var._data
            if var is owner or not isinstance(d, np.ndarray):
                continue
            if _same_layout(d, base):
                var._tv = v
            elif not np.may_share_memory(d, base):
                continue
            else:
                stale = (line or "an earlier line", user_line(4))
                if isinstance(var, TracedArray):
                    var._stale = stale
                else:
                    self.stale_vars[id(var)] = (ref, stale)

    def numpy_call(self, func, args, kwargs, method=None, out=None):
        # (NumPy's own function, not the stand-in a trace puts in its namespace: tracejit
        # code that names np.argmax while a trace runs gets the stand-in, and the graph
        # keeps, exports and saves NumPy's.)
        hit = _ENTRY_ORIGINALS.get(id(func))
        if hit is not None and hit[0] is func:
            func = hit[1]
        name = getattr(func, "__name__", func)
        plain = [_plain(a) for a in args]
        if out is not None:
            return self._escaped_ufunc(f"np.{name} with out=", func, method, plain, kwargs,
                                       out)
        ins, consts, seqs, operands = [], [], [], []
        arrays = [a for a in args if isinstance(a, np.ndarray)]
        like = np.result_type(*arrays) if arrays else None
        for pos, a in enumerate(args):
            if isinstance(a, (np.ndarray, Variable, TracedScalar)):
                # A Python number weak, as NumPy takes it (plain holds its Python value).
                ins.append(self.operand(a) if not isinstance(a, TracedScalar) else
                           self.weak_operand(a, like))
                operands.append(plain[pos])
            elif _holds_operand(a):
                # np.concatenate([a, b]), np.stack((a, 0.5 * a)): the sequence's operands
                # flattened into the node's inputs, its shape and constants a template.
                tmpl = self._seq_template(a, name, ins, operands)
                if tmpl is None:
                    return self._escaped_ufunc(f"np.{name} with a sequence holding "
                                               f"something other than arrays and "
                                               f"numbers", func, method, plain, kwargs,
                                               None)
                seqs.append((pos, tmpl))
            elif _is_static_constant(a):
                # np.round(a, 2), a // 0.3, np.where(c, a, 0.0): the constant itself, at
                # its place in each call (NumPy takes a Python number weakly).
                consts.append((pos, a))
            else:
                return self._escaped_ufunc(f"np.{name} with a non-array positional "
                                           f"argument", func, method, plain, kwargs, None)
        try:
            static = tuple(sorted(kwargs.items()))
            hash(static)
        except TypeError:
            return self._escaped_ufunc(f"np.{name} with unhashable keyword arguments", func,
                                       method, plain, kwargs, None)
        fn = NumpyCall(func, method, static, consts, seqs)
        y = fn.raw(*[(i.value if isinstance(i, Lit) else p) for i, p in zip(ins, operands)])
        if type(y) is tuple:
            # np.modf, np.divmod, np.nonzero, np.where(c): one node per result, each the
            # call picking its own (NumPy's results are fresh arrays, no views).
            if not all(isinstance(r, (np.ndarray, np.generic)) for r in y):
                return self._escaped_ufunc(f"np.{name}, which returns several values",
                                           func, method, plain, kwargs, None)
            return tuple(self._numpy_result(
                NumpyCall(func, method, static, consts, seqs, k), ins, operands, r, name,
                static_shape=isinstance(func, np.ufunc) or
                name in _SHAPE_STATIC and not (name == "where" and len(args) == 1))
                for k, r in enumerate(y))
        return self._numpy_result(fn, ins, operands, y, name, static_shape=(
            isinstance(func, np.ufunc) and method != "at" or name in _SHAPE_STATIC))

    def _numpy_result(self, fn, ins, operands, y, name, static_shape):
        t = self._emit(fn, ins, y, None)
        if isinstance(t, TracedArray) and isinstance(y, np.ndarray):
            self._numpy_view(t, fn, ins, operands)
        if isinstance(t, TracedArray) and not static_shape:
            # The result's shape may depend on the data (np.unique(t), np.bincount(t)):
            # the graph after it holds this one (len(np.unique(t)) is a constant of it).
            # A guard on it keeps the call in the graph and holds the shape; compiled
            # plans check it right after the call too (plan._check_result).
            self.graph.nodes.append(Node(Guard("shape", tuple(int(d) for d in y.shape)),
                                         [t._tv], [], user_line(2)))
        if isinstance(t, TracedArray):
            if isinstance(y, np.generic):
                t._numpy_scalar = True     # np.std(a), np.dot(a, b): a NumPy scalar
            elif type(y) in (bool, int, float):
                t._numpy_scalar = "python"     # np.allclose: a Python scalar
        return t

    def _seq_template(self, seq, name, ins, operands):
        """The template of a sequence argument (NumpyCall.seqs), its operands appended
        to ins and operands; None if it holds what cannot be replayed."""
        entries = []
        for x in seq:
            if isinstance(x, (np.ndarray, Variable)):
                ins.append(self.operand(x))
                operands.append(_plain(x))
                entries.append(None)
            elif isinstance(x, TracedScalar):
                # A traced Python number in the list: its value, behind a guard.
                entries.append(("c", self.freeze(x, f"an element of np.{name}'s sequence")))
            elif isinstance(x, (list, tuple)):
                sub = self._seq_template(x, name, ins, operands)
                if sub is None:
                    return None
                entries.append(sub)
            elif type(x) in (bool, int, float, type(None)):
                entries.append(("c", x))
            else:
                return None
        return ("list" if isinstance(seq, list) else "tuple", tuple(entries))

    def _numpy_view(self, t, fn, ins, operands):
        """t, a NumPy call's result, is a view of an operand's buffer (np.flip,
        np.expand_dims, np.ravel): as eager's, it shows a later in-place write of that
        buffer (the call recorded again on the new value), and a write through it, which
        changes the operand in eager, is an escape (_view_line)."""
        shared = [k for k, p in enumerate(operands)
                  if isinstance(p, np.ndarray) and np.may_share_memory(t, p)]
        if not shared:
            return
        line = self.graph.nodes[-1].line
        t._view_line = line
        rebuild = None
        if len(shared) == 1:
            k = shared[0]
            tr_ref = weakref.ref(self)   # self.views holds this: no Trace -> Trace cycle

            def rebuild(t, src_value):
                self = tr_ref()
                out = self.new_value(t.shape, t.dtype)
                self.graph.nodes.append(Node(fn, ins[:k] + [src_value] + ins[k + 1:],
                                             [out], user_line(2)))
                t._tv = out
                return out
        self._note_view(t, operands[shared[0]], line, rebuild, keep=True)

    def array_function(self, func, args, kwargs):
        name = getattr(func, "__name__", "")
        if name in ("shape", "ndim", "size", "result_type", "may_share_memory",
                    "shares_memory", "iscomplexobj", "isrealobj"):
            return func._implementation(*[np.asarray(a).view(np.ndarray)
                                         if isinstance(a, np.ndarray) else a for a in args],
                                        **kwargs)
        if name in ("sum", "mean", "max", "amax", "min", "amin", "reshape", "transpose",
                    "copy", "argmax", "argmin") and args and isinstance(args[0], TracedArray):
            method = {"amax": "max", "amin": "min"}.get(name, name)
            return getattr(args[0], method)(*args[1:], **kwargs)
        if name == "copyto" and len(args) == 2 and not kwargs and \
                isinstance(args[0], np.ndarray) and \
                np.can_cast(np.result_type(args[1]), args[0].dtype, "same_kind"):
            # np.copyto(buf, x.data) is buf[...] = x.data (its default casting checked
            # here: same_kind, where item assignment casts unsafely).
            dst = args[0]
            if type(dst) is made.MadeArray and self.follow_made(dst, writing=True) or \
                    type(dst) is TracedArray and dst._trace is self:
                self.assign_item(dst, Ellipsis, args[1])
                return None
        if name in made.IN_PLACE_WRITERS:
            # np.copyto(buf, x.data), np.put(...): NumPy writes the first argument in
            # place, which a graph of values does not follow (a traced destination's
            # update, or traced values copied as plain data into a plain array).
            self.escape(f"np.{name} writes traced data, or into traced data, in place")
            return func._implementation(*[_plain_deep(a) for a in args],
                                        **{k: _plain_deep(v) for k, v in kwargs.items()})
        flat_ok = all(isinstance(a, (np.ndarray, Variable)) or _holds_operand(a)
                      for a in args)
        if flat_ok:
            return self.numpy_call(func, args, kwargs)
        if any(isinstance(a, (np.ndarray, Variable)) or _holds_operand(a) for a in args) \
                and all(isinstance(a, (np.ndarray, Variable, TracedScalar)) or
                        _holds_operand(a) or _is_static_constant(a) for a in args):
            # Constants as NumpyCall.consts; a traced Python number among them (np.round(
            # d, n)) is a parameter of the call: its value, behind a guard.
            return self.numpy_call(func, [
                self.freeze(a, f"an argument of np.{name}") if isinstance(a, TracedScalar)
                else a for a in args], kwargs)
        self.escape(f"np.{name} applied to traced data")
        return func._implementation(*[_plain_deep(a) for a in args], **kwargs)

    def record_data_op(self, fn, x, *args):
        """A tracejit function applied to traced data, giving traced data."""
        var = Variable.__new__(Variable)
        self.check_stale(x)
        var._tv = x._tv if self.is_mine(x._tv) else self.array_value(x)
        var._data = x.view(np.ndarray)
        var._grad = None
        var.name = None
        var.creator = None
        var.generation = 0
        self.created.append(var)
        with core.no_grad():
            y = fn(var, *args)
        if not isinstance(y, Variable):
            return y
        if fn in _VIEW_OPS:
            self._view_call = (fn, args)
            return self._view_of(x, _VIEW_OPS[fn](x.view(np.ndarray), *args), y)
        return self._wrap(y._data, self.value_of(y))

    def _view_of(self, x, numpy_result, y):
        """y's tracer; where NumPy gives a view of x's buffer (`d[0:2]`, reshape, .T), a
        tracer of that view: an in-place update of the buffer later changes it, as in
        eager, and the view's value is then rebuilt from the buffer's new value
        (_refresh_views)."""
        tv = self.value_of(y)
        if isinstance(numpy_result, np.ndarray) and numpy_result.base is not None \
                and numpy_result.shape == y._data.shape:
            root = _root(x.view(np.ndarray))
            if _root(numpy_result) is root:
                t = self._wrap(numpy_result, tv)
                t._view_line = user_line(3)
                fn, args = self._view_call
                # (x[key] of traced data x: an in-place write through it is x[key] = the
                # written values, _write_into.)
                t._view_src = (x, args[0]) if fn is F.get_item else None
                src = x.view(np.ndarray)
                self._note_view(t, src, user_line(3), self._data_op_rebuilder(fn, src, args))
                return t
        src = x.view(np.ndarray)
        if not src.flags.c_contiguous and isinstance(numpy_result, np.ndarray) and \
                numpy_result.shape == y._data.shape:
            self.layout_copies.setdefault(id(_root(src)), user_line(3))
        return self._wrap(y._data, tv)

    def _note_view(self, target, src, line, rebuild, keep=False):
        """target (a Variable or a tracer) holds a NumPy view of src's buffer (src: a
        plain array, or None: unknown). rebuild(target, value of src) gives target the
        value it has after src's buffer is written in place (None: it cannot, and a use
        of target after such a write runs eagerly). keep: held for the trace, as a view
        taken of it may outlive it (np.expand_dims(c, 0)[0]), rebuilt after it."""
        if self._rebuilding:
            return                  # the rebuilt value's own temporaries: not views
        data = target._data if isinstance(target, Variable) else target.view(np.ndarray)
        root = _root(data)
        ref = (lambda: target) if keep else weakref.ref(target)
        self.views.setdefault(id(root), []).append(
            (ref, line, None if src is None else _layout(src), rebuild))

    def _op_rebuilder(self, node):
        """A view made by a tracejit Function (F.reshape(W, ...)): the same op, on the
        operand's new value, as eager's Variable shows it (its data is the view)."""
        op, meta_key = node.fn, id(node)
        tr_ref = weakref.ref(self)      # self.views holds this: no Trace -> Trace cycle

        def rebuild(y, src_value):
            self = tr_ref()
            out = self.new_value(y.shape, y.dtype)
            fresh = Node(op, [src_value], [out], user_line(2))
            self.graph.nodes.append(fresh)
            # Eager's graph is unchanged (y is still op's output of its operand): a
            # create_graph replay links the rebuilt node as it linked the original.
            self.grad_meta[id(fresh)] = self.grad_meta[meta_key]
            if meta_key in self.leaf_operands:
                self.leaf_operands[id(fresh)] = self.leaf_operands[meta_key]
            self.owner[id(out)] = y
            y._tv = out
            return out
        return rebuild

    def _data_op_rebuilder(self, fn, src, args):
        """A view of traced data (`W.data.T`, `d[0:2]`): fn(src, *args) recorded again
        on the new value of its operand src."""
        tr_ref = weakref.ref(self)      # self.views holds this: no Trace -> Trace cycle

        def rebuild(t, src_value):
            self = tr_ref()
            var = Variable.__new__(Variable)
            var._tv, var._data, var._grad = src_value, src, None
            var.name, var.creator, var.generation = None, None, 0
            self.created.append(var)
            self._rebuilding = True
            try:
                with core.no_grad():
                    y = fn(var, *args)
            finally:
                self._rebuilding = False
            t._tv = self.value_of(y)
            return t._tv
        return rebuild

    def _refresh_views(self, root, layout, value):
        """An in-place write of value into the buffer `layout` (a view of root, or root
        itself): the live views of root taken before show the write in eager. Each
        whose operand is that buffer, or a view rebuilt here, is rebuilt from the new
        value, in the order they were taken (a view of a view after its operand); any
        other is stale (a use of it runs eagerly)."""
        entries = self.views.pop(id(root), ())
        fresh = {} if value is None else {layout: value}
        kept = []
        for entry in entries:
            ref, line, src, rebuild = entry
            t = ref()
            if t is None:
                continue
            src_value = fresh.get(src)
            if src_value is None or rebuild is None:
                line = line or "a `.data` read"
                if isinstance(t, Variable):
                    self.stale_vars[id(t)] = (ref, (line, user_line(3)))
                else:
                    t._stale = (line, user_line(3))
                continue
            data = t._data if isinstance(t, Variable) else t.view(np.ndarray)
            fresh[_layout(data)] = rebuild(t, src_value)
            kept.append(entry)            # it can be rebuilt again after another write
        if kept:
            self.views[id(root)] = kept + self.views.get(id(root), [])

    def _check_stale_var(self, var):
        entry = self.stale_vars.get(id(var))
        if entry is not None and entry[0]() is var:
            del self.stale_vars[id(var)]           # one escape is enough
            self._stale_escape(entry[1])

    def check_stale(self, t):
        stale = getattr(t, "_stale", None)
        if stale is not None:
            t._stale = None              # one escape is enough
            self._stale_escape(stale)

    def _stale_escape(self, stale):
        self.escapes.append((
            f"a view of an array (taken at {stale[0]}) is used after an in-place "
            f"update of that array (at {stale[1]}): eager's view shows the update, the "
            f"compiled graph would compute it from the values before", stale[1]))

    def array_constructor(self, name, orig, a, args, kwargs):
        """np.asarray / np.array / np.ascontiguousarray ... (name) of traced data a,
        from the user's code: recorded where the tracer has their semantics."""
        params = dict(zip(("dtype", "copy") if name in ("asarray", "array") else
                          ("dtype",), args))
        if len(args) > len(params) or set(kwargs) - {"dtype", "copy"} or \
                set(params) & set(kwargs) or name in ("frombuffer", "require") or \
                a.dtype.kind not in "biuf":
            self.escape(f"np.{name}(...) of traced data (only np.asarray, np.array, "
                        f"np.ascontiguousarray with dtype=/copy= are followed)")
            return orig(a.view(np.ndarray), *args, **kwargs)
        params.update(kwargs)
        dtype = params.get("dtype")
        copy_ = params.get("copy", True if name == "array" else None)
        if name in ("ascontiguousarray", "asfortranarray", "asarray_chkfinite"):
            plain = a.view(np.ndarray)
            if name == "asarray_chkfinite":
                orig(plain, dtype)      # raises on inf/nan now; the values are checked
                self.escape("np.asarray_chkfinite(...) of traced data")
                return orig(plain, dtype)
            if dtype is not None and np.dtype(dtype) != a.dtype:
                a = a.astype(np.dtype(dtype))
            if a.ndim == 0:
                return a.reshape(1)    # NumPy gives at least one dimension (a view)
            contiguous = plain.flags.c_contiguous if name == "ascontiguousarray" else \
                plain.flags.f_contiguous
            return a if contiguous else a.copy()     # the same values either way
        if copy_ is False and dtype is not None and np.dtype(dtype) != a.dtype:
            return orig(a.view(np.ndarray), *args, **kwargs)   # NumPy's ValueError
        if dtype is not None and np.dtype(dtype) != a.dtype:
            return a.astype(np.dtype(dtype))          # a cast (a new array, as NumPy)
        if copy_:
            return a.copy()
        if not a._numpy_scalar:
            return a          # the array itself, as np.asarray(x.data) is x.data
        # np.asarray of a NumPy scalar (a.mean()): a 0-d array of the same value.
        return self._wrap(a.view(np.ndarray), self.array_value(a), None)

    def numpy_scalar_cast(self, x, dtype):
        """np.float32(x) (dtype) of traced data or a traced Python number, recorded as
        a cast: a traced NumPy scalar (0-d), or the cast array. None: not one the graph
        reproduces exactly (float to int truncates, overflows and NaNs differ): eager's
        own constructor then (whose reading of traced data is an escape)."""
        src = x.dtype
        if src.kind not in "biuf" or (dtype.kind in "iu" and src.kind not in "biu"):
            return None
        if dtype.kind in "iu" and not np.can_cast(src, dtype, casting="safe"):
            return None          # a narrowing int cast wraps around: not recorded
        if isinstance(x, TracedScalar):
            if dtype.kind in "iu":
                return None      # np.int32(5): range checks NumPy makes, not the graph
            value = np.asarray(dtype.type(x._value))
            t = self._wrap(value, self.scalar_cast_value(x, dtype))
            t._numpy_scalar = True
            return t
        y = x.astype(dtype)
        if y is x or (isinstance(y, TracedArray) and y._tv is x._tv):
            y = self._wrap(x.view(np.ndarray).copy(), self.array_value(x))
        if isinstance(y, TracedArray) and y.ndim == 0:
            y._numpy_scalar = True
        return y

    # ---- guards and escapes

    def guard(self, x, conv):
        tv = self.array_value(x)
        plain = np.asarray(x).view(np.ndarray)
        if conv == "bool":
            outcome = bool(plain)
        elif conv == "float":
            outcome = float(plain)
        else:
            outcome = plain.__index__() if conv == "index" else int(plain)
        line = user_line(3)
        self.graph.nodes.append(Node(Guard(conv, outcome), [tv], [], line))
        if conv in ("float", "int") and log.isEnabledFor(logging.INFO):
            log.info("jit: %s() of traced data outside the jitted function's own code (a "
                     "helper it calls, or a C function) at %s: guarded by its value %r (a "
                     "new value retraces; .item() is followed everywhere)", conv, line,
                     outcome)
        return outcome

    def escape(self, reason, line=None):
        """Record what cannot be replayed; the traced call itself goes on, eagerly right.
        line: where the cause is, when no frame of the user's is running (else the
        innermost user frame's)."""
        self.escapes.append((reason, line or user_line(3)))

    def _escaped_ufunc(self, reason, func, method, plain, kwargs, out):
        self.escape(reason)
        # Plain keyword arrays too (a traced where= mask would call back here forever).
        kwargs = {k: _plain(v) if isinstance(v, np.ndarray) else v
                  for k, v in kwargs.items()}
        if out is not None:
            kwargs["out"] = tuple(_plain(o) for o in out) if isinstance(out, tuple) \
                else _plain(out)
        f = func if not method or method == "__call__" else getattr(func, method)
        return f(*plain, **kwargs)

    def own(self, arr):
        """Remember a buffer computed inside the trace (kept alive so ids stay unique)."""
        self.owned[id(arr)] = arr

    def _is_owned(self, arr):
        while arr is not None:
            if id(arr) in self.owned:
                return True
            arr = arr.base if isinstance(arr.base, np.ndarray) else None
        return False

    def side_effect(self, what):
        """An effect only the tracing run has (print, repr of traced data), made by the
        caller of the hook that reports it: recorded when that is the user's code."""
        f = user_frame(sys._getframe(2))
        if f is not None:
            self.side_effects.append((what, frame_line(f)))


_DTYPE_OF = {float: np.dtype(np.float64), int: np.dtype(np.int64), bool: np.dtype(bool)}
_CMP_OPS = ("gt", "ge", "lt", "le", "eq", "ne")
# The node each computes with. // and % are NumPy's, which follow Python's floor
# semantics (sign of the divisor); a zero divisor is guarded against (Python raises).
_SCALAR_FNS = {"add": F.Add, "sub": F.Sub, "mul": F.Mul, "truediv": F.Div, "pow": F.PowV,
               "floordiv": lambda: NumpyCall(np.floor_divide),
               "mod": lambda: NumpyCall(np.remainder),
               "and": lambda: NumpyCall(np.bitwise_and),
               "or": lambda: NumpyCall(np.bitwise_or),
               "xor": lambda: NumpyCall(np.bitwise_xor),
               "gt": F.Greater, "ge": F.GreaterEqual, "lt": F.Less, "le": F.LessEqual,
               "eq": F.Equal, "ne": F.NotEqual}
_SCALAR_UNARY_FNS = {"neg": F.Neg, "abs": F.Abs, "invert": lambda: NumpyCall(np.invert)}


def _same_number(y, result):
    got = y.item()
    return type(got) is type(result) and (got == result or (got != got and
                                                            result != result))


_CALL_ATTRS = ("inputs", "outputs", "generation")


def _detached(fn):
    """A copy of a Function for a graph node: same parameters, no inputs or outputs,
    so a variant keeps no traced argument or intermediate alive."""
    if type(fn).__module__.startswith("tracejit"):
        try:
            # A traced Python number as a static parameter (an axis, a clip bound) is
            # the value it is: guarded, so the node holds a plain number.
            return type(fn)(*[_static(p) for p in fn.param_values()])
        except TypeError:
            pass
    clone = copy.copy(fn)
    for attr in ("inputs", "outputs", "generation"):
        clone.__dict__.pop(attr, None)
    return clone


def _static(p):
    if isinstance(p, TracedScalar):
        return p._trace.freeze(p, "a static parameter of a tracejit function") \
            if p._trace is not None else p._value
    if type(p) in (tuple, list):
        return type(p)(_static(x) for x in p)
    return p


# tracejit functions on traced data that NumPy computes as views of their operand's
# buffer: what NumPy gives for the same call (a view or a copy).
_VIEW_OPS = {
    F.get_item: lambda a, key: a[key],
    F.reshape: lambda a, shape: a.reshape(shape),
    F.transpose: lambda a, axes=None: a.transpose(axes),
}


def _same_layout(a, b):
    # One buffer, one layout: a is b in all but the Python object.
    return (a.shape == b.shape and a.dtype == b.dtype and a.strides == b.strides
            and a.__array_interface__["data"][0] == b.__array_interface__["data"][0])


def _root(a):
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


def _layout(a):
    """The memory an array's values are read from: two arrays of one layout hold the
    same values (a view of a buffer, made again, is the same view)."""
    return (a.__array_interface__["data"][0], a.shape, a.strides, a.dtype.str)


def _plain(a):
    if isinstance(a, Variable):
        return a._data
    if isinstance(a, TracedScalar):
        return a._value
    if isinstance(a, np.ndarray):
        return a.view(np.ndarray)
    return a


def _plain_deep(a):
    if isinstance(a, (list, tuple)):
        return type(a)(_plain_deep(x) for x in a)
    return _plain(a)


# print() runs only while tracing: a wrapper installed while any thread traces reports
# it to that thread's trace (other threads' prints pass through untouched).
_print_lock = threading.Lock()
_print_users = 0
_original_print = builtins.print


# NumPy functions whose result's shape follows from their operands' shapes and static
# arguments alone (with ufuncs): any other NumPy call's result shape is guarded.
_SHAPE_STATIC = frozenset(
    "round around clip cumsum cumprod where flip fliplr flipud roll rot90 tile "
    "expand_dims squeeze swapaxes transpose moveaxis ravel reshape diagonal trace take "
    "take_along_axis dot vdot matmul einsum tensordot outer inner kron cross sort "
    "argsort argmax argmin amax amin max min sum mean std var prod ptp percentile "
    "quantile median nanmean nansum nanmax nanmin nanstd nanvar average cov corrcoef "
    "isclose allclose array_equal full_like zeros_like ones_like empty_like pad "
    "nan_to_num searchsorted copy real imag diff interp norm broadcast_to atleast_1d "
    "atleast_2d atleast_3d triu tril any all count_nonzero python_round_to "
    "concatenate stack hstack vstack dstack column_stack row_stack block".split())


def _holds_operand(a):
    """a is a list or tuple (maybe nested) with an array or Variable in it."""
    return isinstance(a, (list, tuple)) and any(
        isinstance(x, (np.ndarray, Variable)) or _holds_operand(x) for x in a)


def _user_layouts(inputs, outputs):
    """Per output of a user Function's forward: None where it is laid out as an
    elementwise NumPy op of its inputs lays it out (as its first input of its shape, else
    C order), else its axis order, outermost first: what eager_layouts' run stands in
    for the node with (the user's code runs once per call)."""
    arrays = [x._data for x in inputs if isinstance(x._data, np.ndarray)]
    rules = []
    for y in outputs:
        a = y._data
        if not isinstance(a, np.ndarray) or a.ndim < 2:
            rules.append(None)
            continue
        like = next((x for x in arrays if x.shape == a.shape), None)
        guess = np.zeros(a.shape, a.dtype) if like is None else np.zeros_like(like, a.dtype)
        order = tuple(sorted(range(a.ndim), key=lambda d: (-abs(a.strides[d]), -a.shape[d], d)))
        rules.append(None if guess.strides == a.strides or (guess.flags.c_contiguous and
                                                            a.flags.c_contiguous) else order)
    return rules


def _is_static_constant(a):
    """A Python constant a NumPy call takes as a parameter (2 in np.round(a, 2), the
    pad widths of np.pad): numbers, strings, None, tuples of those."""
    if isinstance(a, tuple):
        return all(_is_static_constant(x) for x in a)
    return type(a) in (bool, int, float, str, type(None))


def _tracing_print(*args, **kwargs):
    tr = core._state.trace
    if tr is not None and not tr.abstract:
        tr.side_effect("print()")
        # A traced number printed is shown, not guarded: print runs only while tracing
        # (the side-effect warning says so), so what it shows cannot change a result.
        args = [a._value if isinstance(a, TracedScalar) else a for a in args]
    return _original_print(*args, **kwargs)


_original_seed = np.random.seed


def _tracing_seed(seed=None):
    """np.random.seed while some thread traces: recorded (arrayops.RandomSeed) when
    this thread traces and the seed is a plain integer; else NumPy's own."""
    tr = core._state.trace
    if tr is None or tr.abstract:
        return _original_seed(seed)
    if isinstance(seed, TracedScalar) and seed.pytype is int:
        # A seed computed from traced data (int(...) + k): the value it is, guarded
        # (a new value retraces), as the seed is a parameter of the node.
        seed = tr.freeze(seed, "np.random.seed")
    if isinstance(seed, (int, np.integer)) and not isinstance(seed, bool) and seed >= 0:
        from tracejit.ops.arrayops import RandomSeed
        RandomSeed(int(seed))()
        return None
    tr.escape(f"np.random.seed({type(seed).__name__}): only an integer seed is replayed")
    return _original_seed(seed)


_original_py_seed = random.seed


def _tracing_py_seed(*args, **kwargs):
    # Python's random draws are never replayed; a seed inside the function would hide
    # them from jit's after-trace comparison of the stream's state (seed, then draw the
    # same numbers the warm-up drew: the state ends where it started).
    tr = core._state.trace
    if tr is not None and not tr.abstract:
        tr.escape("random.seed() inside the function: Python's random stream cannot be "
                  "replayed by compiled calls; draw with tracejit functions (F.dropout) "
                  "after np.random.seed")
    return _original_py_seed(*args, **kwargs)


# ---- NumPy's array constructors on traced data

# np.asarray(x.data) and friends do not dispatch (__array_function__) for an ndarray
# subclass: NumPy hands out a plain array of the traced buffer, and what is computed
# from it is frozen (a branch on its mean is never guarded). While a trace runs, the
# module's functions are these: for this thread's traced data, called from outside
# tracejit, the NumPy semantics recorded (np.asarray is the array itself, np.array a
# copy, a dtype= a cast), or an escape.
_NP_ENTRIES = {}
_ENTRY_ORIGINALS = {}      # id(entry) -> (entry, NumPy's function)


def _register(name, orig, entry):
    """entry stands for NumPy's orig (name) while a trace runs (start() swaps it in)."""
    entry.__name__ = entry.__qualname__ = name
    entry.__doc__ = orig.__doc__
    entry.__wrapped__ = orig
    _NP_ENTRIES[name] = (orig, entry)
    _ENTRY_ORIGINALS[id(entry)] = (entry, orig)


def _np_entry(name):
    orig = getattr(np, name)

    def entry(a, *args, **kwargs):
        tr = core._state.trace
        if tr is None or tr.abstract:
            return orig(a, *args, **kwargs)
        if type(a) is TracedArray and a._trace is tr:
            if is_internal(sys._getframe(1)):
                return orig(a, *args, **kwargs)
            return tr.array_constructor(name, orig, a, args, kwargs)
        if name in ("array", "asarray") and type(a) in (list, tuple) and \
                sequences.holds_traced(a, tr) and not is_internal(sys._getframe(1)):
            return sequences.array_of_sequence(tr, orig, a, args, kwargs)
        if type(a) is made.MadeArray:
            pv = np.ndarray.view(a, np.ndarray)
            r = orig(pv, *args, **kwargs)
            return a if r is pv else made.made(r, sys._getframe(1))   # np.asarray(buf)
        return made.made(orig(a, *args, **kwargs), sys._getframe(1))
    _register(name, orig, entry)


for _n in ("asarray", "array", "ascontiguousarray", "asfortranarray", "asarray_chkfinite",
           "frombuffer", "require"):
    _np_entry(_n)


def _np_made_entry(name):
    """A NumPy constructor of constants (np.zeros, np.arange ...): its result a MadeArray
    when the user's code calls it while this thread traces (trace/made.py)."""
    orig = getattr(np, name)

    def entry(*args, **kwargs):
        r = orig(*args, **kwargs)
        if type(r) is np.ndarray and core._state.trace is not None:
            return made.made(r, sys._getframe(1))
        return r
    _register(name, orig, entry)


for _n in ("zeros", "ones", "empty", "zeros_like", "ones_like", "empty_like", "arange",
           "linspace", "logspace", "eye", "identity", "copy", "tri"):
    _np_made_entry(_n)


# np.stack([float(m), 1.0]), np.full(shape, float(v)): traced numbers that NumPy's C
# code reads through __array__ (a guard by value each) unless they are traced arrays
# first (trace/sequences.py).
def _np_sequence_entry(name):
    orig = getattr(np, name)

    def entry(seq, *args, **kwargs):
        tr = core._state.trace
        if tr is not None and not tr.abstract and type(seq) in (list, tuple) and \
                sequences.holds_traced(seq, tr) and not is_internal(sys._getframe(1)):
            items = sequences.as_stack_items(tr, seq)
            if items is not None:
                seq = items
        r = orig(seq, *args, **kwargs)
        # Of constants only (made arrays among them: NumPy's C code makes a plain
        # result): an array f made, as np.zeros's is (a write of traced data into
        # it, then a branch on it, was frozen).
        return made.made(r, sys._getframe(1)) if tr is not None else r
    _register(name, orig, entry)


for _n in ("stack", "concatenate", "hstack", "vstack", "dstack", "column_stack"):
    _np_sequence_entry(_n)


def _np_fill_entry(name, follow):
    orig = getattr(np, name)

    def entry(a, fill_value, *args, **kwargs):
        tr = core._state.trace
        if tr is not None and not tr.abstract and sequences.holds_traced(fill_value, tr) \
                and not is_internal(sys._getframe(1)):
            return follow(tr, orig, a, fill_value, args, kwargs)
        r = orig(a, fill_value, *args, **kwargs)
        return made.made(r, sys._getframe(1)) if tr is not None else r
    _register(name, orig, entry)


_np_fill_entry("full", sequences.full)
_np_fill_entry("full_like", sequences.full_like)


# Every other public NumPy function (np.where, np.pad, np.outer, np.resize, np.kron,
# np.fromfunction, np.indices ...): a fresh plain array it gives the user's code is an
# array f made (made.made_result). NumPy's C code makes these of made operands without
# subclass propagation, or of Python lists and shapes, and traced data written into one
# then branched on was frozen, silently. (Ufuncs propagate the subclass themselves;
# types, np.ndarray among them, are not swapped: trace/record's code rewrite calls
# np.ndarray(...) through _np_ndarray.)
def _made_results(r, args, kwargs, frame):
    """r (a NumPy function's result) with each fresh plain array in it made (one level:
    a tuple, list or namedtuple of them, np.meshgrid, np.linalg.eig)."""
    t = type(r)
    if t is np.ndarray:
        return made.made_result(r, args, kwargs, frame)
    if isinstance(r, (tuple, list)) and (t is tuple or t is list or hasattr(t, "_make")) \
            and any(type(a) is np.ndarray for a in r):
        items = [made.made_result(a, args, kwargs, frame) if type(a) is np.ndarray else a
                 for a in r]
        return t(items) if t is tuple or t is list else t._make(items)
    return r


def _float_sequence(a, tr):
    """a is a list or tuple holding tr's traced values, every one of a float dtype."""
    if type(a) not in (list, tuple) or not sequences.holds_traced(a, tr):
        return False

    def floats(x):
        if type(x) in (list, tuple):
            return all(floats(y) for y in x)
        if (type(x) is TracedArray or isinstance(x, TracedScalar)) and x._trace is tr:
            return x.dtype.kind == "f"
        return True
    return floats(a)


def _traced_sequences(tr, args, kwargs):
    """np.mean([a.sum(), b.sum()]), np.interp(t, xp, [d[0], d[1]]): a list of traced
    values where no argument is traced data does not dispatch to the tracer, and NumPy's
    C code read each value (a guard by value: every new value retraced, or, for traced
    arrays in an argument the function does not coerce first, the traced call's values
    frozen). Such a list of floats is the traced array np.asarray makes of it (recorded),
    so the call dispatches. (Float lists only: an int list may be a shape or a width,
    which the graph must not read as data.)"""
    vals = list(args) + list(kwargs.values())
    if any((type(a) is TracedArray and a._trace is tr) or isinstance(a, Variable)
           for a in vals):
        return args, kwargs              # dispatched: the tracer takes the lists itself
    asarray = _NP_ENTRIES["asarray"][0]

    def conv(a):
        if _float_sequence(a, tr):
            try:
                t = sequences.array_of_sequence(tr, asarray, a, (), {})
            except (ValueError, TypeError):      # ragged: the function's own business
                return a
            if type(t) is TracedArray:
                return t
        return a
    return tuple(conv(a) for a in args), {k: conv(v) for k, v in kwargs.items()}


_RESULT_ENTRIES = set()     # ids of _np_result_entry's stand-ins


# Functions whose list argument is a sequence of arrays, not one array_like: np.block,
# np.einsum's operands, np.meshgrid ... (np.block(asarray(list)) is another array).
_SEQUENCE_TAKERS = frozenset("""block concat concatenate stack hstack vstack dstack
    column_stack row_stack unstack einsum einsum_path meshgrid broadcast_arrays select
    choose piecewise ix_ histogramdd savez savez_compressed save savetxt multi_dot
    apply_along_axis apply_over_axes""".split())


def _np_result_entry(orig, name, module=None):
    takes_arrays = name not in _SEQUENCE_TAKERS

    def entry(*args, **kwargs):
        tr = core._state.trace
        if tr is None or tr.abstract:
            return orig(*args, **kwargs)
        frame = sys._getframe(1)
        if is_internal(frame) or frame.f_code.co_filename.startswith(_NP_DIR):
            return orig(*args, **kwargs)     # tracejit's own calls, NumPy's: as they are
        if takes_arrays and (any(type(a) in (list, tuple) for a in args) or
                             any(type(a) in (list, tuple) for a in kwargs.values())):
            args, kwargs = _traced_sequences(tr, args, kwargs)
        return _made_results(orig(*args, **kwargs), args, kwargs, frame)
    _RESULT_ENTRIES.add(id(entry))
    if module is None:
        _register(name, orig, entry)
    else:
        entry.__name__ = entry.__qualname__ = name
        entry.__doc__, entry.__wrapped__ = orig.__doc__, orig
        _SUB_ENTRIES.append((module, name, orig, entry))
        _ENTRY_ORIGINALS[id(entry)] = (entry, orig)


class _GridEntry:
    """np.mgrid, np.ogrid, np.r_, np.c_ while a trace runs: their arrays, made (NumPy's
    own Python code makes them, past the constructors' stand-ins)."""

    def __init__(self, orig):
        self._orig = orig

    def __getitem__(self, key):
        r = self._orig[key]
        if core._state.trace is None:
            return r
        return _made_results(r, (), {}, sys._getframe(1))

    def __len__(self):
        return len(self._orig)

    def __getattr__(self, name):
        return getattr(self._orig, name)


def _np_buffer_iterator(t):
    """np.nditer / np.broadcast / np.nested_iters as the traced code calls them: NumPy's
    C iterators read their operands' buffers (`for v in np.nditer(x.data): s += float(v)` summed the
    traced call's values, and a branch on the sum was frozen, silently). Of traced
    data: an escape, the iterator NumPy's over plain views."""
    def call(*args, **kwargs):
        tr = core._state.trace
        if tr is not None and not tr.abstract and (
                any(made.holds_traced(a, tr) for a in args) or
                any(made.holds_traced(a, tr) for a in kwargs.values())):
            tr.escape(f"np.{t.__name__}(...) of traced data: NumPy's C iterator reads "
                      f"its buffer past the tracer")
            args = tuple(_plain_deep(a) for a in args)
            kwargs = {k: _plain_deep(v) for k, v in kwargs.items()}
        return t(*args, **kwargs)
    call.__name__ = call.__qualname__ = t.__name__
    return call


_register("nested_iters", np.nested_iters, _np_buffer_iterator(np.nested_iters))


# The same for NumPy's public submodules of array functions (np.linalg.inv of a list,
# np.fft.fft), by (module, name): start() swaps these in too.
_SUB_ENTRIES = []
_DISPATCHER = type(np.zeros_like)   # numpy._ArrayFunctionDispatcher (a function in 1.x)
# Functions that never give an array (type and shape queries, printing, settings): no
# stand-in (tracejit's own code calls the first ones thousands of times a trace).
_NO_ARRAYS = frozenset("""result_type may_share_memory shares_memory can_cast
    promote_types min_scalar_type broadcast_shapes shape ndim size iterable issubdtype
    isdtype iscomplexobj isrealobj isfortran common_type mintypecode typename
    get_printoptions set_printoptions printoptions seterr geterr seterrcall geterrcall
    setbufsize getbufsize get_include show_config show_runtime info base_repr
    binary_repr array2string array_repr array_str format_float_positional
    format_float_scientific datetime_data isscalar""".split())
for _mod in (np, np.linalg, np.fft, np.emath):
    for _n in sorted(dir(_mod)):
        _f = getattr(_mod, _n)
        if not _n.startswith("_") and not (_mod is np and _n in _NP_ENTRIES) and \
                _n not in _NO_ARRAYS and \
                isinstance(_f, (types.FunctionType, _DISPATCHER, types.BuiltinFunctionType)) \
                and (getattr(_f, "__module__", None) or "").startswith("numpy"):
            _np_result_entry(_f, _n, None if _mod is np else _mod)
for _n in ("mgrid", "ogrid", "r_", "c_"):
    _NP_ENTRIES[_n] = (getattr(np, _n), _GridEntry(getattr(np, _n)))


def _entry_originals():
    """id(NumPy's object) -> (it, its stand-in), for the stand-ins at other names."""
    out = {id(orig): (orig, entry) for orig, entry in _NP_ENTRIES.values()}
    for _, _, orig, entry in _SUB_ENTRIES:
        out.setdefault(id(orig), (orig, entry))
    return out


def _tracing_isscalar(element):
    """np.isscalar while tracing: a traced Python number, and traced data standing for
    the NumPy scalar eager has there (x.data.mean()), are scalars, as in eager."""
    tr = core._state.trace
    if tr is not None and not tr.abstract and (
            isinstance(element, TracedScalar) or
            (type(element) is TracedArray and element._numpy_scalar)) \
            and not is_internal(sys._getframe(1)):    # tracejit's as_array keeps it traced
        return True
    return _NP_ENTRIES["isscalar"][0](element)


_NP_ENTRIES["isscalar"] = (np.isscalar, _tracing_isscalar)


# ---- float() and int() in the jitted function give TracedScalars

# The rewritten code loads these where it loaded the global name: a module global of
# that name (`float = np.float32`, `from numpy import int64 as int`) is what the user's
# call calls, in every thread, as LOAD_GLOBAL finds globals before builtins.
_NOT_SHADOWED = object()


def _shadowing(name):
    f = sys._getframe(2).f_globals.get(name, _NOT_SHADOWED)
    return None if f is _NOT_SHADOWED or f is getattr(builtins, name) else f


def _traced_number(pytype, args, kwargs, kinds=None):
    """float(x) / int(x) in traced code: a traced number for traced data of this trace
    (of a dtype kind in `kinds`, if given), else what the builtin gives."""
    if len(args) == 1 and not kwargs:
        x, tr = args[0], core._state.trace
        if tr is not None and not tr.abstract:
            if isinstance(x, TracedScalar) and x._trace is tr:
                return tr.scalar_convert(x, pytype)
            if isinstance(x, Variable) and x._data is not None:
                x = x.data        # float(loss): Variable.__float__ is float(loss.data)
            if isinstance(x, TracedArray) and x._trace is tr and \
                    (kinds is None or x.dtype.kind in kinds):
                return tr.to_scalar(x, pytype)
    return pytype(*args, **kwargs)


def _traced_float(*args, **kwargs):
    own = _shadowing("float")      # looks two frames up: call it here, not in a helper
    if own is not None:
        return own(*args, **kwargs)
    return _traced_number(float, args, kwargs)


def _traced_int(*args, **kwargs):
    own = _shadowing("int")
    if own is not None:
        return own(*args, **kwargs)
    return _traced_number(int, args, kwargs, "biuf")


def _traced_isinstance(*args, **kwargs):
    own = _shadowing("isinstance")
    if own is not None:
        return own(*args, **kwargs)
    if len(args) != 2 or kwargs:
        return isinstance(*args, **kwargs)      # Python's own TypeError
    obj, classinfo = args
    if type(obj) is TracedArray:
        # Traced data is what eager holds there: an ndarray, or the NumPy scalar a
        # reduction or an index gives (x.data.mean() is a np.float64, a float).
        return isinstance(_eager_stand_in(obj), classinfo)
    # A traced Python number is an instance of what its value is (float, int, bool,
    # numbers.Real): its type is fixed by the operations that made it, not its value.
    if isinstance(obj, TracedScalar):
        return isinstance(obj._value, classinfo)
    return isinstance(obj, classinfo)


def _eager_stand_in(a):
    """A plain object of the type eager has where the trace holds the TracedArray a."""
    plain = a.view(np.ndarray)
    if a._numpy_scalar == "python":
        return plain[()].item()
    return plain[()] if a._numpy_scalar else plain


def _traced_type(*args, **kwargs):
    own = _shadowing("type")
    if own is not None:
        return own(*args, **kwargs)
    if len(args) == 1 and not kwargs:
        t = type(args[0])
        if issubclass(t, TracedScalar):
            return args[0].pytype
        if t is TracedArray:
            # x.data, an ndarray argument, a captured array: eager's is an ndarray, or
            # a NumPy scalar (`type(a) is np.ndarray` must branch as in eager).
            return type(_eager_stand_in(args[0]))
        return t
    return type(*args, **kwargs)


def _buffer_reader(name):
    """memoryview(x.data), bytes(x.data), bytearray(x.data) in the traced code: the
    buffer protocol hands traced data out as plain bytes (np.frombuffer of it, a C
    extension), which the tracer cannot follow: an escape."""
    orig = getattr(builtins, name)

    def call(*args, **kwargs):
        own = _shadowing(name)
        if own is not None:
            return own(*args, **kwargs)
        tr = core._state.trace
        if args and type(args[0]) is TracedArray and tr is not None and \
                args[0]._trace is tr and not tr.abstract:
            tr.escape(f"{name}() of traced data (its buffer, read outside the tracer)")
        return orig(*args, **kwargs)
    return call


# Python's float() and int() must return real numbers (CPython converts whatever
# __float__ returns to an exact float), so the calls themselves are redirected: in the
# code the trace runs, a call `float(...)` / `int(...)` of the builtin (LOAD_GLOBAL with
# the call bit) loads these instead. Outside a trace they are float, int,
# isinstance and type.
_INTERCEPT = {"float": "__tracejit_float__", "int": "__tracejit_int__",
              "isinstance": "__tracejit_isinstance__", "type": "__tracejit_type__",
              "memoryview": "__tracejit_memoryview__", "bytes": "__tracejit_bytes__",
              "bytearray": "__tracejit_bytearray__"}
def _neutral_zero_dtype(dtype):
    """The dtype of a zero that adds to a gradient without promoting it: float32 for
    the compiled float dtypes (float32 + float64 is float64, float32 + float32 stays
    float32), else the gradient's own."""
    return np.dtype(np.float32) if np.result_type(np.float32, dtype) == dtype else dtype


_BUFFER_TYPE_NAMES = ("memoryview", "bytes", "bytearray")
for _n in _BUFFER_TYPE_NAMES:
    setattr(builtins, f"__tracejit_{_n}__", _buffer_reader(_n))
builtins.__tracejit_float__ = _traced_float
builtins.__tracejit_int__ = _traced_int
builtins.__tracejit_isinstance__ = _traced_isinstance
builtins.__tracejit_type__ = _traced_type
_LOAD_GLOBAL = dis.opmap.get("LOAD_GLOBAL")
# np.float32 loaded to be called: LOAD_METHOD (3.11), or LOAD_ATTR after a global
# loaded with the NULL of a call (3.11) or with its own method bit (3.12+).
_LOAD_METHODS = {dis.opmap[n] for n in ("LOAD_METHOD", "LOAD_ATTR") if n in dis.opmap}
_NP_SCALAR_NAMES = ("float16", "float32", "float64", "int8", "int16", "int32", "int64",
                    "uint8", "uint16", "uint32", "uint64")


def _numpy_scalar_type(t):
    """np.float32 etc. as the traced code calls it: of traced data or a traced number,
    a recorded cast (a traced NumPy scalar, as eager's np.float32); else t itself."""
    def call(*args, **kwargs):
        tr = core._state.trace
        if len(args) == 1 and not kwargs and tr is not None and not tr.abstract:
            x = args[0]
            if (isinstance(x, TracedScalar) or type(x) is TracedArray) and x._trace is tr:
                y = tr.numpy_scalar_cast(x, np.dtype(t))
                if y is not None:
                    return y
                if type(x) is TracedArray:
                    tr.escape(f"np.{t.__name__}(...) of traced {x.dtype} data (a cast the "
                              f"graph does not reproduce exactly: truncation, overflow)")
                    return t(x.view(np.ndarray))
        return t(*args, **kwargs)
    call.__name__ = call.__qualname__ = t.__name__
    return call


for _n in _NP_SCALAR_NAMES:
    setattr(np, f"__tracejit_{_n}__", _numpy_scalar_type(getattr(np, _n)))


def _np_ndarray(*args, **kwargs):
    """np.ndarray(shape, ...) as the traced code calls it: an array f made, as np.empty's
    is (a plain one took traced data as plain values). Over another object's buffer
    (buffer=), what the tracer follows is not that object's memory: traced data or an
    array f made there is an escape; any other buffer gives NumPy's plain array."""
    tr = core._state.trace
    buf = kwargs.get("buffer", args[2] if len(args) > 2 else None)
    if tr is not None and not tr.abstract and buf is not None and (
            isinstance(buf, (TracedArray, made.MadeArray)) or
            isinstance(buf, TracedScalar)):
        tr.escape("np.ndarray(..., buffer=...) over traced data or an array the function "
                  "made: NumPy reads that buffer past the tracer")
        args = tuple(_plain_deep(a) for a in args)
        kwargs = {k: _plain_deep(v) for k, v in kwargs.items()}
    r = np.ndarray(*args, **kwargs)
    if tr is None or buf is not None:
        return r
    return made.made(r, sys._getframe(1))


np.__tracejit_ndarray__ = _np_ndarray


# d's own method for np.ndarray.name(d, ...), called from a frame that is not tracejit's
# (its __name__): the escapes d's methods raise for the code that calls them (`.view()`,
# `__array__()`: trace.values._leak) are the user's, at the user's line (the file is
# this one, which user_line skips).
_UNBOUND_NS = {"__name__": "<np.ndarray unbound>"}
exec(compile("def delegate(a, name, args, kwargs):\n"
             "    return getattr(a, name)(*args, **kwargs)\n", __file__, "exec"), _UNBOUND_NS)
_unbound_delegate = _UNBOUND_NS["delegate"]


class _UnboundMethods:
    """np.ndarray as the traced code reads an attribute of it (the code rewrite:
    `np.ndarray.item(d, 0)`, `np.ndarray.__getitem__(d, k)`, `np.ndarray.tolist(d)`):
    called on this trace's traced data or an array f made, that array's own method
    (what `d.item(0)` runs, recorded), as eager's plain d runs NumPy's. NumPy's C
    method itself read the traced buffer past the tracer's overrides (the traced call's
    values, frozen into the graph, silently). Anything else is np.ndarray's own."""

    def __getattr__(self, name):
        attr = getattr(np.ndarray, name)
        if not callable(attr) or isinstance(attr, type):
            return attr

        def call(*args, **kwargs):
            tr = core._state.trace
            if args and tr is not None and not tr.abstract and (
                    (type(args[0]) is TracedArray and args[0]._trace is tr) or
                    type(args[0]) is made.MadeArray):
                return _unbound_delegate(args[0], name, args[1:], kwargs)
            return attr(*args, **kwargs)
        call.__name__ = call.__qualname__ = name
        return call


np.__tracejit_ndarray_unbound__ = _UnboundMethods()


_BUFFER_ITERATORS = (np.nditer, np.broadcast)
for _t in _BUFFER_ITERATORS:
    setattr(np, f"__tracejit_{_t.__name__}__", _np_buffer_iterator(_t))
# np.X loaded to be called that the code rewrite redirects to np.__tracejit_X__.
_NP_REWRITTEN = frozenset(_NP_SCALAR_NAMES) | {"ndarray", "nditer", "broadcast"}
_EXTENDED_ARG = dis.opmap.get("EXTENDED_ARG")
_patched_codes = {}


def _rename_load(raw, names, ins, name, shift):
    """Point the name load `ins` in bytecode `raw` at `name` (added to names), its low
    `shift` bits kept; False where that needs an EXTENDED_ARG (the load is left alone)."""
    if ins.offset >= 2 and raw[ins.offset - 2] == _EXTENDED_ARG:
        return False
    if name not in names:
        names.append(name)
    arg = (names.index(name) << shift) | (ins.arg & shift)
    if arg > 255:
        return False
    raw[ins.offset + 1] = arg
    return True


def _patched_code(code):
    # By identity: equal code objects may come from different files (co_filename is
    # not part of code equality), and the patched one keeps its original's.
    done = _patched_codes.get(id(code))
    if done is not None and done[0] is code:
        return done[1]
    new = code
    if (3, 11) <= sys.version_info < (3, 14):
        raw = bytearray(code.co_code)
        names = list(code.co_names)
        changed = False
        prev = None
        instructions = list(dis.get_instructions(code))
        for k, ins in enumerate(instructions):
            before, prev = prev, ins
            if ins.opname == "LOAD_ATTR" and ins.argval == "ndarray" and \
                    before is not None and before.opcode == _LOAD_GLOBAL and \
                    before.argval in ("np", "numpy") and k + 1 < len(instructions) and \
                    instructions[k + 1].opcode in _LOAD_METHODS:
                # np.ndarray.item(d, 0): an attribute of np.ndarray itself, NumPy's C
                # method on traced data past its overrides (the traced call's value,
                # frozen): np.__tracejit_ndarray__'s (_UnboundMethods), d's own method.
                changed |= _rename_load(raw, names, ins, "__tracejit_ndarray_unbound__",
                                        1 if sys.version_info >= (3, 12) else 0)
                continue
            if ins.opcode in _LOAD_METHODS and ins.argval in _NP_REWRITTEN and \
                    before is not None and before.opcode == _LOAD_GLOBAL and \
                    before.argval in ("np", "numpy") and (
                        ins.opname == "LOAD_METHOD" or before.arg & 1 or
                        (sys.version_info >= (3, 12) and ins.arg & 1)):
                # np.float32(...): the module's __tracejit_float32__ (the same type
                # outside a trace; were `np` not NumPy, the trace raises AttributeError
                # and the call runs eagerly).
                changed |= _rename_load(
                    raw, names, ins, f"__tracejit_{ins.argval}__",
                    1 if ins.opname == "LOAD_ATTR" and sys.version_info >= (3, 12) else 0)
                continue
            if ins.opcode != _LOAD_GLOBAL or ins.argval not in _INTERCEPT:
                continue
            if not ins.arg & 1 and not (
                    ins.argval in _BUFFER_TYPE_NAMES and k + 1 < len(instructions) and
                    instructions[k + 1].opname.startswith("STORE_")):
                # Not loaded to be called; but `mv = memoryview` binds the reader that
                # sees traced data (isinstance(b, mv) then raises: the call runs eagerly).
                continue
            if ins.offset >= 2 and raw[ins.offset - 2] == _EXTENDED_ARG:
                continue
            name = _INTERCEPT[ins.argval]
            if name not in names:
                names.append(name)
            arg = (names.index(name) << 1) | (ins.arg & 1)
            if arg > 255:
                continue        # would need an EXTENDED_ARG: leave this call alone
            raw[ins.offset + 1] = arg
            changed = True
        consts = tuple(_patched_code(c) if isinstance(c, types.CodeType) else c
                       for c in code.co_consts)
        if changed or any(a is not b for a, b in zip(consts, code.co_consts)):
            try:
                new = code.replace(co_code=bytes(raw), co_names=tuple(names),
                                   co_consts=consts)
            except (ValueError, TypeError):
                new = code
    if len(_patched_codes) > 4096:
        _patched_codes.clear()      # code made at run time (exec): bounded, not a leak
    _patched_codes[id(code)] = (code, new)
    return new


_swap_lock = threading.Lock()
_swapped = {}      # id(function) -> [function, its own code, traces using the swap]


def _user_functions(v):
    """The user functions behind a value the traced function reads."""
    if isinstance(v, types.MethodType):
        v = v.__func__
    if isinstance(v, functools.partial):
        return _user_functions(v.func)
    if pystate._threads(v) is not None:
        return _user_functions(pystate._threads(v))
    if type(v) is types.FunctionType:
        mod = pystate.probe(v, "__module__", "") or ""
        return [] if mod.startswith(("tracejit", "numpy", "numba")) else [v]
    cls = type(v)
    if cls.__module__.startswith(("tracejit", "numpy", "numba", "builtins")) or \
            not isinstance(pystate.probe(v, "__dict__"), dict) or isinstance(v, type):
        return []
    # An object of a user class (a Model): what calling it runs, and the methods it
    # may call on itself (self.helper(m), static and class methods, properties).
    out = []
    for klass in cls.__mro__:
        if klass.__module__.startswith(("tracejit", "numpy", "numba", "builtins")):
            continue
        for attr in vars(klass).values():
            if isinstance(attr, (staticmethod, classmethod)):
                attr = attr.__func__
            elif isinstance(attr, property):
                attr = attr.fget
            if type(attr) is types.FunctionType:
                out += _user_functions(attr)
    return out


def _has_intercepts(f):
    # Code run with builtins of its own (exec with a restricted __builtins__) would not
    # find the redirected names: its float() stays Python's (by value).
    b = pystate.probe(f, "__builtins__", builtins.__dict__)
    b = b if isinstance(b, dict) else pystate.probe(b, "__dict__") or {}
    return b.get("__tracejit_float__") is _traced_float


_LIBRARY_DIRS = tuple({os.path.abspath(p) + os.sep for p in (
    sysconfig.get_path("stdlib"), sysconfig.get_path("platstdlib"),
    sysconfig.get_path("purelib"), sysconfig.get_path("platlib")) if p})


def _is_user_module(m):
    if not isinstance(m, types.ModuleType):
        return False
    name = pystate.probe(m, "__name__", "") or ""
    f = pystate.probe(m, "__file__")
    return isinstance(f, str) and \
        not name.startswith(("tracejit", "numpy", "numba")) and \
        not os.path.abspath(f).startswith(_LIBRARY_DIRS)


_called_globals_of = {}


def _called_globals(code):
    """{name: the line of its first such load} of the global names code (and the code
    it nests) loads to call them (LOAD_GLOBAL with the call's NULL, 3.11 to 3.13)."""
    done = _called_globals_of.get(id(code))
    if done is not None and done[0] is code:
        return done[1]
    names = {}
    if (3, 11) <= sys.version_info < (3, 14):
        for ins in dis.get_instructions(code):
            if ins.opcode == _LOAD_GLOBAL and ins.arg & 1:
                names.setdefault(ins.argval, ins.positions.lineno or code.co_firstlineno)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            for n, line in _called_globals(c).items():
                names.setdefault(n, line)
    if len(_called_globals_of) > 4096:
        _called_globals_of.clear()
    _called_globals_of[id(code)] = (code, names)
    return names


def _code_names(code):
    names = set(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            names |= _code_names(c)
    return names


def _reach_helpers(funcs, roots, limit=256):
    """Add to funcs (id -> function) the user functions they call that the function's
    locations do not list: `helpers.is_lr(lr)` (an attribute of a user module the
    function names), and the module-level helpers those call in turn. Their
    isinstance(lr, float) must answer for a traced float argument too."""
    work = list(funcs.values()) + [f for k, f in roots.items() if k not in funcs]
    seen = set(funcs) | set(roots)
    while work and len(funcs) < limit:
        f = work.pop()
        names = _code_names(f.__code__)
        glb = f.__globals__
        found = []
        for n in names:
            v = glb.get(n)
            if _is_user_module(v):
                found += [a for m in names if m != n
                          for a in _user_functions(pystate.probe(v, m))]
            elif type(v) is types.FunctionType:
                found += _user_functions(v)
        for g in found:
            if id(g) not in seen:
                seen.add(id(g))
                funcs[id(g)] = g
                work.append(g)


def reached_user_functions(locs, fn=None):
    """The user functions a trace of fn runs that swap_scalar_code patches: those at
    its locations, fn's own, and the helpers they call through user modules."""
    funcs = {}
    for loc in locs:
        for f in _user_functions(loc.read()):
            funcs[id(f)] = f
    roots = {id(f): f for f in _user_functions(fn)} if fn is not None else {}
    _reach_helpers(funcs, roots)
    return list(funcs.values()) + [f for k, f in roots.items() if k not in funcs]


def swap_scalar_code(locs, fn=None, values=()):
    """Give the user functions at these locations (and the helpers fn and they call
    through user modules) code whose float()/int() calls give traced numbers, while a
    trace runs. Other threads running them see no difference: outside a trace the
    redirected names are float and int themselves."""
    funcs = {}
    for loc in locs:
        for f in _user_functions(loc.read()):
            funcs[id(f)] = f
    roots = {id(f): f for f in _user_functions(fn)} if fn is not None else {}
    _reach_helpers(funcs, roots)
    done = []
    _swap_np_aliases(list(funcs.values()) + list(roots.values()), done)
    _swap_np_at_locations(locs, done)
    _swap_np_in_classes(list(funcs.values()) + list(roots.values()), locs, values, done)
    with _swap_lock:
        for f in funcs.values():
            entry = _swapped.get(id(f))
            if entry is None:
                if not _has_intercepts(f):
                    continue
                own = f.__code__
                code = _patched_code(own)
                if code is own:
                    continue
                try:
                    f.__code__ = code
                except (TypeError, ValueError):
                    continue
                entry = _swapped[id(f)] = [f, own, 0]
            entry[2] += 1
            done.append(f)
    return done


# NumPy's constructors bound under a module global of the user's code (`from numpy
# import asarray`) are not the numpy module's attributes that start() swaps: that name
# handed out a plain array of traced data, and a branch on it was frozen. While a trace
# runs, such globals of the functions it reaches hold the entries too (counted per
# (globals, name) across threads; other threads' calls pass straight through).
_np_alias_swaps = {}   # (id(globals), name) -> [globals, original, entry, traces using it]


def _swap_np_aliases(funcs, done):
    originals = _entry_originals()
    dicts = {}
    attrs = {}           # a module the code names: its attributes the code names
    for f in funcs:
        g = pystate.probe(f, "__globals__")
        if isinstance(g, dict) and g is not np.__dict__:
            dicts[id(g)] = g
            code = pystate.probe(f, "__code__")
            names = _code_names(code) if isinstance(code, types.CodeType) else ()
            for n in names:
                m = g.get(n)
                # (`nc.zeros(3)` with nc a NumPy submodule, `helpers.zeros(3)` with a
                # user module's `from numpy import zeros`: that module's attribute.)
                if isinstance(m, types.ModuleType) and m is not np:
                    md = pystate.probe(m, "__dict__")
                    if isinstance(md, dict) and md is not np.__dict__:
                        attrs.setdefault(id(md), (md, set()))[1].update(names)

    def swap(key, holder, val, install):
        entry = _np_alias_swaps.get(key)
        if entry is None:
            if id(val) not in originals or originals[id(val)][0] is not val:
                return
            orig, new = originals[id(val)]
            install(new)
            entry = _np_alias_swaps[key] = [holder, orig, new, 0, None]
        entry[3] += 1
        done.append(key)

    # np.ndarray bound to a module global (`from numpy import ndarray`) and called: no
    # stand-in can be put there (isinstance and `type(a) is ndarray` must stay NumPy's),
    # and the code rewrite sees only `np.ndarray(...)`. Its arrays would take traced data
    # as plain values: an escape.
    tr = core._state.trace
    for f in funcs:
        g, code = pystate.probe(f, "__globals__"), pystate.probe(f, "__code__")
        if tr is not None and isinstance(g, dict) and isinstance(code, types.CodeType):
            for n, line in _called_globals(code).items():
                t = g.get(n)
                if t is np.ndarray:
                    tr.escapes.append((f"np.ndarray is called as the global {n}: the "
                                       f"arrays it makes would take traced data as plain "
                                       f"values (call it as np.ndarray(...), or use "
                                       f"np.empty)", source_line(code.co_filename, line)))
                elif any(t is b for b in _BUFFER_ITERATORS):
                    tr.escapes.append((f"np.{t.__name__} is called as the global {n}: its "
                                       f"C iterator would read traced data past the "
                                       f"tracer (call it as np.{t.__name__}(...))",
                                       source_line(code.co_filename, line)))
    with _swap_lock:
        for g in dicts.values():
            for name, val in list(g.items()):
                swap((id(g), name), g, val, lambda e, g=g, name=name: g.__setitem__(name, e))
        for md, names in attrs.values():
            if id(md) in dicts:
                continue
            for name in names:
                val = md.get(name)
                if val is not None:
                    swap((id(md), name), md, val,
                         lambda e, md=md, name=name: md.__setitem__(name, e))
        # A closure cell holding one (`zeros = np.zeros` in the enclosing function):
        # the same swap, its key (id(cell), None).
        for f in funcs:
            for cell in pystate.probe(f, "__closure__") or ():
                try:
                    val = cell.cell_contents
                except ValueError:          # an empty cell
                    continue
                swap((id(cell), None), cell, val,
                     lambda e, cell=cell: setattr(cell, "cell_contents", e))


def _swap_np_at_locations(locs, done):
    """The same swap for a NumPy constructor the state walk reached elsewhere: a default
    or keyword-only default argument (`def f(x, zeros=np.zeros)`, a new defaults tuple:
    fn's copy for the trace, symbolic_scalars, is made after this), a dict's or a list's
    item (`{"z": np.zeros}`), a class attribute (`make = staticmethod(np.zeros)`), a
    partial's keyword. One held where nothing can be put (a tuple's
    item, a partial's positional argument) would make plain arrays the tracer cannot
    follow: the trace is an escape, naming it."""
    originals = _entry_originals()
    for loc in locs:
        val = loc.read()
        hit = originals.get(id(val))
        if hit is None or hit[0] is not val:
            continue
        key = (id(loc.container), ("loc", loc.kind, loc.key))

        def how(loc=loc, new=hit[1]):
            container, k = loc.container, loc.key
            if loc.kind == "attr" and isinstance(container, type):
                raw = container.__dict__.get(k)
                if raw is None:
                    return None              # inherited: the defining class's own
                return _class_attr_swap(container, k, raw, new)
            return loc.write, lambda orig, new, loc=loc: (
                loc.write(orig) if loc.read() is new else None)
        # (a tuple's item, a partial's positional argument: nothing can be put there)
        if _swap_at(key, loc.container, hit, how, f"at {loc.describe()}"):
            done.append(key)


def _swap_at(key, container, hit, how, where):
    """Count one more trace using swap `key` (NumPy's function hit[0] for its stand-in
    hit[1]), installing it if none does yet: how() gives (install, restore), read under
    the lock (None: nothing to swap). True if it is in place; where it cannot be
    put (install raises), a constructor is an escape naming the place (`where`): its
    arrays would take traced data as plain values. NumPy's other functions stay its own
    there (`OPS = (np.sum, np.max)`, partial(np.mean, axis=0)), as before: their fresh
    results of constants are plain, which traced data is rarely written into."""
    with _swap_lock:
        entry = _np_alias_swaps.get(key)
        if entry is None:
            orig, new = hit
            got = how()
            if got is None:
                return False
            install, restore = got
            try:
                install(new)
            except Exception:  # noqa: BLE001 - immutable (a tuple), or a guarded place
                tr = core._state.trace
                if tr is not None and id(new) not in _RESULT_ENTRIES:
                    tr.escape(f"np.{orig.__name__} is held {where}, where the tracer "
                              f"cannot put its recording stand-in: the arrays it makes "
                              f"would take traced data as plain values")
                return False
            entry = _np_alias_swaps[key] = [container, orig, new, 0, restore]
        entry[3] += 1
        return True


def _class_attr_swap(cls, k, raw, new):
    """(install, restore) of new for NumPy's constructor at class attribute cls.k, raw
    as the class holds it: binding as the original does (a staticmethod stays one, a
    builtin such as np.zeros does not bind, NumPy 2's dispatchers do, as functions)."""
    if isinstance(raw, staticmethod):
        repl = staticmethod(new)
    elif isinstance(raw, classmethod):
        repl = classmethod(new)
    else:
        repl = new if hasattr(type(raw), "__get__") else staticmethod(new)

    def install(_):
        setattr(cls, k, repl)

    def restore(orig, new):
        if cls.__dict__.get(k) is repl:      # unless the user rebound it meanwhile
            setattr(cls, k, raw)
    return install, restore


_NOT_SCANNED = ("builtins", "tracejit", "numpy", "numba")


def _swap_np_in_classes(funcs, locs, values, done):
    """The swap of _swap_np_at_locations for NumPy's constructors held as class
    attributes (`make = staticmethod(np.zeros)`, `zeros = np.zeros` in a class body):
    of the classes the function's code names (module globals, closure cells), the
    classes at its locations and those of the objects there, with their bases. Classes
    are not walked as state, so these were never seen: `Maker.make(3)` gave a plain
    array, and traced data written into it, then branched on, was frozen silently."""
    originals = _entry_originals()
    classes = {}

    def add(c):
        if isinstance(c, type) and id(c) not in classes:
            for k in pystate.probe(c, "__mro__") or ():
                mod = pystate.probe(k, "__module__", "") or ""
                if isinstance(mod, str) and not mod.startswith(_NOT_SCANNED):
                    classes.setdefault(id(k), k)

    for f in funcs:
        code = pystate.probe(f, "__code__")
        glb = pystate.probe(f, "__globals__")
        if isinstance(code, types.CodeType) and isinstance(glb, dict):
            names = _code_names(code)
            for n in names:
                v = glb.get(n)
                if isinstance(v, types.ModuleType) and _is_user_module(v):
                    for m in names:                      # helpers.Maker.make(3)
                        add(pystate.probe(v, m))
                else:
                    add(v)
        for cell in pystate.probe(f, "__closure__") or ():
            try:
                add(cell.cell_contents)
            except ValueError:              # an empty cell
                pass
    for loc in locs:
        try:
            val = loc.read()
        except Exception:  # noqa: BLE001 - a location that cannot be read: not one
            continue
        add(val if isinstance(val, type) else type(val))
    for val in values:                       # the call's arguments (a model, self)
        add(val if isinstance(val, type) else type(val))
    for c in classes.values():
        try:
            items = list(vars(c).items())
        except TypeError:
            continue
        for k, raw in items:
            fn = raw.__func__ if isinstance(raw, (staticmethod, classmethod)) else raw
            hit = originals.get(id(fn))
            if hit is None or hit[0] is not fn:
                continue
            key = (id(c), ("cls", k))
            # (a metaclass may refuse the write)
            if _swap_at(key, c, hit,
                        lambda c=c, k=k, raw=raw, new=hit[1]: _class_attr_swap(c, k, raw, new),
                        f"as the class attribute {c.__qualname__}.{k}"):
                done.append(key)


def unswap_scalar_code(done):
    with _swap_lock:
        for f in done:
            if type(f) is tuple:                 # a NumPy constructor alias
                swap = _np_alias_swaps[f]
                swap[3] -= 1
                if swap[3] == 0:
                    g, orig, entry, _, restore = swap
                    if restore is not None:      # _swap_np_at_locations' own
                        restore(orig, entry)
                    elif f[1] is None:           # a closure cell
                        if g.cell_contents is entry:
                            g.cell_contents = orig
                    elif g.get(f[1]) is entry:   # unless the user rebound the name
                        g[f[1]] = orig
                    del _np_alias_swaps[f]
                continue
            entry = _swapped[id(f)]
            entry[2] -= 1
            if entry[2] == 0:
                f.__code__ = entry[1]
                del _swapped[id(f)]


def plain_numbers(locs):
    """A traced Python number the function stored in state it reads (`self.loss =
    float(loss.data)`, `log.append(loss)`, `hist[k] = (loss, n)`) is the plain number
    after the trace, as after an eager call: a TracedFloat left in a list is not a
    float to isinstance, json or a later trace. So is a traced array or NumPy scalar
    (state a refused trace left: `S['h'] = x.data.sum()`)."""
    seen = set()
    for loc in locs:
        v = loc.read()
        if isinstance(v, (TracedScalar, TracedArray, made.MadeArray)):
            loc.write(_untraced(v))
        else:
            # Items the locations do not list: appended during the trace, past the
            # first 64, or nested deeper.
            _plain_items(v, seen, 6)


def _plain_items(c, seen, depth):
    t = type(c)
    if depth == 0 or id(c) in seen:
        return
    if t not in (list, dict, set):
        _plain_attrs(c, seen, depth)
        return
    seen.add(id(c))
    if t is set:
        if any(_holds_tracer(x) for x in c):
            items = [_plain_value(x, seen, depth) for x in c]
            c.clear()
            c.update(items)
        return
    if t is dict:
        if any(_holds_tracer(k) for k in c):
            items = [(_plain_value(k, seen, depth), v) for k, v in c.items()]
            c.clear()
            c.update(items)
        keys = list(c)
    else:
        keys = range(len(c))
    for k in keys:
        x = c[k]
        y = _plain_value(x, seen, depth)
        if y is not x:
            c[k] = y


_NOT_WALKED = (type, types.ModuleType, types.FunctionType, types.MethodType,
               types.BuiltinFunctionType, functools.partial, np.ndarray, np.generic,
               Variable, TracedScalar, str, bytes, bytearray, int, float, complex,
               tuple, frozenset)
_MAX_ATTRS = 64


def _plain_attrs(o, seen, depth):
    """The attributes of a user object (`Record(loss=float(...))` appended to a log, a
    tracker's `best`), in its __dict__ and __slots__: traced numbers plain."""
    if isinstance(o, _NOT_WALKED) or o is None:
        return
    seen.add(id(o))
    d = pystate.probe(o, "__dict__")
    if type(d) is dict:
        for k in list(d)[:_MAX_ATTRS]:
            x = d[k]
            y = _plain_value(x, seen, depth)
            if y is not x:
                d[k] = y           # past __setattr__: a frozen dataclass is fixed too
    for klass in type(o).__mro__[:-1]:
        slots = vars(klass).get("__slots__", ())
        for k in (slots,) if isinstance(slots, str) else slots:
            if k in ("__dict__", "__weakref__"):
                continue
            try:
                x = object.__getattribute__(o, k)
            except AttributeError:
                continue           # an empty slot
            y = _plain_value(x, seen, depth)
            if y is not x:
                try:
                    object.__setattr__(o, k, y)
                except (AttributeError, TypeError):
                    pass


def _plain_value(x, seen, depth):
    """x with the traced numbers in it plain (a new tuple where one holds some)."""
    if isinstance(x, (TracedScalar, TracedArray, made.MadeArray)):
        return _untraced(x)
    if type(x) is tuple:
        if any(_holds_tracer(y) for y in x):
            return tuple(_plain_value(y, seen, depth - 1) for y in x)
        for y in x:
            _plain_items(y, seen, depth - 1)
        return x
    _plain_items(x, seen, depth - 1)
    return x


def _holds_tracer(x):
    return isinstance(x, (TracedScalar, TracedArray, made.MadeArray)) or (
        type(x) is tuple and any(_holds_tracer(y) for y in x))


def _untraced(x):
    """What eager holds for a tracer left in Python state (a refused trace's `S['h'] =
    x.data.sum()`): the number, the NumPy scalar, the array (a view of its memory)."""
    if isinstance(x, TracedScalar):
        return x._value
    if type(x) is made.MadeArray:
        return made.plain_of(x)                   # an array f made (trace/made.py)
    a = x.view(np.ndarray)
    scalar = x._numpy_scalar
    return a if not scalar else a.item() if scalar == "python" else a[()]


def symbolic_scalars(fn):
    """fn, or a copy of it (same globals, closure and defaults) whose float()/int()
    calls give TracedScalars of traced values: what a trace runs."""
    if isinstance(fn, types.MethodType):
        f = symbolic_scalars(fn.__func__)
        return fn if f is fn.__func__ else types.MethodType(f, fn.__self__)
    if isinstance(fn, functools.partial):
        f = symbolic_scalars(fn.func)
        return fn if f is fn.func else functools.partial(f, *fn.args, **fn.keywords)
    inner = pystate._threads(fn)
    if inner is not None:
        # A state-threading wrapper (pystate.threaded): the user's function runs in it.
        f = symbolic_scalars(inner)
        return fn if f is inner else fn._tracejit_rethread(f)
    if type(fn) is not types.FunctionType or not _has_intercepts(fn):
        return fn
    code = _patched_code(fn.__code__)
    if code is fn.__code__:
        return fn
    g = types.FunctionType(code, fn.__globals__, fn.__name__, fn.__defaults__,
                           fn.__closure__)
    g.__kwdefaults__ = fn.__kwdefaults__
    g.__qualname__ = fn.__qualname__
    g.__dict__.update(fn.__dict__)
    return g


# Variable.creator's own slot, and what stands in its place while any thread traces:
# `h.creator = None` in the user's code is the cut h.unchain() makes, which compiled
# calls must repeat on the caller's graph when h comes from outside the call.
_CREATOR_SLOT = Variable.__dict__["creator"]


class _TracedCreator:
    """Variable.creator while a trace runs: reads and writes the slot; an assignment in
    the user's code (not tracejit's: set_creator, grad's detaching of its inputs) to a
    Variable from outside the call (an argument, a captured Variable) goes to the
    thread's trace first. None is unchain()'s cut (Trace.unchaining); another Function
    is an escape (compiled calls could not give the caller's Variable that history)."""

    def __get__(self, obj, cls=None):
        return self if obj is None else _CREATOR_SLOT.__get__(obj, cls)

    def __set__(self, obj, value):
        tr = core._state.trace
        # (getattr: a Variable tracejit makes with __new__ has no _tv before it sets one)
        if tr is not None and not tr.abstract and (
                getattr(obj, "_tv", None) is None or tr.is_live(obj)):
            try:
                cur = _CREATOR_SLOT.__get__(obj, type(obj))
            except AttributeError:          # Variable.__init__ setting it first
                cur = None
            if value is not cur and not is_internal(sys._getframe(1)):
                if value is None:
                    tr.unchaining(obj, False)
                else:
                    tr.escape("the function sets .creator of a Variable from outside "
                              "the call to another Function; compiled calls would not "
                              "give it that history")
        _CREATOR_SLOT.__set__(obj, value)

    def __delete__(self, obj):
        _CREATOR_SLOT.__delete__(obj)


_TRACED_CREATOR = _TracedCreator()


def start(trace):
    global _print_users
    with _print_lock:
        if _print_users == 0:
            Variable.creator = _TRACED_CREATOR
            builtins.print = _tracing_print
            np.random.seed = _tracing_seed
            random.seed = _tracing_py_seed
            for name, (_, entry) in _NP_ENTRIES.items():
                setattr(np, name, entry)
            for mod, name, _, entry in _SUB_ENTRIES:
                setattr(mod, name, entry)
        _print_users += 1
    return core.set_trace(trace)


def stop(trace, prev):
    global _print_users
    core.set_trace(prev)
    for v in trace.created:
        v._tv = None
    with _print_lock:
        _print_users -= 1
        if _print_users == 0:
            Variable.creator = _CREATOR_SLOT
            builtins.print = _original_print
            np.random.seed = _original_seed
            random.seed = _original_py_seed
            for name, (orig, _) in _NP_ENTRIES.items():
                setattr(np, name, orig)
            for mod, name, orig, _ in _SUB_ENTRIES:
                setattr(mod, name, orig)
