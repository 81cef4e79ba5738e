"""Nothing is spent on a peer before it is authenticated: a live shard process against an
unauthenticated peer's huge frame and msgpack header bomb (its peak RSS and CPU time, read from
the kernel: tests/wire_attack.py), the token read before the header is unpacked, and msgpack's
container limits for a peer that has the token (or a shard that has none)."""
from __future__ import annotations

import sys
import time

import msgpack
import numpy as np
import pytest

from psbench.systems.ps import protocol
from psbench.systems.ps.worker import ADMIN, KVWorker

import wire_attack
from wire_attack import MIB, header_bomb

TOKEN = "bounded-test-token"
CPU_BUDGET_S = 0.1


@pytest.mark.parametrize("limit_mb, frames", [
    (1, [b"\0" * (300 * MIB)]),                 # far over the limit: libzmq drops the connection unread
    (1, [header_bomb(16 * MIB)]),               # a header bomb over the limit: the same
    (None, [header_bomb(16 * MIB)]),            # the default 512 MiB limit: over the header cap, never unpacked
    (None, [header_bomb(protocol.MAX_HEADER_BYTES)]),  # within the cap: the token is read first, nothing unpacked
], ids=["300MiB-frame", "16MiB-bomb", "16MiB-bomb-default-limit", "1MiB-bomb-default-limit"])
def test_an_unauthenticated_message_costs_the_shard_neither_memory_nor_cpu(limit_mb, frames):
    shard = wire_attack.start_shard(sys.executable, TOKEN, limit_mb)
    try:
        cost = wire_attack.attack(shard, frames)
        size_mib = sum(len(f) for f in frames) / MIB
        # what may be held: the limit's worth (libzmq receives a frame up to it) over twice the idle size
        allowed_mib = 2 * cost.idle_rss_mib + (limit_mb if limit_mb is not None else size_mib)
        print(f"\nlimit {limit_mb or 'default'} MiB, {size_mib:.0f} MiB sent: idle {cost.idle_rss_mib:.0f} MiB, "
              f"peak {cost.peak_rss_mib:.0f} MiB, cpu {cost.cpu_s:.3f} s; {cost.line}")
        assert cost.peak_rss_mib < allowed_mib, cost
        assert cost.cpu_s < CPU_BUDGET_S, cost
        if limit_mb is not None:
            assert cost.line == "the shard closed the connection (no reply)", cost
        else:
            assert cost.line.startswith("error reply: "), cost
            assert ("exceeds" in cost.line) if size_mib > 1 else ("missing or wrong token" in cost.line), cost
        # the shard still serves, and refused without changing anything
        with KVWorker([shard.address], ADMIN, [(3,)], TOKEN, timeout_s=30) as admin:
            stats = admin.stats()[0]
            assert stats["version"] == 0 and stats["applied"] == 0 and stats["keys"] == []
            assert stats["error_log"]["rejected"] == (0 if limit_mb is not None else 1)
            admin.shutdown()
        assert shard.proc.wait(timeout=10) == 0
    finally:
        wire_attack.stop(shard)


def test_the_token_is_checked_before_the_header_is_unpacked(monkeypatch):
    """A bomb of a million empty arrays without the token is refused from its first bytes: msgpack
    is never called on it (with the token, it is, and its limits refuse the bomb)."""
    calls = []
    unpackb = msgpack.unpackb
    monkeypatch.setattr(msgpack, "unpackb", lambda *a, **kw: calls.append(1) or unpackb(*a, **kw))
    bomb = header_bomb(protocol.MAX_HEADER_BYTES)
    with pytest.raises(protocol.ProtocolError, match="missing or wrong token"):
        protocol.decode([bomb], token=TOKEN)
    assert calls == []
    with pytest.raises(protocol.ProtocolError, match="exceeds max_array_len"):
        protocol.decode([bomb])
    assert calls == [1]


@pytest.mark.parametrize("field, value, limit", [
    ("rows", list(range(protocol.MAX_HEADER_BYTES // 16 + 1)), "array"),
    ("rows", {str(i): 0 for i in range(protocol.MAX_HEADER_BYTES // 64 + 1)}, "map"),
])
def test_a_header_within_the_size_cap_still_has_container_limits(field, value, limit):
    """A peer with the token (or a shard without one) gets msgpack's container limits: an array or a
    map longer than a header can need is refused before it is built."""
    header = msgpack.packb({"token": TOKEN, "op": "push", "worker": 0, "step": 0, "version": 0, field: value})
    assert len(header) <= protocol.MAX_HEADER_BYTES
    for token in (TOKEN, None):
        with pytest.raises(protocol.ProtocolError, match=f"not valid msgpack within its limits.*{limit}"):
            protocol.decode([header], token=token)
    # the launcher's control messages (a run's step rows) have the larger cap and limits
    assert protocol.decode([header], token=TOKEN, max_header_bytes=protocol.CONTROL_HEADER_BYTES).op == "push"


def test_the_token_is_the_headers_first_entry_and_nothing_else_passes():
    frames = protocol.encode("push", worker=0, keys=[0], arrays=[np.ones(2, np.float32)], token=TOKEN)
    assert bytes(frames[0]).startswith(b"\x88\xa5token\xb2" + TOKEN.encode())
    assert protocol.decode(frames, token=TOKEN).keys == [0]
    for other in ("bounded-test-tokeN", TOKEN[:-1], TOKEN + "x", ""):
        with pytest.raises(protocol.ProtocolError, match="missing or wrong token"):
            protocol.decode(protocol.encode("push", worker=0, token=other), token=TOKEN)
    for long in ("t" * 200, "t" * 70_000):  # msgpack's str8 and str32
        assert protocol.decode(protocol.encode("pull", worker=0, token=long), token=long).op == "pull"
    for header in (b"", b"\x81", b"\x81\xa5token", b"\x81\xa5token\xd9", b"\x81\xa5token\xb2abc",
                   b"\xde\x00\x01\xa5token\xd9\x05abc"):
        with pytest.raises(protocol.ProtocolError, match="missing or wrong token"):
            protocol.decode([header], token=TOKEN)
