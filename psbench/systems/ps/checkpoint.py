"""Shard checkpoints: raw .npy tensors plus a JSON header, each file written atomically.

    <dir>/shard-<j>-v<version>.npy   params, then momentum, then each extra slot (e.g. gap-aware's running
                                     average), every one in key order, flattened and concatenated (float32)
    <dir>/shard-<j>.json             {version, keys, shapes, momentum, slots, file, sha256, policy, done_rid, ...}

The .npy is written first under a name carrying the version, then the header is replaced to point
at it; only then is the previous .npy removed. A crash at any point leaves a header that names a
complete .npy (the checksum proves it), so a restart always finds a consistent state.
"""
from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from psbench.core.atomic import atomic_write, atomic_write_json
from psbench.core.errors import ConfigError

FORMAT = 1


@dataclass(frozen=True)
class Interval:
    """Checkpoint every `versions` updates or every `seconds` (exactly one is set)."""
    versions: int | None = None
    seconds: float | None = None

    def due(self, version: int, last_version: int, now: float, last_t: float) -> bool:
        if self.versions is not None:
            return version - last_version >= self.versions
        return self.seconds is not None and now - last_t >= self.seconds and version != last_version


def parse_interval(text: str) -> Interval:
    """'100' = every 100 updates of the shard; '2.5s' = every 2.5 seconds."""
    raw = str(text).strip()
    try:
        if raw.endswith("s"):
            seconds = float(raw[:-1])
            if seconds > 0:
                return Interval(seconds=seconds)
        elif int(raw) >= 1:
            return Interval(versions=int(raw))
    except ValueError:
        pass
    raise ConfigError(f"checkpoint interval '{text}' must be a number of updates >= 1 (e.g. 100) "
                      f"or seconds > 0 with an s (e.g. 2.5s)")


def header_path(directory: Path, shard_id: int) -> Path:
    return Path(directory) / f"shard-{shard_id}.json"


def save(directory: Path, shard_id: int, version: int, keys: list[int], params: dict[int, np.ndarray],
         momentum: dict[int, np.ndarray], extra: dict[str, Any],
         slots: dict[str, dict[int, np.ndarray]] | None = None) -> Path:
    """`slots`: more per-key float32 tensors to keep (empty ones are left out), e.g. a mitigation's state."""
    directory = Path(directory)
    slots = {name: tensors for name, tensors in (slots or {}).items() if tensors}
    for name, tensors in slots.items():
        if sorted(tensors) != sorted(keys) or any(tensors[k].dtype != np.float32 for k in keys):
            raise ValueError(f"checkpoint slot {name!r} must hold a float32 tensor for every key")
    tensors = [params[k] for k in keys] + ([momentum[k] for k in keys] if momentum else [])
    tensors += [slot[k] for slot in slots.values() for k in keys]
    flat = np.concatenate([t.reshape(-1) for t in tensors]).astype(np.float32, copy=False)
    data = directory / f"shard-{shard_id}-v{version}.npy"
    atomic_write(data, lambda tmp: _save_npy(tmp, flat))
    header = directory / f"shard-{shard_id}.json"
    previous = _read_header(header)
    atomic_write_json(header, {"format": FORMAT, "shard": shard_id, "version": version, "keys": keys,
                               "shapes": [list(params[k].shape) for k in keys], "momentum": bool(momentum),
                               "slots": list(slots),
                               "file": data.name, "sha256": hashlib.sha256(flat.tobytes()).hexdigest(),
                               "time": time.time(), **extra})
    if previous and previous.get("file") and previous["file"] != data.name:
        (directory / str(previous["file"])).unlink(missing_ok=True)
    return data


def _save_npy(path: Path, flat: np.ndarray) -> None:
    with open(path, "wb") as f:  # a file object: np.save would add ".npy" to a temp file's name
        np.save(f, flat, allow_pickle=False)


def _read_header(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


@dataclass
class Restored:
    version: int
    keys: list[int]
    params: dict[int, np.ndarray]
    momentum: dict[int, np.ndarray]
    header: dict[str, Any]
    slots: dict[str, dict[int, np.ndarray]] = field(default_factory=dict)


def load(directory: Path, shard_id: int) -> Restored:
    path = header_path(directory, shard_id)
    header = _read_header(path)
    if not header or header.get("format") != FORMAT or header.get("shard") != shard_id:
        raise ConfigError(f"no usable checkpoint header at {path}")
    flat = np.load(Path(directory) / Path(str(header["file"])).name, allow_pickle=False)
    if hashlib.sha256(flat.tobytes()).hexdigest() != header["sha256"]:
        raise ConfigError(f"checkpoint {header['file']} does not match its header's checksum")
    keys = [int(k) for k in header["keys"]]
    shapes = [tuple(int(d) for d in s) for s in header["shapes"]]
    sizes = [math.prod(s) for s in shapes]
    n = sum(sizes)
    names = ["params"] + (["momentum"] if header["momentum"] else []) + [str(s) for s in header.get("slots", [])]
    if flat.dtype != np.float32 or flat.ndim != 1 or len(flat) != n * len(names):
        raise ConfigError(f"checkpoint {header['file']} has {flat.shape} {flat.dtype}, header expects "
                          f"{n * len(names)} float32")
    slots: dict[str, dict[int, np.ndarray]] = {}
    offset = 0
    for name in names:
        slot = slots.setdefault(name, {})
        for k, shape, size in zip(keys, shapes, sizes):
            slot[k] = flat[offset:offset + size].reshape(shape).copy()
            offset += size
    params, momentum = slots.pop("params"), slots.pop("momentum", {})
    return Restored(int(header["version"]), keys, params, momentum, header, slots)
