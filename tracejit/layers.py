"""tracejit.layers: Layer (a container of Parameters and sublayers) and Linear.

This sits above the eager core, beside models and optimizers; it is DeZero's
layers module. The JIT needs nothing from it: a Layer's Parameters are Variables
read from outside a jitted function's arguments, so the tracer treats them as live
inputs. Linear draws its weights with the same NumPy calls in the same order as
DeZero, so a seeded program initialises the same weights in both.
"""
import os
import weakref

import numpy as np

import tracejit.functions as F
from tracejit.core import Parameter


def _weak(obj):
    # DeZero keeps weak references to a layer's inputs and outputs. Python scalars
    # cannot be weakly referenced; holding them strongly keeps nothing large alive.
    try:
        return weakref.ref(obj)
    except TypeError:
        return lambda: obj


class Layer:
    """A callable holding Parameters and sublayers, registered by attribute name."""

    def __init__(self):
        # A dict used as an ordered set: parameters come out in the order they were
        # assigned, so every process walks them (and a trace records them) alike.
        # DeZero uses a set, whose order of strings changes with PYTHONHASHSEED.
        self._params = {}

    def __setattr__(self, name, value):
        if isinstance(value, (Parameter, Layer)):
            if "_params" not in self.__dict__:
                raise AttributeError(
                    f"{type(self).__name__}.{name}: call super().__init__() in "
                    f"{type(self).__name__}.__init__ before assigning Parameters or Layers")
            self._params[name] = None
        elif name in self.__dict__.get("_params", ()):
            # Rebinding `self.W = None` unregisters W (DeZero would yield None).
            del self._params[name]
        super().__setattr__(name, value)

    def __delattr__(self, name):
        self._params.pop(name, None)
        super().__delattr__(name)

    def __call__(self, *inputs):
        outputs = self.forward(*inputs)
        if not isinstance(outputs, tuple):
            outputs = (outputs,)
        self.inputs = [_weak(x) for x in inputs]
        self.outputs = [_weak(y) for y in outputs]
        return outputs if len(outputs) > 1 else outputs[0]

    def forward(self, *inputs):
        raise NotImplementedError()

    def params(self):
        """Every Parameter of this layer and its sublayers, depth first."""
        for name in self._params:
            obj = self.__dict__[name]
            if isinstance(obj, Layer):
                yield from obj.params()
            else:
                yield obj

    def cleargrads(self):
        for param in self.params():
            param.cleargrad()

    def to_cpu(self):
        # Parameters are always NumPy arrays already (DeZero moves CuPy ones back).
        return self

    def to_gpu(self):
        from tracejit import cuda
        raise cuda.no_gpu(f"{type(self).__name__}.to_gpu")

    def _flatten_params(self, params_dict, parent_key=""):
        # Keys are attribute paths ("l0/W"), the names save_weights writes.
        for name in self._params:
            obj = self.__dict__[name]
            key = parent_key + "/" + name if parent_key else name
            if isinstance(obj, Layer):
                obj._flatten_params(params_dict, key)
            else:
                params_dict[key] = obj

    def save_weights(self, path):
        """Write every initialised Parameter to an .npz file (np.savez_compressed)."""
        params_dict = {}
        self._flatten_params(params_dict)
        array_dict = {key: param.data for key, param in params_dict.items()
                      if param.data is not None}
        try:
            np.savez_compressed(path, **array_dict)
        except (Exception, KeyboardInterrupt):
            # Do not leave a half-written file that a later load would trust.
            if os.path.exists(path):
                os.remove(path)
            raise

    def load_weights(self, path):
        """Read Parameters saved by save_weights; a missing key raises KeyError."""
        with np.load(path) as npz:
            params_dict = {}
            self._flatten_params(params_dict)
            for key, param in params_dict.items():
                if key not in npz:
                    raise KeyError(f"load_weights: {path} holds no array for parameter "
                                   f"{key!r} (it holds {sorted(npz.files)})")
                param.data = npz[key]


class Linear(Layer):
    """y = x @ W + b. W is created on the first call when in_size is not given."""

    def __init__(self, out_size, nobias=False, dtype=np.float32, in_size=None):
        super().__init__()
        self.in_size = in_size
        self.out_size = out_size
        self.dtype = dtype

        self.W = Parameter(None, name="W")
        if self.in_size is not None:
            self._init_W()

        if nobias:
            self.b = None
        else:
            self.b = Parameter(np.zeros(out_size, dtype=dtype), name="b")

    def _init_W(self, xp=np):
        # DeZero's draw, call for call: randn in float64, cast, then scale. The scale
        # is a Python float so it stays weak: under NumPy 2, DeZero's np.float64 scale
        # promotes W to float64; this keeps `dtype`, as DeZero did under NumPy 1.
        I, O = self.in_size, self.out_size
        W_data = xp.random.randn(I, O).astype(self.dtype) * float(np.sqrt(1 / I))
        self.W.data = W_data

    def forward(self, x):
        # State created during a call (this lazy W) is created eagerly: the JIT
        # starts tracing once it exists.
        if self.W.data is None:
            self.in_size = x.shape[1]
            self._init_W()
        return F.linear(x, self.W, self.b)
