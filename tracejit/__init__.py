"""tracejit: define-by-run autodiff (DeZero's API) with a tracing JIT to numba kernels.

Eager layer: Variable, Function, the functions in tracejit.functions, layers, models,
optimizers, utils, datasets, dataloaders (DeZero's names and semantics).
JIT layer: jit, grad, value_and_grad, eval_shape, disable_jit (see README and API.md).
"""
from tracejit.core import (Config, Function, Parameter, ShapeDtype, Variable, as_array,
                           as_variable, no_grad, test_mode, using_config)
from tracejit import functions
from tracejit import layers, models, optimizers, utils, datasets, dataloaders
from tracejit.layers import Layer
from tracejit.models import Model
from tracejit.dataloaders import DataLoader
from tracejit.jit import jit, disable_jit, JitWarning
from tracejit.autodiff import grad, value_and_grad, eval_shape

__version__ = "0.1.0"

__all__ = [
    "Config", "Function", "Parameter", "ShapeDtype", "Variable", "as_array", "as_variable",
    "no_grad", "test_mode", "using_config", "functions", "layers", "models", "optimizers",
    "utils", "datasets", "dataloaders", "Layer", "Model", "DataLoader", "jit", "disable_jit",
    "JitWarning", "grad", "value_and_grad", "eval_shape",
]
