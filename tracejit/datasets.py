"""tracejit.datasets: Dataset, the built-in toy datasets and DeZero's downloaded ones.

Eager-side data handling, unrelated to tracing. Spiral reproduces DeZero's
get_spiral draw for draw (it reseeds NumPy's global generator, as DeZero does, so
weights initialised after loading it match DeZero's too).

MNIST, CIFAR10, CIFAR100, Shakespear and ImageNet.labels() fetch DeZero's URLs into
the cache directory (~/.dezero, or $TRACEJIT_DATA) through utils.get_file, and read
a file that is already there without a network; files placed there by hand or by
DeZero itself are used as they are. CIFAR is converted once and kept as an .npz
(load_cache_npz / save_cache_npz, DeZero's names and file names).
"""
import ast
import gzip
import os
import pickle
import tarfile

import numpy as np

from tracejit import utils
from tracejit.transforms import Compose, Flatten, Normalize, ToFloat


class Dataset:
    """Indexable (x, t) pairs; subclasses fill self.data and self.label in prepare()."""

    def __init__(self, train=True, transform=None, target_transform=None):
        self.train = train
        self.transform = transform
        self.target_transform = target_transform
        if self.transform is None:
            self.transform = lambda x: x
        if self.target_transform is None:
            self.target_transform = lambda x: x

        self.data = None
        self.label = None
        self.prepare()

    def __getitem__(self, index):
        if not np.isscalar(index):
            raise TypeError(f"Dataset index must be a scalar, got {type(index).__name__} "
                            f"(DataLoader builds batches)")
        if self.label is None:
            return self.transform(self.data[index]), None
        return self.transform(self.data[index]), self.target_transform(self.label[index])

    def __len__(self):
        return len(self.data)

    def prepare(self):
        pass


def get_spiral(train=True):
    """Three interleaved spirals of 100 2-D points each, shuffled; labels 0, 1, 2."""
    seed = 1984 if train else 2020
    np.random.seed(seed=seed)

    num_data, num_class, input_dim = 100, 3, 2
    data_size = num_class * num_data
    x = np.zeros((data_size, input_dim), dtype=np.float32)
    t = np.zeros(data_size, dtype=np.int_)   # DeZero's np.int, removed in NumPy 1.24

    for j in range(num_class):
        for i in range(num_data):
            rate = i / num_data
            radius = 1.0 * rate
            theta = j * 4.0 + 4.0 * rate + np.random.randn() * 0.2
            ix = num_data * j + i
            x[ix] = np.array([radius * np.sin(theta),
                              radius * np.cos(theta)]).flatten()
            t[ix] = j
    indices = np.random.permutation(num_data * num_class)
    x = x[indices]
    t = t[indices]
    return x, t


class Spiral(Dataset):
    def prepare(self):
        self.data, self.label = get_spiral(self.train)


class SinCurve(Dataset):
    """Predict the next value of a noisy sine (train) or a cosine (test), shape (999, 1)."""

    def prepare(self):
        num_data = 1000
        dtype = np.float64

        x = np.linspace(0, 2 * np.pi, num_data)
        noise_range = (-0.05, 0.05)
        noise = np.random.uniform(noise_range[0], noise_range[1], size=x.shape)
        if self.train:
            y = np.sin(x) + noise
        else:
            y = np.cos(x)
        y = y.astype(dtype)
        self.data = y[:-1][:, np.newaxis]
        self.label = y[1:][:, np.newaxis]


# ================================================================ downloaded datasets

def _read_idx(filepath, magic, ndim):
    # The IDX format: a big-endian int32 magic number (0x00000801 for ubyte labels,
    # 0x00000803 for ubyte images), one big-endian int32 per dimension, then the bytes.
    # DeZero skips the header by offset; reading it turns a truncated or wrong file
    # into an error naming the file instead of a reshape failure.
    with gzip.open(filepath, "rb") as f:
        raw = f.read()
    header = 4 * (1 + ndim)
    got_magic = int.from_bytes(raw[:4], "big") if len(raw) >= 4 else None
    if got_magic != magic:
        found = "none" if got_magic is None else f"{got_magic:#010x}"
        raise ValueError(f"{filepath}: IDX magic number {found}, expected "
                         f"{magic:#010x}; the file is not the one its name says")
    if len(raw) < header:
        raise ValueError(f"{filepath}: the IDX header is truncated ({len(raw)} bytes)")
    dims = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    data = np.frombuffer(raw, np.uint8, offset=header)
    if data.size != int(np.prod(dims)):
        raise ValueError(f"{filepath}: header says {dims} ({int(np.prod(dims))} bytes of "
                         f"data), the file holds {data.size}; it is truncated or corrupt "
                         f"(delete it to download it again)")
    return data, dims


