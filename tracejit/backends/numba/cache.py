"""Kernel caches: in-process by source (= graph structure), on disk content-addressed.

The last step of trace -> IR -> passes -> codegen: turning generated numba source into
a dispatcher. A kernel's source depends only on the structure of its fused group (ops,
parameters, dtypes, ranks, broadcasting pattern), never on sizes, so the source text is
the structural key. On disk each kernel is a real .py file named by
hash(source + numba/llvmlite versions + CPU), imported under its own module name
(registered in sys.modules before exec_module, or numba's cache fails to load in the
next process) and compiled with njit(cache=True). A truncated, corrupted or unwritable
entry is caught, ignored and rebuilt in memory: it never crashes a call and never
replays code for another source (the file's text is compared before importing).
"""
import hashlib
import importlib.util
import linecache
import os
import sys
import threading

import numba
import numpy as np

LOCK = threading.RLock()           # one compilation at a time: cold threads compile once
_KERNELS = {}                      # source -> dispatcher
STATS = {"kernels_built": 0, "disk_loads": 0, "disk_errors": 0}


def _pin_threading_layer():
    """Pin numba's threading layer: 'workqueue' aborts on concurrent parallel kernels.

    Returns True when parallel kernels may run from several threads at once; False
    means the caller serializes parallel kernel calls (PARALLEL_LOCK).
    """
    env = os.environ.get("NUMBA_THREADING_LAYER", "").lower()
    if env and env not in ("default", "workqueue", "safe", "threadsafe"):
        return True
    for layer, mod in (("omp", "omppool"), ("tbb", "tbbpool")):
        try:
            importlib.import_module("numba.np.ufunc." + mod)
        except Exception:  # noqa: BLE001 - layer not usable on this machine
            continue
        numba.config.THREADING_LAYER = layer
        return True
    return False


THREADSAFE_PARALLEL = _pin_threading_layer()

# LLVM's loop vectorizer gives up on a loop that needs more than 8 runtime checks that
# its arrays do not overlap ("too many memory checks needed"): a fused kernel that reads
# and writes many arrays (an LSTM cell's gates: 13 inputs, 12 outputs) ran scalar, 120
# us for 30 x 100 elements, 40 us vectorized. The checks run once per inner loop entry,
# so a few hundred of them cost less than one scalar pass. Process-wide LLVM options
# (numba has no per-function ones); they only let more loops vectorize, behind checks
# that keep overlapping arrays on the scalar path. Part of the disk cache's key.
LLVM_OPTIONS = ("-runtime-memory-check-threshold=1024", "-vectorize-memory-check-threshold=1024")


def _set_llvm_options():
    try:
        import llvmlite.binding as llvm
        for opt in LLVM_OPTIONS:
            llvm.set_option("tracejit", opt)
    except Exception:  # noqa: BLE001 - an LLVM without these options: defaults
        pass


_set_llvm_options()
PARALLEL_LOCK = threading.Lock()


def _noalias_option():
    """numba's `noalias` flag (LLVM's noalias on a function's pointer arguments) as an
    njit option: numba has the flag (its parfors set it) but no decorator option.

    Why: a loop kernel that writes several arrays otherwise vectorizes only behind
    runtime overlap checks of every written array against every other one, and LLVM
    emits the loop twice (checked vector and scalar). With noalias there are no checks:
    measured on the LSTM cell's kernel (13 inputs, 12 outputs), numba compile 0.77 s ->
    0.50 s of CPU, 5024 -> 2677 lines of machine code, the same vector loop.
    Sound for the loop kernels the plan calls: every array a kernel writes (its outputs,
    accumulators and epilogue results) is a fresh np.empty / np.zeros / np.full of the
    plan (plan._emit_group), so it overlaps nothing else passed; LLVM's noalias only
    constrains memory modified during the call, so inputs that alias each other (x and
    x.T, one array passed twice) are read correctly
    (tests/backends/numba/test_kernel_writes_fresh_arrays.py checks the plan side).
    False when this numba lacks the flag: kernels are then written without it."""
    try:
        from numba.core import compiler, cpu, options
        if not hasattr(compiler.Flags, "noalias"):
            return False
        if not hasattr(cpu.CPUTargetOptions, "noalias"):
            cpu.CPUTargetOptions.noalias = options.TargetOptions.Mapping("noalias")
        return True
    except Exception:  # noqa: BLE001 - another numba: no option, no flag
        return False


NOALIAS = _noalias_option()


