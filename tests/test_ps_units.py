"""Parameter server pieces in-process: wire format, key partition, optimizer, mitigations, policies."""
from __future__ import annotations

import re
from pathlib import Path

import msgpack
import numpy as np
import pytest
import torch

from psbench.systems.base import parse_options
from psbench.systems.ps import protocol
from psbench.systems.ps.adapter import PSOptions
from psbench.systems.ps.partition import partition_keys
from psbench.systems.ps.policies import (DCASGD, GapAware, StalenessLR, parse_consistency, parse_mitigation,
                                         resolve_step)
from psbench.systems.ps.server import SGD, Shard
from psbench.core.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent


# ---- wire ---------------------------------------------------------------------------------------

def frames_bytes(frames):
    return [bytes(memoryview(f)) for f in frames]


def test_roundtrip_is_exact_and_zero_copy_views():
    a, b = np.arange(12, dtype=np.float32).reshape(3, 4), np.ones(5, np.float32)
    frames = protocol.encode("push", worker=1, step=7, version=3, keys=[4, 5], arrays=[a, b], token="t", want_params=True)
    assert frames[1] is a  # the array itself goes out, no copy
    msg = protocol.decode(frames_bytes(frames), token="t")
    assert (msg.op, msg.worker, msg.step, msg.version, msg.keys) == ("push", 1, 7, 3, [4, 5])
    assert msg.extra == {"want_params": True}
    np.testing.assert_array_equal(msg.arrays[0], a)
    np.testing.assert_array_equal(msg.arrays[1], b)


def test_packed_roundtrip_is_one_frame_of_views():
    a, b = np.arange(12, dtype=np.float32).reshape(3, 4), np.ones(5, np.float32)
    flat = np.concatenate([a.reshape(-1), b])
    frames = protocol.encode("push", worker=1, keys=[4, 5], arrays=[a, b], packed=flat)
    assert len(frames) == 2 and frames[1] is flat  # one frame, the buffer itself
    msg = protocol.decode(frames_bytes(frames))
    assert msg.keys == [4, 5] and "packed" not in msg.extra
    np.testing.assert_array_equal(msg.arrays[0], a)
    np.testing.assert_array_equal(msg.arrays[1], b)
    np.testing.assert_array_equal(msg.flat, flat)
    assert msg.arrays[1].base is not None and np.shares_memory(msg.arrays[1], msg.flat)
    layout = protocol.PackedLayout([4, 5], [[3, 4], [5]])
    same = protocol.encode("push", worker=1, keys=[4, 5], layout=layout, packed=flat)
    assert frames_bytes(same) == frames_bytes(frames)


def packed(shapes, nbytes, n_frames=1, **over):
    header = {"op": "push", "worker": 0, "step": 0, "version": 0, "keys": list(range(len(shapes))),
              "dtypes": ["float32"] * len(shapes), "shapes": shapes, "packed": True}
    header.update(over)
    return [msgpack.packb(header)] + [b"\x00" * nbytes] * n_frames


@pytest.mark.parametrize("frames, message", [
    (packed([[2], [3]], 16), "needs 12 bytes at byte 8 of the packed frame, which has 16"),
    (packed([[2], [3]], 24), "packed frame has 24 bytes, its 2 tensors 20"),
    (packed([[2], [3]], 20, n_frames=2), "but the message has 2 tensor frames (packed: one frame for all)"),
    (packed([[2], [3]], 20, n_frames=0), "but the message has 0 tensor frames (packed: one frame for all)"),
    (packed([[2]], 8, packed="yes"), "'packed' must be true or false"),
    (packed([[2]], 8, packed=1), "'packed' must be true or false"),
])
def test_decode_rejects_bad_packed_messages(frames, message):
    with pytest.raises(protocol.ProtocolError, match=re.escape(message)):
        protocol.decode(frames)


EXPECTED = protocol.PackedLayout([0, 1], [[1, 2], [3]])


