"""Exported.save / tj.load: a self-contained file a process without the source runs.

The file is one .npz: "__graph__" holds the graph as JSON (format, version, symbols,
values with their symbolic shapes, ops by primitive name with their declared params,
inputs, outputs), the other entries the initializers and constants by name. Loading
rebuilds each op from tracejit.ops.primitive.PRIMITIVES (and the guard op, and NumPy
calls by their function's name in the numpy namespace) with its params, so nothing of
the user's code is needed; running instantiates the graph at
the sizes the inputs have and compiles it with the numba backend.
"""
import json
import zipfile

import numpy as np

from tracejit.exporting.exported import FORMAT_VERSION, Exported, ExportError
from tracejit.exporting.symbolic import Sym, substitute
from tracejit.ir import Graph, Lit, Node, Value

_MAGIC = "tracejit-export"
_GRAPH_KEY = "__graph__"


# ---------------------------------------------------------------- encoding

def _enc(x, what):
    from tracejit.ops.arrayops import _ArrayIndex, _MaskIndex, _Slice
    if isinstance(x, Sym):
        return {"sym": [x.coef, list(x.names)]}
    if x is None or isinstance(x, (bool, str)):
        return x
    if isinstance(x, _ArrayIndex):
        return {"aidx": int(x)}
    if isinstance(x, _MaskIndex):
        return {"midx": [int(e) for e in x]}
    if isinstance(x, (int, np.integer)) and not isinstance(x, np.bool_):
        return int(x)
    if isinstance(x, np.bool_):
        return bool(x)
    if isinstance(x, (float, np.floating)):
        return float(x)
    if x is Ellipsis:
        return {"ellipsis": True}
    if isinstance(x, _Slice):
        return {"slice": [_enc(e, what) for e in x]}
    if isinstance(x, tuple):
        return {"tuple": [_enc(e, what) for e in x]}
    raise ExportError(f"save: {what} has a parameter {x!r} that has no saved form")


# The NumPy functions a file may name besides ufuncs: pure array functions (no file,
# no memory mapping, no printing), so a loaded file can make its loader call nothing
# else. A ufunc's "at" (in place) is no saved method either.
_PURE_NUMPY = frozenset("""argmax argmin argsort sort cumsum cumprod diff around round
    clip where sum prod mean std var max min amax amin any all count_nonzero flip roll
    tile repeat concatenate stack hstack vstack dstack column_stack block searchsorted
    isclose allclose nan_to_num""".split())
_UFUNC_METHODS = (None, "__call__", "reduce", "accumulate", "outer", "reduceat")


def _numpy_function(name, method=None):
    # A NumPy call's function, saved by its name in the numpy namespace: a loading
    # process looks it up there, among pure functions only (no code of the file runs).
    f = getattr(np, name, None) if isinstance(name, str) and not name.startswith("_") \
        else None
    ok = isinstance(f, np.ufunc) and method in _UFUNC_METHODS or \
        name in _PURE_NUMPY and method in (None, "__call__") and callable(f)
    if not ok or getattr(f, "__name__", None) != name:
        raise ValueError(f"np.{name}{'.' + method if method else ''} is no NumPy function "
                         f"a tracejit file may call")
    return f


def _dec(x):
    from tracejit.ops.arrayops import _ArrayIndex, _MaskIndex, _Slice
    if isinstance(x, dict):
        if "numpy" in x:
            return _numpy_function(x["numpy"])
        if "sym" in x:
            return Sym(x["sym"][0], x["sym"][1])
        if "aidx" in x:
            return _ArrayIndex(x["aidx"])
        if "midx" in x:
            return _MaskIndex(tuple(x["midx"]))
        if "ellipsis" in x:
            return Ellipsis
        if "slice" in x:
            return _Slice(tuple(_dec(e) for e in x["slice"]))
        if "tuple" in x:
            return tuple(_dec(e) for e in x["tuple"])
        raise ValueError(f"unknown entry {x!r}")
    return x


