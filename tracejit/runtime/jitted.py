"""tracejit.runtime.jitted: the decorator, its variant cache, and the compiled call.

The path of one call: the arguments give a signature key (shapes, dtypes, static
values, grad mode). Under that key sit the variants traced so far, one per sequence
of guard outcomes. A variant runs its graph; the first guard that fails names the
outcome seen, which leads to the variant traced for that outcome, or to a new trace
(a real call that records). Outputs are Variables whose one creator, a
CompiledFunction, runs the compiled backward graph.
"""
import contextlib
import functools
import itertools
import linecache
import logging
import os
import random
import re
import sysconfig
import threading
import time
import warnings

import numpy as np

from tracejit import core
from tracejit.trace import pystate
from tracejit.trace import record as tracing
from tracejit.trace.abstract import _set_stream_state, _stream_state   # random streams
from tracejit.trace.call import trace_call
from tracejit.runtime.checking import (NOISE_RUNS, NOREF, LiveState, Soft,
                                       copy_caller_graph, first_difference, float32_noise,
                                       gradient_difference, identity_difference,
                                       result_objects,
                                       leaves_with_paths, low_precision_involved,
                                       twin_copy, walks_into_caller, with_noise,
                                       layout_copy)
from tracejit.core import Config, NoDataError, Parameter, Variable
from tracejit.trace.pytree import (ARR, FLT, MAX_DEPTH, STATIC, VAR, NestedTooDeep,
                                   _Identity, flatten_args, leaf_key, unflatten)
from tracejit.runtime.signature import PAR, alias_pattern, key_change, key_distance
from tracejit.ops.trace_only import GuardFailure
from tracejit.runtime.variant import (MISS, SLOW, InplaceAlias, JitWarning, Stale, Variant,
                              WalkReadMismatch, compile_graph)

log = logging.getLogger("tracejit")


_ENVIRON = getattr(os.environ, "_data", None)


_ENV_KEY = os.environ.encodekey("TRACEJIT_DISABLE") if hasattr(os.environ, "encodekey") \
    else "TRACEJIT_DISABLE"


# The per-call test of TRACEJIT_DISABLE: os.environ's backing dict, one lookup.
_env_get = _ENVIRON.get if _ENVIRON is not None else (lambda key: "?")
_state = core._state


def _env_disabled():
    # Read at every call, cheaply: os.environ's backing dict, not os.environ.get.
    if _ENVIRON is not None:
        v = _ENVIRON.get(_ENV_KEY)
        return v is not None and v in (b"1", "1")
    return os.environ.get("TRACEJIT_DISABLE") == "1"


def jit_disabled():
    return _state.jit_off or _env_disabled()


class disable_jit:
    """`with tj.disable_jit():` runs every jitted function as plain Python (pdb, print)."""

    def __enter__(self):
        self.prev = _state.jit_off
        _state.jit_off = True
        _state.refresh_mode()

    def __exit__(self, *exc):
        _state.jit_off = self.prev
        _state.refresh_mode()


# ------------------------------------------------------------------ argument trees


_RETRACE = object()
# cache_info()'s counters besides calls (README, Debugging): hits + misses + fallbacks
# == calls; the others count events, not calls.
_COUNTED = ("hits", "misses", "fallbacks", "traces", "retraces", "guard_failures")


def _read(counter):
    # An itertools.count's next value, without taking it: its repr is "count(n)".
    return int(repr(counter)[6:-1])


