"""Tiny network probes: a TCP sink/source pair for throughput, and a pyzmq ping-pong for round-trip
time and bandwidth. Used by the netlab tests (between namespaces) and for the analytic scale model's
inputs (on loopback). Run as `python -m psbench.bench.lab.netprobe sink|source ...` inside a namespace.

Only loopback or 198.18.0.0/15 addresses are accepted (the project's network rule).
"""
from __future__ import annotations

import argparse
import ipaddress
import json
import socket
import statistics
import sys
import time
from dataclasses import asdict, dataclass

ALLOWED_NETS = (ipaddress.ip_network("127.0.0.0/8"), ipaddress.ip_network("198.18.0.0/15"))
CHUNK = 1 << 16


def check_address(host: str) -> str:
    """Raise ConfigError unless host is a loopback or 198.18.0.0/15 IPv4 address (or 0.0.0.0 to bind)."""
    try:
        ip = ipaddress.ip_address(host)
        problem = None if str(ip) == "0.0.0.0" or any(ip in net for net in ALLOWED_NETS) else \
            f"address {host} is outside the allowed networks 127.0.0.0/8 and 198.18.0.0/15"
    except ValueError:
        problem = f"address '{host}' is not an IPv4 address; allowed: 127.0.0.0/8 or 198.18.0.0/15"
    if problem:
        # Imported only here: `workloads` pulls in torch, and the probe must start fast in a namespace.
        from psbench.core.errors import ConfigError

        raise ConfigError(problem)
    return host


# ---- TCP throughput -------------------------------------------------------------------------

def tcp_sink(bind: str, port: int, ready_file: str | None = None) -> dict:
    """Accept one connection, read until EOF; report bytes and seconds from first to last byte."""
    check_address(bind)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as srv:
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind((bind, port))
        srv.listen(1)
        if ready_file:
            open(ready_file, "w").close()
        conn, _ = srv.accept()
        with conn:
            total, first, last = 0, None, None
            buf = bytearray(CHUNK)
            while True:
                n = conn.recv_into(buf)
                if not n:
                    break
                now = time.perf_counter()
                first = first if first is not None else now
                last = now
                total += n
    seconds = (last - first) if first is not None and last is not None else 0.0
    return {"bytes": total, "seconds": seconds, "mbit_s": total * 8 / seconds / 1e6 if seconds > 0 else None}


def tcp_source(host: str, port: int, nbytes: int, connect_timeout: float = 10.0) -> dict:
    """Connect (retrying until the sink listens) and send nbytes."""
    check_address(host)
    deadline = time.monotonic() + connect_timeout
    while True:
        try:
            sock = socket.create_connection((host, port), timeout=connect_timeout)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    payload = b"\0" * CHUNK
    start = time.perf_counter()
    with sock:
        sent = 0
        while sent < nbytes:
            sent += sock.send(payload[:min(CHUNK, nbytes - sent)])
        sock.shutdown(socket.SHUT_WR)
        sock.recv(1)  # wait for the sink to close: all bytes delivered
    return {"bytes": sent, "seconds": time.perf_counter() - start}


# ---- pyzmq ping-pong ------------------------------------------------------------------------

@dataclass
class LinkMeasurement:
    rtt_s: float           # median round trip of a small message
    bandwidth_Bps: float   # one-way bytes/s, from round trips of a large message
    message_bytes: int

    def to_dict(self) -> dict:
        return asdict(self)


def zmq_pingpong(host: str = "127.0.0.1", small_rounds: int = 200, big_bytes: int = 4 << 20,
                 big_rounds: int = 8) -> LinkMeasurement:
    """Echo server in a thread (on `host`, an ephemeral port), client here. RTT from small messages;
    bandwidth from large ones: a round trip of S bytes each way costs rtt + 2*S/B."""
    import threading

    import zmq

    check_address(host)
    ctx = zmq.Context.instance()
    rep = ctx.socket(zmq.REP)
    port = rep.bind_to_random_port(f"tcp://{host}")

    def echo() -> None:
        while True:
            msg = rep.recv(copy=False)
            rep.send(msg, copy=False)
            if len(msg) == 0:
                return

    thread = threading.Thread(target=echo, daemon=True)
    thread.start()
    req = ctx.socket(zmq.REQ)
    req.connect(f"tcp://{host}:{port}")
    try:
        small = b"x" * 8
        for _ in range(20):  # warm-up
            req.send(small)
            req.recv()
        rtts = []
        for _ in range(small_rounds):
            t = time.perf_counter()
            req.send(small)
            req.recv()
            rtts.append(time.perf_counter() - t)
        rtt = statistics.median(rtts)
        big = bytes(big_bytes)
        req.send(big)
        req.recv()
        bigs = []
        for _ in range(big_rounds):
            t = time.perf_counter()
            req.send(big, copy=False)
            req.recv(copy=False)
            bigs.append(time.perf_counter() - t)
        big_rtt = statistics.median(bigs)
        bandwidth = 2 * big_bytes / max(big_rtt - rtt, 1e-9)
        req.send(b"")
        req.recv()
    finally:
        thread.join(timeout=2)
        req.close(linger=0)
        rep.close(linger=0)
    return LinkMeasurement(rtt_s=rtt, bandwidth_Bps=bandwidth, message_bytes=big_bytes)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m psbench.bench.lab.netprobe", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("sink", help="receive one TCP stream, print JSON {bytes, seconds, mbit_s}")
    s.add_argument("--bind", required=True)
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--ready-file", help="touched once listening")
    c = sub.add_parser("source", help="send N bytes over TCP, print JSON {bytes, seconds}")
    c.add_argument("--host", required=True)
    c.add_argument("--port", type=int, required=True)
    c.add_argument("--bytes", type=int, required=True)
    z = sub.add_parser("pingpong", help="pyzmq round-trip time and bandwidth on one address")
    z.add_argument("--host", default="127.0.0.1")
    args = p.parse_args(argv)
    try:
        if args.cmd == "sink":
            out = tcp_sink(args.bind, args.port, args.ready_file)
        elif args.cmd == "source":
            out = tcp_source(args.host, args.port, args.bytes)
        else:
            out = zmq_pingpong(args.host).to_dict()
    except ValueError as exc:  # ConfigError is a ValueError
        print(f"netprobe: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
