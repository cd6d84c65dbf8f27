"""A user Function whose backward reads its input's `.data` when it runs (detached:
eager loses the second derivative there, and reads the array the Variable holds at
backward time, not the call's): the tests of rebinds between a call and its backward
share it."""
import numpy as np

import tracejit as tj


class TanhData(tj.Function):
    def forward(self, x):
        return np.tanh(x)

    def backward(self, gy):
        y = np.tanh(self.inputs[0].data)       # detached: eager's own (lossy) rule
        return gy * (1 - y * y)
