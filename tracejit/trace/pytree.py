"""Arguments and results of a jitted call as trees: leaves (arrays, Variables, floats)
inside tuples, lists and dicts, and everything else static (part of the cache key).

Used by runtime.jitted to key calls, by trace.call to describe a traced call's result
(its Leaf records) and by runtime.variant to rebuild a call's results.
"""
import dataclasses
import inspect
import weakref

import numpy as np

from tracejit.core import MOVEMENT, NoDataError, Parameter, Variable
from tracejit.trace import made, pystate
from tracejit.trace.record import TracedArray, TracedScalar
from tracejit.trace.records import Form, Leaf

# Module-level names of the forms: the per-call key builders read globals, not Form's
# attributes.
VAR, ARR, FLT = Form.VARIABLE, Form.ARRAY, Form.FLOAT
SCALAR = Form.NUMPY_SCALAR          # a result leaf eager NumPy returns as a scalar
PYTHON_SCALAR = Form.PYTHON_SCALAR  # ... as a Python scalar (np.allclose)
STATIC = "static"      # the tree node of a static value: (STATIC, value), in the key
BY_ID = "static by identity"   # (BY_ID, _Identity(obj)): an object keyed by identity


# How deep arguments and results may nest (lists, tuples, dicts in one another): their
# trees are keys that Python compares, and source the runner is generated as, both
# recursively (a key nested ~1000 deep raises RecursionError when compared). Deeper
# ones run eagerly, warned (NestedTooDeep; a result's: an escape of the trace).
MAX_DEPTH = 100


class NestedTooDeep(Exception):
    """An argument nests containers deeper than MAX_DEPTH: the call runs eagerly."""


def flatten_args(obj, leaves, depth=0):
    """Append array-like leaves to `leaves`; return a hashable structure with statics."""
    t = type(obj)
    if t is Variable or isinstance(obj, Variable):
        leaves.append(obj)
        return VAR
    if t is np.ndarray or isinstance(obj, np.ndarray):
        leaves.append(obj)
        return ARR
    if t is float:
        leaves.append(obj)
        return FLT
    if t is tuple or t is list or t is dict:
        if depth >= MAX_DEPTH:
            raise NestedTooDeep(depth)
        if t is dict:
            keys = tuple(obj)
            return ("dict", keys) + tuple(flatten_args(obj[k], leaves, depth + 1)
                                          for k in keys)
        return (t.__name__,) + tuple(flatten_args(x, leaves, depth + 1) for x in obj)
    if isinstance(obj, np.generic) and obj.dtype.kind == "f":
        # A 0-d array leaf, keyed apart from a 0-d array argument: eager's code may
        # tell them apart (isinstance, grad's float64 leaf, the type it returns).
        leaves.append(np.asarray(obj))
        return SCALAR
    if pystate.keyed_by_identity(obj) or pystate.argument_object(obj):
        # An object whose class compares by value (__eq__ / __hash__; a dataclass, whose
        # __hash__ is None) but holds state the function reads (arrays, Variables,
        # mutable attributes): an equal object is not the same state. Keyed by identity
        # (the variant captured this one's arrays), and walked as a root
        # (pystate.argument_objects), as an object of default equality is.
        return (BY_ID, _Identity(obj))
    try:
        hash(obj)
    except TypeError:
        raise TypeError(f"jit: argument of type {t.__name__} is neither an array, a Variable, "
                        f"a float nor hashable (it could not be a static argument)") from None
    return (STATIC, obj)


class _Identity:
    """An object in a signature key by identity (hash and == of id), not by its class's
    __eq__: (BY_ID, _Identity(obj)). Held by a weak reference where the object takes one:
    a key kept in a Jitted's tables (its warm-up set, its fallbacks) must not keep alive
    an object the caller built for one call (a config or holder object made per call);
    once it dies the key equals no live object's (a new object at its address included).
    `cls` is its class, which stays: the storm check groups keys by it."""

    __slots__ = ("_ref", "_id", "cls")

    def __init__(self, obj):
        self._id = id(obj)
        self.cls = type(obj)
        try:
            self._ref = weakref.ref(obj)
        except TypeError:                    # __slots__ without __weakref__: held
            self._ref = _Strong(obj)

    @property
    def obj(self):
        return self._ref()

    def __hash__(self):
        return self._id

    def __eq__(self, other):
        if type(other) is not _Identity or other._id != self._id:
            return False
        o = self._ref()
        return o is not None and o is other._ref()

    def __repr__(self):
        return f"<the {self.cls.__name__} object at {self._id:#x}>"


class _Strong:
    """weakref.ref's call, for an object that takes no weak reference."""

    __slots__ = ("obj",)

    def __init__(self, obj):
        self.obj = obj

    def __call__(self):
        return self.obj


def unflatten(tree, leaves, it=None, bound=None, argv=None):
    """argv: the call's (args, kwargs), for a result that is an argument's container.
    Iterative: a traced call's result nested deeper than the recursion limit is rebuilt
    too (it then runs eagerly from the next call on: MAX_DEPTH)."""
    it = iter(leaves) if it is None else it
    bound = {} if bound is None else bound
    root = []
    stack = [(None, iter((tree,)), root)]      # (tree, its subtrees left, their objects)
    while stack:
        node, subtrees, built = stack[-1]
        for t in subtrees:
            subs = _subtrees(t)
            if subs is None:
                built.append(_unflatten_leaf(t, it, bound, argv))
            else:
                stack.append((t, iter(subs), []))
                break
        else:
            stack.pop()
            if stack:
                stack[-1][2].append(_container(node, built, bound))
    return root[0]


def _subtrees(tree):
    """The subtrees of a container's tree (a bind's: the container's), None for a leaf."""
    if tree in (VAR, ARR, FLT) or tree == SCALAR:
        return None
    tag = tree[0]
    if tag == "bind":
        return tree[2:]
    if tag in ("tuple", "list"):
        return tree[1:]
    if tag in ("dict", "ntuple"):
        return tree[2:]
    if tag == "dataclass":
        return tree[3:]
    return None


