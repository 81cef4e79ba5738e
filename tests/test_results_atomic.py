"""Results survive interruption: a run interrupted at any point leaves the complete previous state or
the complete new one; `psbench bench` resumes a killed suite; a corrupt or foreign file in a suite
folder makes `psbench report` print one clear line, not a stack trace."""
from __future__ import annotations

import errno
import json
import os
import re
import signal
import subprocess
import threading
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


# ---- two processes writing one suite at once ----------------------------------------------------

# A writer that stops halfway until told to go on (a file appears): after its first table is in its
# staging folder ("staging"), or after the complete run it replaces was moved aside ("swap").
PAUSED_WRITER = """
import os, sys, time
from pathlib import Path
from psbench.core import atomic, records
from psbench.core.records import Recorder
from psbench.core.spec import RunSpec

results, pause, go, seed = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3]), int(sys.argv[4])

def wait_go():
    deadline = time.monotonic() + 120
    while not go.exists() and time.monotonic() < deadline:
        time.sleep(0.02)

if pause == "staging":
    real_table = records.atomic_write_table
    def table(path, frame):
        real_table(path, frame)
        if path.name.startswith("steps."):
            wait_go()
    records.atomic_write_table = table
else:
    real_replace = os.replace
    def replace(src, dst):
        real_replace(src, dst)
        if Path(dst).name.startswith(atomic.OLD_PREFIX):
            wait_go()
    atomic.os.replace = replace
rec = Recorder(RunSpec("single", "mlp-digits", max_steps=1, seed=seed))
rec.start_clock()
rec.step(0, 0, 32, 1.0)
rec.stop_clock()
rec.finish(results, "s")
"""


