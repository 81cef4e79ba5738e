"""Offline data sharding (Provatas et al., IEEE BigData 2021): which examples each worker trains on.

Strategies, named by one string (`--sharding`):
  random                 shuffle with the seed, deal round-robin (the baseline)
  stratified             per class, deal its examples round-robin: every shard keeps the class mix
  distribution-aware:k   PCA + k-means into k neighbourhoods; deal each dense one round-robin,
                         copy each sparse one (fewer points than workers) to every worker
Pure and deterministic for (labels, features, n_workers, strategy, seed).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from psbench.core.atomic import atomic_write
from psbench.core.errors import ConfigError
from psbench.workloads.datasets import array_fingerprint, package_version, write_npz

STRATEGIES = ("random", "stratified", "distribution-aware:k")
SHARDING_VERSION = 1  # bump when the code below deals examples differently (cached plans then miss)
KMEANS_MAX_ITER = 150  # as in the paper
PCA_COMPONENTS = 16


@dataclass
class ShardPlan:
    strategy: str
    n_workers: int
    shards: list[np.ndarray]  # example indices per worker, int64
    sparse_neighbourhoods: list[int] = field(default_factory=list)  # their sizes (distribution-aware)

    def fingerprint(self) -> str:
        """sha256 of every worker's example indices, in order (what a run's manifest records)."""
        return array_fingerprint(*self.shards, np.asarray(self.sparse_neighbourhoods, dtype=np.int64))

    def report(self, labels: np.ndarray, n_classes: int) -> dict:
        """Per-worker size and class counts, and how far each shard's class mix is from the global one."""
        global_p = np.bincount(labels, minlength=n_classes) / len(labels)
        counts = [np.bincount(labels[s], minlength=n_classes) for s in self.shards]
        props = [c / max(1, c.sum()) for c in counts]
        eps = 1e-12
        kl = [float(np.sum(np.where(p > 0, p * np.log((p + eps) / (global_p + eps)), 0.0))) for p in props]
        return {
            "strategy": self.strategy,
            "n_workers": self.n_workers,
            "shard_sizes": [int(len(s)) for s in self.shards],
            "class_counts": [c.astype(int).tolist() for c in counts],
            "max_class_proportion_deviation": float(max(np.abs(p - global_p).max() for p in props)),
            "mean_kl_to_global": float(np.mean(kl)),
            "n_sparse_neighbourhoods": len(self.sparse_neighbourhoods),
            "sparse_neighbourhood_sizes": self.sparse_neighbourhoods,
            "fingerprint": self.fingerprint(),
        }


def parse_strategy(strategy: str) -> tuple[str, int | None]:
    if strategy in ("random", "stratified"):
        return strategy, None
    if strategy.startswith("distribution-aware:"):
        raw_k = strategy.split(":", 1)[1]
        try:
            k = int(raw_k)
        except ValueError:
            raise ConfigError(f"sharding '{strategy}': k must be an integer, got '{raw_k}'") from None
        if k <= 0:
            raise ConfigError(f"sharding '{strategy}': k must be > 0")
        return "distribution-aware", k
    raise ConfigError(f"unknown sharding '{strategy}'; choose from: {', '.join(STRATEGIES)}")


def _deal(indices: np.ndarray, n_workers: int, start: int = 0) -> list[list[int]]:
    """Round-robin: the i-th index goes to worker (start + i) mod n."""
    dealt: list[list[int]] = [[] for _ in range(n_workers)]
    for i, idx in enumerate(indices):
        dealt[(start + i) % n_workers].append(int(idx))
    return dealt


