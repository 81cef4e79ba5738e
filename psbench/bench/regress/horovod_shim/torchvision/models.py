"""`torchvision.models.<name>()` as the synthetic benchmark calls it: psbench's own definitions of
torchvision's ImageNet ResNets (psbench/workloads/resnet.py), 1000 classes, untrained."""
from __future__ import annotations

from psbench.workloads.resnet import ResNet, resnet


def resnet18() -> ResNet:
    return resnet("resnet18")


def resnet34() -> ResNet:
    return resnet("resnet34")


def resnet50() -> ResNet:
    return resnet("resnet50")
