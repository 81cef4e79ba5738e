"""psbench launch started by torch's own torchrun on this machine (`--standalone`): the run folder
rank 0 gathers reads back (load_suite) with a local run's columns and trains as well. Slow: each
job starts its ranks and torchrun's agent (~10 s on 2 cores), and the local twin runs beside it."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from psbench.bench.harness.results import load_suite
from psbench.bench.harness.runner import run_all
from psbench.core.spec import RunSpec

pytestmark = pytest.mark.slow
WORKLOAD, STEPS = "mlp-digits", 30


def torchrun(nproc: int, args: list[str], results: Path, env: dict[str, str] | None = None) -> tuple[float, str]:
    """Run `torchrun --standalone --nproc-per-node N -m psbench launch ARGS`; its wall time and output."""
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
            "-m", "psbench", "launch", "--workload", WORKLOAD, "--max-steps", str(STEPS),
            "--results-dir", str(results), "--suite", "launched", *args]
    began = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, env={**os.environ, **(env or {})},
                          cwd=Path(__file__).resolve().parent.parent)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return time.monotonic() - began, done.stdout + done.stderr


def check_like_local(launched_dir: Path, local: RunSpec, tmp_path: Path, same_accuracy: bool) -> dict:
    """The launched suite against a local run of the same spec: one run, the same id, columns and
    row counts; its accuracy equal (deterministic ddp) or sane (ps: asynchronous). Its manifest."""
    run_all([local], tmp_path / "local", "local", progress=False, allow_oversubscribe=True)
    got, want = load_suite(launched_dir), load_suite(tmp_path / "local" / "local")
    assert list(got.runs["run_id"]) == [local.run_id]
    for table in ("runs", "steps", "evals", "events"):
        assert list(getattr(got, table).columns) == list(getattr(want, table).columns), table
    assert len(got.steps) == len(want.steps) == local.workers * STEPS
    acc, local_acc = float(got.runs["final_val_accuracy"][0]), float(want.runs["final_val_accuracy"][0])
    if same_accuracy:
        assert acc == pytest.approx(local_acc, abs=1e-9)
    assert acc > 0.3, acc   # chance is 0.1 on digits
    assert not [p for p in launched_dir.iterdir() if p.name.startswith(".")], "staging left behind"
    return got.manifests[local.run_id]


def test_torchrun_ddp_two_ranks(tmp_path):
    wall, out = torchrun(2, ["--system", "ddp"], tmp_path / "r")
    manifest = check_like_local(tmp_path / "r" / "launched", RunSpec("ddp", WORKLOAD, workers=2, max_steps=STEPS),
                                tmp_path, same_accuracy=True)
    launch = manifest["extra"]["launch"]
    assert launch["engine"] == "torchrun" and launch["world"] == 2 and launch["store"] == "torchrun agent"
    assert set(launch["clock"]["offsets_s"]) == {"0", "1"} and launch["clock"]["within_bound"] is True
    print(f"torchrun ddp 2 ranks: {wall:.1f} s wall; clock offsets {json.dumps(launch['clock']['offsets_s'])}")


def test_torchrun_ps_one_shard_two_workers(tmp_path):
    wall, out = torchrun(3, ["--system", "ps"], tmp_path / "r", env={"PSBENCH_PS_TOKEN": "launch-test-token"})
    manifest = check_like_local(tmp_path / "r" / "launched", RunSpec("ps", WORKLOAD, workers=2, max_steps=STEPS),
                                tmp_path, same_accuracy=False)
    launch = manifest["extra"]["launch"]
    assert launch["world"] == 3 and launch["store_auth"] == "token" and len(launch["shards"]) == 1
    assert set(launch["clock"]["offsets_s"]) == {"0", "1", "2"} and launch["clock"]["within_bound"] is True
    assert "launch-test-token" not in json.dumps(manifest)
    print(f"torchrun ps 1 shard + 2 workers: {wall:.1f} s wall; clock offsets {json.dumps(launch['clock']['offsets_s'])}")
