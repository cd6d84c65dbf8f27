"""C code reading traced data through the buffer protocol (struct.unpack_from, zlib.crc32,
hashlib, a Struct's methods, a memoryview under another name) would get the traced call's
bytes: a branch on them frozen, silently wrong once it flips after the first-call check.
On Python 3.11 an ndarray subclass cannot intercept the buffer protocol, so while the
user's function traces, a profile hook sees the calls of known buffer-reading C functions
(trace.buffers) and a local alias of memoryview/bytes/bytearray is the traced-code
reader; a module-level alias reachable by the function is an escape. Each of these runs
eagerly with a warning naming the line, and every call returns what eager returns. The
hook is installed only when the code a trace runs could reach a reader (an MLP step
does not), chains to a Python profile function already set and puts it back; the
readers that are module functions (struct.unpack_from ...) are also swapped for
wrappers while a trace runs, which see their arguments: reading other bytes compiles.
Left: a C method (a Struct's, a hash object's) while a C-level profiler (cProfile) is
active, which the hook cannot chain to.
"""
import cProfile
import hashlib
import struct
import sys
import warnings
import zlib

import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F
from tracejit import optimizers
from tracejit.models import MLP
from tracejit.trace import buffers

MV = memoryview
PACK = struct.Struct("d")


def flip_late(n=8):
    rng = np.random.default_rng(0)
    return [(1.0 if i < 5 else -1.0) * (np.abs(rng.standard_normal(3)) + .1)
            for i in range(n)]


def struct_read(x):
    return F.sum(x) * (2.0 if struct.unpack_from("d", x.data)[0] > 0 else -3.0)


def memoryview_alias(x):
    mv = memoryview
    return F.sum(x) * (2.0 if mv(x.data)[0] > 0 else -3.0)


def module_level_alias(x):
    return F.sum(x) * (2.0 if MV(x.data)[0] > 0 else -3.0)


def struct_method(x):
    return F.sum(x) * (2.0 if PACK.unpack_from(x.data)[0] > 0 else -3.0)


def struct_iter(x):
    return F.sum(x) * (2.0 if next(struct.iter_unpack("d", x.data))[0] > 0 else -3.0)


def crc(x):
    sign = x.data[0] > 0            # guarded: the crc alone would not flip
    return F.sum(x) * (2.0 if sign and zlib.crc32(x.data) >= 0 else -3.0)


def digest(x):
    first = hashlib.sha256(x.data).digest() != hashlib.sha256(-x.data).digest()
    return F.sum(x) * (2.0 if first and x.data[0] > 0 else -3.0)


def digest_new(x):
    h = hashlib.new("sha256", x.data).digest()
    return F.sum(x) * (2.0 if h and x.data[0] > 0 else -3.0)


def through_an_argument_function(x, read):
    return F.sum(x) * (2.0 if read(x.data) > 0 else -3.0)


def first_double(b):
    return struct.unpack_from("d", b)[0]


READERS = [(struct_read, "struct.unpack_from", "struct.unpack_from(\"d\", x.data)"),
           (memoryview_alias, "memoryview()", "mv(x.data)[0]"),
           (module_level_alias, "memoryview is reachable as MV", "def module_level_alias"),
           (struct_method, "Struct.unpack_from", "PACK.unpack_from(x.data)"),
           (struct_iter, "struct.iter_unpack", "struct.iter_unpack"),
           (crc, "zlib.crc32", "zlib.crc32(x.data)"),
           (digest, "hashlib.sha256", "hashlib.sha256(x.data)"),
           (digest_new, "hashlib.new", "hashlib.new(\"sha256\", x.data)")]


def run_flipping(f, *extra):
    jf = tj.jit(f)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always", tj.JitWarning)
        for d in flip_late():
            want = f(tj.Variable(d.copy()), *extra)
            got = jf(tj.Variable(d.copy()), *extra)
            np.testing.assert_allclose(got.data, want.data, rtol=1e-12)
    return jf, [str(m.message) for m in w if issubclass(m.category, tj.JitWarning)]


