"""Provenance: a run's manifest names the commit, whether the code differed from it (results/,
which runs rewrite, left out) and where, and fingerprints its data and shard plan; the scale
model's files name their commit too."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from psbench.core import records
from psbench.core.records import DIRTY_PATHS_CAP, git_dirty, git_dirty_paths, provenance


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True,
                   capture_output=True)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    (tmp_path / "results" / "reference").mkdir(parents=True)
    (tmp_path / "results" / "reference" / "manifest.json").write_text("{}\n")
    (tmp_path / "src.py").write_text("x = 1\n")
    (tmp_path / "pkg").mkdir()
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "commit", "-q", "-m", "init")
    return tmp_path


def test_results_rewritten_by_runs_do_not_make_the_tree_dirty(repo):
    (repo / "results" / "reference" / "manifest.json").write_text('{"rewritten": true}\n')
    (repo / "untracked.py").write_text("")
    assert git_dirty(repo) is False and git_dirty_paths(repo) == []
    (repo / "src.py").write_text("x = 2\n")
    assert git_dirty(repo) is True and git_dirty_paths(repo) == ["src.py"]
    assert git_dirty_paths(repo / "pkg") == ["src.py"]   # asked from a sub-folder: the whole checkout


def test_dirty_paths_are_capped_and_counted(repo):
    for i in range(DIRTY_PATHS_CAP + 5):
        (repo / f"m{i:02d}.py").write_text("")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "more")
    for i in range(DIRTY_PATHS_CAP + 5):
        (repo / f"m{i:02d}.py").write_text("changed\n")
    stamp = provenance(repo)
    assert stamp["git_dirty"] is True and stamp["git_dirty_count"] == DIRTY_PATHS_CAP + 5
    assert len(stamp["git_dirty_paths"]) == DIRTY_PATHS_CAP and stamp["git_sha"]
    assert stamp["versions"]["mnist1d"] and stamp["versions"]["scikit-learn"]


def test_outside_a_checkout_nothing_is_claimed(tmp_path):
    stamp = provenance(tmp_path)
    assert stamp["git_sha"] is None and stamp["git_dirty"] is None and stamp["git_dirty_paths"] is None


def test_a_run_manifest_records_provenance_and_data_fingerprints(results_dir, monkeypatch):
    from psbench.bench.harness.runner import plan, run_one
    from psbench.core.spec import RunSpec

    monkeypatch.setattr(records, "git_dirty_paths", lambda repo=None: ["systems/ps/server.py"])
    result = run_one(plan(RunSpec("single", "mlp-digits", max_steps=5), allow_oversubscribe=True), results_dir, "p")
    manifest = json.loads((result.out_dir / "manifest.json").read_text())
    assert manifest["git_dirty"] is True and manifest["git_dirty_paths"] == ["systems/ps/server.py"]
    data = manifest["extra"]["data"]
    shards = json.loads((result.out_dir / "shards.json").read_text())
    assert data["dataset"] == "digits" and data["fingerprint"].startswith("sha256:")
    assert data["shard_plan"] == shards["fingerprint"]
    other = run_one(plan(RunSpec("single", "mlp-digits", max_steps=5, seed=1), allow_oversubscribe=True),
                    results_dir, "p")
    other_data = json.loads((other.out_dir / "manifest.json").read_text())["extra"]["data"]
    assert other_data["fingerprint"] == data["fingerprint"] and other_data["shard_plan"] != data["shard_plan"]
