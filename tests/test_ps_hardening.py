"""The shard checks everything before it changes anything: non-finite gradients, liveness,
request ids and duplicates, steps and versions, answers without a request id, and checkpoints that
restore every policy and mitigation bit for bit. In-process shards unless a socket is the point."""
from __future__ import annotations

import threading
import time

import msgpack
import numpy as np
import pytest
import zmq

from psbench.systems.ps import protocol
from psbench.systems.ps.server import ERROR_LOG_KEEP, Shard
from psbench.systems.ps.worker import KVWorker

G = np.ones(3, np.float32)


def frames_bytes(frames):
    return [bytes(memoryview(f)) for f in frames]


def send(shard: Shard, ident: bytes, op: str, worker: int, step: int = 0, arrays=(), **extra) -> None:
    frames = protocol.encode(op, worker=worker, step=step, keys=list(range(len(arrays))), arrays=list(arrays), **extra)
    shard.receive(ident, frames_bytes(frames), None, protocol.DEFAULT_MAX_BYTES)


def replies(shard: Shard) -> list[protocol.Message]:
    out = [protocol.decode(frames_bytes(f)) for _, f in shard.outbox]
    shard.outbox.clear()
    return out


def make_shard(consistency: str = "asp", n: int = 2, **kw) -> Shard:
    kw.setdefault("lr", 0.5)
    shard = Shard(0, n, consistency=consistency, **kw)
    send(shard, b"admin", "init", -1, arrays=[np.arange(3, dtype=np.float32)], rid=0)
    assert replies(shard)[0].extra["initialised"]
    return shard


def counters(shard: Shard) -> dict:
    """The shard's stats without its error log and clocks: what no rejected message may change."""
    return {k: v for k, v in shard.stats().items() if k not in ("error_log", "last_error", "idle_s")}


def state_of(shard: Shard) -> tuple:
    return (shard.version, [shard.params[k].tobytes() for k in shard.keys],
            [shard.momentum[k].tobytes() for k in shard.keys] if shard.momentum else None)


# ---- non-finite gradients -------------------------------------------------------------------------

@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_a_nonfinite_gradient_is_rejected_naming_its_key_and_changes_nothing(bad):
    shard = Shard(0, 1, lr=0.5, momentum=0.9)
    send(shard, b"admin", "init", -1, arrays=[np.zeros(3, np.float32), np.ones(2, np.float32)], rid=0)
    send(shard, b"a", "push", 0, arrays=[G, np.ones(2, np.float32)], want_params=True, rid=1)  # one good update
    replies(shard)
    before, counted = state_of(shard), counters(shard)
    grad = np.ones(2, np.float32)
    grad[1] = bad
    send(shard, b"a", "push", 0, step=1, arrays=[G, grad], want_params=True, rid=2)
    [reply] = replies(shard)
    assert reply.op == "error" and reply.extra["rid"] == 2
    assert "key 1" in reply.extra["error"] and "NaN or inf" in reply.extra["error"]
    assert state_of(shard) == before  # params, momentum and version as they were
    # no counter moved (nonfinite counts pushes skipped under --nonfinite skip, which were answered):
    # the refusal is in the error log
    assert counters(shard) == counted and counted["nonfinite"] == 0 and counted["applied"] == 1
    log = shard.stats()["error_log"]
    assert log["rejected"] == 1 and log["recent"] == [{"kind": "rejected", "worker": 0, "op": "push",
                                                       "error": reply.extra["error"]}]
    # not marked done: the same request id with a finite gradient is a new push and is applied
    send(shard, b"a", "push", 0, step=1, arrays=[G, np.ones(2, np.float32)], want_params=True, rid=2)
    [reply] = replies(shard)
    assert reply.op == "params" and reply.version == 2 and np.isfinite(shard.params[1]).all()


def test_nonfinite_skip_answers_without_applying_and_bsp_averages_the_finite_pushes():
    shard = make_shard("asp", n=1, nonfinite="skip")
    before = state_of(shard)
    send(shard, b"a", "push", 0, arrays=[np.array([1, np.nan, 1], np.float32)], want_params=True, rid=1)
    [reply] = replies(shard)
    assert reply.op == "params" and "staleness" not in reply.extra and reply.version == 0
    assert state_of(shard) == before and shard.stats()["nonfinite"] == 1 and shard.stats()["applied"] == 0
    shard = make_shard("bsp", n=2, nonfinite="skip")
    send(shard, b"a", "push", 0, arrays=[np.full(3, np.inf, np.float32)], want_params=True, rid=1)
    send(shard, b"b", "push", 1, arrays=[np.full(3, 2.0, np.float32)], want_params=True, rid=1)
    out = replies(shard)
    assert [m.op for m in out] == ["params", "params"] and all(m.version == 1 for m in out)
    np.testing.assert_array_equal(shard.params[0], np.arange(3) - 0.5 * 2.0)  # the finite push alone
    assert shard.stats()["nonfinite"] == 1


