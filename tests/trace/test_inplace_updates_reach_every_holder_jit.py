"""An in-place update of a buffer reaches everything that holds that buffer.

In eager, `W * K` wraps the array K in a Variable that holds K's buffer, `d = x.data` is
x's buffer, `Variable(a)` holds a: an in-place update of the buffer afterwards (`K *=
0.9`, `x.data *= 2`, `a += 1`) is what their later uses read, a backward's among them.
Compiled calls read the updated value there too, and stay compiled; a holder of part of
the buffer used after the update runs eagerly, warned. Each function is called at least
four times after its trace with new values and its captured state changed by the call
itself, compared with eager (values, state, gradients).
"""
import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F
from tracejit import Parameter, Variable
from tracejit.testing import assert_jit_matches_eager

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")


def var_args(shape=(3,)):
    return lambda k: (Variable(np.random.RandomState(k).randn(*shape)),)


def compiled(info):
    assert info["fallbacks"] == 0 and info["hits"] >= 4, info


def captured_array_step(read_before):
    def make():
        K = np.random.RandomState(0).randn(3)
        W = Parameter(np.random.RandomState(1).randn(3))

        def f(x):
            nonlocal K
            a = F.sum(W * K * x) if read_before else 0.0
            K *= 0.9                       # in place: W * K's Variable holds K
            loss = a + F.sum(F.tanh(W * K))
            W.cleargrad()
            loss.backward()
            W.data -= 0.1 * W.grad.data
            return loss
        return f, (K, W)
    return make


@pytest.mark.parametrize("read_before", [False, True], ids=["updated-first", "read-first"])
def test_a_captured_array_updated_in_place_before_a_backward_inside(read_before):
    info = assert_jit_matches_eager(make_function=captured_array_step(read_before),
                                    make_args=var_args(), calls=5)
    compiled(info)


def test_the_captured_array_of_a_forward_op_updated_before_the_backward():
    def make():
        K = np.random.RandomState(0).randn(3) + 2.0
        W = Parameter(np.random.RandomState(1).randn(3))

        def f(x):
            nonlocal K
            loss = F.sum(F.sin(W * K) * x)
            K -= 0.1 * K                 # eager's backward of W * K reads the new K
            W.cleargrad()
            loss.backward()
            W.data -= 0.1 * W.grad.data
            return loss
        return f, (K, W)
    compiled(assert_jit_matches_eager(make_function=make, make_args=var_args(), calls=5))


def test_an_argument_array_updated_after_the_op_that_read_it():
    def make():
        W = Parameter(np.random.RandomState(1).randn(3))

        def f(x):
            loss = F.sum(W * x)
            x *= 2.0                     # the argument's buffer: read by W * x's backward
            W.cleargrad()
            loss.backward()
            W.data -= 0.1 * W.grad.data
            return loss, W.grad
        return f, (W,)
    compiled(assert_jit_matches_eager(
        make_function=make, make_args=lambda k: (np.random.RandomState(k).randn(3),),
        calls=5))


def test_a_variable_of_a_computed_array_updated_in_place_later():
    def f(x):
        a = x.data * 2.0
        v = Variable(a)
        a += 1.0                         # v holds a: it is 2x + 1 now
        return F.sum(v * x)

    compiled(assert_jit_matches_eager(f, make_args=var_args(), calls=5))


def test_data_read_before_an_update_of_its_variable():
    def f(x):
        d = x.data
        x.data *= 2.0                    # d is x's buffer
        return F.sum(F.exp(d)), x

    compiled(assert_jit_matches_eager(f, make_args=var_args(), calls=5, backward=False))


def test_a_captured_parameters_data_read_before_it_is_updated():
    def make():
        P = Parameter(np.random.RandomState(2).rand(3) + 1.0)

        def f(x):
            d = P.data
            P.data *= 0.5
            return F.sum(x * d)          # eager: the halved data
        return f, (P,)
    compiled(assert_jit_matches_eager(make_function=make, make_args=var_args(), calls=5))


def test_a_variable_of_part_of_a_buffer_used_after_an_update_runs_eagerly(
        record_jit_warnings):
    def make():
        K = np.arange(4.0) + 1.0

        def f(x):
            nonlocal K
            v = Variable(K[0:3])          # part of K's buffer
            K *= 0.5
            return F.sum(v * x)
        return f, (K,)
    info = assert_jit_matches_eager(make_function=make, make_args=var_args(), calls=4,
                                    allow_fallback=True)
    assert info["hits"] == 0
    assert any("in-place update" in str(w.message) for w in record_jit_warnings)