def test_decode_of_the_expected_layout_gives_what_the_full_check_gives():
    flat = np.arange(5, dtype=np.float32)
    frames = frames_bytes(protocol.encode("push", worker=0, keys=[0, 1], layout=EXPECTED, packed=flat, rid=3))
    fast, full = protocol.decode(frames, expect=EXPECTED), protocol.decode(frames)
    assert (fast.keys, fast.shapes, fast.extra, fast.nbytes) == (full.keys, full.shapes, full.extra, full.nbytes)
    np.testing.assert_array_equal(fast.flat, flat)
    for a, b in zip(fast.arrays, full.arrays):  # views made on first use, of the one frame
        assert a.shape == b.shape and np.shares_memory(a, fast.flat)
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("frames, message", [
    # equal to the layout in Python (True == 1, 0 == False, 2.0 == 2) but not integers: checked in full
    (packed([[True, 2], [3]], 20), "tensor 0: shape must be a list of non-negative integers"),
    (packed([[1, 2.0], [3]], 20), "tensor 0: shape must be a list of non-negative integers"),
    (packed([[1, 2], [3]], 20, keys=[False, 1]), "keys must be non-negative integers"),
    (packed([[1, 2], [3]], 16), "needs 12 bytes at byte 8 of the packed frame, which has 16"),
    (packed([[1, 2], [3]], 24), "packed frame has 24 bytes, its 2 tensors 20"),
    (packed([[1, 2], [3]], 20, n_frames=2), "but the message has 2 tensor frames"),
])
def test_a_message_that_only_looks_like_the_expected_layout_is_checked_in_full(frames, message):
    for expect in (EXPECTED, None):  # the same error either way
        with pytest.raises(protocol.ProtocolError, match=re.escape(message)):
            protocol.decode(frames, expect=expect)


def good(**over):
    # the token, when given, is the header's first entry (as encode writes it)
    header = {"token": over.pop("token")} if "token" in over else {}
    header.update({"op": "push", "worker": 0, "step": 0, "version": 0, "keys": [0], "dtypes": ["float32"],
                   "shapes": [[2]]})
    header.update(over)
    return [msgpack.packb(header), np.zeros(2, np.float32).tobytes()]


@pytest.mark.parametrize("frames, message", [
    ([], "empty message"),
    ([b"\xc1\xff garbage"], "not valid msgpack"),
    ([msgpack.packb([1, 2])], "must be a map"),
    ([msgpack.packb({"op": "push", "worker": 0, "step": 0})], "lacks required field 'version'"),
    (good(worker="0"), "'worker' must be int"),
    (good(op="rm -rf"), "unknown op"),
    (good(dtypes=["object"]), "dtype 'object' not allowed"),
    (good(shapes=[[3]]), "needs 12 bytes, frame has 8"),
    (good(shapes=[[-2]]), "non-negative"),
    (good(keys=[0, 1]), "2 keys, 1 dtypes"),
    (good()[:1], "1 keys, 1 dtypes, 1 shapes but the message has 0"),
    ([good()[0], b"\x00" * 5], "frame has 5"),  # truncated
])
def test_decode_rejects(frames, message):
    with pytest.raises(protocol.ProtocolError, match=re.escape(message)):
        protocol.decode(frames)


def test_decode_rejects_oversize_and_wrong_token():
    with pytest.raises(protocol.ProtocolError, match="exceeds the limit"):
        protocol.decode(good(), max_bytes=10)
    with pytest.raises(protocol.ProtocolError, match="wrong token"):
        protocol.decode(good(token="nope"), token="secret")
    with pytest.raises(protocol.ProtocolError, match="wrong token"):
        protocol.decode(good(), token="secret")
    assert protocol.decode(good(token="secret"), token="secret").op == "push"
    # the token is read from the header's first entry, before anything is unpacked: elsewhere it is missing
    late = good()
    late[0] = msgpack.packb({**msgpack.unpackb(late[0]), "token": "secret"})
    with pytest.raises(protocol.ProtocolError, match="missing or wrong token"):
        protocol.decode(late, token="secret")


