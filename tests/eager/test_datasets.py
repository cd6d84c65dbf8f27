"""Datasets, DataLoader and transforms."""
import numpy as np
import pytest

import tracejit as tj
from tracejit import transforms as T
from tracejit.dataloaders import DataLoader, SeqDataLoader
from tracejit.datasets import Dataset, SinCurve, Spiral, get_spiral


def test_spiral_shapes_and_labels():
    ds = Spiral()
    assert len(ds) == 300
    assert ds.data.shape == (300, 2) and ds.data.dtype == np.float32
    assert ds.label.shape == (300,) and np.issubdtype(ds.label.dtype, np.integer)
    assert np.bincount(ds.label).tolist() == [100, 100, 100]
    assert np.abs(ds.data).max() <= 1.0
    x, t = ds[5]
    np.testing.assert_array_equal(x, ds.data[5])
    assert t == ds.label[5]


def test_spiral_is_deterministic_and_matches_dezero():
    np.random.seed(123)
    a = Spiral(train=True)
    b = Spiral(train=True)
    np.testing.assert_array_equal(a.data, b.data)
    np.testing.assert_array_equal(a.label, b.label)
    # The first rows DeZero's get_spiral(train=True) produces.
    np.testing.assert_allclose(a.data[:2], [[-0.1398138850927353, -0.007216573692858219],
                                            [0.37049391865730286, 0.5820947289466858]])
    test = Spiral(train=False)
    assert not np.array_equal(a.data, test.data)
    # Like DeZero, loading reseeds the global generator (2020 for test data).
    after = np.random.rand()
    get_spiral(train=False)
    assert np.random.rand() == after


def test_transforms_are_applied():
    ds = Spiral(transform=lambda x: x * 2, target_transform=lambda t: t + 10)
    x, t = ds[0]
    np.testing.assert_array_equal(x, ds.data[0] * 2)
    assert t == ds.label[0] + 10


def test_dataset_without_labels_and_bad_index():
    class Plain(Dataset):
        def prepare(self):
            self.data = np.arange(4)

    ds = Plain()
    assert ds[2] == (2, None) and len(ds) == 4
    with pytest.raises(TypeError):
        ds[[0, 1]]


def test_sincurve():
    ds = SinCurve(train=False)
    assert ds.data.shape == ds.label.shape == (999, 1)
    np.testing.assert_array_equal(ds.data[1:], ds.label[:-1])


class Numbered(Dataset):
    """Row i is [i, -i] with label 10 * i: every example identifiable."""

    def prepare(self):
        n = np.arange(300)
        self.data = np.stack([n, -n], axis=1).astype(np.float32)
        self.label = 10 * n


def test_dataloader_batches_cover_the_epoch():
    ds = Numbered()
    loader = DataLoader(ds, batch_size=70)
    assert len(loader) == 5 and loader.max_iter == 5
    for _ in range(2):                          # two epochs, each complete
        batches = list(loader)
        assert [x.shape for x, _ in batches] == [(70, 2)] * 4 + [(20, 2)]
        assert all(x.dtype == np.float32 for x, _ in batches)
        xs = np.concatenate([x for x, _ in batches])
        ts = np.concatenate([t for _, t in batches])
        assert sorted(xs[:, 0].astype(int)) == list(range(300))    # every example once
        np.testing.assert_array_equal(ts, 10 * xs[:, 0])           # with its own label
        np.testing.assert_array_equal(xs[:, 1], -xs[:, 0])


def test_dataloader_shuffle_and_reshuffle():
    ds = Spiral()
    plain = DataLoader(ds, batch_size=100, shuffle=False)
    x, t = next(plain)
    np.testing.assert_array_equal(x, ds.data[:100])
    np.testing.assert_array_equal(t, ds.label[:100])

    np.random.seed(0)
    loader = DataLoader(ds, batch_size=300)
    first = next(loader)[0]
    assert not np.array_equal(first, ds.data)
    with pytest.raises(StopIteration):
        next(loader)
    second = next(loader)[0]          # a new epoch, reshuffled
    assert not np.array_equal(first, second)
    np.random.seed(0)
    np.testing.assert_array_equal(next(DataLoader(ds, batch_size=300))[0], first)


def test_dataloader_gpu_rejected():
    with pytest.raises(NotImplementedError):
        DataLoader(Spiral(), 10, gpu=True)
    assert tj.DataLoader is DataLoader


def test_seq_dataloader():
    ds = SinCurve(train=False)
    loader = SeqDataLoader(ds, batch_size=3)
    x, t = next(loader)
    jump = len(ds) // 3
    np.testing.assert_array_equal(x, ds.data[[0, jump, 2 * jump]])
    x, t = next(loader)
    np.testing.assert_array_equal(t, ds.label[[1, jump + 1, 2 * jump + 1]])


def test_ndarray_transforms():
    a = np.array([[1.0, 2.0], [3.0, 4.0]])
    f = T.Compose([T.Normalize(mean=1.0, std=2.0), T.Flatten(), T.AsType(np.float32)])
    out = f(a)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, [0.0, 0.5, 1.0, 1.5])
    np.testing.assert_array_equal(T.Normalize(mean=[1.0, 3.0])(a), [[0.0, 1.0], [0.0, 1.0]])
    assert T.ToInt()(np.array([1.7])).dtype.kind == "i"
    assert T.Compose()(a) is a
