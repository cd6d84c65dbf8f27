"""Warnings name the user's line (issue 9, item 4), also for user code whose path
merely starts like the package's (a sibling directory `tracejit_runs/`)."""
import io
import warnings

import numpy as np

import tracejit as tj
from tracejit.trace import record as tracing


def test_a_user_file_beside_the_package_is_the_users_line():
    src = ("def f(x):\n"
           "    y = x * 2.0\n"
           "    print('step', file=out)\n"
           "    return y\n")
    fake = tracing._PKG_DIR + "_runs/train.py"       # /…/tracejit_runs/train.py
    env = {"out": io.StringIO()}
    exec(compile(src, fake, "exec"), env)
    jf = tj.jit(env["f"])
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for k in range(3):
            x = tj.Variable(np.arange(3.0) + k)
            np.testing.assert_allclose(jf(x).data, (np.arange(3.0) + k) * 2.0)
    msgs = [m for m in w if issubclass(m.category, tj.JitWarning)]
    assert msgs, "print() is a side effect: one warning"
    assert all(m.filename == "train.py" for m in msgs), [(m.filename, str(m.message))
                                                          for m in msgs]
    assert msgs[0].lineno == 3 and "train.py:3" in str(msgs[0].message)
