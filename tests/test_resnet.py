"""psbench's ImageNet ResNets (workloads/resnet.py) are torchvision's architecture: its published
parameter counts, its module names and shapes, its initialisation, and 1000 scores for a 224 image."""
from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from psbench.core.errors import ConfigError
from psbench.workloads.models import build_model
from psbench.workloads.resnet import resnet

# torchvision's model cards (ResNet18_Weights.IMAGENET1K_V1.meta["num_params"], ...), 1000 classes
TORCHVISION_PARAMS = {"resnet18": 11_689_512, "resnet34": 21_797_672, "resnet50": 25_557_032}


@pytest.mark.parametrize("name", sorted(TORCHVISION_PARAMS))
def test_parameter_counts_are_torchvisions(name: str) -> None:
    assert sum(p.numel() for p in resnet(name).parameters()) == TORCHVISION_PARAMS[name]


def test_names_and_shapes_follow_torchvision() -> None:
    shapes = {k: tuple(v.shape) for k, v in resnet("resnet50").state_dict().items()}
    assert shapes["conv1.weight"] == (64, 3, 7, 7)
    assert shapes["layer1.0.downsample.0.weight"] == (256, 64, 1, 1)  # the first bottleneck widens 64 -> 256
    assert shapes["layer2.0.conv2.weight"] == (128, 128, 3, 3)        # v1.5: the stride is on the 3x3
    assert shapes["layer4.2.conv3.weight"] == (2048, 512, 1, 1)
    assert shapes["fc.weight"] == (1000, 2048)
    assert "layer1.0.bn1.num_batches_tracked" in shapes
    small = resnet("resnet18").state_dict()
    assert "layer1.0.downsample.0.weight" not in small and small["layer2.0.downsample.0.weight"].shape == (128, 64, 1, 1)
    assert len(small) == 122 and len(shapes) == 320  # torchvision's state dicts' entries


def test_initialisation_is_torchvisions() -> None:
    torch.manual_seed(0)
    model = resnet("resnet18")
    conv = model.layer3[0].conv2  # 256 -> 256, 3x3: Kaiming normal, fan-out, ReLU gain
    assert conv.weight.std().item() == pytest.approx(math.sqrt(2 / (256 * 9)), rel=0.02)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            assert torch.all(m.weight == 1) and torch.all(m.bias == 0)
    bound = 1 / math.sqrt(512)  # the classifier keeps torch's default: uniform within 1/sqrt(fan_in)
    assert model.fc.weight.abs().max().item() <= bound and model.fc.weight.abs().max().item() > 0.9 * bound


def test_a_224_image_gets_1000_scores_and_other_shapes_are_one_line() -> None:
    model = build_model("resnet18", (3, 224, 224), 1000, seed=0)
    with torch.no_grad():
        assert model.eval()(torch.zeros(1, 3, 224, 224)).shape == (1, 1000)
    assert build_model("resnet18", (1, 64, 64), 10, seed=0).conv1.in_channels == 1
    with pytest.raises(ConfigError, match=r"resnet18 needs \(C, H, W\) inputs"):
        build_model("resnet18", (28,), 2, seed=0)
    with pytest.raises(ConfigError, match="unknown ImageNet ResNet 'resnet101'"):
        resnet("resnet101")