def _show(images, row, col):
    # A row x col grid of random images (N, C, H, W); matplotlib is imported only here.
    try:
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise ImportError("show() draws with matplotlib, which is not installed "
                          "(pip install matplotlib)") from e
    _, C, H, W = images.shape
    img = np.zeros((H * row, W * col, C))
    for r in range(row):
        for c in range(col):
            k = np.random.randint(0, len(images) - 1) if len(images) > 1 else 0
            img[r * H:(r + 1) * H, c * W:(c + 1) * W] = images[k].transpose(1, 2, 0) / 255
    plt.imshow(img[:, :, 0] if C == 1 else img, cmap="gray" if C == 1 else None,
               interpolation="nearest")
    plt.axis("off")
    plt.show()


class MNIST(Dataset):
    """28x28 handwritten digits: data uint8 (N, 1, 28, 28), label uint8 (N,).

    60000 training and 10000 test images from the gzip IDX files at DeZero's mirror.
    The default transform flattens an image to 784 float32 values in [0, 1].
    """

    url = "https://ossci-datasets.s3.amazonaws.com/mnist/"   # DeZero's mirror
    train_files = {"target": "train-images-idx3-ubyte.gz",
                   "label": "train-labels-idx1-ubyte.gz"}
    test_files = {"target": "t10k-images-idx3-ubyte.gz",
                  "label": "t10k-labels-idx1-ubyte.gz"}

    def __init__(self, train=True,
                 transform=Compose([Flatten(), ToFloat(), Normalize(0., 255.)]),
                 target_transform=None):
        super().__init__(train, transform, target_transform)

    def prepare(self):
        files = self.train_files if self.train else self.test_files
        data_path = utils.get_file(self.url + files["target"])
        label_path = utils.get_file(self.url + files["label"])
        self.data = self._load_data(data_path)
        self.label = self._load_label(label_path)
        if len(self.data) != len(self.label):
            raise ValueError(f"MNIST: {data_path} holds {len(self.data)} images but "
                             f"{label_path} {len(self.label)} labels")

    def _load_label(self, filepath):
        labels, _ = _read_idx(filepath, 0x00000801, 1)
        return labels

    def _load_data(self, filepath):
        data, (n, rows, cols) = _read_idx(filepath, 0x00000803, 3)
        return data.reshape(n, 1, rows, cols)

    def show(self, row=10, col=10):
        _show(self.data, row, col)

    @staticmethod
    def labels():
        return {i: str(i) for i in range(10)}


def _cifar_batches(filepath, names):
    # The pickled python-version batches inside the tar.gz, by member basename, read in
    # one pass over the archive (DeZero reopens it for every batch).
    found = {}
    with tarfile.open(filepath, "r:gz") as archive:
        for item in archive.getmembers():
            base = item.name.rsplit("/", 1)[-1]
            if base in names and item.isfile():
                found[base] = pickle.load(archive.extractfile(item), encoding="bytes")
    missing = [n for n in names if n not in found]
    if missing:
        raise ValueError(f"{filepath}: the archive has no member {missing[0]!r}; it is "
                         f"not the CIFAR python archive, or it is truncated (delete it "
                         f"to download it again)")
    return [found[n] for n in names]


def _batch_field(batch, key, filepath):
    if key not in batch:
        raise ValueError(f"{filepath}: a batch lacks the key {key!r} (it has "
                         f"{sorted(batch)})")
    return batch[key]


