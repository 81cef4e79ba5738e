"""The parameter server's wire format: one msgpack header frame, then one raw buffer per tensor.

    frame 0:  msgpack map {op, worker, step, version, keys, dtypes, shapes, token?, ...}
    frame i:  the bytes of tensor i-1 (C order, dtype and shape as in the header)

Tensors are sent zero-copy (`send_multipart(copy=False)`) and read back with `np.frombuffer`
on the received frame buffers. Nothing is ever unpickled. `decode` validates the whole message
(size, header type, op, fields, dtype allow-list, shape vs byte length, token) before anyone
acts on it, so a bad message can only produce a `ProtocolError`, never a half-applied update.
"""
from __future__ import annotations

import hmac
import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import msgpack
import numpy as np

# Requests a server shard answers, replies it sends, and the launcher's control messages.
SERVER_OPS = frozenset({"init", "pull", "push", "bye", "state", "stats", "shutdown", "register"})
REPLY_OPS = frozenset({"ok", "params", "error"})
CONTROL_OPS = frozenset({"server_ready", "worker_ready", "go", "worker_done", "worker_progress", "server_progress"})
ALL_OPS = SERVER_OPS | REPLY_OPS | CONTROL_OPS

ALLOWED_DTYPES = {"float32": np.dtype(np.float32)}
DEFAULT_MAX_BYTES = 512 * 2**20
MAX_HEADER_BYTES = 16 * 2**20  # the header holds names and small lists; a huge one is an attack

# Fields every message needs, and their types (bool is excluded from int on purpose).
REQUIRED: dict[str, type] = {"op": str, "worker": int, "step": int, "version": int}
# Optional fields checked whenever present: a request id (retries and de-duplication echo it).
OPTIONAL_UINT = ("rid",)


class ProtocolError(ValueError):
    """A message that breaks the wire format; the message names the first thing that is wrong."""


@dataclass
class Message:
    op: str
    worker: int
    step: int
    version: int
    keys: list[int] = field(default_factory=list)
    arrays: list[np.ndarray] = field(default_factory=list)  # read-only views on the frames
    extra: dict[str, Any] = field(default_factory=dict)     # op-specific header fields
    nbytes: int = 0                                          # payload bytes, header included

    def tensors(self) -> dict[int, np.ndarray]:
        return dict(zip(self.keys, self.arrays))


def encode(op: str, *, worker: int = -1, step: int = 0, version: int = 0, keys: Sequence[int] = (),
           arrays: Sequence[np.ndarray] = (), token: str | None = None, **extra: Any) -> list[Any]:
    """Frames for send_multipart(copy=False): the header, then each array's own buffer (no copy)."""
    if len(keys) != len(arrays):
        raise ProtocolError(f"{len(keys)} keys but {len(arrays)} arrays")
    header: dict[str, Any] = {"op": op, "worker": int(worker), "step": int(step), "version": int(version),
                              "keys": [int(k) for k in keys],
                              "dtypes": [a.dtype.name for a in arrays],
                              "shapes": [list(a.shape) for a in arrays], **extra}
    if token is not None:
        header["token"] = token
    frames: list[Any] = [msgpack.packb(header, use_bin_type=True)]
    for a in arrays:
        frames.append(a if a.flags.c_contiguous else np.ascontiguousarray(a))
    return frames


def _buffer(frame: Any) -> memoryview:
    return frame.buffer if hasattr(frame, "buffer") else memoryview(frame)


