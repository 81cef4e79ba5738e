"""Where the ranks of a launched job meet: one torch TCPStore at MASTER_ADDR:MASTER_PORT (torchrun's
agent's, or served by rank 0 on a socket bound to that address only), through which rank 0 measures
every rank's clock offset and the ranks hand their record files to rank 0 (no shared folder needed
across hosts). Values in it are bytes; nothing is unpickled."""
from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Callable, Iterable, Sequence

from psbench.bench.lab.launch.env import LaunchEnv

OFFSET_ROUNDS = 8
# Rows of other ranks are placed on rank 0's clock; an offset beyond this shifts them by more than a
# short step of these workloads, so a run whose offsets exceed it says so in its manifest.
CLOCK_BOUND_S = 0.05


def connect(env: LaunchEnv, timeout_s: float):
    """The job's store: a client of torchrun's agent store, or rank 0 serving one on a socket bound
    to MASTER_ADDR only (torch's own would listen on every interface) and the others its clients."""
    import torch.distributed as dist

    timeout = timedelta(seconds=timeout_s)
    if env.agent_store or env.rank != 0:
        return dist.TCPStore(env.master_addr, env.master_port, env.world, is_master=False, timeout=timeout)
    from psbench.systems.ddp.adapter import bind_store_socket

    fd = bind_store_socket(env.master_addr, env.master_port).detach()  # the store owns the socket now
    return dist.TCPStore(env.master_addr, env.master_port, env.world, is_master=True, timeout=timeout,
                         master_listen_fd=fd)


@dataclass(frozen=True)
class Offset:
    offset_s: float   # add to this rank's time.time() to get rank 0's
    rtt_s: float      # the round trip it was read from (its uncertainty is half of it)


def estimate_offset(samples: Sequence[tuple[float, float, float]]) -> Offset:
    """From round trips (sent, rank 0's time in the reply, received), the one with the shortest
    round trip: rank 0 read its clock within it, most likely at its middle."""
    sent, remote, received = min(samples, key=lambda s: s[2] - s[0])
    return Offset(remote - (sent + received) / 2, received - sent)


def measure_offsets(store, rank: int, world: int, rounds: int = OFFSET_ROUNDS) -> dict[int, Offset]:
    """Collective: each rank in turn does `rounds` round trips to rank 0 through the store (rank 0
    serves one rank at a time, so no reply waits on another's). Rank 0 gets every rank's offset
    ({} elsewhere)."""
    if rank != 0:
        store.wait([f"clock/go/{rank}"])
        samples = []
        for k in range(rounds):
            sent = time.time()
            store.set(f"clock/req/{rank}/{k}", b"")
            remote = float(store.get(f"clock/rep/{rank}/{k}"))
            samples.append((sent, remote, time.time()))
        est = estimate_offset(samples)
        store.set(f"clock/offset/{rank}", json.dumps([est.offset_s, est.rtt_s]))
        return {}
    for r in range(1, world):
        store.set(f"clock/go/{r}", b"")
        for k in range(rounds):
            store.wait([f"clock/req/{r}/{k}"])
            store.set(f"clock/rep/{r}/{k}", repr(time.time()))
    offsets = {0: Offset(0.0, 0.0)}
    for r in range(1, world):
        offset_s, rtt_s = json.loads(store.get(f"clock/offset/{r}"))
        offsets[r] = Offset(float(offset_s), float(rtt_s))
    return offsets


def clock_record(offsets: dict[int, Offset], bound_s: float = CLOCK_BOUND_S) -> dict:
    """The manifest's account of the ranks' clocks: each offset to rank 0's, and whether all lie
    within the bound."""
    worst = max((abs(o.offset_s) for o in offsets.values()), default=0.0)
    return {"method": f"{OFFSET_ROUNDS} round trips to rank 0 through the rendezvous store, the shortest kept",
            "offsets_s": {str(r): round(o.offset_s, 6) for r, o in sorted(offsets.items())},
            "rtt_s": {str(r): round(o.rtt_s, 6) for r, o in sorted(offsets.items())},
            "max_abs_offset_s": round(worst, 6), "bound_s": bound_s, "within_bound": worst <= bound_s}


def send_files(store, rank: int, folder: Path, names: Iterable[str]) -> None:
    """This rank's files (those of `names` that exist) into the store; the list goes last."""
    sent = []
    for name in names:
        path = folder / name
        if path.is_file():
            store.set(f"files/{rank}/{name}", path.read_bytes())
            sent.append(name)
    store.set(f"files/{rank}", json.dumps(sent))


def receive_files(store, ranks: Iterable[int], folder: Path, allowed: Callable[[int], str]) -> list[str]:
    """Every rank's files into `folder` (a temp file, then renamed); waits for each rank's list.
    Only names the regex `allowed(rank)` matches are taken; returns the names received."""
    received = []
    for r in ranks:
        for name in json.loads(store.get(f"files/{r}")):
            if not re.fullmatch(allowed(r), name):
                raise RuntimeError(f"rank {r} sent a file named {name!r}, which no rank writes")
            tmp = folder / f".{name}.tmp"
            tmp.write_bytes(store.get(f"files/{r}/{name}"))
            os.replace(tmp, folder / name)
            received.append(name)
    return received
