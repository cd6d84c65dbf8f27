"""gradcheck must catch planted gradient bugs in user Functions and pass correct ones."""
import numpy as np
import pytest

import tracejit
import tracejit.functions as F
from tracejit import Function, Variable
from tracejit.testing import gradcheck

# The jit placeholder: gradcheck(jit=True) also checks values and gradients through
# tracejit.jit(f). Enabled as soon as tracejit has a jit.
JIT_MODES = [
    pytest.param(False, id="eager"),
    pytest.param(True, id="jit", marks=pytest.mark.skipif(
        not hasattr(tracejit, "jit"), reason="tracejit.jit not yet available")),
]

RNG = np.random.default_rng(0)
X = RNG.uniform(-2, 2, (3, 4))


# ---------------------------------------------------------------- correct Functions

class Square(Function):
    def forward(self, x):
        return x ** 2

    def backward(self, gy):
        x, = self.inputs
        return 2 * x * gy


class Sin(Function):
    def forward(self, x):
        return np.sin(x)

    def backward(self, gy):
        x, = self.inputs
        return gy * Cos()(x)


class Cos(Function):
    def forward(self, x):
        return np.cos(x)

    def backward(self, gy):
        x, = self.inputs
        return gy * -F.sin(x)


class BroadcastMul(Function):
    def forward(self, x0, x1):
        return x0 * x1

    def backward(self, gy):
        x0, x1 = self.inputs
        return F.sum_to(gy * x1, x0.shape), F.sum_to(gy * x0, x1.shape)


class Reverse(Function):
    """y = 3 * x[::-1] along the first axis."""

    def forward(self, x):
        return 3 * x[::-1]

    def backward(self, gy):
        return 3 * gy[::-1]


class SplitHalves(Function):
    """Two outputs: the first row times 2, the second row squared."""

    def forward(self, x):
        return 2 * x[0], x[1] ** 2

    def backward(self, g0, g1):
        x, = self.inputs
        return _stack_rows(2 * g0, 2 * x[1] * g1)


def _stack_rows(a, b):
    top = Variable(np.array([[1.0], [0.0]], dtype=a.dtype))
    return F.expand_dims(a, 0) * top + F.expand_dims(b, 0) * (1 - top)


CORRECT = {
    "square": (lambda x: Square()(x), (X,)),
    "sin": (lambda x: Sin()(x), (X,)),
    "broadcast_mul": (lambda a, b: BroadcastMul()(a, b), (X[:, :1], X[0])),
    "reverse": (lambda x: Reverse()(x), (X,)),
    "two_outputs": (lambda x: SplitHalves()(x), (X[:2, :3],)),
}


def _correct_params():
    for name in sorted(CORRECT):
        for mode in JIT_MODES:
            jit = mode.values[0]
            yield pytest.param(name, jit, marks=list(mode.marks), id=f"{name}-{mode.id}")


@pytest.mark.parametrize("name,jit", list(_correct_params()))
def test_correct_functions_pass(name, jit):
    f, inputs = CORRECT[name]
    assert gradcheck(f, *inputs, second_order=True, jit=jit) is True
    assert gradcheck(f, *[a.astype(np.float32) for a in inputs], jit=jit) is True


# ---------------------------------------------------------------- planted bugs

class WrongSign(Square):
    def backward(self, gy):
        x, = self.inputs
        return -2 * x * gy


class MissingFactor(Square):
    def backward(self, gy):
        x, = self.inputs
        return x * gy


class MissingSumTo(BroadcastMul):
    def backward(self, gy):
        x0, x1 = self.inputs
        return gy * x1, gy * x0


class MeanInsteadOfSum(BroadcastMul):
    def backward(self, gy):
        x0, x1 = self.inputs
        g0 = F.sum_to(gy * x1, x0.shape)
        g1 = F.sum_to(gy * x0, x1.shape) / gy.shape[0]
        return g0, g1


