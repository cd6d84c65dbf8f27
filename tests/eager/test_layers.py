"""Layer, Linear, Model and MLP: parameter registration, lazy init, save/load."""
import gc

import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F
import tracejit.layers as L
from tracejit.core import Parameter
from tracejit.models import MLP, Model, Sequential


class TwoParams(L.Layer):
    def __init__(self):
        super().__init__()
        self.p1 = Parameter(np.array(1.0), name="p1")
        self.p2 = Parameter(np.array(2.0), name="p2")
        self.not_a_param = tj.Variable(np.array(3.0))
        self.number = 4

    def forward(self, x):
        return x * self.p1 + self.p2


def test_setattr_registers_parameters_and_layers_in_order():
    layer = L.Layer()
    layer.b = Parameter(np.zeros(2))
    layer.sub = TwoParams()
    layer.a = Parameter(np.ones(3))
    layer.v = tj.Variable(np.ones(1))       # a plain Variable is not a parameter
    assert list(layer._params) == ["b", "sub", "a"]
    params = list(layer.params())
    assert [p.name for p in params] == [None, "p1", "p2", None]
    assert params[0] is layer.b and params[-1] is layer.a
    assert all(isinstance(p, Parameter) for p in params)


def test_rebinding_to_a_non_parameter_unregisters():
    layer = TwoParams()
    layer.p1 = None
    assert [p.name for p in layer.params()] == ["p2"]
    del layer.p2
    assert list(layer.params()) == []


def test_missing_super_init_is_explained():
    class Forgetful(L.Layer):
        def __init__(self):
            self.W = Parameter(np.ones(1))

    with pytest.raises(AttributeError, match=r"super\(\).__init__\(\)"):
        Forgetful()


def test_cleargrads_recurses_into_sublayers():
    outer = L.Layer()
    outer.inner = TwoParams()
    y = outer.inner(tj.Variable(np.array(5.0)))
    y.backward()
    assert outer.inner.p1.grad.data == 5.0
    outer.cleargrads()
    assert all(p.grad is None for p in outer.params())


def test_call_keeps_weak_references_to_inputs_and_outputs():
    layer = TwoParams()
    x = tj.Variable(np.array(2.0))
    y = layer(x)
    assert float(y.data) == 4.0
    assert layer.inputs[0]() is x and layer.outputs[0]() is y
    del x, y
    gc.collect()
    assert layer.inputs[0]() is None and layer.outputs[0]() is None


def test_forward_not_implemented():
    with pytest.raises(NotImplementedError):
        L.Layer()(np.ones(1))


def test_linear_lazy_init_shapes_and_dtype():
    layer = L.Linear(5)
    assert layer.W.data is None
    assert layer.b.shape == (5,) and layer.b.dtype == np.float32
    y = layer(np.ones((4, 3), dtype=np.float32))
    assert layer.in_size == 3
    assert layer.W.shape == (3, 5) and layer.W.dtype == np.float32
    assert y.shape == (4, 5) and y.dtype == np.float32


def test_linear_init_draws_like_dezero():
    np.random.seed(0)
    layer = L.Linear(4, in_size=3)   # W created at construction
    np.random.seed(0)
    expected = np.random.randn(3, 4).astype(np.float32) * np.float32(np.sqrt(1 / 3))
    np.testing.assert_array_equal(layer.W.data, expected)
    np.testing.assert_array_equal(layer.b.data, np.zeros(4, np.float32))


def test_linear_forward_value_and_nobias():
    layer = L.Linear(2, nobias=True, dtype=np.float64, in_size=3)
    assert layer.b is None
    assert [p.name for p in layer.params()] == ["W"]
    x = np.arange(6.0).reshape(2, 3)
    np.testing.assert_allclose(layer(x).data, x @ layer.W.data)
    layer.W.data = np.ones((3, 2))
    layer2 = L.Linear(2, dtype=np.float64, in_size=3)
    layer2.W.data = np.ones((3, 2))
    layer2.b.data = np.array([1.0, -1.0])
    np.testing.assert_allclose(layer2(x).data, [[4.0, 2.0], [13.0, 11.0]])


def test_mlp_forward_backward_shapes():
    np.random.seed(0)
    model = MLP((10, 7, 3), activation=F.relu)
    x = np.random.randn(8, 4).astype(np.float32)
    y = model(x)
    assert y.shape == (8, 3)
    assert [l.W.shape for l in model.layers] == [(4, 10), (10, 7), (7, 3)]
    loss = F.sum(y ** 2)
    loss.backward()
    params = list(model.params())
    assert len(params) == 6
    for p in params:
        assert p.grad is not None and p.grad.shape == p.shape


def test_mlp_gradient_matches_numerical():
    np.random.seed(1)
    model = MLP((3, 2))
    x = np.random.randn(4, 2)
    model(x)
    for p in model.params():
        p.data = p.data.astype(np.float64)
    W = model.l0.W

    def loss_of_W(W_data):
        W.data = W_data
        return F.sum(model(x) ** 2)

    expected = tj.utils.numerical_grad(loss_of_W, W.data.copy())
    model.cleargrads()
    loss_of_W(W.data).backward()
    np.testing.assert_allclose(W.grad.data, expected, rtol=1e-5, atol=1e-7)


def test_sequential_chains_layers_and_callables():
    model = Sequential(L.Linear(3, in_size=2), F.tanh, L.Linear(1, in_size=3))
    assert len(list(model.params())) == 4
    x = np.ones((5, 2), np.float32)
    expected = np.tanh(x @ model.l0.W.data + model.l0.b.data) @ model.l2.W.data + model.l2.b.data
    np.testing.assert_allclose(model(x).data, expected, rtol=1e-6)


def test_save_load_weights_roundtrip(tmp_path):
    np.random.seed(0)
    x = np.random.randn(2, 3).astype(np.float32)
    model = MLP((4, 2))
    y = model(x).data
    path = str(tmp_path / "w.npz")
    model.save_weights(path)
    assert sorted(np.load(path).files) == ["l0/W", "l0/b", "l1/W", "l1/b"]

    other = MLP((4, 2))        # uninitialised W: load_weights creates it
    other.load_weights(path)
    for p, q in zip(model.params(), other.params()):
        np.testing.assert_array_equal(p.data, q.data)
    np.testing.assert_array_equal(other(x).data, y)


def test_save_skips_uninitialised_and_load_reports_missing(tmp_path):
    model = MLP((4, 2))
    path = str(tmp_path / "w.npz")
    model.save_weights(path)
    assert sorted(np.load(path).files) == ["l0/b", "l1/b"]
    with pytest.raises(KeyError, match="l0/W"):
        MLP((4, 2)).load_weights(path)


def test_model_plot_without_graphviz(tmp_path, monkeypatch):
    monkeypatch.setattr("shutil.which", lambda name: None)
    model = MLP((3, 2))
    with pytest.raises(RuntimeError, match="dot"):
        model.plot(np.ones((1, 2), np.float32), to_file=str(tmp_path / "m.png"))
    assert "Linear" not in (tmp_path / "m.dot").read_text()   # ops, not layers, are nodes
    assert "MatMul" in (tmp_path / "m.dot").read_text()


def test_model_is_layer():
    assert issubclass(Model, tj.Layer) and tj.Model is Model
