"""Offline sharding strategies: exact assignment properties, determinism, clear errors."""
from __future__ import annotations

import numpy as np
import pytest

from psbench.core.errors import ConfigError
from psbench.workloads import load_dataset
from psbench.workloads.sharding import make_shards, make_shards_cached


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits", seed=0)


@pytest.mark.parametrize("strategy", ["random", "stratified"])
@pytest.mark.parametrize("n_workers", [1, 3, 8])
def test_every_example_is_assigned_exactly_once(digits, strategy: str, n_workers: int) -> None:
    plan = make_shards(digits.y_train, digits.x_train, n_workers, strategy, seed=1)
    everything = np.concatenate(plan.shards)
    assert len(everything) == len(digits.y_train)
    assert np.array_equal(np.sort(everything), np.arange(len(digits.y_train)))
    sizes = [len(s) for s in plan.shards]
    assert max(sizes) - min(sizes) <= 1


def test_stratified_keeps_global_class_proportions_within_one_example(digits) -> None:
    n = 6
    plan = make_shards(digits.y_train, digits.x_train, n, "stratified", seed=0)
    global_counts = np.bincount(digits.y_train, minlength=10)
    for shard in plan.shards:
        counts = np.bincount(digits.y_train[shard], minlength=10)
        assert np.all(np.abs(counts - global_counts / n) <= 1.0)


def test_stratified_balances_classes_better_than_random_on_skewed_data() -> None:
    skewed = load_dataset("skewed-synthetic", seed=0)
    labels, n = skewed.y_train, 12
    strat = make_shards(labels, None, n, "stratified", seed=0).report(labels, 10)
    rand = make_shards(labels, None, n, "random", seed=0).report(labels, 10)
    assert strat["max_class_proportion_deviation"] < rand["max_class_proportion_deviation"]
    assert strat["mean_kl_to_global"] < rand["mean_kl_to_global"]


def test_distribution_aware_copies_exactly_the_sparse_neighbourhoods(digits) -> None:
    n, k = 8, 120  # many clusters over ~1400 points: some have fewer than 8 members
    plan = make_shards(digits.y_train, digits.x_train, n, f"distribution-aware:{k}", seed=0)
    counts = np.bincount(np.concatenate(plan.shards), minlength=len(digits.y_train))
    copied = np.flatnonzero(counts == n)
    assert set(np.unique(counts)) <= {1, n}  # dealt once, or copied to every worker
    assert len(plan.sparse_neighbourhoods) > 0
    assert sum(plan.sparse_neighbourhoods) == len(copied)
    assert all(0 < size < n for size in plan.sparse_neighbourhoods)
    for shard in plan.shards:
        assert set(copied) <= set(shard.tolist())
    report = plan.report(digits.y_train, 10)
    assert report["n_sparse_neighbourhoods"] == len(plan.sparse_neighbourhoods)


@pytest.mark.parametrize("strategy", ["random", "stratified", "distribution-aware:10"])
def test_strategies_are_deterministic_for_a_seed(digits, strategy: str) -> None:
    a = make_shards(digits.y_train, digits.x_train, 4, strategy, seed=5)
    b = make_shards(digits.y_train, digits.x_train, 4, strategy, seed=5)
    c = make_shards(digits.y_train, digits.x_train, 4, strategy, seed=6)
    assert all(np.array_equal(x, y) for x, y in zip(a.shards, b.shards))
    assert not all(np.array_equal(x, y) for x, y in zip(a.shards, c.shards))


@pytest.mark.parametrize("strategy, message", [
    ("distribution-aware:0", "k must be > 0"),
    ("distribution-aware:abc", "k must be an integer"),
    ("round-robin", "unknown sharding 'round-robin'; choose from: random, stratified"),
])
def test_bad_strategies_are_clear_errors(digits, strategy: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        make_shards(digits.y_train, digits.x_train, 2, strategy, seed=0)


def test_more_workers_than_examples_is_a_clear_error() -> None:
    labels = np.array([0, 1, 0])
    with pytest.raises(ConfigError, match="more workers than examples"):
        make_shards(labels, None, 4, "random", seed=0)


def test_distribution_aware_plans_are_cached_per_data_workers_and_seed(digits, tmp_path) -> None:
    """Every worker process of a run needs the plan; k-means runs once, the rest load it."""
    x, y = digits.x_train, digits.y_train
    first = make_shards_cached(y, x, 4, "distribution-aware:60", 0, tmp_path)
    assert len(list(tmp_path.glob("shards-*.npz"))) == 1
    again = make_shards_cached(y, x, 4, "distribution-aware:60", 0, tmp_path)
    fresh = make_shards(y, x, 4, "distribution-aware:60", 0)
    for plan in (first, again):
        assert all(np.array_equal(a, b) for a, b in zip(plan.shards, fresh.shards))
        assert plan.sparse_neighbourhoods == fresh.sparse_neighbourhoods
    make_shards_cached(y, x, 4, "distribution-aware:60", 1, tmp_path)  # another seed: another plan
    make_shards_cached(y[:-1], x[:-1], 4, "distribution-aware:60", 0, tmp_path)  # other data: another plan
    make_shards_cached(y, x, 4, "random", 0, tmp_path)  # a permutation: never cached
    assert len(list(tmp_path.glob("shards-*.npz"))) == 3


def test_a_cached_plan_is_keyed_by_the_k_means_version_and_fingerprinted(digits, tmp_path, monkeypatch) -> None:
    """Another scikit-learn (its PCA and k-means make the plan) is a cache miss; a plan's report
    carries the fingerprint of its indices, which differs between plans."""
    from psbench.workloads import sharding

    x, y = digits.x_train, digits.y_train
    plan = make_shards_cached(y, x, 4, "distribution-aware:60", 0, tmp_path)
    monkeypatch.setattr(sharding, "package_version", lambda name: "0.0-other")
    make_shards_cached(y, x, 4, "distribution-aware:60", 0, tmp_path)
    assert len(list(tmp_path.glob("shards-*.npz"))) == 2
    report = plan.report(y, 10)
    assert report["fingerprint"] == plan.fingerprint() == make_shards(y, x, 4, "distribution-aware:60", 0).fingerprint()
    assert report["fingerprint"] != make_shards(y, x, 4, "random", 0).fingerprint()
