"""Arrays the traced function makes itself (np.zeros, np.empty, np.array of numbers,
np.arange ...), and traced data written into them.

Why: NumPy's item assignment copies an array operand straight from its buffer, with
no Python hook on the value. `buf = np.zeros(n); buf[:] = x.data; if buf.sum() > 0:`
copied the traced call's data into a plain array, and the branch on it was never
guarded: every compiled call took the traced call's branch, silently (the checks
against eager compare values on the traced branch and could not see it).

While a trace runs, NumPy's constructors called from the user's code give a MadeArray
(an ndarray subclass, a view of NumPy's own result): its item assignment, fill() and
NumPy's in-place writers (np.copyto, np.put, np.place, np.putmask ...) with traced data
as the value or the index, and indexing it by traced data (np.eye(3)[t]), are escapes (the call runs eagerly, with a warning naming
the line). Everything else about it is NumPy's: its arithmetic is a plain array's,
and it leaves the traced call as a plain ndarray view of the same buffer (results, a
Variable's data).

The constructors are found wherever the function reaches them (trace/record.py swaps
its stand-ins into NumPy's namespace, the user's globals, cells, defaults, containers,
class attributes and modules' attributes for the trace), and every other public NumPy
function's fresh plain result is made too (made_result: NumPy's C code makes its
results of made operands without subclass propagation, or of Python lists).

Not covered (documented in README): arrays made by other libraries, and arrays NumPy's
own Python code hands out past its public functions; the trace's first-call checks
still compare their values.
"""
import weakref

import numpy as np

from tracejit import core
from tracejit.trace.values import TracedArray, TracedScalar, is_internal

_NP_DIR = __import__("os").path.dirname(np.__file__)


def _traced_in(a, tr):
    """Traced data of trace tr in a (an array, or nested lists and tuples of them)."""
    if type(a) in (list, tuple):
        return any(_traced_in(x, tr) for x in a)
    return type(a) is TracedArray and a._trace is tr


def _plain(a):
    if type(a) in (list, tuple):
        return type(a)(_plain(x) for x in a)
    return a.view(np.ndarray) if type(a) is TracedArray else a


def holds_traced(a, tr):
    """a is (or holds, in nested lists and tuples) a traced array or number of trace tr."""
    if type(a) in (list, tuple):
        return any(holds_traced(x, tr) for x in a)
    return (type(a) is TracedArray or isinstance(a, TracedScalar)) and a._trace is tr


def held_by(arr):
    """The live Variables MadeArray.hold recorded as holding arr's buffer (arr a made
    array, or the traced data one became: follow_made keeps the record)."""
    refs = getattr(arr, "__dict__", {}).get("_holders", ())
    return [v for v in (r() for r in refs) if v is not None]