def test_the_nonfinite_mode_is_validated():
    from psbench.core.errors import ConfigError

    with pytest.raises(ConfigError, match="reject | skip"):
        Shard(0, 1, lr=0.1, nonfinite="ignore")


# ---- every check before any state change ------------------------------------------------------------

def test_a_malformed_push_does_not_revive_a_dropped_worker():
    shard = make_shard("ssp:1", n=2, worker_timeout_s=1.0)
    send(shard, b"a", "pull", 0, rid=1)
    send(shard, b"b", "pull", 1, rid=1)
    replies(shard)
    shard.expire(now=time.monotonic() + 10)  # both silent for 10 s: no longer waited for
    assert shard.dropped == {0, 1} and shard.policy.live == set()
    send(shard, b"b", "push", 1, arrays=[np.ones(4, np.float32)], rid=2)  # wrong shape
    send(shard, b"b", "push", 1, arrays=[np.array([np.nan, 0, 0], np.float32)], rid=3)  # non-finite
    assert [m.op for m in replies(shard)] == ["error", "error"]
    assert shard.dropped == {0, 1} and shard.policy.live == set() and 1 not in shard.last_seen
    send(shard, b"b", "push", 1, arrays=[G], rid=4)  # a good one: it is back
    assert replies(shard)[0].op == "ok" and 1 in shard.policy.live and 1 not in shard.dropped


def test_a_push_bsp_rejects_is_not_marked_done():
    """Worker 0 pushes twice for the open step: the second is refused. Once the step is through,
    a retry of that refused request must be a new push (held for the next step), not answered as
    'applied' from a record of a push that never was."""
    shard = make_shard("bsp", n=2)
    send(shard, b"a", "push", 0, arrays=[G], want_params=True, rid=1)
    send(shard, b"a", "push", 0, arrays=[G], want_params=True, rid=2)
    [refused] = replies(shard)
    assert refused.op == "error" and "pushed twice" in refused.extra["error"] and refused.extra["rid"] == 2
    send(shard, b"b", "push", 1, arrays=[G], want_params=True, rid=1)
    assert [m.version for m in replies(shard)] == [1, 1]
    send(shard, b"a", "push", 0, step=1, arrays=[G], want_params=True, rid=2)  # the retry, a step on
    assert replies(shard) == [] and shard.version == 1  # held: it waits for worker 1's step 1
    assert shard.stats()["duplicates"] == 0


def test_a_retry_of_a_push_bsp_timed_out_on_gets_the_same_error_not_a_new_step():
    """Worker 0's push waits for worker 1, who is gone; the step times out and worker 0 gets an
    error. Its client resends a request every retry_s: a resend that crosses that error on the wire
    must get the same error, not open a new step that waits again and then blames worker 0 too
    (seen in the compose BSP job: 'waiting for worker(s) [0, 1]' where only 1 was lost)."""
    shard = make_shard("bsp", n=2, step_timeout_s=5.0)
    before = state_of(shard)
    send(shard, b"a", "push", 0, arrays=[G], want_params=True, rid=1)
    shard.expire(now=time.monotonic() + 6)
    [timed_out] = replies(shard)
    assert timed_out.op == "error" and "waiting for worker(s) [1]" in timed_out.extra["error"]
    send(shard, b"a", "push", 0, arrays=[G], want_params=True, rid=1)  # the resend
    [again] = replies(shard)
    assert again.op == "error" and again.extra == timed_out.extra and again.extra["rid"] == 1
    assert shard.policy.waiting_requests() == [] and state_of(shard) == before
    log = shard.stats()["error_log"]
    assert shard.stats()["duplicates"] == 1 and (log["timed_out"], log["rejected"]) == (1, 0)
    send(shard, b"a", "push", 0, arrays=[G], want_params=True, rid=2)  # a new request: a new step
    assert replies(shard) == [] and [r.rid for r in shard.policy.waiting_requests()] == [2]


