"""One rpc-ps process: `python -m psbench.systems.rpc_ps.process --job DIR --rank R --servers S --world W --port P`.
Ranks 0..S-1 are server shards (RPC names ps0, ps1, ...), the others trainers (trainer0, ...).

As in PyTorch's parameter-server tutorials: each server process holds its shard in a global that
module-level functions act on when called by RPC (`rpc_async("ps0", _push, args=...)`); a push
under bsp is an `@rpc.functions.async_execution` function whose future completes once every live
trainer's gradient for the round is in (the batch-updating parameter server of the RPC tutorial).
Tensors travel by TensorPipe (torch's RPC pickler, tensors as separate buffers), on 127.0.0.1.

Files written into the job directory (read by systems/rpc_ps/adapter.py; no pickle):
  trainer{i}.json / trainer{i}.snapshots.npy / trainer{i}.buffers.npy   rows, clock, worker 0's snapshots
  shard{j}.npy / shard{j}.json                                          final flat parameters, counters
  rank{r}.error.json                                                    on an exception (allreduce_common)
"""
from __future__ import annotations

import argparse
import json
import threading
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.rpc as rpc

from psbench.core.atomic import atomic_write, atomic_write_json
from psbench.core.spec import RunSpec
from psbench.core.supervisor import watch_launcher
from psbench.systems.allreduce_common import exit_now, write_error
from psbench.systems.common import prepare
from psbench.systems.peer_common import PeerOptions, PeerWorker, ShardCore, ShardPlan, shard_plans

SHARD: "RpcShard | None" = None  # the shard a server process holds; the RPC functions below act on it


class RpcShard:
    """A server shard behind RPC: many RPC threads call it, so one lock orders its updates. It
    remembers the version each trainer was last sent (staleness = version at apply minus that)."""

    def __init__(self, plan: ShardPlan, n_workers: int, consistency: str):
        self.core = ShardCore(plan)
        self.lock = threading.Lock()
        self.bsp = consistency == "bsp"
        self.live = set(range(n_workers))
        self.sent: dict[int, int] = {}
        self.round: dict[int, tuple[list[torch.Tensor], torch.futures.Future]] = {}
        self.staleness: Counter = Counter()

    def _weights(self) -> list[torch.Tensor]:
        # SGD updates in place: the reply gets a copy, which later updates cannot touch while it is sent
        return [t.clone() for t in self.core.weights()]

    def pull(self, worker: int) -> list[torch.Tensor]:
        with self.lock:
            self.sent[worker] = self.core.version
            return self._weights()

    def push(self, worker: int, grads: list[torch.Tensor]) -> torch.futures.Future:
        future: torch.futures.Future = torch.futures.Future()
        with self.lock:
            self.round[worker] = (grads, future)
            answers = self._apply_if_complete()
        _answer(answers)
        return future

    def bye(self, worker: int) -> None:
        with self.lock:
            self.live.discard(worker)
            answers = self._apply_if_complete()
        _answer(answers)

    def _apply_if_complete(self) -> list[tuple[torch.futures.Future, Any]]:
        """asp: apply the one gradient in; bsp: once every live trainer pushed, their average."""
        if not self.round or (self.bsp and not self.live <= set(self.round)):
            return []
        tau = self.core.version - min(self.sent.get(w, 0) for w in self.round)
        self.core.apply([grads for grads, _ in self.round.values()])
        self.staleness[tau] += 1
        weights = self._weights()
        answers = []
        for w, (_, future) in self.round.items():
            self.sent[w] = self.core.version
            answers.append((future, (tau, weights)))
        self.round = {}
        return answers


def _answer(answers: list[tuple[torch.futures.Future, Any]]) -> None:
    for future, value in answers:  # outside the lock: completing a future sends the reply
        future.set_result(value)


def _pull(worker: int) -> list[torch.Tensor]:
    return SHARD.pull(worker)


@rpc.functions.async_execution
def _push(worker: int, grads: list[torch.Tensor]) -> torch.futures.Future:
    return SHARD.push(worker, grads)


def _bye(worker: int) -> None:
    SHARD.bye(worker)


