"""Results survive interruption: a run interrupted at any point leaves the complete previous state or
the complete new one; `psbench bench` resumes a killed suite; a corrupt or foreign file in a suite
folder makes `psbench report` print one clear line, not a stack trace."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from psbench.core import atomic
from psbench.core import records
from psbench.bench.cli import main as cli_main
from psbench.core.records import Recorder
from psbench.bench.harness.results import load_suite
from psbench.bench.harness.runner import clean_staging, is_complete
from psbench.core.spec import RunSpec
from psbench.core.tables import read_table
from psbench.systems.common import child_env

ROOT = Path(__file__).resolve().parent.parent
RUN_FILES = {"manifest.json", "steps.parquet", "evals.parquet", "events.parquet"}


def recorder(spec: RunSpec, loss: float) -> Recorder:
    rec = Recorder(spec)
    rec.start_clock()
    rec.step(0, 0, 32, loss)
    rec.eval(0, "val", loss, 0.5)
    rec.stop_clock()
    return rec


def snapshot(run_dir: Path) -> dict[str, str]:
    return {p.name: p.read_bytes() for p in sorted(run_dir.iterdir())}


def assert_complete(run_dir: Path) -> dict:
    assert RUN_FILES <= {p.name for p in run_dir.iterdir()}, sorted(p.name for p in run_dir.iterdir())
    manifest = json.loads((run_dir / "manifest.json").read_text())
    for name in ("steps", "evals", "events"):
        read_table(run_dir, name)
    return manifest


@pytest.mark.parametrize("fail_at", [1, 2, 3])  # the nth table write: steps, evals, events
def test_interrupt_between_file_writes_keeps_the_previous_run(results_dir, monkeypatch, fail_at):
    spec = RunSpec("single", "mlp-digits", max_steps=1)
    old = recorder(spec, 1.0).finish(results_dir, "s")
    before = snapshot(old.out_dir)
    calls = {"n": 0}
    real = records.atomic_write_table

    def flaky(path, frame):
        calls["n"] += 1
        if calls["n"] == fail_at:
            raise KeyboardInterrupt
        real(path, frame)

    monkeypatch.setattr(records, "atomic_write_table", flaky)
    with pytest.raises(KeyboardInterrupt):
        recorder(spec, 2.0).finish(results_dir, "s")
    assert snapshot(old.out_dir) == before  # the complete previous state, untouched
    assert is_complete(results_dir, "s", spec)
    assert len(load_suite(results_dir / "s").runs) == 1  # the half-written staging dir is not read
    clean_staging(results_dir, "s")
    assert [p.name for p in (results_dir / "s").iterdir()] == [spec.run_id]


def test_interrupt_inside_the_final_rename_is_repaired(results_dir, monkeypatch):
    """Killed after the old run was moved aside and before the new one took its place: the next
    start puts the old one back (complete previous state)."""
    spec = RunSpec("single", "mlp-digits", max_steps=1)
    old = recorder(spec, 1.0).finish(results_dir, "s")
    before = snapshot(old.out_dir)
    real = os.replace
    calls = {"n": 0}

    def flaky(src, dst):
        if Path(str(src)).name == spec.run_id:  # the move of the old run aside
            real(src, dst)
            raise KeyboardInterrupt
        calls["n"] += 1
        real(src, dst)

    monkeypatch.setattr(atomic.os, "replace", flaky)
    with pytest.raises(KeyboardInterrupt):
        recorder(spec, 2.0).finish(results_dir, "s")
    monkeypatch.setattr(atomic.os, "replace", real)
    assert not old.out_dir.exists()
    clean_staging(results_dir, "s")
    assert snapshot(old.out_dir) == before
    assert sorted(p.name for p in (results_dir / "s").iterdir()) == [spec.run_id]


def _psbench(args: list[str], **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "psbench.bench.cli", *args], env=child_env(), cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True, **kw)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.communicate()


def test_sigkill_of_psbench_run_leaves_old_or_new_complete(results_dir):
    """A real SIGKILL at several points of a re-run over a complete run: the run folder always holds
    one complete run (the previous or the new), and no half-written file is ever read."""
    args = ["run", "--system", "single", "--workload", "mlp-digits", "--max-steps", "150", "--evals-per-epoch", "8",
            "--results-dir", str(results_dir), "--suite", "k", "--no-progress"]
    first = _psbench(args)
    out, err = first.communicate(timeout=180)
    assert first.returncode == 0, err[-2000:]
    [run_dir] = [p for p in (results_dir / "k").iterdir() if not p.name.startswith(".")]
    previous = assert_complete(run_dir)
    outcomes = []
    for delay in (1.0, 4.5):
        proc = _psbench([*args, "--no-resume"])
        time.sleep(delay)
        finished = proc.poll() is not None
        _kill_group(proc)
        manifest = assert_complete(run_dir)
        outcomes.append("new" if manifest["start"] != previous["start"] else "old")
        if finished:
            break
        previous = manifest
    clean_staging(results_dir, "k")
    assert [p.name for p in (results_dir / "k").iterdir()] == [run_dir.name]
    assert "old" in outcomes, outcomes  # at least one kill landed before the new run was in place


EXPERIMENT = """
suite = "resume"
description = "three tiny single-process runs"
[matrix]
system = ["single"]
workload = ["logreg-digits"]
seed = [0, 1, 2]
[settings]
max_steps = 30
"""


def test_bench_resumes_a_killed_suite(results_dir, tmp_path):
    config = tmp_path / "resume.toml"
    config.write_text(EXPERIMENT)
    args = ["bench", str(config), "--results-dir", str(results_dir), "--no-progress"]
    proc = _psbench(args)
    suite = results_dir / "resume"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and not list(suite.glob("*/manifest.json")) and proc.poll() is None:
        time.sleep(0.05)
    done = list(suite.glob("*/manifest.json"))
    _kill_group(proc)  # right after the first run completed (and before the report)
    assert len(done) >= 1
    first = {p.parent.name: p.read_text() for p in suite.glob("*/manifest.json")}
    assert len(first) < 3 or proc.returncode == 0, "the kill came too late to test resuming"
    again = _psbench(args)
    out, err = again.communicate(timeout=300)
    assert again.returncode == 0, err[-2000:]
    assert f"{len(first)} run(s) of suite 'resume' already complete, skipping (resume)" in err
    runs = {p.parent.name: p.read_text() for p in suite.glob("*/manifest.json")}
    assert len(runs) == 3
    assert all(runs[name] == text for name, text in first.items())  # completed runs were not redone
    assert (suite / "report.md").is_file()
    assert not list(suite.glob(".staging-*"))


@pytest.mark.parametrize("junk", ["corrupt-manifest", "foreign-file", "bad-parquet", "bad-csv"])
def test_report_on_a_damaged_suite_is_one_clear_line(results_dir, junk, capsys):
    spec = RunSpec("single", "mlp-digits", max_steps=1)
    run = recorder(spec, 1.0).finish(results_dir, "s")
    if junk == "corrupt-manifest":
        (run.out_dir / "manifest.json").write_text('{"psbench_manifest": 1, "run_id": ')
    elif junk == "foreign-file":
        (results_dir / "s" / "notes.xlsx").write_bytes(b"PK\x03\x04 not ours")
    elif junk == "bad-parquet":
        (run.out_dir / "steps.parquet").write_bytes(b"PAR1 \x00\xff garbage")
    else:
        (run.out_dir / "steps.parquet").unlink()
        (run.out_dir / "steps.csv").write_bytes(b"\x00\xff garbage,\n\"unterminated")
    rc = cli_main(["report", str(results_dir / "s")])  # an exception here would fail the test itself
    err = capsys.readouterr().err
    assert rc == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("psbench: error: "), err
    name = {"corrupt-manifest": "manifest.json", "foreign-file": "notes.xlsx", "bad-parquet": "steps.parquet",
            "bad-csv": "steps.csv"}[junk]
    assert name in lines[0]
