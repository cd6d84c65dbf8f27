"""Autodiff beyond the eager backward: functional transforms (grad, value_and_grad,
usable eagerly and under jit) and eval_shape (tracejit.trace.abstract). The backward of
a traced region is tracejit.trace.backward.

grad collects gradients aside (DictGrads) instead of in `.grad`, so transforming a
function never touches the `.grad` of captured Parameters. The backward is built with
create_graph, so grad(grad(f)) works, and under jit the whole thing is one trace.

A Variable argument is differentiated through a new Variable that is, for any outer
pass (an enclosing grad, or the user's `backward(create_graph=True)` on the result),
the output of an identity node on the argument, and for the inner pass a leaf: the
inner backward stops there (it neither walks the outer graph nor fills the argument's
`.grad`), the outer one goes through it to the argument, so higher derivatives are
those of the mathematical function.
"""
import numpy as np

from tracejit import core
from tracejit.core import DictGrads, Variable, backprop
from tracejit.ops.arrayops import Reshape
from tracejit.trace import pystate
from tracejit.trace.abstract import eval_shape


def _as_diff_variable(x):
    tr = core.active_trace()
    if isinstance(x, Variable):
        # Reshape to its own shape: a primitive identity (backward: the gradient as
        # it is) that eager, the tracer and every backend know. Under no_grad it
        # records no creator and the result is a plain leaf, as DeZero's would be.
        return Reshape(x.shape)(x)
    if isinstance(x, core.ScalarTracer):
        if tr is not None and x._trace is tr:
            # A float argument (or a number computed from traced data) under jit: a
            # traced 0-d float64 leaf, as eager makes Variable(np.asarray(x, float64)).
            return tr.scalar_var(x)
        x = x._value        # left over from another trace: the number it is
    if isinstance(x, (float, int, np.generic)):
        return Variable(np.asarray(x, dtype=np.result_type(x, np.float64)))
    if tr is not None and isinstance(x, np.ndarray) and getattr(x, "_numpy_scalar", False):
        # Traced data standing for a NumPy scalar (an np.float32 argument, x.data.sum()):
        # eager's leaf above, a cast of it.
        return Variable(x.astype(np.result_type(x.dtype, np.float64)))
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
        # While fn runs and the inner backward walks, the new Variables are leaves
        # (a backward inside fn stops there too, as at eager's leaf); the identity
        # nodes are put back for the outer passes afterwards.
        links = [(x, x.creator) for x in xs]
        for x in xs:
            x.creator = None
        try:
            y, gs = _inner(fn, nums, xs, args, kwargs)
        finally:
            for x, c in links:
                x.creator = c
        return y, (gs[0] if single else tuple(gs))

    value_and_grad_fn.__name__ = f"value_and_grad_{pystate.probe(fn, '__name__', 'f')}"
    value_and_grad_fn._tracejit_wrapper = True     # pystate: look through to fn
    return value_and_grad_fn


def _inner(fn, nums, xs, args, kwargs):
    f = fn
    if core.active_trace() is not None:
        # Under jit: float()/int() in the differentiated function's own code give
        # traced numbers, as in a jitted function's (one guard per outcome).
        from tracejit.trace.record import symbolic_scalars
        f = symbolic_scalars(fn)
    with core.using_config("enable_backprop", True):
        y = f(*args, **kwargs)
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
    return y, gs


def grad(fn, argnums=0):
    vg = value_and_grad(fn, argnums)

    def grad_fn(*args, **kwargs):
        return vg(*args, **kwargs)[1]

    grad_fn.__name__ = f"grad_{pystate.probe(fn, '__name__', 'f')}"
    grad_fn._tracejit_wrapper = True
    return grad_fn

__all__ = ["grad", "value_and_grad", "eval_shape"]
