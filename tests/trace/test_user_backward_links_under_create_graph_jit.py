"""A user Function with per-call state, differentiated with create_graph inside a
jitted function: each gradient its backward gives links, in eager's graph, only the
Variables that gradient's own graph reaches (not the forward's outputs it never reads,
not an input read as `.data`). A caller's walk from a result computed from such a
gradient then never reads the .grad retained on, or preset on, a Variable eager's walk
does not reach; where the links change with the per-call state, the call runs eagerly
with a JitWarning."""
import warnings

import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F
from tracejit import JitWarning


class SignCube(tj.Function):
    # Per-call state read by the backward; the backward never reads the output.
    def forward(self, x):
        self.k = 3.0 if x.sum() > 0 else -2.0
        return x ** 3

    def backward(self, gy):
        x, = self.inputs
        return gy * self.k * x * x


class DataScale(tj.Function):
    # y = x * w; the backward reads w as .data for x's gradient (detached, as eager).
    def forward(self, x, w):
        self.k = 1.0 if x.sum() > 0 else -1.0
        return x * w

    def backward(self, gy):
        x, w = self.inputs
        return gy * w.data * self.k, gy * x * self.k


class SwitchLink(tj.Function):
    # Which input the gradient's graph reaches depends on the per-call state.
    def forward(self, x):
        self.linked = bool(x.sum() > 0)
        return x * 2.0

    def backward(self, gy):
        x, = self.inputs
        return gy * (x if self.linked else x.data) * 2.0


VALUES = [1.2, 0.7, -0.9, 1.1, -1.3, 0.4]


def _grad(v):
    return None if v.grad is None else v.grad.data


def _calls(run, f):
    jf = tj.jit(f)
    for v in VALUES:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", JitWarning)
            got = run(jf, v)
        want = run(f, v)
        assert len(got) == len(want)
        for k, (a, b) in enumerate(zip(got, want)):
            assert (a is None) == (b is None), f"x = {v}, entry {k}: {a} vs {b}"
            if a is not None:
                np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12,
                                           err_msg=f"x = {v}, entry {k}")


def test_retained_grad_of_forward_output_not_read():
    # y.grad, retained by the backward inside f, is not on the path from x.grad.
    def f(x):
        y = SignCube()(x)
        F.sum(y).backward(retain_grad=True, create_graph=True)
        return x.grad * 0.5, x.grad, y

    def run(fn, v):
        x = tj.Variable(np.array(v))
        h, _, y = fn(x)
        h.backward()
        return [_grad(x), _grad(y)]

    _calls(run, f)


def test_preset_grad_of_forward_output_not_read():
    def f(x):
        y = SignCube()(x)
        F.sum(y).backward(create_graph=True)
        return x.grad * 0.5, x.grad, y

    def run(fn, v):
        x = tj.Variable(np.array([v, 0.5 * v]))
        h, _, y = fn(x)
        y.grad = tj.Variable(np.full(y.shape, 0.25))
        F.sum(h).backward(retain_grad=True, create_graph=True)
        g = x.grad
        x.cleargrad()
        F.sum(g * g).backward()
        return [g.data, _grad(x), _grad(y)]

    _calls(run, f)


def test_preset_grad_of_input_read_as_data_not_read():
    # x's gradient reads w as .data: eager's walk from it never reaches w (nor p).
    def f(x, p):
        w = p * 1.5
        y = DataScale()(x, w)
        F.sum(y).backward(create_graph=True)
        return x.grad * 0.5, x.grad, p.grad, w

    def run(fn, v):
        x = tj.Variable(np.array([v, -0.25]))
        p = tj.Variable(np.array([0.5, v]))
        h, _, _, w = fn(x, p)
        w.grad = tj.Variable(np.full(w.shape, 0.25))
        F.sum(h).backward()
        return [_grad(x), _grad(p), _grad(w)]

    _calls(run, f)


def test_links_changing_with_state_match_or_fall_back():
    def f(x):
        y = SwitchLink()(x)
        F.sum(y).backward(create_graph=True)
        return x.grad * 3.0, x.grad, y

    def run(fn, v):
        x = tj.Variable(np.array([v, 2.0 * v]))
        h, g, y = fn(x)
        y.grad = tj.Variable(np.full(y.shape, 0.25))
        F.sum(h * h).backward()
        return [h.data, g.data, _grad(x), _grad(y)]

    _calls(run, f)


def test_links_changing_with_state_warn():
    def f(x):
        y = SwitchLink()(x)
        F.sum(y).backward(create_graph=True)
        return x.grad * 3.0, x.grad

    jf = tj.jit(f)
    with pytest.warns(JitWarning, match="SwitchLink.backward"):
        for v in VALUES:
            x = tj.Variable(np.array([v, 2.0 * v]))
            F.sum(jf(x)[0]).backward()