def test_a_duplicate_answer_carries_the_staleness_it_was_applied_with():
    shard = make_shard("asp", n=2)
    send(shard, b"a", "pull", 0, rid=1)
    send(shard, b"b", "pull", 1, rid=1)
    send(shard, b"b", "push", 1, arrays=[G], rid=2)
    send(shard, b"a", "push", 0, arrays=[G], rid=2)  # one update since its pull: staleness 1
    out = replies(shard)
    assert [m.extra.get("staleness") for m in out[2:]] == [0, 1]
    version = shard.version
    send(shard, b"a2", "push", 0, arrays=[G], rid=2)  # its answer was lost: the retry
    [dup] = replies(shard)
    assert dup.op == "ok" and dup.extra["rid"] == 2 and dup.extra["staleness"] == 1
    assert shard.version == version and shard.stats()["duplicates"] == 1
    send(shard, b"a", "push", 0, step=1, arrays=[G], rid=3)
    send(shard, b"a3", "push", 0, arrays=[G], rid=2)  # an older one: its staleness is not known
    dup = replies(shard)[-1]
    assert dup.op == "ok" and dup.extra["rid"] == 2 and "staleness" not in dup.extra


def test_no_rejected_message_changes_a_counter_and_the_error_log_is_bounded():
    """Every kind of refusal, and more of them than the log keeps: the stats' counters stay as they
    were; the error log has how many there were and the newest ERROR_LOG_KEEP of them."""
    shard = make_shard("bsp", n=2, momentum=0.9)
    send(shard, b"a", "push", 0, arrays=[G], want_params=True, rid=1)  # held: the step waits for worker 1
    before, counted = state_of(shard), counters(shard)
    bad = [("push", 0, {"arrays": [np.ones(4, np.float32)]}),                 # wrong shape
           ("push", 0, {"arrays": [np.array([0, np.nan, 0], np.float32)]}),   # non-finite
           ("push", 0, {"arrays": [G], "step": 9}),                           # ahead of its clock
           ("push", 0, {"arrays": [G], "rid": 2}),                            # pushed twice in one bsp step
           ("push", -1, {"arrays": [G]}), ("push", 7, {"arrays": [G]}),       # admin / unknown worker
           ("init", 0, {"arrays": [G], "if_absent": True}), ("stats", 1, {}), ("shutdown", 0, {}),  # admin's
           ("pull", 0, {"want_keys": [5]}), ("state", -1, {"slot": "grads"}), ("register", 0, {"nonce": "n"})]
    rounds = ERROR_LOG_KEEP // len(bad) + 1
    for _ in range(rounds):
        for op, worker, extra in bad:
            send(shard, b"x", op, worker, **extra)
    assert [m.op for m in replies(shard)] == ["error"] * (rounds * len(bad))
    assert state_of(shard) == before and counters(shard) == counted and not shard.stopping
    log = shard.stats()["error_log"]
    assert log["rejected"] == rounds * len(bad) and len(log["recent"]) == ERROR_LOG_KEEP
    assert [e["op"] for e in log["recent"][-len(bad):]] == [op for op, _, _ in bad]


def test_init_stats_and_shutdown_come_from_the_admin_only():
    shard = make_shard("asp", n=2)
    before = state_of(shard)
    for op, extra in (("init", {"arrays": [G], "if_absent": True}), ("stats", {}), ("shutdown", {})):
        send(shard, b"w", op, 1, rid=3, **extra)
        [reply] = replies(shard)
        assert reply.op == "error" and reply.extra["rid"] == 3
        assert reply.extra["error"] == f"{op} is the launcher's request: it comes from worker -1 (admin), got worker 1"
    assert state_of(shard) == before and not shard.stopping and 1 not in shard.last_seen
    send(shard, b"admin", "stats", -1)
    send(shard, b"admin", "shutdown", -1)
    assert [m.op for m in replies(shard)] == ["ok", "ok"] and shard.stopping


