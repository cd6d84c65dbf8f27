"""Export a spiral-dataset MLP to ONNX and run it in ONNX Runtime (issue 12).

Trains the two-layer MLP of DeZero steps 48-49 for a few epochs (jitted), exports its
prediction with a symbolic batch dimension, and checks that ONNX Runtime's
probabilities equal tracejit's on the test set (another batch size than the export's
example). Also saves the graph as a tracejit file and runs it from the file.
Needs `pip install 'tracejit[onnx]'`. Run: python examples/export_spiral_onnx.py
"""
import os
import tempfile

import numpy as np

import tracejit as tj
import tracejit.functions as F
from tracejit import optimizers
from tracejit.datasets import Spiral
from tracejit.models import MLP


def main(epochs=100, batch_size=30):
    train_set, test_set = Spiral(train=True), Spiral(train=False)
    model = MLP((10, 3))
    optimizer = optimizers.SGD(1.0).setup(model)

    @tj.jit
    def step(x, t):
        loss = F.softmax_cross_entropy(model(x), t)
        model.cleargrads()
        loss.backward()
        optimizer.update()
        return loss

    loader = tj.DataLoader(train_set, batch_size)
    for _ in range(epochs):
        for x, t in loader:
            step(x, t)

    def predict(x):
        return F.softmax(model(x))

    # The example batch fixes everything but the batch size, which stays symbolic;
    # no_grad: an inference graph (nothing saved for a backward).
    with tj.no_grad():
        ex = tj.export(predict, train_set.data[:batch_size], dynamic={"x": {0: "batch"}})
    print(ex)
    try:
        import onnxruntime as ort
    except ImportError:
        print("onnxruntime is not installed (pip install 'tracejit[onnx]'): skipped")
        return
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "spiral_mlp.onnx")
        ex.to_onnx(path)
        sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        (probs,) = sess.run(None, {"x": test_set.data})
        want = predict(test_set.data).data
        np.testing.assert_allclose(probs, want, rtol=1e-5, atol=1e-7)
        acc = float((probs.argmax(axis=1) == test_set.label).mean())
        assert acc > 0.8, acc
        print(f"ONNX Runtime on {len(test_set)} test points: accuracy {acc:.3f}, "
              f"max |onnx - tracejit| {np.abs(probs - want).max():.2e}")

        saved = os.path.join(d, "spiral_mlp.tj")
        ex.save(saved)
        np.testing.assert_allclose(tj.load(saved)(test_set.data), want, rtol=1e-6)
        print("the saved tracejit file gives the same probabilities")


if __name__ == "__main__":
    main()
