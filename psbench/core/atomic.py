"""Atomic writes: a reader sees the complete old file or the complete new one, never half of one.

A folder of run folders (a suite) may be written by several processes at once: each writes its run
into a staging folder of its own (`.staging-<run>-<pid>`) and swaps it into place under the suite
folder's lock (`dir_lock`), which is also held while leftovers are cleaned, so a cleaner never sees
another process's half-done swap and removes only staging folders whose writer is gone.

Each rename is made durable by an fsync of the folder that holds it (the file's own data first). A
disk that fills (or a file size limit) is one DiskFull line naming what was not written, and
nothing of it is left behind."""
from __future__ import annotations

import errno
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
DISK_FULL = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)


class DiskFull(RuntimeError):
    """A write that ran out of space: names what was not written (a run's records: its folder)."""

    def __init__(self, path: Path, reason: str):
        super().__init__(f"{path}: not written ({reason}); nothing of it was kept")
        self.reason = reason


def _disk_full(exc: BaseException) -> str | None:
    """Why `exc` means a full disk, or None."""
    if isinstance(exc, DiskFull):
        return exc.reason
    if isinstance(exc, OSError) and exc.errno in DISK_FULL:
        return os.strerror(exc.errno)
    return None


def fsync_dir(folder: Path) -> None:
    """Make the renames inside `folder` durable."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno != errno.EINVAL:   # a file system that cannot sync a folder
            raise
    finally:
        os.close(fd)


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
        if not path.parent.name.startswith(STAGING_PREFIX):   # a staging folder is synced once, whole, when renamed
            fsync_dir(path.parent)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        reason = _disk_full(exc)
        if reason:
            raise DiskFull(path, reason) from exc
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda tmp: tmp.write_text(text))


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=_json_default) + "\n")


def atomic_write_csv(path: Path, frame: pd.DataFrame) -> None:
    atomic_write(path, lambda tmp: frame.to_csv(tmp, index=False))


def atomic_write_table(path: Path, frame: pd.DataFrame, compression: str = "snappy") -> None:
    """A frame as Parquet (`.parquet`, its dtypes kept; `compression` its codec) or CSV (`.csv`),
    by the path's suffix."""
    path = Path(path)
    if path.suffix == ".parquet":
        atomic_write(path, lambda tmp: frame.to_parquet(tmp, index=False, engine="pyarrow", compression=compression))
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
    fsync_dir(staging)   # its files' names, before the folder's own rename
    with dir_lock(final.parent):
        if final.exists():
            old = final.with_name(f"{OLD_PREFIX}{final.name}-{os.getpid()}")
            os.replace(final, old)
            os.replace(staging, final)
            fsync_dir(final.parent)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(staging, final)
            fsync_dir(final.parent)


@contextmanager
def staged_dir(final: Path) -> Iterator[Path]:
    """A staging folder beside `final`, owned by this process (its pid in the name), to write into;
    swapped into place when the block ends, removed if it raises (a full disk: DiskFull naming `final`)."""
    final = Path(final)
    staging = final.with_name(f"{STAGING_PREFIX}{final.name}-{os.getpid()}")
    try:
        staging.mkdir()
        yield staging
        atomic_replace_dir(staging, final)
    except BaseException as exc:
        shutil.rmtree(staging, ignore_errors=True)  # gone already once the swap went through
        reason = _disk_full(exc)
        if reason:
            raise DiskFull(final, reason) from exc
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