class CIFAR10(Dataset):
    """32x32 colour images in 10 classes: data uint8 (N, 3, 32, 32), label int (N,).

    50000 training images (data_batch_1..5) and 10000 test images (test_batch) from
    the python-version archive. The default transform is DeZero's: float32, then
    (x - 0.5) / 0.5 applied to the 0..255 values (not to [0, 1]).
    Difference from DeZero: training data stays uint8 (DeZero's is float64 with the
    same integer values, 1.2 GB); after the default transform the two are equal.
    """

    url = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"

    def __init__(self, train=True,
                 transform=Compose([ToFloat(), Normalize(mean=0.5, std=0.5)]),
                 target_transform=None):
        super().__init__(train, transform, target_transform)

    def _cache_key(self):
        return self.url

    def prepare(self):
        self.data, self.label = load_cache_npz(self._cache_key(), self.train)
        if self.data is not None:
            return
        filepath = utils.get_file(self.url)
        self.data, self.label = self._load(filepath)
        save_cache_npz(self.data, self.label, self._cache_key(), self.train)

    def _load(self, filepath):
        names = [f"data_batch_{i}" for i in range(1, 6)] if self.train else ["test_batch"]
        batches = _cifar_batches(filepath, names)
        data = np.concatenate([np.asarray(_batch_field(b, b"data", filepath), np.uint8)
                               for b in batches])
        label = np.concatenate([np.array(_batch_field(b, b"labels", filepath))
                                for b in batches])
        return data.reshape(-1, 3, 32, 32), label

    def show(self, row=10, col=10):
        _show(self.data, row, col)

    @staticmethod
    def labels():
        # DeZero spells the first 'ariplane'.
        return {0: "airplane", 1: "automobile", 2: "bird", 3: "cat", 4: "deer", 5: "dog",
                6: "frog", 7: "horse", 8: "ship", 9: "truck"}


_CIFAR100_COARSE = [
    "aquatic mammals", "fish", "flowers", "food containers", "fruit and vegetables",
    "household electrical device", "household furniture", "insects", "large carnivores",
    "large man-made outdoor things", "large natural outdoor scenes",
    "large omnivores and herbivores", "medium-sized mammals", "non-insect invertebrates",
    "people", "reptiles", "small mammals", "trees", "vehicles 1", "vehicles 2"]

# The archive's meta file lists these in this (alphabetical) order.
_CIFAR100_FINE = (
    "apple aquarium_fish baby bear beaver bed bee beetle bicycle bottle bowl boy bridge "
    "bus butterfly camel can castle caterpillar cattle chair chimpanzee clock cloud "
    "cockroach couch crab crocodile cup dinosaur dolphin elephant flatfish forest fox "
    "girl hamster house kangaroo keyboard lamp lawn_mower leopard lion lizard lobster "
    "man maple_tree motorcycle mountain mouse mushroom oak_tree orange orchid otter "
    "palm_tree pear pickup_truck pine_tree plain plate poppy porcupine possum rabbit "
    "raccoon ray road rocket rose sea seal shark shrew skunk skyscraper snail snake "
    "spider squirrel streetcar sunflower sweet_pepper table tank telephone television "
    "tiger tractor train trout tulip turtle wardrobe whale willow_tree wolf woman "
    "worm").split()


class CIFAR100(CIFAR10):
    """32x32 colour images in 100 fine (or 20 coarse) classes, CIFAR10's layout.

    Files `train` and `test` of the python-version archive. Difference from DeZero:
    coarse labels are cached apart from fine ones (DeZero's single cache file returns
    whichever label type was loaded first).
    """

    url = "https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz"

    def __init__(self, train=True,
                 transform=Compose([ToFloat(), Normalize(mean=0.5, std=0.5)]),
                 target_transform=None,
                 label_type="fine"):
        if label_type not in ("fine", "coarse"):
            raise ValueError(f"CIFAR100: label_type must be 'fine' or 'coarse', got "
                             f"{label_type!r}")
        self.label_type = label_type
        super().__init__(train, transform, target_transform)

    def _cache_key(self):
        # Fine labels keep DeZero's cache file name, so its cache is reused.
        return self.url if self.label_type == "fine" else self.url + ".coarse"

    def _load(self, filepath):
        (batch,) = _cifar_batches(filepath, ["train" if self.train else "test"])
        data = np.asarray(_batch_field(batch, b"data", filepath), np.uint8)
        key = b"fine_labels" if self.label_type == "fine" else b"coarse_labels"
        label = np.array(_batch_field(batch, key, filepath))
        return data.reshape(-1, 3, 32, 32), label

    @staticmethod
    def labels(label_type="fine"):
        # DeZero returns an empty list for 'fine'; these are the archive's names.
        names = _CIFAR100_FINE if label_type == "fine" else _CIFAR100_COARSE
        return dict(enumerate(names))


