"""Basic indexing by constants folded into kernel index arithmetic.

x[1:], x[:, ::2], x[2], x[..., 0], x[:, None], negative steps: a GetItem that reads a
group input becomes an affine read inside the group's loop (no copy), and its gradient
(GetItemGrad, gy scattered into zeros) a masked read. Slice starts, lengths and int
indices are resolved against the call's shapes and passed to the kernel as arguments,
so a new shape reuses the kernel and clips / raises exactly as NumPy does.
"""
import re

import numpy as np
import pytest
from hypothesis import given, strategies as st

import tracejit as tj
import tracejit.functions as F
from tracejit.passes import fusion
from tracejit.backends.numba import plan as codegen
from tracejit.autodiff import value_and_grad
from tracejit.backends.numba import cache as kcache

pytestmark = pytest.mark.usefixtures("kernel_cache_dir", "jit_warnings_are_errors")


_NUMPY_GETITEM = re.compile(r"= _f\d+\(.*\)\s+# get_item")


def numpy_getitems(source):
    """Plan lines that run a get_item / get_item_grad as a NumPy call."""
    plan = source.split("# kernel")[0]
    return [ln for ln in plan.splitlines() if _NUMPY_GETITEM.search(ln)]


def unfolded(graph):
    """Compile `graph` again with indexing not folded (the path before folding): the
    compiled graph (its notes and source)."""
    im = fusion._index_movement

    def old(n):
        return n.op.__name__ not in ("GetItem", "GetItemGrad") and im(n)
    fusion._index_movement = old
    try:
        run = codegen.compile(graph.replace())   # a copy: graph keeps its source
    finally:
        fusion._index_movement = im
    return run.graph


def close(got, want, dtype=np.float64):
    tol = 1e-10 if dtype == np.float64 else 2e-5
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, want.shape,
                                                               got.dtype, want.dtype)
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


# ---------------------------------------------------------------- hypothesis

@st.composite
def shapes_and_keys(draw):
    """A shape (sides >= 2), a basic index into it, and a larger shape of the same rank."""
    rank = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(2, 5), min_size=rank, max_size=rank)))
    axes = []
    for _ in shape:
        if draw(st.integers(0, 3)) == 0:
            axes.append(draw(st.integers(-2, 1)))          # valid for every side >= 2
        else:
            bound = st.one_of(st.none(), st.integers(-7, 7))
            axes.append(slice(draw(bound), draw(bound),
                              draw(st.sampled_from([None, 1, 2, -1, -2, 3]))))
    form = draw(st.sampled_from(["plain", "ellipsis", "trailing"]))
    if form == "ellipsis":
        i = draw(st.integers(0, rank))
        j = draw(st.integers(i, rank))
        key = axes[:i] + [Ellipsis] + axes[j:]
    elif form == "trailing":
        key = axes[:draw(st.integers(0, rank))]
    else:
        key = axes
    if draw(st.booleans()):
        key.insert(draw(st.integers(0, len(key))), None)
    grow = draw(st.lists(st.integers(0, 3), min_size=rank, max_size=rank))
    grow[0] = max(grow[0], 1)
    return shape, tuple(key), tuple(d + k for d, k in zip(shape, grow))


_JITTED = {}


def loss_of(key):
    def loss(x):
        y = x[key]
        return F.sum(y * y * 0.5 + y) + F.sum(x * x)
    return loss


def jitted(key):
    """One jitted value_and_grad per index expression, shared across examples."""
    k = repr(key)
    if k not in _JITTED:
        _JITTED[k] = tj.jit(value_and_grad(loss_of(key)))
    return _JITTED[k]


@given(shapes_and_keys(), st.integers(0, 2 ** 31 - 1))
def test_basic_indexing_values_and_grads_match_eager(case, seed):
    shape, key, new_shape = case
    rng = np.random.default_rng(seed)
    f = jitted(key)
    eager = value_and_grad(loss_of(key))
    for s in (shape, shape, shape, new_shape):
        x = rng.standard_normal(s)
        v, g = f(x)
        ve, ge = eager(tj.Variable(x.copy()))
        close(v.data, ve.data)
        close(g.data, ge.data)
        ref = 2 * x                     # NumPy's own answer for the gradient
        ref[key] += x[key] + 1
        close(g.data, ref)
    assert f.cache_info()["fallbacks"] == 0, f.cache_info()
    graph = f.trace(x)
    assert not numpy_getitems(graph.source), graph.source


# ---------------------------------------------------------------- fusion, counted

def _fd(x):
    d = x[1:] - x[:-1]
    return F.sum(d * d)


def _col(x, w):
    return F.sum(x[:, 0] * w)


def _pairs(x):
    s = x[::2] + x[1::2]
    return F.sum(s * s)


