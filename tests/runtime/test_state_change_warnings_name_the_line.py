"""A change of Python state that tracejit sees only by comparing state after the trace
(a list that grows, an attribute or dict entry rebound, a draw from Python's or
NumPy's global random stream) is warned about at the user's line that made it, as
file:line in the text and as the warning's location: the statement that stores to
that attribute or item, appends to that list or draws, also in a helper the function
calls; not the function's def line. The calls still give eager's results (and, where
they run eagerly, eager's state)."""
import os
import random
import warnings
from random import random as draw

import numpy as np

import tracejit as tj
from tracejit import Layer, Variable

from marked_lines import marked_line

HERE = os.path.basename(__file__)


def _line(marker):
    return marked_line(__file__, marker)


def _vec(k):
    return Variable(np.linspace(0.1, 1.0, 4) + k)


def _run(make, n=4, args=lambda k, state: (_vec(k),), same_state=True):
    """make() -> (state, fn), twice: one jitted, one eager, each with its own state; n
    calls of each with new values, results (and the state after, same_state) compared;
    the JitWarnings seen."""
    jstate, jfn = make()
    estate, efn = make()
    jf = tj.jit(jfn)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for k in range(n):
            got = jf(*args(k, jstate))
            want = efn(*args(k, estate))
            np.testing.assert_allclose(got.data, want.data, rtol=1e-12)
            if same_state:
                assert repr(vars(jstate) if hasattr(jstate, "__dict__") else jstate) == \
                    repr(vars(estate) if hasattr(estate, "__dict__") else estate)
    return [w for w in seen if issubclass(w.category, tj.JitWarning)]


def _names(ws, marker, what):
    line = _line(marker)
    assert ws, f"no JitWarning for {what}"
    for w in ws:
        text = str(w.message)
        assert f"{HERE}:{line}" in text, (what, text)
        assert os.path.basename(w.filename) == HERE and w.lineno == line, \
            (what, w.filename, w.lineno, text)


class _Cfg:
    def __init__(self):
        self.lr = 0.5


def test_a_list_appended_to_names_the_append_line():
    def make():
        log = []

        def f(x):
            y = x * 2.0
            log.append(float(x.data.sum()))  # <append>
            return y + 1.0
        return log, f

    # (The append runs while tracing only: the lists differ, as the warning says.)
    _names(_run(make, same_state=False), "append", "append")


def test_an_attribute_rebound_names_the_store_line():
    def make():
        cfg = _Cfg()

        def f(x):
            y = x * cfg.lr
            cfg.lr = cfg.lr * 0.5  # <attr>
            return y
        return cfg, f

    _names(_run(make), "attr", "attribute")


def test_a_dict_entry_rebound_names_the_store_line():
    def make():
        d = {"k": 1, "other": 3}

        def f(x):
            y = x * float(d["k"])
            d["other"] = 3
            d["k"] += 1  # <item>
            return y
        return d, f

    _names(_run(make), "item", "dict entry")


def test_a_store_to_the_same_attribute_of_another_object_is_not_named():
    def make():
        cfg, other = _Cfg(), _Cfg()

        def f(x):
            other.lr = 0.5          # (the same value: no change)
            y = x * 3.0
            cfg.lr = cfg.lr + 1.0  # <the-object>
            return y
        return cfg, f

    _names(_run(make), "the-object", "attribute of the object that changed")


def test_a_draw_from_pythons_random_names_the_draw_line():
    def make():
        def f(x):
            y = x * 2.0
            r = random.random()  # <pydraw>
            return y + 0.0 * r
        return {}, f

    _names(_run(make, same_state=False), "pydraw", "random.random()")


def test_a_draw_imported_from_random_names_the_draw_line():
    def make():
        def f(x):
            y = x * 2.0
            return y * (1.0 + 0.0 * draw())  # <imported-draw>
        return {}, f

    _names(_run(make, same_state=False), "imported-draw", "from random import random")


def test_an_untracked_numpy_draw_names_the_draw_line():
    def make():
        def f(x):
            y = x * 2.0
            z = np.random.rand(4)  # <npdraw>
            return y + 0.0 * z
        return {}, f

    _names(_run(make, same_state=False), "npdraw", "np.random.rand")


def _bump(c):
    c.lr = c.lr * 2.0  # <helper-attr>


_LOG = []


def _record(v):
    _LOG.append(v)  # <helper-append>


def _noise():
    return np.random.rand(4)  # <helper-draw>


def test_a_helper_that_rebinds_an_attribute_names_its_line():
    def make():
        cfg = _Cfg()

        def f(x):
            _bump(cfg)
            return x * 2.0
        return cfg, f

    _names(_run(make), "helper-attr", "helper's attribute store")


def test_a_helper_that_appends_names_its_line():
    def make():
        def f(x):
            _record(1.0)
            return x * 2.0
        return {}, f

    _names(_run(make, same_state=False), "helper-append", "helper's append")


def test_a_helper_that_draws_names_its_line():
    def make():
        def f(x):
            return x * 2.0 + 0.0 * _noise()
        return {}, f

    _names(_run(make, same_state=False), "helper-draw", "helper's np.random draw")


def test_a_method_that_counts_on_self_names_the_line():
    class Opt:
        def __init__(self):
            self.t = 0

        def step(self, x):
            self.t += 1  # <self>
            return x * 2.0

    def make():
        o = Opt()
        return o, o.step

    _names(_run(make), "self", "self.t += 1")


def test_a_layer_that_counts_its_calls_names_the_line():
    class Counted(Layer):
        def __init__(self):
            super().__init__()
            self.calls = 0

        def forward(self, x):
            self.calls += 1  # <layer>
            return x * 2.0

    def make():
        m = Counted()
        return {}, m

    _names(_run(make, same_state=False), "layer", "a Layer's counter")


def test_an_object_passed_and_changed_names_the_line():
    def f(m, x):
        m.lr = m.lr + 1.0  # <through-arg>
        return x * 2.0

    def make():
        return _Cfg(), f

    ws = _run(make, args=lambda k, state: (state, _vec(k)))
    _names(ws, "through-arg", "an argument's attribute")


def test_a_list_passed_and_appended_to_names_the_line():
    def f(L, x):
        L.append(1)  # <arg-list>
        return x * float(len(L))

    def make():
        return [[] for _ in range(4)], f

    ws = _run(make, args=lambda k, state: (state[k], _vec(k)))
    _names(ws, "arg-list", "an argument list appended to")


def test_threaded_state_rebound_to_a_number_names_the_line():
    class S:
        h = None

    def make():
        st = S()

        def f(x):
            st.h = x * 2.0 if x.shape[0] == 4 else 7  # <threaded>
            return x * 3.0
        return st, f

    def args(k, st):
        return (Variable(np.linspace(0.1, 1.0, 4 if k < 3 else 3) + k),)

    ws = _run(make, n=6, args=args, same_state=False)
    _names([w for w in ws if "state it threads" in str(w.message)], "threaded",
           "threaded state rebound to a number")