def _op_class(name):
    """The op class a saved node names: a registered primitive, else one of the ops
    modules' classes that declares its params (the guard, the convolutions, which are
    not in the registry); never an opaque op (a NumPy call, a user Function: their
    params are Python objects)."""
    from tracejit.core import OPAQUE, Function
    from tracejit.ops import conv, trace_only
    from tracejit.ops.primitive import PRIMITIVES
    if name == "NumpyCall":
        return trace_only.NumpyCall       # its function by name (_numpy_params)
    if name == "AssignItem":
        # Opaque to the passes (kept in order), but pure: a copy with `a[key] = value`
        # done by NumPy, its key an index template of ints, slices and index slots.
        return trace_only.AssignItem
    cls = PRIMITIVES.get(name)
    if cls is None:
        for module in (trace_only, conv):
            c = getattr(module, name, None)
            if isinstance(c, type) and issubclass(c, Function) \
                    and c.__module__ == module.__name__ and not name.startswith("_") \
                    and getattr(c, "kind", OPAQUE) != OPAQUE:
                cls = c
    if cls is None:
        raise ValueError(f"op {name!r} is not a primitive of this tracejit")
    return cls


def _numpy_params(n, what):
    """A NumPy call the tracer kept (an argmax in accuracy()): saved as the name of a
    function of the numpy namespace, its ufunc method and its keyword arguments."""
    fn = n.fn
    name = getattr(fn.func, "__name__", None)
    try:
        if _numpy_function(name, fn.method) is not fn.func:
            raise ValueError(name)
    except ValueError:
        raise ExportError(f"save: {what} calls {name or fn.func!r}, which is no pure "
                          f"function of the numpy namespace (a ufunc, or one of "
                          f"saved._PURE_NUMPY): a file cannot hold it") from None
    params = [{"numpy": name}, fn.method,
              {"tuple": [{"tuple": [k, _enc(v, what)]} for k, v in fn.kwargs]},
              {"tuple": [{"tuple": [k, _enc(v, what)]} for k, v in fn.consts]}]
    if fn.seqs or fn.pick is not None:
        # Its list arguments' templates (np.concatenate([a, b])) and which of several
        # results it is (np.divmod); a file without them (every older one) has none.
        params += [_enc(fn.seqs, what), fn.pick]
    return params


def save(ex, path):
    # One document per traced path (export(paths=...)): the first is the file's own,
    # the others under "paths", their arrays named "a<k>:<name>".
    doc, arrays = _document(ex, "a:")
    more = []
    for k, p in enumerate((ex.paths or [])[1:], 1):
        d, a = _document(p, f"a{k}:")
        more.append(d)
        arrays.update(a)
    if more:
        doc["paths"] = more
    with open(path, "wb") as fh:
        np.savez(fh, **{_GRAPH_KEY: np.array(json.dumps(doc))}, **arrays)


def _document(ex, prefix):
    vid = {}
    values = []

    def val(v):
        if id(v) not in vid:
            vid[id(v)] = len(values)
            values.append({"shape": [_enc(d, "a shape") for d in ex.shape_of(v)],
                           "dtype": v.dtype.str})
        return vid[id(v)]

    def operand(n, i, x):
        if isinstance(x, Lit):
            return {"lit": _enc(ex.lit(n, i), "a literal"), "dtype": x.dtype.str}
        return {"v": val(x)}

    inputs = [{"v": val(v), "kind": k, "name": nm}
              for v, k, nm in zip(ex.inputs, ex.input_kinds, ex.input_names)]
    nodes = []
    for n in ex.nodes:
        what = f"op {n.name} ({n.line or 'no line'})"
        try:
            _op_class(n.op.__name__)      # only ops a loading process can rebuild
        except ValueError:
            raise ExportError(f"save: {what} is an op a loading process cannot "
                              f"rebuild (a user Function or a Python call the tracer "
                              f"kept as is): a file cannot hold it") from None
        if n.op.__name__ != "Guard" and getattr(n.op, "params", None) is None:
            raise ExportError(f"save: {what} declares no params")
        nodes.append({"op": n.op.__name__,
                      "params": _numpy_params(n, what) if n.op.__name__ == "NumpyCall"
                      else [_enc(p, what) for p in ex.node_params(n)],
                      "inputs": [operand(n, i, x) for i, x in enumerate(n.inputs)],
                      "outputs": [val(v) for v in n.outputs], "line": n.line})
    outputs = [({"lit": _enc(o.value, "an output"), "dtype": o.dtype.str}
                if isinstance(o, Lit) else {"v": val(o)}) for o in ex.outputs]
    version = 2 if "fill" in ex.input_kinds else 1       # (exported.FORMAT_VERSION)
    doc = {"format": _MAGIC, "version": version, "name": ex.name,
           "symbols": ex.symbols, "values": values, "inputs": inputs, "nodes": nodes,
           "outputs": outputs, "output_names": ex.output_names,
           "guards": [list(g) for g in ex.guards]}
    return doc, {f"{prefix}{k}": np.asarray(a) for k, a in ex.arrays.items()}


