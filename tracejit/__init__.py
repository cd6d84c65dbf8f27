"""tracejit: define-by-run autodiff (DeZero's API) with a tracing JIT to numba kernels.

Eager layer: Variable, Function, the functions in tracejit.functions, layers, models,
optimizers, utils, datasets, dataloaders (DeZero's names and semantics).
JIT layer: jit, grad, value_and_grad, eval_shape, disable_jit (see README and API.md).
"""
from tracejit.core import (Config, Function, Parameter, ShapeDtype, Variable, as_array,
                           as_variable, no_grad, test_mode, using_config)
from tracejit import functions
from tracejit.functions import _setup_variable as setup_variable
from tracejit import layers, models, optimizers, utils, datasets, dataloaders
from tracejit import cuda, transforms, core_simple
from tracejit.layers import Layer
from tracejit.models import Model
from tracejit.datasets import Dataset
from tracejit.dataloaders import DataLoader, SeqDataLoader
from tracejit.runtime.jitted import jit, disable_jit, JitWarning
from tracejit.autodiff import grad, value_and_grad, eval_shape
from tracejit.exporting import Exported, ExportError, export, load

# DeZero's switch between its two cores, set by editing dezero/__init__.py. tracejit
# always exports the full core; the simple one is tracejit.core_simple, which the
# book's step 28/29 scripts import when this is False.
is_simple_core = False

__version__ = "0.1.0"

__all__ = [
    "Config", "Function", "Parameter", "ShapeDtype", "Variable", "as_array", "as_variable",
    "no_grad", "test_mode", "using_config", "functions", "layers", "models", "optimizers",
    "utils", "datasets", "dataloaders", "Layer", "Model", "DataLoader", "jit", "disable_jit",
    "JitWarning", "grad", "value_and_grad", "eval_shape", "cuda", "transforms", "core_simple",
    "Dataset", "SeqDataLoader", "setup_variable", "is_simple_core", "export", "load",
    "Exported", "ExportError",
]
