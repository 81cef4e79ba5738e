"""A parameter-server shard: owns a contiguous range of keys (model tensors), applies gradients with
SGD (momentum, weight decay) under a consistency policy, and answers pulls. `Shard` is the state
machine (no sockets, testable in-process); `serve` runs it behind a zmq ROUTER socket.

Parameters are never updated in place: each update builds new arrays. So a reply that is still
in zmq's send queue (sent zero-copy) keeps the exact values it was sent with, and the per-worker
"what I last sent you" snapshot that DC-ASGD and gap-aware need is a dict of references, free.

Run by hand: `psbench ps-server --bind 127.0.0.1:5555 --shard-id 0 --servers 1 --workers 2 ...`
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np

from systems.ps import protocol
from systems.ps.policies import Mitigation, Policy, Request, make_policy, parse_consistency, parse_mitigation

log = logging.getLogger("psbench.ps.server")
ADMIN = -1  # the worker id of the launcher / operator (init, state, stats, shutdown)


@dataclass
class SGD:
    """torch.optim.SGD's update (dampening 0, no Nesterov), per key, out of place on the weights."""
    momentum: float = 0.0
    weight_decay: float = 0.0

    def step(self, w: np.ndarray, g: np.ndarray, buf: np.ndarray | None, lr: float) -> np.ndarray:
        if self.weight_decay:
            g = g + np.float32(self.weight_decay) * w
        if self.momentum and buf is not None:
            buf *= np.float32(self.momentum)
            buf += g
            g = buf
        out = np.multiply(g, np.float32(-lr))
        out += w
        return out