def decode(frames: Sequence[Any], *, token: str | None = None, max_bytes: int = DEFAULT_MAX_BYTES,
           ops: frozenset[str] = ALL_OPS) -> Message:
    """Validate and unpack a message (frames: zmq.Frame or bytes). Raises ProtocolError."""
    if not frames:
        raise ProtocolError("empty message (no header frame)")
    buffers = [_buffer(f) for f in frames]
    total = sum(b.nbytes for b in buffers)
    if total > max_bytes:
        raise ProtocolError(f"message of {total} bytes exceeds the limit of {max_bytes} bytes")
    if buffers[0].nbytes > MAX_HEADER_BYTES:
        raise ProtocolError(f"header of {buffers[0].nbytes} bytes exceeds {MAX_HEADER_BYTES} bytes")
    try:
        header = msgpack.unpackb(buffers[0], raw=False, strict_map_key=True, use_list=True)
    except Exception as exc:  # msgpack raises several types for garbage
        raise ProtocolError(f"header is not valid msgpack ({type(exc).__name__})") from None
    if not isinstance(header, dict):
        raise ProtocolError(f"header must be a map, got {type(header).__name__}")
    if token is not None:
        given = header.get("token")
        if not isinstance(given, str) or not hmac.compare_digest(given.encode(), token.encode()):
            raise ProtocolError("missing or wrong token")
    for name, kind in REQUIRED.items():
        if name not in header:
            raise ProtocolError(f"header lacks required field '{name}'")
        value = header[name]
        if not isinstance(value, kind) or isinstance(value, bool):
            raise ProtocolError(f"header field '{name}' must be {kind.__name__}, got {type(value).__name__}")
    for name in OPTIONAL_UINT:
        if name in header:
            value = header[name]
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ProtocolError(f"header field '{name}' must be a non-negative int, got {value!r:.40}")
    op = header["op"]
    if op not in ops:
        raise ProtocolError(f"unknown op '{op[:40]}'; allowed: {', '.join(sorted(ops))}")
    keys, dtypes, shapes = header.get("keys", []), header.get("dtypes", []), header.get("shapes", [])
    if not (isinstance(keys, list) and isinstance(dtypes, list) and isinstance(shapes, list)):
        raise ProtocolError("header fields keys, dtypes and shapes must be lists")
    n = len(buffers) - 1
    if not (len(keys) == len(dtypes) == len(shapes) == n):
        raise ProtocolError(f"header lists {len(keys)} keys, {len(dtypes)} dtypes, {len(shapes)} shapes "
                            f"but the message has {n} tensor frames")
    if any(not isinstance(k, int) or isinstance(k, bool) or k < 0 for k in keys):
        raise ProtocolError("keys must be non-negative integers")
    if len(set(keys)) != len(keys):
        raise ProtocolError("duplicate keys in one message")
    arrays: list[np.ndarray] = []
    for i, (dtype_name, shape, buf) in enumerate(zip(dtypes, shapes, buffers[1:])):
        dtype = ALLOWED_DTYPES.get(dtype_name) if isinstance(dtype_name, str) else None
        if dtype is None:
            raise ProtocolError(f"tensor {i}: dtype {dtype_name!r} not allowed; allowed: {', '.join(ALLOWED_DTYPES)}")
        if not isinstance(shape, list) or any(not isinstance(d, int) or isinstance(d, bool) or d < 0 for d in shape):
            raise ProtocolError(f"tensor {i}: shape must be a list of non-negative integers, got {shape!r}")
        expected = math.prod(shape) * dtype.itemsize
        if expected != buf.nbytes:
            raise ProtocolError(f"tensor {i} (key {keys[i]}): shape {shape} {dtype_name} needs {expected} bytes, "
                                f"frame has {buf.nbytes}")
        arrays.append(np.frombuffer(buf, dtype=dtype).reshape(shape))
    extra = {k: v for k, v in header.items()
             if k not in REQUIRED and k not in ("keys", "dtypes", "shapes", "token")}
    return Message(op, header["worker"], header["step"], header["version"], list(keys), arrays, extra, total)


def error_frames(message: str, *, worker: int = -1, token: str | None = None) -> list[Any]:
    return encode("error", worker=worker, token=token, error=message)


def check_error(msg: Message, where: str) -> Message:
    """Raise a PSError if `msg` is an error reply."""
    if msg.op == "error":
        raise PSError(f"{where}: {msg.extra.get('error', 'error')}")
    return msg


class PSError(RuntimeError):
    """An error reply from a server shard, raised on the client side."""
