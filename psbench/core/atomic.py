"""Atomic writes: a reader sees the complete old file or the complete new one, never half of one."""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable

import pandas as pd


def atomic_write(path: Path, write: Callable[[Path], None]) -> None:
    """Call write(tmp_path) on a temp file beside `path`, fsync it, then rename over `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    os.chmod(tmp, 0o644)  # mkstemp makes 0600; results and reports are meant to be shared
    try:
        write(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda tmp: tmp.write_text(text))


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=_json_default) + "\n")


def atomic_write_csv(path: Path, frame: pd.DataFrame) -> None:
    atomic_write(path, lambda tmp: frame.to_csv(tmp, index=False))


def atomic_write_table(path: Path, frame: pd.DataFrame) -> None:
    """A frame as Parquet (`.parquet`, its dtypes kept) or CSV (`.csv`), by the path's suffix."""
    path = Path(path)
    if path.suffix == ".parquet":
        atomic_write(path, lambda tmp: frame.to_parquet(tmp, index=False, engine="pyarrow"))
    elif path.suffix == ".csv":
        atomic_write_csv(path, frame)
    else:
        raise ValueError(f"{path}: a table is written as .parquet or .csv")


def atomic_replace_dir(staging: Path, final: Path) -> None:
    """Move a fully written staging directory into place; an older `final` is swapped out whole."""
    final = Path(final)
    if final.exists():
        old = final.with_name(f".old-{final.name}-{os.getpid()}")
        os.replace(final, old)
        os.replace(staging, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(staging, final)


def _json_default(obj: Any) -> Any:
    import numpy as np

    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")
