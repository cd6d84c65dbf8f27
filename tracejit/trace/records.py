"""The records one stage of a jitted call hands the next (README, "How a call runs").

tracing (trace.call.trace_call)  ->  TracedCall, with its BackwardPlan or BackwardEscape
                                  ->  runtime.variant.Variant (compiles and runs them)

Each record is built once per trace, never per call: the hot path reads the plain
attributes a Variant copies out of them. Tuples (NamedTuple) where the consumers unpack
positionally, frozen dataclasses where they read fields by name.
"""
import enum
import functools
from dataclasses import dataclass
from typing import Any, NamedTuple


class Form(enum.StrEnum):
    """What a leaf is, in a signature key (an argument) or in a result.

    A str enum: signature keys hold these and are hashed on every call that misses the
    hot path, which then stays str's C hash and compare."""

    VARIABLE = "Variable"
    PARAMETER = "Parameter"          # an argument only: a key tells it from a Variable
    ARRAY = "ndarray"
    FLOAT = "float"                  # a Python float
    NUMPY_SCALAR = "NumPy scalar"    # a result eager NumPy returns as np.float64 (0-d sum)
    PYTHON_SCALAR = "Python scalar"  # ... as a Python scalar (np.allclose, .item())


class Source(NamedTuple):
    """Where one forward-graph input comes from at call time.

    kind: "arg" (obj: the leaf index of the call's argument), "arggrad" (obj: the leaf
    index of the argument whose .grad it is), "var" (obj: a captured Variable's data),
    "grad" (obj: the captured Variable whose .grad's data it is), "array" (obj: a
    captured array itself). spec: (shape, dtype) the trace saw, None for an
    argument (the signature key says it)."""

    kind: str
    obj: Any
    spec: Any


class Target(NamedTuple):
    """What an effect writes into, as the current call finds it: ("leaf", i) the call's
    argument leaf i, ("leafgrad", i) its .grad, ("obj", x) an object from outside."""

    where: str
    obj: Any


class Effect(NamedTuple):
    """An update of live state the trace saw, replayed after each compiled call.

    kind: "inplace" (target a Variable, its array updated in place), "inplace_array"
    (target an ndarray) or "rebind" (`var.data = ...`); value: the graph Value written."""

    kind: str
    target: Any
    value: Any


class Leaf(NamedTuple):
    """One leaf of a traced result, as eager returns it (pytree.result_leaves lists the
    kinds): kind, what (a Value, a leaf index, an object), form (a Form or None)."""

    kind: str
    what: Any
    form: Any


class Escape(NamedTuple):
    """Why a traced call cannot stand for later calls (the signature runs eagerly), and
    the user's line that caused it ("file.py:12  text"; None: the def line is shown)."""

    reason: str
    line: Any


class SideEffect(NamedTuple):
    """Something the function did that only happens while tracing (print, a list that
    grows), warned once; the variant still compiles."""

    what: str
    line: Any


@dataclass(frozen=True, eq=False)
class BackwardEscape:
    """The region's backward cannot be compiled: the signature runs eagerly."""

    reason: str
    line: Any = None         # the user's line it is about (None: the function's)