def _unflatten_leaf(tree, it, bound, argv):
    if tree in (VAR, ARR, FLT):
        return next(it)
    if tree == SCALAR:
        return next(it)[()]          # an np.generic argument's 0-d leaf: the scalar
    tag = tree[0]
    if tag == "again":
        return bound[tree[1]]
    if tag == STATIC:
        return tree[1]
    if tag == BY_ID:
        return tree[1].obj
    if tag == "argobj":
        return arg_at(argv, tree[1])
    raise AssertionError(tree)


def _container(tree, items, bound):
    tag = tree[0]
    if tag == "bind":
        bound[tree[1]] = items[0]
        return items[0]
    if tag == "tuple":
        return tuple(items)
    if tag == "list":
        return items
    if tag == "dict":
        return dict(zip(tree[1], items))
    if tag == "dataclass":
        return rebuild_dataclass(tree[1], tree[2], items)
    return tree[1]._make(items)          # "ntuple"


def rebuild_dataclass(cls, names, items):
    """A new instance of dataclass cls with these attributes, as the traced call's own
    object had them after its __init__ and __post_init__ (which are not run again: the
    graph computed what they computed of traced values; frozen and slotted ones too)."""
    obj = object.__new__(cls)
    for n, v in zip(names, items):
        object.__setattr__(obj, n, v)
    return obj


def _dataclass_fields(x, t):
    """(names, values) of a dataclass instance the call made (its instance attributes:
    fields and what __post_init__ set), or None for a class, or an instance from before
    the call (`fresh` says which), returned as that object."""
    if isinstance(x, type) or not dataclasses.is_dataclass(t):
        return None
    d = getattr(x, "__dict__", None)
    if isinstance(d, dict):
        names = tuple(d)
    else:                                   # slots=True
        names = tuple(f.name for f in dataclasses.fields(x))
    return names, [getattr(x, n) for n in names]


def arg_at(argv, path):
    """The object at `path` (("a", i, *keys) or ("k", name, *keys)) in a call's
    (args, kwargs): an argument container, returned as eager returns it."""
    args, kwargs = argv
    obj = args[path[1]] if path[0] == "a" else kwargs[path[1]]
    for k in path[2:]:
        obj = obj[k]
    return obj


def path_source(path, const):
    """arg_at written out, on the runner's `args` / `kwargs`."""
    src = f"args[{path[1]}]" if path[0] == "a" else f"kwargs[{path[1]!r}]"
    return src + "".join(f"[{k}]" if type(k) is int else f"[{const(k)}]" for k in path[2:])


def leaf_key(x):
    if isinstance(x, Variable):
        d = x._data
        if d is None:
            raise NoDataError("jit: a Variable argument has data None")   # named by the caller
        if not isinstance(d, np.ndarray):
            raise TypeError(f"jit: a Variable argument holds a {type(d).__name__}, not a "
                            f"numpy.ndarray (set .data to np.array(...))")
        g = x._grad
        if g is None:
            return (d.shape, d.dtype.char, isinstance(x, Parameter))
        # Set: backward adds to it (traced None, it would overwrite), the function may
        # read it: its shape and dtype are the call's as its data's are.
        gd = g._data
        return (d.shape, d.dtype.char, isinstance(x, Parameter),
                (gd.shape, gd.dtype.char) if isinstance(gd, np.ndarray) else type(gd).__name__)
    if isinstance(x, np.ndarray):
        if x.dtype == object:
            raise TypeError("jit: object arrays are not supported")
        return (x.shape, x.dtype.char)
    return None


# ------------------------------------------------------------------ the compiled call


def flatten_result(obj, leaves, keep=None, before=frozenset()):
    """The result's tree (containers as in flatten_args, every leaf VAR), leaves
    appended. A list, dict or tuple found in two places is one object in eager: its first
    place is ("bind", k, tree), the others ("again", k), so it is rebuilt once.
    keep: id -> path of the argument containers the call returns as they came
    (("argobj", path): that object itself, as eager returns it).
    before: ids of the objects the call could reach when it started (its state and
    arguments): a dataclass instance among them is returned as that object; one the call
    made is rebuilt around its attributes' leaves (("dataclass", cls, names, ...)).
    Iterative (a result of any depth; container_depth says whether it compiles)."""
    counts = {}
    _count_containers(obj, counts, before)
    shared = {i: None for i, n in counts.items() if n > 1}
    root = []
    # (head of the tree, its bind number or None, items left, their trees)
    stack = [(None, None, iter((obj,)), root)]
    while stack:
        head, k, items, trees = stack[-1]
        for x in items:
            tree, walk = _result_node(x, leaves, shared, keep, before)
            if walk is None:
                trees.append(tree)
            else:
                stack.append((walk[0], walk[1], iter(walk[2]), []))
                break
        else:
            stack.pop()
            if stack:
                tree = head + tuple(trees)
                stack[-1][3].append(tree if k is None else ("bind", k, tree))
    return root[0]


def _result_node(x, leaves, shared, keep, before=frozenset()):
    """(x's tree, None) for a leaf or a reference, else (None, (head, bind number or
    None, the items to walk))."""
    if keep:
        path = keep.get(id(x))
        if path is not None:
            return ("argobj", path), None
    k = shared.get(id(x), False)
    if k is not False:
        if k is not None:
            return ("again", k), None
        shared[id(x)] = k = sum(v is not None for v in shared.values())
    else:
        k = None
    t = type(x)
    if isinstance(x, (Variable, np.ndarray, TracedScalar)):
        leaves.append(x)
        return VAR, None
    if t is tuple or t is list:
        return None, ((t.__name__,), k, x)
    if t is dict:
        keys = tuple(x)
        return None, (("dict", keys), k, [x[key] for key in keys])
    if _is_namedtuple(t):
        # A NamedTuple of results (Out(loss, h)): rebuilt as one of its class, around
        # its fields' leaves (as a leaf, compiled calls returned the traced call's).
        return None, (("ntuple", t), k, x)
    dc = _dataclass_fields(x, t) if id(x) not in before else None
    if dc is not None:
        # A dataclass of results the call made (Output(loss=..., logits=...)): a new
        # one each call, as eager's (as a leaf, compiled calls returned the traced
        # call's object again, and the first-call check ran them eagerly).
        return None, (("dataclass", t, dc[0]), k, dc[1])
    leaves.append(x)
    return VAR, None


