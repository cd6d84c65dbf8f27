# tracejit fuzzer: a mismatch it found (kept as a regression test: tests/testing/test_found_programs_match.py)
#   call 5: gradient of capture W0: value differs by 0.111 (jit -0.9579187810145402, eager -1.0689008969414953; rtol 0.001 of the magnitude 1.37, atol 9.5e-07); jit [[0.16212, ..., 0.19386], [1.20455, ..., 0.05213]], eager [[0.17078, ..., 0.2533 ], [1.30382, ..., 0.06363]]
#   also (state after the call: value): call 5: state after the call: capture W0.grad: value differs by 0.111 (jit -0.9579187810145402, eager -1.0689008969414953; rtol 0.001 of the magnitude 1.37, atol 9.5e-07); jit [[0.16212, ..., 0.19386]
# Run: python THIS_FILE  (jit vs eager, call by call; prints the first difference)
import numpy as np
import tracejit as tj
import tracejit.functions as F


class SignScale(tj.Function):
    # Keeps per-call state on self: this call's sign decides its backward's factor.
    def forward(self, x):
        self.k = 2.0 if x.sum() > 0 else -3.0
        return x * self.k

    def backward(self, gy):
        return gy * self.k


# captured state, read as module globals
W0 = tj.Parameter(np.random.default_rng(1759).uniform(-1.0, 1.0, (2, 4)).astype(np.float64))
W2 = tj.Parameter(np.random.default_rng(1793).uniform(-1.0, 1.0, (2, 4)).astype(np.float32))


# state f rebinds (an RNN's h), None until its first call
class Holder:
    def __repr__(self):     # passed as an argument: compared by repr
        return 'Holder()'   # (its h: by STATE())

H0 = None


def STATE():
    """The state after a call (the harness compares it)."""
    return {'H0': H0}


def make():
    # captured state, read through the closure
    W1 = tj.Parameter(np.random.default_rng(1776).uniform(-1.0, 1.0, (4,)).astype(np.float32))
    W3 = tj.Parameter(np.random.default_rng(1810).uniform(-1.0, 1.0, ()).astype(np.float32))

    def f(x0, x1, x2):
        global H0
        h1 = x0 * x0
        h2 = tj.grad(lambda z: F.sum(SignScale()(z) * z))(x2)
        h3 = x1 * W0
        h4 = x2
        t5, k6 = x2.data.mean(), 0
        while t5 < 1.2 and k6 < 4:
            t5 = t5 + 0.55
            k6 += 1
            h4 = F.tanh(h4) * 1.5
        c7 = tj.Variable(h3.data)
        c8 = tj.Variable(c7.data)
        c9 = tj.Variable(h3.data)
        h10 = h3 * c7 + c9 * 0.5
        p11 = H0
        if p11 is None:
            h12 = F.tanh(h10 * 0.5)
        else:
            h12 = F.tanh(h10 * 0.5 + p11 * W1)
        H0 = h12
        loss13 = F.mean(F.tanh(h10 * W2) ** 2)
        W2.cleargrad()
        loss13.backward()
        W2.data -= 0.1 * W2.grad.data
        h14 = F.tanh(h10 * W2)
        loss15 = F.mean(F.tanh(h12 * W3) ** 2)
        W3.cleargrad()
        loss15.backward()
        W3.data -= 0.1 * W3.grad.data
        h16 = F.tanh(h12 * W3)
        return h16, c7, c9

    return f, {'W1': W1, 'W3': W3}


f, _closure = make()
CAPTURES = {'W0': W0, 'W2': W2, **_closure}
# (batch side nb, sign of the signed inputs, s0) for each call; the last calls
# use a new batch side
PLAN = [(1, 1.0, 0.75), (1, 1.0, 0.875), (1, -1.0, 0.375), (1, 1.0, 0.25), (1, -1.0, 0.75), (1, 1.0, 0.375), (3, 1.0, 0.75), (3, 1.0, 0.125), (3, -1.0, 0.625), (3, 1.0, 0.125)]
BACKWARD = 'plain'   # None, 'plain' or 'create_graph'
RETAIN = True   # the caller's backward with retain_grad
PRESET = False   # results' .grad set, the backward from the first
SQUARE = False   # the caller's loss squares the results
NONFINITE = None   # on call 5, entry 0 of the unsigned inputs


def args(call):
    """Fresh arguments for call `call` (new objects, the same values for eager and jit)."""
    nb, sign, s = PLAN[call]
    if call in [0, 6]:    # reset_state()
        global H0
        H0 = None
    rng = np.random.default_rng(1758 + call)
    x0 = tj.Variable(np.asarray(rng.uniform(-2.0, 2.0, (nb, 2, 4)), dtype=np.float32))
    x1 = tj.Variable(np.asarray(rng.uniform(-0.5, 0.5, (nb, 2, 4)) + sign, dtype=np.float32))
    x2 = tj.Variable(np.asarray(rng.uniform(-0.5, 0.5, (nb, 2, 4)) + sign, dtype=np.float64))
    return (x0, x1, x2)


if __name__ == "__main__":
    from tracejit.testing.fuzz.harness import check_file
    check_file(__file__)
