"""Workloads: datasets are deterministic and well-formed; file loaders parse files the test writes."""
from __future__ import annotations

import gzip
import json
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from psbench.core.errors import ConfigError
from psbench.workloads import WORKLOADS, datasets, get_workload, load_dataset
from psbench.workloads.datasets import make_synthetic, read_idx
from psbench.workloads.models import build_model


@pytest.mark.parametrize("name", ["digits", "mnist1d", "higgs-synthetic", "skewed-synthetic", "cifar-synthetic",
                                  "imagenet-synthetic"])
def test_builtin_datasets_are_deterministic_and_well_formed(name: str) -> None:
    a, b = load_dataset(name, seed=3), load_dataset(name, seed=3)
    assert np.array_equal(a.x_train, b.x_train) and np.array_equal(a.y_val, b.y_val)
    assert a.x_train.dtype == np.float32 and a.y_train.dtype == np.int64
    assert len(a.x_train) == len(a.y_train) and len(a.x_val) == len(a.y_val) > 0
    assert set(np.unique(a.y_train)) <= set(range(a.n_classes))
    other = load_dataset(name, seed=4)
    assert not np.array_equal(a.y_train, other.y_train)  # the seed changes the split


def test_label_skew_makes_classes_imbalanced() -> None:
    flat = make_synthetic(0, n_samples=3000, n_features=16, n_classes=5, label_skew=0.0)
    skewed = make_synthetic(0, n_samples=3000, n_features=16, n_classes=5, label_skew=0.5)
    flat_counts = np.bincount(flat.y_train, minlength=5)
    skew_counts = np.bincount(skewed.y_train, minlength=5)
    assert skew_counts[0] / skew_counts[4] > 5 * flat_counts[0] / flat_counts[4]
    with pytest.raises(ConfigError, match="label_skew"):
        make_synthetic(0, label_skew=1.5)


# Above a million rows, the generator is called for at most this many: a fresh clone would spend minutes
# making 10 M rows (1.1 GB) that this test only reads the shape of. higgs-1m itself is real (other
# tests train on it).
GENERATED_ROWS_AT_MOST = datasets.HIGGS_1M_ROWS
ROWS_ASKED = {"higgs-10m": datasets.HIGGS_10M_ROWS, "higgs-1375k": datasets.HIGGS_KASSELA_NODES_ROWS}


@pytest.mark.parametrize("workload", sorted(w for w in WORKLOADS if WORKLOADS[w].dataset not in ("mnist", "cifar10")))
def test_every_builtin_workload_builds_a_model_that_fits_its_data(workload: str, monkeypatch) -> None:
    w = get_workload(workload)
    asked: list[int] = []
    generate = datasets.higgs_shaped

    def at_most_a_million(rows: int):
        asked.append(rows)
        return generate(min(rows, GENERATED_ROWS_AT_MOST))

    monkeypatch.setattr(datasets, "higgs_shaped", at_most_a_million)
    data = w.load_data(seed=0)
    if w.dataset in ROWS_ASKED:  # the loader asks for its own size; the test reads a million of them
        assert asked == [ROWS_ASKED[w.dataset]]
    model = w.build_model(data, seed=0)
    logits = model(torch.from_numpy(data.x_train[:4]))
    assert logits.shape == (4, data.n_classes)
    same = w.build_model(data, seed=0)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), same.parameters()))


def test_unknown_names_are_clear_errors() -> None:
    with pytest.raises(ConfigError, match="unknown workload 'nope'; choose from: .*mlp-digits"):
        get_workload("nope")
    with pytest.raises(ConfigError, match="unknown model"):
        build_model("transformer", (4,), 2, 0)


def _write_idx(path: Path, array: np.ndarray, gz: bool = False) -> None:
    header = bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    payload = header + array.astype(np.uint8).tobytes()
    path.write_bytes(gzip.compress(payload) if gz else payload)


def test_mnist_idx_loader_reads_files_the_test_writes(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    train_x, test_x = rng.integers(0, 256, (20, 28, 28)), rng.integers(0, 256, (7, 28, 28))
    train_y, test_y = rng.integers(0, 10, 20), rng.integers(0, 10, 7)
    _write_idx(tmp_path / "train-images-idx3-ubyte", train_x)
    _write_idx(tmp_path / "train-labels-idx1-ubyte", train_y)
    _write_idx(tmp_path / "t10k-images-idx3-ubyte.gz", test_x, gz=True)
    _write_idx(tmp_path / "t10k-labels-idx1-ubyte", test_y)
    data = get_workload("cnn-mnist").load_data(seed=0, data_dir=tmp_path)
    assert data.x_train.shape == (20, 1, 28, 28) and data.x_val.shape == (7, 1, 28, 28)
    assert np.allclose(data.x_train[3, 0] * 255, train_x[3])
    assert np.array_equal(data.y_val, test_y)


def test_idx_loader_rejects_truncated_and_foreign_files(tmp_path: Path) -> None:
    good = tmp_path / "ok"
    _write_idx(good, np.zeros((2, 3, 3)))
    truncated = tmp_path / "truncated"
    truncated.write_bytes(good.read_bytes()[:-4])
    with pytest.raises(ConfigError, match="header says"):
        read_idx(truncated)
    foreign = tmp_path / "foreign"
    foreign.write_bytes(b"PK\x03\x04 not an idx file")
    with pytest.raises(ConfigError, match="bad magic"):
        read_idx(foreign)


def test_missing_data_files_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="missing data file .*train-images-idx3-ubyte"):
        get_workload("cnn-mnist").load_data(seed=0, data_dir=tmp_path)
    with pytest.raises(ConfigError, match="--data-dir"):
        get_workload("cnn-mnist").load_data(seed=0, data_dir=None)
    with pytest.raises(ConfigError, match="data_batch"):
        get_workload("resnet-cifar10").load_data(seed=0, data_dir=tmp_path)


