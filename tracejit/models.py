"""tracejit.models: Model (a Layer that can plot its graph), Sequential and MLP.

DeZero's models module, above layers. A Model is what a training loop hands to an
optimizer and, under the JIT, what a jitted step function reads its Parameters from.
"""
import numpy as np

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


# ---------------------------------------------------------------- image models
# DeZero's architectures, layer for layer and under the same attribute names, so the
# .npz weights DeZero publishes load into them. The weights of `pretrained=True` come
# from utils.get_file: from the cache directory (~/.dezero, or $TRACEJIT_DATA) when
# the file is there, else downloaded; with no network, DownloadError names the URL and
# the path to copy the file to.

class VGG16(Model):
    WEIGHTS_PATH = "https://github.com/koki0702/dezero-models/releases/download/v0.1/vgg16.npz"

    def __init__(self, pretrained=False):
        super().__init__()
        for name, channels in [("1_1", 64), ("1_2", 64), ("2_1", 128), ("2_2", 128),
                               ("3_1", 256), ("3_2", 256), ("3_3", 256), ("4_1", 512),
                               ("4_2", 512), ("4_3", 512), ("5_1", 512), ("5_2", 512),
                               ("5_3", 512)]:
            setattr(self, "conv" + name, L.Conv2d(channels, kernel_size=3, stride=1, pad=1))
        self.fc6 = L.Linear(4096)
        self.fc7 = L.Linear(4096)
        self.fc8 = L.Linear(1000)
        if pretrained:
            self.load_weights(utils.get_file(VGG16.WEIGHTS_PATH))

    def forward(self, x):
        for block in ("1_1 1_2", "2_1 2_2", "3_1 3_2 3_3", "4_1 4_2 4_3", "5_1 5_2 5_3"):
            for name in block.split():
                x = F.relu(getattr(self, "conv" + name)(x))
            x = F.pooling(x, 2, 2)
        x = F.reshape(x, (x.shape[0], -1))
        x = F.dropout(F.relu(self.fc6(x)))
        x = F.dropout(F.relu(self.fc7(x)))
        return self.fc8(x)

    @staticmethod
    def preprocess(image, size=(224, 224), dtype=np.float32):
        """A PIL image as VGG16's input: RGB, resized, BGR, mean-subtracted, CHW."""
        image = image.convert("RGB")
        if size:
            image = image.resize(size)
        image = np.asarray(image, dtype=dtype)
        image = image[:, :, ::-1]
        image -= np.array([103.939, 116.779, 123.68], dtype=dtype)
        return image.transpose((2, 0, 1))


class ResNet(Model):
    WEIGHTS_PATH = ("https://github.com/koki0702/dezero-models/releases/download/v0.1/"
                    "resnet{}.npz")

    def __init__(self, n_layers=152, pretrained=False):
        super().__init__()
        blocks = {50: [3, 4, 6, 3], 101: [3, 4, 23, 3], 152: [3, 8, 36, 3]}
        if n_layers not in blocks:
            raise ValueError(f"The n_layers argument should be either 50, 101, or 152, "
                             f"but {n_layers} was given.")
        block = blocks[n_layers]
        self.conv1 = L.Conv2d(64, 7, 2, 3)
        self.bn1 = L.BatchNorm()
        self.res2 = BuildingBlock(block[0], 64, 64, 256, 1)
        self.res3 = BuildingBlock(block[1], 256, 128, 512, 2)
        self.res4 = BuildingBlock(block[2], 512, 256, 1024, 2)
        self.res5 = BuildingBlock(block[3], 1024, 512, 2048, 2)
        self.fc6 = L.Linear(1000)
        if pretrained:
            self.load_weights(utils.get_file(ResNet.WEIGHTS_PATH.format(n_layers)))

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = F.pooling(x, kernel_size=3, stride=2)
        x = self.res2(x)
        x = self.res3(x)
        x = self.res4(x)
        x = self.res5(x)
        x = _global_average_pooling_2d(x)
        return self.fc6(x)


class ResNet152(ResNet):
    def __init__(self, pretrained=False):
        super().__init__(152, pretrained)


class ResNet101(ResNet):
    def __init__(self, pretrained=False):
        super().__init__(101, pretrained)


class ResNet50(ResNet):
    def __init__(self, pretrained=False):
        super().__init__(50, pretrained)


def _global_average_pooling_2d(x):
    N, C, H, W = x.shape
    h = F.average_pooling(x, (H, W), stride=1)
    return F.reshape(h, (N, C))


class BuildingBlock(Layer):
    """One BottleneckA (changes channels and resolution) then n_layers - 1 BottleneckB."""

    def __init__(self, n_layers=None, in_channels=None, mid_channels=None,
                 out_channels=None, stride=None, downsample_fb=None):
        super().__init__()
        self.a = BottleneckA(in_channels, mid_channels, out_channels, stride, downsample_fb)
        self._forward = ["a"]
        for i in range(n_layers - 1):
            name = "b{}".format(i + 1)
            setattr(self, name, BottleneckB(out_channels, mid_channels))
            self._forward.append(name)

    def forward(self, x):
        for name in self._forward:
            x = getattr(self, name)(x)
        return x


