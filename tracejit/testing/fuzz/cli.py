"""Differential fuzzing: random programs, jit vs eager (`python -m tracejit.testing.fuzz`).

    python -m tracejit.testing.fuzz --programs 500 --jobs 2 --seed 0 --timeout 60 --out fuzz-out

Hypothesis generates programs (tracejit/fuzz_gen.py: `strategies.source_programs()`);
worker processes run each one eagerly and through `tj.jit` and compare call by call
(tracejit/fuzz_harness.py). A program is classified as

  match     every call agrees and jit never warned
  fallback  every call agrees; jit ran some calls eagerly with a JitWarning (grouped by
            cause: the message with its variable parts stripped, one example kept)
  mismatch  a call silently differs (value, dtype, shape, kind, identity, gradient,
            second-order gradient, or the state left behind)
  crash     jit raised where eager did not, or raised another exception type
  hang      the program did not finish within --timeout seconds (its worker is killed)
  invalid   eager itself raises: not a jit bug (kept rare by construction)
  error     the harness itself failed (a fuzzer bug; should be 0)

Each failing program is written to --out as a standalone reproducer: the program,
then `check_file(__file__)`, which runs it both ways and prints the first difference.
Kernels are shared between workers through the disk cache (TRACEJIT_CACHE_DIR).
"""
import argparse
import multiprocessing as mp
import os
import re
import sys
import tempfile
import time
from collections import Counter
from multiprocessing.connection import wait

from tracejit.testing.fuzz.programs import AVOIDABLE, GENERATORS

__all__ = ["generate", "run_many", "normalize_warning", "summarize", "categories",
           "invalid_causes",
           "format_summary", "reproducer", "main", "AVOIDABLE"]

FAILING = ("mismatch", "crash", "hang", "error")
CLASSES = ("match", "fallback", "rounding", "mismatch", "crash", "hang", "invalid", "error")


def generate(n, seed=0, avoid=(), focus=None, generator="programs"):
    """n distinct programs from `source_programs(avoid=avoid, focus=focus)` (or another
    of programs.GENERATORS), deterministic for a seed."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hseed
    from tracejit.testing.fuzz.programs import GENERATORS
    source_programs = GENERATORS[generator]

    # One short hypothesis run per program: a long run's engine mutates the examples
    # it has seen, which gives bursts of near-identical programs. Each run's first
    # example is the simplest program, so the second one is taken.
    progs, seen = [], set()
    k = 0
    while len(progs) < n and k < 3 * n + 10:
        got = []

        @hseed(seed * 1_000_003 + k)
        @settings(max_examples=2, database=None, deadline=None, phases=[Phase.generate],
                  suppress_health_check=list(HealthCheck))
        @given(source_programs(avoid=avoid, focus=focus))
        def collect(p):
            got.append(p)

        collect()
        k += 1
        if got and got[-1].source not in seen:
            seen.add(got[-1].source)
            progs.append(got[-1])
    return progs


# ---------------------------------------------------------------- worker processes

def _worker(conn, scratch):
    """Runs programs sent over `conn` until it receives None."""
    import warnings
    warnings.simplefilter("ignore")     # the sides record JitWarnings themselves
    from tracejit.testing.fuzz.harness import run_program
    while True:
        msg = conn.recv()
        if msg is None:
            return
        idx, source, has32, plant = msg
        path = os.path.join(scratch, f"prog_{os.getpid()}_{idx}.py")

        def progress(what, idx=idx):
            conn.send(("progress", idx, what))
        try:
            res = run_program(source, path, has32, progress=progress, plant=plant)
        except BaseException as e:  # noqa: BLE001 - reported as a harness error
            import traceback
            res = dict(cls="error", detail="".join(traceback.format_exception(e))[-2000:],
                       warnings=[], cache_info=None, seconds=0.0)
        conn.send(("done", idx, res))


class _Slot:
    def __init__(self, ctx, scratch):
        self.ctx, self.scratch = ctx, scratch
        self.start()

    def start(self):
        self.conn, child = self.ctx.Pipe()
        self.proc = self.ctx.Process(target=_worker, args=(child, self.scratch), daemon=True)
        self.proc.start()
        child.close()
        self.idx, self.t0, self.last = None, None, None
        self.cpu0 = self.cpu_last = None
        self.runs = 0

    def retire(self):
        """Stop the worker between programs and start a fresh one."""
        try:
            self.conn.send(None)
        except OSError:
            pass
        self.proc.join(timeout=5)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()
        self.conn.close()
        self.start()

    def kill(self):
        self.proc.kill()
        self.proc.join()
        self.conn.close()


def _cpu_state(pid):
    """(CPU seconds used by process pid, its state letter), from /proc; (None, None)
    where there is no /proc."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _TICKS, fields[0]
    except (OSError, ValueError, IndexError):
        return None, None


