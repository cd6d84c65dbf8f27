"""The trace reports the user's effects only, at the user's line.

While a trace runs, print() and repr()/str()/format() of traced data are hooked
process-wide. An op's forward runs on the traced call's data, so code the machinery
calls runs under the hooks too: numba, compiling an op's kernel (the conv kernels for a
new dtype) and writing its cache, prints its type annotations into a StringIO. That is
not the user's print: no warning, and the checks a side effect turns off (the
perturbation check against frozen values) stay on. A print the user's code makes
through a library (dis.dis, traceback.print_stack) is the user's, named at the user's
line, not the library's.
"""
import dis
import io
import os
import re

import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F
from tracejit.ops.elementwise import Tanh
from tracejit.testing import assert_jit_matches_eager


def _noop():
    return None


# An op's forward that prints through a library, as numba does when it compiles: the
# forward is compiled in the op's own module (the machinery's code).
_FORWARD = '''
def forward(self, x):
    dis.dis(_noop, file=io.StringIO())
    return _original(self, x)
'''


@pytest.fixture
def printing_tanh(monkeypatch):
    ns = {"__name__": Tanh.__module__, "dis": dis, "io": io, "_noop": _noop,
          "_original": Tanh.forward}
    exec(compile(_FORWARD, Tanh.__module__.replace(".", os.sep) + ".py", "exec"), ns)
    monkeypatch.setattr(Tanh, "forward", ns["forward"])


@pytest.mark.usefixtures("jit_warnings_are_errors", "printing_tanh")
def test_a_print_inside_an_ops_forward_is_not_the_users():
    rng = np.random.default_rng(0)
    W = tj.Parameter(rng.standard_normal(4))

    def f(x):
        return F.sum(F.tanh(x) * W)

    def make_args(i):
        W.data = W.data + 0.25 * i                  # the captured weight mutated
        return (tj.Variable(rng.standard_normal(4)),)
    info = assert_jit_matches_eager(f, make_args=make_args, calls=4)
    assert info["fallbacks"] == 0


def test_a_print_through_a_library_is_the_users_at_the_users_line(record_jit_warnings):
    rng = np.random.default_rng(1)
    out = io.StringIO()

    def f(x):
        dis.dis(_noop, file=out)                    # print() inside the standard library
        return F.tanh(x) * 2.0

    jf = tj.jit(f)
    for _ in range(4):
        x = rng.standard_normal(3)
        np.testing.assert_allclose(jf(tj.Variable(x)).data, f(tj.Variable(x)).data, rtol=1e-12)
    msgs = [str(w.message) for w in record_jit_warnings]
    assert len(msgs) == 1, msgs
    assert re.search(r"print\(\) runs only while tracing.*at "
                     r"test_side_effects_are_the_users\.py:\d+  dis\.dis\(_noop", msgs[0]), msgs


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_a_change_stored_in_either_branch_is_named_at_the_branch_that_ran(
        sign, record_jit_warnings):
    # Two statements store to one place, one per side of an `if` on traced data: the
    # warning names the one the traced call ran (it named the first in the source).
    log = []

    def f(x):
        if x.data.sum() > 0:
            log.append("positive")
        else:
            log.append("negative")
        return x * 2.0

    jf = tj.jit(f)
    for _ in range(3):
        x = np.abs(np.random.default_rng(2).standard_normal(3)) * sign
        np.testing.assert_allclose(jf(tj.Variable(x)).data, x * 2.0)
    msgs = [str(w.message) for w in record_jit_warnings]
    ran = "positive" if sign > 0 else "negative"
    assert msgs and all(f'log.append("{ran}")' in m for m in msgs), msgs
