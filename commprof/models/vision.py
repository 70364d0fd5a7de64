"""Torchvision classifiers cut into their natural stages and adapted to 28×28 and 32×32 inputs.

ResNet-18, MobileNetV2, VGG-16, AlexNet, DenseNet-121 and SqueezeNet 1.0, built with
`torchvision.models.<name>(weights=None, num_classes=...)` (random weights, nothing downloaded) and
then changed as little as possible:

- every model: with `in_channels` other than 3 the first conv is replaced by one taking that many
  channels, initialised the way the model initialises its convs; with 3 channels it is torchvision's own.
- every model: dropout probability 0 (torchvision's `dropout=` argument), so runs with different rank
  counts stay numerically comparable.
- VGG-16: the fifth max-pool is dropped (28 would shrink to 0 after five halvings). The classifier
  still sees 512×7×7 through torchvision's adaptive average pool, so the parameter count is unchanged.
- AlexNet: the first conv's stride is 1 instead of 4 (kernel 11, padding 2 kept). Stride 4 followed by
  three 3×3/2 pools needs inputs of 63 or more; the parameter count is unchanged.
- DenseNet-121: the stem's max-pool is dropped (28 would reach 0 at the third transition).
- ResNet-18, MobileNetV2, SqueezeNet 1.0: nothing else; they already work from 8, 8 and 21 pixels.

At 28 and 32 pixels ResNet-18, MobileNetV2 and DenseNet-121 end on a 1×1 map, so BatchNorm in
training mode needs at least 2 samples per rank (frozen backbones are exempt: they use running stats).

Each model becomes an `nn.Sequential` of named stages (resnet: stem, layer1…layer4, pool, fc), which
are also its FSDP units; with `frozen_backbone` the stages become a fixed feature extractor under a
trained head (see `commprof.models.frozen`). Exercised by: `pytest tests/unit/test_models.py -k vision`.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable

from torch import nn

from commprof.base.errors import UsageError
from commprof.models import frozen
from commprof.models.spec import ModelSpec


def _torchvision_models():
    """torchvision.models, imported when a model is built: importing torchvision brings torch._dynamo
    (~2 s), which `commprof bench` and a launcher process never need."""
    import torchvision.models

    return torchvision.models

Stages = tuple[tuple[str, nn.Module], ...]


@dataclass(frozen=True)
class VisionParts:
    """A torchvision classifier taken apart."""

    stages: Stages
    """Feature-extractor stages in forward order; the last one outputs a feature map."""
    classifier: Stages
    """torchvision's own head, from that feature map to logits (pooling included)."""
    pool: nn.Module
    """Feature map → [B, feat_dim]: what a frozen backbone ends with (torchvision's pooling)."""
    feat_dim: int
    """Width of `pool`'s output, the input of a frozen-backbone head."""


@dataclass(frozen=True)
class Arch:
    """How to build one adapted torchvision model."""

    parts: Callable[[int, int], VisionParts]
    """(num_classes, in_channels) → the adapted model's parts."""
    min_image_size: int
    """Smallest square input the adapted model accepts."""


def _rechannel(conv: nn.Conv2d, in_channels: int, init: Callable[[nn.Conv2d], None] | None) -> nn.Conv2d:
    """`conv`, or an otherwise identical conv taking `in_channels` inputs, initialised by `init`
    (None: PyTorch's default init, which is what the model used)."""
    if in_channels == conv.in_channels:
        return conv
    new = nn.Conv2d(in_channels, conv.out_channels, conv.kernel_size, stride=conv.stride,
                    padding=conv.padding, bias=conv.bias is not None)
    if init is not None:
        init(new)
        if new.bias is not None:
            nn.init.zeros_(new.bias)
    return new


def _fan_out(conv: nn.Conv2d) -> None:
    nn.init.kaiming_normal_(conv.weight, mode="fan_out", nonlinearity="relu")


def _flat(pool: nn.Module) -> nn.Sequential:
    return nn.Sequential(pool, nn.Flatten(1))


def _runs(seq: nn.Sequential, names: tuple[str, ...], ends: tuple[int, ...]) -> Stages:
    """Cut `seq` into consecutive runs named `names`, run i ending before index `ends[i]`."""
    layers = list(seq)
    starts = (0,) + ends[:-1]
    return tuple((n, nn.Sequential(*layers[a:b])) for n, a, b in zip(names, starts, ends))


def _resnet18(num_classes: int, in_channels: int) -> VisionParts:
    net = _torchvision_models().resnet18(weights=None, num_classes=num_classes)
    conv1 = _rechannel(net.conv1, in_channels, _fan_out)
    stem = nn.Sequential(conv1, net.bn1, net.relu, net.maxpool)
    layers = tuple((f"layer{i}", getattr(net, f"layer{i}")) for i in range(1, 5))
    return VisionParts(stages=(("stem", stem),) + layers,
                       classifier=(("pool", _flat(net.avgpool)), ("fc", net.fc)),
                       pool=_flat(nn.AdaptiveAvgPool2d(1)), feat_dim=net.fc.in_features)


def _mobilenet_v2(num_classes: int, in_channels: int) -> VisionParts:
    net = _torchvision_models().mobilenet_v2(weights=None, num_classes=num_classes, dropout=0.0)
    first = net.features[0][0]
    net.features[0][0] = _rechannel(first, in_channels, lambda c: nn.init.kaiming_normal_(c.weight, mode="fan_out"))
    # The rows of the paper's Table 2: stem conv, seven bottleneck groups, final 1×1 conv.
    names = ("stem",) + tuple(f"bottleneck{i}" for i in range(1, 8)) + ("conv_last",)
    stages = _runs(net.features, names, (1, 2, 4, 7, 11, 14, 17, 18, 19))
    return VisionParts(stages=stages,
                       classifier=(("pool", _flat(nn.AdaptiveAvgPool2d(1))), ("classifier", net.classifier)),
                       pool=_flat(nn.AdaptiveAvgPool2d(1)), feat_dim=net.last_channel)