def container_depth(obj, limit, before=frozenset()):
    """How deep tuples, lists, dicts (and dataclasses the call made) nest in obj,
    counted up to limit + 1."""
    deepest, stack = 0, [(obj, 0)]
    seen = {}             # id -> the deepest level a container was walked at: one list
    while stack and deepest <= limit:       # in many places is walked once per level
        x, d = stack.pop()
        t = type(x)
        dc = _dataclass_fields(x, t) if id(x) not in before else None
        if (t is tuple or t is list or t is dict or _is_namedtuple(t) or dc is not None) \
                and seen.get(id(x), -1) < d:
            seen[id(x)] = d
            deepest = max(deepest, d + 1)
            stack.extend((y, d + 1) for y in (x.values() if t is dict else
                                              dc[1] if dc is not None else x))
    return deepest


def _is_namedtuple(t):
    return issubclass(t, tuple) and isinstance(getattr(t, "_fields", None), tuple) \
        and callable(getattr(t, "_make", None))


def _count_containers(obj, counts, before=frozenset()):
    stack = [obj]
    while stack:
        obj = stack.pop()
        t = type(obj)
        dc = _dataclass_fields(obj, t) if id(obj) not in before else None
        # Tuples too: one tuple in many places is one object in eager, and walked per
        # place a result DAG (`r = (r, r)` sixty times) would be 2**60 leaves.
        if t is list or t is dict or t is tuple or _is_namedtuple(t) or dc is not None:
            counts[id(obj)] = counts.get(id(obj), 0) + 1
            if counts[id(obj)] > 1:
                continue
        if t is tuple or t is list or _is_namedtuple(t):
            stack.extend(obj)
        elif t is dict:
            stack.extend(obj.values())
        elif dc is not None:
            stack.extend(dc[1])


def _same_array(a, b):
    """a and b are the same array in all but the Python object: one buffer, one layout."""
    return (b is not None and a.shape == b.shape and a.dtype == b.dtype
            and a.strides == b.strides
            and a.__array_interface__["data"][0] == b.__array_interface__["data"][0])


def result_leaves(tr, raw):
    """What each leaf of a traced result is, as eager would return it.

    Returns (leaves, objects). leaves[i] describes raw[i] for the variant's runner, as
    a Leaf (kind, what, form):
      ("out", Value, kind)      computed by the graph: a fresh object each call (kind
                                VAR, ARR, FLT, SCALAR or PYTHON_SCALAR)
      ("arg", i, kind)          the call's argument leaf i itself (an ndarray argument
                                updated in place too: eager returns that object)
      ("argdata", i, None)      `.data` of argument i (eager returns its array object)
      ("const", obj, kind)      a captured Variable or array itself (the same object
                                every call, as eager), or a constant
      ("capdata", var, None)    `.data` of a captured Variable, read after the call
      ("capgrad", var, None)    the `.grad` of a captured Variable, read after the call
      ("arggrad", i, None)      the `.grad` of argument i, read after the call
      ("vardata", j, None)      `.data` of the Variable result leaf j
      ("same", j, None)         the object of leaf j again (`return y, y`)
      ("wrap", leaf, VAR)       a new Variable (no creator) of the array `leaf` (one of
                                the kinds above) is: `Variable(y.data)`; ("constcopy",
                                arr, ARR) inside it: a copy of arr, an array the call
                                made that the graph reads as a constant; ("graddata",
                                g, None): the array of the .grad the call's g-th grad
                                effect sets (`Variable(x.grad.data)`); ("inputdata",
                                r, None): the array graph input r, a .grad the caller
                                set, holds as the call reads it
    objects[i] is what the traced call itself returns for raw[i] (tracers replaced).
    One object returned twice is one leaf: a variant returns it once, so the gradients
    from both uses add up in its one Variable, as they do in eager.
    """
    var_pos = {}
    for i, x in enumerate(raw):
        if isinstance(x, Variable):
            var_pos.setdefault(id(x), i)
    grad_owner = {id(v): o for v, (k, o) in tr.captures if k == "grad"}
    # The .grad objects the call set on Variables from outside, as it left them.
    set_grads = {}
    for var in tr.grad_writes.values():
        if var._grad is not None:
            set_grads.setdefault(id(var._grad), var)
    first = {}
    leaves, objects = [], []
    rebinds, copied = [], []
    for i, x in enumerate(raw):
        obj, leaf = _eager_object(tr, x, var_pos, grad_owner, raw)
        if leaf is not None and leaf[0] in ("wrap", "const") and id(x) in set_grads:
            # A backward that passes its seed through (`y = x + 1.0; y.backward();
            # return x.grad`) leaves a .grad no op computed: eager returns that .grad,
            # the one the variant's grad effect sets, not a new Variable of its array.
            owner = set_grads[id(x)]
            leaf = ("arggrad", tr.arg_leaf[id(owner)], VAR) if id(owner) in tr.arg_leaf \
                else ("capgrad", owner, VAR)
        j = first.setdefault(id(obj), i)
        if j != i:
            leaves.append(Leaf("same", j, None))
            objects.append(objects[j])
            continue
        if leaf is None:
            leaf = _computed_leaf(tr, x)
        elif leaf[0] == "wrap":
            if leaf[1][0] == "const" and _made_in_call(tr, leaf[1][1]):
                # `Variable(np.ones(3))`, a seed returned: an array the call made, which
                # the graph reads as a constant; eager makes a new one every call.
                leaf = ("wrap", ("constcopy",) + tuple(leaf[1][1:]), leaf[2])
            # The traced call's own result holds that array object too, as eager's.
            rebinds.append((x, leaf[1]))
        leaves.append(Leaf(*leaf))
        if leaf[0] == "out":
            obj = strip_tracers(x)
            # Not the graph's constant itself: the caller may change the traced call's
            # result in place, and compiled calls would return what it made of it.
            if isinstance(obj, np.ndarray) and _made_in_call(tr, obj):
                obj = obj.copy(order="K")
            elif isinstance(obj, Variable) and _made_in_call(tr, obj._data):
                copied.append(obj)
        objects.append(obj)
    # The arrays changed once every leaf is known: a later leaf is found to share an
    # earlier one's array by that array (`c = Variable(seed); d = Variable(c.data)`,
    # each a "constcopy" of the seed's ones if c held its copy already).
    for obj in copied:
        obj._data = obj._data.copy(order="K")
    for x, inner in rebinds:
        x._data = _wrapped_array(tr, inner, raw)
    share_arrays(raw, leaves, objects)
    return leaves, objects


