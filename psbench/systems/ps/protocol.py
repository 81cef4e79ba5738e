"""The parameter server's wire format: one msgpack header frame, then the tensors' raw bytes.

    frame 0:  msgpack map {token?, op, worker, step, version, keys, dtypes, shapes, packed?, ...}
              (the token, when there is one, is the map's FIRST entry: see below)
    frame i:  the bytes of tensor i-1 (C order, dtype and shape as in the header), or, with
              packed: true, ONE frame holding every tensor's bytes back to back in header order
              (tensor fusion: a worker's gradients of a shard's keys are one contiguous slice of
              its flat gradient buffer, so one frame per shard, still without a copy)

Tensors are sent zero-copy (`send_multipart(copy=False)`) and read back with `np.frombuffer`
on the received frame buffers. A received zmq frame is ours alone: the shard may write its update
into a gradient's frame and send that frame back by reference (`encode(..., send_as=)`), so a reply
costs neither a copy nor pyzmq's garbage-collector thread. Nothing is ever unpickled. `decode` validates the whole message
(size, token, header type, op, fields, dtype allow-list, shape vs byte length) before anyone
acts on it, so a bad message can only produce a `ProtocolError`, never a half-applied update.

Nothing is spent on a peer before it is authenticated: a receiver with a token reads the header's
first entry from its raw bytes (`_shows_token`) and compares it before it unpacks anything, so a
header of a million empty arrays from a peer without the token costs a few byte comparisons. What
an authenticated or token-less peer can make a receiver unpack is bounded too: the header's size
(`MAX_HEADER_BYTES`) and msgpack's per-container limits (in decode). Sockets that bind add
libzmq's own bound (`limit_frames`: ZMQ_MAXMSGSIZE), which drops a connection whose frame is over
the limit before the frame is read into memory.

A shard and a worker exchange the same layout every step: `decode(expect=PackedLayout)` checks
such a message's keys, dtypes and shapes with a few list comparisons instead of one by one (30 %
less of a shard's time per push of a small model), and anything else in full.
"""
from __future__ import annotations

import hmac
import itertools
import math
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

import msgpack
import numpy as np

# Requests a server shard answers, replies it sends, and the launcher's control messages.
SERVER_OPS = frozenset({"init", "pull", "push", "bye", "state", "stats", "shutdown", "register"})
REPLY_OPS = frozenset({"ok", "params", "error"})
CONTROL_OPS = frozenset({"server_ready", "worker_ready", "go", "worker_done", "worker_progress", "server_progress"})
ALL_OPS = SERVER_OPS | REPLY_OPS | CONTROL_OPS

ALLOWED_DTYPES = {"float32": np.dtype(np.float32)}
DEFAULT_MAX_BYTES = 512 * 2**20
MAX_HEADER_BYTES = 2**20  # the header holds names and small lists; a huge one is an attack
# The launcher's control messages carry a worker's step rows (11 numbers a step) in their header:
# a long run's fit in this (16 MiB: ~150,000 steps), checked after the token like every header.
CONTROL_HEADER_BYTES = 16 * 2**20
# ZMQ_MAXMSGSIZE is a message's byte limit plus this: a frame a little over the limit reaches
# decode and gets its clear error reply; one far over it is dropped by libzmq unread.
FRAME_ALLOWANCE = 64 * 2**10

# Fields every message needs, and their types (bool is excluded from int on purpose).
REQUIRED: dict[str, type] = {"op": str, "worker": int, "step": int, "version": int}
NON_NEGATIVE = ("step", "version")  # a worker's step and a parameter version never go below 0
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
    _arrays: list[np.ndarray] | None = None  # the per-tensor views (a packed message's: made on first use)
    extra: dict[str, Any] = field(default_factory=dict)     # op-specific header fields
    nbytes: int = 0                                          # payload bytes, header included
    # Per array, the zmq frame it views when it came off a socket (writable, nobody else holds it),
    # else None (bytes: read-only).
    owners: list[Any] = field(default_factory=list)
    flat: np.ndarray | None = None  # packed: all tensors' elements as one 1-D view (arrays are views of it)
    shapes: list[list[int]] = field(default_factory=list)  # the header's shapes, validated

    @property
    def arrays(self) -> list[np.ndarray]:
        """Per key, a view on the frames. A packed message's views are made when first asked for:
        the hot path (a push applied to a shard's flat vector, a reply copied into the model's)
        reads `flat` only."""
        if self._arrays is None:
            views, offset = [], 0
            for shape in self.shapes:
                size = math.prod(shape)
                views.append(self.flat[offset:offset + size].reshape(shape))
                offset += size
            self._arrays = views
        return self._arrays

    def tensors(self) -> dict[int, np.ndarray]:
        return dict(zip(self.keys, self.arrays))


