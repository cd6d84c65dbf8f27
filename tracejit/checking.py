"""Eager beside compiled: snapshot live state, compare results, restore.

Every variant's first call (check=True: its first three) runs the eager function and
the compiled variant from the same state; a difference demotes the variant to eager.
"""
import numpy as np

from tracejit.core import Variable

class LiveState:
    """Snapshot and restore of everything a variant reads or writes outside its args."""

    def __init__(self, v, leaves):
        self.vars, self.arrays = [], []
        seen = set()
        objs = [(kind, obj) for kind, obj, _ in v.sources if kind != "arg"]
        objs += [("var" if kind != "inplace_array" else "array", t) for kind, (w, t), _ in
                 v.effects if w == "obj"]
        objs += [("var", var) for (w, var), _ in v.grad_effects if w == "obj"]
        objs += [("var", x) for x in leaves if isinstance(x, Variable)]
        objs += [("array", x) for x in leaves if isinstance(x, np.ndarray)]
        for kind, obj in objs:
            if kind == "grad":
                kind = "var"
            if id(obj) in seen:
                continue
            seen.add(id(obj))
            (self.vars if kind == "var" else self.arrays).append(obj)
        self.initial = self.capture()

    def capture(self):
        vs = [(var._data, None if var._data is None else var._data.copy(), var._grad,
               None if var._grad is None else var._grad._data.copy()) for var in self.vars]
        arrs = [a.copy() for a in self.arrays]
        return vs, arrs

    def restore(self, snap):
        vs, arrs = snap
        for var, (data, data_copy, grad, grad_copy) in zip(self.vars, vs):
            if data is not None:
                np.copyto(data, data_copy)
            var._data = data
            if grad is not None:
                np.copyto(grad._data, grad_copy)
            var._grad = grad
        for a, c in zip(self.arrays, arrs):
            np.copyto(a, c)

    def restore_initial(self):
        self.restore(self.initial)

    def difference(self, snap):
        vs, arrs = snap
        for var, (data, data_copy, grad, grad_copy) in zip(self.vars, vs):
            name = var.name or "a captured Variable"
            d = array_difference(data_copy, var._data, f"{name}.data")
            if d:
                return d
            if (grad_copy is None) != (var._grad is None):
                return f"{name}.grad is {'None' if var._grad is None else 'set'} compiled"
            if grad_copy is not None:
                d = array_difference(grad_copy, var._grad._data, f"{name}.grad")
                if d:
                    return d
        for a, c in zip(self.arrays, arrs):
            d = array_difference(c, a, "a captured array")
            if d:
                return d
        return None


def array_difference(expected, got, what):
    if expected is None or got is None:
        return None if expected is got else f"{what} is None in one run"
    expected, got = np.asarray(expected), np.asarray(got)
    if expected.shape != got.shape or expected.dtype != got.dtype:
        return (f"{what}: eager {expected.dtype}{list(expected.shape)}, compiled "
                f"{got.dtype}{list(got.shape)}")
    if expected.dtype.kind in "fc":
        ok = np.isclose(got, expected, rtol=1e-5, atol=1e-7, equal_nan=True)
    else:
        ok = got == expected
    if np.all(ok):
        return None
    i = np.unravel_index(np.argmin(ok), ok.shape) if ok.ndim else ()
    where = list(int(k) for k in i) if i else ""
    return f"{what}{where}: eager {expected[i]}, compiled {got[i]}"


def first_difference(expected, got, path="output"):
    # The kind of object first: a Parameter returned as itself, a NumPy scalar or a
    # Python bool where eager gives one, a tuple's length.
    if type(expected) is not type(got):
        return (f"{path}: eager gives a {type(expected).__name__}, compiled a "
                f"{type(got).__name__}")
    if isinstance(expected, (tuple, list, dict)) and len(expected) != len(got):
        return f"{path}: eager gives {len(expected)} items, compiled {len(got)}"
    if isinstance(expected, Variable) or isinstance(expected, np.ndarray):
        e = expected._data if isinstance(expected, Variable) else expected
        g = got._data if isinstance(got, Variable) else got
        return array_difference(e, g, path)
    if isinstance(expected, (tuple, list)):
        for i, (e, g) in enumerate(zip(expected, got)):
            d = first_difference(e, g, f"{path}[{i}]")
            if d:
                return d
        return None
    if isinstance(expected, dict):
        for k in expected:
            d = first_difference(expected[k], got[k], f"{path}[{k!r}]")
            if d:
                return d
        return None
    if isinstance(expected, float):
        return None if np.isclose(expected, got, rtol=1e-5, equal_nan=True) else \
            f"{path}: eager {expected!r}, compiled {got!r}"
    return None if expected == got else f"{path}: eager {expected!r}, compiled {got!r}"