_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _hung(s, timeout):
    """Is slot s's program a hang? Wall-clock time alone misjudges a worker starved by
    a loaded machine (a nice 19 deep run beside other work: a 3 s program took over
    120 s of wall time). So: hung when its worker used `timeout` seconds of CPU (a
    compile that runs away), or when `timeout` seconds of wall time have passed and it
    is neither runnable nor using CPU (sleeping, deadlocked). Without /proc: wall."""
    wall = time.monotonic() - s.t0
    if wall <= timeout:
        return False
    cpu, state = _cpu_state(s.proc.pid)
    if cpu is None or s.cpu0 is None:
        return True
    progressing = cpu > s.cpu_last + 0.01 or state == "R"
    s.cpu_last = cpu
    return cpu - s.cpu0 >= timeout or not progressing


# Programs a worker runs before it is replaced. Each program's kernels stay compiled in
# its worker (numba keeps every dispatcher it built): about 3 MB a program, so a worker
# that ran 4,000 programs of the 10,000-program deep run held 11.6 GB, and two of them
# exhausted the machine's memory.
RECYCLE = 200


def with_boundscheck():
    """Make the workers (spawned: they read os.environ as it is then) compile kernels
    with numba's bounds checks, into caches of their own (numba's cache does not key
    on the flag: a kernel cached without checks would be loaded). A kernel that writes
    past an array's end corrupted the heap silently, or crashed far from the write
    (fuzz program 9112: `munmap_chunk(): invalid pointer` in a later free); checked,
    it raises IndexError at the access, and the harness classes that a crash."""
    from tracejit.backends.numba.cache import cache_dir
    root = os.path.join(cache_dir(), "boundscheck")
    os.environ["NUMBA_BOUNDSCHECK"] = "1"
    os.environ["TRACEJIT_CACHE_DIR"] = os.path.join(root, "kernels")
    os.environ["NUMBA_CACHE_DIR"] = os.path.join(root, "numba")