@dataclass(frozen=True, eq=False)
class BackwardPlan:
    """The backward of a traced region (trace.backward.trace_backward), split from the
    forward: what the forward saves and where every backward input comes from."""

    graph: Any               # the backward Graph: inputs -> one gradient per non-None slot
    sources: list            # per backward input: ("saved", k), ("input", i), ("gy", k),
                             # ("madedata", k): the data of made leaf input k now,
                             # or a capture's (kind, obj) (read_capture)
    grad_slots: list         # per differentiable input: its output slot, None: no gradient
    saved: list              # forward Values the forward graph outputs for the backward
    saved_bytes: int
    recomputed_bytes: int    # what recomputation spared saving
    diff_sources: list       # per differentiable input (the creator's inputs): its source
                             # (kind, obj): ("arg", leaf), ("var", Variable), ("arggrad",
                             # leaf), ("grad", owner), ("made", result leaf index),
                             # ("effgrad", grad effect index): made leaves
    # The joint forward+backward graph, for create_graph replays on Variables.
    joint: Any
    joint_diff_inputs: list  # joint input index of each differentiable input
    joint_gy_inputs: dict    # joint input index -> output gradient k
    joint_grad_slots: list
    joint_captures: dict     # joint input index -> capture source, read at backward time
    joint_meta: dict         # the trace's grad_meta (what eager autodiff links)
    replay_saved: list       # indices into saved that a replay takes from the call
    saved_views: dict        # index into saved -> (forward input position, view steps):
                             # rebuilt on the call's buffer (trace.backward._argument_views)
    saved_unaliased: dict    # index into saved -> input position: copied if the forward
                             # gave it as a view of that input's buffer
    snapshots: dict          # forward input position -> index into saved of its copy
                             # (an argument, as the forward saw it: remat's snapshot)
    fixed_inputs: frozenset  # forward input positions nothing outside can change
    grad_dtypes: Any         # per output, per input: eager's gradient dtype; None: one
    replay_refusal: Any      # why a create_graph replay cannot follow it, or None
    # id(joint Value) -> joint input position: a state of a buffer the call updates
    # (W1.data *= 0.9), which eager's graph holds as that buffer (a Constant of a .data
    # view, the Parameter): a replay reads the buffer as it is then (trace.backward).
    replay_live: dict = None
    # id(forward Value) -> differentiable input position: a made leaf's value a replay
    # reads (`c = Variable(h.data)`) where the compiled backward does not, taken as the
    # made leaf's data then (trace.backward._save_for_replay).
    replay_made: dict = None
    # (Value of a Variable of the call, Value of its .grad): the .grads a backward
    # inside the call left on its intermediates (trace.backward.held_grads), outputs
    # of the forward graph after the saved values.
    held_grads: list = ()

    @functools.cached_property
    def joint_diff_position(self):
        """joint input index -> position among the differentiable inputs (the replays
        build their environment from it: computed once per plan, not per backward)."""
        return {i: k for k, i in enumerate(self.joint_diff_inputs)}


