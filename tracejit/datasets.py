"""tracejit.datasets: Dataset and the small built-in datasets DeZero's examples use.

Eager-side data handling, unrelated to tracing. Spiral reproduces DeZero's
get_spiral draw for draw (it reseeds NumPy's global generator, as DeZero does, so
weights initialised after loading it match DeZero's too). The downloaded datasets
(MNIST, CIFAR) are not included: tracejit installs and tests without a network.
"""
import numpy as np


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
