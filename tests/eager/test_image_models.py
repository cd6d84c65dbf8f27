"""DeZero's image models VGG16, ResNet (50/101/152) and SqueezeNet: architecture,
forward shapes, pretrained weights from the cache directory (and the clear error
without a network), and save_weights / load_weights round trips.
"""
import urllib.error

import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F
import tracejit.layers as L
from tracejit import models as M
from tracejit import utils

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")


@pytest.fixture
def empty_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACEJIT_DATA", str(tmp_path))

    def offline(url, path, hook, timeout):
        raise urllib.error.URLError("no network (test)")
    monkeypatch.setattr(utils, "_download", offline)
    return tmp_path


@pytest.mark.parametrize("make, url", [
    (lambda: M.VGG16(pretrained=True), M.VGG16.WEIGHTS_PATH),
    (lambda: M.ResNet50(pretrained=True), M.ResNet.WEIGHTS_PATH.format(50)),
    (lambda: M.ResNet(101, pretrained=True), M.ResNet.WEIGHTS_PATH.format(101)),
    (lambda: M.ResNet152(pretrained=True), M.ResNet.WEIGHTS_PATH.format(152)),
], ids=["VGG16", "ResNet50", "ResNet101", "ResNet152"])
def test_pretrained_without_network_names_url_and_path(empty_cache, make, url):
    name = url.rsplit("/", 1)[1]
    with pytest.raises(utils.DownloadError) as e:
        make()
    assert url in str(e.value) and str(empty_cache / name) in str(e.value)


def test_pretrained_loads_from_the_cache(empty_cache):
    # A file of DeZero's keys in the cache: loaded without touching the network (the
    # arrays are small stand-ins; load_weights takes what the file holds).
    keys = {}
    M.VGG16()._flatten_params(keys)
    arrays = {k: np.full(3, i, np.float32) for i, k in enumerate(sorted(keys))}
    np.savez(empty_cache / "vgg16.npz", **arrays)
    model = M.VGG16(pretrained=True)
    flat = {}
    model._flatten_params(flat)
    assert set(flat) == set(arrays)
    for k, p in flat.items():
        np.testing.assert_array_equal(p.data, arrays[k])
    assert "conv5_3/W" in flat and "fc8/b" in flat


def test_vgg16_forward_shape():
    x = np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float32)
    model = M.VGG16()
    with tj.test_mode(), tj.no_grad():
        y = model(x)
    assert y.shape == (1, 1000) and y.dtype == np.float32
    assert model.conv1_1.W.shape == (64, 3, 3, 3) and model.fc6.W.shape == (512, 4096)
    img = pytest.importorskip("PIL.Image").new("RGB", (40, 30))
    assert M.VGG16.preprocess(img, size=(32, 32)).shape == (3, 32, 32)


def test_resnet_structure_and_block_forward():
    with pytest.raises(ValueError, match="50, 101, or 152"):
        M.ResNet(34)
    for n, blocks in [(50, [3, 4, 6, 3]), (101, [3, 4, 23, 3]), (152, [3, 8, 36, 3])]:
        model = M.ResNet(n)
        assert [len(getattr(model, f"res{i}")._forward) for i in (2, 3, 4, 5)] == blocks
    # One stage at small widths: a projection bottleneck then identity ones.
    block = M.BuildingBlock(2, 4, 2, 8, 2)
    x = np.random.default_rng(1).standard_normal((2, 4, 5, 5)).astype(np.float32)
    y = block(x)
    assert y.shape == (2, 8, 3, 3) and (y.data >= 0).all()
    assert block.a.conv4.W.shape == (8, 4, 1, 1) and block.b1.conv2.W.shape == (2, 2, 3, 3)
    x = np.random.default_rng(2).standard_normal((1, 3, 16, 16)).astype(np.float32)
    r = M.ResNet(50)
    h = M._global_average_pooling_2d(F.relu(r.bn1(r.conv1(x))))
    assert h.shape == (1, 64)


def test_squeezenet_forward_and_concat_gradient():
    x = np.random.default_rng(3).standard_normal((1, 3, 64, 64)).astype(np.float32)
    model = M.SqueezeNet()
    with tj.test_mode(), tj.no_grad():
        y = model(x)
    assert y.shape == (1, 1000) and y.dtype == np.float32
    with pytest.raises(ValueError, match="no SqueezeNet weights"):
        M.SqueezeNet(pretrained=True)
    a, b = tj.Variable(np.ones((1, 2, 2, 2))), tj.Variable(np.zeros((1, 3, 2, 2)))
    c = M._concat_channels(a, b)
    np.testing.assert_array_equal(c.data, np.concatenate([a.data, b.data], axis=1))
    F.sum(c * np.arange(20.).reshape(1, 5, 2, 2)).backward()
    np.testing.assert_array_equal(b.grad.data, np.arange(8., 20.).reshape(1, 3, 2, 2))


def test_save_and_load_weights_round_trip(tmp_path):
    np.random.seed(0)
    model = M.Sequential(L.Conv2d(3, 3, pad=1), L.BatchNorm(), F.relu, F.flatten,
                         L.Linear(2))
    x = np.random.default_rng(4).standard_normal((2, 1, 4, 4)).astype(np.float32)
    model(x)                               # creates the lazy parameters
    path = str(tmp_path / "w.npz")
    model.save_weights(path)
    np.random.seed(1)
    other = M.Sequential(L.Conv2d(3, 3, pad=1), L.BatchNorm(), F.relu, F.flatten,
                         L.Linear(2))
    other.load_weights(path)
    for p, q in zip(model.params(), other.params()):
        np.testing.assert_array_equal(p.data, q.data)
    with tj.test_mode():
        np.testing.assert_array_equal(model(x).data, other(x).data)