class PermutedGradient(Function):
    """Elementwise 3 * x, but backward returns the gradient reversed."""

    def forward(self, x):
        return 3 * x

    def backward(self, gy):
        return 3 * gy[::-1]


class WrongSecondOrderFrozen(Sin):
    """Right first derivative, but cos(x) is computed from .data: no second derivative."""

    def backward(self, gy):
        x, = self.inputs
        return gy * Variable(np.cos(x.data))


class BadCos(Cos):
    def backward(self, gy):
        x, = self.inputs
        return gy * F.sin(x)                 # the sign is wrong


class WrongSecondOrderFormula(Sin):
    """Right first derivative through a Cos whose own backward is wrong."""

    def backward(self, gy):
        x, = self.inputs
        return gy * BadCos()(x)


class WrongSecondOutput(SplitHalves):
    def backward(self, g0, g1):
        x, = self.inputs
        return _stack_rows(2 * g0, x[1] * g1)


class Float64Gradient(Square):
    """Right values, but the gradient of a float32 input comes back as float64."""

    def backward(self, gy):
        x, = self.inputs
        return Variable((2 * x.data * gy.data).astype(np.float64))


BUGS = {
    "wrong_sign": (lambda x: WrongSign()(x), (X,), {}),
    "missing_factor": (lambda x: MissingFactor()(x), (X,), {}),
    "missing_sum_to": (lambda a, b: MissingSumTo()(a, b), (X[:, :1], X[0]), {}),
    "missing_sum_to_leading": (lambda a, b: MissingSumTo()(a, b), (X, X[0]), {}),
    "mean_instead_of_sum": (lambda a, b: MeanInsteadOfSum()(a, b), (X, X[0]), {}),
    "permuted": (lambda x: PermutedGradient()(x), (X,), {}),
    "second_order_frozen": (lambda x: WrongSecondOrderFrozen()(x), (X,),
                            {"second_order": True}),
    "second_order_formula": (lambda x: WrongSecondOrderFormula()(x), (X,),
                             {"second_order": True}),
    "second_output": (lambda x: WrongSecondOutput()(x), (X[:2, :3],), {}),
    "float32_gradient_dtype": (lambda x: Float64Gradient()(x), (X.astype(np.float32),), {}),
}


@pytest.mark.parametrize("jit", JIT_MODES)
@pytest.mark.parametrize("name", sorted(BUGS))
def test_planted_bug_is_caught(name, jit):
    f, inputs, kwargs = BUGS[name]
    with pytest.raises(AssertionError):
        gradcheck(f, *inputs, jit=jit, **kwargs)


@pytest.mark.parametrize("name", ["second_order_frozen", "second_order_formula"])
def test_second_order_bugs_have_right_first_derivative(name):
    f, inputs, _ = BUGS[name]
    assert gradcheck(f, *inputs) is True
    with pytest.raises(AssertionError, match="second-order"):
        gradcheck(f, *inputs, second_order=True)


def test_permuted_gradient_needs_random_cotangents():
    # With all-ones cotangents a reversed gradient of 3 * x looks right: this is why
    # gradcheck draws random cotangents by default.
    f = BUGS["permuted"][0]
    assert gradcheck(f, X, cotangents=[np.ones(X.shape)]) is True
    with pytest.raises(AssertionError):
        gradcheck(f, X)
    for seed in range(5):
        with pytest.raises(AssertionError):
            gradcheck(f, X, seed=seed)


def test_missing_sum_to_message_names_shapes():
    f = BUGS["missing_sum_to"][0]
    with pytest.raises(AssertionError, match=r"input 0 with shape \(3, 1\).*shape \(3, 4\)"):
        gradcheck(f, X[:, :1], X[0])


# ---------------------------------------------------------------- the failure message