def share_arrays(raw, leaves, objects):
    """The traced call's results that hold another Variable result's array object
    (`Variable(h.data)`, `return c, c.data`): that Variable's array as it is now,
    after its rebuild as a view (call.py), down chains of them in leaf order."""
    for i, leaf in enumerate(leaves):
        if leaf[0] == "wrap" and leaf[1][0] == "vardata":
            raw[i]._data = raw[leaf[1][1]]._data
        elif leaf[0] == "vardata":
            objects[i] = raw[leaf[1]]._data
        elif leaf[0] == "same":
            objects[i] = objects[leaf[1]]


def _made_in_call(tr, arr):
    """arr is an array the graph reads as a constant that the function made (not one
    from outside it reads by a name)."""
    return isinstance(arr, np.ndarray) and id(arr) in tr.captured_arrays and \
        tr.captured_arrays[id(arr)][0] is arr and id(arr) not in tr.names


def _eager_object(tr, x, var_pos, grad_owner, raw):
    """(the object eager returns for result leaf x, its leaf if not computed)."""
    if isinstance(x, Variable):
        entry = tr.captured_vars.get(id(x))
        if id(x) in tr.arg_leaf:
            return x, ("arg", tr.arg_leaf[id(x)], VAR)
        if entry is not None and entry[0] is x:
            owner = grad_owner.get(id(entry[1]))
            if owner is None:
                # A captured Variable returned is that object, as in eager (its data
                # as the call's effects leave it).
                return x, ("const", x, VAR)
            if owner._grad is x and id(owner) in tr.arg_leaf:
                return x, ("arggrad", tr.arg_leaf[id(owner)], VAR)    # this call's
            if owner._grad is x:
                return x, ("capgrad", owner, VAR)
        elif x._tv is None:
            return x, ("const", x, VAR)      # from outside and never used: itself
        elif x.creator is None and x._data is not None:
            # `Variable(y.data)`: a new Variable of an array eager returns elsewhere.
            inner = _array_of(tr, x, var_pos, raw)
            if inner is not None:
                return x, ("wrap", inner, VAR)
        return x, None
    if isinstance(x, TracedArray):
        view = tr.arg_views.get(id(x))
        if view is not None and view[0] is x:
            return view[2], ("arg", view[1], ARR)
        if x._capture is not None:
            return x._capture, ("const", x._capture, ARR)
        owner = x._owner
        if owner is not None and _same_array(x, owner._data):
            # `v.data`: eager returns the Variable's array object itself.
            entry = tr.captured_vars.get(id(owner))
            if id(owner) in tr.arg_leaf:
                return owner._data, ("argdata", tr.arg_leaf[id(owner)], None)
            if entry is not None and entry[0] is owner and \
                    id(entry[1]) not in _grad_inputs(tr):
                return owner._data, ("capdata", owner, None)
            # (`x.grad.data` of a .grad from outside: the runner's input array itself,
            # this call's .grad's, result_views' ("input", r), () root.)
            if id(owner) in var_pos:
                return owner._data, ("vardata", var_pos[id(owner)], None)
            j = _holder_of(tr, owner, var_pos, raw)
            if j is not None:
                return raw[j]._data, ("vardata", j, None)
            return owner._data, None    # computed; `h.data` twice is one object
        held = made.held_by(x)
        for j in var_pos.values():
            # (the Variable's array is a plain view of x by now: made.plain_of)
            if any(raw[j] is h for h in held) and raw[j]._tv is x._tv \
                    and _same_array(raw[j]._data, x):
                # An array f made that a Variable result holds (`v = Variable(a);
                # a[:] = x.data; return v, a`): eager's a is v.data.
                return x, ("vardata", j, None)
        return x, None
    if isinstance(x, TracedScalar):
        view = tr.arg_views.get(id(x))
        if view is not None and view[0] is x:
            return view[2], ("arg", view[1], FLT)
    return x, None


def _holder_of(tr, owner, var_pos, raw):
    """The Variable result leaf made as `Variable(owner.data)` (or down a chain of new
    Variables, `Variable(Variable(owner.data).data)`), owner not a result: eager's holds
    owner's array object, the one every `owner.data` gives, or None."""
    for j in var_pos.values():
        y, o = raw[j], raw[j]
        while o is not owner and id(o) in tr.made_of_data:
            var, t, up = tr.made_of_data[id(o)]
            if var is not o or o._tv is not t._tv or not _same_array(o._data, t) or \
                    not _same_array(t, up._data):
                break
            o = up
        if o is owner and y is not owner:
            return j
    return None


