"""Soak test of the PS wire path: W worker processes, each doing N push-pull ops (KVWorker, ASP) with
small tensors against S shard processes on loopback. Reports ops/s, latency percentiles and each
shard's resident memory before and after (psutil), so a leak shows as growth.

    python -m psbench.systems.ps.soak --workers 8 --ops 10000 --servers 2      (`make soak`)
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

SHAPES = [(64, 32), (32,), (32, 10), (10,)]  # ~10 KB of float32 per push
TOKEN = "soak"


@dataclass
class SoakResult:
    workers: int
    servers: int
    ops_per_worker: int
    ops: int
    seconds: float
    ops_per_s: float
    p50_ms: float
    p99_ms: float
    rss_before_mb: list[float]
    rss_after_mb: list[float]

    @property
    def growth_mb(self) -> float:
        return max(a - b for a, b in zip(self.rss_after_mb, self.rss_before_mb))


def worker_main(addresses: list[str], worker_id: int, ops: int, out: str) -> None:
    """One worker process: ops push-pull round trips, per-op latency in seconds."""
    from psbench.systems.ps.worker import KVWorker

    rng = np.random.default_rng(worker_id)
    grads = [rng.standard_normal(s).astype(np.float32) * np.float32(1e-3) for s in SHAPES]
    lat = np.empty(ops)
    with KVWorker(addresses, worker_id, SHAPES, TOKEN) as kv:
        kv.pull()
        t_start = time.time()
        for i in range(ops):
            t = time.perf_counter()
            reply = kv.push_pull(grads, i)
            lat[i] = time.perf_counter() - t
            if len(reply.params) != len(SHAPES):
                raise RuntimeError(f"op {i}: reply with {len(reply.params)} tensors")
        t_end = time.time()
        kv.bye()
    np.save(out, lat)
    Path(out + ".json").write_text(json.dumps({"start": t_start, "end": t_end}))


def soak(workers: int = 8, ops: int = 10000, servers: int = 2, timeout_s: float = 900) -> SoakResult:
    import psutil

    from psbench.systems.common import child_env
    from psbench.core.supervisor import Supervisor
    from psbench.systems.ps.launch import Cluster
    from psbench.systems.ps.worker import ADMIN, KVWorker

    with Cluster(servers, workers, TOKEN) as cluster, tempfile.TemporaryDirectory(prefix="psbench-soak-") as tmp:
        addresses = cluster.start_servers(["--lr", "0.001", "--consistency", "asp"])
        pids = [c.proc.pid for c in cluster.children if c.role == "server"]
        with KVWorker(addresses, ADMIN, SHAPES, TOKEN) as admin:
            admin.init([np.zeros(s, np.float32) for s in SHAPES])
            rss_before = [psutil.Process(p).memory_info().rss / 2**20 for p in pids]
            with Supervisor() as workers_sup:
                procs = [workers_sup.spawn(f"soak worker {w}", [sys.executable, "-m", "psbench.systems.ps.soak",
                                                                "--role-worker", str(w), "--addresses", ",".join(addresses),
                                                                "--ops", str(ops), "--out", os.path.join(tmp, f"w{w}.npy")],
                                           env=child_env()).proc
                         for w in range(workers)]
                deadline = time.monotonic() + timeout_s
                for p in procs:
                    rc = p.wait(timeout=max(1.0, deadline - time.monotonic()))
                    if rc != 0:
                        raise RuntimeError(f"soak worker exited with {rc}")
            rss_after = [psutil.Process(p).memory_info().rss / 2**20 for p in pids]
            stats = admin.stats()
            admin.shutdown()
        lat = np.concatenate([np.load(os.path.join(tmp, f"w{w}.npy")) for w in range(workers)])
        spans = [json.loads(Path(os.path.join(tmp, f"w{w}.npy.json")).read_text()) for w in range(workers)]
    seconds = max(s["end"] for s in spans) - min(s["start"] for s in spans)
    applied = sum(s["applied"] for s in stats)
    if applied != workers * ops * servers:
        raise RuntimeError(f"shards applied {applied} pushes, expected {workers * ops * servers}")
    return SoakResult(workers, servers, ops, workers * ops, seconds, workers * ops / seconds,
                      float(np.percentile(lat, 50) * 1e3), float(np.percentile(lat, 99) * 1e3), rss_before, rss_after)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m psbench.systems.ps.soak", description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--ops", type=int, default=10000, help="push-pull ops per worker")
    p.add_argument("--servers", type=int, default=2)
    p.add_argument("--max-growth-mb", type=float, default=50.0, help="fail if a shard's RSS grows more")
    p.add_argument("--role-worker", type=int, help=argparse.SUPPRESS)
    p.add_argument("--addresses", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.role_worker is not None:
        from psbench.systems.common import configure_threads

        from psbench.systems.ps.protocol import zmq_process

        configure_threads(1)
        with zmq_process():
            worker_main(args.addresses.split(","), args.role_worker, args.ops, args.out)
        return 0
    result = soak(args.workers, args.ops, args.servers)
    print(json.dumps({**asdict(result), "growth_mb": result.growth_mb}, indent=2))
    if result.growth_mb > args.max_growth_mb:
        print(f"soak: shard memory grew {result.growth_mb:.1f} MB > {args.max_growth_mb} MB", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