def test_failure_message_names_input_element_values_and_tolerances():
    x = Variable(np.array([[1.0, 2.0], [3.0, 4.0]]), name="weights")
    with pytest.raises(AssertionError) as info:
        gradcheck(lambda a, b: MissingFactor()(b) + a, np.ones((2, 2)), x, rtol=1e-5, atol=1e-7,
                  cotangents=[np.ones((2, 2))])
    msg = str(info.value)
    assert "input 1 ('weights') with shape (2, 2)" in msg
    assert "worst element at index (1, 1)" in msg     # |x| largest there: 2x vs x
    assert "analytic=" in msg and "numeric=" in msg
    assert "rtol=1e-05" in msg and "atol=1e-07" in msg


def test_failure_message_zero_dim():
    with pytest.raises(AssertionError, match=r"input 0 with shape \(\): worst element at "
                                             r"index \(\)"):
        gradcheck(lambda x: WrongSign()(x), np.array(1.5))


def test_worst_element_value_is_reported():
    x = np.array([0.5, -3.0, 1.0])
    with pytest.raises(AssertionError) as info:
        gradcheck(lambda a: MissingFactor()(a), x, cotangents=[np.ones(3)])
    msg = str(info.value)
    assert "index (1,)" in msg
    assert "analytic=-3.0," in msg
    assert "numeric=-6.0" in msg or "numeric=-5.99999" in msg


# ---------------------------------------------------------------- inputs

def test_int_labels_pass_through_unchecked():
    x = RNG.standard_normal((4, 3))
    t = np.array([0, 2, 1, 2])
    assert gradcheck(F.softmax_cross_entropy, x, t, second_order=True)
    assert gradcheck(F.softmax_cross_entropy, x, Variable(t))


def test_python_numbers_pass_through():
    assert gradcheck(lambda x, c: x * c + F.sin(x), X, 2.5, second_order=True)


def test_float32_inputs_checked_in_float64():
    x = X.astype(np.float32)
    assert gradcheck(lambda a: F.tanh(a) * a, x, second_order=True)


# Inputs in any memory layout: the numeric side perturbs each element of its float64
# copy by index (a reshaped alias of an F-ordered or strided copy is a copy, and
# perturbing it gave a numeric gradient of 0).
LAYOUTS = {
    "fortran": lambda: np.asfortranarray(np.arange(1., 7.).reshape(2, 3)),
    "transposed": lambda: np.arange(1., 7.).reshape(3, 2).T,
    "strided": lambda: np.arange(1., 13.).reshape(3, 4)[:, ::2],
    "reversed": lambda: np.arange(1., 7.).reshape(2, 3)[::-1, ::-1],
}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_inputs_in_any_memory_layout(layout):
    x = LAYOUTS[layout]()
    assert gradcheck(lambda a: a * a, x)
    assert gradcheck(lambda a, b: F.sin(a) * b, x, x.copy(order="C"), second_order=True)
    assert gradcheck(lambda a: F.tanh(a) * a, x.astype(np.float32))


class ZeroGrad(Function):
    # A planted bug that a numeric gradient of 0 would pass.
    def forward(self, x):
        return x * x

    def backward(self, gy):
        return gy * 0


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_a_wrong_gradient_is_caught_in_any_memory_layout(layout):
    with pytest.raises(AssertionError, match="numeric="):
        gradcheck(lambda a: ZeroGrad()(a), LAYOUTS[layout]())


def test_outputs_independent_of_an_input():
    assert gradcheck(lambda a, b: F.sin(a), X, X)


def test_bad_cotangents_are_rejected():
    with pytest.raises(ValueError, match="cotangents"):
        gradcheck(F.sin, X, cotangents=[np.ones(3)])


def test_gradcheck_with_jit():
    from tracejit.testing import gradcheck
    r = np.random.default_rng(23)
    f = lambda x, y: F.tanh(F.matmul(x, y)) * 2 + F.sum(x)
    assert gradcheck(f, r.standard_normal((3, 4)), r.standard_normal((4, 2)), jit=True)
