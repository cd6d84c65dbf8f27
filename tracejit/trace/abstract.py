"""Abstract evaluation: run a function on shapes and dtypes alone (eval_shape).

Each primitive applies its shape rule instead of its forward; `.data` has a shape and
a dtype and no value to look at. Nothing the function writes leaks out (_Sandbox): not
an in-place update of a Variable's data or of an array it reaches (BatchNorm's running
averages, `W.data -= lr * g`), not a `.data =` or `.grad =`, not an attribute, global
or dict entry it rebinds where pystate finds it, not a draw from NumPy's or Python's
global random stream. What the function does in plain Python (print, a list it
appends to) happens, once, as it runs.
"""
import functools
import random

import numpy as np

from tracejit import core
from tracejit.core import ShapeDtype, Variable
from tracejit.trace import pystate

# A captured array up to this size is replaced by a copy while the function runs (its
# in-place updates go there); a bigger one (a dataset) is made read-only instead, so
# eval_shape stays cheap: an in-place write into it raises.
_COPY_BYTES = 1 << 24


class _AbstractTrace(core.TraceHooks):
    """Runs a function on shapes alone: each primitive applies its shape rule."""

    abstract = True

    def __init__(self):
        self.kept = {}     # id(Variable) -> (Variable, _data, _grad) before the first write

    def _keep(self, var):
        if id(var) not in self.kept:
            self.kept[id(var)] = (var, var._data, var._grad)

    def put_back(self):
        """Every Variable's data and .grad as the function found them."""
        for var, data, grad in self.kept.values():
            var._data, var._grad = data, grad
        self.kept.clear()

    def backward_of(self, fn, deferrable=False):
        pass

    def backward_outside(self, fns, retain_grad, create_graph):
        pass

    def unchaining(self, var, backward):
        pass            # shapes only: no call repeats a cut

    def input_grads(self, fn, gys, retain_grad=False):
        return core._input_grads(fn, gys)

    def call(self, fn, inputs):
        from tracejit.trace.record import user_line
        specs = [ShapeDtype(x._data.shape, x._data.dtype) for x in inputs]
        try:
            out = fn.shape_rule(*specs)
        except (ValueError, TypeError, IndexError) as e:
            raise type(e)(f"{e} (at {user_line(3)})") from None
        outs = out if isinstance(out, tuple) else (out,)
        ys = [Variable(_placeholder(s)) for s in outs]
        return ys if len(ys) > 1 else ys[0]

    def new_variable(self, var, data):
        var._data = data.view(np.ndarray) if isinstance(data, _ShapeOnly) else data

    def read_data(self, var):
        # Shapes pass through (Variable(x.data), x.data.shape); a value does not. A copy,
        # not a view: an in-place update of it (`W.data -= ...`, batch_norm's running
        # averages) must not reach the Variable's buffer. (Its values, not zeros: a
        # boolean mask of them gives eager's shape.)
        return np.array(var._data).view(_ShapeOnly)

    def write_data(self, var, value):
        self._keep(var)                # put back after the call
        return value.view(np.ndarray) if isinstance(value, _ShapeOnly) else value

    def read_grad(self, var):
        return var._grad

    def write_grad(self, var, value):
        self._keep(var)

    def literal(self, var, value):
        pass

    def scalar_input(self, value, like_dtype):
        # A traced number of the jitted function around eval_shape (x * s, s a float
        # argument): only the operand's dtype matters here, as for the number it is.
        v = value._value
        return core.Constant(np.asarray(v, dtype=np.result_type(like_dtype, v)))


class _ShapeOnly(np.ndarray):
    """`.data` under eval_shape: it has a shape and dtype, and no value to look at."""

    def _no_value(self, *args):
        from tracejit.trace.record import user_line
        raise TypeError(f"eval_shape: the function looks at values at {user_line(2)}; "
                        f"only shapes and dtypes are known")

    __bool__ = __float__ = __int__ = __index__ = item = tolist = _no_value


def _placeholder(spec):
    # A zero-stride view: shape and dtype without allocating the array.
    return np.broadcast_to(np.zeros((), spec.dtype), spec.shape)


