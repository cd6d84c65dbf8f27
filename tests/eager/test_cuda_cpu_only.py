"""tracejit.cuda: DeZero's GPU names exist; the GPU is never used, and asking says so.

Also the device methods on Variable, Layer and DataLoader, and SeqDataLoader's order.
"""
import numpy as np
import pytest

import tracejit as tj
import tracejit.layers as L
from tracejit import cuda
from tracejit.datasets import Dataset, SinCurve

NO_GPU = "no GPU path"


def test_module_names():
    assert cuda.gpu_enable is False
    assert cuda.cupy is None
    x = np.ones(3)
    assert cuda.get_array_module(x) is np
    assert cuda.get_array_module(tj.Variable(x)) is np
    assert cuda.as_numpy(x) is x
    assert cuda.as_numpy(tj.Variable(x)) is x
    s = cuda.as_numpy(2.5)
    assert isinstance(s, np.ndarray) and s.shape == () and s == 2.5
    np.testing.assert_array_equal(cuda.as_numpy([1, 2]), [1, 2])
    with pytest.raises(NotImplementedError, match=NO_GPU):
        cuda.as_cupy(x)
    assert tj.cuda is cuda


def test_variable_to_cpu_is_a_noop_and_to_gpu_raises():
    a = np.arange(3.0)
    v = tj.Variable(a)
    v.to_cpu()
    assert v.data is a
    with pytest.raises(NotImplementedError, match="Variable.to_gpu.*" + NO_GPU):
        v.to_gpu()
    assert v.data is a


def test_layer_to_cpu_keeps_parameters_and_to_gpu_raises():
    layer = L.Linear(3, in_size=2)
    W = layer.W.data
    layer.to_cpu()
    assert layer.W.data is W
    with pytest.raises(NotImplementedError, match="Linear.to_gpu.*" + NO_GPU):
        layer.to_gpu()
    model = tj.models.MLP((4, 2))
    model.to_cpu()
    with pytest.raises(NotImplementedError, match="MLP.to_gpu"):
        model.to_gpu()


def test_dataloader_device_flag():
    ds = SinCurve()
    loader = tj.DataLoader(ds, 10)
    assert loader.gpu is False
    loader.to_cpu()
    assert loader.gpu is False
    with pytest.raises(NotImplementedError, match="DataLoader.to_gpu.*" + NO_GPU):
        loader.to_gpu()
    assert loader.gpu is False
    with pytest.raises(NotImplementedError, match=r"DataLoader\(gpu=True\)"):
        tj.DataLoader(ds, 10, gpu=True)
    with pytest.raises(NotImplementedError, match=r"SeqDataLoader\(gpu=True\)"):
        tj.SeqDataLoader(ds, 10, gpu=True)
    # DeZero's portable idiom runs unchanged.
    if tj.cuda.gpu_enable:
        loader.to_gpu()
    assert isinstance(next(loader)[0], np.ndarray)


class Numbered(Dataset):
    def prepare(self):
        self.data = np.arange(10)
        self.label = 100 + np.arange(10)


def test_seq_dataloader_is_dezeros():
    from tracejit import SeqDataLoader       # as `from dezero import SeqDataLoader`
    ds = Numbered()
    loader = SeqDataLoader(ds, batch_size=3)
    assert loader.shuffle is False and loader.max_iter == 4 and loader.gpu is False
    batches = list(loader)
    # Row k of batch i is element (k * jump + i) % size, jump = size // batch_size.
    assert [x.tolist() for x, _ in batches] == [[0, 3, 6], [1, 4, 7], [2, 5, 8],
                                               [3, 6, 9]]
    assert [t.tolist() for _, t in batches] == [[100, 103, 106], [101, 104, 107],
                                               [102, 105, 108], [103, 106, 109]]
    # The next epoch starts again at the beginning.
    np.testing.assert_array_equal(next(loader)[0], [0, 3, 6])
    # Wrapping past the end: 7 elements in batches of 2 (jump 3) for 4 iterations.
    class Seven(Numbered):
        def prepare(self):
            self.data = np.arange(7)
            self.label = np.arange(7)
    assert [x.tolist() for x, _ in SeqDataLoader(Seven(), 2)] == [
        [0, 3], [1, 4], [2, 5], [3, 6]]
