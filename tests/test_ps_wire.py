"""A real server shard process on a real socket: bad frames get error replies, the shard keeps
serving with unchanged parameters, and it exits cleanly on shutdown."""
from __future__ import annotations

import hashlib

import msgpack
import numpy as np
import psutil
import zmq

from psbench.systems.ps import protocol
from psbench.systems.ps.launch import Cluster
from psbench.systems.ps.worker import ADMIN, KVWorker

TOKEN = "s3cret"
SHAPES = [(4, 3), (3,)]


def checksum(kv: KVWorker) -> str:
    return hashlib.sha256(b"".join(a.tobytes() for a in kv.state())).hexdigest()


def raw_request(sock: zmq.Socket, frames: list) -> protocol.Message:
    sock.send_multipart(frames)
    assert sock.poll(10000), "the server did not answer"
    return protocol.decode(sock.recv_multipart())


def test_server_rejects_bad_frames_and_keeps_serving():
    with Cluster(1, 1, TOKEN) as cluster:
        [address] = cluster.start_servers(["--lr", "0.5", "--momentum", "0.9", "--max-message-mb", "1"])
        server_pid = cluster.children[0].proc.pid
        with KVWorker([address], ADMIN, SHAPES, TOKEN) as admin, KVWorker([address], 0, SHAPES, TOKEN) as kv:
            admin.init([np.ones(s, np.float32) for s in SHAPES])
            before = checksum(kv)
            sock = zmq.Context.instance().socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(f"tcp://{address}")
            grads = [np.ones(s, np.float32) for s in SHAPES]
            ok = protocol.encode("push", worker=0, keys=[0, 1], arrays=grads, token=TOKEN)
            bad = {
                "malformed header": [b"\x92not msgpack", *ok[1:]],
                "truncated tensor": [ok[0], bytes(memoryview(ok[1]))[:20], ok[2]],
                # just over the limit: refused with a clear error (far over it, libzmq drops the
                # connection unread: tests/test_ps_bounded.py)
                "oversized": [ok[0], b"\x00" * (2**20 + 1)],
                "wrong dtype": protocol.encode("push", worker=0, keys=[0, 1], token=TOKEN,
                                               arrays=[g.astype(np.float64) for g in grads]),
                "wrong shape": protocol.encode("push", worker=0, keys=[0, 1], token=TOKEN,
                                               arrays=[np.ones((3, 4), np.float32), grads[1]]),
                "wrong token": protocol.encode("push", worker=0, keys=[0, 1], arrays=grads, token="guess"),
                "no token": protocol.encode("push", worker=0, keys=[0, 1], arrays=grads),
                "missing keys": protocol.encode("push", worker=0, keys=[0], arrays=grads[:1], token=TOKEN),
                "unknown op": [msgpack.packb({"token": TOKEN, "op": "exec", "worker": 0, "step": 0, "version": 0})],
                "pickle bytes": [b"\x80\x04\x95\x05\x00\x00\x00\x00\x00\x00\x00K\x01."],
            }
            for name, frames in bad.items():
                reply = raw_request(sock, [bytes(memoryview(f)) for f in frames])
                assert reply.op == "error", name
                assert reply.extra["error"], name
            assert checksum(kv) == before  # nothing was applied
            assert psutil.Process(server_pid).is_running()
            # ... and it still serves: a good push is applied
            reply = kv.push([0, 1], grads, want_params=True)
            assert reply.version == 1
            np.testing.assert_allclose(reply.params[0], 0.5)  # 1 - 0.5 * 1
            stats = admin.stats()[0]
            assert stats["error_log"]["rejected"] == len(bad) and stats["applied"] == 1
            sock.close()
            admin.shutdown()
        cluster.wait_servers()
        assert cluster.children[0].proc.returncode == 0
    assert not psutil.pid_exists(server_pid) or psutil.Process(server_pid).status() == psutil.STATUS_ZOMBIE


def test_role_commands_by_hand(tmp_path):
    """`psbench ps-server` and `psbench ps-worker` as an operator would start them on two hosts."""
    import json
    import socket
    import subprocess
    import sys

    from psbench.systems.common import child_env

    with socket.socket() as s:  # a free port for the operator's --bind
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = child_env({"PSBENCH_PS_TOKEN": TOKEN})
    server = subprocess.Popen([sys.executable, "-m", "psbench.bench.cli", "ps-server", "--bind", f"127.0.0.1:{port}",
                               "--workers", "1", "--workload", "logreg-digits", "--consistency", "ssp:1"],
                              env=env, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        out = tmp_path / "w0.json"
        worker = subprocess.run([sys.executable, "-m", "psbench.bench.cli", "ps-worker", "--servers", f"127.0.0.1:{port}",
                                 "--worker-id", "0", "--workload", "logreg-digits", "--max-steps", "20", "--init",
                                 "--out", str(out)], env=env, capture_output=True, text=True, timeout=120)
        assert worker.returncode == 0, worker.stderr[-2000:]
        rows = json.loads(out.read_text())["rows"]
        assert rows["step"] == list(range(20)) and set(rows["staleness"]) == {0}
        with KVWorker([f"127.0.0.1:{port}"], -1, [(10, 64), (10,)], TOKEN) as admin:
            assert admin.stats()[0]["applied"] == 20
            admin.shutdown()
        assert server.wait(timeout=10) == 0
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()


# A PS process (shard or worker) whose last zero-copy frames are still being sent when it exits:
# 12 frames of 8 MB to a reader that starts reading a second later.
_SENDER = """
import sys
import numpy as np
import zmq
from psbench.systems.ps.protocol import send_frames, zmq_process

def send():
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 30000)
    sock.connect(sys.argv[1])
    for i in range(12):
        send_frames(sock, [b"h", np.full(2 * 2**20, i, np.float32)])
    sock.close()

if sys.argv[2] == "wrapped":
    with zmq_process():
        send()
else:
    send()
"""


def _send_and_exit(how: str) -> tuple[int, list[float], str]:
    import subprocess
    import sys
    import time

    from psbench.systems.common import child_env

    ctx = zmq.Context.instance()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    try:
        child = subprocess.Popen([sys.executable, "-c", _SENDER, f"tcp://127.0.0.1:{port}", how], env=child_env(),
                                 stderr=subprocess.PIPE, text=True)
        time.sleep(1.0)  # a slow reader: the sender reaches exit with most frames still queued
        got = []
        while router.poll(5000 if not got else 2000):
            _, _, data = router.recv_multipart()
            got.append(float(np.frombuffer(data, np.float32)[0]))
        return child.wait(timeout=60), got, child.stderr.read()
    finally:
        router.close()


def test_a_ps_process_exits_only_once_its_zero_copy_frames_are_sent():
    """protocol.zmq_process (the shard's and the worker's main run in it): the context is terminated
    before the interpreter exits, so queued zero-copy frames are all sent and released. Without it
    the same sender dies at exit ('Bad address (src/tcp.cpp:227)', a segfault, or libzmq's
    'pfd.revents & POLLIN (src/signaler.cpp:238)' abort seen in a PS worker under load)."""
    rc, got, err = _send_and_exit("wrapped")
    assert rc == 0 and got == [float(i) for i in range(12)], (rc, got, err[-500:])
