"""Atomic writes: a reader sees the complete old file or the complete new one, never half of one.

A folder of run folders (a suite) may be written by several processes at once: each writes its run
into a staging folder of its own (`.staging-<run>-<pid>`) and swaps it into place under the suite
folder's lock (`dir_lock`), which is also held while leftovers are cleaned, so a cleaner never sees
another process's half-done swap and removes only staging folders whose writer is gone."""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import pandas as pd

from psbench.core.supervisor import pid_alive

STAGING_PREFIX = ".staging-"
OLD_PREFIX = ".old-"


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


@contextmanager
def dir_lock(folder: Path) -> Iterator[None]:
    """An exclusive flock on the folder itself (no lock file to leave behind), released on exit."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def atomic_replace_dir(staging: Path, final: Path) -> None:
    """Move a fully written staging directory into place; an older `final` is swapped out whole,
    under the parent folder's lock (see dir_lock)."""
    final = Path(final)
    with dir_lock(final.parent):
        if final.exists():
            old = final.with_name(f"{OLD_PREFIX}{final.name}-{os.getpid()}")
            os.replace(final, old)
            os.replace(staging, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(staging, final)


@contextmanager
def staged_dir(final: Path) -> Iterator[Path]:
    """A staging folder beside `final`, owned by this process (its pid in the name), to write into;
    swapped into place when the block ends, removed if it raises."""
    final = Path(final)
    staging = final.with_name(f"{STAGING_PREFIX}{final.name}-{os.getpid()}")
    staging.mkdir()
    try:
        yield staging
        atomic_replace_dir(staging, final)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)  # gone already once the swap went through
        raise


def owner_alive(leftover: Path) -> bool:
    """Whether the process a `.staging-<run>-<pid>` / `.old-<run>-<pid>` folder is named after
    still runs (then it is still writing it; a pid reused since only delays the cleaning)."""
    pid = leftover.name.rpartition("-")[2]
    return pid.isdigit() and pid_alive(int(pid))


def _json_default(obj: Any) -> Any:
    import numpy as np

    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")