@dataclass(frozen=True)
class PackedLayout:
    """The keys, dtypes and shapes of the packed message a worker and a shard exchange every step,
    checked once. `encode(layout=)` writes them; `decode(expect=)` compares a header with them in a
    few list comparisons (element types included, so a bool or float never passes for an int)
    where it would otherwise check every tensor and dimension in Python."""
    keys: list[int]
    shapes: list[list[int]]
    dtypes: list[str] = field(init=False)
    nbytes: int = field(init=False)
    key_types: list[type] = field(init=False)
    dim_types: list[type] = field(init=False)

    def __post_init__(self) -> None:
        if len(self.keys) != len(self.shapes) or len(set(self.keys)) != len(self.keys):
            raise ProtocolError(f"a layout needs distinct keys and one shape per key ({len(self.keys)} keys, "
                                f"{len(self.shapes)} shapes)")
        set_ = object.__setattr__  # frozen: the derived fields are set once, here
        set_(self, "keys", [int(k) for k in self.keys])
        set_(self, "shapes", [[int(d) for d in shape] for shape in self.shapes])
        set_(self, "dtypes", ["float32"] * len(self.keys))
        set_(self, "nbytes", sum(math.prod(shape) for shape in self.shapes) * ALLOWED_DTYPES["float32"].itemsize)
        set_(self, "key_types", [int] * len(self.keys))
        set_(self, "dim_types", [int] * sum(len(shape) for shape in self.shapes))

    def matches(self, keys: list, dtypes: list, shapes: list, packed_frame: memoryview) -> bool:
        """A header's lists (already known to be lists) and its one packed frame describe exactly
        this layout. A shape equal to one of ours is a list (a list equals only a list); its
        dimensions' types are compared too, as a bool equals 1 and a float 64.0 equals 64."""
        return (keys == self.keys and dtypes == self.dtypes and shapes == self.shapes
                and packed_frame.nbytes == self.nbytes and list(map(type, keys)) == self.key_types
                and list(map(type, itertools.chain.from_iterable(shapes))) == self.dim_types)


def encode(op: str, *, worker: int = -1, step: int = 0, version: int = 0, keys: Sequence[int] = (),
           arrays: Sequence[np.ndarray] = (), token: str | None = None,
           send_as: Sequence[Any] | None = None, packed: Any = None,
           layout: PackedLayout | None = None, **extra: Any) -> list[Any]:
    """Frames for send_multipart(copy=False): the header, then each array's own buffer (no copy).
    `send_as[i]`, when not None, is sent in place of arrays[i]: a zmq frame holding exactly its bytes.
    `packed`: one buffer (an array or a zmq frame) holding all tensors' bytes back to back, sent as
    the only tensor frame; the tensors are then described by `arrays` or by `layout` (their dtypes
    and shapes, precomputed: a shard or a worker sends the same layout every step)."""
    if layout is not None:
        dtypes, shapes = layout.dtypes, layout.shapes
        if packed is None or len(dtypes) != len(keys):
            raise ProtocolError(f"a layout needs packed data and one dtype and shape per key ({len(keys)} keys)")
    else:
        if len(keys) != len(arrays):
            raise ProtocolError(f"{len(keys)} keys but {len(arrays)} arrays")
        dtypes = [_DTYPE_NAMES.get(a.dtype) or a.dtype.name for a in arrays]
        shapes = [list(a.shape) for a in arrays]
    if packed is not None and keys:
        extra["packed"] = True
    # the token is the first entry: a receiver checks it before it unpacks anything (decode)
    header: dict[str, Any] = {"token": token, "op": op, "worker": int(worker), "step": int(step),
                              "version": int(version), "keys": [int(k) for k in keys], "dtypes": dtypes,
                              "shapes": shapes, **extra}
    if token is None:
        del header["token"]
    frames: list[Any] = [_pack(header)]
    if packed is not None:
        if keys:
            frames.append(packed)
        return frames
    for i, a in enumerate(arrays):
        owner = send_as[i] if send_as is not None else None
        if owner is not None:
            frames.append(owner)
        else:
            frames.append(a if a.flags.c_contiguous else np.ascontiguousarray(a))
    return frames


