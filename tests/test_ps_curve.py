"""The PS wire is encrypted where it leaves the machine: a shard and a client on two network
namespace hosts (bench/lab/netlab.py), every frame of the server host's link captured by a raw
packet socket (AF_PACKET, the kernel's tap that tcpdump reads), searched for the job's token and
for the bytes of a known tensor. With CURVE (the default beyond loopback) neither is there;
with it turned off both are, so the test can fail. On loopback, CURVE is off unless asked."""
from __future__ import annotations

import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from psbench.bench.lab import netlab
from psbench.bench.lab.netlab import NetLab
from psbench.core.exposure import TOKEN_ENV, address_host
from psbench.systems.common import child_env
from psbench.systems.ps import curve
from psbench.systems.ps.launch import Cluster
from psbench.systems.ps.worker import ADMIN, KVWorker

REASON = netlab.unavailable_reason()
PY = sys.executable
PORT = 7100

# Every frame in or out of the namespace it runs in, appended raw to argv[1] until SIGTERM.
TAP = """
import signal, socket, sys
out = open(sys.argv[1], "wb")
tap = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003))  # ETH_P_ALL
open(sys.argv[1] + ".ready", "w").close()
signal.signal(signal.SIGTERM, lambda *_: (out.close(), sys.exit(0)))
while True:
    out.write(tap.recv(1 << 18))
"""

# A shard bound to argv[1]:argv[2]; argv[3] "default" (CURVE as the address decides) or "off".
SERVER = """
import sys
from psbench.systems.ps import protocol
from psbench.core.exposure import read_token
from psbench.systems.ps.server import Shard, serve
with protocol.zmq_process():
    serve(Shard(0, 1, lr=0.5), sys.argv[1], int(sys.argv[2]), read_token(None),
          curve=None if sys.argv[3] == "default" else False)
"""

# The admin: loads a tensor of a known byte pattern (argv[3], hex, repeated), reads it back, stops the shard.
CLIENT = """
import sys
import numpy as np
from psbench.core.exposure import read_token
from psbench.systems.ps.worker import ADMIN, KVWorker
pattern = np.frombuffer(bytes.fromhex(sys.argv[3]) * 1024, np.float32)
with KVWorker([sys.argv[1]], ADMIN, [pattern.shape], read_token(None), timeout_s=30,
              curve=None if sys.argv[2] == "default" else False) as admin:
    admin.init([pattern])
    assert admin.state()[0].tobytes() == pattern.tobytes()
    admin.shutdown()
print("ok")
"""


def captured_run(tmp_path: Path, mode: str) -> tuple[bytes, str, bytes]:
    """(every byte the server host's link carried, the token, the tensor's 32-byte pattern)."""
    token = secrets.token_hex(16)
    pattern = np.random.default_rng(7).uniform(1.0, 2.0, 8).astype(np.float32).tobytes()
    capture = tmp_path / f"{mode}.bin"
    env = child_env({TOKEN_ENV: token})
    with NetLab(hosts=2) as lab:
        tap = lab.exec(0, [PY, "-c", TAP, str(capture)], env=env)
        deadline = time.monotonic() + 30
        while not Path(f"{capture}.ready").exists():
            assert tap.poll() is None and time.monotonic() < deadline, "the tap did not start"
            time.sleep(0.02)
        server = lab.exec(0, [PY, "-c", SERVER, "{h0}", str(PORT), mode], env=env, stderr=subprocess.PIPE, text=True)
        lab.wait_listening(0, PORT)
        client = lab.run(1, [PY, "-c", CLIENT, f"{{h0}}:{PORT}", mode, pattern.hex()], env=env, timeout=60)
        assert client.returncode == 0 and client.stdout.strip() == "ok", client.stderr[-2000:]
        assert server.wait(timeout=10) == 0
        banner = server.stderr.read()
        assert ("CURVE-encrypted" in banner) == (mode == "default"), banner
        tap.send_signal(signal.SIGTERM)
        tap.wait(timeout=10)
    return capture.read_bytes(), token, pattern


@pytest.mark.netns
@pytest.mark.skipif(REASON is not None, reason=f"netlab: {REASON}")
@pytest.mark.parametrize("mode", ["default", "off"])
def test_a_cross_host_ps_run_shows_neither_token_nor_tensor_on_the_wire(tmp_path, mode):
    data, token, pattern = captured_run(tmp_path, mode)
    tensor_bytes = 2 * len(pattern) * 1024  # the init and the state reply
    assert len(data) > tensor_bytes, f"captured only {len(data)} bytes"
    clear = mode == "off"
    assert (token.encode() in data) == clear, f"token in the capture: {token.encode() in data} ({mode})"
    assert (pattern in data) == clear, f"tensor bytes in the capture: {pattern in data} ({mode})"


def test_curve_is_off_on_loopback_unless_asked_and_on_beyond_it():
    assert not curve.wanted("127.0.0.1", "t") and not curve.wanted("localhost", "t")
    assert curve.wanted("198.18.0.1", "t") and curve.wanted("0.0.0.0", "t") and curve.wanted("ps-server", "t")
    assert not curve.wanted("198.18.0.1", None)  # --insecure: no token, nothing to derive a key from
    assert curve.wanted("127.0.0.1", "t", True) and not curve.wanted("198.18.0.1", "t", False)
    with pytest.raises(Exception, match="CURVE needs the job's token"):
        curve.wanted("127.0.0.1", None, True)
    assert address_host("tcp://198.18.0.1:7") == "198.18.0.1" and address_host("[::1]:7") == "[::1]"
    # the server key is the token's: the same token, the same key; another token, another key
    assert curve.server_keys("a") == curve.server_keys("a") != curve.server_keys("b")


def test_a_curve_shard_on_loopback_answers_only_curve_clients():
    """--curve on loopback: a CURVE client with the token trains; a plain client gets no answer."""
    token = secrets.token_hex(16)
    with Cluster(1, 1, token) as cluster:
        [address] = cluster.start_servers(["--lr", "0.5", "--curve"])
        with KVWorker([address], ADMIN, [(3,)], token, curve=True) as admin:
            admin.init([np.ones(3, np.float32)])
            # no resend (retry_s > timeout_s): after the failed handshake the socket has no peer, and a
            # resend would block there
            with KVWorker([address], 0, [(3,)], token, timeout_s=1, retry_s=10) as plain:
                with pytest.raises(Exception, match="did not answer"):
                    plain.pull()
            with KVWorker([address], 0, [(3,)], token, curve=True) as kv:
                np.testing.assert_allclose(kv.push_pull([np.ones(3, np.float32)], 0).params[0], 0.5)
            admin.shutdown()
        cluster.wait_servers()