def test_a_shard_with_a_token_takes_admin_requests_from_the_admin_carrying_it():
    """Over the socket: a worker id with the right token cannot stop the shard, nor the admin id
    without the token; the admin with it can."""
    from psbench.systems.ps.launch import Cluster
    from psbench.systems.ps.worker import ADMIN

    with Cluster(1, 1, "t0k") as cluster:
        [address] = cluster.start_servers(["--lr", "0.1"])
        with KVWorker([address], 0, [(3,)], "t0k", timeout_s=10) as worker:
            with pytest.raises(protocol.PSError, match="shutdown is the launcher's request"):
                worker.shutdown()
        with KVWorker([address], ADMIN, [(3,)], "guess", timeout_s=10) as stranger:
            with pytest.raises(protocol.PSError, match="wrong token"):
                stranger.shutdown()
        assert cluster.children[0].proc.poll() is None  # still serving
        with KVWorker([address], ADMIN, [(3,)], "t0k", timeout_s=10) as admin:
            assert admin.stats()[0]["error_log"]["rejected"] == 2
            admin.shutdown()
        cluster.wait_servers()


# ---- steps and versions from clients ---------------------------------------------------------------

def test_negative_steps_and_versions_are_refused_by_the_codec():
    for field in ("step", "version"):
        frames = protocol.encode("push", worker=0, keys=[0], arrays=[G], **{field: 0})
        header = msgpack.unpackb(frames[0])
        header[field] = -1
        with pytest.raises(protocol.ProtocolError, match=f"'{field}' must be >= 0"):
            protocol.decode([msgpack.packb(header), bytes(memoryview(G))])


@pytest.mark.parametrize("consistency", ["asp", "bsp", "ssp:1"])
def test_a_step_ahead_of_the_clock_or_a_version_the_shard_never_had_is_refused(consistency):
    shard = make_shard(consistency, n=2)
    before = state_of(shard)
    send(shard, b"a", "push", 0, step=1000, arrays=[G], want_params=True, rid=1)
    send(shard, b"a", "pull", 0, step=1, rid=2)
    send(shard, b"a", "push", 0, step=0, version=7, arrays=[G], want_params=True, rid=3)
    out = replies(shard)
    assert [m.op for m in out] == ["error"] * 3, [m.extra for m in out]
    assert "step 1000 is ahead" in out[0].extra["error"] and "version 7" in out[2].extra["error"]
    assert state_of(shard) == before and shard.policy.clock == {0: 0, 1: 0}
    send(shard, b"a", "push", 0, step=0, arrays=[G], want_params=True, rid=4)  # in step: accepted
    assert shard.policy.clock[0] == 1


def test_a_restored_shard_accepts_workers_that_are_further_on_then_checks_them(tmp_path):
    shard = make_shard("ssp:2", n=1, checkpoint_dir=str(tmp_path))
    for step in range(3):
        send(shard, b"a", "push", 0, step=step, arrays=[G], want_params=True, rid=step + 1)
    shard.save_checkpoint()
    for step in range(3, 6):  # lost in the crash
        send(shard, b"a", "push", 0, step=step, arrays=[G], want_params=True, rid=step + 1)
    replies(shard)
    restored = Shard(0, 1, lr=0.5, consistency="ssp:2", checkpoint_dir=str(tmp_path))
    assert restored.restore(str(tmp_path)) == 3
    # the worker holds version 6 and is at step 6: a restarted shard cannot know, it takes its word
    send(restored, b"a", "push", 0, step=6, version=6, arrays=[G], want_params=True, rid=7)
    send(restored, b"a", "push", 0, step=7, version=4, arrays=[G], want_params=True, rid=8)
    assert [m.op for m in replies(restored)] == ["params", "params"] and restored.policy.clock[0] == 8
    send(restored, b"a", "push", 0, step=20, version=5, arrays=[G], want_params=True, rid=9)  # now it checks
    [reply] = replies(restored)
    assert reply.op == "error" and "step 20 is ahead" in reply.extra["error"]


# ---- request ids ---------------------------------------------------------------------------------

def test_every_answer_echoes_the_request_id():
    shard = Shard(0, 2, lr=0.1, momentum=0.9)
    requests = [("init", -1, {"arrays": [np.zeros(3, np.float32)]}),
                ("init", -1, {"arrays": [np.zeros(3, np.float32)], "slot": "momentum"}),
                ("register", -1, {"nonce": "n"}), ("stats", -1, {}), ("state", -1, {}), ("pull", 0, {}),
                ("push", 0, {"arrays": [G], "want_params": True}), ("push", 1, {"arrays": [G]}),
                ("pull", 0, {"want_keys": [9]}), ("bye", 1, {}), ("shutdown", -1, {})]
    for rid, (op, worker, extra) in enumerate(requests, start=10):
        send(shard, b"x", op, worker, rid=rid, **extra)
        [reply] = replies(shard)
        assert reply.extra.get("rid") == rid, (op, reply.op, reply.extra)


