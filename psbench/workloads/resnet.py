"""ImageNet ResNets (He et al. 2016) laid out as torchvision's `resnet18`/`resnet34`/`resnet50`
(its v1.5: the stride of a bottleneck on its 3x3 convolution), written here: the torchvision that pins
this torch (0.28.0) is a CUDA build whose operators do not load beside the CPU torch. Same modules, names, shapes and initialisation (convolutions
Kaiming-normal, fan-out; BatchNorm weight 1, bias 0; the classifier torch's default), so the
parameter counts are torchvision's (resnet18 11,689,512; resnet50 25,557,032 at 1000 classes) and a
state dict's keys are the ones torchvision writes.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from psbench.core.errors import ConfigError


def conv3x3(c_in: int, c_out: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False)


def conv1x1(c_in: int, c_out: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False)


class BasicBlock(nn.Module):
    """Two 3x3 convolutions and the identity (or a strided 1x1 projection where the shape changes)."""
    expansion = 1

    def __init__(self, c_in: int, planes: int, stride: int = 1, downsample: nn.Module | None = None):
        super().__init__()
        self.conv1 = conv3x3(c_in, planes, stride)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = conv3x3(planes, planes)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        identity = x if self.downsample is None else self.downsample(x)
        return self.relu(out + identity)


class Bottleneck(nn.Module):
    """1x1 down to `planes`, a 3x3 carrying the stride, 1x1 up to 4 x planes, plus the shortcut."""
    expansion = 4

    def __init__(self, c_in: int, planes: int, stride: int = 1, downsample: nn.Module | None = None):
        super().__init__()
        self.conv1 = conv1x1(c_in, planes)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = conv3x3(planes, planes, stride)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = conv1x1(planes, planes * self.expansion)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        identity = x if self.downsample is None else self.downsample(x)
        return self.relu(out + identity)


Block = type[BasicBlock] | type[Bottleneck]


class ResNet(nn.Module):
    """A 7x7/2 stem and a 3x3/2 max-pool, four stages of blocks (64, 128, 256, 512 planes; the
    last three halve the resolution in their first block), global average pooling, a linear head."""

    def __init__(self, block: Block, layers: tuple[int, int, int, int], n_classes: int = 1000, in_channels: int = 3):
        super().__init__()
        self.inplanes = 64
        self.conv1 = nn.Conv2d(in_channels, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        self.layer1 = self._stage(block, 64, layers[0], 1)
        self.layer2 = self._stage(block, 128, layers[1], 2)
        self.layer3 = self._stage(block, 256, layers[2], 2)
        self.layer4 = self._stage(block, 512, layers[3], 2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512 * block.expansion, n_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def _stage(self, block: Block, planes: int, blocks: int, stride: int) -> nn.Sequential:
        downsample = None
        if stride != 1 or self.inplanes != planes * block.expansion:
            downsample = nn.Sequential(conv1x1(self.inplanes, planes * block.expansion, stride),
                                       nn.BatchNorm2d(planes * block.expansion))
        stage = [block(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * block.expansion
        stage += [block(self.inplanes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*stage)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


ARCHITECTURES: dict[str, tuple[Block, tuple[int, int, int, int]]] = {
    "resnet18": (BasicBlock, (2, 2, 2, 2)),
    "resnet34": (BasicBlock, (3, 4, 6, 3)),
    "resnet50": (Bottleneck, (3, 4, 6, 3)),
}


def resnet(name: str, n_classes: int = 1000, in_channels: int = 3) -> ResNet:
    """torchvision's `models.<name>()` (untrained): resnet18, resnet34 or resnet50."""
    if name not in ARCHITECTURES:
        raise ConfigError(f"unknown ImageNet ResNet '{name}'; choose from: {', '.join(ARCHITECTURES)}")
    block, layers = ARCHITECTURES[name]
    return ResNet(block, layers, n_classes, in_channels)


def imagenet_resnet(name: str) -> Callable[..., ResNet]:
    """The model registry's factory, (input_shape, n_classes) -> the ResNet for C x H x W inputs."""
    def build(input_shape: tuple[int, ...], n_classes: int) -> ResNet:
        if len(input_shape) != 3:
            raise ConfigError(f"{name} needs (C, H, W) inputs, got shape {input_shape}")
        return resnet(name, n_classes, input_shape[0])
    build.__name__ = name
    return build
