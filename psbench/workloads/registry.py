"""Named workloads: dataset + model + loss + optimizer settings + batch size + epochs."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from psbench.core.errors import ConfigError
from psbench.workloads.datasets import Dataset, load_dataset

if TYPE_CHECKING:  # torch loads when a model is built, so `psbench list` and `--help` stay light
    from torch import nn


DATA_SEED = 0


@dataclass(frozen=True)
class OptimizerSettings:
    lr: float = 0.05
    momentum: float = 0.9
    weight_decay: float = 0.0


@dataclass(frozen=True)
class Workload:
    name: str
    dataset: str
    model: str
    optimizer: OptimizerSettings
    batch_size: int
    epochs: int
    target_accuracy: float  # validation accuracy that time-to-accuracy is measured to
    loss: str = "cross_entropy"
    model_options: dict = field(default_factory=dict)
    description: str = ""

    def load_data(self, seed: int = DATA_SEED, data_dir: Path | str | None = None) -> Dataset:
        """The dataset and its train/val split are fixed (DATA_SEED), like a benchmark's published
        split; a run's seed varies what a run varies: initial weights, shards and batch order."""
        return load_dataset(self.dataset, seed, Path(data_dir) if data_dir else None)

    def build_model(self, data: Dataset, seed: int) -> nn.Module:
        from psbench.workloads.models import build_model

        return build_model(self.model, data.input_shape, data.n_classes, seed, **self.model_options)

    def loss_fn(self) -> nn.Module:
        from torch import nn

        return nn.CrossEntropyLoss()


WORKLOADS: dict[str, Workload] = {w.name: w for w in [
    Workload("logreg-higgs-synthetic", "higgs-synthetic", "logreg", OptimizerSettings(0.1, 0.0), 64, 2, 0.70,
             description="logistic regression on a HIGGS-shaped synthetic binary problem (Kassela 2019)"),
    Workload("mlp-higgs-synthetic", "higgs-synthetic", "mlp", OptimizerSettings(0.05, 0.9), 64, 2, 0.75,
             description="small MLP on the HIGGS-shaped synthetic problem (Kassela 2019)"),
    # Kassela et al. (2019) at size: plain SGD (MLlib's GradientDescent has no momentum)
    Workload("logreg-higgs-1m", "higgs-1m", "logreg", OptimizerSettings(0.5, 0.0), 400, 1, 0.70,
             description="logistic regression on 1 M HIGGS-shaped rows (mini-batch 100 %..0.01 %: Kassela 2019)"),
    Workload("logreg-higgs-10m", "higgs-10m", "logreg", OptimizerSettings(0.5, 0.0), 4000, 1, 0.70,
             description="logistic regression on 10 M HIGGS-shaped rows (the Kassela cost model's second size)"),
    # ... and at Kassela's own data per core on one worker (one core, so the PS's shard fits beside it):
    # 39k training rows (141 VMs x 2 vCPU) and 1.1 M (5 nodes), the same generator as higgs-1m
    Workload("logreg-higgs-49k", "higgs-49k", "logreg", OptimizerSettings(0.5, 0.0), 390, 1, 0.70,
             description="logistic regression on 48,750 HIGGS-shaped rows: 39k training rows on one worker "
                         "(Kassela 2019's rows a core on its 141 x 2-vCPU VMs)"),
    Workload("logreg-higgs-1375k", "higgs-1375k", "logreg", OptimizerSettings(0.5, 0.0), 11000, 1, 0.70,
             description="logistic regression on 1.375 M HIGGS-shaped rows: 1.1 M training rows on one worker "
                         "(Kassela 2019's rows a core on its 5 nodes)"),
    Workload("mlp-higgs-1m", "higgs-1m", "mlp", OptimizerSettings(0.5, 0.0), 400, 1, 0.70,
             model_options={"hidden": (15, 15), "activation": "sigmoid"},
             description="the thesis' 28-15-15-2 sigmoid MLP on 1 M HIGGS-shaped rows (Kassela 2019)"),
    Workload("mlp-wide-synthetic", "higgs-synthetic", "mlp", OptimizerSettings(0.02, 0.9), 64, 1, 0.70,
             model_options={"hidden": (1024, 1024)},
             description="wide MLP (1.08 M params, 4.3 MB) on HIGGS-shaped data: communication-bound runs"),
    Workload("mlp-longtail", "longtail-synthetic", "mlp", OptimizerSettings(0.05, 0.9), 32, 5, 0.60,
             description="MLP on a long-tailed, class-rich synthetic set (100 fine classes in 20 coarse, Zipf 1.1): "
                         "where data sharding has something to balance"),
    Workload("logreg-digits", "digits", "logreg", OptimizerSettings(0.1, 0.9), 32, 5, 0.90,
             description="logistic regression on scikit-learn digits (real 8x8 images)"),
    Workload("mlp-digits", "digits", "mlp", OptimizerSettings(0.05, 0.9), 32, 5, 0.90,
             description="MLP on scikit-learn digits (real 8x8 images)"),
    Workload("mlp-wide-digits", "digits", "mlp", OptimizerSettings(0.05, 0.9), 32, 5, 0.90,
             model_options={"hidden": (256, 256)},
             description="wider MLP on scikit-learn digits (85k params, 0.34 MB: 4.9x mlp-digits' exchange)"),
    Workload("mlp-skewed-synthetic", "skewed-synthetic", "mlp", OptimizerSettings(0.05, 0.9), 32, 5, 0.70,
             description="MLP on 10-class synthetic data with label skew (sharding stress case)"),
    Workload("cnn-mnist1d", "mnist1d", "cnn", OptimizerSettings(0.05, 0.9), 32, 8, 0.80,
             description="1-D CNN on MNIST-1D (Greydanus 2020), generated offline"),
    Workload("cnn-mnist1d-20k", "mnist1d-20k", "cnn", OptimizerSettings(0.05, 0.9), 32, 4, 0.80,
             description="1-D CNN on 20,000 MNIST-1D examples (16k/4k split): sharding over 12 workers"),
    Workload("resnet-synthetic", "cifar-synthetic", "resnet", OptimizerSettings(0.05, 0.9, 5e-4), 32, 1, 0.50,
             description="ResNet-8 on CIFAR-shaped synthetic images (throughput)"),
    Workload("cnn-mnist", "mnist", "cnn", OptimizerSettings(0.05, 0.9), 64, 2, 0.97,
             description="CNN on MNIST IDX files from --data-dir"),
    Workload("resnet-cifar10", "cifar10", "resnet", OptimizerSettings(0.05, 0.9, 5e-4), 128, 10, 0.70,
             description="ResNet-8 on CIFAR-10 binary files from --data-dir"),
]}


def get_workload(name: str) -> Workload:
    if name not in WORKLOADS:
        raise ConfigError(f"unknown workload '{name}'; choose from: {', '.join(WORKLOADS)}")
    return WORKLOADS[name]
