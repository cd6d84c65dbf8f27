"""Newton's method with a second derivative from autodiff (DeZero step 33).

backward(create_graph=True) records the backward pass itself, so the first
derivative is a Variable with a history and can be differentiated again.
Minimises f(x) = x^4 - 2x^2 from x = 2; the minimum is at x = 1.
Run: python examples/newton.py
"""
import numpy as np

import tracejit as tj


def f(x):
    return x ** 4 - 2 * x ** 2


def derivatives(x, fn=f):
    """f'(x) and f''(x) as floats, for a Variable x holding a scalar."""
    x.cleargrad()
    y = fn(x)
    y.backward(create_graph=True)
    gx = x.grad                 # 4x^3 - 4x, still connected to x
    x.cleargrad()
    gx.backward()
    gx2 = x.grad                # 12x^2 - 4
    return float(gx.data), float(gx2.data)


def newton(x0=2.0, iters=10, fn=f):
    x = tj.Variable(np.array(x0))
    history = [x0]
    for _ in range(iters):
        gx, gx2 = derivatives(x, fn)
        x.data = x.data - gx / gx2
        history.append(float(x.data))
    return history


def main():
    d1, d2 = derivatives(tj.Variable(np.array(2.0)))
    print(f"f'(2) = {d1:g}, f''(2) = {d2:g}")
    assert (d1, d2) == (24.0, 44.0)

    history = newton()
    for i, x in enumerate(history):
        print(f"{i:2d}  x = {x:.12f}")
    assert abs(history[-1] - 1.0) < 1e-12, history[-1]
    assert all(a >= b for a, b in zip(history, history[1:])), "from 2, x decreases monotonically"

    # f compiled: the second derivative goes through the compiled region
    # (backward(create_graph=True) replays it as a differentiable graph).
    f_jit = tj.jit(f)
    jit_history = newton(fn=f_jit)
    assert np.allclose(jit_history, history, rtol=1e-12), (jit_history, history)
    info = f_jit.cache_info()
    print(f"jit(f): the same {len(jit_history) - 1} Newton steps, {info['hits']} compiled "
          f"calls, {info['fallbacks']} fallbacks")
    assert info["fallbacks"] == 0, info


if __name__ == "__main__":
    main()
