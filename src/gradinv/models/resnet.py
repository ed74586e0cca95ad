"""ResNet-18 (He et al. 2016, arXiv:1512.03385), torchvision's implementation; ``depth`` 10 and 34
give ResNet-10 (one basic block per stage, Refiner's Fig. 10) and ResNet-34.

CENSOR and GIFD attack an untrained ResNet-18 whose stem is the small-image one of the
inversefed code: a 3x3 stride-1 convolution and no max-pool, so 32x32 and 64x64 inputs keep their
resolution through the first stage. ``small_image_stem=False`` gives the ImageNet stem.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from torch import nn

from gradinv.models import MODELS
from gradinv.settings import bounded


@MODELS.register("resnet18")
class ResNet18:
    @dataclass(frozen=True)
    class Settings:
        small_image_stem: bool = True
        width: int = bounded(64, ge=8, doc="channels of the first stage (64 in the paper)")
        norm: Literal["batch", "group"] = "batch"
        depth: Literal[10, 18, 34] = bounded(
            18, doc="basic blocks per stage: 1 (ResNet-10, Refiner's Fig. 10), 2 or 3-4-6-3"
        )

    @staticmethod
    def build(num_classes: int, in_channels: int, image_size: int, s: Settings) -> nn.Module:
        import torchvision  # on use: importing it costs seconds per job

        norm_layer = nn.BatchNorm2d if s.norm == "batch" else _group_norm
        model = torchvision.models.ResNet(
            torchvision.models.resnet.BasicBlock,
            BLOCKS[s.depth],
            num_classes=num_classes,
            width_per_group=64,
            norm_layer=norm_layer,
        )
        if s.width != 64:
            model = _rescale_width(model, s.width, num_classes, norm_layer, BLOCKS[s.depth])
        if s.small_image_stem:
            model.conv1 = nn.Conv2d(in_channels, s.width, 3, stride=1, padding=1, bias=False)
            model.maxpool = nn.Identity()
        elif in_channels != 3:
            model.conv1 = nn.Conv2d(in_channels, s.width, 7, stride=2, padding=3, bias=False)
        return model


BLOCKS = {10: [1, 1, 1, 1], 18: [2, 2, 2, 2], 34: [3, 4, 6, 3]}


def _group_norm(channels: int) -> nn.GroupNorm:
    # Two groups, as in the CVB code's VBResNet18GN.
    return nn.GroupNorm(2, channels)


def _rescale_width(
    model: nn.Module, width: int, num_classes: int, norm_layer, blocks: list[int]
) -> nn.Module:
    """torchvision fixes the stage widths at 64..512; rebuild with ``width`` .. 8*width."""
    import torchvision

    model.inplanes = width
    model.conv1 = nn.Conv2d(3, width, 7, stride=2, padding=3, bias=False)
    model.bn1 = norm_layer(width)
    block = torchvision.models.resnet.BasicBlock
    model.layer1 = model._make_layer(block, width, blocks[0])
    model.layer2 = model._make_layer(block, 2 * width, blocks[1], stride=2)
    model.layer3 = model._make_layer(block, 4 * width, blocks[2], stride=2)
    model.layer4 = model._make_layer(block, 8 * width, blocks[3], stride=2)
    model.fc = nn.Linear(8 * width, num_classes)
    return model