def load(path):
    """An Exported read from a file Exported.save wrote: call it on arrays (numba
    backend), or to_onnx() it. ValueError for a file that is not one, a truncated one,
    or one from a newer tracejit format."""
    try:
        with np.load(path, allow_pickle=False) as z:
            if _GRAPH_KEY not in z.files:
                raise ValueError(f"tj.load: {path} is not a tracejit export file")
            doc = json.loads(str(z[_GRAPH_KEY][()]))
            arrays = {k: z[k] for k in z.files if k != _GRAPH_KEY}
    except (zipfile.BadZipFile, EOFError, OSError, json.JSONDecodeError, KeyError) as e:
        if isinstance(e, FileNotFoundError):
            raise
        raise ValueError(f"tj.load: {path} is truncated or not a tracejit export file "
                         f"({type(e).__name__}: {e})") from None
    if not isinstance(doc, dict) or doc.get("format") != _MAGIC:
        raise ValueError(f"tj.load: {path} is not a tracejit export file")
    version = doc.get("version")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise ValueError(f"tj.load: {path} has format version {version}, newer than this "
                         f"tracejit reads ({FORMAT_VERSION}); upgrade tracejit")
    try:
        first = _rebuild(doc, _named(arrays, "a:"))
        if doc.get("paths"):
            first.paths = [first] + [_rebuild(d, _named(arrays, f"a{k}:"))
                                     for k, d in enumerate(doc["paths"], 1)]
        return first
    except (KeyError, IndexError, TypeError) as e:
        raise ValueError(f"tj.load: {path} is damaged ({type(e).__name__}: {e})") from None


def _named(arrays, prefix):
    return {k[len(prefix):]: a for k, a in arrays.items() if k.startswith(prefix)}


def _rebuild(doc, arrays):
    symbols = doc["symbols"]
    shapes = {}
    values = []
    for d in doc["values"]:
        dims = tuple(_dec(x) for x in d["shape"])
        v = Value(substitute(dims, symbols), np.dtype(d["dtype"]))
        if any(isinstance(x, Sym) for x in dims):
            shapes[id(v)] = dims
        values.append(v)
    params, lits, nodes = {}, {}, []
    for d in doc["nodes"]:
        cls = _op_class(d["op"])
        p = tuple(_dec(x) for x in d["params"])
        if d["op"] == "NumpyCall":
            _numpy_function(p[0].__name__, p[1])     # its method too
            p = p + ((), None)[len(p) - 4:]          # no seqs, pick saved: none
        ins, node_lits = [], {}
        for i, x in enumerate(d["inputs"]):
            if "v" in x:
                ins.append(values[x["v"]])
            else:
                lv = _dec(x["lit"])
                ins.append(Lit(substitute(lv, symbols), x["dtype"]))
                if isinstance(lv, Sym):
                    node_lits[i] = lv
        n = Node(cls(*substitute(p, symbols)), ins, [values[k] for k in d["outputs"]],
                 d.get("line"))
        if p != n.params:
            params[id(n)] = p
        for i, lv in node_lits.items():
            lits[(id(n), i)] = lv
        nodes.append(n)
    inputs = [values[x["v"]] for x in doc["inputs"]]
    missing = [x["name"] for x in doc["inputs"] if x["kind"] in ("init", "const", "fill")
               and x["name"] not in arrays]
    if missing:
        raise KeyError(f"arrays {missing} missing")
    outputs = [values[x["v"]] if "v" in x else Lit(_dec(x["lit"]), x["dtype"])
               for x in doc["outputs"]]
    return Exported(doc["name"], inputs, [x["kind"] for x in doc["inputs"]],
                    [x["name"] for x in doc["inputs"]], arrays, nodes, outputs,
                    doc["output_names"], shapes, params, lits, symbols,
                    [tuple(g) for g in doc.get("guards", [])])


# ---------------------------------------------------------------- running