def _vgg16(num_classes: int, in_channels: int) -> VisionParts:
    net = _torchvision_models().vgg16(weights=None, num_classes=num_classes, dropout=0.0)
    net.features[0] = _rechannel(net.features[0], in_channels, _fan_out)
    net.features[30] = nn.Identity()  # the fifth max-pool
    stages = _runs(net.features, tuple(f"block{i}" for i in range(1, 6)), (5, 10, 17, 24, 31))
    fcs = _runs(net.classifier, ("fc6", "fc7", "fc8"), (3, 6, 7))
    return VisionParts(stages=stages, classifier=(("pool", _flat(net.avgpool)),) + fcs,
                       pool=_flat(nn.AdaptiveAvgPool2d((7, 7))), feat_dim=512 * 7 * 7)


def _alexnet(num_classes: int, in_channels: int) -> VisionParts:
    net = _torchvision_models().alexnet(weights=None, num_classes=num_classes, dropout=0.0)
    net.features[0] = _rechannel(net.features[0], in_channels, None)
    net.features[0].stride = (1, 1)
    stages = _runs(net.features, tuple(f"conv{i}" for i in range(1, 6)), (3, 6, 8, 10, 13))
    fcs = _runs(net.classifier, ("fc6", "fc7", "fc8"), (3, 6, 7))
    return VisionParts(stages=stages, classifier=(("pool", _flat(net.avgpool)),) + fcs,
                       pool=_flat(nn.AdaptiveAvgPool2d((6, 6))), feat_dim=256 * 6 * 6)


def _densenet121(num_classes: int, in_channels: int) -> VisionParts:
    net = _torchvision_models().densenet121(weights=None, num_classes=num_classes)
    f = net.features
    conv0 = _rechannel(f.conv0, in_channels, lambda c: nn.init.kaiming_normal_(c.weight))
    stages = [("stem", nn.Sequential(conv0, f.norm0, f.relu0))]  # pool0 dropped
    for i in range(1, 5):
        stages.append((f"denseblock{i}", getattr(f, f"denseblock{i}")))
        if i < 4:
            stages.append((f"transition{i}", getattr(f, f"transition{i}")))
    # DenseNet.forward applies a ReLU after `features`; it lives with the final norm here.
    stages.append(("norm5", nn.Sequential(f.norm5, nn.ReLU(inplace=True))))
    return VisionParts(stages=tuple(stages),
                       classifier=(("pool", _flat(nn.AdaptiveAvgPool2d(1))), ("classifier", net.classifier)),
                       pool=_flat(nn.AdaptiveAvgPool2d(1)), feat_dim=net.classifier.in_features)


def _squeezenet1_0(num_classes: int, in_channels: int) -> VisionParts:
    net = _torchvision_models().squeezenet1_0(weights=None, num_classes=num_classes, dropout=0.0)
    net.features[0] = _rechannel(net.features[0], in_channels, lambda c: nn.init.kaiming_uniform_(c.weight))
    # Named as in the paper: conv1 (+ maxpool1), fire2 … fire9; the max-pools ride with fire4 and fire8.
    names = ("conv1",) + tuple(f"fire{i}" for i in range(2, 10))
    stages = _runs(net.features, names, (3, 4, 5, 7, 8, 9, 10, 12, 13))
    conv10 = nn.Sequential(*net.classifier, nn.Flatten(1))  # dropout, conv 1×1, ReLU, global pool
    return VisionParts(stages=stages, classifier=(("conv10", conv10),),
                       pool=_flat(nn.AdaptiveAvgPool2d(1)), feat_dim=512)


ARCHS: dict[str, Arch] = {
    "resnet18": Arch(_resnet18, min_image_size=8),
    "mobilenet_v2": Arch(_mobilenet_v2, min_image_size=8),
    "vgg16": Arch(_vgg16, min_image_size=16),
    "alexnet": Arch(_alexnet, min_image_size=21),
    "densenet121": Arch(_densenet121, min_image_size=15),
    "squeezenet1_0": Arch(_squeezenet1_0, min_image_size=21),
}


def units_of(stages: Stages) -> tuple[nn.Module, ...]:
    """The stages that hold parameters: parameter-free ones (pooling) need no wrapping."""
    return tuple(m for _, m in stages if any(True for _ in m.parameters()))


def build(name: str, *, num_classes: int, in_channels: int, image_size: int, frozen_backbone: bool,
          head_width: int = frozen.HEAD_WIDTH) -> ModelSpec:
    """Torchvision model `name`, adapted; with `frozen_backbone`, its features under a trained head."""
    arch = ARCHS[name]
    if image_size < arch.min_image_size:
        raise UsageError(f"model '{name}' needs image_size >= {arch.min_image_size}, got {image_size}")
    parts = arch.parts(num_classes, in_channels)
    if frozen_backbone:
        net, units = frozen.fixed_feature_classifier(
            nn.Sequential(OrderedDict(parts.stages + (("pool", parts.pool),))),
            feat_dim=parts.feat_dim, num_classes=num_classes, width=head_width)
        return ModelSpec(module=net, task="classify", units=units, kind="image", layers=tuple(net.children()),
                         head=units[1:])
    stages = parts.stages + parts.classifier
    net = nn.Sequential(OrderedDict(stages))
    linears = tuple(m for _, stage in parts.classifier for m in stage.modules() if isinstance(m, nn.Linear))
    return ModelSpec(module=net, task="classify", units=units_of(stages), kind="image",
                     layers=tuple(net.children()), head=linears if len(linears) > 1 else ())
