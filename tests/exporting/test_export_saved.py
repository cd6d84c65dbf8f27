"""Exported.save / tj.load: a file that runs without the user's source.

Saved models run in a fresh process that has only the file (and tracejit), through the
numba backend, with the jitted function's results; a loaded file runs at new sizes of
its symbolic dimensions and still converts to ONNX. A newer format, a truncated file
and inputs that do not match are clear errors.
"""
import json
import os
import subprocess
import sys
import zipfile

import numpy as np
import pytest

import tracejit as tj
import tracejit.functions as F
from tracejit.exporting.exported import FORMAT_VERSION
from tracejit.models import MLP

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")

# The checkout (tests/export/ is two folders down): what the fresh process imports.
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _loss(x, t, W, b):
    return F.softmax_cross_entropy(F.linear(x, W, b), t)


def _exports(tmp_path):
    """(file, function, example-free call arguments) for three models."""
    np.random.seed(0)
    model = MLP((10, 3))

    def predict(x):
        return F.softmax(model(x))

    rng = np.random.default_rng(1)
    vg = tj.value_and_grad(_loss, argnums=(2, 3))
    W, b = rng.random((4, 3)), rng.random(3)

    def chain(x, y):
        return F.tanh(tj.Variable(x) * y) ** 2 + F.exp(-y)

    out = []
    ex = tj.export(predict, np.random.rand(5, 2), dynamic={"x": {0: "batch"}})
    out.append(("mlp", ex, predict, [(np.random.rand(n, 2),) for n in (3, 7, 5)]))
    ex = tj.export(vg, rng.random((5, 4)), rng.integers(0, 3, 5), W, b,
                   dynamic={0: {0: "batch"}, "t": {0: "batch"}})
    out.append(("sce", ex, vg, [(rng.random((n, 4)), rng.integers(0, 3, n), W, b)
                                for n in (5, 2, 9)]))
    ex = tj.export(chain, rng.random((4, 3)), rng.random(3))
    out.append(("chain", ex, chain, [(rng.random((4, 3)), rng.random(3)) for _ in range(3)]))
    files = []
    for name, ex, f, calls in out:
        path = str(tmp_path / f"{name}.tj")
        ex.save(path)
        files.append((path, ex, f, calls))
    return files


def _flat(x):
    if isinstance(x, tj.Variable):
        return [x.data]
    if isinstance(x, (tuple, list)):
        return [a for e in x for a in _flat(e)]
    return [np.asarray(x)]


def _close(got, want):
    got = got if isinstance(got, tuple) else (got,)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-9, atol=1e-12)


_CHILD = """
import sys, numpy as np, tracejit as tj
for path in sys.argv[1:]:
    m = tj.load(path)
    z = np.load(path + ".in.npz")
    outs = {}
    for k in range(int(z["calls"])):
        args = [z[f"{k}_{i}"] for i in range(int(z["nargs"]))]
        res = m(*args)
        res = res if isinstance(res, tuple) else (res,)
        for j, r in enumerate(res):
            outs[f"{k}_{j}"] = r
    np.savez(path + ".out.npz", **outs)
print("ran", len(sys.argv) - 1)
"""


def test_saved_files_run_in_a_fresh_process_without_the_source(tmp_path):
    files = _exports(tmp_path)
    for path, ex, f, calls in files:
        np.savez(path + ".in.npz", calls=len(calls), nargs=len(calls[0]),
                 **{f"{k}_{i}": a for k, args in enumerate(calls) for i, a in enumerate(args)})
    run_dir = tmp_path / "elsewhere"
    run_dir.mkdir()
    # Only tracejit on the path: neither this file nor its functions are importable.
    env = dict(os.environ, PYTHONPATH=ROOT)
    r = subprocess.run([sys.executable, "-c", _CHILD] + [p for p, *_ in files],
                       cwd=run_dir, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "ran 3" in r.stdout
    for path, ex, f, calls in files:
        outs = np.load(path + ".out.npz")
        jf = tj.jit(f)
        for k, args in enumerate(calls):
            want = _flat(f(*args))
            _close(tuple(outs[f"{k}_{j}"] for j in range(len(want))), want)
            _close(tuple(outs[f"{k}_{j}"] for j in range(len(want))), _flat(jf(*args)))


def test_a_loaded_file_runs_at_new_sizes_and_converts_to_onnx(tmp_path):
    ort = pytest.importorskip("onnxruntime")
    for path, ex, f, calls in _exports(tmp_path):
        m = tj.load(path)
        assert m.input_specs == ex.input_specs and m.output_names == ex.output_names
        assert sorted(m.initializers) == sorted(ex.initializers)
        assert "inputs:" in str(m)
        sess = ort.InferenceSession(m.to_onnx().SerializeToString(),
                                    providers=["CPUExecutionProvider"])
        names = [s["name"] for s in m.input_specs]
        for args in calls:
            want = _flat(f(*args))
            _close(m(*args), want)
            _close(ex(*args), want)
            got = sess.run(None, dict(zip(names, args)))
            for g, w in zip(got, want):
                np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-9)


