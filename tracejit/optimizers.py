"""tracejit.optimizers: DeZero's optimizers and gradient hooks.

Updates are in place on `param.data` (`param.data -= lr * param.grad.data`), exactly
as DeZero writes them: under the JIT, Parameters are live inputs and these writes
are recorded as assignments and replayed, so a whole training step compiles. Keep
them in place; rebinding a fresh array would look the same in eager mode but would
break code that holds on to `param.data`. Per-parameter state (momentum, squared
gradient sums) lives in dicts keyed by id(param), as in DeZero, and is created on
the first update, which runs eagerly.
"""
import math

import numpy as np

from tracejit.core import Variable

from tracejit.core import Parameter


class Optimizer:
    def __init__(self):
        self.target = None
        self.hooks = []

    def setup(self, target):
        self.target = target
        return self

    def update(self):
        params = [p for p in self.target.params() if p.grad is not None]
        for f in self.hooks:
            f(params)
        for param in params:
            # A hook may drop a gradient (FreezeParam); DeZero would crash on it here.
            if param.grad is not None:
                self.update_one(param)

    def update_one(self, param):
        raise NotImplementedError()

    def add_hook(self, f):
        """f(params) runs before each update with the parameters that have gradients."""
        self.hooks.append(f)


# ---------------------------------------------------------------- hooks

class WeightDecay:
    """L2 regularisation: grad += rate * param."""

    def __init__(self, rate):
        self.rate = rate

    def __call__(self, params):
        for param in params:
            param.grad.data += self.rate * param.data


class ClipGrad:
    """Scale all gradients down when their global L2 norm exceeds max_norm."""

    def __init__(self, max_norm):
        self.max_norm = max_norm

    def __call__(self, params):
        total_norm = 0
        for param in params:
            total_norm += (param.grad.data ** 2).sum()
        total_norm = math.sqrt(float(total_norm))
        rate = self.max_norm / (total_norm + 1e-6)
        if rate < 1:
            for param in params:
                param.grad.data *= rate


class FreezeParam:
    """Drop the gradients of the given layers or Parameters so they are not updated."""

    def __init__(self, *layers):
        self.freeze_params = []
        for layer in layers:
            if isinstance(layer, Parameter):
                self.freeze_params.append(layer)
            else:
                for p in layer.params():
                    self.freeze_params.append(p)

    def __call__(self, params):
        for p in self.freeze_params:
            p.grad = None


# ---------------------------------------------------------------- optimizers

class SGD(Optimizer):
    def __init__(self, lr=0.01):
        super().__init__()
        self.lr = lr

    def update_one(self, param):
        param.data -= self.lr * param.grad.data


def _state_buffer(store, param):
    """The optimizer's per-parameter buffer, a Variable keyed by id(param) (as DeZero).

    A Variable rather than a bare ndarray so that every read and in-place update goes
    through `.data`, which the tracer records: NumPy on a bare buffer (`np.sqrt(v)`)
    is invisible to it and would be frozen into a compiled step.
    """
    buf = store.get(id(param))
    if buf is None:
        buf = store[id(param)] = Variable(np.zeros_like(param._data))
    return buf


class MomentumSGD(Optimizer):
    def __init__(self, lr=0.01, momentum=0.9):
        super().__init__()
        self.lr = lr
        self.momentum = momentum
        self.vs = {}

    def update_one(self, param):
        v = _state_buffer(self.vs, param)
        v.data *= self.momentum
        v.data -= self.lr * param.grad.data
        param.data += v.data


class AdaGrad(Optimizer):
    def __init__(self, lr=0.001, eps=1e-8):
        super().__init__()
        self.lr = lr
        self.eps = eps
        self.hs = {}

    def update_one(self, param):
        lr = self.lr
        eps = self.eps
        grad = param.grad.data
        h = _state_buffer(self.hs, param)
        h.data += grad * grad
        param.data -= lr * grad / (np.sqrt(h.data) + eps)


class AdaDelta(Optimizer):
    def __init__(self, rho=0.95, eps=1e-6):
        super().__init__()
        self.rho = rho
        self.eps = eps
        self.msg = {}
        self.msdx = {}

    def update_one(self, param):
        msg = _state_buffer(self.msg, param)
        msdx = _state_buffer(self.msdx, param)
        rho = self.rho
        eps = self.eps
        grad = param.grad.data
        msg.data *= rho
        msg.data += (1 - rho) * grad * grad
        dx = np.sqrt((msdx.data + eps) / (msg.data + eps)) * grad
        msdx.data *= rho
        msdx.data += (1 - rho) * dx * dx
        param.data -= dx


class Adam(Optimizer):
    def __init__(self, alpha=0.001, beta1=0.9, beta2=0.999, eps=1e-8):
        super().__init__()
        # The step count is an array Variable, not a Python int: under jit its
        # increment and the bias correction are recorded, so a compiled training
        # step advances it (a Python int would be frozen at its trace-time value).
        self._step = Variable(np.zeros((), dtype=np.float64), name="adam_t")
        self.alpha = alpha
        self.beta1 = beta1
        self.beta2 = beta2
        self.eps = eps
        self.ms = {}
        self.vs = {}

    @property
    def t(self):
        return int(self._step._data)

    @t.setter
    def t(self, value):
        self._step._data[...] = value

    def update(self, *args, **kwargs):
        self._step.data += 1
        super().update(*args, **kwargs)

    @property
    def lr(self):
        # Bias correction folded into the step size (Kingma & Ba, section 2).
        t = self._step.data
        fix1 = 1. - self.beta1 ** t
        fix2 = 1. - self.beta2 ** t
        return self.alpha * np.sqrt(fix2) / fix1

    def update_one(self, param):
        m = _state_buffer(self.ms, param)
        v = _state_buffer(self.vs, param)
        beta1, beta2, eps = self.beta1, self.beta2, self.eps
        grad = param.grad.data
        m.data += (1 - beta1) * (grad - m.data)
        v.data += (1 - beta2) * (grad * grad - v.data)
        param.data -= self.lr * m.data / (np.sqrt(v.data) + eps)