def _array_of(tr, x, var_pos, raw):
    """The leaf (as result_leaves describes them) of the array a creator-less Variable
    x made inside the function holds, when eager would have given it that very array
    object: the same buffer and the same traced value (no operation between), of an
    argument, a captured Variable or array, or a Variable result."""
    d, tv = x._data, x._tv
    for var, v in tr.arg_vars.values():
        if var._tv is tv and _same_array(d, var._data):
            return ("argdata", tr.arg_leaf[id(var)], None)
    for arr, v in tr.arg_arrays.values():
        if v is tv and _same_array(d, arr) and id(arr) in tr.arg_leaf:
            return ("arg", tr.arg_leaf[id(arr)], ARR)
    grads = _grad_inputs(tr)
    for var, v in tr.captured_vars.values():
        if var._tv is tv and _same_array(d, var._data):
            if id(v) in grads:
                # A .grad from outside (not the traced call's .grad object): this
                # call's, as the call reads it.
                r = next(i for i, u in enumerate(tr.graph.inputs) if u is v)
                return ("inputdata", r, None)
            return ("capdata", var, None)
    # The array of a .grad the call sets (`Variable(x.grad.data)`, also of a seed passed
    # through, which the graph reads as a constant): eager's .grad and the new Variable
    # share it, so the runner wraps the very array its grad effect sets (not a copy),
    # also where that .grad is returned after x (its array: the grad effect's, which
    # x, made earlier, cannot name through the result).
    for gi, var in enumerate(tr.grad_writes.values()):
        g = var._grad
        if g is not None and g is not x and g._tv is tv and \
                _same_array(d, g._data):
            return ("graddata", gi, None)
    # A Variable result holding it (`return x.grad, Variable(x.grad.data)`, two
    # Variables of one `np.ones(3)`): that result's array, before a constant's copy. A
    # later one only if computed (a later new Variable may be a "vardata" of this one).
    for j in var_pos.values():
        y = raw[j]
        if y is not x and (j < var_pos[id(x)] or y.creator is not None) and \
                y._tv is tv and _same_array(d, y._data):
            return ("vardata", j, None)
    for arr, v in tr.captured_arrays.values():
        if v is tv and _same_array(d, arr):
            return ("const", arr, ARR)
    return None


def _wrapped_array(tr, inner, raw):
    kind, a, _ = inner
    if kind == "argdata":
        return next(var._data for var, _ in tr.arg_vars.values() if tr.arg_leaf[id(var)] == a)
    if kind == "arg":
        return next(arr for arr, _ in tr.arg_arrays.values() if tr.arg_leaf.get(id(arr)) == a)
    if kind == "capdata":
        return a._data
    if kind == "const":
        return a
    if kind == "constcopy":
        return a.copy(order="K")      # (eager's is laid out as the function made it)
    if kind == "graddata":
        return list(tr.grad_writes.values())[a]._grad._data
    if kind == "inputdata":
        return input_arrays(tr)[a]
    return raw[a]._data


def _computed_leaf(tr, x):
    if isinstance(x, Variable):
        return ("out", tr.value_of(x), VAR)
    if isinstance(x, TracedScalar):
        # A Python number returned (float(loss) summed): one, as eager's.
        return ("out", x._tv, FLT if x.pytype is float else PYTHON_SCALAR)
    if isinstance(x, np.ndarray):
        scalar = getattr(x, "_numpy_scalar", False)
        return ("out", tr.array_value(x), ARR if not scalar else
                PYTHON_SCALAR if scalar == "python" else SCALAR)
    return ("const", x, None)


def strip_tracers(obj):
    """The traced call's result with tracer types replaced by plain ones."""
    if isinstance(obj, TracedArray):
        a = np.array(obj.view(np.ndarray))
        scalar = obj._numpy_scalar
        return a if not scalar else a.item() if scalar == "python" else a[()]
    if isinstance(obj, TracedScalar):
        return obj._value
    if type(obj) in (tuple, list):
        return type(obj)(strip_tracers(x) for x in obj)
    if type(obj) is dict:
        return {k: strip_tracers(v) for k, v in obj.items()}
    return obj


def arg_names(fn, n):
    try:
        params = list(inspect.signature(fn).parameters)
    except Exception:  # noqa: BLE001 - inspect probes __wrapped__ / __signature__ with
        params = []    # hasattr: a user __getattr__ raising KeyError reaches here
    names = []
    for i in range(n):
        names.append(params[i] if i < len(params) and params[i] not in ("args", "kwargs")
                     else f"arg{i}")
    return names


def structure_source(tree, exprs, const):
    if tree in (VAR, ARR, FLT):
        return next(exprs)
    tag = tree[0]
    if tag == STATIC:
        return const(tree[1])
    if tag == BY_ID:
        return const(tree[1].obj)
    if tag == "bind":       # one list or dict in several places: named where first built
        return f"(t{tree[1]} := {structure_source(tree[2], exprs, const)})"
    if tag == "again":
        return f"t{tree[1]}"
    if tag == "argobj":     # an argument's container itself (the runner's args/kwargs)
        return path_source(tree[1], const)
    parts = [structure_source(t, exprs, const)
             for t in tree[(2 if tag in ("dict", "ntuple") else 3 if tag == "dataclass"
                           else 1):]]
    if tag == "dataclass":
        return (f"{const(rebuild_dataclass)}({const(tree[1])}, {const(tree[2])}, "
                f"({''.join(p + ', ' for p in parts)}))")
    if tag == "ntuple":
        return f"{const(tree[1])}._make(({''.join(p + ', ' for p in parts)}))"
    if tag == "tuple":
        return "(" + "".join(p + ", " for p in parts) + ")"
    if tag == "list":
        return "[" + ", ".join(parts) + "]"
    keys = tree[1]
    return "{" + ", ".join(f"{const(k)}: {p}" for k, p in zip(keys, parts)) + "}"


# ------------------------------------------------------------------ returned views


