"""C code reading traced data through the buffer protocol, seen while a trace runs.

On Python 3.11 an ndarray subclass cannot intercept the buffer protocol: C code that
reads a buffer (`struct.unpack_from(fmt, x.data)`, `zlib.crc32(x.data)`) gets the traced
call's bytes, and what it computes from them is frozen into the graph. While the user's
function runs in a trace, a profile hook (sys.setprofile: this thread only, chained to
a Python-level profile function already set, restored after) sees every call of a C
function from Python code. A call of a known buffer reader from the user's code makes
the trace an escape naming the line: the variant runs eagerly, with a warning.

The hook sees which C function is called, not its arguments: a call of a reader on
bytes that are not traced data runs eagerly too (a false fallback, never a wrong
answer). Calls of types (memoryview, bytes, bytearray, array.array) are no C-function
calls the hook sees: called by their builtin names (or a local alias `mv = memoryview`)
they are intercepted by trace.record; bound to another name outside the function (a
module-level `MV = memoryview`, `from array import array`), they are an escape when the
function can reach them (reachable_buffer_types). While a C-level profiler is active
(cProfile), which a Python hook cannot chain to, the hook is not installed: module
functions are still seen by their wrappers, and a C method that may read a buffer is
found from what the function reaches instead (method_reader_without_hook: a reader
object in its state or arguments, or a reader method called on an object of a module
that makes them); that trace is an escape. Nothing is added to the normal path.
"""
import array
import binascii
import hashlib
import os
import struct
import sys
import threading
import types
import zlib

import numpy as np

from tracejit import core
from tracejit.trace.pystate import probe
from tracejit.trace.values import is_internal


def _builtin_functions(module, names):
    """(C function, the name it has in module) for those of names that are ones."""
    out = []
    for name in names:
        f = getattr(module, name, None)
        if type(f).__name__ == "builtin_function_or_method":
            out.append((f, name))
    return out


# C functions whose purpose is reading a buffer, by the name the user knows them by:
# module functions are one object each (their identity is the test).
_READER_FUNCTIONS = {}
for _mod, _names in ((struct, ("unpack", "unpack_from", "iter_unpack")),
                     (zlib, ("crc32", "adler32", "compress", "decompress")),
                     (binascii, [n for n in dir(binascii) if not n.startswith("_")]),
                     (hashlib, sorted(hashlib.algorithms_guaranteed) + ["new"])):
    for _f, _n in _builtin_functions(_mod, _names):
        _READER_FUNCTIONS[id(_f)] = (_f, f"{_mod.__name__}.{_n}")
_READER_FUNCTIONS[id(np.frombuffer)] = (np.frombuffer, "np.frombuffer")
try:
    import _hashlib           # hashlib.new(name, data) calls it from hashlib.py
    _READER_FUNCTIONS[id(_hashlib.new)] = (_hashlib.new, "hashlib.new")
except (ImportError, AttributeError):
    pass
# Bound C methods (a new object per access): (name, type of their object).
_READER_METHODS = {
    "unpack": (struct.Struct,), "unpack_from": (struct.Struct,),
    "iter_unpack": (struct.Struct,),
    "update": tuple({type(hashlib.new(n)) for n in ("md5", "sha1", "sha256")}),
    "compress": (type(zlib.compressobj()),), "decompress": (type(zlib.decompressobj()),),
    "frombytes": (array.array,), "from_bytes": (type,),
}
# Types that read a buffer when called: seen by name (trace.record), or reachable under
# another name (reachable_buffer_types).
BUFFER_TYPES = (memoryview, bytes, bytearray, array.array)


def _reader(f):
    """The name of the buffer-reading C function f, or None."""
    entry = _READER_FUNCTIONS.get(id(f))
    if entry is not None and entry[0] is f:
        return entry[1]
    name = getattr(f, "__name__", None)
    kinds = _READER_METHODS.get(name)
    if kinds is not None:
        owner = getattr(f, "__self__", None)
        if name == "from_bytes":
            if owner is int:
                return "int.from_bytes"
        elif isinstance(owner, kinds):
            return f"{type(owner).__name__}.{name}"
    return None


_STDLIB = os.path.dirname(os.__file__) + os.sep


def _line_of(frame):
    """'file.py:12  source' of the innermost user frame at or above frame (past the
    standard library's: hashlib.new calls the reader for the user's line)."""
    from tracejit.trace.record import frame_line
    f = frame
    while f is not None and f.f_code.co_filename.startswith(_STDLIB):
        f = f.f_back
    return frame_line(f if f is not None else frame)


