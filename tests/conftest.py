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