def run_many(programs, jobs=1, timeout=60.0, plant=None, on_result=None, nice=0,
             recycle=RECYCLE):
    """Run programs in `jobs` worker processes; a list of result dicts in program order.

    A program is a SourceProgram or a tuple (source, has_float32[, plant]); `plant`
    (see fuzz_harness.PLANTS) is the fault planted in jit's results, for the fuzzer's
    own tests. A program still running after `timeout` seconds is a hang: its worker
    is killed and replaced."""
    ctx = mp.get_context("spawn")
    scratch = tempfile.mkdtemp(prefix="tracejit-fuzz-")
    items = [(p.source, p.has_float32, plant) if hasattr(p, "source")
             else (tuple(p) + (plant,))[:3] for p in programs]
    results = [None] * len(items)
    todo = list(range(len(items)))[::-1]
    if nice:
        os.nice(nice)           # the workers inherit it; the parent only waits
    slots = [_Slot(ctx, scratch) for _ in range(max(1, min(jobs, len(items))))]
    try:
        while todo or any(s.idx is not None for s in slots):
            for s in slots:
                if s.idx is None and todo:
                    s.idx = todo.pop()
                    s.t0, s.last = time.monotonic(), "sent"
                    s.cpu0 = s.cpu_last = _cpu_state(s.proc.pid)[0]
                    s.conn.send((s.idx,) + items[s.idx])
            busy = [s for s in slots if s.idx is not None]
            left = min(s.t0 + timeout - time.monotonic() for s in busy)
            # Past a timeout a program may still be running (starved, not hung): poll
            # once a second then, not in a busy loop.
            ready = wait([s.conn for s in busy], timeout=1.0 if left <= 0 else min(left, 1.0))
            for s in busy:
                if s.conn in ready:
                    try:
                        kind, idx, payload = s.conn.recv()
                    except (EOFError, OSError):
                        kind, idx, payload = "died", s.idx, None
                    if kind == "progress":
                        s.last = payload
                        continue
                    if kind == "died":
                        # Dying mid-program (a segfault in compiled code) is a crash;
                        # dying before its first call is the harness's own failure.
                        res = dict(cls="crash" if s.last != "sent" else "error",
                                   detail=f"the worker process died (exit "
                                   f"code {s.proc.exitcode}) during {s.last}",
                                   warnings=[], cache_info=None,
                                   seconds=time.monotonic() - s.t0)
                        s.kill()
                        idx = s.idx
                        s.start()
                    else:
                        res = payload
                        s.idx = None
                        s.runs += 1
                        if s.runs >= recycle:
                            s.retire()
                    results[idx] = res
                    if on_result:
                        on_result(idx, res)
                elif _hung(s, timeout):
                    res = dict(cls="hang", detail=f"no result after {timeout:g} s; it was "
                               f"running the {s.last}", warnings=[], cache_info=None,
                               seconds=timeout)
                    results[s.idx] = res
                    if on_result:
                        on_result(s.idx, res)
                    s.kill()
                    s.start()
    finally:
        for s in slots:
            try:
                s.conn.send(None)
            except OSError:
                pass
        for s in slots:
            s.proc.join(timeout=5)
            if s.proc.is_alive():
                s.kill()
    return results


# ---------------------------------------------------------------- reporting

_STRIP = [
    (re.compile(r"jit\([^)]*\)"), "jit(f)"),
    (re.compile(r" at \S+\.py:\d+.*$", re.S), " at LINE"),
    (re.compile(r"\S+\.py:\d+"), "FILE:LINE"),
    (re.compile(r"0x[0-9a-f]+"), "ADDR"),
    (re.compile(r"'[^']*'"), "'…'"),
    (re.compile(r" \((?=[^;]*eager )[^;]*\)(?=;| at LINE|$)"), " (…)"),  # which value, how
    (re.compile(r"\((?:\d+, )*\d*,?\)"), "SHAPE"),
    (re.compile(r"-?\d+(\.\d+)?(e-?\d+)?"), "N"),
]


def normalize_warning(message):
    """A JitWarning's cause: its message with names, lines, shapes and numbers stripped."""
    text = message.split("\n")[0]
    for pat, rep in _STRIP:
        text = pat.sub(rep, text)
    return text.strip()


def summarize(results):
    """Counts per class, and fallback causes {cause: (count, example warning)}."""
    counts = Counter(r["cls"] for r in results if r is not None)
    causes = {}
    for r in results:
        if r is None or r["cls"] != "fallback":
            continue
        for cause in sorted({normalize_warning(w) for w in r["warnings"]}):
            n, ex = causes.get(cause, (0, None))
            causes[cause] = (n + 1, ex or next(w for w in r["warnings"]
                                               if normalize_warning(w) == cause))
    return counts, causes


