"""Abstract evaluation: run a function on shapes and dtypes alone (eval_shape).

Each primitive applies its shape rule instead of its forward; `.data` has a shape and
a dtype and no value to look at.
"""
import numpy as np

from tracejit import core
from tracejit.core import ShapeDtype, Variable


class _AbstractTrace(core.TraceHooks):
    """Runs a function on shapes alone: each primitive applies its shape rule."""

    abstract = True

    def backward_of(self, fn):
        pass

    def input_grads(self, fn, gys):
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
        # Shapes pass through (Variable(x.data), x.data.shape); a value does not.
        return var._data.view(_ShapeOnly)

    def write_data(self, var, value):
        return value

    def read_grad(self, var):
        return var._grad

    def write_grad(self, var, value):
        pass

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
    def conv(a):
        if isinstance(a, ShapeDtype):
            return Variable(_placeholder(a))
        return a

    args = [conv(a) for a in args]
    kwargs = {k: conv(v) for k, v in kwargs.items()}
    prev = core.set_trace(_AbstractTrace())
    try:
        with core.no_grad():
            out = fn(*args, **kwargs)
    finally:
        core.set_trace(prev)
    return _specs(out)


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

