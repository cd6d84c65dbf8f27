"""Functional transforms: grad, value_and_grad (usable eagerly and under jit), eval_shape.

grad collects gradients aside (DictGrads) instead of in `.grad`, so transforming a
function never touches the `.grad` of captured Parameters. The backward is built with
create_graph, so grad(grad(f)) works, and under jit the whole thing is one trace.
"""
import numpy as np

from tracejit import core
from tracejit.core import DictGrads, ShapeDtype, Variable, backprop


def _as_diff_variable(x):
    tr = core.active_trace()
    if isinstance(x, Variable):
        return Variable(x.data)   # a fresh leaf: the user's Variable keeps its .grad
    if isinstance(x, float) and tr is not None and hasattr(x, "_tv"):
        return tr.scalar_var(x)
    if isinstance(x, (float, int, np.generic)):
        return Variable(np.asarray(x, dtype=np.result_type(x, np.float64)))
    if isinstance(x, np.ndarray):
        return Variable(x)
    raise TypeError(f"grad: cannot differentiate with respect to a {type(x).__name__}")


def value_and_grad(fn, argnums=0):
    """f -> (x... -> (f(x...), df/dx[argnums])); f must return a scalar Variable."""
    single = isinstance(argnums, int)
    nums = (argnums,) if single else tuple(argnums)

    def value_and_grad_fn(*args, **kwargs):
        args = list(args)
        for i in nums:
            if i >= len(args):
                raise TypeError(f"grad: argnums {i} but the function got {len(args)} "
                                f"positional arguments")
        xs = [_as_diff_variable(args[i]) for i in nums]
        for i, x in zip(nums, xs):
            args[i] = x
        with core.using_config("enable_backprop", True):
            y = fn(*args, **kwargs)
        if not isinstance(y, Variable):
            raise TypeError(f"grad: the function must return a Variable, got "
                            f"{type(y).__name__}")
        if y.size != 1:
            raise ValueError(f"grad: the function must return a scalar, got shape {y.shape}")
        grads = DictGrads()
        grads.set(y, Variable(np.ones(y.shape, y.dtype)))
        backprop([y], create_graph=core.Config.enable_backprop, grads=grads)
        gs = []
        for x in xs:
            g = grads.get(x)
            gs.append(g if g is not None else Variable(np.zeros(x.shape, x.dtype)))
        return y, (gs[0] if single else tuple(gs))

    value_and_grad_fn.__name__ = f"value_and_grad_{getattr(fn, '__name__', 'f')}"
    return value_and_grad_fn


def grad(fn, argnums=0):
    vg = value_and_grad(fn, argnums)

    def grad_fn(*args, **kwargs):
        return vg(*args, **kwargs)[1]

    grad_fn.__name__ = f"grad_{getattr(fn, '__name__', 'f')}"
    return grad_fn


class _AbstractTrace:
    """Runs a function on shapes alone: each primitive applies its shape rule."""

    abstract = True

    def backward_of(self, fn):
        pass

    def call(self, fn, inputs):
        from tracejit.tracing import user_line
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


class _ShapeOnly(np.ndarray):
    """`.data` under eval_shape: it has a shape and dtype, and no value to look at."""

    def _no_value(self, *args):
        from tracejit.tracing import user_line
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
    prev = core._state.trace
    core._state.trace = _AbstractTrace()
    try:
        with core.no_grad():
            out = fn(*args, **kwargs)
    finally:
        core._state.trace = prev
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
