"""Wire fuzzing against a live server shard process (loopback): >= 100k random, truncated, oversized,
shape-mismatched and otherwise wrong messages, and well-formed ones that must still be refused
(NaN/inf gradients, steps ahead of the worker's clock, versions the shard never had, negative
steps and versions) and packed messages whose one frame does not fit their tensors. Zero crashes (the process lives and still serves a good pull), zero corrupted
parameters (checksum before/after), every bad message answered with an error reply (counted on our
side and in the shard's error log), and no counter of the shard's changed by any of them. Replays of request ids the shard already applied are
answered as duplicates and change nothing.

Hypothesis drives a few thousand structured cases; a seeded random mutator sends the bulk fast.
PSBENCH_FUZZ_MESSAGES=N sets the bulk size (default 100000); an atheris harness fuzzes
protocol.decode in a subprocess when atheris is importable."""
from __future__ import annotations

import hashlib
import importlib.util
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import msgpack
import numpy as np
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from psbench.systems.common import child_env
from psbench.systems.ps import protocol
from psbench.systems.ps.launch import Cluster
from psbench.systems.ps.worker import ADMIN, KVWorker

TOKEN = "fuzz-token"
SHAPES = [(32, 16), (32,)]  # every tensor >= 128 bytes: a random frame of <= 64 bytes never fits one
N_WORKERS = 2
MAX_MB = 1
BULK = int(os.environ.get("PSBENCH_FUZZ_MESSAGES", "100000"))
HYPOTHESIS_CASES = int(os.environ.get("PSBENCH_FUZZ_HYPOTHESIS", "1000"))
BATCH = 256  # messages in flight at once (the ROUTER answers in order; pipelining keeps it fast)
PRE_APPLIED = 3  # real pushes of worker 0 (request ids 0..2, steps 0..2) before the checksum is taken
CLOCK = {0: PRE_APPLIED, 1: 0}  # the step each worker is at, on the shard


class Live:
    """One shard process, an admin client and a raw DEALER socket; counts what was sent/answered."""

    def __init__(self, cluster: Cluster, address: str):
        self.cluster, self.address = cluster, address
        self.admin = KVWorker([address], ADMIN, SHAPES, TOKEN)
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.SNDHWM, 0)
        self.sock.setsockopt(zmq.RCVHWM, 0)
        self.sock.connect(f"tcp://{address}")
        self.sent = self.errors = 0
        self.extra_errors = 0  # error replies to messages sent outside send_all
        self.non_errors: list[str] = []

    def checksum(self) -> str:
        return hashlib.sha256(b"".join(a.tobytes() for a in self.admin.state())).hexdigest()

    def send_all(self, messages: list[list[bytes]]) -> None:
        """Send in pipelined batches; every message must get exactly one error reply."""
        for i in range(0, len(messages), BATCH):
            batch = messages[i:i + BATCH]
            for frames in batch:
                self.sock.send_multipart(frames, copy=len(frames[-1]) < 65536)
            for _ in batch:
                assert self.sock.poll(30000), f"no reply after {self.sent} answered messages: the shard hangs"
                reply = protocol.decode(self.sock.recv_multipart(), ops=protocol.REPLY_OPS)
                self.sent += 1
                if reply.op == "error" and reply.extra.get("error"):
                    self.errors += 1
                else:
                    self.non_errors.append(reply.op)


@pytest.fixture(scope="module")
def live():
    with Cluster(1, N_WORKERS, TOKEN) as cluster:
        [address] = cluster.start_servers(["--lr", "0.1", "--momentum", "0.9", "--max-message-mb", str(MAX_MB),
                                           "--log-level", "ERROR"])
        server = Live(cluster, address)
        rng = np.random.default_rng(0)
        server.admin.init([rng.standard_normal(s).astype(np.float32) for s in SHAPES])
        with KVWorker([address], 0, SHAPES, TOKEN) as kv:  # request ids 0, 1, 2: replays of them are duplicates
            for step in range(PRE_APPLIED):
                assert kv.push_pull([rng.standard_normal(s).astype(np.float32) for s in SHAPES], step).staleness == 0
        server.before = server.checksum()
        server.counted = counters(server.admin.stats()[0])
        yield server
        server.sock.close()
        server.admin.close()


def counters(stats: dict) -> dict:
    """A shard's stats less its error log, its clocks and the duplicates the replay test answers."""
    return {k: v for k, v in stats.items() if k not in ("error_log", "last_error", "idle_s", "duplicates")}