class ImageNet(Dataset):
    """Only ImageNet.labels(): the images are not downloadable (DeZero's is a stub)."""

    labels_url = ("https://gist.githubusercontent.com/yrevar/942d3a0ac09ec9e5eb3a/raw/"
                  "238f720ff059c1f82f368259d1ca4ffa5dd8f9f5/"
                  "imagenet1000_clsidx_to_labels.txt")

    def __init__(self):
        raise NotImplementedError("ImageNet's images are not downloadable; only "
                                  "ImageNet.labels() (class index -> name) is provided")

    @staticmethod
    def labels():
        """{class index: name} for the 1000 ILSVRC classes, from DeZero's URL."""
        path = utils.get_file(ImageNet.labels_url)
        with open(path, "r", encoding="utf-8") as f:
            text = f.read()
        # The file is a Python dict literal. DeZero eval()s it; literal_eval reads the
        # same dict and runs nothing a tampered download could put there.
        try:
            labels = ast.literal_eval(text)
        except (ValueError, SyntaxError) as e:
            raise ValueError(f"{path}: not the ImageNet label dict ({e}); delete it to "
                             f"download it again") from e
        if not isinstance(labels, dict):
            raise ValueError(f"{path}: expected a dict literal, got {type(labels).__name__}")
        return labels


class Shakespear(Dataset):
    """Tiny Shakespeare as character ids: data[i] is char i, label[i] char i + 1.

    Ids are given in order of first appearance; char_to_id and id_to_char map them.
    DeZero's spelling of the class name and of the cache file (shakespear.txt).
    """

    url = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/" \
          "tinyshakespeare/input.txt"
    file_name = "shakespear.txt"

    def prepare(self):
        path = utils.get_file(self.url, self.file_name)
        with open(path, "r", encoding="utf-8") as f:
            data = f.read()

        char_to_id = {}
        id_to_char = {}
        for c in data:
            if c not in char_to_id:
                new_id = len(char_to_id)
                char_to_id[c] = new_id
                id_to_char[new_id] = c

        indices = np.array([char_to_id[c] for c in data], dtype=np.int_)
        self.data = indices[:-1]
        self.label = indices[1:]
        self.char_to_id = char_to_id
        self.id_to_char = id_to_char


# ================================================================ npz cache

def _cache_npz_path(filename, train):
    filename = filename[filename.rfind("/") + 1:]
    suffix = ".train.npz" if train else ".test.npz"
    return filename + suffix, os.path.join(utils.get_cache_dir(), filename + suffix)


def load_cache_npz(filename, train=False):
    """(data, label) saved by save_cache_npz for this URL or name, or (None, None)."""
    _, filepath = _cache_npz_path(filename, train)
    if not os.path.exists(filepath):
        return None, None
    with np.load(filepath) as loaded:
        return loaded["data"], loaded["label"]


def save_cache_npz(data, label, filename, train=False):
    """Save (data, label) as <cache>/<basename>.train.npz (or .test.npz); keeps an
    existing file. Returns the path written, or None when it was already there."""
    name, filepath = _cache_npz_path(filename, train)
    if os.path.exists(filepath):
        return None
    os.makedirs(os.path.dirname(filepath), exist_ok=True)

    print("Saving: " + name)
    # Written under a temporary name and renamed: an interrupted save must not leave
    # a file load_cache_npz would trust.
    part = filepath[:-len(".npz")] + ".part.npz"
    try:
        np.savez_compressed(part, data=data, label=label)
        os.replace(part, filepath)
    except BaseException:
        if os.path.exists(part):
            os.remove(part)
        raise
    print(" Done")
    return filepath