class Shard:
    def __init__(self, shard_id: int, n_workers: int, lr: float, momentum: float = 0.0, weight_decay: float = 0.0,
                 consistency: str = "asp", mitigation: str = "none", step_timeout_s: float = 60.0):
        self.shard_id = shard_id
        self.n_workers = n_workers
        self.lr = lr
        self.optimizer = SGD(momentum, weight_decay)
        self.consistency = consistency
        self.policy: Policy = make_policy(consistency, n_workers)
        self.mitigation: Mitigation = parse_mitigation(mitigation)
        self.step_timeout_s = step_timeout_s
        self.keys: list[int] = []
        self.shapes: dict[int, tuple[int, ...]] = {}
        self.params: dict[int, np.ndarray] = {}
        self.momentum: dict[int, np.ndarray] = {}
        self.version = 0
        self.pulled_version: dict[int, int] = {}
        self.snapshot: dict[int, dict[int, np.ndarray]] = {}
        self.staleness = Counter()
        self.n_errors = 0
        self.stopping = False
        self.outbox: list[tuple[bytes, list[Any]]] = []

    # ---- what policies call ---------------------------------------------------------------
    def apply(self, grads: dict[int, np.ndarray], workers: list[int]) -> int:
        """One optimizer update from `grads` (already averaged under BSP). Returns its staleness."""
        tau = max(self.version - self.pulled_version.get(w, 0) for w in workers)
        pulled = self.snapshot.get(workers[0], self.params)
        new: dict[int, np.ndarray] = {}
        for k in self.keys:
            w_now = self.params[k]
            g, lr = self.mitigation.adjust(k, grads[k], self.lr, tau, w_now, pulled.get(k, w_now))
            new[k] = self.optimizer.step(w_now, g, self.momentum.get(k), lr)
        self.params = new
        self.version += 1
        self.staleness[tau] += 1
        return tau

    def _params_frames(self, req: Request, op: str, keys: list[int], **extra: Any) -> list[Any]:
        if req.worker != ADMIN:
            self.pulled_version[req.worker] = self.version
            self.snapshot[req.worker] = self.params  # a reference: params are replaced, not mutated
        return protocol.encode(op, worker=req.worker, step=req.step, version=self.version, keys=keys,
                               arrays=[self.params[k] for k in keys], **extra)

    def reply_push(self, req: Request, staleness: int) -> None:
        if req.want_params:
            frames = self._params_frames(req, "params", self.keys, staleness=staleness)
        else:
            frames = protocol.encode("ok", worker=req.worker, step=req.step, version=self.version, staleness=staleness)
        self.outbox.append((req.ident, frames))

    def reply_pull(self, req: Request) -> None:
        self.outbox.append((req.ident, self._params_frames(req, "params", req.keys or self.keys)))

    def reply_error(self, req: Request, text: str) -> None:
        self.error(req.ident, text, req.worker)

    def error(self, ident: bytes, text: str, worker: int = ADMIN) -> None:
        self.n_errors += 1
        log.warning("shard %d: rejected a message from worker %s: %s", self.shard_id, worker, text)
        self.outbox.append((ident, protocol.error_frames(text, worker=worker)))

    # ---- requests -------------------------------------------------------------------------
    def handle(self, ident: bytes, msg: protocol.Message, now: float | None = None) -> None:
        """Act on one decoded message. Everything is checked before any state changes."""
        now = time.monotonic() if now is None else now
        op, w = msg.op, msg.worker
        if op not in protocol.SERVER_OPS:
            raise protocol.ProtocolError(f"op '{op}' is not a request a server answers")
        if not (w == ADMIN or 0 <= w < self.n_workers):
            raise protocol.ProtocolError(f"worker id {w} out of range (0..{self.n_workers - 1}, or -1 for admin)")
        req = Request(ident, w, msg.step, now, want_params=bool(msg.extra.get("want_params", False)))
        if op == "init":
            self._init(req, msg)
        elif op == "stats":
            self.outbox.append((ident, protocol.encode("ok", worker=w, version=self.version, stats=self.stats())))
        elif op == "shutdown":
            self.stopping = True
            self.outbox.append((ident, protocol.encode("ok", worker=w, version=self.version)))
        elif not self.keys:
            raise protocol.ProtocolError(f"shard {self.shard_id} is not initialised yet")
        elif op == "state":
            slot = msg.extra.get("slot", "params")
            source = {"params": self.params, "momentum": self.momentum}.get(slot)
            if source is None or (slot == "momentum" and not self.momentum):
                raise protocol.ProtocolError(f"state slot {slot!r} unknown or empty; allowed: params, momentum")
            self.outbox.append((ident, protocol.encode("params", worker=w, version=self.version, keys=self.keys,
                                                       arrays=[source[k].copy() for k in self.keys])))
        elif op == "pull":
            keys = msg.extra.get("want_keys") or list(self.keys)
            if not isinstance(keys, list) or any(not isinstance(k, int) or isinstance(k, bool) for k in keys):
                raise protocol.ProtocolError("pull's want_keys must be a list of integer keys")
            unknown = sorted(set(keys) - set(self.shapes))
            if unknown:
                raise protocol.ProtocolError(f"pull of key(s) {unknown} not held by shard {self.shard_id} "
                                             f"(keys {self.keys[0]}..{self.keys[-1]})")
            req.keys = keys
            self.policy.pull(self, req) if w != ADMIN else self.reply_pull(req)
        elif op == "push":
            if w == ADMIN:
                raise protocol.ProtocolError("push needs a worker id >= 0")
            self._check_tensors(msg, exact=True)
            req.grads = msg.tensors()
            self.policy.push(self, req)
        elif op == "bye":
            self.policy.bye(self, w)
            self.outbox.append((ident, protocol.encode("ok", worker=w, version=self.version)))

    def _check_tensors(self, msg: protocol.Message, exact: bool) -> None:
        if exact and sorted(msg.keys) != self.keys:
            raise protocol.ProtocolError(f"{msg.op} must carry exactly shard {self.shard_id}'s keys {self.keys}, "
                                         f"got {sorted(msg.keys)}")
        for k, a in zip(msg.keys, msg.arrays):
            if k not in self.shapes:
                raise protocol.ProtocolError(f"key {k} is not held by shard {self.shard_id}")
            if a.shape != self.shapes[k]:
                raise protocol.ProtocolError(f"key {k}: shape {list(a.shape)} does not match the registered "
                                             f"{list(self.shapes[k])}")

    def _init(self, req: Request, msg: protocol.Message) -> None:
        slot = msg.extra.get("slot", "params")
        if_absent = bool(msg.extra.get("if_absent", False))
        if slot == "params":
            if self.keys:
                if if_absent:
                    self.outbox.append((req.ident, protocol.encode("ok", worker=req.worker, version=self.version,
                                                                   initialised=False)))
                    return
                raise protocol.ProtocolError(f"shard {self.shard_id} is already initialised")
            if not msg.keys:
                raise protocol.ProtocolError("init carries no tensors")
            if sorted(msg.keys) != list(range(min(msg.keys), max(msg.keys) + 1)):
                raise protocol.ProtocolError("init keys must be one contiguous range")
            for k, a in zip(msg.keys, msg.arrays):
                if not np.isfinite(a).all():
                    raise protocol.ProtocolError(f"init key {k}: tensor holds NaN or inf")
            self.keys = sorted(msg.keys)
            self.shapes = {k: a.shape for k, a in zip(msg.keys, msg.arrays)}
            self.params = {k: np.array(a, copy=True) for k, a in zip(msg.keys, msg.arrays)}
            self.momentum = ({k: np.zeros_like(a) for k, a in self.params.items()}
                             if self.optimizer.momentum else {})
            self.version = msg.version
            self.policy.reset(msg.step)
            self.pulled_version = {w: msg.version for w in range(self.n_workers)}
        elif slot == "momentum":
            if not self.keys:
                raise protocol.ProtocolError("init of momentum before params")
            if not self.optimizer.momentum:
                raise protocol.ProtocolError("this shard runs without momentum")
            self._check_tensors(msg, exact=True)
            self.momentum = {k: np.array(a, copy=True) for k, a in zip(msg.keys, msg.arrays)}
        else:
            raise protocol.ProtocolError(f"init slot {slot!r} unknown; allowed: params, momentum")
        self.outbox.append((req.ident, protocol.encode("ok", worker=req.worker, version=self.version,
                                                       initialised=True)))

    def expire(self, now: float | None = None) -> None:
        self.policy.expire(self, time.monotonic() if now is None else now, self.step_timeout_s)

    def stats(self) -> dict[str, Any]:
        return {"shard": self.shard_id, "version": self.version, "keys": self.keys,
                "applied": int(sum(self.staleness.values())),
                "staleness_hist": {str(k): int(v) for k, v in sorted(self.staleness.items())},
                "errors": self.n_errors, **self.policy.stats()}

    def receive(self, ident: bytes, frames: list[Any], token: str | None, max_bytes: int) -> None:
        """Decode + handle; a bad message gets an error reply and leaves the state as it was."""
        try:
            msg = protocol.decode(frames, token=token, max_bytes=max_bytes, ops=protocol.ALL_OPS)
            self.handle(ident, msg)
        except protocol.ProtocolError as exc:
            self.error(ident, str(exc))
        except Exception as exc:  # a bug must not take the shard down mid-run; say so loudly
            log.exception("shard %d: internal error", self.shard_id)
            self.error(ident, f"internal server error: {type(exc).__name__}: {exc}")


