"""A small CNN on MNIST-format data (DeZero steps 57-58): Conv2d, ReLU, max pooling,
Linear, softmax cross-entropy and SGD, the training step compiled with @tj.jit beside
the same training run eagerly; the two must agree step for step, with no fallback.

This machine (and CI) has no network, so by default the example writes a small data
set in MNIST's own file format (gzip IDX, the four files of the real download) into a
temporary directory, points TRACEJIT_DATA there and loads it through
tracejit.datasets.MNIST, the code that reads the real files. The images are synthetic
(each class a stroke at its own place, plus noise) so that a few steps learn them.
With --full it trains on the real MNIST from the cache directory (~/.dezero or
$TRACEJIT_DATA), downloading it if the files are not there.

Run: python examples/cnn_mnist.py [--full]
"""
import argparse
import gzip
import os
import tempfile
import time

import numpy as np

import tracejit as tj
import tracejit.functions as F
import tracejit.layers as L
from tracejit import optimizers
from tracejit.datasets import MNIST
from tracejit.models import Model


class CNN(Model):
    def __init__(self, channels=8):
        super().__init__()
        self.conv1 = L.Conv2d(channels, 3, pad=1)      # in_channels from the first call
        self.conv2 = L.Conv2d(2 * channels, 3, pad=1)
        self.fc = L.Linear(10)

    def forward(self, x):
        x = F.pooling(F.relu(self.conv1(x)), 2, 2)
        x = F.pooling(F.relu(self.conv2(x)), 2, 2)
        return self.fc(F.reshape(x, (x.shape[0], -1)))


def write_idx(path, array, magic):
    # IDX: a big-endian int32 magic number, one int32 per dimension, then the bytes.
    header = magic.to_bytes(4, "big") + b"".join(n.to_bytes(4, "big") for n in array.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + array.astype(np.uint8).tobytes())


def synthetic_mnist(directory, n_train, n_test, seed=0):
    """Write the four MNIST files into directory: class k is a 3-pixel-wide stroke,
    horizontal for k < 5 and vertical otherwise, at a place set by k, plus noise."""
    rng = np.random.default_rng(seed)
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        labels = rng.integers(0, 10, n)
        images = rng.integers(0, 60, (n, 28, 28))
        for img, k in zip(images, labels):
            at = 3 + 4 * (k % 5) + rng.integers(-1, 2)
            if k < 5:
                img[at:at + 3, 4:24] = 255
            else:
                img[4:24, at:at + 3] = 255
        write_idx(os.path.join(directory, f"{prefix}-images-idx3-ubyte.gz"), images,
                  0x00000803)
        write_idx(os.path.join(directory, f"{prefix}-labels-idx1-ubyte.gz"), labels,
                  0x00000801)


def to_image(x):
    # (1, 28, 28) float32 in [0, 1]: MNIST's default transform flattens to 784 values.
    return x.astype(np.float32) / 255.0


def train(train_set, epochs, batch_size, jit):
    np.random.seed(0)                    # the same weight draws for both runs
    model = CNN()
    optimizer = optimizers.SGD(0.1).setup(model)

    def step(x, t):
        loss = F.softmax_cross_entropy(model(x), t)
        model.cleargrads()
        loss.backward()
        optimizer.update()
        return loss

    if jit:
        step = tj.jit(step)
    # Batches of equal size (the loader drops nothing, so the size divides the data):
    # a last smaller batch would be a new shape, compiled once more.
    loader = tj.DataLoader(train_set, batch_size, shuffle=False)
    losses = []
    t0 = time.perf_counter()
    for epoch in range(epochs):
        total = 0.0
        for x, t in loader:
            loss = step(x, t)
            losses.append(float(loss.data))
            total += losses[-1] * len(t)
        print(f"  {'jit  ' if jit else 'eager'} epoch {epoch + 1}  loss "
              f"{total / len(train_set):.4f}")
    seconds = time.perf_counter() - t0
    if jit:
        info = step.cache_info()
        print(f"  jitted step: {info}")
        assert info["fallbacks"] == 0, info
    return model, losses, seconds


def accuracy(model, dataset, n=2000):
    x = np.stack([dataset[i][0] for i in range(min(n, len(dataset)))])
    t = np.array([dataset[i][1] for i in range(min(n, len(dataset)))])
    with tj.no_grad(), tj.test_mode():
        return float(F.accuracy(model(x), t).data)


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--full", action="store_true",
                   help="the real MNIST (cached or downloaded), 60000 images, 2 epochs")
    args = p.parse_args()
    tmp = None
    if not args.full:
        tmp = tempfile.TemporaryDirectory(prefix="tracejit_mnist_")
        synthetic_mnist(tmp.name, n_train=320, n_test=200)
        os.environ["TRACEJIT_DATA"] = tmp.name
    try:
        train_set = MNIST(train=True, transform=to_image)
        test_set = MNIST(train=False, transform=to_image)
        if not args.full:
            assert len(train_set) == 320 and train_set[0][0].shape == (1, 28, 28)
        epochs, batch = (2, 100) if args.full else (3, 32)
        if args.full:          # 60000 = 600 batches of 100
            assert len(train_set) % batch == 0
        model, losses, t_jit = train(train_set, epochs, batch, jit=True)
        _, eager_losses, t_eager = train(train_set, epochs, batch, jit=False)
        # float32 throughout: the compiled kernels may sum in another order.
        np.testing.assert_allclose(losses, eager_losses, rtol=2e-4, atol=1e-5)
        print(f"jitted and eager training agree step by step ({len(losses)} steps; "
              f"jit {t_jit:.2f} s including its compile, eager {t_eager:.2f} s)")
        acc = accuracy(model, test_set)
        print(f"test accuracy {acc:.3f}")
        assert acc > (0.95 if args.full else 0.8), acc
    finally:
        if tmp is not None:
            tmp.cleanup()


if __name__ == "__main__":
    main()