class MadeArray(np.ndarray):
    """An array the traced function made (see the module docstring)."""

    def __array_finalize__(self, obj):
        # A view of a made array (buf[1:], buf.T): the tracer cannot follow a write
        # into buf while it lives (eager's view shows the write), so buf keeps it.
        if isinstance(obj, MadeArray) and self.base is not None:
            views = obj.__dict__.setdefault("_views", [])
            views.append(weakref.ref(self))

    def has_views(self):
        """Does a live NumPy view show this buffer (buf[1:], buf.T)?"""
        return any(r() is not None for r in self.__dict__.get("_views", ()))

    def is_view(self):
        """Is this a view of another made array (buf[1:], np.broadcast_to(buf, s))?"""
        return type(self.base) is MadeArray or "_view_of_made" in self.__dict__

    def hold(self, var):
        """Variable var holds this buffer (tj.Variable(buf)): a write into buf is what
        var shows (Trace.follow_made)."""
        self.__dict__.setdefault("_holders", []).append(weakref.ref(var))

    def holders(self):
        return held_by(self)

    def __setitem__(self, key, value):
        tr = core._state.trace
        if tr is not None and not tr.abstract and (holds_traced(value, tr) or
                                                    _traced_in(key, tr)):
            if tr.follow_made(self, writing=True):
                return tr.assign_item(self, key, value)      # self is traced data now
            tr.escape("item assignment of traced data into an array made inside the "
                      "function that is a view of another, or has views (buf[1:]), or "
                      "that a Variable holds and has used (tj.Variable(buf) read before "
                      "the write): "
                      "NumPy copies it as plain values, which the tracer cannot follow")
            value, key = _plain(value), _plain(key)
        np.ndarray.__setitem__(self, key, value)

    def __array_function__(self, func, types, args, kwargs):
        # NumPy asks the arguments' types in order, and ndarray's own method (which this
        # class would inherit) runs the function on any mix of ndarray subclasses: a
        # made array before traced data (np.copyto(buf, x.data), np.concatenate([buf,
        # x.data])) would read the traced buffers as plain data. The tracer's first.
        if any(issubclass(t, TracedArray) for t in types):
            return NotImplemented
        return super().__array_function__(func, types, args, kwargs)

    def __getitem__(self, key):
        # np.eye(3)[t] with t traced: NumPy reads the index array in C, so the graph
        # would hold the traced call's rows. Followed as traced data from here on.
        tr = core._state.trace
        if tr is not None and not tr.abstract and _traced_in(key, tr):
            if tr.follow_made(self):
                return self[key]                        # TracedArray.__getitem__
            tr.escape("an array made inside the function indexed by traced data "
                      "(np.eye(3)[t]) while it has views or a Variable holds it")
            key = _plain(key)
        return np.ndarray.__getitem__(self, key)

    def put(self, indices, values, mode="raise"):
        # (NumPy's C code reads traced values or indices as plain data, as np.put's)
        tr = core._state.trace
        if tr is not None and not tr.abstract and (holds_traced(values, tr) or
                                                    _traced_in(indices, tr)):
            tr.escape("put() of traced data into an array made inside the function: "
                      "NumPy copies it as plain values, which the tracer cannot follow")
            values, indices = _plain(values), _plain(indices)
        np.ndarray.put(self, indices, values, mode)

    @property
    def flat(self):
        # buf.flat[k] = x.data copies traced values in C (np.flatiter's assignment):
        # while a trace runs, a stand-in that sees the assignment.
        it = np.ndarray.flat.__get__(self)
        tr = core._state.trace
        return it if tr is None or tr.abstract else _MadeFlat(it, tr)

    @flat.setter
    def flat(self, value):
        # `buf.flat = x.data`: ndarray's setter copies in C, as the item assignment
        self.flat[...] = value

    def fill(self, value):
        tr = core._state.trace
        if tr is not None and not tr.abstract and holds_traced(value, tr):
            if tr.follow_made(self, writing=True):
                return tr.assign_item(self, Ellipsis, value)
            tr.escape("fill() of an array made inside the function with traced data, "
                      "while it has views")
            value = _plain(value)
        np.ndarray.fill(self, value)

    def __reduce__(self):
        # Pickled (and deep-copied by pickle's protocol) as the plain array it stands for.
        return np.ndarray.view(self, np.ndarray).__reduce__()

    def __deepcopy__(self, memo):
        return np.ndarray.view(self, np.ndarray).copy()


class _MadeFlat:
    """A made array's .flat while a trace runs: np.flatiter, except that assigning
    traced data (or by a traced index) is an escape, warned, not a plain copy."""

    __slots__ = ("_it", "_tr")

    def __init__(self, it, tr):
        self._it, self._tr = it, tr

    def __setitem__(self, key, value):
        if holds_traced(value, self._tr) or _traced_in(key, self._tr):
            self._tr.escape(".flat[...] = traced data, into an array made inside the "
                            "function: NumPy copies it as plain values, which the tracer "
                            "cannot follow")
            value, key = _plain(value), _plain(key)
        self._it[key] = value

    def __getitem__(self, key):
        return self._it[key]

    def __iter__(self):
        return iter(self._it)

    def __len__(self):
        return len(self._it)

    def __array__(self, dtype=None, copy=None):
        a = self._it.copy()                 # (np.flatiter's: a new 1-d array)
        return a if dtype is None else a.astype(dtype)

    def __getattr__(self, name):
        return getattr(self._it, name)      # base, coords, index, copy()


