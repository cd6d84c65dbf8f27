"""tracejit.models: Model (a Layer that can plot its graph), Sequential and MLP.

DeZero's models module, above layers. A Model is what a training loop hands to an
optimizer and, under the JIT, what a jitted step function reads its Parameters from.
"""
import tracejit.functions as F
import tracejit.layers as L
from tracejit import utils
from tracejit.layers import Layer


class Model(Layer):
    def plot(self, *inputs, to_file="model.png"):
        """Run forward on `inputs` and draw the graph with Graphviz (utils.plot_dot_graph)."""
        y = self.forward(*inputs)
        return utils.plot_dot_graph(y, verbose=True, to_file=to_file)


class Sequential(Model):
    """Layers (or callables) applied in order; layers are registered as l0, l1, ..."""

    def __init__(self, *layers):
        super().__init__()
        self.layers = []
        for i, layer in enumerate(layers):
            setattr(self, "l" + str(i), layer)
            self.layers.append(layer)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


class MLP(Model):
    """Fully connected layers of the given output sizes, `activation` between them."""

    def __init__(self, fc_output_sizes, activation=F.sigmoid):
        super().__init__()
        self.activation = activation
        self.layers = []
        for i, out_size in enumerate(fc_output_sizes):
            layer = L.Linear(out_size)
            setattr(self, "l" + str(i), layer)
            self.layers.append(layer)

    def forward(self, x):
        for layer in self.layers[:-1]:
            x = self.activation(layer(x))
        return self.layers[-1](x)
