"""A model and a dataset of your own, as psbench calls them (docs/workloads.md).

    psbench run --system single --workload examples/own_model/own_mlp.toml
    psbench run --system ps -np 2 --model own_model:make_model --dataset own_model:load_data   # from this folder
"""
from __future__ import annotations

import math

import numpy as np
from torch import nn


def make_model(input_shape: tuple[int, ...], n_classes: int, hidden: int = 32) -> nn.Module:
    """Called with the examples' shape and the number of classes (torch is seeded first)."""
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), hidden), nn.ReLU(),
                         nn.Linear(hidden, n_classes))


def load_data(seed: int, data_dir: str | None = None):
    """Called with the data seed and --data-dir (unused here): (x_train, y_train, x_val, y_val).
    Four Gaussian blobs in 8 dimensions, 1,600 training and 400 validation examples."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(0.0, 2.0, size=(4, 8))
    y = rng.integers(0, 4, size=2000)
    x = centres[y] + rng.normal(0.0, 1.0, size=(2000, 8))
    return x[:1600], y[:1600], x[1600:], y[1600:]   # float64 is converted to float32 by psbench
