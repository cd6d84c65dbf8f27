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
from tracejit.functions_conv import pair
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


# ---------------------------------------------------------------- convolution

class Conv2d(Layer):
    """2-D convolution of NCHW images; W is (out_channels, in_channels, KH, KW).

    With in_channels None, W is created on the first call from x.shape[1]. The draw is
    DeZero's: randn in float64, cast to dtype, times sqrt(1 / (C * KH * KW))."""

    def __init__(self, out_channels, kernel_size, stride=1, pad=0, nobias=False,
                 dtype=np.float32, in_channels=None):
        super().__init__()
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.kernel_size = kernel_size
        self.stride = stride
        self.pad = pad
        self.dtype = dtype

        self.W = Parameter(None, name="W")
        if in_channels is not None:
            self._init_W()

        if nobias:
            self.b = None
        else:
            self.b = Parameter(np.zeros(out_channels, dtype=dtype), name="b")

    def _w_shape(self, C, OC, KH, KW):
        return (OC, C, KH, KW)

    def _init_W(self, xp=np):
        C, OC = self.in_channels, self.out_channels
        KH, KW = pair(self.kernel_size, f"{type(self).__name__}: kernel_size")
        scale = float(np.sqrt(1 / (C * KH * KW)))     # a Python float: keeps dtype
        self.W.data = xp.random.randn(*self._w_shape(C, OC, KH, KW)).astype(self.dtype) \
            * scale

    def _lazy_init(self, x):
        # Created eagerly on the first call, as Linear's W: the JIT traces once it exists.
        if self.W.data is None:
            self.in_channels = x.shape[1]
            self._init_W()

    def forward(self, x):
        self._lazy_init(x)
        return F.conv2d(x, self.W, self.b, self.stride, self.pad)


class Deconv2d(Conv2d):
    """2-D transposed convolution; W is (in_channels, out_channels, KH, KW)."""

    def _w_shape(self, C, OC, KH, KW):
        return (C, OC, KH, KW)

    def forward(self, x):
        self._lazy_init(x)
        return F.deconv2d(x, self.W, self.b, self.stride, self.pad)


# ---------------------------------------------------------------- RNN / LSTM

class RNN(Layer):
    """An Elman RNN: h = tanh(x2h(x) + h2h(h)). The hidden state h carries over calls
    until reset_state(); the first call after a reset has no h2h term."""

    def __init__(self, hidden_size, in_size=None):
        super().__init__()
        self.x2h = Linear(hidden_size, in_size=in_size)
        # h2h maps the hidden state: its input size is hidden_size. (DeZero passes
        # in_size, which only works when in_size is None or equals hidden_size.)
        self.h2h = Linear(hidden_size, in_size=None if in_size is None else hidden_size,
                          nobias=True)
        self.h = None

    def reset_state(self):
        self.h = None

    def forward(self, x):
        if self.h is None:
            h_new = F.tanh(self.x2h(x))
        else:
            h_new = F.tanh(self.x2h(x) + self.h2h(self.h))
        self.h = h_new
        return h_new


class LSTM(Layer):
    """An LSTM cell (DeZero's: four input and four hidden Linears, gates f, i, o and
    the candidate u). State h and c carry over calls until reset_state()."""

    def __init__(self, hidden_size, in_size=None):
        super().__init__()
        H, I = hidden_size, in_size
        self.x2f = Linear(H, in_size=I)
        self.x2i = Linear(H, in_size=I)
        self.x2o = Linear(H, in_size=I)
        self.x2u = Linear(H, in_size=I)
        self.h2f = Linear(H, in_size=H, nobias=True)
        self.h2i = Linear(H, in_size=H, nobias=True)
        self.h2o = Linear(H, in_size=H, nobias=True)
        self.h2u = Linear(H, in_size=H, nobias=True)
        self.reset_state()

    def reset_state(self):
        self.h = None
        self.c = None

    def forward(self, x):
        if self.h is None:
            f = F.sigmoid(self.x2f(x))
            i = F.sigmoid(self.x2i(x))
            o = F.sigmoid(self.x2o(x))
            u = F.tanh(self.x2u(x))
        else:
            f = F.sigmoid(self.x2f(x) + self.h2f(self.h))
            i = F.sigmoid(self.x2i(x) + self.h2i(self.h))
            o = F.sigmoid(self.x2o(x) + self.h2o(self.h))
            u = F.tanh(self.x2u(x) + self.h2u(self.h))

        if self.c is None:
            c_new = i * u
        else:
            c_new = (f * self.c) + (i * u)
        h_new = o * F.tanh(c_new)
        self.h, self.c = h_new, c_new
        return h_new


# ---------------------------------------------------------------- EmbedID / BatchNorm

class EmbedID(Layer):
    """A lookup table: row x of W (in_size, out_size), drawn with randn as DeZero."""

    def __init__(self, in_size, out_size):
        super().__init__()
        self.W = Parameter(np.random.randn(in_size, out_size), name="W")

    def forward(self, x):
        return F.embed_id(x, self.W)


class BatchNorm(Layer):
    """Batch normalization (F.batch_norm) with learned gamma, beta and running
    averages avg_mean, avg_var: updated by every call in train mode, used instead of
    the batch's statistics in test mode (tj.test_mode()). All four are Parameters, so
    save_weights stores them; avg_mean and avg_var never get gradients, so optimizers
    leave them alone. All are created from x.shape[1] and x.dtype on the first call."""

    def __init__(self):
        super().__init__()
        self.avg_mean = Parameter(None, name="avg_mean")
        self.avg_var = Parameter(None, name="avg_var")
        self.gamma = Parameter(None, name="gamma")
        self.beta = Parameter(None, name="beta")

    def _init_params(self, x):
        D = x.shape[1]
        if self.avg_mean.data is None:
            self.avg_mean.data = np.zeros(D, dtype=x.dtype)
        if self.avg_var.data is None:
            self.avg_var.data = np.ones(D, dtype=x.dtype)
        if self.gamma.data is None:
            self.gamma.data = np.ones(D, dtype=x.dtype)
        if self.beta.data is None:
            self.beta.data = np.zeros(D, dtype=x.dtype)

    def forward(self, x):
        if self.avg_mean.data is None:
            self._init_params(x)
        return F.batch_norm(x, self.gamma, self.beta, self.avg_mean.data, self.avg_var.data)
