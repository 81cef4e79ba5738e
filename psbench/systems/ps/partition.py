"""Which server shard owns which key: contiguous key ranges balanced by total size (as ps-lite).

Keys are the model's parameter tensor indices 0..K-1. Every role (launcher, server, worker)
calls this one function, so they agree on the layout without exchanging it.
"""
from __future__ import annotations

from typing import Sequence

from psbench.core.errors import ConfigError


def partition_keys(sizes: Sequence[int], n_shards: int) -> list[list[int]]:
    """Split keys 0..len(sizes)-1 into n_shards contiguous, non-empty ranges whose total sizes are
    as even as a greedy cut allows: shard j ends at the first key where the running total reaches
    (j+1)/n_shards of the whole, but always leaves at least one key for each later shard."""
    n_keys = len(sizes)
    if n_shards < 1:
        raise ConfigError(f"servers must be >= 1, got {n_shards}")
    if n_shards > n_keys:
        raise ConfigError(f"servers ({n_shards}) exceeds the model's {n_keys} parameter tensors; "
                          f"use at most {n_keys} server shards")
    total = sum(int(s) for s in sizes)
    shards: list[list[int]] = []
    start, running = 0, 0
    for j in range(n_shards):
        remaining_shards = n_shards - j - 1
        if remaining_shards == 0:
            shards.append(list(range(start, n_keys)))
            break
        target = total * (j + 1) / n_shards
        end = start + 1  # at least one key
        running += int(sizes[start])
        # extend while below target, leaving one key for each later shard; take the next key too
        # if that brings the running total closer to the target than stopping here
        while end < n_keys - remaining_shards:
            nxt = running + int(sizes[end])
            if abs(nxt - target) < abs(running - target):
                running, end = nxt, end + 1
            else:
                break
        shards.append(list(range(start, end)))
        start = end
    return shards


def shard_of(shards: list[list[int]]) -> dict[int, int]:
    """key -> shard index."""
    return {k: j for j, keys in enumerate(shards) for k in keys}