@pytest.mark.parametrize("fn, shapes", [(_fd, [(50,)]), (_col, [(6, 4), (6,)]),
                                        (_pairs, [(40,)])])
def test_forward_indexing_is_one_loop_with_no_copy(fn, shapes):
    f = tj.jit(fn)
    rng = np.random.default_rng(1)
    for _ in range(3):
        xs = [rng.standard_normal(s) for s in shapes]
        close(f(*xs).data, fn(*[tj.Variable(x) for x in xs]).data)
    g = f.trace(*xs, optimized=False)    # unfolded() recompiles the traced graph
    s = g.summary()
    assert (s["kernels"], s["numpy_calls"], s["materialized"]) == (1, 0, 0), g.source
    old = unfolded(g).notes
    assert old["numpy_calls"] >= 1 and old["materialized"] >= 1
    assert f.cache_info()["fallbacks"] == 0


@pytest.mark.parametrize("fn, shapes", [(_fd, [(50,)]), (_col, [(6, 4), (6,)]),
                                        (_pairs, [(40,)])])
def test_backward_scatter_is_a_masked_read(fn, shapes):
    f = tj.jit(value_and_grad(fn, argnums=0))
    rng = np.random.default_rng(2)
    for _ in range(3):
        xs = [rng.standard_normal(s) for s in shapes]
        v, g = f(*xs)
        ve, ge = value_and_grad(fn, argnums=0)(*[tj.Variable(x) for x in xs])
        close(v.data, ve.data)
        close(g.data, ge.data)
    graph = f.trace(*xs, optimized=False)   # its get_item nodes, unfused
    s = graph.summary()
    n_index = sum(n.name in ("get_item", "get_item_grad") for n in graph.nodes)
    # A scatter that nothing in a kernel reads (x[:, 0]'s gradient is the result) stays
    # NumPy's zeros + assignment: a kernel writing every element is no faster.
    out_ids = {id(v) for v in graph.outputs}
    lone = sum(n.name == "get_item_grad" and id(n.out) in out_ids for n in graph.nodes)
    assert len(numpy_getitems(graph.source)) == lone, graph.source
    old = unfolded(graph)
    # Every other get_item / get_item_grad was a NumPy call that materialized its result
    # (counted by its lines: the op between two reads, x[1:] - x[:-1], is a NumPy call
    # too there, a part of one op: plan._no_kernel).
    assert len(numpy_getitems(old.source)) - len(numpy_getitems(graph.source)) == \
        n_index - lone
    assert old.notes["materialized"] - s["materialized"] == n_index - lone
    if not lone:
        assert re.search(r"\(a\d\[.*\] if .*i0.* else 0\.0\)", graph.source)  # masked read
    assert f.cache_info()["fallbacks"] == 0


# ---------------------------------------------------------------- shapes and errors

def test_new_shape_reuses_the_kernel_with_new_index_constants():
    def f(x):
        return F.sum((x[3:] - x[:-3]) * x[-1])
    jf = tj.jit(f)
    x = np.random.rand(20, 3)
    for _ in range(3):
        close(jf(x).data, f(tj.Variable(x)).data)
    src20 = jf.trace(x).source
    built = kcache.STATS["kernels_built"]
    for n in (7, 33, 5, 3):          # 3: both slices are empty (a length-1 slice would
        #                              be a new broadcasting structure: a new kernel)
        y = np.random.rand(n, 3)
        for _ in range(2):
            close(jf(y).data, f(tj.Variable(y)).data)
    assert kcache.STATS["kernels_built"] == built
    kern = lambda s: s.split("# kernel", 1)[1]      # noqa: E731
    src33 = jf.trace(np.random.rand(33, 3)).source
    assert kern(src33) == kern(src20)
    assert ", 30, 3, 32)" in src33.split("# kernel")[0], src33   # n0, n1, c0 = 33 - 1
    assert jf.cache_info()["fallbacks"] == 0