def test_no_pickle_in_ps_package():
    """Every module on a PS network path: the ps package and the network probe."""
    paths = [*(ROOT / "systems" / "ps").rglob("*.py"), ROOT / "bench" / "lab" / "netprobe.py"]
    assert len(paths) >= 10
    for path in paths:
        text = path.read_text()
        assert not re.search(r"\b(import\s+pickle|from\s+pickle|cPickle|dill|cloudpickle|marshal)\b", text), path
        assert not re.search(r"\b(recv_pyobj|send_pyobj|recv_serialized|eval|exec)\(", text), path
        assert "allow_pickle=True" not in text, path
        assert ".loads(" not in text or "json.loads" in text, path


# ---- partition ----------------------------------------------------------------------------------

def test_partition_by_size_contiguous_and_balanced():
    assert partition_keys([8192, 128, 8192, 64, 640, 10], 2) == [[0, 1], [2, 3, 4, 5]]
    assert partition_keys([1, 1, 1, 1], 4) == [[0], [1], [2], [3]]
    assert partition_keys([100, 1, 1, 1], 2) == [[0], [1, 2, 3]]
    rng = np.random.default_rng(0)
    for _ in range(50):
        sizes = rng.integers(1, 1000, size=int(rng.integers(1, 30))).tolist()
        s = int(rng.integers(1, len(sizes) + 1))
        shards = partition_keys(sizes, s)
        assert [k for ks in shards for k in ks] == list(range(len(sizes)))
        assert len(shards) == s and all(shards)
        # balanced: no shard exceeds the ideal share by more than the largest single key
        assert max(sum(sizes[k] for k in ks) for ks in shards) <= sum(sizes) / s + max(sizes)
    with pytest.raises(ConfigError, match="at most 2 server shards"):
        partition_keys([5, 5], 3)


# ---- optimizer and mitigations --------------------------------------------------------------------

def test_sgd_matches_torch_with_momentum_and_weight_decay():
    rng = np.random.default_rng(1)
    w0 = rng.standard_normal((4, 3)).astype(np.float32)
    p = torch.nn.Parameter(torch.from_numpy(w0.copy()))
    opt = torch.optim.SGD([p], lr=0.1, momentum=0.9, weight_decay=0.01)
    sgd, w, buf = SGD(0.9, 0.01), w0.copy(), np.zeros_like(w0)
    for _ in range(5):
        g = rng.standard_normal((4, 3)).astype(np.float32)
        p.grad = torch.from_numpy(g.copy())
        opt.step()
        w_before = w
        w = sgd.step(w, g, buf, 0.1)
        assert w is not w_before  # never in place: a zero-copy reply in flight keeps its values
    np.testing.assert_allclose(w, p.detach().numpy(), rtol=1e-6, atol=1e-6)


def test_mitigations_by_hand():
    g = np.array([1.0, -2.0, 0.5], np.float32)
    w_now = np.array([0.3, 0.0, 1.0], np.float32)
    w_pulled = np.array([0.1, 0.0, 1.5], np.float32)
    # staleness-aware lr: lr / max(1, tau)
    assert StalenessLR().adjust(0, g, 0.1, 4, w_now, w_pulled)[1] == pytest.approx(0.025)
    assert StalenessLR().adjust(0, g, 0.1, 0, w_now, w_pulled)[1] == pytest.approx(0.1)
    # DC-ASGD, lambda 2: g + 2 * g*g*(w_now - w_pulled) = [1 + 2*1*0.2, -2 + 0, 0.5 + 2*0.25*(-0.5)]
    out, lr = DCASGD(2.0).adjust(0, g, 0.1, 3, w_now, w_pulled)
    np.testing.assert_allclose(out, [1.4, -2.0, 0.25], rtol=1e-6)
    assert lr == 0.1
    # gap-aware, first update: avg = |g| = [1, 2, .5]; lr*avg = [.1, .2, .05]; |dw| = [.2, 0, .5]
    # gap = max(1, [2, 0, 10]) = [2, 1, 10]; g' = [.5, -2, .05]
    ga = GapAware()
    out, _ = ga.adjust(0, g, 0.1, 3, w_now, w_pulled)
    np.testing.assert_allclose(out, [0.5, -2.0, 0.05], rtol=1e-5)
    # second update with g2: avg = .9*[1,2,.5] + .1*|g2|, g2 = [3, 0, 0.5] -> avg = [1.2, 1.8, .5]
    g2 = np.array([3.0, 0.0, 0.5], np.float32)
    out, _ = ga.adjust(0, g2, 0.1, 1, w_now, w_pulled)
    np.testing.assert_allclose(out, [3.0 / (0.2 / 0.12), 0.0, 0.5 / 10], rtol=1e-5)