class BottleneckA(Layer):
    """A bottleneck that changes the resolution: 1x1, 3x3, 1x1 convolutions (with
    BatchNorm) plus a strided 1x1 projection of x. downsample_fb puts the stride on the
    3x3 convolution (Facebook's ResNet) instead of the first 1x1 (MSRA's)."""

    def __init__(self, in_channels, mid_channels, out_channels, stride=2,
                 downsample_fb=False):
        super().__init__()
        stride_1x1, stride_3x3 = (1, stride) if downsample_fb else (stride, 1)
        self.conv1 = L.Conv2d(mid_channels, 1, stride_1x1, 0, nobias=True)
        self.bn1 = L.BatchNorm()
        self.conv2 = L.Conv2d(mid_channels, 3, stride_3x3, 1, nobias=True)
        self.bn2 = L.BatchNorm()
        self.conv3 = L.Conv2d(out_channels, 1, 1, 0, nobias=True)
        self.bn3 = L.BatchNorm()
        self.conv4 = L.Conv2d(out_channels, 1, stride, 0, nobias=True)
        self.bn4 = L.BatchNorm()

    def forward(self, x):
        h1 = F.relu(self.bn1(self.conv1(x)))
        h1 = F.relu(self.bn2(self.conv2(h1)))
        h1 = self.bn3(self.conv3(h1))
        h2 = self.bn4(self.conv4(x))
        return F.relu(h1 + h2)


class BottleneckB(Layer):
    """A bottleneck that keeps the resolution and the channels (identity shortcut)."""

    def __init__(self, in_channels, mid_channels):
        super().__init__()
        self.conv1 = L.Conv2d(mid_channels, 1, 1, 0, nobias=True)
        self.bn1 = L.BatchNorm()
        self.conv2 = L.Conv2d(mid_channels, 3, 1, 1, nobias=True)
        self.bn2 = L.BatchNorm()
        self.conv3 = L.Conv2d(in_channels, 1, 1, 0, nobias=True)
        self.bn3 = L.BatchNorm()

    def forward(self, x):
        h = F.relu(self.bn1(self.conv1(x)))
        h = F.relu(self.bn2(self.conv2(h)))
        h = self.bn3(self.conv3(h))
        return F.relu(h + x)


def _concat_channels(a, b):
    # Channel concatenation from existing primitives: each part scattered into zeros of
    # the joint shape (GetItemGrad, whose gradient is the slice back), then added.
    N, Ca, H, W = a.shape
    shape = (N, Ca + b.shape[1], H, W)
    key_a, _ = F._split_index((slice(None), slice(0, Ca)))
    key_b, _ = F._split_index((slice(None), slice(Ca, None)))
    return F.GetItemGrad(key_a, shape)(a) + F.GetItemGrad(key_b, shape)(b)


class Fire(Layer):
    """SqueezeNet's Fire module: a 1x1 squeeze, then 1x1 and 3x3 expands, concatenated."""

    def __init__(self, squeeze, expand1x1, expand3x3):
        super().__init__()
        self.squeeze = L.Conv2d(squeeze, 1)
        self.expand1x1 = L.Conv2d(expand1x1, 1)
        self.expand3x3 = L.Conv2d(expand3x3, 3, pad=1)

    def forward(self, x):
        s = F.relu(self.squeeze(x))
        return _concat_channels(F.relu(self.expand1x1(s)), F.relu(self.expand3x3(s)))


class SqueezeNet(Model):
    """SqueezeNet 1.1 (Iandola et al. 2016). DeZero declares SqueezeNet but leaves it
    empty and publishes no weights for it, so pretrained=True raises ValueError.
    Pooling rounds the output size down (DeZero's pooling has no ceil mode)."""

    def __init__(self, pretrained=False, num_classes=1000):
        super().__init__()
        if pretrained:
            raise ValueError("SqueezeNet(pretrained=True): DeZero publishes no SqueezeNet "
                             "weights; train it, or load_weights() from your own .npz")
        self.conv1 = L.Conv2d(64, 3, stride=2)
        self.fires = []
        for i, (sq, e1, e3) in enumerate([(16, 64, 64), (16, 64, 64), (32, 128, 128),
                                          (32, 128, 128), (48, 192, 192), (48, 192, 192),
                                          (64, 256, 256), (64, 256, 256)]):
            setattr(self, f"fire{i + 2}", Fire(sq, e1, e3))
            self.fires.append(getattr(self, f"fire{i + 2}"))
        self.conv10 = L.Conv2d(num_classes, 1)

    def forward(self, x):
        x = F.pooling(F.relu(self.conv1(x)), 3, 2)
        for i, fire in enumerate(self.fires):
            x = fire(x)
            if i in (1, 3):
                x = F.pooling(x, 3, 2)
        x = F.relu(self.conv10(F.dropout(x)))
        return _global_average_pooling_2d(x)