def _paused_writer(results_dir: Path, pause: str, go: Path, seed: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", PAUSED_WRITER, str(results_dir), pause, str(go), str(seed)],
                            env=child_env(), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for(suite: Path, pattern: str, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 120
    while not list(suite.glob(pattern)) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert list(suite.glob(pattern)), f"no {pattern} appeared: {proc.communicate()[1][-2000:]}"


def test_two_processes_write_one_suite_at_once_and_both_runs_are_complete(results_dir, tmp_path):
    """Process A is halfway through writing its run (its staging folder holds a table) when a
    `psbench run` into the same suite starts, cleans the suite and writes its own run; then A
    finishes. The cleaning leaves A's staging alone (its owner lives): both runs are complete."""
    go, suite = tmp_path / "go", results_dir / "s"
    writer = _paused_writer(results_dir, "staging", go, seed=1)
    _wait_for(suite, ".staging-*", writer)
    other = _psbench(["run", "--system", "single", "--workload", "mlp-digits", "--max-steps", "20", "--seed", "0",
                      "--results-dir", str(results_dir), "--suite", "s", "--no-progress"])
    out, err = other.communicate(timeout=300)
    assert other.returncode == 0, err[-2000:]
    assert writer.poll() is None, writer.communicate()[1][-2000:]  # still paused, its staging untouched
    go.touch()
    _, err = writer.communicate(timeout=120)
    assert writer.returncode == 0, err[-2000:]
    runs = sorted(p.name for p in suite.iterdir())
    assert len(runs) == 2 and not [n for n in runs if n.startswith(".")], runs
    assert {assert_complete(suite / name)["seed"] for name in runs} == {0, 1}


def test_cleaning_waits_for_a_swap_in_progress(results_dir, tmp_path):
    """A re-run has moved the complete run it replaces aside (`.old-*`) and not yet renamed its new
    one into place when another process cleans the suite: the cleaner waits on the suite's lock
    instead of putting the old run back under the writer's feet, and the new run lands whole."""
    spec = RunSpec("single", "mlp-digits", max_steps=1, seed=1)
    first = recorder(spec, 1.0).finish(results_dir, "s")
    first_start = json.loads((first.out_dir / "manifest.json").read_text())["start"]
    go, suite = tmp_path / "go", results_dir / "s"
    writer = _paused_writer(results_dir, "swap", go, seed=1)
    _wait_for(suite, ".old-*", writer)
    cleaner = threading.Thread(target=clean_staging, args=(results_dir, "s"))
    cleaner.start()
    cleaner.join(1.0)
    blocked = cleaner.is_alive()
    go.touch()
    _, err = writer.communicate(timeout=120)
    cleaner.join(30)
    assert blocked, "the cleaner did not wait for the swap in progress"
    assert writer.returncode == 0, err[-2000:]
    assert [p.name for p in suite.iterdir()] == [spec.run_id]
    assert assert_complete(first.out_dir)["start"] != first_start  # the new run, in place


def test_cleaning_removes_staging_only_of_a_dead_owner(results_dir):
    suite = results_dir / "s"
    suite.mkdir(parents=True)
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
        live, dead = suite / f".staging-run-a-{sleeper.pid}", suite / f".staging-run-b-{gone.stdout.strip()}"
        live.mkdir(), dead.mkdir()
        clean_staging(results_dir, "s")
        assert live.is_dir() and not dead.exists()
    finally:
        sleeper.kill()
        sleeper.wait()
    clean_staging(results_dir, "s")
    assert not live.exists()


# ---- a full disk, and durable renames -------------------------------------------------------------

def _file_size_limit(limit: int):
    """For a child: writes past `limit` bytes fail with EFBIG (SIGXFSZ ignored), as on a full disk."""
    import resource

    def limit_files() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)   # an ignored signal stays ignored across exec
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return limit_files


def test_a_disk_that_fills_while_a_run_is_recorded_is_one_line_and_leaves_nothing(results_dir):
    """`psbench run` whose step table outgrows what the disk takes: one line naming the run folder,
    no traceback, and nothing in results/ but the (empty) suite folder: no staging folder, no temp file."""
    proc = _psbench(["run", "--system", "single", "--workload", "mlp-digits", "--max-steps", "60", "--format", "csv",
                     "--results-dir", str(results_dir), "--suite", "full", "--no-progress"],
                    preexec_fn=_file_size_limit(4096))
    out, err = proc.communicate(timeout=180)
    (line,) = err.strip().splitlines()
    assert proc.returncode == 1 and re.fullmatch(
        rf"psbench: run failed: {re.escape(str(results_dir))}/full/single-mlp-digits-w1-s0-\w+: not written "
        r"\(File too large\); nothing of it was kept", line), err
    assert [str(p.relative_to(results_dir)) for p in results_dir.rglob("*")] == ["full"]


@pytest.mark.parametrize("errno_name", ["ENOSPC", "EFBIG", "EDQUOT"])
def test_a_full_disk_while_replacing_a_run_keeps_the_previous_one(results_dir, monkeypatch, errno_name):
    spec = RunSpec("single", "mlp-digits", max_steps=1)
    old = recorder(spec, 1.0).finish(results_dir, "s")
    before = snapshot(old.out_dir)
    real = records.atomic_write_json

    def full(path, obj):   # the manifest, the last file of the run, meets a full disk
        real(path, obj)
        raise OSError(getattr(errno, errno_name), os.strerror(getattr(errno, errno_name)), str(path))

    monkeypatch.setattr(records, "atomic_write_json", full)
    with pytest.raises(atomic.DiskFull, match=rf"^{re.escape(str(old.out_dir))}: not written \("):
        recorder(spec, 2.0).finish(results_dir, "s")
    assert snapshot(old.out_dir) == before and sorted(p.name for p in (results_dir / "s").iterdir()) == [spec.run_id]


def test_renames_are_made_durable_by_syncing_their_folder(results_dir, monkeypatch):
    """After each rename the folder holding it is fsynced; a staging folder once, before its own rename."""
    seen: list[tuple[str, str]] = []
    real_replace, real_fsync = os.replace, os.fsync
    monkeypatch.setattr(atomic.os, "replace", lambda src, dst: seen.append(("replace", str(dst))) or real_replace(src, dst))
    monkeypatch.setattr(atomic.os, "fsync", lambda fd: seen.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
                        or real_fsync(fd))
    target = results_dir / "notes" / "a.txt"
    atomic.atomic_write_text(target, "x")
    assert seen[-2:] == [("replace", str(target)), ("fsync", str(target.parent))]
    seen.clear()
    run = recorder(RunSpec("single", "mlp-digits", max_steps=1), 1.0).finish(results_dir, "s")
    staging = next(dst for kind, dst in seen if kind == "replace" and Path(dst).name == "manifest.json")
    staging = str(Path(staging).parent)
    assert seen[-3:] == [("fsync", staging), ("replace", str(run.out_dir)), ("fsync", str(run.out_dir.parent))]
    assert ("fsync", staging) not in seen[:-3]   # its files' names are synced once, with it
