"""A static argument (an int, a string, a tuple's item, a NumPy integer, a value named in
static_argnums) with a new value at every call makes every call a new signature: warmed
up eagerly and never compiled, or compiled once per value. That storm is warned once,
naming the argument, its type and the call's line, and saying what to pass instead;
the tables it fills stay bounded; a static argument taking a few values compiles
without a warning."""
import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F
from tracejit.runtime import jitted

CASES = {
    # name: (function, static_argnums, the call's other argument for value t, label)
    "int": (lambda x, t: F.sum(x * t), (), lambda t: ((t,), {}), "t"),
    "numpy int": (lambda x, t: F.sum(x * t), (), lambda t: ((np.int64(t),), {}), "t"),
    "string": (lambda x, tag: F.sum(x * len(tag)), (), lambda t: ((f"s{t}",), {}), "tag"),
    "tuple item": (lambda x, cfg: F.sum(x * cfg[1]), (), lambda t: (((2, t),), {}),
                   "cfg[1]"),
    "keyword": (lambda x, step=0: F.sum(x * step), (), lambda t: ((), {"step": t}),
                "step"),
    "static_argnums float": (lambda x, lr: F.sum(x * lr), (1,),
                             lambda t: ((0.5 + t,), {}), "lr"),
}


def _call(jf, fn, make, t):
    x = np.random.randn(3)
    args, kwargs = make(t)
    got = jf(tj.Variable(x), *args, **kwargs)
    want = fn(tj.Variable(x), *args, **kwargs)
    np.testing.assert_allclose(got.data, want.data, rtol=1e-12)


def _storms(seen):
    return [str(w.message) for w in seen if "is static" in str(w.message)]


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_new_static_value_at_every_call_warns_once(case, record_jit_warnings):
    fn, static, make, label = CASES[case]
    jf = tj.jit(fn, static_argnums=static)
    for t in range(jitted._STATIC_STORM + 8):
        _call(jf, fn, make, t)            # the line the warning names
    ws = _storms(record_jit_warnings)
    assert len(ws) == 1, ws
    assert f"argument {label} is static" in ws[0] and "retrace storm" in ws[0]
    assert "_call(jf, fn, make, t)" in ws[0] or "jf(tj.Variable(x)" in ws[0]
    if static:
        assert "static_argnums" in ws[0]


def test_every_value_compiled_once_warns_of_a_compile_storm(record_jit_warnings):
    fn, _, make, _ = CASES["int"]
    jf = tj.jit(fn)
    for t in range(jitted._STATIC_STORM + 1):
        _call(jf, fn, make, t)
        _call(jf, fn, make, t)            # warmed up, then traced and compiled
    ws = _storms(record_jit_warnings)
    assert len(ws) == 1 and "compile storm" in ws[0] and "argument t" in ws[0], ws


@pytest.mark.usefixtures("jit_warnings_are_errors")
def test_a_static_argument_with_a_few_values_compiles_without_a_warning():
    fn, _, make, _ = CASES["int"]
    jf = tj.jit(fn)
    for t in range(60):
        _call(jf, fn, make, t % 4)
    assert jf.cache_info()["hits"] > 0


def test_the_tables_a_storm_fills_stay_bounded(record_jit_warnings):
    jf = tj.jit(lambda x, t: x * t)
    x = np.ones(2)
    for t in range(jitted._MAX_WARM + 100):
        jf(x, t)
    assert len(jf._warm) <= jitted._MAX_WARM
    assert all(len(keys) <= 4 * jitted._IDENTITY_STORM for keys in jf._static_once.d.values())
    assert len(_storms(record_jit_warnings)) == 1
