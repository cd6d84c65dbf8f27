"""testing.assert_jit_matches_eager takes 0-d arguments (Variable and ndarray): their
perturbed copies are 0-d arrays (a TypeError from Variable(np.float64) before)."""
import numpy as np

import tracejit as tj
import tracejit.functions as F
from tracejit.testing import assert_jit_matches_eager


def test_zero_d_variable_beside_rank_3():
    info = assert_jit_matches_eager(lambda s, x: F.tanh(s * x + s),
                                    tj.Variable(np.array(0.3)),
                                    tj.Variable(np.random.RandomState(0).rand(2, 1, 3)))
    assert info["hits"] >= 3


def test_zero_d_ndarray_argument():
    info = assert_jit_matches_eager(lambda s, x: F.sum(F.exp(x * s)), np.array(0.5),
                                    tj.Variable(np.random.RandomState(1).rand(4)))
    assert info["hits"] >= 3
