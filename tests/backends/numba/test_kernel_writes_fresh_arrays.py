"""Every array a loop kernel writes is a fresh array that overlaps no other argument.

The loop kernels are compiled with numba's `noalias` flag (LLVM's noalias on every
pointer argument; backends/numba/cache.py, _noalias_option): no runtime overlap checks,
so a kernel with many outputs vectorizes with half the code and compiles faster. That
is sound only while each array the kernel writes (outputs o*, accumulators r*, epilogue
results e*) shares no memory with any other array of the call; inputs may alias each
other (they are only read). These tests wrap every loop kernel the plans call and check
that, on programs whose inputs alias (one array twice, x and x.T, views, parameters
updated in place by an optimizer, an unrolled LSTM window), each call compared with
eager.
"""
import inspect
import re

import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F
import tracejit.layers as L
from tracejit import optimizers
from tracejit.backends.numba import cache as kcache
from tracejit.models import Model
from tracejit.testing import assert_jit_matches_eager

pytestmark = pytest.mark.usefixtures("kernel_cache_dir", "jit_warnings_are_errors")


_BLOCK = re.compile(r"# s(\d+): start of o(\d+)'s block in its concatenation, axis (\d+)")


class _Checked:
    """A loop kernel's dispatcher that checks its written arrays before each call.

    An output the kernel writes through its concatenation's buffer at a block (the
    source's "# sK: start of oJ's block ..., axis A": o_J[..., s_K + i_A, ...]) is
    checked as the region it writes, buffer[..., s_K:s_K + n_A, ...]: the other blocks
    of that buffer are other arguments' regions, which it must not overlap."""

    calls = 0

    def __init__(self, disp):
        self.disp = disp
        names = list(inspect.signature(disp.py_func).parameters)
        self.written = [i for i, n in enumerate(names) if n[0] in "ore" and n[1:].isdigit()]
        self.blocks = {}            # argument index -> (start's index, axis, extent's index)
        for k, j, axis in _BLOCK.findall(inspect.getsource(disp.py_func)):
            self.blocks[names.index(f"o{j}")] = (names.index(f"s{k}"), int(axis),
                                                 names.index(f"n{axis}"))

    def __getattr__(self, name):
        return getattr(self.disp, name)

    def region(self, args, i):
        """The memory argument i is accessed through (its block, where it is one)."""
        if i not in self.blocks:
            return args[i]
        s, axis, n = self.blocks[i]
        idx = (slice(None),) * axis + (slice(args[s], args[s] + args[n]),)
        return args[i][idx]

    def __call__(self, *args):
        arrays = [j for j, a in enumerate(args) if isinstance(a, np.ndarray)]
        for i in self.written:
            for j in arrays:
                assert j == i or not np.shares_memory(self.region(args, i),
                                                      self.region(args, j)), (
                    f"{self.disp.py_func.__name__}: written argument {i} overlaps "
                    f"argument {j}")
        _Checked.calls += 1
        return self.disp(*args)


@pytest.fixture
def checked_kernels(monkeypatch):
    orig = kcache.kernel

    def kernel(source, name, disk=True):
        disp = orig(source, name, disk)
        return _Checked(disp) if name.startswith("k_") else disp
    monkeypatch.setattr(kcache, "kernel", kernel)
    _Checked.calls = 0
    yield
    assert _Checked.calls > 0, "no loop kernel ran: the test checked nothing"


def test_one_array_passed_twice_and_its_transpose(checked_kernels):
    def f(x, y):
        return F.sum(F.tanh(x * y + x) * F.exp(y)), x * 2.0 + F.transpose(y)

    rng = np.random.default_rng(0)
    x = rng.standard_normal((6, 6))
    assert_jit_matches_eager(f, make_args=lambda k: (x + k,) * 2)
    assert_jit_matches_eager(f, make_args=lambda k: (x + k, (x + k).T))


def test_views_of_one_buffer(checked_kernels):
    def f(a, b, c):
        return a * b + c, F.sum(a - c, axis=0)

    rng = np.random.default_rng(1)

    def args(k):
        buf = rng.standard_normal((3, 20))
        return buf[0, :8], buf[0, 2:10], buf[1, ::2][:8]
    assert_jit_matches_eager(f, make_args=args)


def test_parameters_updated_in_place_by_adam_and_sgd(checked_kernels):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((5, 3))
    for opt_cls in (optimizers.SGD, optimizers.Adam):
        def make():
            np.random.seed(0)
            model = L.Linear(4, in_size=3)
            opt = opt_cls().setup(model)

            def step(x):
                loss = F.sum(F.sigmoid(model(x)) ** 2)
                model.cleargrads()
                loss.backward()
                opt.update()
                return loss
            return step, [model.W, model.b]
        assert_jit_matches_eager(make_function=make, make_args=lambda k: (x + k,),
                                 backward=False)


def test_lstm_window(checked_kernels):
    class Net(Model):
        def __init__(self):
            super().__init__()
            self.rnn = L.LSTM(6)
            self.fc = L.Linear(1)

        def forward(self, x):
            return self.fc(self.rnn(x))
    rng = np.random.default_rng(3)
    xs = rng.standard_normal((4, 3, 1))
    ts = rng.standard_normal((4, 3, 1))

    def make():
        np.random.seed(0)
        m = Net()
        opt = optimizers.Adam().setup(m)

        def window(xs, ts):
            loss = 0
            for i in range(4):
                loss = loss + F.mean_squared_error(m(xs[i]), ts[i])
            m.cleargrads()
            loss.backward()
            opt.update()
            m.rnn.reset_state()
            return loss
        window(xs, ts)            # creates the weights
        return window, list(m.params())
    assert_jit_matches_eager(make_function=make, make_args=lambda k: (xs + 0.1 * k, ts),
                             backward=False)
