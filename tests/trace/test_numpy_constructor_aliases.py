"""np.asarray reached under another name (`from numpy import asarray`, bound before the
trace) is NumPy's asarray of traced data like np.asarray: recorded, or an escape. (They
were swapped as attributes of the numpy module only, so the alias handed out a plain
array of the traced buffer and a branch on it was frozen: silently wrong once the branch
flipped after the first-call check.) The alias is restored after the trace."""
import threading
import warnings
from numpy import asarray as bound_asarray

import _np_alias_helpers as h

import numpy as np
import tracejit as tj
import tracejit.functions as F


def flip_late(n=8):
    rng = np.random.default_rng(0)
    return [(1.0 if i < 5 else -1.0) * (np.abs(rng.standard_normal(3)) + .1)
            for i in range(n)]


def test_asarray_imported_by_name_is_not_frozen():
    def f(x):
        return F.sum(x) * (2.0 if bound_asarray(x.data).sum() > 0 else -3.0)

    jf = tj.jit(f)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tj.JitWarning)   # an escape may fall back, warned
        for d in flip_late():
            want = f(tj.Variable(d.copy()))
            got = jf(tj.Variable(d.copy()))
            np.testing.assert_allclose(got.data, want.data, rtol=1e-12)
    assert jf.cache_info()["hits"] >= 3
    assert bound_asarray is np.asarray and globals()["bound_asarray"] is np.asarray


def test_alias_in_a_helper_module_and_threads_see_numpy():
    def f(x):
        return F.sum(x) * h.scale(x.data)

    jf = tj.jit(f)
    stop, seen = [], []

    def other():                     # another thread's calls of the alias during traces
        a = np.arange(3.0)
        while not stop:
            seen.append(h.positive(a) and h.bound(a) is a)

    t = threading.Thread(target=other)
    t.start()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", tj.JitWarning)
            for d in flip_late():
                want = f(tj.Variable(d.copy()))
                got = jf(tj.Variable(d.copy()))
                np.testing.assert_allclose(got.data, want.data, rtol=1e-12)
    finally:
        stop.append(1)
        t.join()
    assert seen and all(seen)
    assert h.bound is np.asarray