def test_out_of_range_int_raises_like_numpy_and_slices_clip():
    f = tj.jit(value_and_grad(lambda x: F.sum(x[3] * 2 + F.sum(x[3:] ** 2))))
    for _ in range(3):
        v, g = f(np.arange(5.0))
    close(v.data, np.float64(6 + 9 + 16))
    close(g.data, np.array([0, 0, 0, 2 + 6, 8.0]))
    v, g = f(np.arange(4.0))                    # x[3:] is one element
    close(g.data, np.array([0, 0, 0, 2 + 6.0]))
    with pytest.raises(IndexError, match="index 3 is out of bounds"):
        f(np.arange(3.0))
    with pytest.raises(IndexError):
        np.arange(3.0)[3]
    h = tj.jit(lambda x: F.sum(x[10:] * 2) + F.sum(x[-100:2] * 3))
    for n in (5, 5, 5, 12, 1, 0):
        x = np.random.rand(n)
        close(h(x).data, np.sum(x[10:] * 2) + np.sum(x[-100:2] * 3))
    assert f.cache_info()["fallbacks"] == 0 and h.cache_info()["fallbacks"] == 0


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_dtypes_and_size_one_axes(dtype):
    def f(x, w):
        a = x[:, 1:2] * w                    # (B, 1) against (B, D): broadcast in the loop
        b = x[None, ::-1, 0]                  # (1, B)
        return F.sum(a * a) + F.sum(b * b * 3)
    vg = value_and_grad(f, argnums=(0, 1))
    jf = tj.jit(vg)
    rng = np.random.default_rng(3)
    for B in (5, 5, 5, 9):
        x = rng.standard_normal((B, 4)).astype(dtype)
        w = rng.standard_normal((B, 4)).astype(dtype)
        v, (gx, gw) = jf(x, w)
        ve, (gxe, gwe) = vg(tj.Variable(x), tj.Variable(w))
        close(v.data, ve.data, dtype)
        close(gx.data, gxe.data, dtype)
        close(gw.data, gwe.data, dtype)
    assert not numpy_getitems(jf.trace(x, w).source)
    assert jf.cache_info()["fallbacks"] == 0


def test_advanced_indexing_stays_a_numpy_call():
    idx = np.array([0, 2, 2])

    def f(x):
        return F.sum(x[idx] * 2 + x[1:4])
    jf = tj.jit(value_and_grad(f))
    x = np.random.rand(6)
    for _ in range(3):
        v, g = jf(x)
        ve, ge = value_and_grad(f)(tj.Variable(x))
        close(v.data, ve.data)
        close(g.data, ge.data)
    close(g.data, np.array([2, 1, 5, 1, 0, 0.0]))   # the repeated index adds twice
    assert len(numpy_getitems(jf.trace(x).source)) == 2   # x[idx] and its scatter
    assert jf.cache_info()["fallbacks"] == 0


def test_chains_of_movement_fold_through_indexing():
    def f(x):
        return F.sum(F.transpose(x)[1:] * 2 + x[:, 1:].T) + F.sum(x[None, :, ::-1][0] * x)
    vg = value_and_grad(f)
    jf = tj.jit(vg)
    rng = np.random.default_rng(4)
    for shape in ((4, 3), (4, 3), (4, 3), (6, 3)):
        x = rng.standard_normal(shape)
        v, g = jf(x)
        ve, ge = vg(tj.Variable(x))
        close(v.data, ve.data)
        close(g.data, ge.data)
    graph = jf.trace(x)
    plan = graph.source.split("# kernel")[0]
    assert not re.search(r"= _f\d+\(.*# (get_item|transpose)", plan), plan
    assert jf.cache_info()["fallbacks"] == 0


def test_large_groups_run_prange_kernels():
    # Above codegen.PARALLEL_MIN elements the loops are prange (0-d inputs read before
    # the loop: a 0-d array read inside a prange body fails to type).
    vg = value_and_grad(_fd)
    jf = tj.jit(vg)
    rng = np.random.default_rng(5)
    for n in (codegen.PARALLEL_MIN + 7,) * 3 + (2 * codegen.PARALLEL_MIN,):
        x = rng.standard_normal(n)
        v, g = jf(x)
        ve, ge = vg(tj.Variable(x))
        close(v.data, ve.data)
        close(g.data, ge.data)
    src = jf.trace(x).source
    assert "numba.prange" in src and not numpy_getitems(src)
    assert jf.cache_info()["fallbacks"] == 0


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_transcendental_groups_take_views_in_numpy_blocks(dtype):
    # float32 exp runs as NumPy ufuncs on blocks (faster than a libm loop); x[1:] is
    # then a view that is blocked like an input, never a copy. float64 exp is vecmath
    # inside the fused kernel, where x[1:] is index arithmetic.
    def f(x):
        return F.sum(F.exp(x[1:] - x[:-1]) * x[:0:-1])
    jf = tj.jit(f)
    rng = np.random.default_rng(6)
    for n in (2001, 2001, 2001, 3001):
        x = rng.standard_normal(n).astype(dtype)
        np.testing.assert_allclose(jf(x).data, f(tj.Variable(x)).data,
                                   rtol=1e-12 if dtype == np.float64 else 1e-4)
    s = jf.trace(x).summary()
    assert s["blocked_groups"] == (1 if dtype == np.float32 else 0) and s["materialized"] == 0
    assert not numpy_getitems(jf.trace(x).source)
    assert jf.cache_info()["fallbacks"] == 0