def serve(shard: Shard, host: str = "127.0.0.1", port: int = 0, token: str | None = None,
          max_bytes: int = protocol.DEFAULT_MAX_BYTES, control: str | None = None,
          parent_pid: int | None = None) -> None:
    """Bind a ROUTER socket and answer until a shutdown request (or the parent process dies)."""
    import zmq

    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 2000)
    sock.setsockopt(zmq.ROUTER_MANDATORY, 0)
    if port:
        sock.bind(f"tcp://{host}:{port}")
    else:
        port = sock.bind_to_random_port(f"tcp://{host}")
    print(f"ps-server shard {shard.shard_id} listening on {host}:{port}", file=sys.stderr, flush=True)
    if control:
        ctl = ctx.socket(zmq.DEALER)
        ctl.setsockopt(zmq.LINGER, 2000)
        ctl.connect(control)
        ctl.send_multipart(protocol.encode("server_ready", token=token, shard=shard.shard_id, port=port))
        ctl.close()
    try:
        while not shard.stopping:
            if sock.poll(200):
                frames = sock.recv_multipart(copy=False)
                shard.receive(frames[0].bytes, frames[1:], token, max_bytes)
            else:
                if parent_pid is not None and os.getppid() != parent_pid:
                    log.warning("shard %d: launcher %d is gone, exiting", shard.shard_id, parent_pid)
                    return
            shard.expire()
            for ident, out in shard.outbox:
                sock.send_multipart([ident, *out], copy=False)
            shard.outbox.clear()
    finally:
        sock.close()


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--bind", default="127.0.0.1:0", help="host:port to listen on (port 0: a free one; default 127.0.0.1:0)")
    p.add_argument("--shard-id", type=int, default=0, help="this shard's index (0..servers-1)")
    p.add_argument("--servers", type=int, default=1, help="number of server shards in the job")
    p.add_argument("--workers", type=int, required=True, help="number of workers in the job")
    p.add_argument("--consistency", default="asp", help="bsp | asp | ssp:S (default asp)")
    p.add_argument("--mitigation", default="none", help="none | staleness-lr | dc-asgd:LAMBDA | gap-aware")
    p.add_argument("--workload", help="take lr/momentum/weight decay defaults from this workload")
    p.add_argument("--lr", type=float, help="learning rate as applied (already scaled)")
    p.add_argument("--lr-scaling", default="auto", help="with --workload's lr: auto | none | 1/n | FACTOR")
    p.add_argument("--momentum", type=float, help="SGD momentum")
    p.add_argument("--weight-decay", type=float, help="SGD weight decay")
    p.add_argument("--step-timeout-s", type=float, default=60.0, help="BSP/SSP wait bound in seconds (default 60)")
    p.add_argument("--max-message-mb", type=float, default=protocol.DEFAULT_MAX_BYTES / 2**20,
                   help="reject messages larger than this (default 512)")
    p.add_argument("--token", help="shared token every message must carry (or env PSBENCH_PS_TOKEN)")
    p.add_argument("--control", help=argparse.SUPPRESS)  # the launcher's control socket
    p.add_argument("--parent-pid", type=int, help=argparse.SUPPRESS)
    p.add_argument("--log-level", default="WARNING", help=argparse.SUPPRESS)