def invalid_causes(results):
    """Why eager rejected the invalid programs {cause: (count, first program, detail)}:
    each is a generator bug (a program eager cannot run tests nothing), so the summary
    names them, grouped like fallback causes."""
    causes = {}
    for i, r in enumerate(results):
        if r is None or r["cls"] != "invalid":
            continue
        detail = (r.get("detail") or "").split(": ", 1)[-1]     # without "call k"
        cause = normalize_warning(detail)
        n, first, ex = causes.get(cause, (0, i, r.get("detail") or ""))
        causes[cause] = (n + 1, first, ex)
    return causes


def categories(results):
    """Kinds of difference {category: (programs, first program index, its message)}."""
    cats = {}
    for i, r in enumerate(results):
        if r is None or r["cls"] not in ("mismatch", "crash"):
            continue
        for cat, msg in r.get("diffs", {}).items():
            if cat == "crash":
                cat = "crash: " + normalize_warning(msg.split(": ", 1)[-1])[:90]
            n, first, ex = cats.get(cat, (0, i, msg))
            cats[cat] = (n + 1, first, ex)
    return cats


def format_summary(results, seconds=None):
    counts, causes = summarize(results)
    n = sum(counts.values())
    lines = [f"{n} programs" + (f" in {seconds:.0f} s" if seconds is not None else "")]
    for c in CLASSES:
        k = counts.get(c, 0)
        lines.append(f"  {c:9s} {k:6d}  ({100 * k / max(n, 1):.1f}%)")
    never = sum(1 for r in results if r and r["cls"] == "match" and r["cache_info"]
                and r["cache_info"]["hits"] == 0)
    lines.append(f"  (matches whose compiled code never ran: {never})")
    cats = categories(results)
    if cats:
        lines.append("mismatches and crashes by kind of difference (programs; a program "
                     "may show several; first example):")
        for cat, (k, first, ex) in sorted(cats.items(), key=lambda kv: -kv[1][0]):
            lines.append(f"  {k:5d}  {cat}\n         e.g. program {first}: "
                         f"{ex.splitlines()[0][:240]}")
    if causes:
        lines.append("fallbacks by cause (programs; one warning each):")
        for cause, (k, ex) in sorted(causes.items(), key=lambda kv: -kv[1][0]):
            lines.append(f"  {k:5d}  {cause}\n         e.g. {ex[:300]}")
    invalid = invalid_causes(results)
    if invalid:
        lines.append("invalid programs by cause (programs; eager raises: a generator bug; "
                     "first example):")
        for cause, (k, first, ex) in sorted(invalid.items(), key=lambda kv: -kv[1][0]):
            lines.append(f"  {k:5d}  {cause}\n         e.g. program {first}: "
                         f"{ex.splitlines()[0][:240]}")
    return "\n".join(lines)


