"""The downloaded datasets read files in their real formats from the cache directory.

Each test writes small files laid out as the real downloads are (gzip IDX with its
magic numbers for MNIST, the pickled python batches inside the CIFAR tar.gz, the
plain text of Tiny Shakespeare, the ImageNet label dict) into a temporary cache
directory ($TRACEJIT_DATA) and loads them through the datasets' own code. The network
is faked: urlopen raises URLError (this machine has none), or serves given bytes.
"""
import gzip
import io
import os
import pickle
import tarfile
import urllib.error
import urllib.request

import numpy as np
import pytest

import tracejit as tj
from tracejit import datasets, utils
from tracejit.datasets import (CIFAR10, CIFAR100, MNIST, ImageNet, Shakespear,
                               load_cache_npz, save_cache_npz)


def _no_network(*args, **kwargs):
    raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty cache directory in TRACEJIT_DATA, and no network."""
    d = tmp_path / "cache"
    monkeypatch.setenv("TRACEJIT_DATA", str(d))
    monkeypatch.setattr(urllib.request, "urlopen", _no_network)
    return d


# ---------------------------------------------------------------- file writers

def _write_idx(path, array, magic):
    header = magic.to_bytes(4, "big") + b"".join(
        n.to_bytes(4, "big") for n in array.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + array.astype(np.uint8).tobytes())


def _write_mnist(cache, n_train=7, n_test=3, seed=0):
    rng = np.random.default_rng(seed)
    cache.mkdir(parents=True, exist_ok=True)
    out = {}
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        images = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
        labels = rng.integers(0, 10, size=n, dtype=np.uint8)
        _write_idx(cache / f"{prefix}-images-idx3-ubyte.gz", images, 0x00000803)
        _write_idx(cache / f"{prefix}-labels-idx1-ubyte.gz", labels, 0x00000801)
        out[prefix] = (images, labels)
    return out


def _add_pickle(archive, name, obj):
    # The archives were pickled by Python 2: str keys load as bytes with
    # encoding='bytes', which is what the loaders (and DeZero's) read.
    payload = pickle.dumps(obj, protocol=2)
    info = tarfile.TarInfo(name)
    info.size = len(payload)
    archive.addfile(info, io.BytesIO(payload))


def _write_cifar10(cache, per_batch=4, seed=0):
    rng = np.random.default_rng(seed)
    cache.mkdir(parents=True, exist_ok=True)
    batches = {}
    with tarfile.open(cache / "cifar-10-python.tar.gz", "w:gz") as archive:
        dirinfo = tarfile.TarInfo("cifar-10-batches-py")
        dirinfo.type = tarfile.DIRTYPE
        archive.addfile(dirinfo)
        _add_pickle(archive, "cifar-10-batches-py/batches.meta",
                    {b"label_names": [b"airplane"] * 10, b"num_vis": 3072})
        for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
            data = rng.integers(0, 256, size=(per_batch, 3072), dtype=np.uint8)
            labels = [int(v) for v in rng.integers(0, 10, size=per_batch)]
            batches[name] = (data, labels)
            _add_pickle(archive, "cifar-10-batches-py/" + name,
                        {b"batch_label": name.encode(), b"labels": labels, b"data": data,
                         b"filenames": [b"x.png"] * per_batch})
    return batches


def _write_cifar100(cache, n=5, seed=0):
    rng = np.random.default_rng(seed)
    cache.mkdir(parents=True, exist_ok=True)
    parts = {}
    with tarfile.open(cache / "cifar-100-python.tar.gz", "w:gz") as archive:
        _add_pickle(archive, "cifar-100-python/meta",
                    {b"fine_label_names": [], b"coarse_label_names": []})
        for name in ("train", "test"):
            data = rng.integers(0, 256, size=(n, 3072), dtype=np.uint8)
            fine = [int(v) for v in rng.integers(0, 100, size=n)]
            coarse = [int(v) for v in rng.integers(0, 20, size=n)]
            parts[name] = (data, fine, coarse)
            _add_pickle(archive, "cifar-100-python/" + name,
                        {b"filenames": [b"x.png"] * n, b"batch_label": name.encode(),
                         b"fine_labels": fine, b"coarse_labels": coarse, b"data": data})
    return parts


# ---------------------------------------------------------------- MNIST

def test_mnist_reads_gzip_idx_from_the_cache(cache):
    written = _write_mnist(cache)
    for train, prefix in ((True, "train"), (False, "t10k")):
        images, labels = written[prefix]
        ds = MNIST(train=train, transform=None)
        assert ds.data.shape == (len(images), 1, 28, 28) and ds.data.dtype == np.uint8
        assert ds.label.shape == (len(images),) and ds.label.dtype == np.uint8
        np.testing.assert_array_equal(ds.data[:, 0], images)
        np.testing.assert_array_equal(ds.label, labels)
        assert len(ds) == len(images)
    assert MNIST.labels() == {i: str(i) for i in range(10)}


def test_mnist_default_transform_flattens_to_float32_in_unit_range(cache):
    images, labels = _write_mnist(cache)["train"]
    ds = MNIST()
    x, t = ds[2]
    assert x.shape == (784,) and x.dtype == np.float32
    np.testing.assert_allclose(x, images[2].reshape(-1).astype(np.float32) / 255.0,
                               rtol=1e-6)
    assert t == labels[2]
    loader = tj.DataLoader(ds, batch_size=4, shuffle=False)
    xb, tb = next(loader)
    assert xb.shape == (4, 784) and xb.dtype == np.float32
    np.testing.assert_array_equal(tb, labels[:4])


def test_mnist_rejects_a_wrong_or_truncated_file(cache):
    _write_mnist(cache)
    # The label file where the image file should be: the magic number says so.
    os.replace(cache / "train-labels-idx1-ubyte.gz", cache / "train-images-idx3-ubyte.gz")
    _write_idx(cache / "train-labels-idx1-ubyte.gz", np.zeros(7, np.uint8), 0x00000801)
    with pytest.raises(ValueError, match="magic number"):
        MNIST()
    # A header promising more images than the file holds.
    with gzip.open(cache / "t10k-images-idx3-ubyte.gz", "wb") as f:
        f.write(b"".join(v.to_bytes(4, "big") for v in (0x803, 5, 28, 28)) + bytes(100))
    with pytest.raises(ValueError, match="truncated"):
        MNIST(train=False)


# ---------------------------------------------------------------- CIFAR

def test_cifar10_reads_the_python_batches_and_caches_npz(cache):
    batches = _write_cifar10(cache)
    train = CIFAR10(train=True, transform=None)
    want = np.concatenate([batches[f"data_batch_{i}"][0] for i in range(1, 6)])
    want_labels = sum((batches[f"data_batch_{i}"][1] for i in range(1, 6)), [])
    assert train.data.shape == (20, 3, 32, 32)
    np.testing.assert_array_equal(train.data.reshape(20, -1), want)
    np.testing.assert_array_equal(train.label, want_labels)
    assert np.issubdtype(train.label.dtype, np.integer)

    test = CIFAR10(train=False, transform=None)
    np.testing.assert_array_equal(test.data.reshape(4, -1), batches["test_batch"][0])
    np.testing.assert_array_equal(test.label, batches["test_batch"][1])

    # Converted once: DeZero's cache file names, and later loads need no archive.
    assert (cache / "cifar-10-python.tar.gz.train.npz").exists()
    assert (cache / "cifar-10-python.tar.gz.test.npz").exists()
    os.remove(cache / "cifar-10-python.tar.gz")
    again = CIFAR10(train=True, transform=None)
    np.testing.assert_array_equal(again.data, train.data)
    np.testing.assert_array_equal(again.label, train.label)


def test_cifar10_default_transform_is_dezeros(cache):
    batches = _write_cifar10(cache)
    x, t = CIFAR10(train=False)[1]
    raw = batches["test_batch"][0][1].reshape(3, 32, 32).astype(np.float32)
    assert x.dtype == np.float32 and x.shape == (3, 32, 32)
    np.testing.assert_allclose(x, (raw - 0.5) / 0.5)
    assert t == batches["test_batch"][1][1]
    assert CIFAR10.labels()[0] == "airplane" and len(CIFAR10.labels()) == 10


def test_cifar10_archive_without_a_batch_is_a_clear_error(cache):
    cache.mkdir(parents=True)
    with tarfile.open(cache / "cifar-10-python.tar.gz", "w:gz") as archive:
        _add_pickle(archive, "cifar-10-batches-py/data_batch_1",
                    {b"data": np.zeros((1, 3072), np.uint8), b"labels": [0]})
    with pytest.raises(ValueError, match="data_batch_2"):
        CIFAR10()
    assert not (cache / "cifar-10-python.tar.gz.train.npz").exists()


@pytest.mark.parametrize("label_type", ["fine", "coarse"])
def test_cifar100_fine_and_coarse_labels(cache, label_type):
    parts = _write_cifar100(cache)
    for train, name in ((True, "train"), (False, "test")):
        data, fine, coarse = parts[name]
        ds = CIFAR100(train=train, transform=None, label_type=label_type)
        assert ds.data.shape == (5, 3, 32, 32)
        np.testing.assert_array_equal(ds.data.reshape(5, -1), data)
        np.testing.assert_array_equal(ds.label, fine if label_type == "fine" else coarse)
    names = CIFAR100.labels(label_type)
    assert len(names) == (100 if label_type == "fine" else 20)


def test_cifar100_caches_fine_and_coarse_apart(cache):
    data, fine, coarse = _write_cifar100(cache)["train"]
    np.testing.assert_array_equal(CIFAR100(label_type="fine").label, fine)
    # DeZero's one cache file would hand back the fine labels here.
    np.testing.assert_array_equal(CIFAR100(label_type="coarse").label, coarse)
    assert (cache / "cifar-100-python.tar.gz.train.npz").exists()
    assert (cache / "cifar-100-python.tar.gz.coarse.train.npz").exists()
    with pytest.raises(ValueError, match="label_type"):
        CIFAR100(label_type="medium")


# ---------------------------------------------------------------- text and labels

def test_shakespear_character_ids(cache):
    cache.mkdir(parents=True)
    text = "First Citizen:\nBefore we proceed any further, hear me speak.\n"
    (cache / "shakespear.txt").write_text(text, encoding="utf-8")
    ds = Shakespear()
    ids = [ds.char_to_id[c] for c in text]
    np.testing.assert_array_equal(ds.data, ids[:-1])
    np.testing.assert_array_equal(ds.label, ids[1:])
    assert len(ds) == len(text) - 1
    # Ids in order of first appearance.
    assert [ds.id_to_char[i] for i in range(4)] == ["F", "i", "r", "s"]
    assert sorted(ds.char_to_id.values()) == list(range(len(set(text))))
    x, t = ds[0]
    assert ds.id_to_char[int(x)] == "F" and ds.id_to_char[int(t)] == "i"


def test_imagenet_labels_from_the_cache(cache):
    cache.mkdir(parents=True)
    (cache / "imagenet1000_clsidx_to_labels.txt").write_text(
        "{0: 'tench, Tinca tinca',\n 1: 'goldfish, Carassius auratus',\n"
        " 999: 'toilet tissue, toilet paper, bathroom tissue'}")
    labels = ImageNet.labels()
    assert labels[0] == "tench, Tinca tinca" and labels[999].startswith("toilet")
    # A tampered file is read as data, never run.
    (cache / "imagenet1000_clsidx_to_labels.txt").write_text("__import__('os').getcwd()")
    with pytest.raises(ValueError, match="label dict"):
        ImageNet.labels()
    with pytest.raises(NotImplementedError, match="labels"):
        ImageNet()


# ---------------------------------------------------------------- missing files

@pytest.mark.parametrize("make, file_name, url", [
    (lambda: MNIST(), "train-images-idx3-ubyte.gz",
     "https://ossci-datasets.s3.amazonaws.com/mnist/train-images-idx3-ubyte.gz"),
    (lambda: MNIST(train=False), "t10k-images-idx3-ubyte.gz",
     "https://ossci-datasets.s3.amazonaws.com/mnist/t10k-images-idx3-ubyte.gz"),
    (lambda: CIFAR10(), "cifar-10-python.tar.gz",
     "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"),
    (lambda: CIFAR100(), "cifar-100-python.tar.gz",
     "https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz"),
    (lambda: Shakespear(), "shakespear.txt",
     "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/"
     "input.txt"),
    (ImageNet.labels, "imagenet1000_clsidx_to_labels.txt",
     "https://gist.githubusercontent.com/yrevar/942d3a0ac09ec9e5eb3a/raw/"
     "238f720ff059c1f82f368259d1ca4ffa5dd8f9f5/imagenet1000_clsidx_to_labels.txt"),
])
def test_missing_file_without_network_names_file_url_and_place(cache, make, file_name, url):
    with pytest.raises(utils.DownloadError) as info:
        make()
    msg = str(info.value)
    assert file_name in msg and url in msg
    assert str(cache / file_name) in msg and "TRACEJIT_DATA" in msg
    assert isinstance(info.value, OSError)
    assert not (cache / file_name).exists()
    assert not (cache / (file_name + ".part")).exists()


def test_cache_dir_defaults_to_dezeros(monkeypatch):
    monkeypatch.delenv("TRACEJIT_DATA", raising=False)
    assert utils.get_cache_dir() == os.path.join(os.path.expanduser("~"), ".dezero")
    monkeypatch.setenv("TRACEJIT_DATA", "/somewhere/else")
    assert utils.get_cache_dir() == "/somewhere/else"


# ---------------------------------------------------------------- get_file

class _Response(io.BytesIO):
    def __init__(self, payload, length=True, fail_after=None):
        super().__init__(payload)
        self.headers = {"Content-Length": str(len(payload))} if length else {}
        self.fail_after = fail_after

    def read(self, n=-1):
        if self.fail_after is not None and self.tell() >= self.fail_after:
            raise TimeoutError("timed out")
        return super().read(n)


def test_get_file_downloads_once_with_progress(cache, monkeypatch, capsys):
    payload = bytes(range(256)) * 700          # several 64 KiB blocks
    calls = []

    def urlopen(url, timeout=None):
        calls.append((url, timeout))
        return _Response(payload)

    monkeypatch.setattr(urllib.request, "urlopen", urlopen)
    path = utils.get_file("https://example.org/data/blob.bin")
    assert path == str(cache / "blob.bin")
    assert open(path, "rb").read() == payload
    assert calls == [("https://example.org/data/blob.bin", utils.download_timeout)]
    out = capsys.readouterr().out
    assert "Downloading: blob.bin" in out and "100.00%" in out and "#" * 30 in out

    # Cached: no second download, and file_name picks the local name.
    assert utils.get_file("https://example.org/data/blob.bin") == path
    assert len(calls) == 1
    other = utils.get_file("https://example.org/data/blob.bin", "renamed.bin")
    assert other == str(cache / "renamed.bin") and len(calls) == 2


def test_interrupted_download_leaves_no_file(cache, monkeypatch):
    monkeypatch.setattr(urllib.request, "urlopen",
                        lambda url, timeout=None: _Response(bytes(200000), fail_after=65536))
    with pytest.raises(utils.DownloadError, match="timed out"):
        utils.get_file("https://example.org/big.bin")
    assert sorted(os.listdir(cache)) == []


def test_show_progress(capsys):
    utils.show_progress(1, 50, 100)
    assert capsys.readouterr().out == "\r[" + "#" * 15 + "." * 15 + "] 50.00%"
    utils.show_progress(10, 50, 100)           # past the end: clamped
    assert capsys.readouterr().out == "\r[" + "#" * 30 + "] 100.00%"
    utils.show_progress(3, 10, -1)             # no Content-Length
    assert "30 bytes" in capsys.readouterr().out


# ---------------------------------------------------------------- npz cache, weights

def test_save_and_load_cache_npz_roundtrip(cache):
    url = "https://example.org/x/archive.tar.gz"
    assert load_cache_npz(url, train=True) == (None, None)
    data = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    label = np.array([3, 1])
    path = save_cache_npz(data, label, url, train=True)
    assert path == str(cache / "archive.tar.gz.train.npz")
    d, t = load_cache_npz(url, train=True)
    np.testing.assert_array_equal(d, data)
    np.testing.assert_array_equal(t, label)
    assert d.dtype == np.uint8
    assert load_cache_npz(url, train=False) == (None, None)
    # An existing cache file is kept, not overwritten.
    assert save_cache_npz(data * 0, label, url, train=True) is None
    np.testing.assert_array_equal(load_cache_npz(url, train=True)[0], data)
    assert sorted(os.listdir(cache)) == ["archive.tar.gz.train.npz"]


def test_weights_in_dezeros_npz_layout_load_from_the_cache(cache):
    # What a pretrained model does: a DeZero-saved .npz (keys are attribute paths)
    # fetched by get_file, then load_weights.
    np.random.seed(0)
    src = tj.models.MLP((5, 3))
    x = np.random.randn(4, 2).astype(np.float32)
    y = src(x).data
    cache.mkdir(parents=True)
    src.save_weights(str(cache / "mlp.npz"))
    with np.load(cache / "mlp.npz") as npz:
        assert sorted(npz.files) == ["l0/W", "l0/b", "l1/W", "l1/b"]

    path = utils.get_file("https://example.org/weights/mlp.npz")
    dst = tj.models.MLP((5, 3))
    dst.load_weights(path)
    np.testing.assert_array_equal(dst(x).data, y)
    for p, q in zip(src.params(), dst.params()):
        assert p.data.dtype == q.data.dtype
        np.testing.assert_array_equal(p.data, q.data)


def test_dataset_module_exports():
    for name in ("MNIST", "CIFAR10", "CIFAR100", "ImageNet", "Shakespear", "SinCurve",
                 "Spiral", "load_cache_npz", "save_cache_npz"):
        assert hasattr(datasets, name), name
    assert tj.Dataset is datasets.Dataset


def test_show_without_matplotlib_says_so(cache, monkeypatch):
    import sys
    _write_mnist(cache)
    ds = MNIST(transform=None)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)
    with pytest.raises(ImportError, match="pip install matplotlib"):
        ds.show(2, 2)


def test_shakespear_batches_for_bptt(cache):
    # How the book feeds a character model: SeqDataLoader over the id sequence.
    cache.mkdir(parents=True)
    text = "to be, or not to be: that is the question.\n" * 3
    (cache / "shakespear.txt").write_text(text, encoding="utf-8")
    ds = Shakespear()
    loader = tj.SeqDataLoader(ds, batch_size=4)
    x, t = next(loader)
    jump = len(ds) // 4
    assert x.shape == t.shape == (4,) and np.issubdtype(x.dtype, np.integer)
    assert [ds.id_to_char[int(i)] for i in x] == [text[k * jump] for k in range(4)]
    assert [ds.id_to_char[int(i)] for i in t] == [text[k * jump + 1] for k in range(4)]
