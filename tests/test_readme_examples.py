"""Every `psbench` line of the README's and docs/' examples runs as written on this machine (a newcomer's first
hour): each line of a ```sh block that runs `.venv/bin/psbench` (after a `git switch ... &&`, the
psbench part, in this checkout) runs from a scratch folder
that sees this checkout's bench/ and examples/ (so their relative paths and results/ resolve there), with a short
budget added to single runs (--max-steps, unless the line sets its own budget or is a suite or
--help). Lines run in README order, so `report` finds the results an earlier line wrote."""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from psbench.systems.common import child_env

ROOT = Path(__file__).resolve().parent.parent
SHORT = ["--max-steps", "8"]
pytestmark = pytest.mark.slow  # about 3 minutes: `make test-slow` (CI runs it), not `make test`


PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]  # the front page, then docs/


def readme_lines() -> list[str]:
    """The psbench command lines of the README's and docs/' sh blocks, comments dropped, in order."""
    lines, in_sh = [], False
    for line in "\n".join(page.read_text() for page in PAGES).splitlines():
        if line.startswith("```"):
            in_sh = line.strip() == "```sh"
            continue
        # `git switch my-change && .venv/bin/psbench ...`: the psbench part (here: the same checkout)
        command = line.split("&& ", 1)[1] if "&& .venv/bin/psbench " in line else line
        if in_sh and command.startswith(".venv/bin/psbench "):
            lines.append(command.split("  #")[0].split(" # ")[0].strip())
    return lines


def as_run(line: str) -> list[str]:
    argv = shlex.split(line)[1:]
    if argv[:1] == ["run"] and "--config" not in argv and "--help" not in argv and \
            not any(a in argv for a in ("--max-steps", "--budget", "--epochs")):
        argv += SHORT
    return [sys.executable, "-m", "psbench", *argv]


def test_the_readme_has_examples_to_run():
    lines = readme_lines()
    assert len(lines) >= 15 and any(" run --system " in line for line in lines)


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    where = tmp_path_factory.mktemp("newcomer")
    (where / "bench").symlink_to(ROOT / "bench")
    (where / "examples").symlink_to(ROOT / "examples")  # docs/workloads.md runs examples/own_model
    return where


@pytest.mark.parametrize("line", readme_lines())
def test_a_readme_line_runs_as_written(line: str, scratch: Path):
    if "--browser-check" in line and not (shutil.which("chromium") or shutil.which("chromium-browser")):
        pytest.skip("chromium not installed: bash .ci/install-chromium.sh")
    env = child_env({"PSBENCH_DEBUG": ""})
    env.pop("PSBENCH_DEBUG")
    done = subprocess.run(as_run(line), cwd=scratch, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{line}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    warnings = [w for w in done.stderr.splitlines() if w.startswith("psbench: warning:")]
    assert len(warnings) <= 1, warnings  # an oversubscribed ad-hoc run: one line, then it runs
    assert not re.search(r"^Traceback", done.stderr, re.M), done.stderr[-3000:]
    assert os.path.isdir(scratch / "bench")
