"""A PS round trip timed alone: push + pull of given tensors against one fresh shard, with no
compute around it (the PS's counterpart of allreduce_common.time_allreduce_alone)."""
from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Iterator, Sequence

import numpy as np

from psbench.systems.ps.launch import Cluster
from psbench.systems.ps.protocol import DEFAULT_MAX_BYTES
from psbench.systems.ps.worker import ADMIN, KVWorker

ALONE_REPEATS = 30  # round trips timed after one warm-up (their median)


@contextmanager
def one_shard(shapes: Sequence[Sequence[int]], token: str, max_bytes: int = DEFAULT_MAX_BYTES) -> Iterator[KVWorker]:
    """One shard in its own process holding zeros of `shapes` (lr 0, momentum 0: a push changes
    nothing) and a worker connected to it."""
    shapes = [tuple(s) for s in shapes]
    with Cluster(1, 1, token) as cluster:
        [address] = cluster.start_servers(["--lr", "0.0", "--momentum", "0",
                                           "--max-message-mb", repr(max_bytes / 2**20)])
        with KVWorker([address], ADMIN, shapes, token, max_bytes=max_bytes) as admin, \
                KVWorker([address], 0, shapes, token, max_bytes=max_bytes) as kv:
            admin.init([np.zeros(s, np.float32) for s in shapes])
            yield kv
            admin.shutdown()
        cluster.wait_servers()


def time_push_pull_alone(shapes: Sequence[Sequence[int]], token: str, repeats: int = ALONE_REPEATS) -> float:
    """Median seconds of one push + pull of float32 tensors of `shapes` (a model's gradients)."""
    grads = [np.zeros(tuple(s), np.float32) for s in shapes]
    times = []
    with one_shard(shapes, token) as kv:
        kv.push_pull(grads, 0)  # warm-up: the first message pays the connection's set-up
        for step in range(1, repeats + 1):
            began = time.perf_counter()
            kv.push_pull(grads, step)
            times.append(time.perf_counter() - began)
    return float(np.median(times))