def shard_from_args(args: argparse.Namespace) -> Shard:
    from systems.ps.policies import resolve_lr
    from workloads import get_workload
    from workloads.errors import ConfigError

    parse_consistency(args.consistency)
    parse_mitigation(args.mitigation)
    if args.workers < 1 or not (0 <= args.shard_id < args.servers):
        raise ConfigError(f"need workers >= 1 and 0 <= shard-id < servers, got workers={args.workers} "
                          f"shard-id={args.shard_id} servers={args.servers}")
    lr, momentum, wd = args.lr, args.momentum, args.weight_decay
    if args.workload:
        opt = get_workload(args.workload).optimizer
        lr = lr if lr is not None else opt.lr * resolve_lr(args.lr_scaling, args.consistency, args.workers)
        momentum = momentum if momentum is not None else opt.momentum
        wd = wd if wd is not None else opt.weight_decay
    if lr is None:
        raise ConfigError("give --lr or --workload")
    return Shard(args.shard_id, args.workers, lr, momentum or 0.0, wd or 0.0, args.consistency, args.mitigation,
                 args.step_timeout_s)


def split_address(text: str) -> tuple[str, int]:
    from workloads.errors import ConfigError

    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ConfigError(f"address '{text}' must be host:port, e.g. 127.0.0.1:5555")
    return host, int(port)


def main(args: argparse.Namespace) -> int:
    logging.basicConfig(level=getattr(logging, str(args.log_level).upper(), logging.WARNING),
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    shard = shard_from_args(args)
    host, port = split_address(args.bind)
    token = args.token or os.environ.get("PSBENCH_PS_TOKEN") or None
    serve(shard, host, port, token, int(args.max_message_mb * 2**20), args.control, args.parent_pid)
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m systems.ps.server", description=__doc__.splitlines()[0])
    add_arguments(parser)
    sys.exit(main(parser.parse_args()))
