"""Datasets: real ones a package ships or generates, synthetic ones, and loaders for user files.

Every loader returns a `Dataset` of float32 features and int64 labels, split into train and
validation, deterministic for a seed. Nothing is downloaded. Generated arrays are cached
(cached_arrays) under a key of what made them: the generator's parameters, the generating
packages' versions and GENERATOR_VERSION; each cache file's fingerprint (sha256 of its arrays)
is kept beside it, and a run's manifest records it.
"""
from __future__ import annotations

import functools
import gzip
import hashlib
import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from psbench.core.atomic import atomic_write, atomic_write_json
from psbench.core.errors import ConfigError

# Bump when a generator's own code (below) changes what it makes; the packages it calls are keyed
# by their versions.
GENERATOR_VERSION = 1


@dataclass(frozen=True)
class Dataset:
    name: str
    x_train: np.ndarray  # float32, shape (n, *input_shape)
    y_train: np.ndarray  # int64, shape (n,)
    x_val: np.ndarray
    y_val: np.ndarray
    n_classes: int
    fingerprint: str | None = None  # of the generated arrays it was made from (None: not cached)

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.x_train.shape[1:])


def _split(name: str, x: np.ndarray, y: np.ndarray, n_classes: int, seed: int,
           val_fraction: float = 0.2, fingerprint: str | None = None) -> Dataset:
    order = np.random.default_rng(seed).permutation(len(x))
    n_val = int(round(len(x) * val_fraction))
    val, train = order[:n_val], order[n_val:]
    return Dataset(name, np.ascontiguousarray(x[train], dtype=np.float32), y[train].astype(np.int64),
                   np.ascontiguousarray(x[val], dtype=np.float32), y[val].astype(np.int64), n_classes, fingerprint)


def _standardise(x: np.ndarray) -> np.ndarray:
    mean, std = x.mean(axis=0, keepdims=True), x.std(axis=0, keepdims=True)
    return (x - mean) / np.where(std > 0, std, 1.0)


def load_digits(seed: int, data_dir: Path | None = None) -> Dataset:
    """scikit-learn's 8x8 handwritten digits (1797 real images, shipped with the package)."""
    def make() -> tuple[np.ndarray, np.ndarray]:
        from sklearn.datasets import load_digits as sk_digits

        bunch = sk_digits()
        return (bunch.data / 16.0).astype(np.float32), bunch.target.astype(np.int64)

    x, y, fingerprint = cached_arrays("digits", {}, ("scikit-learn",), make)
    return _split("digits", x, y, 10, seed, fingerprint=fingerprint)


def cache_dir() -> Path:
    """Where generated datasets are kept between processes ($PSBENCH_CACHE, else ~/.cache/psbench)."""
    import os

    return Path(os.environ.get("PSBENCH_CACHE", Path.home() / ".cache" / "psbench"))


def load_mnist1d(seed: int, data_dir: Path | None = None, n_samples: int = 5000) -> Dataset:
    """MNIST-1D (Greydanus 2020), generated offline by the `mnist1d` package (any size; the
    package's default 5000 gives a 4000/1000 split)."""
    def make() -> tuple[np.ndarray, np.ndarray]:
        from mnist1d.data import get_dataset_args, make_dataset

        args = get_dataset_args()
        args.seed = 42  # the benchmark's canonical data
        args.num_samples = n_samples
        data = make_dataset(args)
        return (np.concatenate([data["x"], data["x_test"]]).astype(np.float32),
                np.concatenate([data["y"], data["y_test"]]).astype(np.int64))

    x, y, fingerprint = cached_arrays("mnist1d", {"seed": 42, "num_samples": n_samples}, ("mnist1d",), make)
    x = _standardise(x)[:, None, :]  # (n, 1, 40): one channel for the 1-D CNN
    return _split("mnist1d", x, y, 10, seed, fingerprint=fingerprint)


def package_version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def array_fingerprint(*arrays: np.ndarray) -> str:
    """sha256 over each array's dtype, shape and bytes."""
    digest = hashlib.sha256()
    for a in arrays:
        a = np.ascontiguousarray(a)
        digest.update(f"{a.dtype.str}{a.shape}".encode())
        digest.update(a.data)
    return f"sha256:{digest.hexdigest()}"


def write_npz(path: Path, **arrays: np.ndarray) -> None:
    """np.savez to exactly `path` (given a name, savez would add '.npz' to it)."""
    with open(path, "wb") as f:
        np.savez(f, **arrays)


