"""tracejit: define-by-run autodiff (DeZero's API) with a tracing JIT to numba."""
from tracejit.core import (Config, Function, Parameter, ShapeDtype, Variable, as_array,
                           as_variable, no_grad, test_mode, using_config)
from tracejit import functions

__version__ = "0.1.0"
from tracejit import layers, models, optimizers, utils, datasets, dataloaders
from tracejit.layers import Layer
from tracejit.models import Model
from tracejit.dataloaders import DataLoader
from tracejit.jit import jit, disable_jit, JitWarning
from tracejit.autodiff import grad, value_and_grad, eval_shape
