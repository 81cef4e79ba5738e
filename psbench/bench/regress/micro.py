"""Micro-benchmarks timed by pytest-benchmark, each a ratio of two sides measured in one session:
psbench's code path and the plainest reference doing the same work.

    wire_encode      protocol.encode of a 6-tensor push (1.3 MB)  vs  msgpack header + the raw arrays
    wire_decode      protocol.decode (full validation)            vs  msgpack.unpackb + np.frombuffer
    roundtrip_1mb    KVWorker.push_pull of 1 MB to a PS shard     vs  a raw pyzmq echo of the same bytes
    roundtrip_10mb   the same with 10 MB
    shard_apply      a shard receiving an ASP push (decode, policy, SGD with momentum, reply)
                                                                  vs  the same SGD update in plain numpy
    train_step       the shared worker step (forward_backward + optimizer.step) on mlp-digits
                                                                  vs  the bare torch step on a twin model

Ratio = reference min ÷ psbench min (1.0: psbench adds nothing; higher is better): the fastest
round of each side, the one least disturbed by other load on a shared machine. The
benchmarks themselves are tests/microbench/test_micro.py (the `benchmark` fixture times both sides of
each case); `make microbench` runs them, saves the JSON and compares it with the previous save
(`--benchmark-compare`, `--benchmark-compare-fail`); `psbench regress` gates the ratios
(`micro_ratios` runs that session and reads its JSON) against baselines/regress.json.
"""
from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from psbench.core.errors import ConfigError

SIDES = ("psbench", "reference")
MB = 2**20
# A small model's tensors: mixed shapes, 1.3 MB in all.
SHAPES = [(512, 512), (512,), (512, 128), (128,), (128, 10), (10,)]
ROOT = Path(__file__).resolve().parents[3]
MICROBENCH_DIR = ROOT / "tests" / "microbench"

Sides = dict[str, Callable[[], Any]]


def _arrays(seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(np.float32) for s in SHAPES]


# ---- the cases: each a context manager yielding {side: zero-argument callable} ----------------

@contextlib.contextmanager
def wire_encode() -> Iterator[Sides]:
    import msgpack

    from psbench.systems.ps import protocol

    arrays, keys = _arrays(), list(range(len(SHAPES)))

    def reference() -> list[Any]:
        header = {"op": "push", "worker": 0, "step": 1, "version": 3, "keys": keys,
                  "dtypes": [a.dtype.name for a in arrays], "shapes": [list(a.shape) for a in arrays],
                  "want_params": True, "rid": 1}
        return [msgpack.packb(header, use_bin_type=True), *arrays]

    yield {"psbench": lambda: protocol.encode("push", worker=0, step=1, version=3, keys=keys, arrays=arrays,
                                              want_params=True, rid=1),
           "reference": reference}


@contextlib.contextmanager
def wire_decode() -> Iterator[Sides]:
    import msgpack

    from psbench.systems.ps import protocol

    frames = [bytes(memoryview(f)) for f in protocol.encode("push", worker=0, step=1, version=3,
                                                             keys=list(range(len(SHAPES))), arrays=_arrays())]

    def reference() -> list[np.ndarray]:
        header = msgpack.unpackb(frames[0], raw=False)
        return [np.frombuffer(f, np.float32).reshape(s) for f, s in zip(frames[1:], header["shapes"])]

    yield {"psbench": lambda: protocol.decode(frames), "reference": reference}