def _seen(frame, f):
    tr = core._state.trace
    if tr is None or getattr(tr, "abstract", False) or is_internal(frame):
        return
    name = _reader(f)
    if name is None:
        return
    module = frame.f_globals.get("__name__", "")
    if module.startswith(("numpy", "numba")):
        return          # NumPy's own Python code (np.frombuffer inside np.load ...)
    tr.escapes.append((f"{name}() called while tracing: C code that reads a buffer "
                       f"(traced data passed to it would be read past the tracer, its "
                       f"values frozen)", _line_of(frame)))


_IDS = frozenset(_READER_FUNCTIONS)
_NAMES = frozenset(_READER_METHODS)


def _hook(frame, event, arg):
    # Called for every call and return while the user's function traces: the common
    # case (not a reader) is one set lookup or two.
    if event == "c_call" and (id(arg) in _IDS or getattr(arg, "__name__", None) in _NAMES):
        _seen(frame, arg)


class _Chained:
    """The hook, then the profile function that was set (a Python callable)."""

    __slots__ = ("prev",)

    def __init__(self, prev):
        self.prev = prev

    def __call__(self, frame, event, arg):
        _hook(frame, event, arg)
        return self.prev(frame, event, arg)


# Modules whose functions read no buffer behind the tracer's back (NumPy's are traced).
_SAFE_MODULES = ("tracejit", "numpy", "math", "builtins", "random", "functools",
                 "itertools", "operator", "collections", "typing", "warnings", "copy",
                 "dataclasses", "enum", "abc", "numbers", "logging", "time")
# Names in the code that may lead to a reader: the readers' own, their modules'. (Not
# "update", "compress": an optimizer's update is no reader. An object with a reader
# method is found by its value instead: _READER_OBJECTS.)
_SUSPECT_NAMES = frozenset(_READER_METHODS) - {"update", "compress", "decompress"} | {
    n.split(".")[-1] for _, n in _READER_FUNCTIONS.values()} | {
    "struct", "zlib", "binascii", "hashlib", "_hashlib", "frombuffer", "array"}
_READER_OBJECTS = tuple({t for kinds in _READER_METHODS.values() for t in kinds} - {type})


def _safe(module_name):
    return (module_name or "").split(".")[0] in _SAFE_MODULES


def may_read_buffers(funcs, locs=()):
    """Could the user functions a trace runs call a buffer-reading C function? They name
    one (or its module), reach an object with a reader method (a Struct, a hash object)
    or a module or function outside the safe ones (a third party's code may read a
    buffer). No: the hook, which costs about a third of the trace's time, is not
    installed."""
    from tracejit.trace.record import _code_names, _is_user_module
    for loc in locs:
        try:
            if isinstance(loc.read(), _READER_OBJECTS):
                return True
        except Exception:  # noqa: BLE001 - a location that cannot be read: not one
            continue
    for f in funcs:
        code = probe(f, "__code__")
        if code is None:
            return True
        names = _code_names(code)
        if not names.isdisjoint(_SUSPECT_NAMES):
            return True
        glb = probe(f, "__globals__") or {}
        for n in names:
            v = glb.get(n)
            if v is None or isinstance(v, (int, float, str, bool, np.ndarray, type)):
                continue
            mod = v.__name__ if isinstance(v, types.ModuleType) else \
                probe(v, "__module__")
            if (callable(v) or isinstance(v, types.ModuleType)) and not _safe(mod) and \
                    not _is_user_module(sys.modules.get(mod)):
                # (The user's own functions and objects are among funcs: scanned.)
                return True
    return False


def _module_reader(f, label):
    """A reader module function as the traced code calls it (`struct.unpack_from`, the
    module's attribute while a trace runs): it sees the arguments, so only traced data
    passed to it is an escape (`struct.unpack("d", struct.pack("d", m))` compiles).
    Other threads' calls, and calls outside a trace, pass straight through."""
    def call(*args, **kwargs):
        tr = core._state.trace
        if tr is not None and not getattr(tr, "abstract", False):
            from tracejit.trace.values import TracedArray
            if any(type(a) is TracedArray and a._trace is tr
                   for a in list(args) + list(kwargs.values())):
                tr.escapes.append((f"{label}() of traced data (its buffer, read outside "
                                   f"the tracer)", _line_of(sys._getframe(1))))
        return f(*args, **kwargs)
    call.__name__ = call.__qualname__ = f.__name__
    call.__wrapped__ = f
    return call


_MODULES = {"struct": struct, "zlib": zlib, "binascii": binascii, "hashlib": hashlib}
_SWAPS = [(_MODULES[label.split(".")[0]], label.split(".")[1], f, _module_reader(f, label))
          for f, label in _READER_FUNCTIONS.values() if label.split(".")[0] in _MODULES
          and getattr(_MODULES[label.split(".")[0]], label.split(".")[1], None) is f]
_swap_lock = threading.Lock()
_swap_users = 0


# Modules whose objects have reader methods (a Struct, a hash object, a compressor):
# code naming one of them and a reader method may read a buffer by a C method.
_METHOD_MODULES = frozenset({"struct", "Struct", "hashlib", "_hashlib", "zlib",
                             "compressobj", "decompressobj", "array"})


