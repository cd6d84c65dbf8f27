"""Higher-order derivatives of tanh, and the size of their graphs (DeZero step 35).

Each backward(create_graph=True) builds the next derivative's graph, which grows
quickly with the order. The values are checked against the closed forms in y = tanh x.
Run: python examples/tanh_higher_order.py
"""
import numpy as np

import tracejit as tj
import tracejit.functions as F


def nth_derivatives(x0, order):
    """[f(x0), f'(x0), ..., f^(order)(x0)] for f = tanh, plus each graph's node count."""
    x = tj.Variable(np.array(x0))
    y = F.tanh(x)
    values, sizes = [float(y.data)], [graph_size(y)]
    for _ in range(order):
        x.cleargrad()
        y.backward(create_graph=True)
        y = x.grad
        values.append(float(y.data))
        sizes.append(graph_size(y))
    return values, sizes


def graph_size(v):
    """Number of Functions in the graph that produced v."""
    seen, stack = set(), [v.creator] if v.creator else []
    while stack:
        f = stack.pop()
        if f in seen:
            continue
        seen.add(f)
        stack.extend(x.creator for x in f.inputs if x.creator is not None)
    return len(seen)


def closed_forms(x0):
    y = np.tanh(x0)
    d1 = 1 - y ** 2
    d2 = -2 * y * d1
    d3 = (6 * y ** 2 - 2) * d1
    d4 = (-24 * y ** 3 + 16 * y) * d1
    return [y, d1, d2, d3, d4]


def main(x0=1.0, order=4):
    values, sizes = nth_derivatives(x0, order)
    for n, (value, size) in enumerate(zip(values, sizes)):
        print(f"d^{n} tanh(x)/dx^{n} at x={x0}: {value:+.10f}   ({size} functions in its graph)")
    assert np.allclose(values, closed_forms(x0), rtol=1e-12, atol=1e-12), values
    assert sizes == sorted(sizes) and sizes[-1] > sizes[1], sizes


if __name__ == "__main__":
    main()