def _header(**fields) -> bytes:
    base = {"token": TOKEN, "op": "push", "worker": 0, "step": 0, "version": 0, "keys": [0, 1],  # the token first,
            "dtypes": ["float32"] * 2, "shapes": [list(s) for s in SHAPES]}                      # as encode puts it
    base.update(fields)
    return msgpack.packb({k: v for k, v in base.items() if v is not _DROP}, use_bin_type=True)


_DROP = object()
GOOD = [np.ones(s, np.float32).tobytes() for s in SHAPES]


def mutations(rng: random.Random):
    """(category, frames): each is wrong by construction, whatever the random parts are."""
    r = rng.random
    kind = rng.randrange(26)
    if kind == 0:  # random bytes, any number of frames
        return "random", [rng.randbytes(rng.randrange(0, 200)) for _ in range(rng.randrange(1, 4))]
    if kind == 1:  # a valid header cut short
        h = _header()
        return "truncated-header", [h[:rng.randrange(0, len(h))], *GOOD]
    if kind == 2:  # a tensor frame cut short
        i = rng.randrange(2)
        frames = [_header(), *GOOD]
        frames[1 + i] = frames[1 + i][:rng.randrange(0, len(frames[1 + i]))]
        return "truncated-tensor", frames
    if kind == 3:  # a frame too many or too few
        return "frame-count", [_header(), *GOOD, GOOD[1]] if r() < 0.5 else [_header(), GOOD[0]]
    if kind == 4:  # shapes that match the bytes but not the shard's tensors
        shape = rng.choice([[16, 32], [512], [8, 64], [2, 16, 16]])
        return "shape-mismatch", [_header(shapes=[shape, [32]]), GOOD[0], GOOD[1]]
    if kind == 5:  # keys the shard does not hold, or not all of its keys
        keys = rng.choice([[0], [1], [0, 2], [5, 1], [1, 0, 3]])
        frames = [np.ones(SHAPES[k] if k < 2 else (4,), np.float32).tobytes() for k in keys]
        return "wrong-keys", [_header(keys=keys, dtypes=["float32"] * len(keys),
                                      shapes=[list(SHAPES[k]) if k < 2 else [4] for k in keys]), *frames]
    if kind == 6:  # dtypes outside the allow-list
        dtype = rng.choice(["float64", "int8", "<f4", "object", "O", "", 7, None, ["float32"]])
        return "dtype", [_header(dtypes=[dtype, "float32"]), *GOOD]
    if kind == 7:  # required fields of the wrong type, or missing
        name = rng.choice(["op", "worker", "step", "version"])
        value = rng.choice([_DROP, "1", 1.5, None, True, [0], {"a": 1}, b"\x00"])
        if name == "op" and isinstance(value, str):
            value = _DROP
        return "field-type", [_header(**{name: value}), *GOOD]
    if kind == 8:  # worker ids outside 0..N-1 (and not the admin's -1)
        return "worker-range", [_header(worker=rng.choice([N_WORKERS, 99, -2, -(2 ** 40), 2 ** 62])), *GOOD]
    if kind == 9:  # wrong or missing token
        token = rng.choice([_DROP, "", "guess", TOKEN + "x", TOKEN[:-1], 0, None, TOKEN.encode()])
        return "token", [_header(token=token), *GOOD]
    if kind == 10:  # ops a server does not answer
        op = rng.choice(["exec", "", "PUSH", "go", "worker_done", "server_ready", "params", "error", "x" * 300])
        return "op", [_header(op=op), *GOOD]
    if kind == 11:  # a header that is valid msgpack but not a map
        return "not-a-map", [msgpack.packb(rng.choice([[1, 2], 5, "push", None, b"x", 1.5])), *GOOD]
    if kind == 12:  # byte flips in a valid header, plus a tensor frame of odd length (never valid)
        h = bytearray(_header())
        for _ in range(rng.randrange(1, 5)):
            h[rng.randrange(len(h))] = rng.randrange(256)
        return "flip", [bytes(h), GOOD[0], GOOD[1][:-1]]
    if kind == 13:  # list fields of the wrong kind
        name = rng.choice(["keys", "dtypes", "shapes"])
        return "list-type", [_header(**{name: rng.choice([5, "0,1", {"0": 1}, None])}), *GOOD]
    if kind == 14:  # negative, duplicate or non-integer keys
        keys = rng.choice([[-1, 1], [0, 0], [0.0, 1], ["0", 1], [True, 1]])
        return "key-values", [_header(keys=keys), *GOOD]
    if kind == 15:  # a bad request id
        return "rid", [_header(rid=rng.choice([-1, "1", 1.5, None, [1], True])), *GOOD]
    if kind == 16:  # init of an initialised shard (also with NaN)
        bad = np.full(SHAPES[0], np.nan, np.float32).tobytes() if r() < 0.5 else GOOD[0]
        return "init", [_header(op="init", worker=ADMIN), bad, GOOD[1]]
    if kind == 17:  # pulls of keys the shard does not hold
        want = rng.choice([[7], [0, 9], ["a"], [0.5], 3, [None]])
        return "pull-keys", [_header(op="pull", keys=[], dtypes=[], shapes=[], want_keys=want)]
    if kind == 18:  # state of an unknown slot
        return "state-slot", [_header(op="state", worker=ADMIN, keys=[], dtypes=[], shapes=[],
                                      slot=rng.choice(["grads", "", 3, None]))]
    if kind == 19:  # register without a usable nonce, or from a worker that has an id
        if r() < 0.5:
            return "register", [_header(op="register", worker=ADMIN, keys=[], dtypes=[], shapes=[],
                                        nonce=rng.choice([_DROP, "", 5, "n" * 200]))]
        return "register", [_header(op="register", worker=0, keys=[], dtypes=[], shapes=[], nonce="w")]
    if kind == 20:  # push from the admin id, or with negative shape dims
        if r() < 0.5:
            return "push-admin", [_header(worker=ADMIN), *GOOD]
        return "shape-values", [_header(shapes=[[-32, -16], [32]]), *GOOD]
    if kind == 21:  # oversized (rare: each is > 1 MiB on the wire)
        if r() < 0.02:
            return "oversized", [_header(), b"\x00" * (MAX_MB * 2 ** 20 + 1)]
        return "random", [rng.randbytes(rng.randrange(0, 64))]
    # Well-formed (right keys, shapes, dtypes, token) and still refused; request ids include replays
    # of the applied ones (0..2): a duplicate is answered as such only when the push itself is valid.
    worker = rng.randrange(N_WORKERS)
    rid = rng.choice([rng.randrange(PRE_APPLIED), rng.randrange(PRE_APPLIED, 2 ** 40)])
    step, version = rng.randrange(CLOCK[worker] + 1), rng.randrange(PRE_APPLIED + 1)
    grads = [np.random.default_rng(rng.randrange(2 ** 32)).standard_normal(s).astype(np.float32) for s in SHAPES]
    if kind == 22:  # a NaN or inf somewhere in one gradient
        g = grads[rng.randrange(2)].reshape(-1)
        g[rng.randrange(g.size)] = rng.choice([np.nan, np.inf, -np.inf])
        return "nonfinite", _push(worker, step, version, rid, grads)
    if kind == 23:  # a step ahead of the worker's clock (or below 0), on a push or a pull
        step = rng.choice([CLOCK[worker] + 1 + rng.randrange(5), 2 ** rng.randrange(8, 64) - 1, -1 - rng.randrange(9)])
        if r() < 0.5:
            return "step-range", [_header(op="pull", worker=worker, step=step, keys=[], dtypes=[], shapes=[], rid=rid)]
        return "step-range", _push(worker, step, version, rid, grads)
    if kind == 24:  # a version this shard never had (or below 0)
        version = rng.choice([PRE_APPLIED + 1 + rng.randrange(5), 2 ** rng.randrange(8, 64) - 1, -1 - rng.randrange(9)])
        return "version-range", _push(worker, step, version, rid, grads)
    # kind 25: packed (one frame for all tensors): a frame too short or too long, too many frames,
    # a 'packed' that is no bool, or a well-formed packed push with a NaN/inf
    flat = b"".join(g.tobytes() for g in grads)
    head = _header(worker=worker, step=step, version=version, rid=rid, packed=True)
    choice = rng.randrange(4)
    if choice == 0:
        return "packed", [head, flat[:rng.randrange(len(flat))] if r() < 0.5 else flat + b"\x00" * 4 * rng.randrange(1, 9)]
    if choice == 1:
        return "packed", [head, flat, flat[:4 * rng.randrange(1, 9)]]
    if choice == 2:
        return "packed", [_header(packed=rng.choice([1, 0, "yes", None, [True], 1.0])), flat]
    g = np.frombuffer(bytearray(flat), np.float32)
    g[rng.randrange(g.size)] = rng.choice([np.nan, np.inf, -np.inf])
    return "packed", [head, g.tobytes()]


