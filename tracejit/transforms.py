"""tracejit.transforms: DeZero's transforms for Dataset(transform=...).

The ndarray transforms (Normalize, Flatten, AsType/ToFloat, ToInt) need only NumPy.
The PIL image transforms (Convert, Resize, CenterCrop, ToArray, ToPIL) import Pillow
when they are first used, not when this module is imported: tracejit does not depend
on Pillow; `pip install 'tracejit[image]'` adds it.
"""
import numpy as np

from tracejit.utils import pair


def _pil_image():
    """The PIL.Image module, or an ImportError saying how to install it."""
    try:
        from PIL import Image
    except ImportError as e:
        raise ImportError(
            "this transform works on PIL images and needs Pillow, which is not installed: "
            "pip install 'tracejit[image]' (or pip install Pillow)") from e
    return Image


def _is_pil_image(img):
    # Without Pillow installed nothing can be a PIL image: do not import it to ask.
    import sys
    pil = sys.modules.get("PIL.Image")
    return pil is not None and isinstance(img, pil.Image)


class Compose:
    """Apply transforms in order."""

    def __init__(self, transforms=()):
        self.transforms = list(transforms)

    def __call__(self, img):
        for t in self.transforms:
            img = t(img)
        return img


# ---------------------------------------------------------------- PIL image transforms

class Convert:
    """img.convert(mode); mode 'BGR' gives an RGB image with red and blue swapped."""

    def __init__(self, mode="RGB"):
        self.mode = mode

    def __call__(self, img):
        Image = _pil_image()
        if self.mode == "BGR":
            img = img.convert("RGB")
            r, g, b = img.split()
            return Image.merge("RGB", (b, g, r))
        return img.convert(self.mode)


class Resize:
    """Resize a PIL image to size (an int, or (width, height)); mode is PIL's resample
    filter, bilinear by default (DeZero's Image.BILINEAR)."""

    def __init__(self, size, mode=None):
        self.size = pair(size)
        self.mode = mode

    def __call__(self, img):
        Image = _pil_image()
        mode = Image.BILINEAR if self.mode is None else self.mode
        return img.resize(self.size, mode)


class CenterCrop:
    """Crop the centre of a PIL image to size (an int, or (width, height)); an odd
    margin leaves the extra column/row on the right/bottom, as DeZero does."""

    def __init__(self, size):
        self.size = pair(size)

    def __call__(self, img):
        _pil_image()
        W, H = img.size
        OW, OH = self.size
        left = (W - OW) // 2
        right = W - ((W - OW) // 2 + (W - OW) % 2)
        up = (H - OH) // 2
        bottom = H - ((H - OH) // 2 + (H - OH) % 2)
        return img.crop((left, up, right, bottom))


class ToArray:
    """A PIL image as a (C, H, W) array of `dtype`; an ndarray passes through unchanged.

    A single-channel image gives (1, H, W) (DeZero's transpose fails on it).
    """

    def __init__(self, dtype=np.float32):
        self.dtype = dtype

    def __call__(self, img):
        if isinstance(img, np.ndarray):
            return img
        if _is_pil_image(img):
            a = np.asarray(img)
            a = a[np.newaxis] if a.ndim == 2 else a.transpose(2, 0, 1)
            return a.astype(self.dtype)
        raise TypeError(f"ToArray: expected a PIL image or an ndarray, got "
                        f"{type(img).__name__}")


class ToPIL:
    """A (C, H, W) array as a PIL image (C = 1 gives a single-channel image)."""

    def __call__(self, array):
        Image = _pil_image()
        array = np.asarray(array)
        if array.ndim != 3:
            raise ValueError(f"ToPIL: expected a (C, H, W) array, got shape {array.shape}")
        data = array.transpose(1, 2, 0)
        if data.shape[2] == 1:
            data = data[:, :, 0]
        return Image.fromarray(data)


class RandomHorizontalFlip:
    """Mirror left-right with probability p (a PIL image, or an array's last axis).

    DeZero declares this class with no body; this is the usual definition, drawing
    from NumPy's global generator so np.random.seed makes it repeatable.
    """

    def __init__(self, p=0.5):
        self.p = p

    def __call__(self, img):
        if np.random.rand() >= self.p:
            return img
        if isinstance(img, np.ndarray):
            return img[..., ::-1].copy()
        Image = _pil_image()
        return img.transpose(Image.FLIP_LEFT_RIGHT)


# ---------------------------------------------------------------- ndarray transforms

class Normalize:
    """(array - mean) / std; a sequence mean/std applies per channel (axis 0)."""

    def __init__(self, mean=0, std=1):
        self.mean = mean
        self.std = std

    def __call__(self, array):
        mean, std = self.mean, self.std
        if not np.isscalar(mean):
            mshape = [1] * array.ndim
            mshape[0] = len(array) if len(self.mean) == 1 else len(self.mean)
            mean = np.array(self.mean, dtype=array.dtype).reshape(*mshape)
        if not np.isscalar(std):
            rshape = [1] * array.ndim
            rshape[0] = len(array) if len(self.std) == 1 else len(self.std)
            std = np.array(self.std, dtype=array.dtype).reshape(*rshape)
        return (array - mean) / std


class Flatten:
    def __call__(self, array):
        return array.flatten()


class AsType:
    def __init__(self, dtype=np.float32):
        self.dtype = dtype

    def __call__(self, array):
        return array.astype(self.dtype)


ToFloat = AsType


class ToInt(AsType):
    def __init__(self, dtype=np.int_):
        self.dtype = dtype