def made(result, frame):
    """NumPy's result of a constructor the code in frame called: a MadeArray view of it
    where that is the user's code and the result a plain array, else the result."""
    if type(result) is not np.ndarray:
        return result
    tr = core._state.trace
    if tr is None or tr.abstract or is_internal(frame) or \
            frame.f_code.co_filename.startswith(_NP_DIR):
        return result
    return result.view(MadeArray)


def made_result(r, args, kwargs, frame):
    """A NumPy function's plain ndarray result r, given to the code in frame (any NumPy
    function but the constructors above: np.where, np.pad, np.outer, np.fromfunction,
    np.resize ...): an array f made, as np.zeros's is, where that is the user's code.
    Those gave plain arrays (NumPy's C code makes its results of made operands without
    subclass propagation, or of Python lists), and `buf[:] = x.data; if buf.sum() > 0:`
    on one froze the traced call's branch, silently. r itself where it is an argument
    (np.atleast_1d(a) is a), or a view of a plain argument (that array's own business,
    as before); a view of a made argument is one of its views (a write into either is
    then an escape, as for buf[1:])."""
    tr = core._state.trace
    if tr is None or tr.abstract or is_internal(frame) or \
            frame.f_code.co_filename.startswith(_NP_DIR):
        return r
    flat = _operands(args, kwargs)
    if any(a is r for a in flat):
        return r
    owners = []
    if r.base is not None:
        for a in flat:
            if isinstance(a, np.ndarray) and np.may_share_memory(a, r):
                if type(a) is not MadeArray:
                    return r
                owners.append(a)
    v = r.view(MadeArray)
    if owners:
        v.__dict__["_view_of_made"] = True
        for m in owners:
            m.__dict__.setdefault("_views", []).append(weakref.ref(v))
    return v


def _operands(args, kwargs, depth=0):
    """The arrays among a call's arguments (in lists and tuples, two levels deep)."""
    out = []
    for a in list(args) + list(kwargs.values()):
        if isinstance(a, np.ndarray):
            out.append(a)
        elif type(a) in (list, tuple) and depth < 2:
            out += _operands(a, {}, depth + 1)
    return out


def plain_of(m):
    """The plain ndarray view that stands for MadeArray m outside the trace: one object
    wherever m was (a result, state, a Variable's data), as eager's array is one."""
    v = m.__dict__.get("_plain")
    if v is None:
        v = m.__dict__["_plain"] = np.ndarray.view(m, np.ndarray)
    return v


def plain_tree(obj, memo=None, depth=0):
    """obj (the traced call's result) with each MadeArray its plain_of view (the same
    array in two places is one object there too). Lists and dicts are changed in place
    (they are the very objects eager returns, and may be state too); a tuple holding
    one is rebuilt, once (a result DAG, `r = (r, r)` sixty times, is walked once per
    object, not per path)."""
    memo = {} if memo is None else memo
    t = type(obj)
    if t is MadeArray:
        return plain_of(obj)
    if not (t is list or t is dict or isinstance(obj, tuple)):
        return obj
    done = memo.get(id(obj))
    if done is not None:
        return done[0]
    memo[id(obj)] = (obj,)                   # (a list that holds itself: itself)
    if depth > 200:                           # (past pytree.MAX_DEPTH: an escape)
        return obj
    if t is list or t is dict:
        for k in (range(len(obj)) if t is list else list(obj)):
            y = plain_tree(obj[k], memo, depth + 1)
            if y is not obj[k]:
                obj[k] = y
        return obj
    if t is not tuple and not hasattr(t, "_make"):
        return obj
    items = [plain_tree(x, memo, depth + 1) for x in obj]
    if not all(a is b for a, b in zip(items, obj)):
        new = t(items) if t is tuple else t._make(items)
        memo[id(obj)] = (new,)
        return new
    return obj


# NumPy's in-place writers: their first argument is the array written.
IN_PLACE_WRITERS = frozenset(("copyto", "put", "place", "putmask", "put_along_axis",
                              "fill_diagonal"))