def result_views(tr, raw, leaves):
    """Which computed results eager returns as views of an input's buffer or of another
    result's array (`x.data[0:2]`, `x.data.T`, F.reshape(x), `a.data[1:]` next to `a`),
    and how to rebuild each on the live buffer.

    Returns ({leaf index: (root, steps)}, unexpressed): root ("input", i) (forward graph
    input i: an argument's or a capture's array as the call reads it), ("effect", e)
    (the buffer in-place effect e writes into), ("copy", i) (a copy, new every call, of
    forward graph input i, an array the function made: eager's is new every call),
    ("value", Value) (a value no result holds, which the variant returns too),
    ("rebind", e) (the array rebind effect e stored, `W.data = h.data`, its Variable
    rebound that once),
    ("leaf", j) (result leaf j's array: a
    computed one, or the new array of a returned `Variable(np.ones(3))`), ("grad", g)
    (the array of the .grad the call's g-th grad effect sets: a seed passed through,
    `y = x + 1.0; y.backward(); F.transpose(x.grad)`, is a constant of the graph the
    runner copies, a computed one is a graph output) or ("madegrad", m) (the array of
    the .grad the m-th result Variable keeps, retain_grad); steps: the NumPy view
    operations, replayed at return time so that the result aliases the buffer as
    eager's does (and holds what the call's in-place effects left in it); () when the
    result is that array object itself (`x.grad.data`). unexpressed: leaf indices whose
    traced array shares memory with such a buffer but no replay rebuilds it (the call
    runs eagerly: a copy would be silently unaliased)."""
    ctx = _ViewRoots(tr, raw, leaves)
    views, unexpressed = {}, []
    for i, leaf in enumerate(leaves):
        if leaf[0] != "out" or leaf[2] not in (VAR, ARR):
            continue
        arr = _plain(raw[i])
        if arr is None:
            continue
        data = raw[i]._data if isinstance(raw[i], Variable) else raw[i]
        found = ctx.view_of(arr, data, leaf[1], i)
        if found is not None:
            views[i] = found

    def group(i):        # the buffer a result is rebuilt on: ("input", r) or ("leaf", j)
        while i in views and views[i][0][0] == "leaf":
            i = views[i][0][1]
        return views[i][0] if i in views else ("leaf", i)
    # A computed result sharing memory with a buffer it is not rebuilt on: a copy
    # would not alias it.
    for i, leaf in enumerate(leaves):
        if leaf[0] != "out" or i in views:
            continue
        arr = _plain(raw[i])
        if arr is None or arr.size == 0:
            continue
        if ctx.overlaps_outside(arr) or any(
                # (The same Value twice is the identity checks' business: `return y, y`.)
                j != i and leaves[j][0] == "out" and group(j) != ("leaf", i)
                and leaves[j][1] is not leaf[1]
                and _plain(raw[j]) is not None and _overlaps(arr, _plain(raw[j]))
                for j in range(len(leaves))):
            unexpressed.append(i)
    return views, unexpressed


def rebind_views(tr, raw, leaves, out_views):
    """Which arrays the call's rebind effects store (`W.data = x.data[:, ::-1]`) are, in
    eager, views of a buffer a compiled call has at hand when it applies them, and how
    to rebuild each there: {effect index: (root, steps)}, roots as result_views' (an
    input's array as the call reads it, the buffer of an earlier in-place effect, the
    .grad a grad effect sets, a computed result's array). unexpressed: the effects whose
    array shares memory with a buffer from outside or with a result, but no replay
    rebuilds it (the call runs eagerly: a copy would be silently unaliased)."""
    ctx = _ViewRoots(tr, raw, leaves)
    views, unexpressed, copies = {}, [], set()

    def root_of(i):     # the buffer result i is rebuilt on, ("leaf", i) if none
        while i in out_views and out_views[i][0][0] == "leaf":
            i = out_views[i][0][1]
        return out_views[i][0] if i in out_views else ("leaf", i)
    for e, (kind, _, v) in enumerate(tr.effects):
        arr = tr.rebind_arrays.get(e) if kind == "rebind" else None
        if not isinstance(arr, np.ndarray) or type(arr) is not np.ndarray:
            continue
        found = ctx.view_of(arr, arr, v, before=e)
        if found is not None and _rebind_root_ok(found[0], e, leaves, out_views):
            views[e] = found
            continue
        # (A result rebuilt on the array this effect stores shares it in compiled
        # calls too.)
        shared = arr.size and any(
            leaf[0] == "out" and root_of(i) != ("rebind", e) and _plain(x) is not None
            and _overlaps(arr, _plain(x)) for i, (x, leaf) in enumerate(zip(raw, leaves)))
        if found is not None and found[0][0] == "copy" and not shared and \
                found[0][1] not in copies:
            # An array the function made (`W.data = np.ones(3)`): eager's is new every
            # call, and so is the runner's copy of the graph's, shared with nothing else.
            copies.add(found[0][1])
            continue
        if shared or (arr.size and ctx.overlaps_outside(arr)):
            unexpressed.append(e)
    return views, unexpressed


def _rebind_root_ok(root, e, leaves, out_views):
    """Does the runner hold root's buffer when it applies rebind effect e: an input it
    reads, an earlier in-place effect's buffer, a grad effect's array (made before the
    effects), a computed result not itself rebuilt as a view?"""
    where, r = root
    if where in ("input", "grad", "rebind"):
        return True         # (an earlier rebind: candidates' `before`)
    if where == "effect":
        return r < e
    return where == "leaf" and leaves[r][0] == "out" and r not in out_views


