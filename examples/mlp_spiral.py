"""Train a two-layer MLP on the spiral dataset (DeZero steps 48-49).

Mini-batches from a DataLoader, softmax cross-entropy, and an optimizer that updates
the model's Parameters in place. Seeded: the data and weights are DeZero's.
The training step is compiled with @tj.jit as one graph (forward, backward and the
optimizer's in-place update); the same training runs eagerly beside it and the two
must agree step for step.
Run: python examples/mlp_spiral.py
"""
import numpy as np

import tracejit as tj
import tracejit.functions as F
from tracejit import optimizers
from tracejit.datasets import Spiral
from tracejit.models import MLP


def train_step(model, optimizer, x, t):
    """One step on one mini-batch; returns the batch's loss and accuracy (Variables).

    Return Variables, not float(loss.data): under jit a float() is a value Python
    looks at, so it would become a guard and the step would retrace every call.
    """
    y = model(x)
    loss = F.softmax_cross_entropy(y, t)
    acc = F.accuracy(y, t)
    model.cleargrads()
    loss.backward()
    optimizer.update()
    return loss, acc


def evaluate(model, dataset):
    with tj.no_grad():
        y = model(dataset.data)
        return (float(F.softmax_cross_entropy(y, dataset.label).data),
                float(F.accuracy(y, dataset.label).data))


def train(max_epoch=100, batch_size=30, hidden_size=10, lr=1.0, jit=True):
    train_set = Spiral(train=True)      # reseeds NumPy with 1984, as DeZero does
    test_set = Spiral(train=False)
    loader = tj.DataLoader(train_set, batch_size)
    model = MLP((hidden_size, 3))
    optimizer = optimizers.SGD(lr).setup(model)

    def step(x, t):
        return train_step(model, optimizer, x, t)

    if jit:
        step = tj.jit(step)

    losses = []
    for epoch in range(max_epoch):
        sum_loss = sum_acc = 0.0
        for x, t in loader:
            loss, acc = step(x, t)
            sum_loss += float(loss.data) * len(t)
            sum_acc += float(acc.data) * len(t)
        losses.append(sum_loss / len(train_set))
        if epoch % 10 == 0 or epoch == max_epoch - 1:
            print(f"epoch {epoch + 1:3d}  loss {losses[-1]:.4f}  "
                  f"accuracy {sum_acc / len(train_set):.3f}")
    if jit:
        print("jitted step:", step.cache_info())
        assert step.cache_info()["fallbacks"] == 0
    return model, losses, evaluate(model, test_set)


def main():
    model, losses, (test_loss, test_acc) = train(jit=True)
    print(f"test loss {test_loss:.4f}  test accuracy {test_acc:.3f}")
    _, eager_losses, _ = train(jit=False)
    np.testing.assert_allclose(losses, eager_losses, rtol=1e-6)
    print("jitted and eager training agree epoch by epoch")
    assert losses[-1] < 0.35 * losses[0], losses
    assert sum(b < a for a, b in zip(losses, losses[1:])) >= len(losses) * 2 // 3, losses
    assert test_acc > 0.8, test_acc


if __name__ == "__main__":
    main()