_DTYPE_NAMES = {dtype: name for name, dtype in ALLOWED_DTYPES.items()}  # dtype.name is slow (a Python property)
_HEADER_LISTS = ("keys", "dtypes", "shapes")
_NOT_EXTRA = frozenset(REQUIRED) | {"keys", "dtypes", "shapes", "token", "packed"}
_pack = msgpack.Packer(use_bin_type=True, autoreset=True).pack
try:  # the frame type whose memory a received message owns (see Message.owners)
    from zmq import Frame as _ZmqFrame
except ImportError:  # pragma: no cover - pyzmq is a dependency of every PS role
    _ZmqFrame = ()


def _is_uint(v: Any) -> bool:
    return type(v) is int and v >= 0  # bool is a subclass of int, not int itself


def _shows_token(header: memoryview, token: str) -> bool:
    """The header's first entry is "token": `token`, as encode writes it, compared from the header's
    bytes alone (in constant time): nothing is unpacked for a peer that has not shown the token."""
    marker = header[0] if header.nbytes else 0
    at = 1 if 0x80 <= marker <= 0x8f else 3 if marker == 0xde else 5 if marker == 0xdf else 0  # fixmap, map16/32
    expected = _TOKEN_ENTRIES.get(token)
    if expected is None:  # the bytes of a "token": `token` entry (msgpack's shortest encodings, as encode's)
        if len(_TOKEN_ENTRIES) > 8:
            _TOKEN_ENTRIES.clear()
        expected = _TOKEN_ENTRIES[token] = msgpack.packb("token") + msgpack.packb(token)
    return at > 0 and hmac.compare_digest(bytes(header[at:at + len(expected)]), expected)


_TOKEN_ENTRIES: dict[str, bytes] = {}  # a process checks one token or two: their entries, made once


