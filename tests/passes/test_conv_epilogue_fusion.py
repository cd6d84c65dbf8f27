"""Conv epilogue fusion (passes/conv_epilogue.py, ops/conv_fused.py): conv2d + bias ->
ReLU -> max pooling runs as one ConvEpilogue call, and max pooling's gradient times
ReLU's mask (+ the bias's sum) as one PoolGradMasked call, with eager's values and
gradients: with and without pooling and bias, windows the kernels compute and others,
strides and pads, float32 and float64, and other readers of the conv's output, the
pre-activation and the ReLU's output (kept materialized, or not fused).
"""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import tracejit as tj
import tracejit.functions as F
from tracejit.ops import conv as C
from tracejit.ops.conv_fused import ConvEpilogue, PoolGradMasked
from tracejit.passes import pipeline as P
from tracejit.testing import assert_jit_matches_eager

pytestmark = pytest.mark.usefixtures("jit_warnings_are_errors")

POOL22 = ((2, 2), (2, 2), (0, 0))


def _close(got, want):
    # float32: a few ulps of the array's largest value (sums in another order), as the
    # conv tests (tests/runtime/test_float32_rounding_is_no_mismatch.py).
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape
    scale = float(np.max(np.abs(want), initial=0.0))
    rtol = 1e-4 if got.dtype == np.float32 else 1e-10
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * 0.1 * scale + 1e-30)


def _op_names(g):
    return [type(n.fn).__name__ for n in g.nodes]


# ---------------------------------------------------------------- the fused ops

@pytest.mark.parametrize("dtype", ["f4", "f8"])
@pytest.mark.parametrize("stride, pad, pool", [
    ((1, 1), (1, 1), POOL22), ((2, 2), (0, 0), POOL22), ((1, 1), (1, 1), ((3, 3), (1, 1), (1, 1))),
    ((1, 1), (0, 0), ((2, 2), (1, 1), (0, 0))), ((1, 1), (0, 0), None)])
def test_fused_ops_give_the_values_of_the_primitives_they_replace(dtype, stride, pad, pool):
    # Odd sizes (a row and a column in no 2x2 window), a NaN, exact equality.
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 2, 9, 8)).astype(dtype)
    W = rng.standard_normal((4, 2, 3, 3)).astype(dtype)
    b = rng.standard_normal((4, 1, 1)).astype(dtype)
    x[0, 0, 2, 3] = np.nan
    a = C.Conv2d(stride, pad).forward(x, W) + b
    r = np.maximum(a, 0)
    want = [a, r] + ([C.Pooling(*pool).forward(r)] if pool else [])
    for keep_pre, keep_act in ((True, True), (False, pool is None), (True, pool is None)):
        got = ConvEpilogue(stride, pad, True, pool, keep_pre, keep_act).forward(x, W, b)
        got = got if isinstance(got, tuple) else (got,)
        kept = [w for w, k in zip(want, (keep_pre, keep_act, pool is not None)) if k]
        assert len(got) == len(kept)
        for g, w in zip(got, kept):
            np.testing.assert_array_equal(g, w)
    if pool is None:
        return
    gy = rng.standard_normal(want[-1].shape).astype(dtype)
    ref = C.Pooling2DGrad(*pool).forward(r, gy) * (a > 0)
    gx, s = PoolGradMasked(*pool, (1, 4, 1, 1)).forward(r, gy, a)
    np.testing.assert_array_equal(gx, ref)
    _close(s, ref.sum(axis=(0, 2, 3), keepdims=True))
    # The mask read from the ReLU's output: the same where r = relu(a).
    np.testing.assert_array_equal(PoolGradMasked(*pool, None).forward(r, gy, r), ref)


# ---------------------------------------------------------------- compiled steps