def test_parsers_and_options():
    assert parse_consistency("ssp:3") == ("ssp", 3)
    assert isinstance(parse_mitigation("dc-asgd:0.04"), DCASGD)
    step = resolve_step("auto", "auto", "asp", 4, 0.9)  # one reduction: lr kept, momentum 1 - 0.1 x 4
    assert (step.lr_factor, step.momentum) == (1.0, pytest.approx(0.6)) and step.rule.startswith("momentum")
    assert resolve_step("auto", "auto", "bsp", 4, 0.9).describe()["step_per_sample_vs_sync"] == 1.0
    assert resolve_step("1/n", "auto", "asp", 4, 0.9).momentum == 0.9      # lr / N: momentum kept, never both
    assert resolve_step("auto", "auto", "asp", 16, 0.9).lr_factor == 1 / 16  # 1 - 0.1 x 16 < 0: lr / N instead
    assert resolve_step("auto", "auto", "ssp:2", 1, 0.9).momentum == 0.9
    both = resolve_step("1/n", "scaled", "asp", 8, 0.9)                    # asked for both: taken, and said
    assert both.step_ratio == pytest.approx(1 / 8) and "0.125x" in both.rule
    with pytest.raises(ConfigError, match="momentum_scaling 'half' unknown"):
        resolve_step("auto", "half", "asp", 2, 0.9)
    with pytest.raises(ConfigError, match="momentum alone cannot match"):
        resolve_step("auto", "scaled", "asp", 16, 0.9)
    with pytest.raises(ConfigError, match="not in \\[0, 1\\)"):
        resolve_step("2", "auto", "asp", 8, 0.9)
    assert resolve_step("0.5", "none", "asp", 4, 0.9).lr_factor == 0.5
    opts = parse_options(PSOptions, {"consistency": "ssp:2", "servers": "2", "mitigation": "gap-aware"}, "ps")
    assert opts.servers == 2
    for bad in [{"consistency": "ssp:x"}, {"consistency": "async"}, {"servers": "0"}, {"servers": "two"},
                {"mitigation": "dc-asgd:abc"}, {"mitigation": "magic"}, {"lr_scaling": "-1"},
                {"momentum_scaling": "1.5"}, {"nonfinite": "ignore"},
                {"host": "10.0.0.1"}, {"host": "0.0.0.0"}, {"step_timeout_s": "0"}, {"token_file": "/nonexistent/token"},
                {"token": "on-the-command-line"}, {"nope": 1}]:
        with pytest.raises(ConfigError):
            parse_options(PSOptions, bad, "ps")


# ---- a shard, in-process ------------------------------------------------------------------------

def send(shard: Shard, ident: bytes, op: str, worker: int, step: int = 0, arrays=(), **extra):
    frames = protocol.encode(op, worker=worker, step=step, keys=list(range(len(arrays))), arrays=list(arrays), **extra)
    shard.receive(ident, frames_bytes(frames), None, protocol.DEFAULT_MAX_BYTES)


def replies(shard: Shard) -> list[tuple[bytes, protocol.Message]]:
    out = [(ident, protocol.decode(frames_bytes(f))) for ident, f in shard.outbox]
    shard.outbox.clear()
    return out


def make_shard(consistency: str, n: int = 2, mitigation: str = "none") -> Shard:
    shard = Shard(0, n, lr=1.0, consistency=consistency, mitigation=mitigation)
    send(shard, b"admin", "init", -1, arrays=[np.zeros(3, np.float32)])
    assert replies(shard)[0][1].extra["initialised"]
    return shard