class Jitted:
    """The callable `tj.jit(f)` returns."""

    # Read by trace.pystate, which follows a nested jit into its function.
    _tracejit_jitted = True

    def __init__(self, fn, static_argnums=(), static_argnames=(), max_variants=8,
                 backend="auto", parallel=None, cache=True, check=None, name=None):
        self.fn = fn
        self.__wrapped__ = fn
        # (pystate.probe: a callable object's own __getattr__ may raise KeyError.)
        fname = pystate.probe(fn, "__name__")
        self.__name__ = name or (fname if isinstance(fname, str) else "f")
        self.__doc__ = pystate.probe(fn, "__doc__")
        if isinstance(static_argnums, int):
            static_argnums = (static_argnums,)
        if isinstance(static_argnames, str):
            static_argnames = (static_argnames,)
        self.static_argnums = frozenset(static_argnums)
        self.static_argnames = frozenset(static_argnames)
        self.max_variants = max_variants
        self.backend = backend
        self.parallel = parallel
        self.cache = cache
        self.check = check if check is not None else os.environ.get("TRACEJIT_CHECK") == "1"
        self.lock = threading.RLock()
        self._version = 0            # bumped whenever the variants change (_changed)
        # The last signature's fast path: (hot runner, grad mode, key, variants,
        # variants[0]); None whenever the variants change.
        self._hot = None
        # Call counters: itertools.count, whose next() is one C call that cannot lose an
        # increment to another thread (a plain `self.n += 1` can), read back at
        # cache_info() time. The hot path pays one next(), as it paid one += before.
        self._n_hot = itertools.count()      # hits on the hot path (its only counter)
        self._n_calls = itertools.count()    # every other call (jit on, not nested)
        self._n = {k: itertools.count() for k in _COUNTED}

        self._variants = {}          # key -> list of Variant
        self._warm = _BoundedSet(_MAX_WARM)
        # Identity-keyed storms: the key with its identity-keyed objects replaced by
        # their classes -> its keys warmed up and not called again (_identity_storm).
        self._id_forms = _Forms(_MAX_WARM)
        # Static-value storms: the key with its static values replaced by their types ->
        # its keys warmed up and not traced yet, and -> the keys it traced (_static_storm).
        self._static_once = _Forms(_MAX_WARM, _static_form)
        self._static_traced = _Forms(_MAX_WARM, _static_form)
        self._eager_keys = {}        # key -> reason (fallback for good)
        # trace() after a fallback: key -> the line the fallback names, and, where a
        # variant was traced and then demoted by a check against eager, its graphs
        # (forward, backward or None): what trace() shows, marked as not run. Graphs
        # only, not the variant: no compiled code or live state kept alive for it.
        self._eager_lines = {}
        self._demoted = {}
        self._warned = set()
        self.stats = dict(trace_seconds=0.0, compile_seconds=0.0)   # under self.lock
        # State the function rebinds (`self.h = h` in an RNN layer), once a trace found
        # some: (locations, the Jitted of pystate.threaded(fn, locations)), which then
        # runs every call (_threaded_call). _threads_for: this one is that Jitted of
        # another (which it tells about more state by raising _Rethread; a flag, not a
        # reference: no cycle between the two).
        self._threading = None
        self._threads_for = False

    def __get__(self, obj, objtype=None):
        if obj is None:
            return self
        return BoundJitted(self.__call__, obj)

    # ---- public

    def eager(self, *args, **kwargs):
        return self.fn(*args, **kwargs)

    def _count(self, what):
        next(self._n[what])

    def cache_info(self):
        """The counters of README's Debugging section: calls == hits + misses + fallbacks,
        exactly (each call counts once, by where its result came from)."""
        hot = _read(self._n_hot)
        info = {k: _read(c) for k, c in self._n.items()}
        info["hits"] += hot
        info["calls"] = hot + _read(self._n_calls)
        info["variants"] = sum(map(len, list(self._variants.values())))
        info["eager_signatures"] = len(self._eager_keys)
        if self._threading is not None:
            inner = self._threading[1]
            info["variants"] += sum(map(len, list(inner._variants.values())))
            info["eager_signatures"] += len(inner._eager_keys)
        info.update(self.stats)
        return info

    def trace(self, *args, optimized=True, **kwargs):
        """The forward graph of the variant these arguments select: optimized (passes and
        fusion: what runs) or, optimized=False, as traced. Runs no effect of the function:
        the variant is chosen by running its graph's guards on these arguments (effects
        are replayed by the runner, not the graph), and a signature not traced yet is
        warmed up and traced with the state it touches put back afterwards (a debugging
        tool: other threads calling f meanwhile may see that state change and change
        back). Not a call: cache_info()'s calls do not count it."""
        v = self._variant_for(args, kwargs)
        if isinstance(v, _Demoted):
            return v.graph(0, optimized)
        g = v.forward_graph
        if optimized:
            g = getattr(v.exe, "graph", None) or _optimize(g)
        return _labelled(g, "forward, optimized" if optimized else "forward, as traced")

    def backward_graph(self, *args, optimized=True, **kwargs):
        """The backward graph of the variant these arguments select (as trace()), None
        when these arguments trace without one (no_grad, nothing differentiable)."""
        v = self._variant_for(args, kwargs)
        if isinstance(v, _Demoted):
            return v.graph(1, optimized)
        if not v.bwd:
            return None
        g = v.bwd.graph
        if optimized:
            g = getattr(v.backward_executable(), "graph", None) or _optimize(g)
        return _labelled(g, "backward, optimized" if optimized else "backward, as traced")

    def _variant_for(self, args, kwargs):
        if _state.trace is not None:
            raise RuntimeError(f"jit({self.__name__}).trace() inside a traced function")
        if self._threading is not None:
            return self._threaded_variant(args, kwargs)
        key, leaves = self._call_key(args, kwargs)
        v = self._select(key, leaves)
        found = None
        if v is None:
            with self.lock:
                put_back = _StatePutBack(self._reach(args, kwargs), leaves)
                try:
                    v = self._select(key, leaves)
                    if v is None and key not in self._eager_keys:
                        if key not in self._warm:
                            # The warm-up a first call makes: state created lazily (a
                            # Linear's W, an optimizer's buffers) exists before tracing.
                            self._warm.add(key)
                            with disable_jit(), warnings.catch_warnings():
                                warnings.simplefilter("ignore", JitWarning)
                                self.fn(*args, **kwargs)
                            if put_back.created_state():
                                # That state cannot be put back without undoing it: the
                                # warm-up stays, a real call (README, Debugging).
                                log.info("jit(%s).trace(): the warm-up created state; "
                                         "kept, as a call", self.__name__)
                                next(self._n_calls)
                                self._count("misses")
                            else:
                                put_back.restore()
                            put_back = _StatePutBack(self._reach(args, kwargs), leaves)
                        try:
                            self._trace_and_compile(key, args, kwargs)
                        except _TraceDiverged as td:
                            td.undo_walks()     # eager from now on: the RuntimeError below
                        except _StateFound as sf:
                            found = sf.locs
                            sf.undo_walks()
                        self._changed()
                        v = self._select(key, leaves)
                finally:
                    put_back.restore()
            if found:
                if self._threads_for:
                    raise _Rethread(found)
                self._add_state(found)
                return self._threaded_variant(args, kwargs)
        if v is None:
            reason = self._eager_keys.get(key)
            if key in self._demoted:
                return _Demoted(self._demoted[key], reason)
            line = self._eager_lines.get(key)
            if reason is None:
                reason = "no variant was traced for them"
            raise RuntimeError(
                f"jit({self.__name__}).trace(): no graph for these arguments: "
                f"jit({self.__name__}) runs eagerly for them, every call ({reason}"
                + (f", at {line}" if line else "") + "); nothing was compiled for them "
                f"to show (f.eager(...) or tj.disable_jit() run them as plain Python)")
        return v

    def _select(self, key, leaves):
        """The variant whose guards hold for these arguments (None if none does): each
        candidate's forward graph runs on copies of its inputs, NumPy's random state put
        back, so nothing the function changes is touched."""
        variants = self._variants.get(key)
        if not variants:
            return None
        v, tried = variants[0], 0
        while v is not None and tried <= len(variants):
            tried += 1
            if v.state and v.state_changed():
                return None               # stale: the next call retraces
            arrays = _graph_inputs(v, leaves)
            if arrays is None:
                return None
            rng = np.random.get_state()
            try:
                with np.errstate(all="ignore"):
                    v.exe(arrays)
                return v
            except GuardFailure as gf:
                v = self._next_variant(variants, v, gf)
            except Exception:  # noqa: BLE001 - a call would demote it: not the one
                return None
            finally:
                np.random.set_state(rng)
        return None

    # ---- the call

    def _key(self, args, kwargs):
        leaves = []
        parts = []
        name = None
        try:
            for i, a in enumerate(args):
                if i in self.static_argnums:
                    parts.append((STATIC, a))
                else:
                    name = i
                    parts.append(flatten_args(a, leaves))
            if kwargs:
                for k in sorted(kwargs):
                    if k in self.static_argnames:
                        parts.append((k, (STATIC, kwargs[k])))
                    else:
                        name = k
                        parts.append((k, flatten_args(kwargs[k], leaves)))
        except NestedTooDeep:
            label = self._arg_labels(args, {})[name] if type(name) is int else name
            raise NestedTooDeep(f"argument {label} nests lists, tuples or dicts more than "
                                f"{MAX_DEPTH} levels deep (too deep for a signature "
                                f"key)") from None
        # Which leaves are the same array: a variant traced for f(x, x) must not run
        # f(x, y), nor the other way round (an in-place update of one is seen by both).
        try:
            leaf_keys = tuple([leaf_key(x) for x in leaves])
        except NoDataError:
            raise NoDataError(self._no_data_argument(args, kwargs)) from None
        key = (tuple(parts), leaf_keys + (alias_pattern(leaves),),
               Config.enable_backprop, Config.train)
        try:
            hash(key)
        except TypeError as e:
            raise TypeError(f"jit({self.__name__}): a static argument is not hashable: "
                            f"{e}") from None
        return key, leaves

    def _fast_key(self, args):
        """The key for positional Variables / ndarrays / floats: the common call, fast."""
        parts = []
        for a in args:
            t = type(a)
            if t is Variable or t is Parameter:
                d = a._data
                if type(d) is not np.ndarray:
                    return None          # None or not an array: the general key says so
                # Parameter apart from Variable: a function may branch on isinstance.
                g = a._grad
                if g is None:
                    parts.append((d.shape, d.dtype, VAR if t is Variable else PAR))
                else:
                    # Set: backward adds to it, and the function may read it.
                    g = g._data
                    if type(g) is not np.ndarray:
                        return None
                    parts.append((d.shape, d.dtype, VAR if t is Variable else PAR,
                                  (g.shape, g.dtype)))
            elif t is np.ndarray:
                parts.append((a.shape, a.dtype, ARR))
            elif t is float:
                parts.append(FLT)
            else:
                return None
        if len(args) > 1 and alias_pattern(args) is not None:
            return None           # the same array twice: the general key records it
        return (tuple(parts), Config.enable_backprop, Config.train)

    def _call_key(self, args, kwargs):
        key = None if kwargs or self.static_argnums else self._fast_key(args)
        if key is not None:
            return key, args
        return self._key(args, kwargs)

    def __call__(self, *args, **kwargs):
        hot = self._hot
        if hot is not None and hot[1] is _state.mode and not kwargs \
                and _env_get(_ENV_KEY) is None:
            # The last signature again, with jit on and the grad mode it was traced in
            # (hot[1])? hot[0] tests the arguments and runs the variant in one frame:
            # no key to build and hash (variant.build_runner).
            try:
                out = hot[0](args)
            except GuardFailure as gf:
                next(self._n_calls)
                return self._hot_dispatch(hot, args, gf)
            except Stale:
                next(self._n_calls)
                return self._hot_dispatch(hot, args, None)   # _dispatch retraces
            except InplaceAlias as e:
                next(self._n_calls)
                return self._alias_call(e, args, kwargs)
            except Exception as e:  # noqa: BLE001 - never a backend traceback
                # Never rerun: effects before the failure may have been applied.
                next(self._n_calls)
                return self._demote(hot[2], hot[4], hot[3], e, args, kwargs)
            if out is not MISS:
                if out is SLOW:
                    next(self._n_calls)
                    return self._hot_dispatch(hot, args, None)
                next(self._n_hot)
                return out
        if _state.trace is not None or _state.jit_off or (
                _env_get(_ENV_KEY) is not None and _env_disabled()):
            # Off, or nested in another trace: the outer trace records our ops directly
            # (not a call of this cache: not counted).
            if _state.trace is not None:
                return tracing.symbolic_scalars(self.fn)(*args, **kwargs)
            return self.fn(*args, **kwargs)
        if self._threading is not None:
            return self._threaded_call(args, kwargs, True)
        # A call whose arguments give no key (an unhashable static value) raises
        # before anything runs: no call, so nothing it could be counted as.
        try:
            key, leaves = self._call_key(args, kwargs)
        except NestedTooDeep as e:
            next(self._n_calls)
            return self._too_deep_call(e, args, kwargs)
        except NoDataError as e:
            next(self._n_calls)
            return self._no_data_call(e, args, kwargs)
        next(self._n_calls)
        return self._call(key, leaves, args, kwargs)

    # ---- state threaded through the call (pystate.threaded)

    def _threaded_call(self, args, kwargs, counted):
        """Read the threaded state, run the threading Jitted on it and the arguments,
        write the new state back. counted=False: this call was counted already (the
        call whose trace found the state)."""
        while True:
            locs, inner = self._threading
            state = tuple([loc.read() for loc in locs])
            for s in state:
                if s is pystate._MISSING:
                    return self._state_gone(locs, state, args, kwargs, counted)
            for loc in locs:
                pystate.put(loc, pystate.UNSET)
            try:
                if counted:
                    result, new = inner(*state, *args, **kwargs)
                else:
                    result, new = inner._call_uncounted(state + args, kwargs)
            except _Rethread as r:
                # Its trace found more state: thread that too, and run the call again
                # (the trace's changes were put back).
                _put_back_state(locs, state)
                if not self._add_state(r.locs):       # nothing new: never loop
                    return self._state_gone(locs, None, args, kwargs, counted)
                counted = False
                continue
            except BaseException:
                # Raised before the function ran (a bad argument), or by it: the state
                # as it left it, as eager's.
                _put_back_state(locs, state)
                raise
            for loc, v in zip(locs, new):
                pystate.write_back(loc, v)
            return result

    def _state_gone(self, locs, state, args, kwargs, counted):
        """A threaded location holds nothing now (deleted, an empty cell, a list
        shorter): the function would see it so, not as state; this call runs eagerly.
        (state None: a trace found again state already threaded.)"""
        if counted:
            next(self._n_calls)
        self._count("fallbacks")
        if state is None:
            reason = "its threaded state changes in ways threading cannot follow"
        else:
            loc = next(loc for loc, s in zip(locs, state) if s is pystate._MISSING)
            reason = f"{loc.describe()}, state it threads, holds nothing"
        self._warn_once(reason, f"jit({self.__name__}): this call runs eagerly: {reason}",
                        self._def_line())
        return self.fn(*args, **kwargs)

    def _call_uncounted(self, args, kwargs):
        try:
            key, leaves = self._call_key(args, kwargs)
        except NestedTooDeep as e:
            return self._too_deep_call(e, args, kwargs)
        except NoDataError as e:
            return self._no_data_call(e, args, kwargs)
        return self._call(key, leaves, args, kwargs)

    def _no_data_argument(self, args, kwargs):
        """The message for a Variable argument whose data is None, naming it."""
        labels = self._arg_labels(args, kwargs)
        named = [(labels[i], a) for i, a in enumerate(args) if i not in self.static_argnums]
        named += [(k, kwargs[k]) for k in sorted(kwargs) if k not in self.static_argnames]
        for label, a in named:
            leaves = []
            try:
                flatten_args(a, leaves)
            except Exception:  # noqa: BLE001 - only looking for the argument to name
                continue
            if any(isinstance(x, Variable) and x._data is None for x in leaves):
                what = "is" if isinstance(a, Variable) else "holds"
                return (f"jit({self.__name__}): argument {label!r} {what} a Variable whose "
                        f"data is None (no shape or dtype to compile for)")
        return f"jit({self.__name__}): a Variable argument has data None"

    def _no_data_call(self, e, args, kwargs):
        """A Variable argument whose data is None: no key (no shape, no dtype), so the
        call runs eagerly. Eager's error on it (an op using it) names the argument; a
        function that does not use it gives eager's result."""
        self._count("fallbacks")
        try:
            result = self.fn(*args, **kwargs)
        except NoDataError as err:
            raise NoDataError(f"{e}: {err}") from None
        what = str(e).replace(f"jit({self.__name__}): ", "", 1)
        self._warn_once(str(e), f"jit({self.__name__}): this call runs eagerly: {what}",
                        self._def_line())
        return result

    def _too_deep_call(self, e, args, kwargs):
        """An argument nested deeper than any key can be (pytree.MAX_DEPTH): eager,
        warned."""
        self._count("fallbacks")
        self._warn_once(str(e), f"jit({self.__name__}): this call runs eagerly: {e}",
                        self._def_line())
        return self.fn(*args, **kwargs)

    def _add_state(self, found):
        """Thread the state at the locations `found` too, from the next call on: a new
        threading Jitted over all of them (this one's variants go). False when every
        one is threaded already."""
        with self.lock:
            locs = list(self._threading[0]) if self._threading is not None else []
            n_before = len(locs)
            for loc in found:
                if not any(pystate.same_location(loc, o) for o in locs):
                    locs.append(loc)
            if self._threading is not None and len(locs) == n_before:
                return False
            n = len(locs)
            labels = [loc.label for loc in locs]
            inner = Jitted(pystate.threaded(self.fn, locs, labels, self.__name__),
                           static_argnums=frozenset(i + n for i in self.static_argnums),
                           static_argnames=self.static_argnames,
                           max_variants=self.max_variants, backend=self.backend,
                           parallel=self.parallel, cache=self.cache, check=self.check,
                           name=self.__name__)
            # One set of counters and stats: cache_info() counts each call once.
            inner._n_hot, inner._n_calls, inner._n = self._n_hot, self._n_calls, self._n
            inner.stats = self.stats
            inner._warned = self._warned
            inner._threads_for = True
            self._threading = (tuple(locs), inner)
            self._variants.clear()
            self._eager_keys.clear()
            self._eager_lines.clear()
            self._demoted.clear()
            self._warm.clear()
            self._changed()
            log.info("jit(%s): threads %s through each call (state the function rebinds)",
                     self.__name__, ", ".join(labels))
            return True

    def _threaded_variant(self, args, kwargs):
        """trace() / backward_graph() of a function that threads state: the threading
        Jitted's variant for the state as it is now (put back afterwards)."""
        while True:
            locs, inner = self._threading
            state = tuple([loc.read() for loc in locs])
            for loc, s in zip(locs, state):
                if s is pystate._MISSING:
                    raise RuntimeError(f"jit({self.__name__}): runs eagerly now "
                                       f"({loc.describe()}, state it threads, holds "
                                       f"nothing)")
            for loc in locs:
                pystate.put(loc, pystate.UNSET)
            try:
                return inner._variant_for(state + args, kwargs)
            except _Rethread as r:
                found = r.locs
            finally:
                for loc, v in zip(locs, state):
                    pystate.put(loc, v)
            if not self._add_state(found):
                raise RuntimeError(f"jit({self.__name__}): runs eagerly for these "
                                   f"arguments (its threaded state changes in ways "
                                   f"threading cannot follow)")

    def _hot_dispatch(self, hot, args, failure):
        """The hot signature, but its variant had checks left, saw its Python state
        change or failed a guard: the guard tree from there, else a new trace."""
        version = self._version
        if not hot[3]:
            return self._call(hot[2], args, args, {})
        out = self._dispatch(hot[2], hot[3], args, {}, args, hot[4], failure)
        if out is not _RETRACE:
            return out
        with self.lock:
            if self._version == version:
                # The guard tree was walked: straight to a new trace.
                return self._cold_call(hot[2], args, {})
        return self._call(hot[2], args, args, {})

    def _call(self, key, leaves, args, kwargs):
        while True:
            version = self._version
            variants = self._variants.get(key)
            if variants:
                out = self._dispatch(key, variants, args, kwargs, leaves)
                if out is not _RETRACE:
                    return out
            with self.lock:
                # Trace only if no thread traced (or dropped a variant) since this
                # thread's dispatch missed: else try the new variants first. Checked under
                # the lock the trace holds, so two threads never trace one outcome (once
                # this retried only once, and a third thread's trace in between made a
                # duplicate variant). Each retry follows a change of the variants, and
                # their number is bounded (max_variants), so this ends.
                if self._version == version:
                    return self._cold_call(key, args, kwargs)

    def _dispatch(self, key, variants, args, kwargs, leaves, v=None, failure=None):
        """Run the variant whose guards hold; _RETRACE if none does. Starts at v (the
        last variant run), or at its guard failure, else at the first variant."""
        if v is None or v not in variants:
            v, failure = variants[0], None
        tried = 0
        while True:
            try:
                if failure is not None:
                    failure, gf = None, failure
                    raise gf
                if v.checks_left > 0:
                    if v.demoted is not None:
                        return self._drop_demoted(key, v, variants, args, kwargs)
                    return self._run_checked(key, v, args, kwargs, leaves)
                try:
                    out = self._run(v, leaves, *((args, kwargs) if v.needs_argv else ()))
                except (GuardFailure, Stale):
                    raise
                except InplaceAlias as e:
                    return self._alias_call(e, args, kwargs)
                except WalkReadMismatch as e:
                    # Raised after the walk into the caller's graph (and maybe the
                    # call's updates) ran: an eager rerun would apply them twice. This
                    # call raises; the signature runs eagerly from now on.
                    with self.lock:
                        if v in variants:
                            variants.remove(v)
                            self._changed()
                    self._fallback(key, str(e))
                    self._count("fallbacks")
                    raise
                except Exception as e:  # noqa: BLE001 - never a backend traceback
                    return self._demote(key, v, variants, e, args, kwargs)
                self._count("hits")
                hot = self._hot
                if (hot is None or hot[3] is not variants) \
                        and not kwargs and len(key) == 3 and leaves is args:
                    # The next call starts at the guard tree's root, not at the variant
                    # that ran last: with a loop whose trip count varies from call to
                    # call, the last variant is the wrong guess more often than not.
                    with self.lock:     # as _changed, which drops it: never a stale one
                        if variants and self._variants.get(key) is variants:
                            self._hot = (variants[0].hot_runner(key),
                                         core.call_mode(True, key[1], key[2]), key,
                                         variants, variants[0])
                return out
            except GuardFailure as gf:
                self._count("guard_failures")
                nxt = self._next_variant(variants, v, gf)
                tried += 1
                if nxt is None or tried > len(variants):
                    log.info("jit(%s): retrace: guard %d (%s) saw %r", self.__name__,
                             gf.index, v.guard_line(gf.index), gf.outcome)
                    self._count("retraces")
                    return _RETRACE
                v = nxt
            except Stale as e:
                log.info("jit(%s): retrace: %s", self.__name__, e)
                self._count("retraces")
                with self.lock:
                    if v in variants:
                        variants.remove(v)
                        self._changed()
                    # Warm up again: new state (model.l1 = Linear(2)) may be created
                    # lazily by its first call, which must not happen while tracing.
                    self._warm.discard(key)
                # (Every such location: one Variable at two of them, both rebound.)
                locs = [loc for loc in (_rebound_variable(c, v) for c in
                                        pystate.all_changed(v.state))
                        if loc is not None] if getattr(e, "change", None) else []
                if locs:
                    # The caller put a new Variable where the function reads one (an
                    # RNN's `state.h = Variable(np.zeros(...))` before each sequence):
                    # retracing for each new identity would never compile. Threaded,
                    # it is read at each call as an argument is (its shape and dtype
                    # in the signature, its gradient through the compiled backward).
                    log.info("jit(%s): threads %s (rebound by the caller)",
                             self.__name__, ", ".join(loc.label for loc in locs))
                    if self._threads_for:
                        raise _Rethread(locs) from None
                    if self._add_state(locs):
                        return self._threaded_call(args, kwargs, False)
                return _RETRACE

    def _alias_call(self, e, args, kwargs):
        """This call's arguments share memory with an array the function updates in
        place (or are that captured Variable): eager order of reads and writes matters,
        which a variant (effects applied after the graph) does not keep. Eager, warned."""
        self._count("fallbacks")
        reason = f"{e} (views of one buffer, or a captured Parameter passed as an argument)"
        self._warn_once(reason, f"jit({self.__name__}): this call runs eagerly: {reason}",
                        self._def_line())
        return self.fn(*args, **kwargs)

    def _warn_once(self, reason, message, line):
        """Warn once per reason, naming and pointing at the user's line: where the cause
        happened, else the function's def line."""
        if reason not in self._warned:
            self._warned.add(reason)
            warn_at(f"{message} at {line}" if line else message, line)

    def _def_line(self):
        return tracing.def_line(self.fn)

    def _changed(self):
        """The variants changed: bump the version, drop the hot entry."""
        self._version += 1
        self._hot = None

    def _demote(self, key, v, variants, error, args, kwargs):
        """Compiled code failed before any effect was applied: this signature runs
        eagerly from now on, and so does this call (raising what eager raises)."""
        with self.lock:
            if v in variants:
                variants.remove(v)
                self._changed()
        self._fallback(key, f"the compiled variant raised {type(error).__name__}: {error}")
        self._count("fallbacks")
        return self.fn(*args, **kwargs)

    def _drop_demoted(self, key, v, variants, args, kwargs):
        """A variant whose compiled backward was found to differ when it first ran
        (variant.checked_backward, which set v.demoted and gave that backward the
        reference gradients): this signature runs eagerly from now on."""
        with self.lock:
            if v in variants:
                variants.remove(v)
                self._changed()
        self._fallback(key, v.demoted)
        self._count("fallbacks")
        return self.fn(*args, **kwargs)

    def _cold_call(self, key, args, kwargs):
        """Warm-up, fallback or a new trace (under the lock: a cold cache traces once)."""
        if key in self._eager_keys:
            self._count("fallbacks")
            return self.fn(*args, **kwargs)
        if key not in self._warm:
            # The first call with a new signature runs eagerly: state created during a
            # call (a lazy Linear, an optimizer's buffers) exists before tracing starts.
            if self._identity_storm(key):
                self._count("fallbacks")
                return self.fn(*args, **kwargs)
            self._static_storm(key, args, kwargs, traced=False)
            self._warm.add(key)
            self._count("misses")
            return self.fn(*args, **kwargs)
        self._id_forms.traced(key)
        self._static_once.traced(key)
        self._static_storm(key, args, kwargs, traced=True)
        variants = self._variants.get(key)
        if variants is not None and len(variants) >= self.max_variants:
            self._fallback(key, f"more than max_variants={self.max_variants} variants "
                           f"(data-dependent control flow keeps changing)",
                           _diverging_guard_line(variants))
            self._count("fallbacks")
            return self.fn(*args, **kwargs)
        if log.isEnabledFor(logging.INFO):
            log.info("jit(%s): trace: %s", self.__name__, self._why_new(key))
        # What the trace may change, kept to put back should the trace raise.
        put_back = _StatePutBack(self._reach(args, kwargs),
                                  self._call_key(args, kwargs)[1])
        try:
            result = self._trace_and_compile(key, args, kwargs)
        except _StateFound as sf:
            # The function rebinds Variables it reaches: thread them (the trace's
            # changes put back), and run this call so.
            self._changed()
            sf.undo_walks()
            put_back.restore()
            if self._threads_for:
                raise _Rethread(sf.locs) from None
            self._add_state(sf.locs)
            return self._threaded_call(args, kwargs, False)
        except JitWarning:
            self._count("misses")        # our own warning, raised as an error: as is
            raise
        except _TraceDiverged as td:
            # The first-call check found the variant unlike eager (and made the signature
            # eager): this call too is eager's, from the state before the trace.
            self._changed()
            td.undo_walks()
            put_back.restore()
            self._count("fallbacks")
            return self.fn(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - eager decides whose exception it is
            return self._eager_after_failed_trace(key, e, put_back, args, kwargs)
        except BaseException:
            self._count("misses")
            raise
        self._changed()
        # The trace computed this call's result: a miss, or a fallback when the trace
        # found that the signature must run eagerly.
        self._count("fallbacks" if key in self._eager_keys else "misses")
        return result

    def _identity_storm(self, key):
        """Is this new key one of a storm: it differs from _IDENTITY_STORM or more keys
        warmed up before only in the identity of argument objects (a config or holder
        object built for each call), whose objects died without a second call? Each such
        key is warmed up and never called again, so nothing ever compiles: warned once,
        and such calls run eagerly without entering any table (nothing of theirs kept).
        Objects that live on (ten models called in turn) are no storm: their keys come
        back, and trace."""
        form = _identity_form(key)
        if form is None:
            return False
        one_shot = self._id_forms.get(form)
        if one_shot is None:
            one_shot = self._id_forms.add(form)
        n = sum(1 for k in one_shot.d if _dead_identity(k))
        if n < _IDENTITY_STORM:
            one_shot.add(key)
            return False
        classes = sorted({c.__name__ for c in _identity_classes(key)})
        reason = f"identity storm {form!r}"
        self._warn_once(
            reason,
            f"jit({self.__name__}): runs eagerly: a new {' / '.join(classes)} object is "
            f"passed at every call ({n} died after one call); the signature keys such an argument by "
            f"identity (what the function reads in it is Python state the variant "
            f"captures), so no call would ever compile. Pass its arrays as arguments, "
            f"reuse one object, or make it a frozen dataclass of numbers and strings",
            tracing.user_line(3))
        return True

    def _static_storm(self, key, args, kwargs, traced):
        """Warn once when keys that differ only in static values (ints, strings, tuples
        of them, static_argnums / static_argnames) pile up: _STATIC_STORM of them warmed
        up and not called again (a new value at every call: nothing ever compiles), or
        traced (every value compiles a variant of its own). The calls run as before
        (a value that comes back compiles; the tables are bounded); the warning names
        the argument and the call's line, and says what to pass instead."""
        form = _static_form(key)
        if form is None:
            return
        table = self._static_traced if traced else self._static_once
        keys = table.get(form)
        if keys is None:
            keys = table.add(form)
        keys.add(key)
        if len(keys) < _STATIC_STORM:
            return
        other = next(k for k in reversed(keys.d) if k != key)
        where, old, new = _static_difference(other[0], key[0], self._arg_labels(args, kwargs))
        declared = where.split("[")[0] in self._declared_static(args, kwargs)
        what = (f"{len(keys)} of its values each traced and compiled a variant of their "
                f"own (a compile storm)" if traced else
                f"{len(keys)} different values of it were each called once: every call "
                f"is a new signature, warmed up eagerly, and nothing compiles (a retrace "
                f"storm)")
        number = isinstance(new, (int, float, np.number)) and not isinstance(new, bool)
        hint = ("drop it from static_argnums / static_argnames and pass it as a float "
                "or a 0-d ndarray (a runtime input, read at each call)" if declared else
                "pass it as a float, a 0-d ndarray or a Variable (a runtime input, read "
                "at each call, not part of the signature)" if number else
                "pass the numbers it carries as floats or arrays (runtime inputs)")
        self._warn_once(
            ("static storm", traced, where),
            f"jit({self.__name__}): argument {where} is static "
            f"({_article(type(new).__name__)} {type(new).__name__}, "
            f"part of the signature: {old!r}, {new!r}, ...) and {what}. To compile it "
            f"once, {hint}; keep static only values from a small set (a shape, a flag, "
            f"a name)", tracing.user_line(3))

    def _arg_labels(self, args, kwargs):
        """The arguments' names in key order (positional, then keywords sorted)."""
        from tracejit.trace.pytree import arg_names
        return list(arg_names(self.fn, len(args))) + sorted(kwargs)

    def _declared_static(self, args, kwargs):
        labels = self._arg_labels(args, kwargs)
        return {labels[i] for i in self.static_argnums if i < len(args)} | \
            set(self.static_argnames)

    def _eager_after_failed_trace(self, key, error, put_back, args, kwargs):
        """The trace raised: the user's bug if eager raises too (eager's exception is
        raised), else ours (a TracedFloat where C code wants a real float, json.dumps):
        the state the trace changed is put back, the call runs eagerly, and the
        signature runs eagerly from now on, warned with the line that raised."""
        self._changed()
        put_back.restore()
        try:
            result = self.fn(*args, **kwargs)
        except BaseException:
            self._count("misses")        # the trace raised what eager raises
            raise
        line = _raising_line(error)
        self._fallback(key, f"tracing raised {type(error).__name__}: {error} (eager does "
                            f"not)", line)
        self._count("fallbacks")
        return result

    def _why_new(self, key):
        """What differs from the nearest signature traced before, in the user's terms."""
        known = [k for k in self._variants if k != key]
        if not known:
            return "first trace"
        old = min(known, key=lambda k: key_distance(k, key))
        return key_change(old, key)

    def _next_variant(self, variants, failed, gf):
        prefix = failed.guard_outcomes[:gf.index]
        for v in variants:
            if v is failed:
                continue
            go = v.guard_outcomes
            if len(go) > gf.index and go[:gf.index] == prefix and go[gf.index] == gf.outcome:
                return v
        return None

    def _fallback(self, key, reason, line=None, demoted=None):
        """Run `key` eagerly for good, warned. demoted: the variant a check against
        eager rejected, whose graphs trace() still shows (marked as not run)."""
        self._eager_keys[key] = reason
        if line:
            self._eager_lines[key] = line
        if demoted is not None:
            self._demoted[key] = (demoted.forward_graph,
                                  demoted.bwd.graph if demoted.bwd else None)
        # Bounded as _variants is: a forgotten signature is traced again, and falls back
        # again (warned once: the reason is known).
        for table in (self._eager_keys, self._eager_lines, self._demoted):
            while len(table) > _MAX_SIGNATURES:
                table.pop(next(iter(table)), None)
        self._warn_once(reason, f"jit({self.__name__}) runs eagerly: {reason}",
                        line or self._def_line())

    # ---- verifying a variant against eager

    def _perturbation_check(self, v, args, kwargs, grads_before=None):
        """Run eager and the new variant on slightly perturbed copies of the arguments.

        A value the tracer froze (data copied out of its sight, a draw from a private
        generator) matches at the traced values but not at perturbed ones. Both runs
        start from the same live state, which is then put back (effects included).
        Where the results are Variables requiring grad, both also run backward with
        the same random cotangents (gradients kept aside, the compiled backward graph
        interpreted: nothing is compiled for it), and the gradients of the arguments
        and captured Variables are compared. The backward kernels are checked against
        that interpretation when they first run (variant.checked_backward).
        Returns (what, first difference): what is "frozen" (values differ on the
        perturbed copies, agree on unperturbed ones: a traced-time value was baked
        in), "value" (they differ on unperturbed copies too), "identity" or
        "gradient"; None when they agree (also when the perturbation changes the
        control flow). float32 value differences are judged by the float64 twin
        (runtime/checking.py): rounding is no difference.
        """
        found = self._compare_on_copies(v, args, kwargs, grads_before, perturb=True)
        if found is None or found[0] != "value":
            return found
        again = self._compare_on_copies(v, args, kwargs, grads_before, perturb=False)
        if again is None or again[0] != "value":
            return "frozen", found[1]
        return "value", again[1]

    def _compare_on_copies(self, v, args, kwargs, grads_before, perturb):
        rng = np.random.default_rng(0)
        leaves = []       # in the order _key flattens them (the runner's leaf indices)
        arg_trees = [None if i in self.static_argnums else flatten_args(a, leaves)
                     for i, a in enumerate(args)]
        kw_trees = {k: None if k in self.static_argnames else flatten_args(kwargs[k], leaves)
                    for k in sorted(kwargs)}
        memo = {}         # one copy per object: f(x, x) stays aliased
        grads_before = grads_before or {}
        copy = _perturbed if perturb else _copied
        p_leaves = [memo[id(x)] if id(x) in memo else
                    memo.setdefault(id(x), copy(x, rng, grads_before.get(id(x), _NOW),
                                            memo=memo))
                    for x in leaves]

        def rebuild(new_leaves):
            it = iter(new_leaves)
            return (tuple(a if t is None else unflatten(t, None, it)
                          for a, t in zip(args, arg_trees)),
                    {k: kwargs[k] if t is None else unflatten(t, None, it)
                     for k, t in kw_trees.items()})
        # An argument that is also captured state (f(x, W), W the closure's) is that
        # object in the reruns too, as the variant requires: captured state is not
        # perturbed (LiveState puts it back).
        for j, var in v.captured_args:
            if j < len(p_leaves) and leaves[j] is var:
                p_leaves[j] = var
        if walks_into_caller(v):
            # The caller's graph behind the copies, as behind the arguments (unchanged
            # copies of the Variables there that are not arguments).
            copy_caller_graph(leaves, p_leaves, memo, lambda x: _copied(x, rng, memo=memo))
        p_args, p_kwargs = rebuild(p_leaves)
        # The real arguments too: one may also be captured (f(w) where f updates the
        # closure's w), which the eager run on the copies then changes.
        originals = LiveState(v, leaves)
        # Captured Variables (and such an argument, kept as itself) start the reruns
        # with the .grad they had before the traced call, as an argument's copy does:
        # the variant holds for that one (the signature keys an argument's, a guard a
        # captured one's None). From the one the traced call's own backward set there,
        # eager's rerun adds its gradient again where the variant's guard fails (the
        # check was inconclusive) or, keyed as an argument, does not look (a false
        # difference). Put back: originals.
        for var in originals.vars:
            if id(var) in grads_before:
                var._grad = grads_before[id(var)]
        # A captured Variable whose .grad was an argument when the call began (`S['h'] =
        # W.grad`, threaded; the call has replaced it since) has that argument's copy as
        # its .grad in the reruns, as the variant requires (put back: originals).
        for (where, var), j in v.grad_args:
            if where == "obj" and j < len(p_leaves):
                var._grad = p_leaves[j]
        # Only the arguments are perturbed (fresh copies): perturbing captured Parameters
        # in place would show other threads using the same model wrong weights.
        state = LiveState(v, p_leaves)
        perturbed = state.capture()
        # What existed before the call: eager returning one of these, compiled must too.
        known = _known_objects(p_leaves, state)
        np_state, py_state = np.random.get_state(), random.getstate()
        # What the runs can change through the arguments (a model passed as `m`): put
        # back before the compiled run and after, as the call left it.
        passed = self._passed_state(args, kwargs, leaves)
        twin = []                     # the float64 twin's run, once it is needed

        def get_twin():
            if not twin:
                twin.append(self._twin(v, p_leaves, rebuild, state, np_state))
            return twin[0]
        try:
            with disable_jit(), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                with np.errstate(all="ignore"):
                    expected = self.fn(*p_args, **p_kwargs)
            eager_objects = result_objects(expected)
            eager_state = state.capture()
            passed.restore()
            state.restore(perturbed)
            np.random.set_state(np_state)
            with np.errstate(all="ignore"):
                got = self._run(v, p_leaves, *((p_args, p_kwargs) if v.needs_argv else ()))
            diff = _values_difference(expected, got, state, eager_state, get_twin,
                                      low_precision_involved(p_leaves, state))
            if diff is not None:
                return "value", diff
            diff = identity_difference(expected, got, known, eager_objects)
            if diff is not None:
                return "identity", diff
            v.check_backward = True
            diff = self._gradients_difference(v, p_leaves, expected, got, get_twin)
            return None if diff is None else ("gradient", diff)
        except Exception:  # noqa: BLE001 - inconclusive: the perturbed call itself failed
            return None
        finally:
            v.check_backward = False
            passed.restore()
            state.restore_initial()
            originals.restore_initial()
            np.random.set_state(np_state)
            random.setstate(py_state)

    def _twin(self, v, leaves, rebuild, state, np_state):
        """The float64 twin of a check's eager run: eager on copies of `leaves` with
        float32 made float64 (captured state stays as it is: other threads may read
        it), from `state`'s initial snapshot and the NumPy random state `np_state`, as
        eager's run started; the state as it is now is put back after. Returns
        (result, a snapshot of `state`'s objects after the run, or None where the
        twin's do not line up with them, the twin's leaves, the noisy twins: [(result,
        leaves)] of NOISE_RUNS more runs under float32_noise, whose spread is the
        computation's float32 condition); None if the twin cannot run (a function
        that insists on float32): the difference then stands. The result's float
        arrays carry that spread (checking.with_noise)."""
        first = self._twin_run(v, leaves, rebuild, state, np_state, None)
        if first is None:
            return None
        result, snap, t_leaves = first
        noisy, noisy_snaps = [], []
        for k in range(NOISE_RUNS):
            run = self._twin_run(v, leaves, rebuild, state, np_state, k)
            if run is not None:
                noisy.append((run[0], run[2]))
                noisy_snaps.append(run[1])
        if noisy:
            paths = [dict(leaves_with_paths(r)) for r, _ in noisy]
            for path, leaf in leaves_with_paths(result):
                if isinstance(leaf, Variable) and leaf._data is not None:
                    leaf._data = with_noise(leaf._data, [
                        p[path]._data for p in paths if isinstance(p.get(path), Variable)
                        and p[path]._data is not None])
        if snap is not None:
            snap = _snapshot_with_noise(snap, [s for s in noisy_snaps if s is not None])
        return result, snap, t_leaves, noisy

    def _twin_run(self, v, leaves, rebuild, state, np_state, noise_seed):
        now = state.capture()
        # (The twin shares the objects passed as arguments: their state is put back.)
        passed = self._passed_state(*rebuild(leaves), leaves)
        state.restore_initial()
        py_state = random.getstate()
        np.random.set_state(np_state)
        t_state = None
        noise = float32_noise(noise_seed) if noise_seed is not None else \
            contextlib.nullcontext()
        try:
            memo = {}
            t_leaves = [twin_copy(x, memo) for x in leaves]
            if walks_into_caller(v):
                # The Variables the function captures stay themselves in the copy of
                # the caller's graph (as the twin's function reads them): a walk there
                # adds to the .grad the function reads after it (Variant.walk_read).
                for kind, obj, _ in v.sources:
                    if kind == "var" and id(obj) not in memo:
                        memo[id(obj)] = obj
                copy_caller_graph(leaves, t_leaves, memo, lambda x: twin_copy(x, memo))
            t_args, t_kwargs = rebuild(t_leaves)
            t_state = LiveState(v, t_leaves)
            with disable_jit(), warnings.catch_warnings(), np.errstate(all="ignore"), \
                    noise:
                warnings.simplefilter("ignore")
                result = self.fn(*t_args, **t_kwargs)
            snap = t_state.capture()
        except Exception:  # noqa: BLE001 - no twin: the difference stands
            return None
        finally:
            if t_state is not None:
                t_state.restore_initial()
            passed.restore()
            state.restore(now)
            random.setstate(py_state)
        # (Position by position: the caller's graph behind the twin's copies must be
        # the one behind the call's arguments, else a reference of another Variable.)
        aligned = len(t_state.vars) == len(state.vars) and \
            len(t_state.arrays) == len(state.arrays) and \
            all(np.shape(a._data) == np.shape(b._data)
                for a, b in zip(t_state.vars, state.vars)) and \
            all(a.shape == b.shape for a, b in zip(t_state.arrays, state.arrays))
        return result, snap if aligned else None, t_leaves

    def _gradients_difference(self, v, leaves, expected, got, get_twin):
        """The first difference between the gradients of eager's and the variant's
        results (random cotangents, gradients kept aside) or None. The variant's
        backward graph is interpreted (v.check_backward, set by the caller): compiling
        it is for a call that runs backward. float32 differences are judged by the
        float64 twin (get_twin), as values are."""
        wrt = self._gradient_names(v, leaves)
        state = LiveState(v, leaves)
        soft = Soft(low_precision_involved(leaves, state))
        with np.errstate(all="ignore"):
            diff = gradient_difference(expected, got, wrt, soft=soft)
            if diff is None and soft:
                t = get_twin()
                diff = gradient_difference(
                    expected, got, wrt, ref=NOREF if t is None else
                    (t[0], [var for _, var in self._gradient_names(v, t[2])],
                     [(r, [var for _, var in self._gradient_names(v, tl)])
                      for r, tl in t[3]]))
                if diff is not None and t is None:
                    diff += " (the float64 twin raised: rounding cannot be told apart)"
        return diff

    @staticmethod
    def _gradient_names(v, leaves):
        """(name, Variable) for the float Variables a variant's gradients go to: its
        Variable arguments and captured Variables, named as the trace names them."""
        names = v.forward_graph.input_names
        out, seen = [], set()
        for pos, (kind, obj, _) in enumerate(v.sources):
            var = leaves[obj] if kind == "arg" else obj if kind == "var" else None
            if isinstance(var, Variable) and id(var) not in seen and var._data is not None \
                    and var._data.dtype.kind in "fc":
                seen.add(id(var))
                name = names[pos] if pos < len(names) and names[pos] else var.name
                what = "argument" if kind == "arg" else "captured Variable"
                out.append((f"{what} {name or '?'}", var))
        return out

    def _reach(self, args, kwargs, fn=None):
        """fn (default self.fn) with the objects it is passed as roots of pystate's
        walk (as eval_shape's sandbox does): what a rerun can change through them."""
        passed = [a for a in list(args) + list(kwargs.values())
                  if not isinstance(a, (Variable, np.ndarray)) and
                  not pystate._is_scalar_config(a)]
        fn = self.fn if fn is None else fn
        return functools.partial(fn, *passed) if passed else fn

    def _passed_state(self, args, kwargs, leaves):
        """What a check's rerun changes through the objects the call is passed, to put
        back (its LiveState holds the variant's sources; what the function captures is
        that state's, and a side effect's, as before)."""
        return _StatePutBack(self._reach(args, kwargs, _reads_nothing), leaves)

    def _run_checked(self, key, v, args, kwargs, leaves):
        """Run eager and compiled side by side from the same state; keep eager's on a
        mismatch. Every variant's first call does this (check=True: its first three),
        so a value the tracer could not see (NumPy on a bare array the function also
        mutates) demotes the variant instead of replaying a frozen constant."""
        v.checks_left -= 1
        state = LiveState(v, leaves)
        known = _known_objects(leaves, state)
        rng = np.random.get_state()
        # State reached through the arguments (LiveState holds the variant's sources):
        # the compiled run starts from it as it was, and where eager's result is kept,
        # eager's is put back, so the call leaves what one eager call leaves.
        before = self._passed_state(args, kwargs, leaves)
        try:
            with disable_jit():
                expected = self.fn(*args, **kwargs)
        except BaseException:
            # Eager raised (what the call gives): counted, and the check is still owed
            # (the variant has not been compared with eager yet).
            v.checks_left += 1
            self._count("misses")
            raise
        eager_objects = result_objects(expected)
        eager_state = state.capture()
        rng_after = np.random.get_state()
        after = self._passed_state(args, kwargs, leaves)
        before.restore()
        state.restore_initial()
        np.random.set_state(rng)
        try:
            got = self._run(v, leaves, *((args, kwargs) if v.needs_argv else ()))
        except (GuardFailure, Stale, InplaceAlias):
            after.restore()
            state.restore(eager_state)
            np.random.set_state(rng_after)
            self._count("misses")      # the variant did not apply: eager's result
            return expected
        except Exception as e:  # noqa: BLE001 - never a backend traceback for the user
            after.restore()
            state.restore(eager_state)
            np.random.set_state(rng_after)
            variants = self._variants.get(key, [])
            if v in variants:
                variants.remove(v)
                self._changed()
            self._fallback(key, f"the compiled variant raised {type(e).__name__}: {e}")
            self._count("fallbacks")
            return expected
        twin = []

        def get_twin():
            if not twin:
                twin.append(self._twin(v, leaves, functools.partial(
                    _rebuild, args, kwargs, self.static_argnums, self.static_argnames),
                    state, rng))
            return twin[0]
        diff = _values_difference(expected, got, state, eager_state, get_twin,
                                  low_precision_involved(leaves, state))
        same_objects = identity_difference(expected, got, known, eager_objects) \
            if diff is None else None
        grad_diff = None
        if diff is None and same_objects is None and v.bwd is not None:
            # The backward a later `result.backward()` runs, against eager's, on this
            # call's arguments (the trace-time check skips functions with effects that
            # run only while tracing, and may have been inconclusive).
            v.check_backward = True
            try:
                grad_diff = self._gradients_difference(v, leaves, expected, got, get_twin)
            except Exception:  # noqa: BLE001 - inconclusive: eager's backward raised
                grad_diff = None
            finally:
                v.check_backward = False
        if diff is None and same_objects is None and grad_diff is None:
            self._count("hits")
            return got
        variants = self._variants.get(key, [])
        if v in variants:
            variants.remove(v)
            self._changed()
        after.restore()
        state.restore(eager_state)
        np.random.set_state(rng_after)
        if grad_diff is not None:
            self._fallback(key, f"the compiled backward differs from eager's (random "
                                f"cotangents, on this call's arguments: {grad_diff})",
                           demoted=v)
        elif diff is None:
            self._fallback(key, f"the compiled call's results are not the objects eager "
                                f"returns ({same_objects})", demoted=v)
        else:
            self._fallback(key, f"the compiled variant differs from eager ({diff}; "
                                f"compared: both runs' results and the state they "
                                f"leave, on this call's arguments); the function likely "
                                f"computes with NumPy on arrays the tracer cannot see",
                           demoted=v)
        self._count("fallbacks")
        return expected

    # ---- running a variant

    def _run(self, v, leaves, args=None, kwargs=None):
        if v.state and v.state_changed():
            changed = pystate.changed(v.state)
            if changed is not None:
                loc, old, new = changed
                e = Stale(f"{loc.describe()} changed from {pystate.describe_value(old)} "
                          f"to {pystate.describe_value(new)}")
                e.change = changed
                raise e
        # args/kwargs: only a variant returning an argument's container reads them.
        return v.runner(leaves) if args is None else v.runner(leaves, args, kwargs)

    # ---- tracing

    def _trace_and_compile(self, key, args, kwargs):
        t0 = time.perf_counter()
        self._count("traces")
        call = trace_call(self.fn, self.__name__, args, kwargs, self.static_argnums,
                          self.static_argnames)
        self.stats["trace_seconds"] += time.perf_counter() - t0
        if call.rebound:
            # Before the escapes: threaded, this state may trace without them (a lazy
            # Layer the traced path first used, created by the threaded warm-up).
            raise _StateFound(call.rebound, call.walk_undo)
        if call.escapes:
            reason, line = call.escapes[0]
            self._fallback(key, reason, line)
            return call.result
        if call.side_effects and self.__name__ not in self._warned:
            self._warned.add(self.__name__)
            what, line = call.side_effects[0]
            line = line or self._def_line()
            warn_at(f"jit({self.__name__}): {what} runs only while tracing, not on compiled "
                    f"calls, at {line}", line)
        t1 = time.perf_counter()
        # The compile callable is a partial of a module function, not a bound method:
        # a Variant never reaches its Jitted.
        backend_compile = functools.partial(compile_graph, backend=self.backend,
                                            parallel=self.parallel, cache=self.cache,
                                            where=self._def_line())
        variant = Variant(call, call.backward, backend_compile, self.lock,
                          checks=3 if self.check else 1)
        self.stats["compile_seconds"] += time.perf_counter() - t1
        if variant.walk_read_refusal is not None:
            # (A .grad read or set after a backward inside the call went on into the
            # caller's graph: the part after that walk could not be split off,
            # Variant.walk_read, or the .grad set after it is another's.)
            self._fallback(key, f"the function reads or sets the .grad of a Variable "
                                f"after a backward inside it goes on into the graph from "
                                f"before the call and changes that .grad there, and "
                                f"{variant.walk_read_refusal}; compiled calls cannot "
                                f"follow it after that backward")
            return call.result
        variant.warn = functools.partial(warn_at, line=self._def_line())
        variant.state = pystate.snapshot(call.locations)
        variant.state_changed = pystate.compile_check(variant.state)
        if not call.side_effects:
            frozen = self._perturbation_check(variant, args, kwargs,
                                              _grads_before(call))
            if frozen is not None:
                what, diff = frozen
                if what == "frozen":
                    reason = (f"the traced graph froze a value: on copies of the arguments "
                              f"changed by up to {_PERTURB:.1%} its results differ from "
                              f"eager's ({diff}), on unchanged copies they agree; something "
                              f"the function reads escaped the tracer")
                elif what == "value":
                    reason = (f"the compiled variant differs from eager ({diff}; compared: "
                              f"both runs' results and the state they leave, on copies of "
                              f"the traced call's arguments, changed or not)")
                elif what == "gradient":
                    reason = (f"the compiled backward differs from eager's (with slightly "
                              f"changed inputs, random cotangents: {diff})")
                else:
                    reason = (f"the compiled call's results are not the objects eager "
                              f"returns ({diff})")
                self._fallback(key, reason, demoted=variant)
                # The traced call may itself have run differently from eager (a tracer
                # answering a library's isinstance otherwise): eager's result instead.
                raise _TraceDiverged(call.walk_undo)
        if key not in self._variants and len(self._variants) >= _MAX_SIGNATURES:
            # Signatures built from per-call values (objects called twice and dropped,
            # static values) must not pile up compiled code and the state it holds:
            # the oldest signature's variants go (its next call warms up again).
            del self._variants[next(iter(self._variants))]
            self._changed()
        self._variants.setdefault(key, []).append(variant)
        return call.result

    def backend_name(self):
        b = self.backend
        return os.environ.get("TRACEJIT_BACKEND", "numba") if b == "auto" else b


def _known_objects(leaves, state):
    """What exists before a call: arguments and captured state, their arrays and grads.
    Eager returning one of these, the compiled call must return it too."""
    out = list(leaves) + state.arrays + state.vars
    for x in list(leaves) + state.vars:
        if isinstance(x, Variable):
            out.append(x._data)
            if x._grad is not None:
                out.append(x._grad)
    return out


def _grads_before(call):
    """id(Variable) -> its .grad before the traced call: the arguments' (as the
    signature saw them) and those of the Variables from outside the traced call set
    (the first value walk_undo holds for each)."""
    before = {}
    for var, field, value in call.walk_undo:
        if field == "_grad":
            before.setdefault(id(var), value)
    before.update(call.grads_before)
    return before


_PERTURB = 1e-3   # relative: far above the checks' tolerance, small for control flow


_NOW = object()


def _perturbed(x, rng, grad=_NOW, memo=None):
    """A slightly changed copy of x; a Variable's copy has a changed copy of `grad` (its
    .grad before the call; _NOW: the one it has now) as its .grad. Arrays are copied
    with their layout (checking.layout_copy; memo: the regions copied for this rerun's
    arguments, so views between them stay views)."""
    if isinstance(x, Variable):
        d = x._data
        # The key tells Parameters apart; a Constant (backward's seed) stores no
        # gradient, so the gradient check's copy is one too.
        cls = Parameter if isinstance(x, Parameter) else \
            core.Constant if type(x) is core.Constant else Variable
        y = cls(_perturbed(d, rng, memo=memo), x.name) \
            if d is not None and d.dtype.kind == "f" \
            else cls(layout_copy(d, memo) if d is not None else None, x.name)
        g = x._grad if grad is _NOW else grad
        if g is not None and cls is not core.Constant:
            # Its .grad is state the call reads (and adds to): the copy has one too.
            y._grad = _perturbed(g, rng, memo=memo)
        return y
    if isinstance(x, np.ndarray):
        if x.dtype.kind != "f":
            return layout_copy(x, memo)
        scale = 1 + _PERTURB * rng.uniform(0.5, 1.0, x.shape) * rng.choice([-1, 1], x.shape)
        return layout_copy(x, memo, values=np.asarray(x * scale, dtype=x.dtype))
    if type(x) is float:
        return x * (1 + _PERTURB * 0.75)
    return x


def _copied(x, rng, grad=_NOW, memo=None):
    """An unperturbed copy of x (as _perturbed makes, scale 1): the check that tells a
    frozen value (agrees here) from a graph that computes otherwise (differs here)."""
    if isinstance(x, Variable):
        d = x._data
        cls = Parameter if isinstance(x, Parameter) else \
            core.Constant if type(x) is core.Constant else Variable
        y = cls(None if d is None else layout_copy(d, memo), x.name)
        g = x._grad if grad is _NOW else grad
        if g is not None and cls is not core.Constant:
            y._grad = Variable(layout_copy(g._data, memo)) if isinstance(g, Variable) else \
                _copied(g, rng, memo=memo)
        return y
    if isinstance(x, np.ndarray):
        return layout_copy(x, memo)
    return x


def _snapshot_with_noise(snap, noisy):
    """The twin's snapshot of the state (LiveState.capture) with each float array's
    noise, measured by the noisy twins' snapshots `noisy`: state is judged as results
    are (a .grad a backward inside the call leaves on the caller's graph: a float32 sum
    of parts that cancel moves with float32 rounding as a result does)."""
    vs, arrs = snap[:2]
    vs = [(d, with_noise(dc, [n[0][k][1] for n in noisy]), g,
           with_noise(gc, [n[0][k][3] for n in noisy])) + tuple(rest)
          for k, (d, dc, g, gc, *rest) in enumerate(vs)]
    arrs = [with_noise(a, [n[1][k] for n in noisy]) for k, a in enumerate(arrs)]
    return (vs, arrs) + tuple(snap[2:])


def _rebuild(args, kwargs, static_argnums, static_argnames, new_leaves):
    """args and kwargs with their array leaves (flatten_args's order) replaced."""
    it = iter(new_leaves)
    scratch = []
    a = tuple(x if i in static_argnums else unflatten(flatten_args(x, scratch), None, it)
              for i, x in enumerate(args))
    k = {n: kwargs[n] if n in static_argnames else
         unflatten(flatten_args(kwargs[n], scratch), None, it) for n in sorted(kwargs)}
    return a, {n: k[n] for n in kwargs}


def _values_difference(expected, got, state, eager_state, twin, mixed=False):
    """The first difference of compiled's results and state from eager's; float32
    differences (any float's, `mixed`: the call reads float32) judged by the float64
    twin, run (`twin()`) only when one is found."""
    soft = Soft(mixed)
    diff = first_difference(expected, got, soft=soft) or \
        state.difference(eager_state, soft=soft)
    if diff is not None or not soft:
        return diff
    t = twin()
    if t is None:
        diff = first_difference(expected, got) or state.difference(eager_state)
        return f"{diff} (the float64 twin raised: rounding cannot be told apart)"
    result, snap, _, _ = t
    return first_difference(expected, got, ref=result) or (
        state.difference(eager_state, ref=snap) if snap is not None
        else state.difference(eager_state))


_NOT_USER = tuple({os.path.abspath(p) + os.sep for p in (
    sysconfig.get_path("stdlib"), sysconfig.get_path("platstdlib"),
    sysconfig.get_path("purelib"), sysconfig.get_path("platlib")) if p})


def _raising_line(error):
    """'file.py:12  text' of the user's line an exception came through: the innermost
    frame of its traceback outside tracejit, the standard library and installed
    packages (json.dumps(...) in the user's function, not json/encoder.py)."""
    best = None
    tb = error.__traceback__
    while tb is not None:
        fname = tb.tb_frame.f_code.co_filename
        path = os.path.abspath(fname)
        if not path.startswith(tracing._PKG_DIR + os.sep) and \
                not path.startswith(_NOT_USER) and not fname.startswith("<frozen"):
            text = linecache.getline(fname, tb.tb_lineno).strip()
            best = f"{os.path.basename(fname)}:{tb.tb_lineno}  {text}"
        tb = tb.tb_next
    return best


# Per-signature tables are bounded: keys built from per-call values (new identity-keyed
# objects, static values) must not grow a Jitted without limit.
_MAX_WARM = 512
_MAX_SIGNATURES = 256     # signatures with variants (and with a fallback) kept
# The number of keys differing only in identity-keyed objects that makes a storm.
_IDENTITY_STORM = 8
# ... only in static values (warmed up once each, or traced each): a storm, warned.
_STATIC_STORM = 16


class _BoundedSet:
    """A set of at most `cap` keys, the oldest forgotten first (a forgotten warm-up key
    is warmed up again: one more eager call, never a wrong one)."""

    __slots__ = ("cap", "d")

    def __init__(self, cap):
        self.cap = cap
        self.d = {}

    def __contains__(self, key):
        return key in self.d

    def __len__(self):
        return len(self.d)

    def add(self, key):
        self.d[key] = None
        if len(self.d) > self.cap:
            del self.d[next(iter(self.d))]

    def discard(self, key):
        self.d.pop(key, None)

    def clear(self):
        self.d.clear()


class _Forms(_BoundedSet):
    """form -> the _BoundedSet of its one-shot keys (warmed up, not traced yet);
    form_of(key): its form (_identity_form, _static_form)."""

    __slots__ = ("form_of",)

    def __init__(self, cap, form_of=None):
        super().__init__(cap)
        self.form_of = form_of or _identity_form

    def get(self, form):
        return self.d.get(form)

    def add(self, form):
        self.d[form] = keys = _BoundedSet(4 * _IDENTITY_STORM)
        if len(self.d) > self.cap:
            del self.d[next(iter(self.d))]
        return keys

    def traced(self, key):
        """key was called again (it traces): not one of a storm."""
        form = self.form_of(key)
        keys = self.d.get(form) if form is not None else None
        if keys is not None:
            keys.discard(key)


def _dead_identity(key):
    return any(i.obj is None for i in _identity_classes(key, objects=True))


def _identity_form(key):
    """key with every identity-keyed object replaced by its class; None if it has none."""
    found = []

    def sub(x):
        if isinstance(x, _Identity):
            found.append(x)
            return ("class", x.cls)
        if type(x) is tuple:
            return tuple(sub(y) for y in x)
        return x
    form = sub(key)
    return form if found else None


def _article(word):
    return "an" if word[:1].lower() in "aeiou" else "a"


def _static_form(key):
    """key with every static value replaced by its type; None if it has none (a fast
    key never has one)."""
    if len(key) != 4:
        return None
    found = []

    def sub(x):
        if type(x) is tuple:
            if len(x) == 2 and x[0] is STATIC:
                found.append(x)
                return (STATIC, type(x[1]))
            return tuple(sub(y) for y in x)
        return x
    form = sub(key[0])
    return (form,) + key[1:] if found else None


def _static_difference(a, b, labels):
    """(where, old, new): the first static value that differs between the parts a and b
    of two keys of one _static_form, where named from the argument labels."""
    def walk(x, y, where):
        if type(x) is tuple and type(y) is tuple:
            if len(x) == 2 and x[0] is STATIC and y[0] is STATIC:
                return None if x[1] == y[1] else (where, x[1], y[1])
            # ("list", ...) / ("tuple", ...) items from 1, ("dict", keys, ...) from 2.
            start = 2 if x[:1] == ("dict",) else 1 if x[:1] in (("list",), ("tuple",)) \
                else None
            for i, (u, v) in enumerate(zip(x, y)):
                if start is not None and i < start:
                    continue
                sub = where if start is None else \
                    f"{where}[{x[1][i - 2]!r}]" if start == 2 else f"{where}[{i - 1}]"
                found = walk(u, v, sub)
                if found is not None:
                    return found
        return None
    for i, (x, y) in enumerate(zip(a, b)):
        label = labels[i] if i < len(labels) else str(i)
        if type(x) is tuple and len(x) == 2 and type(x[0]) is str and x[0] == label \
                and x[0] is not STATIC:
            x, y = x[1], y[1]              # a keyword part: (name, tree)
        found = walk(x, y, label)
        if found is not None:
            return found
    return "?", None, None


def _identity_classes(key, objects=False):
    """The classes of key's identity-keyed objects (objects=True: their _Identity)."""
    if isinstance(key, _Identity):
        yield key if objects else key.cls
    elif type(key) is tuple:
        for x in key:
            yield from _identity_classes(x, objects)


def warn_at(message, line):
    """A JitWarning shown at the user's line ("file.py:12  text", as tracing.user_line
    gives it), not at tracejit's frame that noticed."""
    m = re.match(r"(?:grad of )?(.+?):(\d+)(?:\s|$)", line or "")
    if m is None:
        warnings.warn(message, JitWarning, stacklevel=3)
        return
    fname = m.group(1)
    warnings.warn_explicit(message, JitWarning, fname, int(m.group(2)),
                           module=fname[:-3] if fname.endswith(".py") else fname)


class BoundJitted(functools.partial):
    """A jitted method bound to its object (`obj.step`): a call is partial's C call (no
    Python frame added to the hot path); trace(), backward_graph(), eager() and
    cache_info() are the Jitted's, with the object as first argument."""

    __slots__ = ()

    @property
    def jitted(self):
        return self.func.__self__

    def trace(self, *args, **kwargs):
        return self.jitted.trace(*self.args, *args, **kwargs)

    def backward_graph(self, *args, **kwargs):
        return self.jitted.backward_graph(*self.args, *args, **kwargs)

    def eager(self, *args, **kwargs):
        return self.jitted.eager(*self.args, *args, **kwargs)

    def cache_info(self):
        return self.jitted.cache_info()

    def __getattr__(self, name):       # __name__, stats, fn, ...: the Jitted's
        return getattr(self.func.__self__, name)


def _diverging_guard_line(variants):
    """The line of the first guard on which the variants' outcomes differ."""
    outcomes = [v.guard_outcomes for v in variants]
    for i in range(min(len(o) for o in outcomes)):
        if any(o[i] != outcomes[0][i] for o in outcomes):
            return variants[0].guard_line(i)
    return None


def _graph_inputs(v, leaves):
    """Copies of the forward graph's inputs for these leaves (None: they do not fit)."""
    for where, var in v.grad_none:
        if where == "leafgrad":
            if var >= len(leaves) or not isinstance(leaves[var], Variable) \
                    or leaves[var]._grad is None:
                return None
            var = leaves[var]._grad
        if var._grad is not None:
            return None
    for where, var in v.leaf_required:
        x = var if where == "obj" else leaves[var] if var < len(leaves) else None
        if where == "leafgrad" and x is not None:
            x = x._grad
        if not isinstance(x, Variable) or x.creator is not None:
            return None
    out = []
    for kind, obj, spec in v.sources:
        if kind == "arg":
            if obj >= len(leaves):
                return None
            x = leaves[obj]
            a = x._data if isinstance(x, Variable) else np.asarray(x)
        elif kind == "var":
            a = obj._data
        elif kind == "grad":
            a = obj._grad._data if obj._grad is not None else None
        elif kind == "arggrad":
            g = leaves[obj]._grad if obj < len(leaves) else None
            a = g._data if g is not None else None
        else:
            a = obj
        if isinstance(a, np.ndarray):
            if spec is not None and (a.shape != spec[0] or a.dtype != spec[1]):
                return None
            a = a.copy()
        elif a is None:
            return None
        out.append(a)
    return out


def _reads_nothing(*args):
    # The root of _passed_state's walk: only the objects bound to it.
    pass


def _rebound_variable(change, v):
    """The location of a Stale change (loc, old, new) of variant v that threading can
    follow: a Variable v's graph reads (not a Parameter: a Layer's registered weight
    is its identity) the caller replaced by another at a location the function
    captures (not one reached through an argument object, which keys the call by
    identity), else None."""
    if change is None:
        return None
    loc, old, new = change
    if not any(kind == "var" and obj is old for kind, obj, _ in v.sources) or \
            not isinstance(new, Variable) or \
            loc.label.startswith("argument ") or \
            pystate.state_refusal(loc, old, new) is not None:
        return None
    return loc


class _StateFound(Exception):
    """A trace found Variables the function rebinds (TracedCall.rebound)."""

    def __init__(self, locs, walk_undo=()):
        super().__init__()
        self.locs = locs
        self.walk_undo = walk_undo

    def undo_walks(self):
        """Put back what the traced call changed in the caller's graph (a backward
        inside it going on into it: .grad; a cut: creators), as the call runs again."""
        for var, field, value in reversed(self.walk_undo):
            setattr(var, field, value)
        self.walk_undo = ()


class _Rethread(Exception):
    """Raised by a threading Jitted to its owner: thread these locations too."""

    def __init__(self, locs):
        super().__init__()
        self.locs = locs


def _put_back_state(locs, state):
    # Where the call left the placeholder, the state before it.
    for loc, v in zip(locs, state):
        if loc.read() is pystate.UNSET:
            pystate.put(loc, v)


class _TraceDiverged(Exception):
    """The first-call check made the signature eager: the call is rerun eagerly."""

    def __init__(self, walk_undo=()):
        super().__init__()
        self.walk_undo = walk_undo

    undo_walks = _StateFound.undo_walks


class _StatePutBack:
    """What trace() may change, put back: the arguments, every Variable and array the
    function can reach (pystate.locations), Python values and list/dict contents there,
    and the random streams."""

    def __init__(self, fn, leaves):
        import types
        objs, self.values, self.containers, self.streams = [], [], [], []
        locs = pystate.locations(fn)
        self.labels = {loc.label for loc in locs}
        from tracejit.layers import Layer
        from tracejit.optimizers import Optimizer
        for loc in locs:
            val = loc.read()
            if isinstance(val, Variable):
                objs.append(("var", val, None))
            elif type(val) is np.ndarray:
                objs.append(("array", val, None))
            elif type(val) in (list, dict):
                self.containers.append((val, val.copy()))
            elif isinstance(val, (np.random.Generator, np.random.RandomState,
                                  random.Random)):
                # A private random stream the function draws from (gen.random()).
                self.streams.append((val, _stream_state(val)))
            elif isinstance(val, Layer):
                # Nested deeper than locations reach (model.block.l1.W): all its params
                # (not a threaded one's placeholder, pystate.UNSET).
                objs += [("var", p, None) for p in val.params() if isinstance(p, Variable)]
            elif isinstance(val, Optimizer):
                # Its per-parameter buffers (vs[id(p)]), one level below its dicts.
                bufs = [b for d in vars(val).values() if type(d) is dict for b in d.values()]
                objs += [("var", b, None) for b in bufs if isinstance(b, Variable)]
                objs += [("array", b, None) for b in bufs if type(b) is np.ndarray]
            if val is not pystate._MISSING and loc.kind != "default" \
                    and not isinstance(loc.container, tuple):
                self.values.append((loc, val))
        self.live = LiveState(types.SimpleNamespace(sources=objs, effects=(),
                                                    grad_effects=()), leaves)
        self.rng, self.py_rng = np.random.get_state(), random.getstate()
        self.fn = fn

    def created_state(self):
        """Did the function create state since (a lazy Linear's W, an optimizer's
        buffers, a new attribute)? That state cannot be put back without undoing what
        the next trace needs to see."""
        if any(var._data is not None for var, (data, *_) in
               zip(self.live.vars, self.live.initial[0]) if data is None):
            return True
        # A list that grows (a log) is a side effect, put back; a new attribute or dict
        # entry (opt.vs[id(p)]) is state the next call expects to find. A Layer's
        # first call sets `inputs`/`outputs` (weak references, bookkeeping): not state,
        # or trace() of any fresh model's training step would apply the step.
        return any(loc.label not in self.labels and not (
            loc.kind == "item" and type(loc.container) is list) and not (
            type(loc.read()) is list and pystate._bookkeeping(loc.read()))
            for loc in pystate.locations(self.fn))

    def restore(self):
        self.live.restore_initial()
        for c, copy in self.containers:
            if type(c) is list:
                c[:] = copy
            else:
                c.clear()
                c.update(copy)
        for loc, val in self.values:
            if loc.read() is not val:
                try:
                    loc.write(val)
                except (AttributeError, TypeError):
                    pass
        np.random.set_state(self.rng)
        random.setstate(self.py_rng)
        for gen, state in self.streams:
            _set_stream_state(gen, state)



def _optimize(g):
    from tracejit.backends.numba import optimize
    return optimize(g)


class _Demoted:
    """What trace() and backward_graph() find for a signature a check against eager
    demoted: the graphs traced for it, which do not run (its calls run eagerly)."""

    def __init__(self, graphs, reason):
        self.graphs, self.reason = graphs, reason

    def graph(self, which, optimized):
        g = self.graphs[which]
        if g is None:
            return None
        if optimized:
            g = _optimize(g)
        stage = ("forward" if which == 0 else "backward") + \
            (", optimized" if optimized else ", as traced")
        return _labelled(g, f"{stage}; NOT RUN: these arguments run eagerly, every call "
                            f"({self.reason})")


def _labelled(g, stage):
    """A copy of g whose printed header says which graph it is."""
    out = g.replace()
    out.stage = stage
    return out


def jit(fn=None, **options):
    """Compile a define-by-run function: `@tj.jit` or `tj.jit(f, static_argnums=...)`."""
    if fn is None:
        return lambda f: Jitted(f, **options)
    return Jitted(fn, **options)
