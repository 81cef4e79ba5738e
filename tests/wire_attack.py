"""An unauthenticated peer against a live shard process: what one message costs the shard before
it is refused. The attack is raw zmq frames (no psbench encoding), so the same helper measures
any version of the shard: start one with `start_shard(python, ...)`, then `attack(...)`.

A shard's cost is read from the kernel: its peak resident memory (VmHWM in /proc/PID/status) and
its CPU time (user + system, every thread: libzmq's I/O thread reads the bytes)."""
from __future__ import annotations

import os
import struct
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import msgpack
import psutil
import zmq
import zmq.utils.monitor

MIB = 2**20


def header_bomb(nbytes: int) -> bytes:
    """A msgpack header of `nbytes`: one array of empty arrays (each empty array is one byte on
    the wire and a Python list once unpacked)."""
    n = nbytes - 5
    return b"\xdd" + struct.pack(">I", n) + b"\x90" * n


def vm_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def cpu_s(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


@dataclass
class Shard:
    proc: subprocess.Popen
    address: str


def start_shard(python: str, token: str, max_message_mb: float | None, cwd: str | None = None) -> Shard:
    """A shard process on a free loopback port, its token in its environment."""
    argv = [python, "-m", "psbench.systems.ps.server", "--bind", "127.0.0.1:0", "--workers", "1", "--lr", "0.1"]
    if max_message_mb is not None:
        argv += ["--max-message-mb", str(max_message_mb)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PSBENCH_")}
    env["PSBENCH_PS_TOKEN"] = token
    proc = subprocess.Popen(argv, env=env, cwd=cwd, stderr=subprocess.PIPE, text=True, start_new_session=True)
    line = proc.stderr.readline()  # "ps-server shard 0 listening on 127.0.0.1:PORT"
    if "listening on" not in line:
        proc.kill()
        raise RuntimeError(f"shard did not start: {line}{proc.stderr.read()}")
    return Shard(proc, line.split("listening on")[1].strip())


@dataclass
class Cost:
    idle_rss_mib: float    # before the attack
    peak_rss_mib: float    # VmHWM after it
    cpu_s: float           # the shard's CPU time spent from just before the attack to its end
    line: str              # what the attacker saw: the shard's error reply, or the connection dropped


def attack(shard: Shard, frames: list[bytes], timeout_s: float = 120.0) -> Cost:
    """Send `frames` as one message from a fresh connection and wait for the shard's verdict: an
    error reply, or the shard dropping the connection (libzmq refusing a frame over ZMQ_MAXMSGSIZE)."""
    pid = shard.proc.pid
    time.sleep(0.3)  # past start-up: the idle loop only
    idle = vm_kib(pid, "VmRSS") / 1024
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    monitor = sock.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
    sock.connect(f"tcp://{shard.address}")
    try:
        assert monitor.poll(10_000) and zmq.utils.monitor.recv_monitor_message(monitor)["event"] == zmq.EVENT_CONNECTED
        cpu0 = cpu_s(pid)
        sock.send_multipart(frames, copy=False)
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        poller.register(monitor, zmq.POLLIN)
        events = dict(poller.poll(timeout_s * 1000))
        if sock in events:
            header = msgpack.unpackb(sock.recv_multipart()[0], raw=False)
            line = f"error reply: {header.get('error')}" if header.get("op") == "error" else f"reply {header.get('op')}"
        elif monitor in events:
            event = zmq.utils.monitor.recv_monitor_message(monitor)["event"]
            line = ("the shard closed the connection (no reply)" if event == zmq.EVENT_DISCONNECTED
                    else f"monitor event {event}")
        else:
            line = f"no answer within {timeout_s:.0f} s"
        time.sleep(0.2)  # anything the shard still does with it
        return Cost(idle, vm_kib(pid, "VmHWM") / 1024, cpu_s(pid) - cpu0, line)
    finally:
        sock.disable_monitor()
        monitor.close()
        sock.close()


def stop(shard: Shard) -> None:
    if shard.proc.poll() is None:
        shard.proc.kill()
    shard.proc.wait()


if __name__ == "__main__":  # the figures for one shard version: python tests/wire_attack.py PYTHON [CWD]
    python, cwd = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else None)
    for limit, name, frames in [(1, "300 MiB frame", [b"\0" * (300 * MIB)]),
                                (1, "16 MiB header bomb", [header_bomb(16 * MIB)]),
                                (None, "16 MiB header bomb", [header_bomb(16 * MIB)])]:
        shard = start_shard(python, "attack-test-token", limit, cwd)
        try:
            cost = attack(shard, frames)
        finally:
            stop(shard)
        print(f"limit {limit or 'default'} MiB, {name}: idle {cost.idle_rss_mib:.0f} MiB, peak {cost.peak_rss_mib:.0f} "
              f"MiB, cpu {cost.cpu_s:.3f} s; {cost.line}", flush=True)