def _save_npy(path: Path, array: np.ndarray) -> None:
    def write(tmp: Path) -> None:
        with open(tmp, "wb") as fh:
            np.save(fh, np.asarray(array, np.float32), allow_pickle=False)

    atomic_write(path, write)


def _init_rpc(name: str, rank: int, world: int, port: int, listen_fd: int | None, timeout_s: float) -> None:
    """Rendezvous through a TCPStore that rank 0 serves on the socket its launcher bound to
    127.0.0.1 (torch's own tcp:// store would listen on every interface); TensorPipe's own
    listeners follow TP_SOCKET_IFNAME=lo, set by the launcher."""
    def handler(url: str, **kwargs: Any):
        yield dist.TCPStore("127.0.0.1", port, world, is_master=listen_fd is not None,
                            timeout=timedelta(seconds=timeout_s), master_listen_fd=listen_fd), rank, world

    dist.register_rendezvous_handler("psbench-fd", handler)
    options = rpc.TensorPipeRpcBackendOptions(init_method="psbench-fd://", rpc_timeout=timeout_s)
    rpc.init_rpc(name, rank=rank, world_size=world, rpc_backend_options=options)


def serve(job: Path, j: int, spec: RunSpec, options: PeerOptions, args: argparse.Namespace) -> None:
    global SHARD
    SHARD = RpcShard(shard_plans(prepare(spec), options)[j], spec.workers, options.consistency)
    _init_rpc(f"ps{j}", args.rank, args.world, args.port, args.listen_fd, options.timeout_s)
    rpc.shutdown()  # graceful: returns once every trainer is done and has shut down too
    _save_npy(job / f"shard{j}.npy", np.concatenate([t.numpy().reshape(-1) for t in SHARD.core.weights()]))
    atomic_write_json(job / f"shard{j}.json", {"version": SHARD.core.version,
                                               "staleness": {str(k): v for k, v in sorted(SHARD.staleness.items())}})


def train(job: Path, i: int, spec: RunSpec, options: PeerOptions, args: argparse.Namespace) -> None:
    import time

    worker = PeerWorker(spec, i, options.servers)
    shards = [f"ps{j}" for j in range(options.servers)]
    _init_rpc(f"trainer{i}", args.rank, args.world, args.port, args.listen_fd, options.timeout_s)
    t0 = time.time()  # every process has set up by now: init_rpc is a rendezvous of all of them
    worker.receive([f.wait() for f in [rpc.rpc_async(s, _pull, args=(i,)) for s in shards]])
    while (grads := worker.compute()) is not None:
        replies = [f.wait() for f in [rpc.rpc_async(s, _push, args=(i, g)) for s, g in zip(shards, grads)]]
        worker.receive([weights for _, weights in replies], max(tau for tau, _ in replies))
    for s in shards:
        rpc.rpc_sync(s, _bye, args=(i,))
    t_end = time.time()
    report = worker.finish()
    rpc.shutdown()
    snapshots = np.stack(report.snapshots) if report.snapshots else np.zeros((0, 0), np.float32)
    _save_npy(job / f"trainer{i}.snapshots.npy", snapshots)
    _save_npy(job / f"trainer{i}.buffers.npy", report.final_buffers)
    atomic_write_json(job / f"trainer{i}.json", {"worker": i, "t0": t0, "t_end": t_end, "rows": report.rows,
                                                 "snapshot_steps": report.snapshot_steps,
                                                 "snapshot_t": report.snapshot_t})


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m psbench.systems.rpc_ps.process")
    p.add_argument("--job", type=Path, required=True)
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--listen-fd", type=int, help="rank 0: the rendezvous store's listening socket")
    args = p.parse_args(argv)
    watch_launcher()
    try:
        spec = RunSpec.from_dict(json.loads((args.job / "spec.json").read_text()))
        options = PeerOptions(**json.loads((args.job / "options.json").read_text()))
        if args.rank < options.servers:
            serve(args.job, args.rank, spec, options, args)
        else:
            train(args.job, args.rank - options.servers, spec, options, args)
    except BaseException as exc:  # noqa: BLE001 - every failure is reported to the launcher
        write_error(args.job, args.rank, exc)
        return 1
    return 0


if __name__ == "__main__":
    exit_now(main())