def _step_program(stride, pad, bias, pool, reader, dtype, seed):
    """A conv layer's training step with loss.backward() inside (forward and backward in
    one graph) on captured Parameters, which it updates (SGD)."""
    rng = np.random.default_rng(seed)
    W = tj.Parameter((rng.standard_normal((3, 2, 3, 3)) * 0.5).astype(dtype))
    b = tj.Parameter(rng.standard_normal(3).astype(dtype)) if bias else None
    V = tj.Parameter((rng.standard_normal((3, 1)) * 0.5).astype(dtype))
    params = [p for p in (W, b, V) if p is not None]

    def step(x):
        pre = F.conv2d(x, W, b, stride=stride, pad=pad)
        act = F.relu(pre)
        out = F.pooling(act, *pool) if pool else act
        h = F.mean(out, axis=(2, 3))
        loss = F.mean(F.tanh(F.matmul(h, V)) ** 2)
        if reader == "pre":
            loss = loss + F.mean(pre * pre) * 0.1
        elif reader == "act":
            loss = loss + F.mean(act)
        for p in params:
            p.cleargrad()
        loss.backward()
        for p in params:
            p.data -= 0.01 * p.grad.data
        return loss, out

    return step, params


@settings(max_examples=12, deadline=None)
@given(stride=st.sampled_from([1, 2]), pad=st.sampled_from([0, 1]), bias=st.booleans(),
       pool=st.sampled_from([None, (2, 2, 0), (2, 2, 0), (3, 1, 1)]),
       reader=st.sampled_from(["none", "pre", "act"]), dtype=st.sampled_from(["f4", "f8"]),
       hw=st.tuples(st.integers(5, 8), st.integers(5, 8)), seed=st.integers(0, 99))
def test_a_conv_relu_pool_step_with_backward_inside_matches_eager(stride, pad, bias, pool,
                                                                   reader, dtype, hw, seed):
    step, params = _step_program(stride, pad, bias, pool, reader, dtype, seed)
    step_e, params_e = _step_program(stride, pad, bias, pool, reader, dtype, seed)
    jf = tj.jit(step)
    rng = np.random.default_rng(seed + 1)
    for _ in range(5):
        x = rng.standard_normal((2, 2) + hw).astype(dtype)
        (loss, out), (loss_e, out_e) = jf(x), step_e(x)
        _close(loss.data, loss_e.data)
        _close(out.data, out_e.data)
        for p, pe in zip(params, params_e):
            _close(p.grad.data, pe.grad.data)
            _close(p.data, pe.data)
    info = jf.cache_info()
    assert info["fallbacks"] == 0 and info["hits"] >= 3, info
    names = _op_names(jf.trace(x))
    assert "ConvEpilogue" in names and "Conv2d" not in names, names
    # A gradient reaching the ReLU's output from another reader is added to the
    # pooling's before the mask: that chain does not fuse.
    fused_bwd = pool is not None and reader != "act"
    assert ("PoolGradMasked" in names) == fused_bwd, names
    assert ("Pooling2DGrad" in names) == (pool is not None and not fused_bwd), names


@pytest.mark.parametrize("pool", [None, (2, 2, 0), (3, 1, 1)])
@pytest.mark.parametrize("dtype", ["f4", "f8"])
def test_the_callers_backward_through_a_fused_forward_matches_eager(pool, dtype):
    # The forward and the backward in separate graphs: the backward's mask is a > 0 of
    # the saved pre-activation, not the ReLU's output of this graph.
    rng = np.random.default_rng(3)
    W = tj.Parameter((rng.standard_normal((3, 2, 3, 3)) * 0.5).astype(dtype))
    b = tj.Parameter(rng.standard_normal(3).astype(dtype))

    def f(x):
        y = F.relu(F.conv2d(x, W, b, pad=1))
        return F.pooling(y, *pool) if pool else y

    rtol = 1e-4 if dtype == "f4" else 1e-9
    info = assert_jit_matches_eager(
        f, rng.standard_normal((2, 2, 6, 6)).astype(dtype), params=(W, b), rtol=rtol,
        atol=rtol)
    assert info["fallbacks"] == 0, info
    jf = tj.jit(f)
    x = tj.Variable(rng.standard_normal((2, 2, 6, 6)).astype(dtype))
    for _ in range(3):
        jf(x)
    assert "ConvEpilogue" in _op_names(jf.trace(x))
    if pool is not None:
        assert "PoolGradMasked" in _op_names(jf.backward_graph(x))


