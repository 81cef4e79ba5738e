"""The long-tailed data set has what the sharding study needs (sparse neighbourhoods, random shards
that lose tail classes) where digits has little, and `psbench neighbourhoods` reports it."""
from __future__ import annotations

import numpy as np

from psbench.bench.cli import main
from psbench.workloads.datasets import load_dataset, longtail_counts
from psbench.workloads.neighbourhoods import random_shards, sweep
from psbench.workloads.registry import DATA_SEED


def test_longtail_counts_follow_the_stated_zipf_tail():
    counts = longtail_counts()
    assert counts.sum() == 6000 and len(counts) == 100 and counts.min() >= 4
    assert counts[0] / counts[-1] > 100 and all(np.diff(counts[1:]) <= 0)


def test_longtail_has_sparse_neighbourhoods_and_random_shards_lose_classes_where_digits_does_not():
    tail = load_dataset("longtail-synthetic", DATA_SEED)
    digits = load_dataset("digits", DATA_SEED)
    assert tail.n_classes == 100 and len(np.unique(tail.y_train)) == 100
    (tail_k,) = sweep(tail.y_train, tail.x_train, 12, [100])
    (digits_k,) = sweep(digits.y_train, digits.x_train, 12, [40])
    assert tail_k.sparse >= 10 and tail_k.sparse_examples >= 100 and digits_k.sparse == 0
    # random shards lose tail classes: measured 79 of 100 classes absent from some shard; digits none
    tail_random, digits_random = random_shards(tail.y_train, 12), random_shards(digits.y_train, 12)
    assert tail_random.classes_missing_somewhere >= 50 and digits_random.classes_missing_somewhere == 0


def test_the_command_prints_the_sweep_and_refuses_a_bad_k(capsys):
    assert main(["neighbourhoods", "longtail-synthetic", "--k", "40,60"]) == 0
    out = capsys.readouterr().out
    assert "sparse neighbourhoods" in out and "classes missing from some shard" in out
    assert main(["neighbourhoods", "digits", "--k", "a,b"]) == 2
    assert "--k" in capsys.readouterr().err
