"""Every JitWarning names the user's line, file:line, in its text and as the warning's
location: the line in the function where the cause happened, else the function's def
line (never "at None", never a tracejit file), also for user code whose path merely
starts like the package's (a sibling directory `tracejit_runs/`)."""
import io
import os
import random
import warnings

import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F
from tracejit import Parameter, Variable
from tracejit.trace import record as tracing

from marked_lines import marked_line

HERE = os.path.basename(__file__)


def _line(marker):
    return marked_line(__file__, marker)


def _def_line(fn):
    return fn.__code__.co_firstlineno


def _calls(jf, fn, make, n=4):
    """n calls of jf and eager fn with new values, compared; the JitWarnings seen."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for k in range(n):
            got = jf(*make(k))
            want = fn(*make(k))
            np.testing.assert_allclose(np.asarray(getattr(got, "data", got)),
                                       np.asarray(getattr(want, "data", want)), rtol=1e-12)
    return [w for w in seen if issubclass(w.category, tj.JitWarning)]


def _names(ws, line, what):
    assert ws, f"no JitWarning for {what}"
    for w in ws:
        text = str(w.message)
        assert "at None" not in text, text
        assert f"{HERE}:{line}" in text, (what, text)
        assert os.path.basename(w.filename) == HERE and w.lineno == line, \
            (what, w.filename, w.lineno, text)


def _vec(k):
    return (Variable(np.linspace(0.1, 1.0, 4) + k),)


def test_a_list_appended_to_names_the_append_line():
    log = []

    def f(x):
        log.append(x.data.sum())  # <append>
        return x * 2.0

    _names(_calls(tj.jit(f), f, _vec), _line("append"), "append")


def test_print_names_its_line():
    def f(x):
        print("tracing", end="\r")  # <print>
        return x * 2.0

    _names(_calls(tj.jit(f), f, _vec), _line("print"), "print")


def test_a_python_value_in_a_dict_the_function_changes_names_the_store_line():
    cfg = {"k": 1.0}

    def f(x):
        cfg["k"] = cfg["k"] + 1.0  # <dictstore>
        return x * 2.0

    jf = tj.jit(f)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for k in range(4):
            jf(*_vec(k))
    _names([w for w in seen if issubclass(w.category, tj.JitWarning)], _line("dictstore"),
           "dict value")


def test_an_escape_names_its_line():
    def f(x):
        s = sum(x.data.tolist())  # <tolist>
        return x * s

    _names(_calls(tj.jit(f), f, _vec), _line("tolist"), "tolist")


def test_a_seeded_draw_from_pythons_random_names_the_seed_line():
    def f(x):
        random.seed(3)  # <pyseed>
        return x * random.random()

    _names(_calls(tj.jit(f), f, _vec), _line("pyseed"), "random.seed")


def test_a_draw_from_pythons_random_names_the_draw_line():
    def f(x):
        return x * (1.0 + 0.0 * random.random())  # the draw, not its value  # <pydraw>

    _names(_calls(tj.jit(f), f, _vec), _line("pydraw"), "random")


def test_an_untracked_numpy_draw_names_the_draw_line():
    def f(x):
        np.random.seed(1)
        return x * np.random.rand(4)  # <npdraw>

    _names(_calls(tj.jit(f), f, _vec), _line("npdraw"), "np.random.rand")


def test_max_variants_names_the_guard_that_keeps_changing():
    def f(x):
        y = x
        while y.data.sum() < 50:  # <loop>
            y = y * 2.0
        return y

    jf = tj.jit(f, max_variants=2)
    ws = _calls(jf, f, lambda k: (Variable(np.array([0.5 + 3 ** k])),), n=6)
    _names(ws, _line("loop"), "max_variants")


def test_a_value_frozen_out_of_the_tracers_sight_names_the_def_line(tmp_path):
    # A value kept in a file: the tracer does not look there (pystate guards what
    # Python objects hold, also in sets, C containers and C fields, not files).
    held = tmp_path / "k.txt"

    def f(x):
        print("step", end="\r")     # a side effect: no perturbation check, the first-call
        k = float(held.read_text())  # check sees the frozen array
        return x * (np.ones(4) * k)

    jf = tj.jit(f)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for k in range(4):
            held.write_text(repr(1.0 + k))
            got, want = jf(*_vec(k)), f(*_vec(k))
            np.testing.assert_allclose(got.data, want.data, rtol=1e-12)
    ws = [w for w in seen if "differs from eager" in str(w.message)]
    _names(ws, _def_line(f), "check mismatch")


def test_a_failing_compiled_variant_names_the_def_line(monkeypatch):
    def f(x):
        return F.sum(F.tanh(x) * 2.0)

    jf = tj.jit(f)
    for k in range(3):
        jf(*_vec(k))
    v = next(iter(jf._variants.values()))[0]

    def broken(leaves):
        raise RuntimeError("simulated failure")

    monkeypatch.setattr(v, "runner", broken)
    ws = _calls(jf, f, _vec, n=2)
    _names(ws, _def_line(f), "compiled variant raised")


def test_views_of_one_buffer_name_the_def_line():
    buf = np.arange(6.0)
    p, q = Parameter(buf[0:4]), Parameter(buf[2:6])

    def f(s):
        p.data -= s.data
        return q * 2.0

    jf = tj.jit(f)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for k in range(5):
            jf(Variable(np.array(1.0 + k)))
    ws = [w for w in seen if "shares memory" in str(w.message)]
    _names(ws, _def_line(f), "alias")


def test_a_backend_failure_names_the_def_line(monkeypatch):
    from tracejit.backends import numba as codegen

    def f(x):
        return F.sum(F.exp(x) * 3.0)

    def boom(*a, **k):
        raise RuntimeError("simulated codegen failure")

    monkeypatch.setattr(codegen, "compile", boom)
    ws = _calls(tj.jit(f, backend="auto"), f, _vec)
    _names([w for w in ws if "numba backend failed" in str(w.message)], _def_line(f),
           "backend failure")


def test_every_warning_site_goes_through_warn_at():
    # A new warnings.warn in tracejit would name no user line: this lists them all.
    import re
    root = os.path.dirname(tj.__file__)
    sites = []
    for dirpath, _, files in os.walk(root):
        for name in files:
            if name.endswith(".py"):
                with open(os.path.join(dirpath, name)) as fh:
                    for i, text in enumerate(fh, 1):
                        if re.search(r"warnings\.warn(_explicit)?\(", text):
                            sites.append((name, i))
    # jitted.py: warn_at. background.py: the opt-in background compiler's own self-check
    # (a kernel that disagrees with its NumPy reference), shown at the user's frame.
    assert sorted(name for name, _ in sites) == ["background.py", "jitted.py", "jitted.py"], \
        sites


@pytest.mark.parametrize("seed", [None, "abc"])
def test_an_unreplayable_seed_names_its_line(seed):
    def f(x):
        np.random.seed(seed)  # <seed>
        return F.dropout(x, 0.5)

    jf = tj.jit(f)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for k in range(3):
            try:
                jf(*_vec(k))
            except (TypeError, ValueError):
                pass          # NumPy's own error for a bad seed, as eager raises
    ws = [w for w in seen if issubclass(w.category, tj.JitWarning)]
    if seed is None:
        _names(ws, _line("seed"), "seed(None)")


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
