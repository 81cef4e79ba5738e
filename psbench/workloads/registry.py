"""Named workloads: dataset + model + loss + optimizer settings + batch size + epochs."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from psbench.core.errors import ConfigError
from psbench.workloads import user
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
    target_accuracy: float | None  # validation accuracy that time-to-accuracy is measured to (None: none)
    loss: str = "cross_entropy"
    model_options: dict = field(default_factory=dict)
    description: str = ""
    folder: Path | None = None  # a workload file's folder: its modules are looked for there (user.py)

    def load_data(self, seed: int = DATA_SEED, data_dir: Path | str | None = None) -> Dataset:
        """The dataset and its train/val split are fixed (DATA_SEED), like a benchmark's published
        split; a run's seed varies what a run varies: initial weights, shards and batch order.
        `dataset` is a built-in name or the user's loader (pkg.module:loader)."""
        where = Path(data_dir) if data_dir else None
        if user.is_import_string(self.dataset):
            return user.load_user_dataset(self.dataset, seed, where, self.folder)
        return load_dataset(self.dataset, seed, where)

    def build_model(self, data: Dataset, seed: int) -> nn.Module:
        return self.model_for(data.input_shape, data.n_classes, seed)

    def model_for(self, input_shape: tuple[int, ...], n_classes: int, seed: int) -> nn.Module:
        """The seeded initial model: a built-in model or the user's factory (pkg.module:factory)."""
        if user.is_import_string(self.model):
            return user.build_user_model(self.model, input_shape, n_classes, seed, self.folder, **self.model_options)
        from psbench.workloads.models import build_model

        return build_model(self.model, input_shape, n_classes, seed, **self.model_options)

    def check(self, seed: int, data_dir: Path | str | None = None) -> None:
        """The user's loader and factory called once, here, before a run starts: one that fails, or
        returns the wrong thing, is one line (ConfigError) naming it, and nothing is written."""
        data = self.load_data(data_dir=data_dir)
        model = self.model_for(data.input_shape, data.n_classes, seed)
        user.check_forward(self.model, model, data)

    @property
    def is_user(self) -> bool:
        """Defined outside this registry: a model+dataset pair or a workload file."""
        return user.is_user_workload(self.name)

    def provenance(self) -> dict | None:
        """Where a user workload's model and data came from (for the manifest); None for the registry's."""
        return user.provenance(self.name, self.model, self.dataset) if self.is_user else None

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
    # Horovod's pytorch_synthetic_benchmark.py as a workload: its data (one fixed batch a worker of
    # 3x224x224 N(0, 1) images, random labels), its batch of 32 and plain SGD at lr 0.01 (the script
    # scales lr by the ranks; speed does not depend on it), on ResNet-18 (the script's default is
    # ResNet-50, 2.2x the compute: horovod-synthetic-resnet50) so a CPU run stays in minutes
    Workload("horovod-synthetic", "imagenet-synthetic", "resnet18", OptimizerSettings(0.01, 0.0), 32, 20, None,
             description="ResNet-18 on ImageNet-shaped random images as Horovod's synthetic benchmark makes them "
                         "(3x224x224, batch 32, SGD lr 0.01; at 2 workers one fixed batch each: 20 steps)"),
    Workload("horovod-synthetic-resnet50", "imagenet-synthetic", "resnet50", OptimizerSettings(0.01, 0.0), 32, 20,
             None, description="ResNet-50 (the script's default model) on Horovod's synthetic ImageNet-shaped data"),
    Workload("cnn-mnist", "mnist", "cnn", OptimizerSettings(0.05, 0.9), 64, 2, 0.97,
             description="CNN on MNIST IDX files from --data-dir"),
    Workload("resnet-cifar10", "cifar10", "resnet", OptimizerSettings(0.05, 0.9, 5e-4), 128, 10, 0.70,
             description="ResNet-8 on CIFAR-10 binary files from --data-dir"),
]}


_USER_WORKLOADS: dict[str, Workload] = {}


def get_workload(name: str) -> Workload:
    """A registry workload by name, or the user's: MODEL+DATASET or a workload file (user.py), read
    the same way in every process of a run."""
    if name in WORKLOADS:
        return WORKLOADS[name]
    if user.is_user_workload(name):
        if name not in _USER_WORKLOADS:
            fields = user.workload_fields(name)
            optimizer = OptimizerSettings(**fields.pop("optimizer"))
            _USER_WORKLOADS[name] = Workload(optimizer=optimizer, **fields)
        return _USER_WORKLOADS[name]
    raise ConfigError(f"unknown workload '{name}'; choose from: {', '.join(WORKLOADS)}, a workload file "
                      "(path.toml) or --model pkg.module:factory --dataset pkg.module:loader")