def decode(frames: Sequence[Any], *, token: str | None = None, max_bytes: int = DEFAULT_MAX_BYTES,
           ops: frozenset[str] = ALL_OPS, expect: PackedLayout | None = None,
           max_header_bytes: int = MAX_HEADER_BYTES) -> Message:
    """Validate and unpack a message (frames: zmq.Frame or bytes). Raises ProtocolError.
    Written for speed (every request of a step passes here): plain loops, no generators. `expect`:
    the layout the caller's peer sends every step; a message that matches it exactly skips the
    per-tensor checks (it passes them by construction), any other is checked in full. Checked in
    order of cost: sizes, then the token (from the header's bytes), then the unpacked header."""
    if not frames:
        raise ProtocolError("empty message (no header frame)")
    buffers = [memoryview(f) for f in frames]
    total = 0
    for b in buffers:
        total += b.nbytes
    if total > max_bytes:
        raise ProtocolError(f"message of {total} bytes exceeds the limit of {max_bytes} bytes")
    if buffers[0].nbytes > max_header_bytes:
        raise ProtocolError(f"header of {buffers[0].nbytes} bytes exceeds {max_header_bytes} bytes")
    if token is not None and not _shows_token(buffers[0], token):
        raise ProtocolError("missing or wrong token")
    try:
        # msgpack's own limits default to the input's length (a 1 MiB header may declare a
        # million-element array); these hold what a real header carries (a shard's keys and
        # shapes, a run's step rows, a stats map) with room to spare. Keywords, not **: a dict
        # unpacked per call costs a microsecond.
        header = msgpack.unpackb(buffers[0], raw=False, strict_map_key=True, use_list=True,
                                 max_str_len=max_header_bytes, max_bin_len=max_header_bytes,
                                 max_array_len=max_header_bytes // 16, max_map_len=max_header_bytes // 64)
    except Exception as exc:  # msgpack raises several types for garbage (and ValueError over a limit)
        raise ProtocolError(f"header is not valid msgpack within its limits ({type(exc).__name__}: {exc!s:.80})") from None
    if type(header) is not dict:
        raise ProtocolError(f"header must be a map, got {type(header).__name__}")
    for name, kind in REQUIRED.items():
        if name not in header:
            raise ProtocolError(f"header lacks required field '{name}'")
        value = header[name]
        if type(value) is not kind:  # exact: a bool is not an int here
            raise ProtocolError(f"header field '{name}' must be {kind.__name__}, got {type(value).__name__}")
    for name in NON_NEGATIVE:
        if header[name] < 0:
            raise ProtocolError(f"header field '{name}' must be >= 0, got {header[name]}")
    for name in OPTIONAL_UINT:
        if name in header and not _is_uint(header[name]):
            raise ProtocolError(f"header field '{name}' must be a non-negative int, got {header[name]!r:.40}")
    op = header["op"]
    if op not in ops:
        raise ProtocolError(f"unknown op '{op[:40]}'; allowed: {', '.join(sorted(ops))}")
    keys, dtypes, shapes = header.get("keys", []), header.get("dtypes", []), header.get("shapes", [])
    if not (type(keys) is list and type(dtypes) is list and type(shapes) is list):
        raise ProtocolError("header fields keys, dtypes and shapes must be lists")
    packed = header.get("packed", False)
    if packed is not False and packed is not True:
        raise ProtocolError(f"header field 'packed' must be true or false, got {packed!r:.40}")
    n = len(keys)
    if expect is not None and packed and len(buffers) == 2 and expect.matches(keys, dtypes, shapes, buffers[1]):
        # the layout the caller exchanges every step, checked once (PackedLayout): no per-tensor loop
        frame = frames[1]
        arrays, owners = None, [frame if isinstance(frame, _ZmqFrame) else None] * n
        flat = np.frombuffer(buffers[1], dtype=np.float32)
    else:
        arrays, owners, flat = _check_tensors(keys, dtypes, shapes, packed, frames, buffers)
    extra = {k: v for k, v in header.items() if k not in _NOT_EXTRA}
    return Message(op, header["worker"], header["step"], header["version"], keys, arrays, extra, total, owners, flat,
                   shapes)


def _check_tensors(keys: list, dtypes: list, shapes: list, packed: bool, frames: Sequence[Any],
                   buffers: list[memoryview]) -> tuple[list[np.ndarray] | None, list[Any], np.ndarray | None]:
    """Every key, dtype, shape and frame size of a message, element by element: its per-tensor
    views (None for a packed message: made on first use), their frames, and the packed flat view."""
    n = len(keys)
    frames_expected = (1 if n else 0) if packed else n
    if not (len(dtypes) == len(shapes) == n and len(buffers) - 1 == frames_expected):
        raise ProtocolError(f"header lists {len(keys)} keys, {len(dtypes)} dtypes, {len(shapes)} shapes "
                            f"but the message has {len(buffers) - 1} tensor frames"
                            f"{' (packed: one frame for all)' if packed else ''}")
    for k in keys:
        if not _is_uint(k):
            raise ProtocolError("keys must be non-negative integers")
    if len(set(keys)) != n:
        raise ProtocolError("duplicate keys in one message")
    arrays: list[np.ndarray] | None = None if packed else []
    owners: list[Any] = []
    offset = 0  # packed: where tensor i starts in the one frame
    for i in range(n):
        dtype_name, shape = dtypes[i], shapes[i]
        dtype = ALLOWED_DTYPES.get(dtype_name) if type(dtype_name) is str else None
        if dtype is None:
            raise ProtocolError(f"tensor {i}: dtype {dtype_name!r} not allowed; allowed: {', '.join(ALLOWED_DTYPES)}")
        size = 1
        if type(shape) is list:
            for d in shape:
                if not _is_uint(d):
                    size = -1
                    break
                size *= d
        if type(shape) is not list or size < 0:
            raise ProtocolError(f"tensor {i}: shape must be a list of non-negative integers, got {shape!r}")
        expected = size * dtype.itemsize
        frame = frames[1] if packed else frames[i + 1]
        buf = buffers[1] if packed else buffers[i + 1]
        if packed:
            if offset + expected > buf.nbytes:
                raise ProtocolError(f"tensor {i} (key {keys[i]}): shape {shape} {dtype_name} needs {expected} bytes "
                                    f"at byte {offset} of the packed frame, which has {buf.nbytes}")
            offset += expected
        else:
            if expected != buf.nbytes:
                raise ProtocolError(f"tensor {i} (key {keys[i]}): shape {shape} {dtype_name} needs {expected} "
                                    f"bytes, frame has {buf.nbytes}")
            arrays.append(np.frombuffer(buf, dtype=dtype).reshape(shape))  # type: ignore[union-attr]
        owners.append(frame if isinstance(frame, _ZmqFrame) else None)
    flat = None
    if packed and n:
        if offset != buffers[1].nbytes:
            raise ProtocolError(f"packed frame has {buffers[1].nbytes} bytes, its {n} tensors {offset}")
        flat = np.frombuffer(buffers[1], dtype=np.float32)  # the one allowed dtype
    return arrays, owners, flat


_SNDMORE = 2  # zmq.SNDMORE as a plain int (the enum's arithmetic costs microseconds per frame)


def send_frames(sock: Any, frames: Sequence[Any]) -> None:
    """send_multipart(frames, copy=False) without its per-frame type checks and enum flags."""
    last = len(frames) - 1
    for i, frame in enumerate(frames):
        sock.send(frame, _SNDMORE if i < last else 0, copy=False)


def limit_frames(sock: Any, max_bytes: int) -> None:
    """Bound what libzmq reads into memory for `sock` (set before it binds or connects): a peer's
    frame over max_bytes (+ FRAME_ALLOWANCE) drops its connection before the frame is received, where
    decode would see it only once the whole message sat in memory."""
    import zmq

    sock.setsockopt(zmq.MAXMSGSIZE, int(max_bytes) + FRAME_ALLOWANCE)


def recv_frames(sock: Any) -> list[Any]:
    """recv_multipart(copy=False) reading each frame's own 'more' flag (no getsockopt per frame).
    Raises zmq.Again when the socket's receive timeout passes first."""
    frame = sock.recv(copy=False)
    frames = [frame]
    while frame.more:
        frame = sock.recv(copy=False)
        frames.append(frame)
    return frames


@contextmanager
def zmq_process() -> Iterator[None]:
    """Wrap a PS process's main (shard, worker): on the way out, terminate its zmq context, which
    waits (up to each closed socket's linger) until every queued frame is sent and released.

    Our frames go zero-copy: libzmq's I/O thread reads the numpy memory and, when done, reports to
    pyzmq's garbage-collector thread, which holds the arrays until then. Left to interpreter exit,
    pyzmq's atexit hook stops that thread first, drops the arrays and closes the socket the reports
    go to while the I/O thread is still sending (a slow reader, a loaded machine): the process dies
    with 'Bad address (src/tcp.cpp:227)', a segfault, or 'pfd.revents & POLLIN
    (src/signaler.cpp:238)' (a report sent on the closed socket). Reproduced with 20 frames of
    16 MB to a slow reader: 3 aborts in 3 runs without the term, 3 clean exits with it."""
    import zmq

    try:
        yield
    finally:
        ctx = zmq.Context.instance()
        ctx.destroy()  # closes any socket still open (its linger kept), then terminates


def error_frames(message: str, *, worker: int = -1, token: str | None = None) -> list[Any]:
    return encode("error", worker=worker, token=token, error=message)


def check_error(msg: Message, where: str) -> Message:
    """Raise a PSError if `msg` is an error reply."""
    if msg.op == "error":
        raise PSError(f"{where}: {msg.extra.get('error', 'error')}")
    return msg


class PSError(RuntimeError):
    """An error reply from a server shard, raised on the client side."""