def _push(worker: int, step: int, version: int, rid: int, grads: list[np.ndarray]) -> list[bytes]:
    return [_header(worker=worker, step=step, version=version, rid=rid, want_params=True), *(g.tobytes() for g in grads)]


def test_bulk_mutations_all_rejected(live):
    rng = random.Random(1234)
    categories: dict[str, int] = {}
    sent0, errors0 = live.sent, live.errors
    t0 = time.perf_counter()
    for start in range(0, BULK, 4096):
        messages = []
        for _ in range(min(4096, BULK - start)):
            name, frames = mutations(rng)
            categories[name] = categories.get(name, 0) + 1
            messages.append(frames)
        live.send_all(messages)
    elapsed = time.perf_counter() - t0
    sent = live.sent - sent0
    print(f"\nfuzz bulk: {sent} messages in {elapsed:.1f}s ({sent / elapsed:.0f}/s), "
          f"{live.errors - errors0} error replies; categories: {dict(sorted(categories.items()))}")
    assert sent == BULK
    assert live.non_errors == [], f"bad messages answered without an error: {live.non_errors[:10]}"
    assert live.errors - errors0 == BULK
    assert len(categories) >= 23 and categories.get("oversized", 0) > 0
    assert min(categories[c] for c in ("nonfinite", "step-range", "version-range", "packed")) > BULK // 50