def data_fingerprint(data: Dataset) -> str:
    """The dataset's fingerprint: its generated arrays' (kept with the cache), else its own arrays'."""
    return data.fingerprint or array_fingerprint(data.x_train, data.y_train, data.x_val, data.y_val)


def cached_arrays(name: str, params: dict[str, Any], packages: tuple[str, ...],
                  make: Callable[[], tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray, str]:
    """(x, y, fingerprint), made once by `make` and kept in cache_dir() (every worker process loads
    its run's data, and generating it, or importing scikit-learn to read it, costs seconds of CPU
    a process). The file is keyed by what made the arrays: `params`, the versions of `packages`
    (the generators called) and GENERATOR_VERSION, so a changed parameter or an upgraded generator
    makes new arrays rather than reuse stale ones. Beside it, NAME-KEY.json holds that recipe and
    the arrays' fingerprint, computed once."""
    recipe = {"name": name, "params": params, "generator_version": GENERATOR_VERSION,
              "packages": {p: package_version(p) for p in packages}}
    key = hashlib.sha256(json.dumps(recipe, sort_keys=True, default=str).encode()).hexdigest()[:16]
    cached, about = cache_dir() / f"{name}-{key}.npz", cache_dir() / f"{name}-{key}.json"
    if cached.is_file():
        with np.load(cached) as arrays:
            x, y = arrays["x"], arrays["y"]
    else:
        x, y = make()
        atomic_write(cached, lambda tmp: write_npz(tmp, x=x, y=y))
    try:
        fingerprint = json.loads(about.read_text())["fingerprint"]
    except (OSError, ValueError, KeyError, TypeError):  # none yet (or unreadable): computed once, here
        fingerprint = array_fingerprint(x, y)
        atomic_write_json(about, {**recipe, "fingerprint": fingerprint})
    return x, y, fingerprint


def make_synthetic(seed: int, n_samples: int = 4000, n_features: int = 28, n_classes: int = 2,
                   label_skew: float = 0.0, name: str = "synthetic") -> Dataset:
    """Gaussian-cluster classification; `label_skew` in [0, 1) makes classes imbalanced
    (class c gets weight (1 - skew)^c), the stress case for data sharding."""
    if not 0.0 <= label_skew < 1.0:
        raise ConfigError(f"label_skew must be in [0, 1), got {label_skew}")
    def make() -> tuple[np.ndarray, np.ndarray]:
        from sklearn.datasets import make_classification

        weights = np.array([(1.0 - label_skew) ** c for c in range(n_classes)])
        weights = weights / weights.sum()
        x, y = make_classification(n_samples=n_samples, n_features=n_features,
                                   n_informative=max(2, n_features // 2), n_redundant=n_features // 4,
                                   n_classes=n_classes, n_clusters_per_class=2, weights=weights.tolist(),
                                   class_sep=1.0, random_state=seed)
        return x.astype(np.float32), y.astype(np.int64)

    params = {"n_samples": n_samples, "n_features": n_features, "n_classes": n_classes, "label_skew": label_skew,
              "seed": seed}
    x, y, fingerprint = cached_arrays("synthetic", params, ("scikit-learn", "numpy"), make)
    return _split(name, _standardise(x), y, n_classes, seed, fingerprint=fingerprint)


def load_higgs_synthetic(seed: int, data_dir: Path | None = None) -> Dataset:
    """HIGGS-shaped binary problem (28 features), the thesis' logistic-regression workload."""
    return make_synthetic(seed, n_samples=20000, n_features=28, n_classes=2, name="higgs-synthetic")


HIGGS_1M_ROWS = 1_000_000
HIGGS_10M_ROWS = 10_000_000
# Kassela et al. (2019) at its own data per core, on one worker (80 % of the rows train): HIGGS' 11 M
# rows over 141 VMs x 2 vCPU are ~39k rows a core, over its 5 nodes ~1.1 M rows a core
HIGGS_KASSELA_VMS_ROWS = 48_750
HIGGS_KASSELA_NODES_ROWS = 1_375_000


def higgs_shaped(rows: int) -> tuple[np.ndarray, np.ndarray, str]:
    """`rows` HIGGS-shaped rows (28 standardised features, 2 classes), generated once and cached,
    since every worker process loads them."""
    def make() -> tuple[np.ndarray, np.ndarray]:
        from sklearn.datasets import make_classification

        x, y = make_classification(n_samples=rows, n_features=28, n_informative=14, n_redundant=7,
                                   n_classes=2, n_clusters_per_class=2, class_sep=1.0, random_state=0)
        return _standardise(x.astype(np.float32)).astype(np.float32), y.astype(np.int64)

    name = f"higgs-{rows // 1_000_000}m" if rows % 1_000_000 == 0 else f"higgs-{rows}"
    return cached_arrays(name, {"rows": rows, "random_state": 0}, ("scikit-learn", "numpy"), make)


def load_higgs_1m(seed: int, data_dir: Path | None = None) -> Dataset:
    """HIGGS-shaped (28 features, 2 classes) at HIGGS' own order of size, 1 M rows (800k train):
    large enough that a mini-batch can range from 100 % of the data down to 0.01 % (80 examples),
    as Kassela et al. (2019) varied MLlib's miniBatchFraction (~10 s to generate)."""
    x, y, fingerprint = higgs_shaped(HIGGS_1M_ROWS)
    return _split("higgs-1m", x, y, 2, seed, fingerprint=fingerprint)


def load_higgs_10m(seed: int, data_dir: Path | None = None) -> Dataset:
    """10 M HIGGS-shaped rows (8 M train; HIGGS itself has 11 M): the Kassela cost model's second
    data size (bench/experiments/extra/kassela_10m.toml; ~2 min and 1.1 GB to generate)."""
    x, y, fingerprint = higgs_shaped(HIGGS_10M_ROWS)
    return _split("higgs-10m", x, y, 2, seed, fingerprint=fingerprint)


def load_higgs_shaped(seed: int, data_dir: Path | None = None, rows: int = HIGGS_1M_ROWS,
                      name: str = "higgs-1m") -> Dataset:
    """`rows` HIGGS-shaped rows generated as higgs-1m is (no download), split 80/20."""
    x, y, fingerprint = higgs_shaped(rows)
    return _split(name, x, y, 2, seed, fingerprint=fingerprint)


LONGTAIL_FINE, LONGTAIL_COARSE = 100, 20   # fine classes, grouped 5 to a coarse class (as CIFAR-100's)
LONGTAIL_ZIPF = 1.1                         # class c (from 0) has weight (c + 1)^-1.1: the head ~160x the tail
LONGTAIL_ROWS = 6000


def longtail_counts(rows: int = LONGTAIL_ROWS, fine: int = LONGTAIL_FINE, zipf: float = LONGTAIL_ZIPF) -> np.ndarray:
    """Examples per fine class: Zipf weights, at least 4 each (so a tail class still exists in a split)."""
    weights = (np.arange(1, fine + 1, dtype=np.float64)) ** -zipf
    counts = np.maximum(4, np.floor(rows * weights / weights.sum())).astype(np.int64)
    counts[0] += rows - counts.sum()  # the head absorbs the rounding
    return counts


LONGTAIL_SPARSE_BELOW = 24  # a class with fewer examples (2 x 12 workers) is placed apart: a sparse region


def load_longtail_synthetic(seed: int, data_dir: Path | None = None) -> Dataset:
    """A class-rich set with a long tail and sparse regions by design (the sharding issue): 100 fine
    classes in 20 coarse groups, Zipf(1.1) sizes (counts from ~1,100 down to 4), 32 features. Each
    coarse group has a centre; the 40 larger fine classes sit close around their group's centre
    (offset sd 0.15 a feature, clusters of sd up to 1.2: they overlap, so the task is not easy; an
    MLP reaches ~0.85), the 60 tail classes (under 24 examples) far from it (offset sd 1.5) in tight
    clusters (sd 0.4-0.5): small, isolated neighbourhoods. With 12 workers random shards leave 79 of
    the 100 classes absent from some shard, and distribution-aware:100 finds 17 sparse
    neighbourhoods (`psbench neighbourhoods longtail-synthetic`). 6,000 rows: 400 a worker at 12
    workers (train split)."""
    def make() -> tuple[np.ndarray, np.ndarray]:
        rng = np.random.default_rng(20250)
        n_features = 32
        counts = longtail_counts()
        coarse_centres = rng.normal(0.0, 4.0, size=(LONGTAIL_COARSE, n_features))
        order = rng.permutation(LONGTAIL_FINE)  # which coarse group a fine class belongs to: 5 each, mixed sizes
        xs, ys = [], []
        for fine, count in enumerate(counts):
            group = order[fine] % LONGTAIL_COARSE
            offset = 0.15 if count >= LONGTAIL_SPARSE_BELOW else 1.5
            centre = coarse_centres[group] + rng.normal(0.0, offset, size=n_features)
            spread = 0.4 + 0.8 * min(1.0, count / 200)  # the tail is tight
            xs.append(centre + rng.normal(0.0, spread, size=(count, n_features)))
            ys.append(np.full(count, fine))
        return _standardise(np.concatenate(xs)).astype(np.float32), np.concatenate(ys).astype(np.int64)

    x, y, fingerprint = cached_arrays("longtail", {"rows": LONGTAIL_ROWS, "fine": LONGTAIL_FINE,
                                                   "coarse": LONGTAIL_COARSE, "zipf": LONGTAIL_ZIPF, "seed": 20250,
                                                   "offsets": (0.15, 1.5), "sparse_below": LONGTAIL_SPARSE_BELOW},
                                      ("numpy",), make)
    return _split("longtail-synthetic", x, y, LONGTAIL_FINE, seed, fingerprint=fingerprint)


def load_skewed_synthetic(seed: int, data_dir: Path | None = None) -> Dataset:
    return make_synthetic(seed, n_samples=4000, n_features=32, n_classes=10, label_skew=0.3,
                          name="skewed-synthetic")


def load_cifar_synthetic(seed: int, data_dir: Path | None = None, n_samples: int = 2048) -> Dataset:
    """CIFAR-shaped (3x32x32, 10 classes) images for throughput: class-dependent mean patterns
    plus noise, so the models can still learn something."""
    rng = np.random.default_rng(seed)
    patterns = rng.normal(0.0, 1.0, size=(10, 3, 32, 32)).astype(np.float32)
    y = rng.integers(0, 10, size=n_samples)
    x = patterns[y] * 0.5 + rng.normal(0.0, 1.0, size=(n_samples, 3, 32, 32)).astype(np.float32)
    return _split("cifar-synthetic", x, y, 10, seed)


IMAGENET_SHAPE = (3, 224, 224)  # the shape pytorch_synthetic_benchmark.py draws its batch in
IMAGENET_CLASSES = 1000
IMAGENET_SYNTHETIC_TRAIN = 64  # one batch of Horovod's 32 for each of 2 workers
IMAGENET_SYNTHETIC_VAL = 8  # evaluated at a run's start and end: few, a forward at 224 costs


def load_imagenet_synthetic(seed: int, data_dir: Path | None = None) -> Dataset:
    """ImageNet-shaped random images as Horovod's synthetic benchmark draws them: pixels N(0, 1),
    labels uniform over 1000 classes, nothing to learn. Its 128 training images are one batch of 32
    for each of up to 4 workers; generated in ~0.2 s, so not cached (77 MB)."""
    rng = np.random.default_rng(seed)
    n = IMAGENET_SYNTHETIC_TRAIN + IMAGENET_SYNTHETIC_VAL
    x = rng.standard_normal((n, *IMAGENET_SHAPE), dtype=np.float32)
    y = rng.integers(0, IMAGENET_CLASSES, size=n)
    train, val = slice(0, IMAGENET_SYNTHETIC_TRAIN), slice(IMAGENET_SYNTHETIC_TRAIN, n)
    return Dataset("imagenet-synthetic", x[train], y[train].astype(np.int64), x[val], y[val].astype(np.int64),
                   IMAGENET_CLASSES)


# ---- loaders for files a user already has -------------------------------------------------

_MNIST_FILES = {
    "train_images": ("train-images-idx3-ubyte", "train-images.idx3-ubyte"),
    "train_labels": ("train-labels-idx1-ubyte", "train-labels.idx1-ubyte"),
    "test_images": ("t10k-images-idx3-ubyte", "t10k-images.idx3-ubyte"),
    "test_labels": ("t10k-labels-idx1-ubyte", "t10k-labels.idx1-ubyte"),
}


def _find(data_dir: Path, names: tuple[str, ...], what: str) -> Path:
    for name in names:
        for candidate in (data_dir / name, data_dir / f"{name}.gz"):
            if candidate.is_file():
                return candidate
    raise ConfigError(f"missing data file for {what}: none of {', '.join(names)} (or .gz) in {data_dir}")


def read_idx(path: Path) -> np.ndarray:
    """Parse an IDX file (MNIST's format): magic 0x0000 | dtype | ndim, big-endian dims, data."""
    opener: Callable = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        raw = f.read()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0:
        raise ConfigError(f"{path} is not an IDX file (bad magic number)")
    dtype_code, ndim = raw[2], raw[3]
    dtypes = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
    if dtype_code not in dtypes:
        raise ConfigError(f"{path}: unknown IDX data type 0x{dtype_code:02x}")
    header_len = 4 + 4 * ndim
    if len(raw) < header_len:
        raise ConfigError(f"{path}: truncated IDX header")
    dims = struct.unpack(f">{ndim}I", raw[4:header_len])
    dtype = np.dtype(dtypes[dtype_code])
    expected = int(np.prod(dims)) * dtype.itemsize
    if len(raw) - header_len != expected:
        raise ConfigError(f"{path}: IDX body has {len(raw) - header_len} bytes, header says {expected}")
    return np.frombuffer(raw, dtype=dtype, offset=header_len).reshape(dims)


def load_mnist_idx(seed: int, data_dir: Path | None = None) -> Dataset:
    if data_dir is None:
        raise ConfigError("workload needs --data-dir pointing at MNIST IDX files (train-images-idx3-ubyte, ...)")
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise ConfigError(f"data dir {data_dir} does not exist")
    arrays = {key: read_idx(_find(data_dir, names, key)) for key, names in _MNIST_FILES.items()}
    x_train = (arrays["train_images"].astype(np.float32) / 255.0)[:, None, :, :]
    x_val = (arrays["test_images"].astype(np.float32) / 255.0)[:, None, :, :]
    return Dataset("mnist", x_train, arrays["train_labels"].astype(np.int64), x_val,
                   arrays["test_labels"].astype(np.int64), 10)


_CIFAR_RECORD = 1 + 3 * 32 * 32


def read_cifar_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """Parse a CIFAR-10 binary batch: records of 1 label byte + 3072 pixel bytes (CHW)."""
    raw = path.read_bytes()
    if len(raw) == 0 or len(raw) % _CIFAR_RECORD:
        raise ConfigError(f"{path}: size {len(raw)} is not a multiple of the CIFAR-10 record size {_CIFAR_RECORD}")
    records = np.frombuffer(raw, dtype=np.uint8).reshape(-1, _CIFAR_RECORD)
    labels = records[:, 0].astype(np.int64)
    if labels.max() > 9:
        raise ConfigError(f"{path}: label {labels.max()} out of range 0..9")
    images = records[:, 1:].reshape(-1, 3, 32, 32).astype(np.float32) / 255.0
    return images, labels


def load_cifar10_bin(seed: int, data_dir: Path | None = None) -> Dataset:
    if data_dir is None:
        raise ConfigError("workload needs --data-dir pointing at CIFAR-10 binary files (data_batch_1.bin, ...)")
    data_dir = Path(data_dir)
    base = data_dir / "cifar-10-batches-bin" if (data_dir / "cifar-10-batches-bin").is_dir() else data_dir
    train_files = sorted(base.glob("data_batch_*.bin"))
    test_file = base / "test_batch.bin"
    if not train_files or not test_file.is_file():
        raise ConfigError(f"missing data file: need data_batch_*.bin and test_batch.bin in {base}")
    parts = [read_cifar_batch(p) for p in train_files]
    x_val, y_val = read_cifar_batch(test_file)
    mean = np.array([0.4914, 0.4822, 0.4465], dtype=np.float32)[None, :, None, None]
    std = np.array([0.2470, 0.2435, 0.2616], dtype=np.float32)[None, :, None, None]
    x_train = (np.concatenate([p[0] for p in parts]) - mean) / std
    return Dataset("cifar10", x_train.astype(np.float32), np.concatenate([p[1] for p in parts]),
                   ((x_val - mean) / std).astype(np.float32), y_val, 10)


DATASETS: dict[str, Callable[..., Dataset]] = {
    "digits": load_digits,
    "mnist1d": load_mnist1d,
    # larger MNIST-1D for sharding: 12 workers each get enough examples that shard balance matters
    "mnist1d-20k": functools.partial(load_mnist1d, n_samples=20000),
    "higgs-synthetic": load_higgs_synthetic,
    "higgs-1m": load_higgs_1m,
    "higgs-10m": load_higgs_10m,
    "higgs-49k": functools.partial(load_higgs_shaped, rows=HIGGS_KASSELA_VMS_ROWS, name="higgs-49k"),
    "higgs-1375k": functools.partial(load_higgs_shaped, rows=HIGGS_KASSELA_NODES_ROWS, name="higgs-1375k"),
    "skewed-synthetic": load_skewed_synthetic,
    "longtail-synthetic": load_longtail_synthetic,
    "cifar-synthetic": load_cifar_synthetic,
    "imagenet-synthetic": load_imagenet_synthetic,
    "mnist": load_mnist_idx,
    "cifar10": load_cifar10_bin,
}


def load_dataset(name: str, seed: int, data_dir: Path | None = None) -> Dataset:
    if name not in DATASETS:
        raise ConfigError(f"unknown dataset '{name}'; choose from: {', '.join(DATASETS)}")
    return DATASETS[name](seed, data_dir)