def test_a_conv_output_read_elsewhere_is_not_fused_away():
    # The conv's output before the bias is read by another node: the conv stays a call
    # of its own (the add, ReLU and pooling still fuse as elementwise and pooling ops).
    rng = np.random.default_rng(5)
    W = tj.Parameter(rng.standard_normal((3, 2, 3, 3)).astype(np.float32))
    b = tj.Parameter(rng.standard_normal(3).astype(np.float32))

    def f(x):
        c = F.conv2d(x, W, None, pad=1)
        y = F.pooling(F.relu(c + F.reshape(b, (1, -1, 1, 1))), 2, 2)
        return F.sum(y) + F.sum(c * c)

    info = assert_jit_matches_eager(
        f, rng.standard_normal((2, 2, 6, 6)).astype(np.float32), params=(W, b), rtol=1e-4,
        atol=1e-4)
    assert info["fallbacks"] == 0, info
    jf = tj.jit(f)
    x = tj.Variable(rng.standard_normal((2, 2, 6, 6)).astype(np.float32))
    for _ in range(3):
        jf(x)
    names = _op_names(jf.trace(x))
    assert "Conv2d" in names and "ConvEpilogue" not in names, names


def test_the_cnn_step_materializes_fewer_intermediates():
    # W6's shape of step (conv-ReLU-pool twice, linear, softmax cross-entropy, SGD) at a
    # small size: with the pass, neither conv output, mask, nor pooling gradient is
    # materialized.
    rng = np.random.default_rng(0)
    f32 = np.float32
    W1 = tj.Parameter((rng.standard_normal((4, 1, 3, 3)) * 0.3).astype(f32))
    b1 = tj.Parameter(np.zeros(4, f32))
    W2 = tj.Parameter((rng.standard_normal((8, 4, 3, 3)) * 0.3).astype(f32))
    b2 = tj.Parameter(np.zeros(8, f32))
    V = tj.Parameter((rng.standard_normal((8 * 2 * 2, 5)) * 0.3).astype(f32))
    params = (W1, b1, W2, b2, V)

    def step(x, t):
        h = F.pooling(F.relu(F.conv2d(x, W1, b1, pad=1)), 2, 2)
        h = F.pooling(F.relu(F.conv2d(h, W2, b2, pad=1)), 2, 2)
        loss = F.softmax_cross_entropy(F.matmul(F.reshape(h, (x.shape[0], -1)), V), t)
        for p in params:
            p.cleargrad()
        loss.backward()
        for p in params:
            p.data -= f32(0.1) * p.grad.data
        return loss

    x = rng.standard_normal((3, 1, 8, 8)).astype(f32)
    t = rng.integers(0, 5, 3)
    summaries, graphs = {}, {}
    for on in (False, True):
        saved = P.PIPELINE
        if not on:
            P.PIPELINE = tuple(p for p in saved if p is not P.fuse_conv_epilogues)
        try:
            jf = tj.jit(step)
            for _ in range(3):
                jf(x, t)
            graphs[on] = jf.trace(x, t)
            summaries[on] = graphs[on].summary()
        finally:
            P.PIPELINE = saved
    off, on = summaries[False], summaries[True]
    names = _op_names(graphs[True])
    assert names.count("ConvEpilogue") == 2 and names.count("PoolGradMasked") == 2, names
    assert not {"ReLU", "Pooling", "Pooling2DGrad", "Conv2d"} & set(names), names
    # The ops counted are the ops computed: the same with the pass and without.
    assert on["ops"] == off["ops"], (on["ops"], off["ops"])
    assert on["materialized"] < off["materialized"], (on, off)
    assert on["intermediate_bytes"] < off["intermediate_bytes"], (on, off)
