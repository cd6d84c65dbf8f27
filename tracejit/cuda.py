"""tracejit.cuda: DeZero's cuda module; tracejit runs on the CPU only.

tracejit has no GPU path: its compiled kernels are numba CPU code, and CuPy arrays
are not accepted anywhere. The names exist so DeZero programs written to run on
either device (`xp = cuda.get_array_module(x)`, `if cuda.gpu_enable: model.to_gpu()`)
run unchanged on the CPU; asking for the GPU raises a clear error. This is what
DeZero itself does when CuPy is not installed, except that DeZero fails later, with
a NameError on `cupy`, where this module says why.
"""
import numpy as np

from tracejit.core import Variable

# False always, even with CuPy installed: nothing in tracejit can run on CuPy arrays.
gpu_enable = False

# DeZero binds `cuda.cupy` only when CuPy imports; None says there is none here.
cupy = None


def no_gpu(what):
    """The error every GPU request raises (NotImplementedError, as tracejit's other
    unsupported features)."""
    return NotImplementedError(
        f"{what}: tracejit has no GPU path (tracejit.cuda.gpu_enable is False): arrays "
        f"stay NumPy arrays and compiled code runs on the CPU. Drop the GPU request, or "
        f"guard it with `if tracejit.cuda.gpu_enable:` as DeZero programs do.")


def get_array_module(x):
    """The array module for x (a Variable or an array): always numpy."""
    return np


def as_numpy(x):
    """x (a Variable, a NumPy array or a scalar) as a numpy.ndarray."""
    if isinstance(x, Variable):
        x = x.data
    if np.isscalar(x):
        return np.array(x)
    if isinstance(x, np.ndarray):
        return x
    return np.asarray(x)


def as_cupy(x):
    """DeZero's conversion to a CuPy array; here it raises (there is no GPU path)."""
    raise no_gpu("cuda.as_cupy")
