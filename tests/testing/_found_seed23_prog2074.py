# tracejit fuzzer: a mismatch it found (kept as a regression test: tests/testing/test_found_programs_match.py)
#   call 5: gradient of capture W1: value differs by 0.311 (jit -0.22964974735670987, eager 0.08129104770525407; rtol 0.001 of the magnitude 0.0813, atol 9.5e-07); jit -0.22965, eager 0.08129
#   also (state after the call: value): call 5: state after the call: capture W1.grad: value differs by 0.311 (jit -0.22964974735670987, eager 0.08129104770525407; rtol 0.001 of the magnitude 0.0813, atol 9.5e-07); jit -0.22965, eager 0.081
#   JitWarning: jit(f) runs eagerly: the compiled variant differs from eager (a captured Variable.grad is set compiled; compared: both runs' results and the state they leave, on this call's arguments); the function l
# Run: python THIS_FILE  (jit vs eager, call by call; prints the first difference)
import dataclasses
import numpy as np
import tracejit as tj
import tracejit.functions as F


@dataclasses.dataclass(frozen=True)
class Res:
    outs: object
    tag: str


# captured state, read as module globals
W0 = tj.Parameter(np.random.default_rng(17).uniform(-1.0, 1.0, ()).astype(np.float32))
W1 = tj.Parameter(np.random.default_rng(34).uniform(-1.0, 1.0, ()).astype(np.float32))


# state f rebinds (an RNN's h), None until its first call
class Holder:
    def __repr__(self):     # passed as an argument: compared by repr
        return 'Holder()'   # (its h: by STATE())

STATED0 = {'h': None}
LAYER1 = tj.layers.Layer()
LAYER1.h = None


def STATE():
    """The state after a call (the harness compares it)."""
    return {"STATED0['h']": STATED0['h'], 'LAYER1.h': LAYER1.h}


def make():

    def f(x0, x1, s0):
        p1 = STATED0['h']
        if p1 is None:
            h2 = F.tanh(x0 * 0.5)
        else:
            h2 = F.tanh(x0 * 0.5 + 0.5 * p1)
        STATED0['h'] = h2
        h3 = F.exp(F.tanh(h2))
        h4 = F.sin(h3) * 2.0 + 1.0
        h5 = F.sigmoid(h2)
        h6 = h2 / 4.0
        h7 = h6 / (h5 * h5 + 1)
        d10 = W0.data
        loss8 = F.mean(F.tanh(h5 * W0) * d10)
        W0.data *= 0.5
        W0.cleargrad()
        loss8.backward()
        W0.data -= 0.1 * W0.grad.data
        h9 = F.tanh(h5 * W0)
        h11 = h9 / 4.0
        p12 = LAYER1.h
        if p12 is None:
            h13 = F.tanh(h7 * 0.5)
        else:
            h13 = F.tanh(h7 * 0.5 + p12 * W1)
        LAYER1.h = h13
        r14 = (h13,)
        return r14

    return f, {}


f, _closure = make()
CAPTURES = {'W0': W0, 'W1': W1, **_closure}
# (batch side nb, sign of the signed inputs, s0) for each call; the last calls
# use a new batch side
PLAN = [(2, -1.0, 0.25), (2, -1.0, 0.875), (2, 1.0, 0.375), (2, -1.0, 0.125), (2, 1.0, 0.75), (2, -1.0, 0.75), (1, -1.0, 0.875), (1, -1.0, 0.75), (1, 1.0, 0.75), (1, -1.0, 0.75)]
BACKWARD = 'plain'   # None, 'plain' or 'create_graph'
RETAIN = True   # the caller's backward with retain_grad
PRESET = True   # results' .grad set, the backward from the first
SQUARE = False   # the caller's loss squares the results
NONFINITE = None   # on call 5, entry 0 of the unsigned inputs


def args(call):
    """Fresh arguments for call `call` (new objects, the same values for eager and jit)."""
    nb, sign, s = PLAN[call]
    if call in [0, 6]:    # reset_state()
        STATED0['h'] = None
        LAYER1.h = None
    rng = np.random.default_rng(16 + call)
    x0 = tj.Variable(np.asarray(rng.uniform(-2.0, 2.0, ()), dtype=np.float64))
    x1 = np.asarray(rng.uniform(-2.0, 2.0, (nb,)), dtype=np.float64)
    s0 = s
    return (x0, x1, s0)


if __name__ == "__main__":
    from tracejit.testing.fuzz.harness import check_file
    check_file(__file__)