def _roundtrip(size_mb: int) -> Callable[[], contextlib.AbstractContextManager[Sides]]:
    @contextlib.contextmanager
    def case() -> Iterator[Sides]:
        from psbench.bench.regress.ps_benchmarks import echo
        from psbench.systems.ps.launch import Cluster
        from psbench.systems.ps.worker import ADMIN, KVWorker

        shape = (size_mb * MB // 4,)
        grad = np.ones(shape, np.float32)
        header = b"h" * 120  # about the size of a push header

        with echo() as raw, Cluster(1, 1, "bench") as cluster:
            [address] = cluster.start_servers(["--lr", "0.0", "--momentum", "0", "--max-message-mb", "64"])
            with KVWorker([address], ADMIN, [shape], "bench", max_bytes=64 * MB) as admin, \
                    KVWorker([address], 0, [shape], "bench", max_bytes=64 * MB) as kv:
                admin.init([np.zeros(shape, np.float32)])
                step = iter(range(1 << 62))  # from 0: a shard refuses a step ahead of the worker's clock

                def reference() -> np.ndarray:
                    raw.send_multipart([header, grad], copy=False)
                    reply = raw.recv_multipart(copy=False)
                    return np.frombuffer(reply[1].buffer, np.float32)

                yield {"psbench": lambda: kv.push_pull([grad], next(step)), "reference": reference}
                admin.shutdown()
            cluster.wait_servers()

    case.__name__ = f"roundtrip_{size_mb}mb"
    return case


@contextlib.contextmanager
def shard_apply() -> Iterator[Sides]:
    from psbench.systems.ps import protocol
    from psbench.systems.ps.server import Shard

    lr, momentum = np.float32(0.01), np.float32(0.9)
    keys = list(range(len(SHAPES)))
    shard = Shard(0, 1, lr=float(lr), momentum=float(momentum), consistency="asp")
    as_bytes = lambda frames: [bytes(memoryview(f)) for f in frames]  # noqa: E731  (what a socket delivers)
    shard.receive(b"admin", as_bytes(protocol.encode("init", keys=keys, arrays=_arrays(1))), None, protocol.DEFAULT_MAX_BYTES)
    shard.outbox.clear()
    grads = _arrays(2)
    push = as_bytes(protocol.encode("push", worker=0, step=0, keys=keys, arrays=grads, want_params=True))
    weights, buffers = _arrays(1), [np.zeros(s, np.float32) for s in SHAPES]

    def psbench() -> None:
        shard.receive(b"w0", push, None, protocol.DEFAULT_MAX_BYTES)
        shard.outbox.clear()

    def reference() -> None:
        for w, b, g in zip(weights, buffers, grads):
            b *= momentum
            b += g
            w -= lr * b

    yield {"psbench": psbench, "reference": reference}


@contextlib.contextmanager
def train_step() -> Iterator[Sides]:
    import copy

    from psbench.core.spec import RunSpec
    from psbench.systems.common import configure_threads, forward_backward, make_optimizer, prepare

    configure_threads(1)
    prep = prepare(RunSpec("single", "mlp-digits", max_steps=1))
    _, x, y = next(iter(prep.batches(0)))
    loss_fn = prep.workload.loss_fn()
    model = prep.build_model()
    twin = copy.deepcopy(model)
    opt, twin_opt = make_optimizer(model, prep.workload, prep.lr), make_optimizer(twin, prep.workload, prep.lr)

    def psbench() -> None:
        forward_backward(model, loss_fn, x, y)
        opt.step()

    def reference() -> None:
        twin_opt.zero_grad(set_to_none=True)
        loss_fn(twin(x), y).backward()
        twin_opt.step()

    yield {"psbench": psbench, "reference": reference}


CASES: dict[str, Callable[[], contextlib.AbstractContextManager[Sides]]] = {
    "wire_encode": wire_encode, "wire_decode": wire_decode,
    "roundtrip_1mb": _roundtrip(1), "roundtrip_10mb": _roundtrip(10),
    "shard_apply": shard_apply, "train_step": train_step,
}
# Rounds per side (pytest-benchmark's pedantic mode): fixed, so each side's minimum is taken over
# enough undisturbed chances on a loaded machine, and a session takes a few seconds of timing.
ROUNDS = {"wire_encode": 2000, "wire_decode": 2000, "roundtrip_1mb": 400, "roundtrip_10mb": 60,
          "shard_apply": 400, "train_step": 400}
WARMUP_ROUNDS = 5


# ---- ratios from pytest-benchmark's JSON ----------------------------------------------------------

def ratios_from_json(data: dict[str, Any]) -> dict[str, float]:
    """case -> reference min ÷ psbench min, for every case whose two sides were both timed."""
    mins: dict[str, dict[str, float]] = {}
    for bench in data.get("benchmarks", []):
        info = bench.get("extra_info", {})
        if info.get("case") and info.get("side") in SIDES and bench.get("stats"):
            mins.setdefault(info["case"], {})[info["side"]] = float(bench["stats"]["min"])
    return {case: m["reference"] / m["psbench"] for case, m in sorted(mins.items())
            if set(m) == set(SIDES) and m["psbench"] > 0}


def run_session(json_path: Path, select: str | None = None, extra: list[str] | None = None,
                timeout_s: float = 600) -> tuple[int, str]:
    """Run tests/microbench under pytest-benchmark (benchmarks enabled), writing its JSON."""
    from psbench.core.supervisor import Supervisor

    if not MICROBENCH_DIR.is_dir():
        raise ConfigError(f"the micro-benchmarks live in {MICROBENCH_DIR}: run from a source checkout")
    argv = [sys.executable, "-m", "pytest", str(MICROBENCH_DIR), "-q", "-p", "no:cacheprovider",
            "--benchmark-enable", "--benchmark-only", f"--benchmark-json={json_path}", *(extra or [])]
    if select:
        argv += ["-k", select]
    with Supervisor() as sup:
        child = sup.spawn("microbench", argv, capture=True, cwd=str(ROOT), env={**os.environ, "PYTHONPATH": str(ROOT)})
        try:
            out, err = child.proc.communicate(timeout=timeout_s)
        except Exception:
            sup.stop()
            raise
    return child.proc.returncode, out + err


def micro_ratios() -> dict[str, float]:
    """`psbench regress` entry: one pytest-benchmark session; its ratios."""
    with tempfile.TemporaryDirectory(prefix="psbench-micro-") as tmp:
        json_path = Path(tmp) / "micro.json"
        rc, output = run_session(json_path)
        if rc != 0 or not json_path.is_file():
            raise RuntimeError(f"micro-benchmarks failed (pytest exit {rc}): {output.strip().splitlines()[-1:]}")
        ratios = ratios_from_json(json.loads(json_path.read_text()))
    missing = sorted(set(CASES) - set(ratios))
    if missing:
        raise RuntimeError(f"micro-benchmarks: no ratio for {', '.join(missing)}")
    return ratios