def cache_dir():
    """TRACEJIT_CACHE_DIR, else the user cache directory (XDG) / tracejit."""
    d = os.environ.get("TRACEJIT_CACHE_DIR")
    if d:
        return d
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "tracejit")


def _fingerprint():
    import llvmlite
    try:
        cpu = numba.core.config.CPU_NAME or __import__("llvmlite.binding").binding \
            .get_host_cpu_name()
    except Exception:  # noqa: BLE001
        cpu = "unknown"
    # Kernels call tracejit.backends.numba.vecmath: numba's cache does not track that
    # dependency, so its source is part of every key.
    try:                                # read, not imported: it costs 0.1 s to import
        vm = importlib.util.find_spec("tracejit.backends.numba.vecmath").origin
        with open(vm, "rb") as f:
            vm_hash = hashlib.sha256(f.read()).hexdigest()[:16]
    except (OSError, TypeError, AttributeError):    # no source file: never reuse
        vm_hash = f"nosource-{os.getpid()}"
    return f"numba {numba.__version__} llvmlite {llvmlite.__version__} cpu {cpu} " \
           f"numpy {np.__version__} vecmath {vm_hash} llvm {' '.join(LLVM_OPTIONS)}"


FINGERPRINT = _fingerprint()


def kernel(source, name, disk=True):
    """The numba dispatcher `name` defined by `source` (built once per process)."""
    disp = _KERNELS.get(source)
    if disp is not None:
        return disp
    with LOCK:
        disp = _KERNELS.get(source)
        if disp is not None:
            return disp
        disp = None
        if disk:
            try:
                disp = _load_from_disk(source, name)
            except Exception:  # noqa: BLE001 - any cache trouble: build in memory
                STATS["disk_errors"] += 1
                disp = None
        if disp is None:
            disp = _build_in_memory(source, name)
        STATS["kernels_built"] += 1
        _KERNELS[source] = disp
        return disp


def _build_in_memory(source, name):
    digest = hashlib.sha256(source.encode()).hexdigest()[:16]
    filename = f"<tracejit-kernel-{digest}>"
    # Registered with linecache so numba's messages and tracebacks show these lines.
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    code = compile(source.replace("cache=True", "cache=False"), filename, "exec")
    ns = {"__name__": f"tracejit_kernel_{digest}"}
    exec(code, ns)
    return ns[name]


def _load_from_disk(source, name):
    digest = hashlib.sha256((source + FINGERPRINT).encode()).hexdigest()[:24]
    d = cache_dir()
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, f"tj_{digest}.py")
    try:
        with open(path, encoding="utf-8") as f:
            ok = f.read() == source
    except OSError:
        ok = False
    if not ok:
        # Stale or truncated (or absent): write atomically, then import. numba keys its
        # own index on the file's stamp, so a rewritten file invalidates old entries.
        tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(source)
        os.replace(tmp, path)
    modname = f"_tracejit_kernels_{digest}"
    mod = sys.modules.get(modname)
    if mod is None:
        spec = importlib.util.spec_from_file_location(modname, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[modname] = mod          # before exec_module: see the module docstring
        try:
            spec.loader.exec_module(mod)
        except Exception:
            sys.modules.pop(modname, None)
            raise
    disp = getattr(mod, name)
    _guard_disk_cache(disp)
    STATS["disk_loads"] += 1
    return disp


def _guard_disk_cache(disp):
    """Make numba's cache load/save never raise: a bad entry is a miss, then rebuilt."""
    cache = getattr(disp, "_cache", None)
    if cache is None or getattr(cache, "_tracejit_guarded", False):
        return
    load, save = cache.load_overload, cache.save_overload

    def load_overload(sig, target_context):
        try:
            return load(sig, target_context)
        except Exception:  # noqa: BLE001 - truncated / corrupted entry
            STATS["disk_errors"] += 1
            try:
                cache.flush()       # a fresh, empty index: the rebuilt entry is saved
            except Exception:  # noqa: BLE001
                pass
            return None

    def save_overload(sig, data):
        try:
            save(sig, data)
        except Exception:  # noqa: BLE001 - unwritable cache dir
            STATS["disk_errors"] += 1

    cache.load_overload = load_overload
    cache.save_overload = save_overload
    cache._tracejit_guarded = True


def compiled_signatures():
    """Total numba compilations (type signatures) across all kernels of this process."""
    return sum(len(d.signatures) for d in list(_KERNELS.values()))
