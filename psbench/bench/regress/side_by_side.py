"""`psbench regress --against REV`: another commit's benchmarks run on this machine beside this
checkout's, repeat by repeat, as asv's `continuous` does.

A ratio such as "PS shard apply ÷ the same SGD in numpy" carries across loads but not across
processors: how much Python overhead weighs against memory bandwidth differs from one CPU to the
next (CI once saw micro.shard_apply 11% under a baseline measured on another machine, with the
code unchanged). So the check that gates CI measures the accepted commit (the baseline file's
`git_sha`) here and now, and compares this checkout with that, not with numbers from elsewhere.

The other commit is `git archive`d into a temporary folder and installed (editable, no
dependencies) into a temporary venv that reuses this environment's packages; each side runs as
`python -m psbench regress --repeats 1 --update-baseline --baseline <its file>`, the two sides
alternating which goes first, so both see the same state of the machine. The test-only slow-down
knob (ps_benchmarks.SLOWDOWN_ENV) reaches this checkout's side only: it stands for a change made
here.
"""
from __future__ import annotations

import json
import os
import site
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from psbench.core.errors import ConfigError

from .ps_benchmarks import SLOWDOWN_ENV

ROOT = Path(__file__).resolve().parents[3]
# metric -> (higher is better, the samples): check.py turns these into its Measured records
Samples = dict[str, tuple[bool, list[float]]]
SIDE_TIMEOUT_S = 900  # one repeat of every benchmark takes ~40 s here


def resolve_commit(rev: str, repo: Path = ROOT) -> str:
    """The full sha of `rev` in this checkout's history, or a ConfigError saying why not."""
    try:
        out = subprocess.run(["git", "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"], cwd=repo,
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        raise ConfigError(f"--against {rev}: git is not usable here ({exc})") from None
    if out.returncode != 0 or not out.stdout.strip():
        raise ConfigError(f"--against {rev}: not a commit in {repo}'s history (a shallow clone lacks old commits; "
                          f"`git fetch --unshallow` brings them)")
    return out.stdout.strip()


@contextmanager
def installed_commit(sha: str, log: Callable[[str], None], repo: Path = ROOT) -> Iterator[Path]:
    """A python that imports psbench from commit `sha` (and every other package from this
    environment); removed on exit."""
    with tempfile.TemporaryDirectory(prefix=f"psbench-{sha[:7]}-") as tmp:
        src, venv = Path(tmp) / "src", Path(tmp) / "venv"
        src.mkdir()
        archive = subprocess.run(["git", "archive", "--format=tar", sha], cwd=repo, capture_output=True, timeout=120)
        if archive.returncode != 0:
            raise ConfigError(f"--against {sha[:12]}: git archive failed: {archive.stderr.decode().strip()[-300:]}")
        subprocess.run(["tar", "-x", "-C", str(src)], input=archive.stdout, check=True, timeout=120)
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
        python = venv / "bin" / "python"
        # This environment's packages (torch, pyzmq, horovod, ...) by path: its own editable install of
        # psbench is a .pth that only site directories run, so the commit's install below is the one seen.
        venv_site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                                        capture_output=True, text=True, check=True, timeout=60).stdout.strip())
        (venv_site / "psbench-against-deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
        log(f"installing {sha[:12]} into a temporary venv")
        pip = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-deps",
                              "--no-build-isolation", "--no-index", "-e", str(src)],
                             capture_output=True, text=True, timeout=600)
        if pip.returncode != 0:
            raise ConfigError(f"--against {sha[:12]}: its install failed: {pip.stderr.strip()[-500:]}")
        # Both layers must come from the commit, not from this checkout's install beside it.
        seen = subprocess.run([str(python), "-c", "import psbench.core, psbench.bench.regress.check as c; "
                               "print(psbench.core.__file__); print(c.__file__)"],
                              capture_output=True, text=True, timeout=120, cwd=tmp)
        files = seen.stdout.split()
        if seen.returncode != 0 or len(files) != 2 or not all(Path(f).resolve().is_relative_to(src) for f in files):
            raise ConfigError(f"--against {sha[:12]}: its venv imports psbench from {files or seen.stderr.strip()[-300:]}, "
                              f"not from {src}")
        yield python


def run_side(python: Path, names: list[str] | None, quick: bool, out: Path, env: dict[str, str]) -> Samples:
    """One repeat of the benchmarks by the psbench that `python` imports."""
    from psbench.core.supervisor import Supervisor

    argv = [str(python), "-m", "psbench", "regress", "--repeats", "1", "--update-baseline", "--baseline", str(out),
            *(["--quick"] if quick else []), *[a for n in names or [] for a in ("--only", n)]]
    with Supervisor() as sup:
        child = sup.spawn("regress-side", argv, capture=True, cwd=str(out.parent), env=env)
        try:
            stdout, stderr = child.proc.communicate(timeout=SIDE_TIMEOUT_S)
        except Exception:
            sup.stop()
            raise
    if child.proc.returncode != 0:
        last = (stderr.strip() or stdout.strip()).splitlines()[-1:] or ["(no output)"]
        raise RuntimeError(f"{python}: psbench regress exited {child.proc.returncode}: {last[0]}")
    metrics = json.loads(out.read_text())["metrics"]
    out.unlink()
    return {m: (bool(v.get("higher_is_better", True)), [float(v["value"])]) for m, v in metrics.items()}


def measure_side_by_side(sha: str, names: list[str] | None, quick: bool, repeats: int,
                         log: Callable[[str], None]) -> tuple[Samples, Samples]:
    """(the commit's, this checkout's) samples: `repeats` runs of each, interleaved."""
    here_env = dict(os.environ)
    there_env = {k: v for k, v in os.environ.items() if k != SLOWDOWN_ENV}
    sides: dict[str, Samples] = {"there": {}, "here": {}}
    with installed_commit(sha, log) as there_python, tempfile.TemporaryDirectory(prefix="psbench-sides-") as tmp:
        for i in range(repeats):
            order = [("there", there_python, there_env), ("here", Path(sys.executable), here_env)]
            for side, python, env in (order if i % 2 == 0 else order[::-1]):
                log(f"repeat {i + 1}/{repeats}: {'this checkout' if side == 'here' else sha[:12]}")
                for metric, (higher, values) in run_side(python, names, quick, Path(tmp) / f"{side}-{i}.json",
                                                         env).items():
                    sides[side].setdefault(metric, (higher, []))[1].extend(values)
    return sides["there"], sides["here"]
