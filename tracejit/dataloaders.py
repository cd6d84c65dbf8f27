"""tracejit.dataloaders: mini-batch iterators over a Dataset (DeZero's, CPU only).

Each batch is a pair of fresh ndarrays (x, t) stacked from dataset[i]; all batches
but the last have batch_size rows, so a jitted step sees at most two shapes per epoch.
"""
import math

import numpy as np


class DataLoader:
    def __init__(self, dataset, batch_size, shuffle=True, gpu=False):
        if gpu:
            from tracejit import cuda
            raise cuda.no_gpu(f"{type(self).__name__}(gpu=True)")
        self.dataset = dataset
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.data_size = len(dataset)
        self.max_iter = math.ceil(self.data_size / batch_size)
        self.gpu = False
        self.reset()

    def reset(self):
        self.iteration = 0
        if self.shuffle:
            self.index = np.random.permutation(len(self.dataset))
        else:
            self.index = np.arange(len(self.dataset))

    def __iter__(self):
        return self

    def __next__(self):
        if self.iteration >= self.max_iter:
            # Reshuffle for the next epoch: `for x, t in loader` once per epoch.
            self.reset()
            raise StopIteration

        i, batch_size = self.iteration, self.batch_size
        batch_index = self.index[i * batch_size:(i + 1) * batch_size]
        batch = [self.dataset[i] for i in batch_index]
        x = np.array([example[0] for example in batch])
        t = np.array([example[1] for example in batch])

        self.iteration += 1
        return x, t

    def next(self):
        return self.__next__()

    def __len__(self):
        return self.max_iter

    def to_cpu(self):
        self.gpu = False

    def to_gpu(self):
        # DeZero sets the flag and fails at the next batch; this fails here, saying why.
        from tracejit import cuda
        raise cuda.no_gpu(f"{type(self).__name__}.to_gpu")


class SeqDataLoader(DataLoader):
    """Batches for truncated BPTT: row k of batch i is element (k * jump + i) mod size."""

    def __init__(self, dataset, batch_size, gpu=False):
        super().__init__(dataset=dataset, batch_size=batch_size, shuffle=False, gpu=gpu)

    def __next__(self):
        if self.iteration >= self.max_iter:
            self.reset()
            raise StopIteration

        jump = self.data_size // self.batch_size
        batch_index = [(i * jump + self.iteration) % self.data_size
                       for i in range(self.batch_size)]
        batch = [self.dataset[i] for i in batch_index]
        x = np.array([example[0] for example in batch])
        t = np.array([example[1] for example in batch])

        self.iteration += 1
        return x, t
