"""DeZero's PIL image transforms on real PIL images, and their error without Pillow.

Pillow is in the `test` extra, so these run in CI; tracejit itself never requires it
(the transforms import it when first called).
"""
import os
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from tracejit import transforms as T


def _rgb(w=6, h=4, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)
    return Image.fromarray(a), a


def test_convert_modes_and_bgr():
    img, a = _rgb()
    gray = T.Convert("L")(img)
    assert gray.mode == "L" and gray.size == (6, 4)
    assert T.Convert()(gray).mode == "RGB"
    bgr = T.Convert("BGR")(img)
    assert bgr.mode == "RGB"
    np.testing.assert_array_equal(np.asarray(bgr), a[:, :, ::-1])


def test_resize_default_is_bilinear_and_size_is_width_height():
    img, _ = _rgb(8, 6)
    out = T.Resize((4, 3))(img)
    assert out.size == (4, 3)
    np.testing.assert_array_equal(np.asarray(out),
                                  np.asarray(img.resize((4, 3), Image.BILINEAR)))
    assert T.Resize(5)(img).size == (5, 5)
    near = T.Resize(4, Image.NEAREST)(img)
    np.testing.assert_array_equal(np.asarray(near),
                                  np.asarray(img.resize((4, 4), Image.NEAREST)))
    with pytest.raises(ValueError):
        T.Resize((1, 2, 3))


@pytest.mark.parametrize("w, h, ow, oh", [(6, 4, 2, 2), (7, 5, 4, 2), (5, 5, 5, 5)])
def test_center_crop(w, h, ow, oh):
    img, a = _rgb(w, h)
    out = T.CenterCrop((ow, oh))(img)
    assert out.size == (ow, oh)
    left, up = (w - ow) // 2, (h - oh) // 2      # an odd margin's extra goes right/bottom
    np.testing.assert_array_equal(np.asarray(out), a[up:up + oh, left:left + ow])


def test_to_array_and_to_pil_roundtrip():
    img, a = _rgb()
    x = T.ToArray()(img)
    assert x.shape == (3, 4, 6) and x.dtype == np.float32
    np.testing.assert_array_equal(x, a.transpose(2, 0, 1))
    assert T.ToArray(np.uint8)(img).dtype == np.uint8
    arr = np.zeros((3, 2, 2), np.float32)
    assert T.ToArray()(arr) is arr                     # an ndarray passes through
    with pytest.raises(TypeError, match="PIL image"):
        T.ToArray()([1, 2, 3])

    back = T.ToPIL()(a.transpose(2, 0, 1))
    assert back.size == (6, 4) and back.mode == "RGB"
    np.testing.assert_array_equal(np.asarray(back), a)

    gray = T.Convert("L")(img)
    g = T.ToArray(np.uint8)(gray)
    assert g.shape == (1, 4, 6)
    np.testing.assert_array_equal(np.asarray(T.ToPIL()(g)), np.asarray(gray))
    with pytest.raises(ValueError, match="C, H, W"):
        T.ToPIL()(np.zeros((4, 6), np.uint8))


def test_random_horizontal_flip():
    img, a = _rgb()
    np.testing.assert_array_equal(np.asarray(T.RandomHorizontalFlip(p=1.0)(img)),
                                  a[:, ::-1])
    assert T.RandomHorizontalFlip(p=0.0)(img) is img
    x = a.transpose(2, 0, 1)
    np.testing.assert_array_equal(T.RandomHorizontalFlip(p=1.0)(x), x[:, :, ::-1])
    # Seeded through NumPy's global generator, like the rest of DeZero's randomness.
    flip = T.RandomHorizontalFlip()
    np.random.seed(3)
    first = [np.array_equal(flip(x), x) for _ in range(20)]
    np.random.seed(3)
    assert [np.array_equal(flip(x), x) for _ in range(20)] == first
    assert 0 < sum(first) < 20


def test_pipeline_as_an_imagenet_model_preprocesses():
    img, _ = _rgb(40, 30)
    pipe = T.Compose([T.Convert("RGB"), T.Resize(24), T.CenterCrop(16), T.ToArray(),
                      T.Normalize(mean=[103.9, 116.8, 123.7], std=1.0)])
    x = pipe(img)
    assert x.shape == (3, 16, 16) and x.dtype == np.float32
    ref = np.asarray(img.resize((24, 24), Image.BILINEAR))[4:20, 4:20]
    ref = ref.transpose(2, 0, 1).astype(np.float32)
    np.testing.assert_allclose(x, ref - np.array([103.9, 116.8, 123.7],
                                                 np.float32)[:, None, None], rtol=1e-6)


def test_without_pillow_the_import_is_lazy_and_the_error_says_how_to_install():
    # A fresh interpreter where `import PIL` fails: tracejit and its ndarray transforms
    # still import and work; a PIL transform raises an ImportError naming the extra.
    code = """
import sys
sys.modules['PIL'] = None
sys.modules['PIL.Image'] = None
import numpy as np
import tracejit
from tracejit import transforms as T
from tracejit.datasets import MNIST
assert T.Compose([T.Flatten(), T.ToFloat()])(np.ones((2, 2), np.uint8)).dtype == np.float32
arr = np.ones((3, 2, 2))
assert T.ToArray()(arr) is arr
T.Resize(4); T.CenterCrop(2); T.Convert('L')
try:
    T.ToPIL()(np.zeros((3, 2, 2), np.uint8))
except ImportError as e:
    print(e)
"""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, cwd=root)
    assert out.returncode == 0, out.stderr
    assert "Pillow" in out.stdout and "pip install 'tracejit[image]'" in out.stdout