@pytest.mark.parametrize("f, what, line", READERS, ids=[r[0].__name__ for r in READERS])
def test_a_buffer_read_runs_eagerly_warned_at_its_line(f, what, line):
    jf, msgs = run_flipping(f)
    assert msgs and what in msgs[0] and line in msgs[0], msgs
    assert jf.cache_info()["hits"] == 0


def test_a_reader_in_a_function_passed_as_an_argument_is_seen():
    jf, msgs = run_flipping(through_an_argument_function, first_double)
    assert msgs and "struct.unpack_from" in msgs[0], msgs
    assert jf.cache_info()["hits"] == 0


def test_a_python_profile_function_is_chained_and_put_back():
    seen = []

    def profile(frame, event, arg):
        if event == "c_call":
            seen.append(arg)

    sys.setprofile(profile)
    try:
        jf, msgs = run_flipping(struct_read)
        assert sys.getprofile() is profile
    finally:
        sys.setprofile(None)
    assert msgs and "struct.unpack_from" in msgs[0]
    # The user's profiler saw the calls made while tracing too.
    assert struct.unpack_from in seen


def test_an_mlp_training_step_installs_no_hook(monkeypatch):
    installed = []
    real = sys.setprofile
    monkeypatch.setattr(buffers.sys, "setprofile",
                        lambda f: (installed.append(f), real(f)))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 5)).astype(np.float32)
    t = rng.integers(0, 3, 8)
    model = MLP((6, 3), activation=F.relu)
    opt = optimizers.SGD(0.1).setup(model)

    def step():
        loss = F.softmax_cross_entropy(model(x), t)
        model.cleargrads()
        loss.backward()
        opt.update()
        return loss

    js = tj.jit(step)
    with warnings.catch_warnings():
        warnings.simplefilter("error", tj.JitWarning)
        for _ in range(4):
            js()
    assert js.cache_info()["hits"] == 2
    assert installed == []


def under_cprofile(f):
    prof = cProfile.Profile()
    prof.enable()
    try:
        return run_flipping(f)
    finally:
        prof.disable()


def test_a_struct_function_under_cprofile_is_seen():
    # The module functions are wrapped while a trace runs: no hook needed for them.
    jf, msgs = under_cprofile(struct_read)
    assert msgs and "struct.unpack_from" in msgs[0], msgs


def test_a_reader_of_other_bytes_compiles():
    def f(x):
        k = struct.unpack("d", struct.pack("d", 2.0))[0]     # bytes, not traced data
        return F.sum(x) * k

    jf, msgs = run_flipping(f)
    assert not msgs and jf.cache_info()["hits"] >= 3


def test_a_struct_method_under_cprofile_follows_the_data():
    # A C-level profiler leaves no room for the hook: a C method that may read a buffer
    # (PACK, a Struct the function reaches) is found from what the function reaches,
    # and the trace is an escape (eager, warned, saying why), never a frozen branch.
    jf, msgs = under_cprofile(struct_method)
    assert msgs and "Struct" in msgs[0] and "cProfile" in msgs[0], msgs
    assert jf.cache_info()["hits"] == 0


def hash_update(x):
    h = hashlib.sha256()
    h.update(x.data)
    return F.sum(x) * (2.0 if h.digest()[0] & 1 else -3.0)


def test_a_hash_object_under_cprofile_follows_the_data():
    jf, msgs = under_cprofile(hash_update)
    assert msgs and "update" in msgs[0] and "cProfile" in msgs[0], msgs


def test_an_optimizer_update_under_cprofile_still_compiles():
    # "update" alone (no module making reader objects named): no escape.
    W = tj.Parameter(np.array([0.5, -0.25, 0.75]))

    class Opt:
        def update(self):
            return None
    opt = Opt()

    def step(x):
        y = F.sum(x * W)
        opt.update()
        return y

    jf, msgs = under_cprofile(step)
    assert not msgs and jf.cache_info()["hits"] >= 2, msgs