def eval_shape(fn, *args, **kwargs):
    """Output ShapeDtype(s) of fn for ShapeDtype (or array) arguments, from shape rules."""
    # An object passed as an argument (a model, a config dict) is state the function
    # reaches too: a partial's bound arguments are roots of pystate's walk.
    passed = [a for a in list(args) + list(kwargs.values())
              if not isinstance(a, (ShapeDtype, np.ndarray))]
    sandbox = _Sandbox(functools.partial(fn, *passed) if passed else fn)

    def conv(a):
        if isinstance(a, ShapeDtype):
            return Variable(_placeholder(a))
        return sandbox.array(a) if type(a) is np.ndarray else a

    args = [conv(a) for a in args]
    kwargs = {k: conv(v) for k, v in kwargs.items()}
    tr = _AbstractTrace()
    prev = core.set_trace(tr)
    try:
        with core.no_grad():
            out = fn(*args, **kwargs)
    finally:
        core.set_trace(prev)
        tr.put_back()
        sandbox.put_back()
    return _specs(out)


class _Sandbox:
    """What eval_shape's function can reach outside its arguments (pystate.locations),
    kept from its writes: arrays there are swapped for copies while it runs (large ones
    made read-only), and afterwards every location holds what it held, each dict there
    (an optimizer's per-parameter buffers, a cache) its items, and the random streams
    their state. Variables' data and .grad are the trace's (_AbstractTrace.put_back)."""

    def __init__(self, fn):
        from tracejit.optimizers import Optimizer
        self.fn = fn
        locs = pystate.locations(fn)
        self.bindings = [(loc, loc.read()) for loc in locs]
        self.names = {_where(loc) for loc in locs}
        self.containers = {id(loc.container) for loc in locs}
        self.dicts, self.frozen, self.streams = [], [], []
        seen = set()
        for loc, val in self.bindings:
            if id(val) in seen:
                continue
            seen.add(id(val))
            dicts = [val] if type(val) is dict else \
                [d for d in vars(val).values() if type(d) is dict] \
                if isinstance(val, Optimizer) else []
            self.dicts += [(d, dict(d)) for d in dicts]
            if isinstance(val, (np.random.Generator, np.random.RandomState, random.Random)):
                self.streams.append((val, _stream_state(val)))
        for loc, val in self.bindings:
            # (An enclosing jit's traced view of its capture too: written through, it
            # would record an effect of the jitted function.)
            if isinstance(val, np.ndarray) and val.dtype != object:
                scratch = self.array(val)
                if scratch is not val:
                    try:
                        loc.write(scratch)
                    except (AttributeError, TypeError):
                        pass
        self.rng, self.py_rng = np.random.get_state(), random.getstate()

    def array(self, a):
        """An array of the caller's the function may update in place: a plain copy to
        use instead, or (large) the array itself, read-only until put_back."""
        if a.nbytes <= _COPY_BYTES:
            return np.ndarray.view(a, np.ndarray).copy()
        if a.flags.writeable:
            a.flags.writeable = False
            self.frozen.append(a)
        return a

    def put_back(self):
        # An attribute or global the function created on an object it found (a lazy
        # layer's, `self.cache = h`): removed, as before the call.
        for loc in pystate.locations(self.fn):
            if loc.kind in ("attr", "global") and id(loc.container) in self.containers \
                    and _where(loc) not in self.names:
                try:
                    if loc.kind == "attr":
                        delattr(loc.container, loc.key)
                    else:
                        del loc.container[loc.key]
                except (AttributeError, TypeError, KeyError):
                    pass
        for loc, val in self.bindings:
            if val is not pystate._MISSING and loc.read() is not val:
                try:
                    loc.write(val)
                except (AttributeError, TypeError):
                    pass
        for d, items in self.dicts:
            if _changed(d, items):
                d.clear()
                d.update(items)
        for a in self.frozen:
            a.flags.writeable = True
        np.random.set_state(self.rng)
        random.setstate(self.py_rng)
        for gen, state in self.streams:
            _set_stream_state(gen, state)


def _where(loc):
    return (loc.kind, id(loc.container), loc.key)


def _changed(d, items):
    # By identity: == on arrays is elementwise.
    return d.keys() != items.keys() or any(d[k] is not v for k, v in items.items())


def _stream_state(gen):
    if isinstance(gen, np.random.Generator):
        return gen.bit_generator.state
    return gen.get_state() if isinstance(gen, np.random.RandomState) else gen.getstate()


def _set_stream_state(gen, state):
    if isinstance(gen, np.random.Generator):
        gen.bit_generator.state = state
    elif isinstance(gen, np.random.RandomState):
        gen.set_state(state)
    else:
        gen.setstate(state)


def _specs(out):
    if isinstance(out, Variable):
        return ShapeDtype(out._data.shape, out._data.dtype)
    if isinstance(out, np.ndarray):
        return ShapeDtype(out.shape, out.dtype)
    if isinstance(out, (tuple, list)):
        return type(out)(_specs(o) for o in out)
    if isinstance(out, dict):
        return {k: _specs(v) for k, v in out.items()}
    return out

