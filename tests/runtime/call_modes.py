"""Calls in a chosen call mode, jit beside eager: shared by the call-mode and hot-runner
specifications (tests/runtime/)."""
import contextlib

import tracejit as tj
from tracejit.testing.checks import assert_call_matches_eager

MODES = {
    "grad": contextlib.nullcontext,
    "no_grad": tj.no_grad,
    "test": tj.test_mode,
    "off": tj.disable_jit,
    "no_grad+test": lambda: _both(tj.no_grad(), tj.test_mode()),
    "off+no_grad": lambda: _both(tj.disable_jit(), tj.no_grad()),
}


@contextlib.contextmanager
def _both(a, b):
    with a, b:
        yield


def run_both(jf, f, make, mode):
    """The jitted and the eager call on copies of make()'s arguments, in `mode`, compared
    with their gradients; returns the jitted call's result. Without a float Variable
    argument eager still records creators, compiled calls do not (nothing to
    differentiate): older than this change, not compared."""
    return assert_call_matches_eager(jf, f, *make(), context=MODES[mode],
                                     creators="with float arguments", atol=1e-12)
