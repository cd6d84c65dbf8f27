"""cache_info() at its edges (issue 9, item 4): calls == hits + misses + fallbacks
exactly, also for a call that raises inside the first-call check against eager; and
that check is still made on a later call."""
import numpy as np
import pytest

import tracejit as tj

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")


def test_a_call_that_raises_during_the_first_call_check_is_counted_and_keeps_the_check():
    # The variant's first call runs eager beside it; when eager raises, the call is
    # counted (calls == hits + misses + fallbacks) and the check is still owed.
    def f(x):
        m = float(x.data.mean())
        if m > 3:
            raise ValueError("too big")
        return x * (2.0 if m > 0 else 1.0)

    jf = tj.jit(f)
    n = 0
    for d in (1.0, 1.5, 10.0, 2.0, 2.5, 20.0, -1.0, -2.0, -3.0):
        n += 1
        x = tj.Variable(np.full(3, d))
        if d > 3:
            with pytest.raises(ValueError):
                jf(x)
        else:
            np.testing.assert_allclose(jf(x).data, f(tj.Variable(np.full(3, d))).data)
        info = jf.cache_info()
        assert info["calls"] == n == info["hits"] + info["misses"] + info["fallbacks"], info
    assert all(v.checks_left == 0 for vs in jf._variants.values() for v in vs)