def test_cifar10_binary_loader_reads_files_the_test_writes(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)

    def batch(n: int) -> tuple[bytes, np.ndarray, np.ndarray]:
        labels = rng.integers(0, 10, n).astype(np.uint8)
        pixels = rng.integers(0, 256, (n, 3072)).astype(np.uint8)
        return np.concatenate([labels[:, None], pixels], axis=1).tobytes(), labels, pixels

    raw1, y1, p1 = batch(5)
    raw2, y2, _ = batch(4)
    raw_t, yt, _ = batch(3)
    folder = tmp_path / "cifar-10-batches-bin"
    folder.mkdir()
    (folder / "data_batch_1.bin").write_bytes(raw1)
    (folder / "data_batch_2.bin").write_bytes(raw2)
    (folder / "test_batch.bin").write_bytes(raw_t)
    data = get_workload("resnet-cifar10").load_data(seed=0, data_dir=tmp_path)
    assert data.x_train.shape == (9, 3, 32, 32) and data.x_val.shape == (3, 3, 32, 32)
    assert np.array_equal(data.y_train, np.concatenate([y1, y2])) and np.array_equal(data.y_val, yt)
    # channel 0, pixel 0 of image 0, normalised with CIFAR-10's mean/std
    assert data.x_train[0, 0, 0, 0] == pytest.approx((p1[0, 0] / 255.0 - 0.4914) / 0.2470, rel=1e-5)
    (folder / "test_batch.bin").write_bytes(raw_t[:-10])
    with pytest.raises(ConfigError, match="record size"):
        get_workload("resnet-cifar10").load_data(seed=0, data_dir=tmp_path)


def test_a_workloads_split_is_fixed_so_seeds_vary_only_init_shards_and_order() -> None:
    from psbench.core.spec import RunSpec
    from psbench.systems.common import prepare

    a, b = prepare(RunSpec("single", "mlp-digits", seed=0)), prepare(RunSpec("single", "mlp-digits", seed=1))
    assert np.array_equal(a.data.x_val, b.data.x_val) and np.array_equal(a.data.y_train, b.data.y_train)
    first = [p.detach().clone() for p in a.build_model().parameters()]
    assert not all(torch.equal(p, q) for p, q in zip(first, b.build_model().parameters()))


def test_generated_data_is_made_once_and_then_loaded(tmp_path: Path, monkeypatch) -> None:
    """Worker processes load the cache instead of importing scikit-learn or generating again."""
    from psbench.workloads.datasets import cached_arrays

    monkeypatch.setenv("PSBENCH_CACHE", str(tmp_path))
    calls = []

    def make():
        calls.append(1)
        return np.arange(6, dtype=np.float32).reshape(3, 2), np.array([0, 1, 0])

    for _ in range(2):
        x, y, fingerprint = cached_arrays("toy", {"n": 3}, ("numpy",), make)
        assert x.shape == (3, 2) and list(y) == [0, 1, 0] and fingerprint.startswith("sha256:")
    assert calls == [1] and sorted(p.suffix for p in tmp_path.iterdir()) == [".json", ".npz"]
    a = load_dataset("digits", seed=0)
    b = load_dataset("digits", seed=0)  # from the cache written by the first
    assert len(list(tmp_path.glob("digits-*.npz"))) == 1 and np.array_equal(a.x_train, b.x_train)
    assert a.fingerprint == b.fingerprint is not None


def test_a_changed_generator_parameter_or_version_is_a_cache_miss(tmp_path: Path, monkeypatch) -> None:
    """The cache is keyed by what made the arrays: another parameter of a real generator, another
    version of the package that generates, or another GENERATOR_VERSION makes new arrays, each with
    its own fingerprint, computed once and kept beside the file."""
    from psbench.workloads import datasets

    monkeypatch.setenv("PSBENCH_CACHE", str(tmp_path))
    small, other = datasets.make_synthetic(0, n_samples=200), datasets.make_synthetic(0, n_samples=240)
    assert len(list(tmp_path.glob("synthetic-*.npz"))) == 2 and small.fingerprint != other.fingerprint
    calls = []

    def make():
        calls.append(1)
        return np.zeros((2, 2), np.float32), np.array([0, 1])

    datasets.cached_arrays("toy", {"n": 2}, ("mnist1d",), make)
    datasets.cached_arrays("toy", {"n": 2}, ("mnist1d",), make)
    assert len(calls) == 1                                                    # a hit
    monkeypatch.setattr(datasets, "package_version", lambda name: "99.0")    # mnist1d upgraded
    datasets.cached_arrays("toy", {"n": 2}, ("mnist1d",), make)
    monkeypatch.setattr(datasets, "GENERATOR_VERSION", datasets.GENERATOR_VERSION + 1)
    datasets.cached_arrays("toy", {"n": 2}, ("mnist1d",), make)
    assert len(calls) == 3 and len(list(tmp_path.glob("toy-*.npz"))) == 3
    about = next(tmp_path.glob("toy-*.json"))
    recipe = json.loads(about.read_text())
    with np.load(about.with_suffix(".npz")) as arrays:
        assert recipe["fingerprint"] == datasets.array_fingerprint(arrays["x"], arrays["y"])
    assert recipe["params"] == {"n": 2} and "mnist1d" in recipe["packages"]
