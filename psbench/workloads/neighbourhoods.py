"""`psbench neighbourhoods DATASET`: where data sharding has something to balance, per data set.

For each k: distribution-aware sharding's neighbourhoods (PCA + k-means, workloads/sharding.py),
how many are sparse (fewer points than workers: copied to every worker), the examples they hold
and their share of the training set; and, for the data set as a whole, how far random shards stray
from the global class mix (the largest total-variation distance of a shard's class mix from the
training set's) and how many classes some random shard lacks. A data set with no sparse
neighbourhood and random shards within a few percent of the class mix gives the sharding study
little to measure (digits: none up to k = 40; MNIST-1D at 20k: none up to k = 200).
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass

import numpy as np

from psbench.workloads.datasets import load_dataset
from psbench.workloads.registry import DATA_SEED
from psbench.workloads.sharding import make_shards


@dataclass(frozen=True)
class Neighbourhoods:
    k: int
    sparse: int
    sparse_examples: int
    copied_share: float  # of the training set, copied to every worker


@dataclass(frozen=True)
class RandomShards:
    largest_class_mix_distance: float  # total variation, largest over shards
    classes_missing_somewhere: int     # classes that some random shard lacks
    classes: int


def sweep(labels: np.ndarray, features: np.ndarray, workers: int, ks: list[int], seed: int = 0) -> list[Neighbourhoods]:
    out = []
    for k in ks:
        plan = make_shards(labels, features, workers, f"distribution-aware:{k}", seed)
        sizes = plan.sparse_neighbourhoods
        out.append(Neighbourhoods(k, len(sizes), int(sum(sizes)), float(sum(sizes)) / len(labels)))
    return out


def random_shards(labels: np.ndarray, workers: int, seed: int = 0) -> RandomShards:
    classes = np.unique(labels)
    overall = np.array([(labels == c).mean() for c in classes])
    plan = make_shards(labels, None, workers, "random", seed)
    distances, missing = [], set()
    for shard in plan.shards:
        mix = np.array([(labels[shard] == c).mean() for c in classes])
        distances.append(0.5 * float(np.abs(mix - overall).sum()))
        missing |= {int(c) for c, share in zip(classes, mix) if share == 0}
    return RandomShards(max(distances), len(missing), len(classes))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("dataset", help="a data set name (see `psbench list`), e.g. digits, longtail-synthetic")
    p.add_argument("--workers", type=int, default=12, help="workers the training set is sharded over (default 12)")
    p.add_argument("--k", default="20,40,60,100", help="comma-separated k values (default 20,40,60,100)")
    p.add_argument("--seed", type=int, default=0, help="the sharding seed (default 0)")


def main(args: argparse.Namespace) -> int:
    from psbench.core.errors import ConfigError

    try:
        ks = [int(k) for k in args.k.split(",")]
    except ValueError:
        raise ConfigError(f"--k: '{args.k}' is not a comma-separated list of integers, e.g. 20,40,60") from None
    data = load_dataset(args.dataset, DATA_SEED)
    labels, features = data.y_train, data.x_train
    found = random_shards(labels, args.workers, args.seed)
    print(f"{args.dataset}: {len(labels)} training examples, {found.classes} classes, {args.workers} workers")
    print(f"random shards: class mix at most {found.largest_class_mix_distance:.1%} (total variation) from the "
          f"training set's; {found.classes_missing_somewhere} of {found.classes} classes missing from some shard")
    print("k    sparse neighbourhoods  examples in them  share copied to every worker")
    for row in sweep(labels, features, args.workers, ks, args.seed):
        print(f"{row.k:<4} {row.sparse:>21}  {row.sparse_examples:>16}  {row.copied_share:>10.1%}")
    return 0