class _ViewRoots:
    """The buffers a view can be rebuilt on at call time (result_views' roots), and the
    search for the one an array the trace holds is a view of."""

    def __init__(self, tr, raw, leaves):
        self.tr, self.raw = tr, raw
        self.producer = {}
        for n in tr.graph.nodes:
            for o in n.outputs:
                self.producer[id(o)] = n
        self.input_pos = {id(v): i for i, v in enumerate(tr.graph.inputs)}
        self.arrays = input_arrays(tr)
        # One Value several results hold (`h.data.reshape(-1)`, a reshape to its own
        # shape, is h's Value): its root is the result whose array the others' are
        # NumPy views of, in whichever order they come (h; a view of v would not be h).
        self.out_pos = {}
        for j, leaf in enumerate(leaves):
            if leaf[0] == "out" and leaf[2] in (VAR, ARR) and leaf[1] is not None:
                k = self.out_pos.setdefault(id(leaf[1]), j)
                if _views_into(raw[k], raw[j]):
                    self.out_pos[id(leaf[1])] = j
        # A Value an in-place effect writes into a buffer from outside (`W += 1.0`; a
        # view taken after it is rebuilt on the updated value): that buffer, after the
        # effects.
        self.effect_pos, self.effect_arrays = {}, {}
        for e, (kind, target, v) in enumerate(tr.effects):
            buf = target._data if kind == "inplace" else target \
                if kind == "inplace_array" else None
            if isinstance(buf, np.ndarray):
                self.effect_pos.setdefault(id(v), e)
                self.effect_arrays[e] = buf.view(np.ndarray) \
                    if type(buf) is not np.ndarray else buf
        self.owned = _owned_buffers(tr, raw, leaves)
        # A Value `var.data = ...` stored, var rebound that once (its data then is it
        # from that effect on): the array it stored.
        once = {}
        for e, (kind, var, _) in enumerate(tr.effects):
            if kind == "rebind":
                once[id(var)] = None if id(var) in once else e
        self.rebind_pos = {}
        for e in once.values():
            arr = tr.rebind_arrays.get(e) if e is not None else None
            if type(arr) is np.ndarray and tr.effects[e][1]._data is arr:
                self.rebind_pos.setdefault(id(tr.effects[e][2]), e)
        # A .grad from outside read as an input: its Variable (`x.grad.data` is that
        # array object itself).
        self.input_grads = {self.input_pos[id(v)]: g for g, v in tr.captured_vars.values()
                            if id(v) in self.input_pos and id(v) in _grad_inputs(tr)}
        self.made_inputs = {self.input_pos[id(v)]: a for a, v in tr.captured_arrays.values()
                            if id(v) in self.input_pos and _made_in_call(tr, a)
                            and _copy_keeps_layout(a)}

    def candidates(self, v, i, before=None):
        """Every buffer Value v is the array of: (root, that array, its object or
        None), result leaf i's own excluded, of rebind effects only those before
        effect `before` (None: after all effects)."""
        cands = []
        e = self.rebind_pos.get(id(v))
        if e is not None and (before is None or e < before):
            # (Its object: the Variable whose .data it stored, `W.data = x.grad.data`.)
            # (Or the traced array it stored, a computed one: `W.data = a; return a`.)
            owner = self.tr.rebind_owners.get(e)
            cands.append((("rebind", e), self.tr.rebind_arrays[e],
                          owner if owner is not None else self.tr.rebind_tracers.get(e)))
        j = self.out_pos.get(id(v))
        if j is not None and j != i:
            cands.append((("leaf", j), _plain(self.raw[j]), None))
        cands += self.owned.get(id(v), [])
        e = self.effect_pos.get(id(v))
        if e is not None:
            cands.append((("effect", e), self.effect_arrays[e], None))
        r = self.input_pos.get(id(v))
        if r is not None:
            # An array the function made (a seed nothing else holds, np.ones(3)): eager
            # makes it anew every call; the runner copies the graph's.
            cands.append((("input", r), self.arrays[r], self.input_grads.get(r))
                         if r in self.arrays else
                         (("copy", r), self.made_inputs.get(r), None))
        return cands

    def view_of(self, arr, data, v, i=None, before=None):
        """(root, steps) rebuilding arr, the traced array `data` of Value v (result leaf
        i's, or rebind effect `before`'s), on a buffer it is a view of, or None."""
        steps = []
        while True:
            # Every buffer this value is the array of, tried in turn: the one the
            # traced array is exactly a view of (same memory, same strides) is its root.
            cands = [c for c in self.candidates(v, i, before) if c[1] is not None]
            for root, base, obj in cands if not steps else ():
                if data is base or obj is not None and (data is obj or (
                        getattr(data, "_owner", None) is obj and _same_array(arr, base))):
                    return root, ()     # that array object itself: `x.grad.data`
            for root, base, obj in cands:
                # No op between (a reshape to its own shape, elided): a new view of
                # the buffer, as NumPy's reshape gives.
                replay = tuple(reversed(steps)) or (_new_view,)
                # (A copy here, a reshape of a non-contiguous buffer, is rebuilt too: the
                # same shape with other strides can reshape without a copy (x[::2] of a
                # longer buffer, (2, 4) with strides (64, 16)), and eager then returns a
                # view of it; where the replay copies, the runner keeps the graph's value.)
                if _replays(base, replay, arr) or _replays_as_copy(base, replay, arr):
                    return root, replay
            n = self.producer.get(id(v))
            if n is None or n.kind != MOVEMENT or len(n.inputs) != 1:
                # A view of a value no result holds (`h.data.T`, F.reshape(h) with h
                # not returned): the variant returns the value too and replays the
                # view on it, so that it has eager's layout and views of one value
                # alias each other, as eager's views of h do.
                owner = self.tr.owner.get(id(v))
                if steps and isinstance(owner, Variable) and owner._tv is v and \
                        n is not None and _plain(owner) is not None and \
                        _replays(_plain(owner), tuple(reversed(steps)), arr):
                    return ("value", v), tuple(reversed(steps))
                return None
            steps.append(_view_step(n))
            v = n.inputs[0]

    def overlaps_outside(self, arr):
        """Does arr share memory with a buffer from outside the call or one a compiled
        call hands back by identity?"""
        return any(_overlaps(arr, base) for base in list(self.arrays.values())
                   + list(self.effect_arrays.values())
                   + [base for c in self.owned.values() for _, base, _ in c]
                   + list(self.made_inputs.values()))


def _views_into(x, y):
    """Is result leaf x's array a NumPy view taken of result leaf y's (y's array down
    its chain of bases)?"""
    a, b = (z._data if isinstance(z, Variable) else z for z in (x, y))
    if a is b or not isinstance(b, np.ndarray):
        return False
    while isinstance(a, np.ndarray):
        a = np.ndarray.base.__get__(a)    # (not the tracer's .base, a user's read)
        if a is b:
            return True
    return False