def _bind(ex, arrays):
    """The symbols' sizes these input arrays give (ValueError if they do not fit)."""
    specs = ex.input_specs
    if len(arrays) != len(specs):
        raise TypeError(f"{ex.name}: takes {len(specs)} input(s) "
                        f"({', '.join(s['name'] for s in specs)}), got {len(arrays)}")
    sizes = {}
    out = []
    for a, s in zip(arrays, specs):
        a = np.asarray(a.data if hasattr(a, "creator") else a)
        want = "[" + ", ".join(str(d) for d in s["shape"]) + "]"
        bad = ValueError(f"{ex.name}: input {s['name']} must be {s['dtype'].name}{want}, "
                         f"got {a.dtype.name}{list(a.shape)}")
        if a.dtype != s["dtype"] or a.ndim != len(s["shape"]):
            raise bad
        for d, n in zip(s["shape"], a.shape):
            if isinstance(d, Sym) and len(d.names) == 1 and d.coef == 1:
                if sizes.setdefault(d.names[0], n) != n:
                    raise ValueError(f"{ex.name}: input {s['name']}: {d} is "
                                     f"{sizes[d.names[0]]} in another input, {n} here")
        out.append(a)
    for a, s in zip(out, specs):
        for d, n in zip(s["shape"], a.shape):
            want = d.value(sizes) if isinstance(d, Sym) and all(
                k in sizes for k in d.names) else d
            if isinstance(want, Sym) or want != n:
                raise ValueError(f"{ex.name}: input {s['name']} must be "
                                 f"{s['dtype'].name}{list(s['shape'])}, got "
                                 f"{a.dtype.name}{list(a.shape)}")
    return sizes, out


def instantiate(ex, sizes):
    """The concrete Graph of ex at these symbol sizes, and per graph input how a run
    gets its array: ("input", k), ("array", ndarray)."""
    vmap = {}

    def val(v):
        if isinstance(v, Lit):
            return v
        if id(v) not in vmap:
            vmap[id(v)] = Value(substitute(ex.shape_of(v), sizes), v.dtype)
        return vmap[id(v)]

    feeds, k = [], 0
    for v, kind, nm in zip(ex.inputs, ex.input_kinds, ex.input_names):
        val(v)
        if kind == "input":
            feeds.append(("input", k))
            k += 1
        elif kind == "range":
            feeds.append(("array", np.arange(substitute(ex.shape_of(v), sizes)[0],
                                             dtype=v.dtype)))
        elif kind == "fill":
            feeds.append(("array", np.full(substitute(ex.shape_of(v), sizes),
                                           ex.arrays[nm].reshape(-1)[0], v.dtype)))
        else:
            feeds.append(("array", ex.arrays[nm]))
    nodes = []
    for n in ex.nodes:
        fn = type(n.fn)(*substitute(ex.node_params(n), sizes))
        ins = []
        for i, x in enumerate(n.inputs):
            if isinstance(x, Lit):
                ins.append(Lit(substitute(ex.lit(n, i), sizes), x.dtype))
            else:
                ins.append(val(x))
        nodes.append(Node(fn, ins, [val(v) for v in n.outputs], n.line))
    g = Graph(ex.name, [val(v) for v in ex.inputs], nodes, [val(o) for o in ex.outputs],
              ex.input_names)
    return g, feeds


class PathMissed(ValueError):
    """The inputs fail a guard of the exported path."""


def run(ex, arrays):
    from tracejit.backends import numba as backend
    from tracejit.ops.trace_only import GuardFailure
    sizes, arrays = _bind(ex, arrays)
    key = tuple(sorted(sizes.items()))
    entry = ex._runners.get(key)
    if entry is None:
        g, feeds = instantiate(ex, {**ex.symbols, **sizes})
        entry = ex._runners[key] = (backend.compile(g), feeds)
    exe, feeds = entry
    ins = [arrays[x] if kind == "input" else x for kind, x in feeds]
    try:
        outs = exe(ins)
    except GuardFailure as e:
        text, line = ex.guards[e.index] if e.index < len(ex.guards) else ("?", None)
        raise PathMissed(f"{ex.name}: these inputs take another path than the exported "
                         f"one: guard {text} does not hold ({line})") from None
    return tuple(outs) if len(outs) != 1 else outs[0]
