"""Gradients of three optimisation test functions at (1, 1) (DeZero step 24).

Each function is written with ordinary operators on Variables; one backward pass
gives both partial derivatives. Run: python examples/goldstein_price.py
"""
import numpy as np

import tracejit as tj


def sphere(x, y):
    return x ** 2 + y ** 2


def matyas(x, y):
    return 0.26 * (x ** 2 + y ** 2) - 0.48 * x * y


def goldstein(x, y):
    a = 1 + (x + y + 1) ** 2 * (19 - 14 * x + 3 * x ** 2 - 14 * y + 6 * x * y + 3 * y ** 2)
    b = 30 + (2 * x - 3 * y) ** 2 * (18 - 32 * x + 12 * x ** 2 + 48 * y - 36 * x * y
                                     + 27 * y ** 2)
    return a * b


def gradient(f, x0=1.0, y0=1.0):
    """(f(x0, y0), df/dx, df/dy) by backprop."""
    x = tj.Variable(np.array(x0), name="x")
    y = tj.Variable(np.array(y0), name="y")
    z = f(x, y)
    z.backward()
    return float(z.data), float(x.grad.data), float(y.grad.data)


EXPECTED = {  # (value, df/dx, df/dy) at (1, 1), worked out by hand
    sphere: (2.0, 2.0, 2.0),
    matyas: (0.04, 0.040000000000000036, 0.040000000000000036),
    goldstein: (1876.0, -5376.0, 8064.0),
}


def main():
    for f, expected in EXPECTED.items():
        value, gx, gy = gradient(f)
        print(f"{f.__name__:>9}(1, 1) = {value:<8g} grad = ({gx:g}, {gy:g})")
        assert np.allclose((value, gx, gy), expected, rtol=1e-12, atol=1e-12), (f, value, gx, gy)

    # The same gradients compiled: one decorator, the function unchanged. The first
    # calls warm up, trace and check; then one fused kernel runs value and gradient.
    for f in EXPECTED:
        f_jit = tj.jit(f)
        rng = np.random.default_rng(0)
        for _ in range(5):
            x0, y0 = rng.uniform(-1.5, 1.5, 2)
            assert np.allclose(gradient(f_jit, x0, y0), gradient(f, x0, y0), rtol=1e-12)
        info = f_jit.cache_info()
        print(f"jit({f.__name__}): {info['hits']} compiled calls, "
              f"{info['fallbacks']} fallbacks, agrees with eager")
        assert info["fallbacks"] == 0, info


if __name__ == "__main__":
    main()
