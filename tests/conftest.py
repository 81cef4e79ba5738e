"""Shared fixtures. Tests import this checkout's packages (run them as `python -m pytest`)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


@pytest.fixture
def results_dir(tmp_path: Path) -> Path:
    return tmp_path / "results"


@pytest.fixture(scope="session", autouse=True)
def shipped_cpu_figures(tmp_path_factory):
    """Plans use the shipped CPU figures (cpu_figures.py), in this process and in the subprocesses
    the tests start, instead of calibrating each system first on a fresh machine (minutes)."""
    import os

    from cpu_figures import write_figures
    from psbench.bench.harness.calibration import FIGURES_ENV

    folder = tmp_path_factory.mktemp("cpu-figures")
    write_figures(folder)
    saved = os.environ.get(FIGURES_ENV)
    os.environ[FIGURES_ENV] = str(folder)
    yield folder
    if saved is None:
        os.environ.pop(FIGURES_ENV, None)
    else:
        os.environ[FIGURES_ENV] = saved
