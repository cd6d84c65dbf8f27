"""What a NumPy call's result is, compared: the same type (a NumPy scalar is not a 0-d
array), dtype and values, for the tests of NumPy calls on traced data."""
import numpy as np


def assert_same_result(e, j):
    assert type(j) is type(e), (type(e), type(j))
    assert np.asarray(j).dtype == np.asarray(e).dtype
    np.testing.assert_array_equal(np.asarray(j), np.asarray(e))
