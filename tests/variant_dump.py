"""A test-only hook: TRACEJIT_DUMP_VARIANTS=<dir> writes, for every test, what the JIT
generated while it ran (optimized graphs, plans, kernels, runners, backward code,
signature and state checks), one file per test.

Why: a restructuring that promises "behaviour unchanged" is checked by dumping before and
after and diffing the two directories. Each file lists the unique texts sorted, so thread
scheduling inside a test does not reorder them.
"""
import builtins
import os
import re
from collections import defaultdict

_RECORDED = defaultdict(set)


def _record(kind, text):
    _RECORDED[kind].add(text)


def _wrap_compile(real):
    def compile(source, filename, mode, *args, **kwargs):   # noqa: A001 - shadows on purpose
        if isinstance(source, str) and str(filename).startswith("<tracejit"):
            kind = str(filename).strip("<>").split(" ")[0]
            _record(kind, source)
        return real(source, filename, mode, *args, **kwargs)
    return compile


def install():
    """Patch the points where generated code and optimized graphs come into being."""
    import importlib
    targets = os.environ.get(
        "TRACEJIT_DUMP_TARGETS",
        "tracejit.runtime.variant,tracejit.trace.pystate,tracejit.runtime.signature")
    for mod_name in targets.split(","):
        mod = importlib.import_module(mod_name)
        mod.compile = _wrap_compile(builtins.compile)
    codegen = importlib.import_module(os.environ.get("TRACEJIT_DUMP_CODEGEN",
                                                     "tracejit.backends.numba.plan"))
    real_source = codegen.compile_source

    def compile_source(source, filename):
        _record("plan", source)
        return real_source(source, filename)
    codegen.compile_source = compile_source

    cache = importlib.import_module(os.environ.get("TRACEJIT_DUMP_KERNELS",
                                                   "tracejit.backends.numba.cache"))
    real_kernel = cache.kernel

    def kernel(source, name, *args, **kwargs):
        _record("kernel", source)
        return real_kernel(source, name, *args, **kwargs)
    cache.kernel = kernel

    passes = importlib.import_module(os.environ.get("TRACEJIT_DUMP_PASSES",
                                                    "tracejit.passes"))
    real_pipeline = passes.run_pipeline

    def run_pipeline(g, *args, **kwargs):
        out = real_pipeline(g, *args, **kwargs)
        _record("graph", str(out))
        return out
    passes.run_pipeline = run_pipeline
    # passes.optimize (the JIT's call, before any backend) calls the pipeline module's
    # own name: patched too.
    pipeline = getattr(passes, "pipeline", None)
    if getattr(pipeline, "run_pipeline", None) is real_pipeline:
        pipeline.run_pipeline = run_pipeline


def write(directory, nodeid):
    if not _RECORDED:
        return
    os.makedirs(directory, exist_ok=True)
    name = re.sub(r"[^\w.\-]+", "_", nodeid)[:200]
    with open(os.path.join(directory, name + ".txt"), "w", encoding="utf-8") as f:
        for kind in sorted(_RECORDED):
            for text in sorted(_RECORDED[kind]):
                f.write(f"==== {kind}\n{text}\n")
    _RECORDED.clear()