class FakeShard:
    """A ROUTER that answers each request with `answer(request)` frames (in a thread)."""

    def __init__(self, answer):
        self.sock = zmq.Context.instance().socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.port = self.sock.bind_to_random_port("tcp://127.0.0.1")
        self.thread = threading.Thread(target=self._serve, args=(answer,), daemon=True)
        self.thread.start()

    def _serve(self, answer):
        if self.sock.poll(10000):
            ident, *frames = self.sock.recv_multipart()
            self.sock.send_multipart([ident, *answer(protocol.decode(frames))])

    def close(self):
        self.thread.join(timeout=10)
        self.sock.close()


@pytest.mark.parametrize("answer, message", [
    (lambda req: protocol.encode("params", keys=[0], arrays=[np.zeros(3, np.float32)]),
     "sent an answer without a request id while request 0 was in flight"),
    (lambda req: protocol.encode("error", error="message too large"), "without a request id .*message too large"),
    (lambda req: protocol.encode("params", keys=[0], arrays=[np.zeros(3, np.float32)], rid=req.extra["rid"] + 5),
     "an answer to request 5 while request 0"),
])
def test_the_client_takes_no_answer_without_its_request_id(answer, message):
    fake = FakeShard(answer)
    try:
        with KVWorker([f"127.0.0.1:{fake.port}"], 0, [(3,)], timeout_s=10) as kv:
            with pytest.raises(protocol.PSError, match=message):
                kv.pull()
    finally:
        fake.close()


# ---- checkpoints: every policy and mitigation, bit for bit ----------------------------------------

def _drive(shard: Shard, rng: np.random.Generator, steps: range, first_rid: int) -> None:
    """Both workers pull, then push in an order that makes staleness (and uses every mitigation)."""
    rid = first_rid
    for step in steps:
        for w in (0, 1):
            send(shard, b"w%d" % w, "pull", w, step=step, rid=rid)
        for w in ((1, 0) if shard.policy.kind != "bsp" else (0, 1)):
            g = rng.standard_normal(3).astype(np.float32)
            send(shard, b"w%d" % w, "push", w, step=step, arrays=[g], want_params=True, rid=rid + 1)
        rid += 2
        assert all(m.op == "params" for m in replies(shard))


@pytest.mark.parametrize("mitigation", ["none", "staleness-lr", "dc-asgd:0.5", "gap-aware"])
@pytest.mark.parametrize("consistency", ["asp", "bsp", "ssp:1"])
def test_a_checkpoint_round_trip_is_bit_exact(tmp_path, consistency, mitigation):
    kw = dict(lr=0.05, momentum=0.9, weight_decay=0.01, consistency=consistency, mitigation=mitigation,
              checkpoint_dir=str(tmp_path))
    shard = Shard(0, 2, **kw)
    send(shard, b"admin", "init", -1, arrays=[np.linspace(-1, 1, 3, dtype=np.float32)], rid=0)
    assert replies(shard)[0].extra["initialised"]
    _drive(shard, np.random.default_rng(0), range(4), 1)
    shard.save_checkpoint()
    restored = Shard(0, 2, **kw)
    restored.restore(str(tmp_path))
    assert state_of(restored) == state_of(shard)
    assert restored.policy.state_dict() == shard.policy.state_dict()
    # both go on identically: the same pushes (and a retry of the last one) give the same answers,
    # parameters and statistics, bit for bit
    _drive(shard, np.random.default_rng(1), range(4, 7), 100)
    _drive(restored, np.random.default_rng(1), range(4, 7), 100)
    assert state_of(restored) == state_of(shard)
    clocks = ("restored_version", "checkpoints", "idle_s")  # idle_s: seconds since each worker's last message
    assert {k: v for k, v in restored.stats().items() if k not in clocks} == \
        {k: v for k, v in shard.stats().items() if k not in clocks}
    for s in (shard, restored):
        send(s, b"w0", "push", 0, step=6, arrays=[G], want_params=True, rid=105)
    [a], [b] = replies(shard), replies(restored)
    assert a.extra == b.extra and a.version == b.version and a.arrays[0].tobytes() == b.arrays[0].tobytes()
    ours, theirs = shard.mitigation.tensors(), restored.mitigation.tensors()
    assert sorted(ours) == sorted(theirs) and all(ours[k].tobytes() == theirs[k].tobytes() for k in ours)