def test_replays_of_applied_request_ids_are_answered_and_change_nothing(live):
    """Worker 0's pushes 0..2 were applied; a replay of any of them (any finite gradient, any step it
    has been at) is answered as a duplicate: the last with the staleness it was applied with (0), the
    older ones with none, and nothing is applied again."""
    rng = random.Random(99)
    n = max(200, BULK // 100)
    for start in range(0, n, BATCH):
        batch = []
        for _ in range(min(BATCH, n - start)):
            rid = rng.randrange(PRE_APPLIED)
            grads = [np.full(s, rng.uniform(-1e3, 1e3), np.float32) for s in SHAPES]
            batch.append((rid, _push(0, rng.randrange(CLOCK[0] + 1), rng.randrange(PRE_APPLIED + 1), rid, grads)))
        for _, frames in batch:
            live.sock.send_multipart(frames)
        for rid, _ in batch:
            assert live.sock.poll(30000)
            reply = protocol.decode(live.sock.recv_multipart(), ops=protocol.REPLY_OPS)
            assert reply.op == "params" and reply.extra["rid"] == rid and reply.version == PRE_APPLIED, reply.extra
            assert reply.extra.get("staleness") == (0 if rid == PRE_APPLIED - 1 else None), reply.extra
    assert live.checksum() == live.before
    assert live.admin.stats()[0]["duplicates"] >= n


# ---- hypothesis: structured headers with arbitrary values ------------------------------------------

values = st.recursive(st.none() | st.booleans() | st.integers(-2 ** 63, 2 ** 64 - 1) | st.floats() | st.text(max_size=20)
                      | st.binary(max_size=20), lambda inner: st.lists(inner, max_size=4)
                      | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=8)
headers = st.fixed_dictionaries(
    {},
    optional={"op": st.sampled_from(["push", "pull", "init", "state", "stats", "register"]) | values,
              "worker": st.sampled_from([ADMIN, 0, 1]) | values,
              "step": st.integers(0, 10) | values, "version": st.integers(0, 10) | values,
              "keys": st.lists(st.integers(-1, 3), max_size=3) | values,
              "dtypes": st.lists(st.sampled_from(["float32", "float64"]), max_size=3) | values,
              "shapes": st.lists(st.lists(st.integers(-1, 40), max_size=3), max_size=3) | values,
              "token": st.sampled_from([TOKEN, "nope"]) | values, "rid": st.integers(-1, 5) | values,
              "want_params": values, "slot": values, "want_keys": values, "nonce": values})
frames_st = st.lists(st.binary(max_size=64), max_size=3)


def expected_error(frames: list[bytes]) -> bool:
    """Our oracle: a message the codec rejects, or a request this shard must refuse. A message
    that is valid by chance (a stats, a pull, a state of params) may get a normal answer."""
    try:
        msg = protocol.decode(frames, token=TOKEN, max_bytes=MAX_MB * 2 ** 20)
    except protocol.ProtocolError:
        return True
    if msg.op == "stats" and msg.worker == ADMIN:  # init, stats and shutdown are the admin's alone
        return False
    if msg.op == "pull" and msg.worker in (ADMIN, 0, 1):
        want = msg.extra.get("want_keys")
        keys_ok = not want or (isinstance(want, list) and all(type(k) is int and k in (0, 1) for k in want))
        in_step = msg.worker == ADMIN or (msg.step <= CLOCK[msg.worker] and msg.version <= PRE_APPLIED)
        return not (keys_ok and in_step)
    if msg.op == "state" and msg.worker in (ADMIN, 0, 1):
        return msg.extra.get("slot", "params") not in ("params", "momentum")
    if msg.op == "init" and msg.worker == ADMIN and msg.extra.get("if_absent") and \
            msg.extra.get("slot", "params") == "params":
        return False
    if msg.op == "register" and msg.worker == ADMIN and isinstance(msg.extra.get("nonce"), str) and \
            1 <= len(msg.extra["nonce"]) <= 128:
        return False  # an id is handed out while any is free (it changes no parameter)
    return True


def test_hypothesis_structured_messages(live):
    checked = {"error": 0, "valid": 0}

    @settings(max_examples=HYPOTHESIS_CASES, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(header=headers, tensors=frames_st)
    def one(header, tensors):
        if header.get("op") in ("shutdown", "bye"):  # valid control of the shard is not a fuzz case
            header["op"] = "nope"
        try:
            head = msgpack.packb(header, use_bin_type=True)
        except (OverflowError, ValueError, TypeError):
            return
        frames = [head, *tensors]
        must_fail = expected_error(frames)
        before = live.errors
        live.send_all([frames]) if must_fail else _send_any(live, frames)
        if must_fail:
            assert live.errors == before + 1, f"accepted: {header} + {len(tensors)} frames"
            checked["error"] += 1
        else:
            checked["valid"] += 1

    one()
    print(f"\nhypothesis: {checked}")
    assert checked["error"] >= HYPOTHESIS_CASES // 2


def _send_any(live: Live, frames: list[bytes]) -> None:
    live.sock.send_multipart(frames)
    assert live.sock.poll(30000)
    protocol.decode(live.sock.recv_multipart(), ops=protocol.REPLY_OPS)


def test_wrong_token_is_rejected(live):
    grads = [np.ones(s, np.float32) for s in SHAPES]
    for token in ("guess", None):
        live.sock.send_multipart(protocol.encode("push", worker=0, keys=[0, 1], arrays=grads, token=token))
        assert live.sock.poll(10000)
        reply = protocol.decode(live.sock.recv_multipart())
        assert reply.op == "error" and "wrong token" in reply.extra["error"]
        live.extra_errors += 1


def test_after_the_fuzz_the_shard_is_alive_unchanged_and_serving(live):
    """Runs last in this module (pytest keeps file order): the verdict on everything sent above."""
    server = live.cluster.children[0].proc
    assert server.poll() is None, "the shard process died"
    assert live.checksum() == live.before, "parameters changed"
    stats = live.admin.stats()[0]
    assert stats["version"] == PRE_APPLIED and stats["applied"] == PRE_APPLIED  # the fixture's, nothing since
    assert stats["error_log"]["rejected"] == live.errors + live.extra_errors and live.errors >= BULK
    assert counters(stats) == live.counted  # every refusal went to the error log, none to a counter
    with KVWorker([live.address], 0, SHAPES, TOKEN) as kv:
        params, version = kv.pull()
        assert version == PRE_APPLIED and [params[k].shape for k in (0, 1)] == SHAPES
    print(f"\nfuzz total: {live.sent} messages answered, {live.errors} error replies, shard logged {stats['error_log']['rejected']}")


# ---- atheris (coverage-guided) on the decoder ------------------------------------------------------

HARNESS = Path(__file__).with_name("atheris_decode.py")
FUZZ_RSS_MB = 2048  # libFuzzer's default allowance for the harness's own memory


def fuzz_rss_limit_mb() -> int:
    """libFuzzer reads the process's peak RSS (getrusage), and Linux hands a child its parent's peak
    at fork and keeps it across exec: a pytest process that once held 3 GB (a test that loaded a large
    data set) would fail the harness at its first check. The allowance counts from that peak."""
    import resource

    return FUZZ_RSS_MB + resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024


@pytest.mark.skipif(importlib.util.find_spec("atheris") is None, reason="atheris is not installed (no wheel here)")
def test_atheris_decode_harness(tmp_path):
    runs = int(os.environ.get("PSBENCH_ATHERIS_RUNS", "50000"))
    proc = subprocess.run([sys.executable, str(HARNESS), f"-runs={runs}", "-seed=1", "-max_len=4096",
                           f"-rss_limit_mb={fuzz_rss_limit_mb()}", f"-artifact_prefix={tmp_path}/"],
                          env=child_env(), capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert f"Done {runs} runs" in out, out[-3000:]
