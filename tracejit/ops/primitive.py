"""The primitive registry and the base of elementwise primitives.

A primitive is a Function subclass registered here: its eager forward, its backward
(written with tracejit.functions, so it traces), its shape rule, its kind and, for
elementwise ops, the scalar expression code generation emits. The primitives live in
elementwise.py and arrayops.py; tracejit.functions re-exports them with the functions
users call.
"""
import functools

import numpy as np

from tracejit.core import ELEMENTWISE, Function, ShapeDtype

PRIMITIVES = {}


def primitive(cls):
    """Register a Function subclass as a primitive (name -> class)."""
    PRIMITIVES[cls.__name__] = cls
    return cls


@functools.lru_cache(maxsize=None)
def probe_dtype(cls, params, dtypes):
    # The result dtype NumPy gives for these input dtypes, found by running forward
    # on one-element arrays: the rule then matches eager exactly, int inputs included.
    fn = cls(*params)
    xs = [np.ones((1,), d) for d in dtypes]
    with np.errstate(all="ignore"):
        return np.asarray(fn.forward(*xs)).dtype


def broadcast_shape(name, specs):
    try:
        return np.broadcast_shapes(*[s.shape for s in specs])
    except ValueError:
        shapes = " and ".join(f"x{i} has shape {s.shape}" for i, s in enumerate(specs))
        raise ValueError(f"{name}: operands cannot be broadcast together: {shapes}") from None


class Elementwise(Function):
    """Base of elementwise primitives: broadcasting shape rule, NumPy's dtype."""

    kind = ELEMENTWISE

    def shape_rule(self, *specs):
        shape = broadcast_shape(type(self).__name__.lower(), specs)
        dtype = probe_dtype(type(self), self.param_values(), tuple(s.dtype for s in specs))
        return ShapeDtype(shape, dtype)


def sum_to_shape(gx, shape):
    """A backward rule's gradient gx brought to its input's shape: summed over the axes
    the forward broadcast. A gx smaller than the shape (an output gradient the user set
    with another shape, `y.grad = Variable(np.array(1.5))` into a (2,) output) stands for
    the same value everywhere: broadcast. DeZero returns it unchanged, so the input's
    gradient took its shape."""
    if gx.shape != shape:
        from tracejit.functions import broadcast_to, sum_to
        if len(gx.shape) <= len(shape) and np.broadcast_shapes(gx.shape, shape) == shape:
            return broadcast_to(gx, shape)
        return sum_to(gx, shape)
    return gx

def differentiable(x):
    return x.dtype.kind in "fc"