def _owned_buffers(tr, raw, leaves):
    """id(Value) -> [(root, the array the traced call holds, its object)] for the buffers
    a compiled call hands back by identity that are neither inputs, effects nor computed
    results (result_views' "grad", "madegrad" and made "leaf" roots). A .grad that is
    itself a result is that result's leaf; a result's .grad that a grad effect sets is
    that effect's."""
    owned = {}
    results = {id(x) for x, leaf in zip(raw, leaves) if leaf[0] == "out"}

    def add(g, root, data=None):
        # data: the array the traced views were taken of (g's, unless replaced by a copy)
        tv = g._tv
        base = _plain(g) if data is None else _plain(data)
        if tv is None or not tr.is_mine(tv) or base is None:
            return
        # (The object `.data` gives is the array itself: a tracer of it names g.)
        owned.setdefault(id(tv), []).append((root, base, g))
    set_by_effect = set()
    for gi, var in enumerate(tr.grad_writes.values()):
        g = var._grad
        if g is None or id(g) in results:
            continue
        if id(g) not in set_by_effect:
            add(g, ("grad", gi))
        set_by_effect.add(id(g))
    made = [x for x, leaf in zip(raw, leaves) if leaf[0] == "out" and leaf[2] == VAR]
    for m, x in enumerate(made):
        g = x._grad
        if g is not None and id(g) not in results and id(g) not in set_by_effect:
            add(g, ("madegrad", m))
    for j, leaf in enumerate(leaves):
        if leaf[0] == "wrap" and leaf[1][0] == "constcopy":
            # `Variable(np.ones(3))` returned: a new copy every call (result_leaves gave
            # the traced one its copy already); its views were taken of the original.
            add(raw[j], ("leaf", j), leaf[1][1])
    return owned


def _copy_keeps_layout(a):
    """A copy of a in its own order has its strides: views replayed on it are laid out
    as eager's views of a new array of the function's are (not so for a slice of a
    bigger one, whose copy is compact)."""
    a = a.view(np.ndarray) if type(a) is not np.ndarray else a
    return a.copy(order="K").strides == a.strides


def _plain(x):
    """The plain ndarray of a result leaf (a Variable's data, a tracer as ndarray)."""
    d = x._data if isinstance(x, Variable) else x
    if not isinstance(d, np.ndarray) or getattr(d, "_numpy_scalar", False):
        return None      # (a result eager gives as a NumPy or Python scalar: no buffer)
    return d.view(np.ndarray) if type(d) is not np.ndarray else d


def _grad_inputs(tr):
    """ids of the graph inputs standing for a .grad from outside (an argument's or a
    captured Variable's, the caller's)."""
    return {id(v) for v, (kind, _) in tr.captures if kind == "grad"}


def input_arrays(tr):
    """Forward graph input index -> the array the traced call read for it, for the inputs
    whose buffer is the caller's (an argument's, a captured Variable's or array's, a
    .grad's the caller set): not an array the function made (np.ones(3), new every
    eager call)."""
    pos = {id(v): i for i, v in enumerate(tr.graph.inputs)}
    out = {}
    for var, v in tr.arg_vars.values():
        a = tr.read_arrays.get(id(v), var._data)
        if id(v) in pos and isinstance(a, np.ndarray):
            out[pos[id(v)]] = a
    for arr, v in tr.arg_arrays.values():
        if id(v) in pos and id(arr) in tr.arg_leaf:
            out[pos[id(v)]] = arr
    for v, (kind, obj) in tr.captures:
        if id(v) not in pos:
            continue
        # (A .grad the caller set, on an argument or a captured Variable: its array.)
        a = tr.read_arrays.get(id(v), obj._data if kind == "var" else None) \
            if kind in ("var", "grad") else None
        if isinstance(a, np.ndarray):
            out[pos[id(v)]] = a
        elif kind == "array" and not _made_in_call(tr, obj):
            out[pos[id(v)]] = obj
    return {i: (a.view(np.ndarray) if type(a) is not np.ndarray else a)
            for i, a in out.items()}


def _view_step(node):
    # x[key] with a basic key: NumPy's view (GetItem.forward copies, as F.get_item
    # does; `x.data[0:2]` is the same node, and the trace-time check tells them apart).
    key = node.fn.view_index(node) if hasattr(node.fn, "view_index") else None
    if key is not None:
        return _BasicIndex(key)
    return node.fn.forward


def _new_view(a):
    return a.view()


class _BasicIndex:
    __slots__ = ("key",)

    def __init__(self, key):
        self.key = key

    def __call__(self, a):
        return a[self.key]

    def __repr__(self):
        return f"[{self.key!r}]"


def replay_view(base, steps):
    """The view `steps` give of `base`, or None when NumPy gave a copy (a reshape of a
    non-contiguous argument: eager copies too, before the call's effects). No steps:
    base itself (the result is that array object)."""
    if not steps:
        return base
    y = base
    for step in steps:
        y = step(y)
    # (An empty result shares no memory, view or not; it is a new object all the same,
    # as eager's: two equal empty views x[..., 1:] of a size-1 axis are two objects.)
    if not isinstance(y, np.ndarray) or (y.size and not np.may_share_memory(y, base)):
        return None
    return y


def _replays(base, steps, arr):
    try:
        y = replay_view(base, steps)
    except Exception:  # noqa: BLE001 - not replayable: not a view we can rebuild
        return False
    return y is not None and _same_array(y.view(np.ndarray), arr)


def _replays_as_copy(base, steps, arr):
    """Do the view steps, replayed on `base`, give a copy holding what `arr` holds (a
    reshape NumPy answered with a copy at trace time)?"""
    try:
        y = base
        for step in steps:
            y = step(y)
    except Exception:  # noqa: BLE001 - not replayable
        return False
    return isinstance(y, np.ndarray) and not np.may_share_memory(y, base) and \
        y.shape == arr.shape and y.dtype == arr.dtype and \
        bool(np.array_equal(y, arr, equal_nan=arr.dtype.kind in "fc"))


def _overlaps(a, b):
    if not np.may_share_memory(a, b):
        return False
    try:
        return bool(np.shares_memory(a, b, max_work=10_000))
    except Exception:  # noqa: BLE001 - TooHardError: count it as shared
        return True
