"""tracejit.utils: numerical gradients, gradient_check, comparisons, DOT graphs."""
import re
import stat

import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F
from tracejit import utils


def f_poly(x):
    return F.sin(x) * x ** 2 + 3 * x


def test_numerical_grad_matches_analytic():
    x = np.array([[0.3, -1.2, 2.0], [0.0, 0.7, -0.4]])
    expected = np.cos(x) * x ** 2 + 2 * x * np.sin(x) + 3
    num = utils.numerical_grad(f_poly, x)
    np.testing.assert_allclose(num, expected, rtol=1e-6, atol=1e-8)
    # x was perturbed in place and must be restored exactly.
    np.testing.assert_array_equal(x, [[0.3, -1.2, 2.0], [0.0, 0.7, -0.4]])


def test_numerical_grad_accepts_variables_args_and_ndarray_results():
    x = tj.Variable(np.array([1.0, 2.0]))
    num = utils.numerical_grad(lambda a, k, scale=1.0: scale * k * a ** 3, x, 2.0, scale=0.5)
    np.testing.assert_allclose(num, 0.5 * 2.0 * 3 * x.data ** 2, rtol=1e-6)
    num = utils.numerical_grad(lambda a: np.exp(a), np.array([0.0, 1.0]))
    np.testing.assert_allclose(num, np.exp([0.0, 1.0]), rtol=1e-6)


def test_gradient_check_passes_and_converts_to_float64():
    x = tj.Variable(np.random.RandomState(0).randn(3, 2).astype(np.float32))
    assert utils.gradient_check(F.tanh, x) is True
    assert x.dtype == np.float64
    W = np.random.RandomState(1).randn(2, 4)
    assert utils.gradient_check(F.matmul, np.random.RandomState(2).randn(3, 2), W)


class WrongSquare(tj.Function):
    def forward(self, x):
        return x ** 2

    def backward(self, gy):
        x, = self.inputs
        return 3 * x * gy           # should be 2 * x * gy


def test_gradient_check_detects_a_wrong_backward(capsys):
    assert utils.gradient_check(lambda x: WrongSquare()(x), np.array([1.0, 2.0])) is False
    assert "FAILED (Gradient Check)" in capsys.readouterr().out


def test_array_equal_and_allclose_accept_variables():
    a = np.array([1.0, 2.0])
    assert utils.array_equal(tj.Variable(a), a.copy())
    assert not utils.array_equal(tj.Variable(a), a + 1)
    assert utils.array_allclose(tj.Variable(a), tj.Variable(a + 1e-7))
    assert not utils.array_allclose(a, a + 1e-3)
    assert utils.array_allclose(a, a + 1e-3, atol=1e-2)


def _graph():
    x = tj.Variable(np.array(1.0), name="x")
    y = tj.Variable(np.array(2.0), name="y")
    z = x * y + F.exp(x)
    z.name = "z"
    return x, y, z


def test_get_dot_graph_nodes_and_edges():
    x, y, z = _graph()
    txt = utils.get_dot_graph(z, verbose=False)
    assert txt.startswith("digraph g {\n") and txt.endswith("}")
    for label in ("x", "y", "z", "Mul", "Exp", "Add"):
        assert f'label="{label}"' in txt
    mul = z.creator.inputs[0].creator
    assert f"{id(x)} -> {id(mul)}" in txt and f"{id(y)} -> {id(mul)}" in txt
    assert f"{id(z.creator)} -> {id(z)}" in txt
    # Each function is visited once even though x feeds two of them.
    assert len(re.findall(r"shape=box", txt)) == 3


def test_get_dot_graph_verbose_shows_shape_and_dtype():
    x = tj.Variable(np.ones((2, 3), np.float32), name="x")
    txt = utils.get_dot_graph(F.sum(x), verbose=True)
    assert 'label="x: (2, 3) float32"' in txt
    assert 'label="() float32"' in txt


def test_plot_dot_graph_without_graphviz(tmp_path, monkeypatch):
    monkeypatch.setattr("shutil.which", lambda name: None)
    *_, z = _graph()
    out = tmp_path / "g.png"
    with pytest.raises(RuntimeError) as info:
        utils.plot_dot_graph(z, to_file=str(out))
    msg = str(info.value)
    assert "Graphviz" in msg and "`dot`" in msg and "not installed" in msg
    dot_file = tmp_path / "g.dot"
    assert str(dot_file) in msg
    assert dot_file.read_text() == utils.get_dot_graph(z)
    assert not out.exists()


def test_plot_dot_graph_runs_dot(tmp_path, monkeypatch):
    # A stand-in `dot` that records its arguments and writes the output file.
    fake = tmp_path / "dot"
    fake.write_text('#!/bin/sh\necho "$@" > "$(dirname "$0")/args"\necho PNG > "$5"\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setattr("shutil.which", lambda name: str(fake) if name == "dot" else None)
    *_, z = _graph()
    out = tmp_path / "graph.svg"
    utils.plot_dot_graph(z, to_file=str(out))
    assert out.read_text() == "PNG\n"
    assert (tmp_path / "args").read_text().split() == [str(tmp_path / "graph.dot"), "-T", "svg",
                                                       "-o", str(out)]


def test_sum_to_and_reshape_sum_backward():
    x = np.arange(24.0).reshape(2, 3, 4)
    np.testing.assert_array_equal(utils.sum_to(x, (3, 1)), x.sum(axis=(0, 2))[:, None])
    np.testing.assert_array_equal(utils.sum_to(x, (1, 4)), x.sum(axis=(0, 1))[None])
    gy = x.sum(axis=1)
    assert utils.reshape_sum_backward(gy, x.shape, 1, False).shape == (2, 1, 4)
    assert utils.reshape_sum_backward(gy, x.shape, (-1,), False).shape == (2, 4, 1)
    assert utils.reshape_sum_backward(np.array(1.0), x.shape, None, False).shape == ()


def test_logsumexp_is_stable():
    x = np.array([[1000.0, 1000.0], [0.0, np.log(3.0)]])
    np.testing.assert_allclose(utils.logsumexp(x), [[1000.0 + np.log(2.0)], [np.log(4.0)]])


def test_small_helpers():
    assert utils.max_backward_shape(np.zeros((2, 3, 4)), 1) == [2, 1, 4]
    assert utils.max_backward_shape(np.zeros((2, 3)), None) == [1, 1]
    assert utils.pair(3) == (3, 3) and utils.pair((1, 2)) == (1, 2)
    with pytest.raises(ValueError):
        utils.pair((1, 2, 3))
    assert utils.get_conv_outsize(28, 3, 1, 1) == 28
    assert utils.get_conv_outsize(7, 3, 2, 0) == 3
    assert utils.get_deconv_outsize(3, 3, 2, 0) == 7
