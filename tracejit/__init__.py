"""tracejit: define-by-run autodiff (DeZero's API) with a tracing JIT to numba."""
from tracejit.core import (Config, Function, Parameter, ShapeDtype, Variable, as_array,
                           as_variable, no_grad, test_mode, using_config)
from tracejit import functions

__version__ = "0.1.0"