def make_shards(labels: np.ndarray, features: np.ndarray | None, n_workers: int, strategy: str,
                seed: int) -> ShardPlan:
    kind, k = parse_strategy(strategy)
    n = len(labels)
    if n_workers <= 0:
        raise ConfigError(f"workers must be >= 1, got {n_workers}")
    if n_workers > n:
        raise ConfigError(f"cannot shard {n} examples over {n_workers} workers: more workers than examples")
    rng = np.random.default_rng(seed)
    sparse_sizes: list[int] = []
    groups: list[np.ndarray]
    if kind == "random":
        groups = [rng.permutation(n)]
    elif kind == "stratified":
        groups = [rng.permutation(np.flatnonzero(labels == c)) for c in np.unique(labels)]
    else:
        if features is None:
            raise ConfigError("distribution-aware sharding needs the features")
        groups, sparse = _neighbourhoods(features, k, n_workers, seed, rng)
        sparse_sizes = [len(g) for g in sparse]
    shards: list[list[int]] = [[] for _ in range(n_workers)]
    cursor = 0  # carry the round-robin position across groups so shard sizes stay within one
    for group in groups:
        for w, part in enumerate(_deal(group, n_workers, cursor)):
            shards[w].extend(part)
        cursor = (cursor + len(group)) % n_workers
    if kind == "distribution-aware":
        for group in sparse:
            for w in range(n_workers):
                shards[w].extend(int(i) for i in group)
    return ShardPlan(strategy, n_workers, [np.asarray(s, dtype=np.int64) for s in shards], sparse_sizes)


def make_shards_cached(labels: np.ndarray, features: np.ndarray, n_workers: int, strategy: str, seed: int,
                       cache: Path) -> ShardPlan:
    """make_shards, with distribution-aware plans kept in `cache` (one file per data, workers,
    strategy, seed, SHARDING_VERSION and scikit-learn's version, whose PCA and k-means make the
    plan): they cost seconds and every worker process of a run would otherwise repeat them.
    Random and stratified are a permutation: always computed."""
    if parse_strategy(strategy)[0] != "distribution-aware":
        return make_shards(labels, features, n_workers, strategy, seed)
    made_by = f"v{SHARDING_VERSION}|scikit-learn {package_version('scikit-learn')}"
    digest = hashlib.blake2b(f"{n_workers}|{strategy}|{seed}|{features.shape}|{features.dtype}|{made_by}".encode(),
                             digest_size=16)
    digest.update(np.ascontiguousarray(labels).tobytes())
    digest.update(np.ascontiguousarray(features).tobytes())
    file = cache / f"shards-{digest.hexdigest()}.npz"
    if file.is_file():
        with np.load(file) as saved:
            bounds = np.cumsum(saved["sizes"])[:-1]
            return ShardPlan(strategy, n_workers, np.split(saved["indices"], bounds), saved["sparse"].tolist())
    plan = make_shards(labels, features, n_workers, strategy, seed)
    atomic_write(file, lambda tmp: write_npz(tmp, indices=np.concatenate(plan.shards),
                                             sizes=np.array([len(s) for s in plan.shards]),
                                             sparse=np.array(plan.sparse_neighbourhoods, dtype=np.int64)))
    return plan


def _neighbourhoods(features: np.ndarray, k: int, n_workers: int, seed: int,
                    rng: np.random.Generator) -> tuple[list[np.ndarray], list[np.ndarray]]:
    from sklearn.cluster import KMeans
    from sklearn.decomposition import PCA

    flat = features.reshape(len(features), -1).astype(np.float64)
    if k > len(flat):
        raise ConfigError(f"distribution-aware:{k}: k must be <= the number of examples ({len(flat)})")
    n_components = min(PCA_COMPONENTS, flat.shape[1], len(flat))
    reduced = PCA(n_components=n_components, random_state=seed).fit_transform(flat)
    assignment = KMeans(n_clusters=k, max_iter=KMEANS_MAX_ITER, n_init=1, random_state=seed).fit_predict(reduced)
    dense, sparse = [], []
    for c in range(k):
        members = rng.permutation(np.flatnonzero(assignment == c))
        if len(members) == 0:
            continue
        (sparse if len(members) < n_workers else dense).append(members)
    return dense, sparse