def test_bsp_waits_for_all_then_applies_the_average():
    shard = make_shard("bsp")
    send(shard, b"a", "push", 0, arrays=[np.full(3, 2.0, np.float32)], want_params=True)
    assert replies(shard) == [] and shard.version == 0
    send(shard, b"b", "push", 1, arrays=[np.full(3, 4.0, np.float32)], want_params=True)
    out = replies(shard)
    assert sorted(i for i, _ in out) == [b"a", b"b"]
    for _, m in out:
        assert m.op == "params" and m.extra["staleness"] == 0 and m.version == 1
        np.testing.assert_allclose(m.arrays[0], -3.0)  # w - lr * mean(2, 4)


def test_asp_staleness_counts_updates_since_the_pull():
    shard = make_shard("asp")
    send(shard, b"a", "pull", 0)
    send(shard, b"b", "pull", 1)
    replies(shard)
    for _ in range(3):
        send(shard, b"a", "push", 0, arrays=[np.ones(3, np.float32)], want_params=True)
    send(shard, b"b", "push", 1, arrays=[np.ones(3, np.float32)])
    taus = [m.extra["staleness"] for _, m in replies(shard)]
    assert taus == [0, 0, 0, 3]


def test_ssp_holds_a_worker_more_than_s_ahead():
    shard = make_shard("ssp:1")
    g = [np.ones(3, np.float32)]
    send(shard, b"a", "push", 0, step=0, arrays=g, want_params=True)  # worker 0 now at step 1: 1 - 0 <= 1
    assert len(replies(shard)) == 1
    send(shard, b"a", "push", 0, step=1, arrays=g, want_params=True)  # would be at step 2: held
    assert replies(shard) == []
    send(shard, b"b", "push", 1, step=0, arrays=g, want_params=True)  # slowest now 1: both may go
    assert sorted(i for i, _ in replies(shard)) == [b"a", b"b"]
    send(shard, b"b", "bye", 1)
    for step in (2, 3, 4):  # worker 1 (at step 1) left: nobody to wait for, though 0 runs 3 steps ahead
        send(shard, b"a", "push", 0, step=step, arrays=g, want_params=True)
    send(shard, b"a", "pull", 0, step=5)
    assert [m.op for _, m in replies(shard)] == ["ok", "params", "params", "params", "params"]
    assert shard.policy.max_gap <= 1


def test_bad_push_is_rejected_and_leaves_state_unchanged():
    shard = make_shard("asp")
    before = shard.params[0].copy()
    send(shard, b"a", "push", 0, arrays=[np.ones(4, np.float32)])           # wrong shape
    send(shard, b"a", "push", 5, arrays=[np.ones(3, np.float32)])           # unknown worker
    send(shard, b"a", "push", -1, arrays=[np.ones(3, np.float32)])          # admin cannot push
    send(shard, b"a", "init", -1, arrays=[np.ones(3, np.float32)])          # already initialised
    out = replies(shard)
    assert [m.op for _, m in out] == ["error"] * 4
    assert "does not match the registered" in out[0][1].extra["error"]
    np.testing.assert_array_equal(shard.params[0], before)
    assert shard.version == 0 and shard.error_log.report()["rejected"] == 4


def test_shard_dc_asgd_uses_the_params_the_worker_pulled():
    shard = make_shard("asp", mitigation="dc-asgd:2")  # lr 1, no momentum, w0 = 0
    g = np.array([1.0, 2.0, -1.0], np.float32)
    send(shard, b"a", "pull", 0)                       # worker 0 holds w = 0
    send(shard, b"b", "pull", 1)
    send(shard, b"b", "push", 1, arrays=[g])           # fresh: w = -g = [-1, -2, 1]
    send(shard, b"a", "push", 0, arrays=[g], want_params=True)  # stale by 1
    out = replies(shard)
    assert out[-1][1].extra["staleness"] == 1
    # g' = g + 2*g*g*(w_now - w_pulled) = [1, 2, -1] + 2*[1, 4, 1]*[-1, -2, 1] = [-1, -14, 1]
    np.testing.assert_allclose(out[-1][1].arrays[0], np.array([-1, -2, 1]) - np.array([-1, -14, 1]))