def test_inputs_that_do_not_match_are_clear_errors(tmp_path):
    (path, ex, f, calls), *_ = _exports(tmp_path)
    m = tj.load(path)
    with pytest.raises(ValueError, match=r"input x must be float64\[batch, 2\], got "
                                         r"float32\[3, 2\]"):
        m(np.ones((3, 2), np.float32))
    with pytest.raises(ValueError, match=r"input x must be float64\[batch, 2\]"):
        m(np.ones((3, 5)))
    with pytest.raises(TypeError, match="takes 1 input"):
        m(np.ones((3, 2)), np.ones(2))
    (_, ex2, _, _) = _exports(tmp_path)[1]
    with pytest.raises(ValueError, match="batch"):
        ex2(np.ones((3, 4)), np.zeros(4, np.int64), np.ones((4, 3)), np.ones(3))


def _rewrite(path, change):
    z = dict(np.load(path))
    doc = json.loads(str(z["__graph__"][()]))
    change(doc)
    z["__graph__"] = np.array(json.dumps(doc))
    with open(path, "wb") as fh:
        np.savez(fh, **z)


def test_newer_truncated_and_foreign_files_are_clear_errors(tmp_path):
    (path, ex, f, calls), *_ = _exports(tmp_path)
    newer = str(tmp_path / "newer.tj")
    ex.save(newer)
    _rewrite(newer, lambda d: d.update(version=FORMAT_VERSION + 1))
    with pytest.raises(ValueError, match="newer"):
        tj.load(newer)
    data = open(path, "rb").read()
    cut = str(tmp_path / "cut.tj")
    with open(cut, "wb") as fh:
        fh.write(data[: len(data) // 2])
    with pytest.raises(ValueError, match="truncated"):
        tj.load(cut)
    other = str(tmp_path / "other.npz")
    np.savez(other, a=np.ones(3))
    with pytest.raises(ValueError, match="not a tracejit export file"):
        tj.load(other)
    unknown = str(tmp_path / "unknown.tj")
    ex.save(unknown)
    _rewrite(unknown, lambda d: d["nodes"][0].update(op="NoSuchOp"))
    with pytest.raises(ValueError, match="NoSuchOp"):
        tj.load(unknown)
    assert zipfile.is_zipfile(path)


def test_kept_guards_are_checked_when_a_saved_file_runs(tmp_path):
    def halve_if_big(x):
        x = tj.Variable(x)
        if float(F.sum(x).data) > 1.0:
            x = x * 0.5
        return x

    ex = tj.export(halve_if_big, np.array([1.0, 2.0]), allow_guards=True)
    assert len(ex.guards) == 1 and "if float(F.sum(x).data) > 1.0" in ex.guards[0][1]
    path = str(tmp_path / "g.tj")
    ex.save(path)
    m = tj.load(path)
    for x in (np.array([3.0, 1.0]), np.array([0.7, 0.9]), np.array([5.0, -1.0])):
        np.testing.assert_allclose(m(x), halve_if_big(x).data)
    with pytest.raises(ValueError, match="another path"):
        m(np.array([0.1, 0.2]))
    with pytest.raises(tj.ExportError, match="guards"):
        m.to_onnx()


def test_a_saved_cnn_runs_from_the_file(tmp_path):
    np.random.seed(13)
    conv = tj.layers.Conv2d(3, kernel_size=3, stride=2, pad=1)

    def cnn(x):
        h = F.relu(conv(x))
        return F.pooling(h, 2, stride=1, pad=1), F.average_pooling(h, 2, stride=2)

    x = np.random.standard_normal((2, 2, 6, 6)).astype(np.float32)
    cnn(x)
    path = str(tmp_path / "cnn.tj")
    tj.export(cnn, x, dynamic={"x": {0: "batch"}}).save(path)
    m = tj.load(path)
    for n in (2, 3, 5):
        x = np.random.standard_normal((n, 2, 6, 6)).astype(np.float32)
        for g, w in zip(m(x), cnn(x)):
            np.testing.assert_allclose(g, w.data, rtol=1e-6, atol=1e-6)


def _halve_until_small(x):
    x = tj.Variable(x)
    while float(F.sum(x * x).data) > 1.0:
        x = x * 0.5
    return x + 1


def test_a_saved_file_of_several_paths_runs_each_and_converts_to_an_if_tree(tmp_path):
    ort = pytest.importorskip("onnxruntime")
    # Fixed sizes: the loop's trip count follows the sum of squares, which a second
    # trace at another size (values repeated) changes.
    ex = tj.export(_halve_until_small, np.array([0.5, 0.1]),
                   paths=[(np.array([1.5, 0.2]),), (np.array([2.5, 0.3]),)])
    path = str(tmp_path / "loop.tj")
    ex.save(path)
    m = tj.load(path)
    assert len(m.paths) == 3
    sess = ort.InferenceSession(m.to_onnx().SerializeToString(),
                                providers=["CPUExecutionProvider"])
    for x in (np.array([0.3, 0.2]), np.array([1.2, 0.4]), np.array([2.0, 1.0])):
        want = _halve_until_small(x).data
        np.testing.assert_allclose(m(x), want, rtol=1e-12)
        out, flag = sess.run(None, {"x": x})
        assert flag
        np.testing.assert_allclose(out, want, rtol=1e-12)
    with pytest.raises(ValueError, match="another path"):
        m(np.array([9.0, 0.0]))


def _made_from_the_size(x):
    # Arrays the function makes from x's shape: one value each (a fill) and a range.
    v = tj.Variable(x)
    zeros = np.zeros(x.shape)
    ones = np.ones((x.shape[0], 1), np.float32)
    half = np.full(x.shape[:1], -0.5)
    return F.sum(v * ones + zeros, axis=1) * half + np.arange(x.shape[0])


def test_arrays_made_from_a_symbolic_size_save_and_run_at_new_sizes(tmp_path):
    rng = np.random.default_rng(4)
    ex = tj.export(_made_from_the_size, rng.random((4, 3)), dynamic={"x": {0: "n"}})
    path = str(tmp_path / "made.npz")
    ex.save(path)
    m = tj.load(path)
    for n in (7, 1, 4):
        x = rng.random((n, 3))
        _close(m(x), _flat(_made_from_the_size(x)))
    with zipfile.ZipFile(path) as z:        # the oldest tracejit that reads it: 2
        assert json.loads(np.load(z.open("__graph__.npy")).item())["version"] == 2


def test_numpy_calls_the_tracer_kept_save_by_name(tmp_path):
    # accuracy()'s argmax and a cumsum are NumPy calls in the graph: saved as the names
    # of numpy functions with their keyword arguments, run and converted when loaded.
    def acc(x, t):
        return F.accuracy(tj.Variable(x), t)

    def ranks(x):
        return tj.Variable(np.cumsum(tj.Variable(x).data, axis=1)) * 2

    path = str(tmp_path / "acc.tj")
    tj.export(acc, np.random.rand(4, 3), np.array([0, 1, 2, 0]),
              dynamic={"x": {0: "n"}, "t": {0: "n"}}).save(path)
    m = tj.load(path)
    for n in (4, 7, 2):
        x, t = np.random.rand(n, 3), np.random.randint(0, 3, n)
        np.testing.assert_allclose(m(x, t), acc(x, t).data, rtol=1e-12)
    m.to_onnx()
    path = str(tmp_path / "ranks.tj")
    tj.export(ranks, np.random.rand(4, 3)).save(path)
    m = tj.load(path)
    for _ in range(3):
        x = np.random.rand(4, 3)
        np.testing.assert_allclose(m(x), ranks(x).data, rtol=1e-12)
    # A file naming anything but a pure NumPy function is refused, not called.
    with np.load(path) as z:
        arrays = dict(z)
    doc = json.loads(str(arrays["__graph__"][()]))
    bad = str(tmp_path / "bad.tj")
    for params in ([{"numpy": "__import__"}, None], [{"numpy": "savetxt"}, None],
                   [{"numpy": "add"}, "at"]):
        doc["nodes"][0]["params"][:2] = params
        arrays["__graph__"] = np.array(json.dumps(doc))
        with open(bad, "wb") as fh:
            np.savez(fh, **arrays)
        with pytest.raises(ValueError, match="no NumPy function a tracejit file may call"):
            tj.load(bad)


def _assigned(x):
    x = tj.Variable(x)
    buf = np.zeros(x.shape)
    buf[1:] = x.data[1:] * 2.0
    m = x.data.copy()
    m[m > 0.5] = 0.0
    stats = np.array([x.data.mean(), x.data.max()])
    return F.tanh(x) * tj.Variable(buf) + tj.Variable(m) + float(stats[0] * stats[1])


def test_item_assignment_and_joined_traced_numbers_save_and_run(tmp_path):
    # AssignItem (item assignment into traced data) was refused as "no primitive";
    # it is a copy with the assignment: saved with its index template.
    path = str(tmp_path / "assigned.tj")
    rng = np.random.default_rng(0)
    # (Fixed sizes: np.zeros(x.shape) is a constant of the trace, which a symbolic
    # dimension cannot follow; export says so.)
    tj.export(_assigned, rng.random((4, 3))).save(path)
    m = tj.load(path)
    for _ in range(3):
        x = rng.random((4, 3))
        np.testing.assert_allclose(m(x), _assigned(x).data, rtol=1e-12)
    m.to_onnx()
