"""Train a two-layer MLP on the spiral dataset (DeZero steps 48-49).

Mini-batches from a DataLoader, softmax cross-entropy, and an optimizer that updates
the model's Parameters in place. Seeded: the data and weights are DeZero's.
Run: python examples/mlp_spiral.py
"""
import tracejit as tj
import tracejit.functions as F
from tracejit import optimizers
from tracejit.datasets import Spiral
from tracejit.models import MLP


def train_step(model, optimizer, x, t):
    """One step on one mini-batch; returns the batch's loss and accuracy as floats."""
    y = model(x)
    loss = F.softmax_cross_entropy(y, t)
    acc = F.accuracy(y, t)
    model.cleargrads()
    loss.backward()
    optimizer.update()
    return float(loss.data), float(acc.data)


def evaluate(model, dataset):
    with tj.no_grad():
        y = model(dataset.data)
        return (float(F.softmax_cross_entropy(y, dataset.label).data),
                float(F.accuracy(y, dataset.label).data))


def train(max_epoch=100, batch_size=30, hidden_size=10, lr=1.0):
    train_set = Spiral(train=True)      # reseeds NumPy with 1984, as DeZero does
    test_set = Spiral(train=False)
    loader = tj.DataLoader(train_set, batch_size)
    model = MLP((hidden_size, 3))
    optimizer = optimizers.SGD(lr).setup(model)

    losses = []
    for epoch in range(max_epoch):
        sum_loss = sum_acc = 0.0
        for x, t in loader:
            loss, acc = train_step(model, optimizer, x, t)
            sum_loss += loss * len(t)
            sum_acc += acc * len(t)
        losses.append(sum_loss / len(train_set))
        if epoch % 10 == 0 or epoch == max_epoch - 1:
            print(f"epoch {epoch + 1:3d}  loss {losses[-1]:.4f}  "
                  f"accuracy {sum_acc / len(train_set):.3f}")
    return model, losses, evaluate(model, test_set)


def main():
    model, losses, (test_loss, test_acc) = train()
    print(f"test loss {test_loss:.4f}  test accuracy {test_acc:.3f}")
    assert losses[-1] < 0.35 * losses[0], losses
    assert sum(b < a for a, b in zip(losses, losses[1:])) >= len(losses) * 2 // 3, losses
    assert test_acc > 0.8, test_acc


if __name__ == "__main__":
    main()