def test_shard_staleness_lr_damps_a_stale_update():
    shard = make_shard("asp", mitigation="staleness-lr")
    g = np.ones(3, np.float32)
    send(shard, b"a", "pull", 0)
    for _ in range(4):
        send(shard, b"b", "push", 1, arrays=[g])       # w = -4 (worker 1 never pulled: tau grows but lr/tau)
    send(shard, b"a", "push", 0, arrays=[g], want_params=True)
    last = replies(shard)[-1][1]
    assert last.extra["staleness"] == 4
    w_before = -(1 + 1 + 1 / 2 + 1 / 3)  # worker 1's own pushes had tau 0, 1, 2, 3
    np.testing.assert_allclose(last.arrays[0], w_before - 1 / 4, rtol=1e-6)


def test_pipelined_push_counts_staleness_and_dc_asgd_from_the_version_it_names():
    shard = make_shard("asp", n=1, mitigation="dc-asgd:2")  # lr 1, no momentum, w0 = 0
    g = np.array([1.0, 2.0, -1.0], np.float32)
    send(shard, b"a", "pull", 0)                                           # sent v0: w = 0
    send(shard, b"a", "push", 0, arrays=[g], want_params=True, based_on=0)  # v1: w = -g, sent
    assert replies(shard)[-1][1].extra["staleness"] == 0
    # the next gradient was computed on v0 (the reply of v1 was still in flight): stale by 1,
    # and DC-ASGD compensates from v0's weights, not from v1's that were sent last
    send(shard, b"a", "push", 0, arrays=[g], want_params=True, based_on=0)
    last = replies(shard)[-1][1]
    assert last.extra["staleness"] == 1 and last.version == 2
    # g' = g + 2*g*g*(w_now - w_v0) = [1, 2, -1] + 2*[1, 4, 1]*[-1, -2, 1] = [-1, -14, 1]
    np.testing.assert_allclose(last.arrays[0], np.array([-1, -2, 1]) - np.array([-1, -14, 1]))
    # a version never sent to this worker falls back to the last send (v2): staleness 0, no error
    send(shard, b"a", "push", 0, arrays=[g], want_params=True, based_on=99)
    assert replies(shard)[-1][1].extra["staleness"] == 0 and not shard.error_log.recent


def test_pipelined_push_is_refused_outside_asp_and_when_malformed():
    for consistency in ("bsp", "ssp:1"):
        shard = make_shard(consistency, n=1)
        send(shard, b"a", "push", 0, arrays=[np.ones(3, np.float32)], based_on=0)
        [(_, msg)] = replies(shard)
        assert msg.op == "error" and "needs consistency asp" in msg.extra["error"] and shard.version == 0
    shard = make_shard("asp", n=1)
    for bad in (-1, "0", True, 1.5):
        send(shard, b"a", "push", 0, arrays=[np.ones(3, np.float32)], based_on=bad)
        [(_, msg)] = replies(shard)
        assert msg.op == "error" and "based_on" in msg.extra["error"]
    assert shard.version == 0 and shard.error_log.report()["rejected"] == 4
    with pytest.raises(ConfigError, match="pipeline needs consistency asp"):
        parse_options(PSOptions, {"consistency": "bsp", "pipeline": "true"}, "ps")
    assert parse_options(PSOptions, {"consistency": "asp", "pipeline": "true"}, "ps").pipeline is True


def test_a_packed_push_updates_like_one_frame_per_key():
    grads = [np.array([1, 2, 3], np.float32), np.array([[4, 5]], np.float32)]
    results = []
    for pack in (False, True):
        shard = Shard(0, 1, lr=0.5, momentum=0.9)
        send(shard, b"admin", "init", -1, arrays=[np.zeros(3, np.float32), np.ones((1, 2), np.float32)])
        frames = protocol.encode("push", worker=0, keys=[0, 1], arrays=grads, want_params=True,
                                 packed=np.concatenate([g.reshape(-1) for g in grads]) if pack else None)
        shard.receive(b"a", frames_bytes(frames), None, protocol.DEFAULT_MAX_BYTES)
        [(_, reply)] = replies(shard)[1:]
        assert reply.op == "params" and reply.flat is not None  # the answer is packed either way
        results.append([a.copy() for a in reply.arrays])
    for a, b in zip(*results):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_allclose(results[1][1], [[-1.0, -1.5]])  # 1 - 0.5 * [4, 5]