def method_reader_without_hook(funcs, locs=(), values=()):
    """Under a C-level profiler (cProfile), where the hook cannot run: (what, line) if
    the functions may call a buffer-reading C method, judged from what they reach, not
    from the calls they make: an object with a reader method among the captured state
    or the arguments (`PACK.unpack_from(x.data)` with PACK a module's struct.Struct), or
    code naming a reader method and a module that makes such objects
    (`hashlib.sha256().update(x.data)`). Else None. A false fallback while profiling,
    never a frozen value; `opt.update()` alone names no such module and compiles."""
    from tracejit.trace.record import _code_names
    for obj in [loc.read() for loc in locs if _readable(loc)] + list(values):
        if isinstance(obj, _READER_OBJECTS):
            return f"a {type(obj).__name__} (its reader methods)", None
    for f in funcs or ():
        code = getattr(f, "__code__", None)
        if code is None:
            continue
        names = _code_names(code)
        methods = _method_calls(code, f)
        if methods and not names.isdisjoint(_METHOD_MODULES):
            import linecache
            line = (f"{code.co_filename}:{code.co_firstlineno}  "
                    f"{linecache.getline(code.co_filename, code.co_firstlineno).strip()}")
            mods = "/".join(sorted(names & _METHOD_MODULES))
            return f"{', '.join(sorted(methods))} of a {mods} object", line
    return None


def _method_calls(code, f):
    """The reader method names the code loads from an object other than a module the
    swaps cover (`PACK.unpack_from`, `h.update`; not `struct.unpack_from`, whose
    wrapper sees its arguments), nested functions' code included."""
    import dis
    glb = getattr(f, "__globals__", {})
    out, stack = set(), [code]
    while stack:
        c = stack.pop()
        stack += [k for k in c.co_consts if isinstance(k, types.CodeType)]
        prev = None
        for ins in dis.get_instructions(c):
            if ins.opname in ("LOAD_ATTR", "LOAD_METHOD") and ins.argval in _READER_METHODS \
                    and ins.argval != "from_bytes":
                on_module = prev is not None and prev.opname in ("LOAD_GLOBAL", "LOAD_NAME") \
                    and glb.get(prev.argval) in _MODULES.values()
                if not on_module:
                    out.add(ins.argval)
            prev = ins
    return out


def _readable(loc):
    try:
        loc.read()
        return True
    except Exception:  # noqa: BLE001 - a location that cannot be read: nothing there
        return False


def install(funcs=None, locs=(), values=()):
    """Start seeing buffer readers in this thread (if the functions the trace runs may
    call one: may_read_buffers); returns the token for uninstall. values: the call's
    arguments (under a C-level profiler an argument may be a reader object)."""
    global _swap_users
    if funcs is not None and not may_read_buffers(funcs, locs):
        return (False, None, False)
    with _swap_lock:
        if _swap_users == 0:
            for mod, name, _, wrapper in _SWAPS:
                setattr(mod, name, wrapper)
        _swap_users += 1
    prev = sys.getprofile()
    if prev is None:
        sys.setprofile(_hook)
        return (True, None, True)
    if prev is _hook or isinstance(prev, _Chained) or not callable(prev):
        # A trace inside a trace: the outer hook sees it. A C-level profiler (cProfile)
        # cannot be chained: the module functions' wrappers still see their calls, and
        # a C method that may read a buffer, found from what the function reaches, is
        # an escape (the hook would have seen the call; nothing sees it now).
        if not callable(prev) and funcs is not None:
            found = method_reader_without_hook(funcs, locs, values)
            tr = core._state.trace
            if found is not None and tr is not None:
                what, line = found
                tr.escapes.append((f"{what} may read traced data past the tracer, and "
                                   f"with a C-level profiler (cProfile) active such a "
                                   f"call cannot be seen", line))
        return (False, None, True)
    sys.setprofile(_Chained(prev))
    return (True, prev, True)


def uninstall(token):
    global _swap_users
    installed, prev, swapped = token
    if installed:
        sys.setprofile(prev)
    if swapped:
        with _swap_lock:
            _swap_users -= 1
            if _swap_users == 0:
                for mod, name, f, _ in _SWAPS:
                    setattr(mod, name, f)


def reachable_buffer_types(locs):
    """(label, type) of the buffer-reading types the function reaches under another
    name than the builtin one (`MV = memoryview` at module level, `from array import
    array`): calls of them are not seen."""
    out = []
    for loc in locs:
        try:
            val = loc.read()
        except Exception:  # noqa: BLE001 - a location that cannot be read: not one
            continue
        for t in BUFFER_TYPES:
            if val is t and not (t is not array.array and loc.label == t.__name__):
                out.append((loc.label, t))
    return out
