"""`make demo`: jit three define-by-run programs and show what happened.

For each: the eager and jitted results agree, the traced graph, the cache info, and
the time per call eager vs jit (median of repeated calls, one process).
"""
import time
import warnings

import numpy as np

import tracejit as tj
import tracejit.functions as F
from tracejit import optimizers
from tracejit.models import MLP


def median_us(fn, repeat=200):
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e6 * float(np.median(times))


def banner(title):
    print("\n" + "=" * 78 + f"\n{title}\n" + "=" * 78)


# 1. The program that defines define-by-run: a loop whose trip count depends on data.
def grow(x):
    y = x
    while y.data < 100:
        y = y + x
    return y


def demo_while_loop():
    banner("1. data-dependent while loop: y = y + x until y > 100")
    grow_jit = tj.jit(grow)
    for xv in [3.0, 7.0, 3.0, 7.0, 3.0, 7.0]:
        x = tj.Variable(np.array(xv))
        y = grow_jit(x)
        y.backward()
        xe = tj.Variable(np.array(xv))
        ye = grow(xe)
        ye.backward()
        assert y.data == ye.data and x.grad.data == xe.grad.data
        print(f"x={xv}: jit y={float(y.data):6.1f} dy/dx={float(x.grad.data):4.1f}   "
              f"eager y={float(ye.data):6.1f} dy/dx={float(xe.grad.data):4.1f}")
    print("graph for x=7 (the loop unrolled behind one guard per iteration):")
    print("\n".join(str(grow_jit.trace(tj.Variable(np.array(7.0)), optimized=False))
                    .splitlines()[:8]
                    + ["  ..."]))
    print("cache_info:", _info(grow_jit))


def goldstein_price(x, y):
    return (1 + (x + y + 1) ** 2 * (19 - 14 * x + 3 * x ** 2 - 14 * y + 6 * x * y + 3 * y ** 2)) \
        * (30 + (2 * x - 3 * y) ** 2 * (18 - 32 * x + 12 * x ** 2 + 48 * y - 36 * x * y
                                        + 27 * y ** 2))


def demo_goldstein_price():
    banner("2. Goldstein-Price value and gradient on 0-d arrays (dispatch-bound)")
    vg = tj.value_and_grad(goldstein_price, argnums=(0, 1))
    vg_jit = tj.jit(vg)
    rng = np.random.default_rng(0)
    for _ in range(4):
        x, y = np.array(rng.uniform(-1, 1)), np.array(rng.uniform(-1, 1))
        z, (gx, gy) = vg_jit(x, y)
        ze, (gxe, gye) = vg(x, y)
        np.testing.assert_allclose([z.data, gx.data, gy.data], [ze.data, gxe.data, gye.data],
                                   rtol=1e-12)
    print(f"at (1, 1): value {float(vg_jit(np.array(1.0), np.array(1.0))[0].data)}, "
          f"gradient {[float(g.data) for g in vg_jit(np.array(1.0), np.array(1.0))[1]]}")
    g = vg_jit.trace(np.array(1.0), np.array(1.0))
    print(f"optimized graph: {len(g.nodes)} nodes, {g.summary()['kernels']} kernel; "
          f"first lines:")
    print("\n".join(str(g).splitlines()[:6] + ["  ..."]))
    x, y = np.array(0.3), np.array(-0.2)
    t_eager = median_us(lambda: vg(x, y))
    t_jit = median_us(lambda: vg_jit(x, y))
    print(f"eager {t_eager:8.1f} us/call   jit {t_jit:8.1f} us/call   "
          f"speedup {t_eager / t_jit:5.1f}x")
    print("cache_info:", _info(vg_jit))


def demo_mlp_step():
    banner("3. MLP training step (forward, backward, Adam update) compiled as one graph")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((128, 64)).astype(np.float32)
    t = rng.integers(0, 10, 128)

    def make():
        np.random.seed(0)
        model = MLP((128, 10), activation=F.relu)
        model(x)  # lazy init of the Linear layers
        return model, optimizers.Adam().setup(model)

    def step(model, opt):
        loss = F.softmax_cross_entropy(model(x), t)
        model.cleargrads()
        loss.backward()
        opt.update()
        return loss

    m_jit, o_jit = make()
    m_eager, o_eager = make()
    step_jit = tj.jit(lambda: step(m_jit, o_jit))
    for i in range(30):
        lj = step_jit()
        le = step(m_eager, o_eager)
        if i % 10 == 0 or i == 29:
            print(f"step {i:2d}: jit loss {float(lj.data):.6f}   eager loss {float(le.data):.6f}")
    worst = max(float(np.abs(p.data - q.data).max())
                for p, q in zip(m_jit.params(), m_eager.params()))
    print(f"largest parameter difference after 30 steps: {worst:.2e}")
    assert worst < 1e-5
    g = step_jit.trace()
    s = g.summary()
    print(f"graph: {s['nodes']} nodes, ops: " + ", ".join(
        f"{k} x{v}" for k, v in sorted(s['ops'].items())[:8]) + ", ...")
    t_eager = median_us(lambda: step(m_eager, o_eager), 50)
    t_jit = median_us(step_jit, 50)
    print(f"eager {t_eager:8.1f} us/step   jit {t_jit:8.1f} us/step   "
          f"speedup {t_eager / t_jit:5.2f}x")
    print("cache_info:", _info(step_jit))


def _info(f):
    info = f.cache_info()
    return ", ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}"
                     for k, v in info.items())


def main():
    warnings.simplefilter("error", tj.JitWarning)   # the demo must not fall back
    print(f"tracejit {tj.__version__}: backend {tj.jit(lambda: None).backend_name()}")
    demo_while_loop()
    demo_goldstein_price()
    demo_mlp_step()
    print("\nall jitted results matched eager; 0 fallbacks")


if __name__ == "__main__":
    main()