def reproducer(source, res):
    """A standalone file: the verdict as a comment, the program, the check."""
    detail = (res.get("detail") or "").rstrip()
    head = [f"# tracejit fuzzer: {res['cls']}"] + [f"#   {line}" for line in
                                                   detail.splitlines()[:12]]
    for cat, msg in list(res.get("diffs", {}).items())[1:]:
        head.append(f"#   also ({cat}): {msg.splitlines()[0][:200]}")
    for w in res.get("warnings", [])[:3]:
        head.append(f"#   JitWarning: {w.splitlines()[0][:200]}")
    head.append("# Run: python THIS_FILE  (jit vs eager, call by call; prints the first "
                "difference)")
    tail = ["", "", 'if __name__ == "__main__":',
            "    from tracejit.testing.fuzz.harness import check_file",
            "    check_file(__file__)", ""]
    return "\n".join(head) + "\n" + source + "\n".join(tail)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m tracejit.testing.fuzz", description=__doc__.split(
        "\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--programs", type=int, default=100)
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=60.0,
                    help="seconds per program: of CPU time, or of wall time while the worker "
                    "is neither runnable nor using CPU")
    ap.add_argument("--out", default=None, help="directory for failing programs")
    ap.add_argument("--nice", type=int, default=0, help="niceness added to the workers")
    ap.add_argument("--skip", type=int, default=0,
                    help="run programs SKIP.. of the --programs the seed generates (the "
                         "rest of a stopped run; numbered as in the whole run)")
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument("--no-boundscheck", dest="boundscheck", action="store_false",
                    help="compile the kernels without numba's bounds checks (by default "
                    "the workers set NUMBA_BOUNDSCHECK=1, with caches of their own, so an "
                    "access past an array's end is an IndexError the fuzzer reports as a "
                    "crash, where it was silent memory corruption)")
    ap.add_argument("--avoid", default="", help="comma-separated constructs to leave out, "
                    "to look past known bugs: " + "; ".join(
                        f"{k}: {v}" for k, v in sorted(AVOIDABLE.items())))
    ap.add_argument("--focus", default=None,
                    choices=["state", "nested_grad", "views", "rebound", "argument_views",
                             "unchain", "mixed_dtypes", "matmul", "conv", "made_leaves",
                             "scalar_dropout", "backward_into", "retain_grad", "c_state",
                             "hidden_state", "nesting", "rebind_alias", "input_leaves",
                             "grad_grads", "dropped_state", "replay_reads", "gate_sums",
                             "rounding", "numpy_calls", "rebind_inplace", "made_arrays",
                             "broadcast_views"],
                    help="draw mostly one family of statements: state (a .grad that is a "
                    "seed passed through, in-place updates of argument views and of "
                    "buffers before a backward, eval_shape of a function that writes); "
                    "nested_grad (grad, value_and_grad and grad of grad inside f); "
                    "views (results that are views of arguments, captures, other values); "
                    "nesting (results nested lists and tuples deep, up to and past "
                    "the depth compiled calls rebuild); "
                    "rebound (state a step rebinds on a captured holder across calls, "
                    "an RNN's h); "
                    "argument_views (intermediates that are views of arguments); "
                    "conv (conv2d + bias -> ReLU -> max pooling, other readers of each "
                    "value); "
                    "unchain (unchain_backward inside f reaching an argument with a creator); "
                    "mixed_dtypes (float32 results whose cotangents are float64, beside a "
                    "float64 state threaded between calls); "
                    "matmul (sums of products, products sharing an operand, recurrences, "
                    "length-1 contractions: what the matmul batching pass rewrites); "
                    "gate_sums (an LSTM's gate weight gradients, sum_t a_t^T @ g_it of "
                    "kernels' results: joined products, concatenations written in place); "
                    "made_leaves (Variables made in f, leaves of its graph, returned or "
                    "stored as state: their gradients); "
                    "input_leaves (Variables made in f of an argument's or a captured "
                    "Parameter's data, beside it; with --generator argument_updates the "
                    "caller rebinds the arguments before the backward); "
                    "scalar_dropout (0-d inputs and dropout masks); "
                    "grad_grads (a backward inside f through an argument's or a "
                    "captured Parameter's .grad: x.grad.grad; grad() and "
                    "value_and_grad() of a function closing over an argument with a "
                    "creator); "
                    "backward_into (a backward inside f going on into the "
                    "caller's graph through arguments with a creator); "
                    "retain_grad (earlier values returned beside the last, the caller's "
                    "backward with retain_grad=True: their .grad; a third with no "
                    "Variable argument); "
                    "dropped_state (a value stored as state, maybe with a .grad a "
                    "backward inside f retained, dropped or rebound by the caller, its "
                    ".grad changed first, before the caller's backward); "
                    "replay_reads (a value computed before an in-place update of the "
                    "buffer it reads, returned and read by a later op; the caller's "
                    "backward with retain_grad=True); "
                    "c_state (--generator deep_captures: a ContextVar's value or an "
                    "lru_cache'd function's result on every path, rebound or cleared "
                    "between calls); "
                    "hidden_state (--generator deep_captures: a set member's or class's "
                    "attribute, a ctypes field, a module's attribute or a long list's "
                    "item at a computed index on every path, changed between calls); "
                    "rebind_alias (a captured Parameter's .data or an ndarray stored as "
                    "state set to an existing buffer: x.data[::-1], x.grad.data); "
                    "rounding (round/math.floor/ceil/trunc/int/float/.item() of numbers "
                    "read from float, uint64 and uint32 data, halves and values past "
                    "int64 among them, used as operands, conditions and trip counts); "
                    "numpy_calls (NumPy calls with constant arguments on an input's data: "
                    "np.round(d, 1), d.clip(-0.75, 0.75), np.where(d > 0, d, 0.0), "
                    "round(d.max(), 2), constructors of traced numbers: np.array([d.mean(), "
                    "float(d.max())]), np.full(d.shape, float(m)); rarely an out= write "
                    "into an array made in f); "
                    "made_arrays (arrays f makes, np.zeros/np.empty/np.full, written "
                    "with an input's data by item assignment, np.copyto, fill() or +=, "
                    "a Variable of one before the write, a branch on one; item "
                    "assignment into a computed array and into an input's data); "
                    "broadcast_views (a captured Parameter with a size-1 axis read "
                    "through a view, W.T.T, a reshape there and back, W[..., ::-1], by "
                    "ops of a larger shape, with backwards inside f between the reads); "
                    "rebind_inplace (a user Function of an argument or a captured "
                    "Parameter that f updates in place, before or after it; the "
                    "default of --generator rebind_inplace)")
    ap.add_argument("--generator", default="programs", choices=sorted(GENERATORS),
                    help="programs: the general generator; argument_updates: its programs "
                    "with the caller changing the arguments between call and backward; "
                    "rebind_inplace: programs of focus rebind_inplace whose caller "
                    "rebinds (also to the other float dtype) or updates the arguments "
                    "and captured Parameters between call and backward")
    opts = ap.parse_args(argv)
    t0 = time.monotonic()
    avoid = [a for a in opts.avoid.split(",") if a]
    programs = generate(opts.programs, opts.seed, avoid, opts.focus, opts.generator)
    skip = max(0, min(opts.skip, len(programs)))
    if opts.out:
        os.makedirs(opts.out, exist_ok=True)
    done = [0]

    def on_result(idx, res):
        idx += skip
        done[0] += 1
        if not opts.quiet:
            print(f"[{done[0]}/{len(programs) - skip}] program {idx}: {res['cls']} "
                  f"({res['seconds']:.1f} s)"
                  + (f"  {res['detail'].splitlines()[0][:150]}" if res.get("detail") else ""),
                  flush=True)
        if opts.out and res["cls"] in FAILING + ("fallback", "rounding", "invalid"):
            sub = os.path.join(opts.out, res["cls"])
            os.makedirs(sub, exist_ok=True)
            with open(os.path.join(sub, f"prog{idx:05d}.py"), "w") as fh:
                fh.write(reproducer(programs[idx].source, res))

    if opts.boundscheck:
        with_boundscheck()
    results = run_many(programs[skip:], jobs=opts.jobs, timeout=opts.timeout,
                       on_result=on_result, nice=opts.nice)
    text = format_summary(results, time.monotonic() - t0)
    print(text)
    if opts.out:
        with open(os.path.join(opts.out, "summary.txt"), "w") as fh:
            fh.write(text + "\n")
        import json
        with open(os.path.join(opts.out, "results.json"), "w") as fh:
            json.dump([dict(r, program=i, features=programs[i].features)
                       for i, r in enumerate(results, skip)], fh, indent=1, default=str)
    counts, _ = summarize(results)
    return 1 if any(counts.get(c) for c in FAILING) else 0


if __name__ == "__main__":
    sys.exit(main())
