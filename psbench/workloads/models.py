"""Plain torch models: logistic regression, MLP, a small 1-D/2-D CNN, a small CIFAR-style ResNet, and
torchvision's ImageNet ResNet-18/50 (resnet.py)."""
from __future__ import annotations

import math
from typing import Callable

import torch
from torch import nn

from psbench.core.errors import ConfigError
from psbench.workloads.resnet import imagenet_resnet


class LogisticRegression(nn.Module):
    def __init__(self, input_shape: tuple[int, ...], n_classes: int):
        super().__init__()
        self.linear = nn.Linear(math.prod(input_shape), n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x.flatten(1))


ACTIVATIONS: dict[str, Callable[[], nn.Module]] = {"relu": nn.ReLU, "sigmoid": nn.Sigmoid}


class MLP(nn.Module):
    """Fully connected layers; `activation` sigmoid is the thesis' 28-15-15-2 MLP and what Spark's
    MultilayerPerceptronClassifier computes in its hidden layers."""

    def __init__(self, input_shape: tuple[int, ...], n_classes: int, hidden: tuple[int, ...] = (128, 64),
                 activation: str = "relu"):
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ConfigError(f"mlp activation '{activation}' is not one of {', '.join(ACTIVATIONS)}")
        layers: list[nn.Module] = []
        width = math.prod(input_shape)
        for h in hidden:
            layers += [nn.Linear(width, h), ACTIVATIONS[activation]()]
            width = h
        layers.append(nn.Linear(width, n_classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x.flatten(1))


class SmallCNN(nn.Module):
    """Two conv blocks and a linear head; 1-D for (C, L) inputs (MNIST-1D), 2-D for (C, H, W)."""

    def __init__(self, input_shape: tuple[int, ...], n_classes: int, channels: int = 32):
        super().__init__()
        if len(input_shape) not in (2, 3):
            raise ConfigError(f"cnn needs (C, L) or (C, H, W) inputs, got shape {input_shape}")
        conv, pool = (nn.Conv1d, nn.MaxPool1d) if len(input_shape) == 2 else (nn.Conv2d, nn.MaxPool2d)
        self.features = nn.Sequential(
            conv(input_shape[0], channels, 3, padding=1), nn.ReLU(), pool(2),
            conv(channels, channels, 3, padding=1), nn.ReLU(), pool(2),
        )
        with torch.no_grad():
            n_flat = self.features(torch.zeros(1, *input_shape)).numel()
        self.head = nn.Linear(n_flat, n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


class BasicBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class SmallResNet(nn.Module):
    """CIFAR-style ResNet (He et al. 2016): 3 stages of `blocks_per_stage` basic blocks.
    blocks_per_stage=9 is ResNet-56 as in the thesis; the default 1 (ResNet-8) fits 2 CPU cores."""

    def __init__(self, input_shape: tuple[int, ...], n_classes: int, blocks_per_stage: int = 1, width: int = 16):
        super().__init__()
        if len(input_shape) != 3:
            raise ConfigError(f"resnet needs (C, H, W) inputs, got shape {input_shape}")
        self.stem = nn.Sequential(nn.Conv2d(input_shape[0], width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU())
        stages: list[nn.Module] = []
        c_in = width
        for stage, c_out in enumerate((width, width * 2, width * 4)):
            for block in range(blocks_per_stage):
                stages.append(BasicBlock(c_in, c_out, 2 if stage > 0 and block == 0 else 1))
                c_in = c_out
        self.stages = nn.Sequential(*stages)
        self.head = nn.Linear(c_in, n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.stages(self.stem(x))
        return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(out, 1), 1))


MODELS: dict[str, Callable[..., nn.Module]] = {
    "logreg": LogisticRegression,
    "mlp": MLP,
    "cnn": SmallCNN,
    "resnet": SmallResNet,
    "resnet18": imagenet_resnet("resnet18"),  # torchvision's ImageNet ResNets (resnet.py)
    "resnet50": imagenet_resnet("resnet50"),
}


def build_model(name: str, input_shape: tuple[int, ...], n_classes: int, seed: int, **options) -> nn.Module:
    """Same seed, same initial weights: every worker of every system starts from one model."""
    if name not in MODELS:
        raise ConfigError(f"unknown model '{name}'; choose from: {', '.join(MODELS)}")
    torch.manual_seed(seed)
    return MODELS[name](input_shape, n_classes, **options)