@dataclass(frozen=True, eq=False)
class TracedCall:
    """One traced call of a function, everything the runtime needs to build a variant.

    Holds the traced call's result objects only for this call's own return (result) and
    made_grads; a Variant copies what it needs and keeps no reference to this record."""

    graph: Any               # the whole traced Graph (forward, then backward nodes)
    n_inputs: int            # the forward's inputs: graph.inputs[:n_inputs]
    n_nodes: int             # the forward's nodes: graph.nodes[:n_nodes]
    grad_mode: bool          # Config.enable_backprop it was traced in (the key's)
    sources: list            # per forward input: its Source
    leaf_forms: list         # per argument leaf: Form.VARIABLE, ARRAY or FLOAT
    out_tree: Any            # the result's structure (pytree.flatten_result)
    out_leaves: list         # per result leaf: its Leaf
    effects: list            # Effects, targets as Targets
    grad_effects: list       # (Target, Value or None): a .grad the call set (None: cleared)
    grad_none: list          # Targets whose .grad was None when traced and must stay so
    made_grads: list         # per made result Variable: (x, x.grad, Value of it or None)
    mutated: frozenset       # ids of the forward inputs the call updates in place
    has_random: bool         # the forward draws random numbers
    has_creator: list        # per made result Variable: eager gives it a creator
    grad_alias: dict         # grad effect index -> made result that is that .grad
    grad_same: dict          # grad effect index -> earlier grad effect: the same .grad
    made_grad_effect: dict   # made result -> grad effect whose .grad its .grad is
    grad_constant: frozenset  # grad effect indices whose .grad is a Constant
    made_constant: list      # per made result Variable: eager's is a Constant
    grad_reach: Any          # per differentiable input: outputs reaching it; None: all
    cut_sets: Any            # per made result Variable, what unchain_backward cuts in
                             # the call (trace.call._cut_sets); None: no creator
    escapes: list            # Escapes: why it must run eagerly, the one reported first
    side_effects: list       # SideEffects: what only runs while tracing
    result: Any              # what the traced call itself returns (for this call)
    grads_before: dict       # id(argument Variable) -> its .grad before the call
    locations: list          # pystate locations of the Python state the function reads
    backward: Any            # BackwardPlan, BackwardEscape, or None (no backward)
    # result leaf index -> (root, steps): a result eager returns as a view of an input's
    # buffer or of another result (pytree.result_views), rebuilt on it at return time
    out_views: Any = None
    # rebind effect index -> (root, steps): an array `W.data = ...` stores that eager
    # shares with a buffer the runner holds (pytree.rebind_views), rebuilt on it
    rebind_views: Any = None
    made_grad_leaf: dict = None  # made result -> result leaf that is its .grad, a
                                 # Variable the graph does not compute (`y.backward(
                                 # retain_grad=True); return y.grad, y`: the seed)
    nested_grads: list = ()  # (grad effect index, Value, is a Constant): the .grad a
                             # backward in the call gave that effect's .grad (x.grad.grad)
    rebound: list = ()       # Locations of Variables it rebinds (state to thread), when
                             # that is the only Python state it changes
    captured_args: list = ()  # (argument leaf, Variable or array): an argument that is
                              # also state the function captures, read as the argument
    grad_args: list = ()     # (Target, argument leaf): a .grad from outside that was
                             # that argument when traced, as the graph reads it
    leaf_required: list = ()  # Targets a backward inside the call stopped at (no
                              # creator): the variant holds while they have none
    cuts: list = ()          # (kind, [Targets]): cuts of the caller's graph the
                             # function made (Trace.unchain_events), in order; and
                             # ("backward", [Targets], retain_grad, n, seeds): a
                             # backward inside it that goes on from those Variables
                             # into the caller's graph, after the call's first n
                             # effects, each seeded with a graph Value (or None)
    # Result leaf indices of the leaves of eager's graph the call made and returns
    # (`c = Variable(np.ones(3)); return x * c, c`), whose gradients eager's backward
    # sets: inputs of the compiled call ("made" diff sources), in the BackwardPlan's
    # order, made anew by the runner every call.
    made_leaves: list = ()
    made_inputs: dict = None  # made result leaf -> the forward input its array is read
                              # as (a "constcopy"): the runner's new array goes there
    leaf_class: dict = None   # result leaf -> (class, name) of a Variable the runner
                              # makes, where it is not a plain unnamed Variable
    wrap_grads: dict = None   # "wrap" result leaf -> the Value of the .grad a backward
                              # inside the call gave it (set on the runner's new leaf)
    wrap_grad_alias: dict = None  # "wrap" result leaf -> ("result", j), ("effect",
                              # gi) or ("made", m): its .grad is result leaf j, the
                              # .grad grad effect gi sets, or made result m's .grad
                              # (one object in eager)
    walk_untouched: list = ()  # (Target, n): a .grad the function touches after the
                               # first n such backwards, which they did not touch:
                               # the variant holds while they leave it
    walk_checks: list = ()   # (Target, kind, walk): a .grad such a backward touched
                             # that the function sees after walk number `walk`, as
                             # cleared / kept / a leaf's: it must be so at call time
    walk_reads: list = ()    # (input position, Target, walk): a leaf's .grad read
                             # after such a backward added to it, an input read
                             # after that walk (Trace._walk_read)
    grad_late: dict = None   # grad effect index -> walk: a .grad set after such a
                             # backward touched it, set right after it at call time
    walk_undo: list = ()     # (Variable, field, value before): what such a backward
                             # (.grad) or a cut (creator) changed in the caller's graph
                             # while tracing, to put back if the call runs again