def test_a_push_off_a_socket_is_answered_with_its_own_frame():
    """The update is written into the received gradient frame, which goes back by reference."""
    import zmq

    ctx = zmq.Context.instance()
    router, dealer = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER)
    try:
        port = router.bind_to_random_port("tcp://127.0.0.1")
        dealer.connect(f"tcp://127.0.0.1:{port}")
        shard = make_shard("asp", n=1)  # lr 1, w = 0
        g = np.array([1, 2, 3], np.float32)
        dealer.send_multipart(protocol.encode("push", worker=0, keys=[0], arrays=[g], packed=g, want_params=True),
                              copy=False)
        ident, *frames = router.recv_multipart(copy=False)
        shard.receive(ident.bytes, frames, None, protocol.DEFAULT_MAX_BYTES)
        [(_, out)] = shard.outbox
        assert out[1] is frames[1] and shard.flat_frame is frames[1]
        np.testing.assert_array_equal(np.frombuffer(frames[1].buffer, np.float32), -g)
        assert protocol._SNDMORE == zmq.SNDMORE
        protocol.send_frames(router, [ident, *out])
        reply = protocol.decode(protocol.recv_frames(dealer))
        np.testing.assert_array_equal(reply.arrays[0], -g)
    finally:
        router.close(0)
        dealer.close(0)


@pytest.mark.parametrize("lr_scaling, momentum_scaling", [("auto", "auto"), ("1/n", "auto"), ("auto", "scaled"),
                                                          ("0.5", "auto"), ("auto", "0.5")])
@pytest.mark.parametrize("workers", [2, 4, 8, 16])
def test_the_async_step_per_sample_matches_the_synchronous_one(lr_scaling, momentum_scaling, workers):
    """Each rule, from the settings the servers apply: SGD with momentum m and lr takes lr / (1 - m)
    per update. The synchronous phase's update is N batches of b samples at the workload's lr and
    m; an async update is one batch. Their steps per sample agree within 1%."""
    lr, m, b = 0.05, 0.9, 16
    try:
        step = resolve_step(lr_scaling, momentum_scaling, "asp", workers, m)
    except ConfigError:
        assert momentum_scaling == "scaled" and workers > 1 / (1 - m)  # momentum alone cannot reach that far
        return
    sync = lr / ((1 - m) * workers * b)
    asynchronous = lr * step.lr_factor / ((1 - step.momentum) * b)
    assert asynchronous == pytest.approx(sync, rel=0.01), step
    assert step.step_ratio == pytest.approx(1.0, rel=0.01)


def test_a_warmup_ramps_the_step_from_the_first_update():
    """lr:from=0.25,updates=3: the first three updates take 0.25, 0.5 and 0.75 of the lr, then all
    of it; momentum:from=0,updates=2 starts without momentum and reaches the matched one."""
    from psbench.systems.ps.policies import parse_warmup

    shard = Shard(0, 1, lr=1.0, warmup=parse_warmup("lr:from=0.25,updates=3"))
    send(shard, b"admin", "init", -1, arrays=[np.zeros(3, np.float32)])
    replies(shard)
    seen = []
    for _ in range(5):
        send(shard, b"a", "push", 0, arrays=[np.ones(3, np.float32)], want_params=True)
        seen.append(float(replies(shard)[0][1].arrays[0][0]))
    assert seen == pytest.approx([-0.25, -0.75, -1.5, -2.5, -3.5])
    ramp = parse_warmup("momentum:from=0,updates=2")
    assert [ramp.at(k, 0.1, 0.9) for k in range(3)] == [(0.1, 0.0), (0.1, pytest.approx(0.45)), (0.1, 0.9)]
    assert parse_warmup("none").at(0, 0.1, 0.9) == (0.1, 0.9)
    for bad in ["lr", "lr:from=2,updates=10", "momentum:from=1,updates=5", "lr:from=0.1", "lr:from=0.1,updates=0",
                "step:from=0.1,updates=5", "lr:from=0.1,updates=2.5"]:
        with pytest.raises(ConfigError, match="warmup"):
            parse_warmup(bad)
