"""A parameter-server shard: owns a contiguous range of keys (model tensors), applies gradients with
SGD (momentum, weight decay) under a consistency policy, and answers pulls. `Shard` is the state
machine (no sockets, testable in-process); `serve` runs it behind a zmq ROUTER socket.

Parameters are never updated in place: each update builds new arrays. So a reply that is still
in zmq's send queue (sent zero-copy) keeps the exact values it was sent with, and the per-worker
record of what was sent (the w_pulled that DC-ASGD and gap-aware need) holds references, free.
The new arrays are, where it can be, the pushed gradient's own received frame: the update is
written into it and the frame goes back in the reply by reference (no allocation, no copy, and no
work for pyzmq's garbage-collector thread, which a zero-copy send of a numpy array costs).
A pipelined worker (`--pipeline`) computes on the parameters of the reply before the last one and
says so (`based_on`); so the record keeps each worker's last SENT_HISTORY sends.

`handle` checks a message completely before it changes anything: a message that fails a check
gets one error reply and leaves the shard as it was, liveness and request-id records and every
counter included; the refusal is written to the shard's error log (`ErrorLog`), kept apart from
its state. The job's own requests (init, stats, shutdown) come from the admin id only, and, when
the shard has a token, carry it like every message.

Run by hand: `psbench ps-server --bind 127.0.0.1:5555 --shard-id 0 --servers 1 --workers 2 ...`
"""
from __future__ import annotations

import argparse
import logging
import math
import sys
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from psbench.core.supervisor import watch_launcher
from psbench.systems.ps import checkpoint, protocol
from psbench.core.exposure import add_token_argument, check_exposure, split_address, token_from_args
from psbench.systems.ps.curve import secure_server
from psbench.systems.ps.curve import wanted as curve_wanted
from psbench.systems.ps.policies import (Mitigation, Policy, Request, Warmup, make_policy, parse_consistency,
                                         parse_mitigation, parse_warmup)

log = logging.getLogger("psbench.ps.server")
ADMIN = -1  # the worker id of the launcher / operator (init, state, stats, shutdown)
SENT_HISTORY = 2  # (version, params) sends remembered per worker: a pipelined push is one reply behind
NONFINITE_MODES = ("reject", "skip")
ADMIN_OPS = frozenset({"init", "stats", "shutdown"})  # the launcher's / operator's requests (and register)
ERROR_LOG_KEEP = 50  # the newest error replies a shard's error log keeps


@dataclass
class ErrorLog:
    """The error replies a shard sent, kept apart from its state: a message a check refused
    ("rejected") changes no counter of the shard's and is written here instead, as is a held
    request a policy gave up on ("timed_out") and a bug caught while handling one ("internal").
    The newest `keep` entries and how many of each kind there were (reported in stats under
    'error_log')."""
    keep: int = ERROR_LOG_KEEP
    totals: Counter = field(default_factory=Counter)
    recent: deque = field(init=False)

    def __post_init__(self) -> None:
        self.recent = deque(maxlen=self.keep)

    def add(self, kind: str, worker: int, op: str | None, text: str) -> None:
        self.totals[kind] += 1
        self.recent.append({"kind": kind, "worker": worker, "op": op, "error": text})

    @property
    def last(self) -> str:
        return self.recent[-1]["error"] if self.recent else ""

    def report(self) -> dict[str, Any]:
        return {**{k: int(self.totals[k]) for k in ("rejected", "timed_out", "internal")}, "recent": list(self.recent)}


@dataclass
class SGD:
    """torch.optim.SGD's update (dampening 0, no Nesterov), out of place on the weights. (numpy, two
    passes: torch's fused add, tried here, was slower on a buffer it also writes, and its per-call
    cost doubled a small model's update.)"""
    momentum: float = 0.0
    weight_decay: float = 0.0

    def step(self, w: np.ndarray, g: np.ndarray, buf: np.ndarray | None, lr: float,
             out: np.ndarray | None = None, momentum: float | None = None) -> np.ndarray:
        """The new weights, in `out` if given (it may be g's own buffer, never w's). `buf` (the
        momentum) is updated in place; `momentum` overrides the optimizer's for this step (a ramp)."""
        momentum = self.momentum if momentum is None else momentum
        if self.weight_decay:
            g = g + np.float32(self.weight_decay) * w
        if self.momentum and buf is not None:
            buf *= np.float32(momentum)
            buf += g
            g = buf
        out = np.multiply(g, np.float32(-lr), out=out)
        out += w
        return out


def all_finite(a: np.ndarray) -> bool:
    """No NaN or inf in `a`. dot(a, a) is finite exactly when every element is (a NaN or inf
    propagates and squares cannot cancel one), unless finite values overflow it: then look at each
    element. One BLAS pass, no temporary (np.isfinite(a).all() allocates a mask)."""
    flat = a.reshape(-1)
    return bool(np.isfinite(np.dot(flat, flat))) or bool(np.isfinite(flat).all())


class Shard:
    def __init__(self, shard_id: int, n_workers: int, lr: float, momentum: float = 0.0, weight_decay: float = 0.0,
                 consistency: str = "asp", mitigation: str = "none", step_timeout_s: float = 60.0,
                 worker_timeout_s: float | None = None, checkpoint_dir: str | None = None,
                 checkpoint_every: str = "100", nonfinite: str = "reject", warmup: Warmup | None = None):
        from psbench.core.errors import ConfigError

        if nonfinite not in NONFINITE_MODES:
            raise ConfigError(f"nonfinite '{nonfinite}' unknown; allowed: {' | '.join(NONFINITE_MODES)}")
        self.shard_id = shard_id
        self.n_workers = n_workers
        self.lr = lr
        self.optimizer = SGD(momentum, weight_decay)
        self.warmup = warmup or Warmup()  # the async step's ramp from the phase's first update
        self.consistency = consistency
        self.policy: Policy = make_policy(consistency, n_workers)
        self.mitigation: Mitigation = parse_mitigation(mitigation)
        self.step_timeout_s = step_timeout_s
        self.nonfinite = nonfinite  # a push with NaN/inf: reject (error reply) or skip (answered, not applied)
        # One flat float32 vector holds all of this shard's parameters in key order (tensor fusion:
        # one update, one check, one frame per message however many keys); per-key views on demand.
        self.keys: list[int] = []
        self.shapes: dict[int, tuple[int, ...]] = {}
        self.spans: dict[int, tuple[int, int]] = {}  # key -> [start, end) in the flat vector
        self.layout = protocol.PackedLayout([], [])  # keys, dtypes, shapes of the packed frame, key order
        self.flat = np.zeros(0, np.float32)
        self.flat_frame: Any = None  # the zmq frame self.flat lives in (sent by reference), if any
        self.momentum_flat: np.ndarray | None = None
        self.version = 0
        self.start_version = 0  # the version a worker holds before anything was sent to it (init / restore)
        self.sent: dict[int, deque[tuple[int, np.ndarray]]] = {}  # per worker: its last (version, flat params)
        self.staleness = Counter()
        self.error_log = ErrorLog()
        self.n_nonfinite = 0  # pushes with a NaN/inf gradient answered without being applied (skip)
        self.stopping = False
        self.outbox: list[tuple[bytes, list[Any]]] = []
        # Fault tolerance: liveness (last message time per worker), de-duplication of retried
        # pushes (per worker, the last request id applied and the staleness it was applied with),
        # ids handed out by `register`.
        self.worker_timeout_s = worker_timeout_s
        self.last_seen: dict[int, float] = {}
        self.dropped: set[int] = set()        # workers the policy stopped waiting for (dead)
        self.lost_workers: list[int] = []
        self.done: dict[int, tuple[int, int | None]] = {}
        # per worker, the request id a policy stopped waiting on (BSP/SSP timeout) and the error it got:
        # a retry of it, sent before that error arrived, gets the error again, not a new round
        self.expired: dict[int, tuple[int, str]] = {}
        self.n_duplicates = 0
        self.last_shared: dict[int, tuple[float, float]] = {}  # per worker, the step report of its last reply
        self.registered: dict[str, int] = {}  # nonce -> worker id
        self.finished: set[int] = set()       # workers that said bye (a job's launcher polls stats for it)
        self._next_liveness = 0.0
        self.checkpoint_dir = checkpoint_dir
        self.checkpoint_interval = checkpoint.parse_interval(checkpoint_every)
        self.checkpoint_version: int | None = None
        self.checkpoint_t = 0.0
        self.n_checkpoints = 0
        self.restored_version: int | None = None

    # ---- the flat vector and its per-key views ------------------------------------------------
    def _set_layout(self, shapes: dict[int, tuple[int, ...]]) -> None:
        self.keys = sorted(shapes)
        self.shapes = dict(shapes)
        self.spans, offset = {}, 0
        for k in self.keys:
            n = int(np.prod(self.shapes[k], dtype=np.int64))
            self.spans[k] = (offset, offset + n)
            offset += n
        self.layout = protocol.PackedLayout(self.keys, [list(self.shapes[k]) for k in self.keys])

    def views(self, flat: np.ndarray) -> dict[int, np.ndarray]:
        """Per-key views of a flat vector in this shard's layout."""
        return {k: flat[a:b].reshape(self.shapes[k]) for k, (a, b) in self.spans.items()}

    def pack(self, tensors: dict[int, np.ndarray]) -> np.ndarray:
        """One new flat vector from per-key tensors (all of this shard's keys)."""
        if not self.keys:
            return np.zeros(0, np.float32)
        return np.concatenate([np.asarray(tensors[k], np.float32).reshape(-1) for k in self.keys])

    @property
    def params(self) -> dict[int, np.ndarray]:
        return self.views(self.flat)

    @property
    def momentum(self) -> dict[int, np.ndarray]:
        return {} if self.momentum_flat is None else self.views(self.momentum_flat)

    # ---- what policies call ---------------------------------------------------------------
    def apply(self, grad: np.ndarray | None, reqs: list[Request], reusable: bool = False,
              frame: Any = None) -> int | None:
        """One optimizer update from the flat gradient `grad` (already averaged under BSP), the
        pushes `reqs`'. Returns its staleness; None for a skipped push (grad None: nothing applied).
        `reusable`: grad's buffer may take the new weights (then `frame`, if any, is the zmq frame
        it lives in, which the replies send by reference)."""
        tau = None
        if grad is not None:
            bases = [self._basis(r) for r in reqs]
            tau = max(self.version - version for version, _ in bases)
            lr, momentum = self.lr, None  # None: the optimizer's own momentum
            if self.warmup.kind != "none":  # the common case pays one comparison, not a call
                lr, momentum = self.warmup.at(self.version - self.start_version, lr, self.optimizer.momentum)
            g, lr = self.mitigation.adjust(0, grad, lr, tau, self.flat, bases[0][1])
            out = grad if reusable else None
            self.flat = self.optimizer.step(self.flat, g, self.momentum_flat, lr, out, momentum)
            self.flat_frame = frame if out is not None else None
            self.version += 1
            self.staleness[tau] += 1
        for r in reqs:
            if r.rid is not None:
                self.done[r.worker] = (r.rid, tau)
        return tau

    def _basis(self, req: Request) -> tuple[int, np.ndarray]:
        """The version and parameters a push's gradient was computed on: the earlier send it names
        (pipelined), else the last one sent to its worker. A named version we never sent it (or
        lost in a restart) falls back to the last send, so a wrong claim cannot corrupt anything."""
        sends = self.sent.get(req.worker)
        if not sends:
            return self.start_version, self.flat
        named = req.based_on
        if named is None:
            return sends[-1]
        return next((send for send in sends if send[0] == named), sends[-1])

    def _params_frames(self, req: Request, op: str, keys: list[int] | None, **extra: Any) -> list[Any]:
        """The parameters of `keys` (None: all, as one packed frame: the flat vector itself)."""
        if req.worker != ADMIN:
            # a reference: the flat vector is replaced, not mutated
            self.sent.setdefault(req.worker, deque(maxlen=SENT_HISTORY)).append((self.version, self.flat))
        if keys is None:
            return protocol.encode(op, worker=req.worker, step=req.step, version=self.version, keys=self.keys,
                                   layout=self.layout, packed=self.flat if self.flat_frame is None else self.flat_frame,
                                   **_rid(req.rid), **extra)
        params = self.params
        return protocol.encode(op, worker=req.worker, step=req.step, version=self.version, keys=keys,
                               arrays=[params[k] for k in keys], **_rid(req.rid), **extra)

    def reply_push(self, req: Request, staleness: int | None) -> None:
        fields: dict[str, Any] = {} if staleness is None else {"staleness": staleness}
        if req.shared is not None:
            fields["step_loss"], fields["step_clock_s"] = req.shared
            if req.worker != ADMIN:
                self.last_shared[req.worker] = req.shared  # a retry of this push is answered with it too
        if req.want_params:
            frames = self._params_frames(req, "params", None, **fields)
        else:
            frames = protocol.encode("ok", worker=req.worker, step=req.step, version=self.version,
                                     **_rid(req.rid), **fields)
        self.outbox.append((req.ident, frames))

    def reply_pull(self, req: Request) -> None:
        keys = None if not req.keys or req.keys == self.keys else req.keys
        self.outbox.append((req.ident, self._params_frames(req, "params", keys)))

    def reply_error(self, req: Request, text: str) -> None:
        """A held request the policy gave up on (a timeout)."""
        self.error(req.ident, text, req.worker, req.rid, kind="timed_out", op=req.op)
        if req.rid is not None and req.worker != ADMIN:
            self.expired[req.worker] = (req.rid, text)

    def _reply(self, req: Request, op: str = "ok", **fields: Any) -> None:
        """A small answer; it always echoes the request id (the client matches answers by it)."""
        self.outbox.append((req.ident, protocol.encode(op, worker=req.worker, version=self.version,
                                                       **_rid(req.rid), **fields)))

    def error(self, ident: bytes, text: str, worker: int = ADMIN, rid: int | None = None, kind: str = "rejected",
              op: str | None = None) -> None:
        """An error reply, written to the error log (never to the shard's counters)."""
        self.error_log.add(kind, worker, op, text)
        log.warning("shard %d: %s: %s from worker %s: %s", self.shard_id, kind, op, worker, text)
        self._send_error(ident, text, worker, rid)

    def _send_error(self, ident: bytes, text: str, worker: int, rid: int | None) -> None:
        self.outbox.append((ident, protocol.encode("error", worker=worker, error=text, **_rid(rid))))

    # ---- requests -------------------------------------------------------------------------
    def handle(self, ident: bytes, msg: protocol.Message, now: float | None = None) -> None:
        """Act on one decoded message. Every check runs first (`_check_*` change nothing and return
        the action); only a message that passed them all counts as a sign of life and acts."""
        now = time.monotonic() if now is None else now
        op, w = msg.op, msg.worker
        if op not in protocol.SERVER_OPS:
            raise protocol.ProtocolError(f"op '{op}' is not a request a server answers")
        if not (w == ADMIN or 0 <= w < self.n_workers):
            raise protocol.ProtocolError(f"worker id {w} out of range (0..{self.n_workers - 1}, or -1 for admin)")
        req = Request(ident, w, msg.step, now, op=op, want_params=bool(msg.extra.get("want_params", False)),
                      rid=msg.extra.get("rid"))
        act = self._check(req, msg)
        if w != ADMIN:
            self._seen(w, now)
        act()

    def _check(self, req: Request, msg: protocol.Message) -> Callable[[], None]:
        op = req.op
        if op in ADMIN_OPS and req.worker != ADMIN:  # a worker's id cannot reset, read out or stop the job
            raise protocol.ProtocolError(f"{op} is the launcher's request: it comes from worker {ADMIN} (admin), "
                                         f"got worker {req.worker}")
        if op == "register":
            return self._check_register(req, msg)
        if op == "init":
            return self._check_init(req, msg)
        if op == "stats":
            return lambda: self._reply(req, stats=self.stats(req.t_arrival))
        if op == "shutdown":
            return self._shutdown(req)
        if op == "bye":
            return lambda: self._bye(req)
        if not self.keys:
            raise protocol.ProtocolError(f"shard {self.shard_id} is not initialised yet")
        if op == "state":
            return self._check_state(req, msg)
        if op == "pull":
            return self._check_pull(req, msg)
        return self._check_push(req, msg)

    def _shutdown(self, req: Request) -> Callable[[], None]:
        def act() -> None:
            self.stopping = True
            self._reply(req)
        return act

    def _bye(self, req: Request) -> None:
        self.policy.bye(self, req.worker)
        self.finished.add(req.worker)
        self._reply(req)

    def _check_state(self, req: Request, msg: protocol.Message) -> Callable[[], None]:
        slot = msg.extra.get("slot", "params")
        source = {"params": self.flat, "momentum": self.momentum_flat}.get(slot)
        if source is None:
            raise protocol.ProtocolError(f"state slot {slot!r} unknown or empty; allowed: params, momentum")
        return lambda: self.outbox.append((req.ident, protocol.encode(
            "params", worker=req.worker, version=self.version, keys=self.keys, layout=self.layout,
            packed=source.copy(), **_rid(req.rid))))

    def _check_pull(self, req: Request, msg: protocol.Message) -> Callable[[], None]:
        keys = msg.extra.get("want_keys") or list(self.keys)
        if not isinstance(keys, list) or any(not isinstance(k, int) or isinstance(k, bool) for k in keys):
            raise protocol.ProtocolError("pull's want_keys must be a list of integer keys")
        unknown = sorted(set(keys) - set(self.shapes))
        if unknown:
            raise protocol.ProtocolError(f"pull of key(s) {unknown} not held by shard {self.shard_id} "
                                         f"(keys {self.keys[0]}..{self.keys[-1]})")
        req.keys = keys
        if req.worker == ADMIN:
            return lambda: self.reply_pull(req)
        self._check_progress(req.worker, msg)
        held = self.policy.find_pending(req.worker, req.rid)
        if held is not None:
            return lambda: self._rebind(held, req)
        expired = self._expired_retry(req)
        if expired is not None:
            return expired
        return lambda: self.policy.pull(self, req)

    def _check_push(self, req: Request, msg: protocol.Message) -> Callable[[], None]:
        w = req.worker
        if w == ADMIN:
            raise protocol.ProtocolError("push needs a worker id >= 0")
        self._check_tensors(msg, exact=True)
        self._check_progress(w, msg)
        based_on = msg.extra.get("based_on")
        if based_on is not None and (not isinstance(based_on, int) or isinstance(based_on, bool) or based_on < 0):
            raise protocol.ProtocolError(f"push's based_on must be a non-negative version, got {based_on!r:.40}")
        if based_on is not None and self.policy.kind != "asp":
            raise protocol.ProtocolError(f"a pipelined push (based_on) needs consistency asp; this shard runs "
                                         f"{self.consistency}")
        report = self._check_report(msg.extra.get("report"))
        if msg.flat is not None and msg.keys == self.keys:  # packed in our key order: the frame is the gradient
            grad, frame = msg.flat, msg.owners[0]
            reusable = frame is not None and grad.flags.writeable
        else:  # one tensor frame per key (or another order): a flat copy of our own
            grad, frame, reusable = self.pack(msg.tensors()), None, True
        bad = None if all_finite(grad) else next(k for k, a in zip(msg.keys, msg.arrays) if not all_finite(a))
        if bad is not None and self.nonfinite == "reject":  # refused: counted in the error log, not here
            raise protocol.ProtocolError(f"push of worker {w} step {msg.step}: the gradient of key {bad} holds "
                                         f"NaN or inf; nothing applied (a shard started with --nonfinite skip "
                                         f"answers such a push without applying it)")
        held = self.policy.find_pending(w, req.rid)
        if held is not None:  # a retry of a push still held: answer it on the connection it came from
            return lambda: self._rebind(held, req)
        expired = self._expired_retry(req)
        if expired is not None:
            return expired
        done = self.done.get(w)
        if req.rid is not None and done is not None and req.rid <= done[0]:
            # applied before its reply was lost (or before a restart): answer, never apply twice;
            # the staleness it was applied with is known for the last one only
            staleness = done[1] if req.rid == done[0] else None
            return lambda: self._answer_duplicate(req, staleness)
        req.based_on, req.report = based_on, report
        if bad is None:
            req.grad, req.reusable, req.frame = grad, reusable, (frame if reusable else None)
        self.policy.check_push(req)

        def act() -> None:
            if bad is not None:
                self.n_nonfinite += 1
                log.warning("shard %d: skipped worker %d's push of step %d: key %d holds NaN or inf",
                            self.shard_id, w, req.step, bad)
            self.policy.push(self, req)
        return act

    def _check_report(self, report: Any) -> tuple[float, float] | None:
        """A push's step report, [training loss, training clock in s]: two finite numbers, under bsp
        only (its reply shares the step's mean with every worker; no other policy has a common step)."""
        if report is None:
            return None
        if self.policy.kind != "bsp":
            raise protocol.ProtocolError(f"a push's report (a shared per-step decision) needs consistency bsp; "
                                         f"this shard runs {self.consistency}")
        if (type(report) is not list or len(report) != 2 or
                not all(type(v) in (int, float) and math.isfinite(v) for v in report)):
            raise protocol.ProtocolError(f"a push's report must be [loss, seconds], two finite numbers, got "
                                         f"{report!r:.60}")
        return float(report[0]), float(report[1])

    def _check_progress(self, w: int, msg: protocol.Message) -> None:
        """A worker's step and the version it says it holds, against what this shard knows: its
        clock (a worker moves one step per push; a retry repeats a step) and the shard's own version.
        A restored shard cannot know what its predecessor sent (the worker may be further on), so
        it checks a worker once it has sent it SENT_HISTORY replies of its own."""
        if self.restored_version is not None and len(self.sent.get(w, ())) < SENT_HISTORY:
            return
        at = self.policy.clock[w]
        if msg.step > at:
            raise protocol.ProtocolError(f"worker {w}: step {msg.step} is ahead of the step this shard has it at "
                                         f"({at}); a worker moves one step per push")
        if msg.version > self.version:
            raise protocol.ProtocolError(f"worker {w}: says it holds version {msg.version}, but this shard is at "
                                         f"version {self.version}")

    def _rebind(self, held: Request, req: Request) -> None:
        held.ident = req.ident
        self.n_duplicates += 1

    def _expired_retry(self, req: Request) -> Callable[[], None] | None:
        """The answer to a retry of a request the policy timed out on: the same error, once more."""
        expired = self.expired.get(req.worker)
        if req.rid is None or expired is None or expired[0] != req.rid:
            return None

        def act() -> None:
            self.n_duplicates += 1
            self._send_error(req.ident, expired[1], req.worker, req.rid)  # not a new error: not counted
        return act

    def _answer_duplicate(self, req: Request, staleness: int | None) -> None:
        self.n_duplicates += 1
        if staleness is not None:  # the last push applied: its step report as first sent
            req.shared = self.last_shared.get(req.worker)
        self.reply_push(req, staleness)

    def _seen(self, w: int, now: float) -> None:
        self.last_seen[w] = now
        if w in self.dropped:  # it was only slow, or it restarted: count it again
            self.dropped.discard(w)
            self.policy.live.add(w)
            log.warning("shard %d: worker %d is back", self.shard_id, w)

    def _check_register(self, req: Request, msg: protocol.Message) -> Callable[[], None]:
        """Hand out the next free worker id (docker --scale starts identical workers)."""
        if req.worker != ADMIN:
            raise protocol.ProtocolError(f"register comes from worker -1 (no id yet), got {req.worker}")
        nonce = msg.extra.get("nonce")
        if not isinstance(nonce, str) or not 1 <= len(nonce) <= 128:
            raise protocol.ProtocolError("register needs a nonce: a string of 1..128 characters")
        if nonce not in self.registered and len(self.registered) >= self.n_workers:
            raise protocol.ProtocolError(f"all {self.n_workers} worker ids are taken "
                                         f"(the job was started with --workers {self.n_workers})")

        def act() -> None:
            self.registered.setdefault(nonce, len(self.registered))  # a retried register gets the same id
            self._reply(req, assigned=self.registered[nonce])
        return act

    def _check_tensors(self, msg: protocol.Message, exact: bool) -> None:
        if msg.keys == self.keys and msg.shapes == self.layout.shapes:  # our layout (decode checked the types)
            return
        if exact and sorted(msg.keys) != self.keys:
            raise protocol.ProtocolError(f"{msg.op} must carry exactly shard {self.shard_id}'s keys {self.keys}, "
                                         f"got {sorted(msg.keys)}")
        for k, a in zip(msg.keys, msg.arrays):
            if k not in self.shapes:
                raise protocol.ProtocolError(f"key {k} is not held by shard {self.shard_id}")
            if a.shape != self.shapes[k]:
                raise protocol.ProtocolError(f"key {k}: shape {list(a.shape)} does not match the registered "
                                             f"{list(self.shapes[k])}")

    def _check_init(self, req: Request, msg: protocol.Message) -> Callable[[], None]:
        slot = msg.extra.get("slot", "params")
        if slot == "params":
            if self.keys:
                if msg.extra.get("if_absent", False):
                    return lambda: self._reply(req, initialised=False)
                raise protocol.ProtocolError(f"shard {self.shard_id} is already initialised")
            if not msg.keys:
                raise protocol.ProtocolError("init carries no tensors")
            if sorted(msg.keys) != list(range(min(msg.keys), max(msg.keys) + 1)):
                raise protocol.ProtocolError("init keys must be one contiguous range")
            for k, a in zip(msg.keys, msg.arrays):
                if not all_finite(a):
                    raise protocol.ProtocolError(f"init key {k}: tensor holds NaN or inf")
            return lambda: self._init_params(req, msg)
        if slot == "momentum":
            if not self.keys:
                raise protocol.ProtocolError("init of momentum before params")
            if not self.optimizer.momentum:
                raise protocol.ProtocolError("this shard runs without momentum")
            self._check_tensors(msg, exact=True)
            for k, a in zip(msg.keys, msg.arrays):
                if not all_finite(a):
                    raise protocol.ProtocolError(f"init of momentum, key {k}: tensor holds NaN or inf")

            def act() -> None:
                self.momentum_flat = self.pack(msg.tensors())
                self._reply(req, initialised=True)
            return act
        raise protocol.ProtocolError(f"init slot {slot!r} unknown; allowed: params, momentum")

    def _init_params(self, req: Request, msg: protocol.Message) -> None:
        self._set_layout({k: a.shape for k, a in zip(msg.keys, msg.arrays)})
        self.flat, self.flat_frame = self.pack(msg.tensors()), None
        self.momentum_flat = np.zeros_like(self.flat) if self.optimizer.momentum else None
        self.version = msg.version
        self.policy.reset(msg.step)
        self.start_version = msg.version
        self._reply(req, initialised=True)

    def expire(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        self.policy.expire(self, now, self.step_timeout_s)
        if self.worker_timeout_s is not None and now >= self._next_liveness:
            self._next_liveness = now + min(0.5, self.worker_timeout_s / 4)
            waiting = {r.worker for r in self.policy.waiting_requests()}
            for w, seen in list(self.last_seen.items()):
                if w in self.policy.live and w not in waiting and now - seen > self.worker_timeout_s:
                    del self.last_seen[w]
                    if self.policy.drop_dead(self, w):
                        self.dropped.add(w)
                        self.lost_workers.append(w)
                        log.warning("shard %d: worker %d silent for %.1fs, no longer waited for",
                                    self.shard_id, w, now - seen)

    # ---- checkpoints ----------------------------------------------------------------------
    def maybe_checkpoint(self, now: float | None = None) -> bool:
        if self.checkpoint_dir is None or not self.keys:
            return False
        now = time.monotonic() if now is None else now
        if self.checkpoint_version is not None and not self.checkpoint_interval.due(
                self.version, self.checkpoint_version, now, self.checkpoint_t):
            return False
        self.save_checkpoint(now)
        return True

    def save_checkpoint(self, now: float | None = None) -> None:
        assert self.checkpoint_dir is not None
        checkpoint.save(Path(self.checkpoint_dir), self.shard_id, self.version, self.keys, self.params, self.momentum,
                        {"policy": self.policy.state_dict(), "mitigation": self.mitigation.name,
                         "done_rid": {str(w): r for w, (r, _) in self.done.items()},
                         "done_staleness": {str(w): s for w, (_, s) in self.done.items()},
                         "registered": self.registered, "consistency": self.consistency,
                         "staleness_hist": {str(k): int(v) for k, v in self.staleness.items()}},
                        slots={"mitigation": {k: self.views(a) for k, a in self.mitigation.tensors().items()}.get(0, {})})
        self.checkpoint_version = self.version
        self.checkpoint_t = time.monotonic() if now is None else now
        self.n_checkpoints += 1

    def restore(self, directory: str) -> int:
        """Load the last checkpoint of this shard; returns its version."""
        from psbench.core.errors import ConfigError

        state = checkpoint.load(Path(directory), self.shard_id)
        if state.header.get("consistency") != self.consistency:
            raise ConfigError(f"checkpoint in {directory} was made under {state.header.get('consistency')}, "
                              f"this shard runs {self.consistency}")
        if state.header.get("mitigation", self.mitigation.name) != self.mitigation.name:
            raise ConfigError(f"checkpoint in {directory} was made with mitigation {state.header['mitigation']}, "
                              f"this shard runs {self.mitigation.name}")
        if state.momentum and not self.optimizer.momentum:
            raise ConfigError("checkpoint holds momentum but this shard runs without it")
        self._set_layout({k: a.shape for k, a in state.params.items()})
        self.version = state.version
        self.flat, self.flat_frame = self.pack(state.params), None
        self.momentum_flat = (self.pack(state.momentum) if state.momentum else
                              np.zeros_like(self.flat) if self.optimizer.momentum else None)
        self.policy.load_state(state.header.get("policy", {}))
        saved = state.slots.get("mitigation")
        self.mitigation.load_tensors({0: self.pack(saved)} if saved else {})
        self.start_version = self.version
        stale = state.header.get("done_staleness", {})
        self.done = {int(w): (int(r), None if stale.get(w) is None else int(stale[w]))
                     for w, r in state.header.get("done_rid", {}).items()}
        self.registered = {str(n): int(i) for n, i in state.header.get("registered", {}).items()}
        self.staleness = Counter({int(k): int(v) for k, v in state.header.get("staleness_hist", {}).items()})
        self.checkpoint_version, self.checkpoint_t = self.version, time.monotonic()
        self.restored_version = self.version
        return self.version

    def stats(self, now: float | None = None) -> dict[str, Any]:
        now = time.monotonic() if now is None else now
        return {"shard": self.shard_id, "version": self.version, "keys": self.keys,
                "applied": int(sum(self.staleness.values())),
                "staleness_hist": {str(k): int(v) for k, v in sorted(self.staleness.items())},
                "duplicates": self.n_duplicates, "nonfinite": self.n_nonfinite,
                "lost_workers": self.lost_workers, "checkpoints": self.n_checkpoints,
                "restored_version": self.restored_version,
                # who is done and who went quiet: what a launcher on another host can see of the job
                "finished": sorted(self.finished), "last_error": self.error_log.last,
                "error_log": self.error_log.report(),  # diagnostics, not state: what was refused and why
                "waiting": sorted({r.worker for r in self.policy.waiting_requests()}),
                "idle_s": {str(w): round(now - t, 3) for w, t in sorted(self.last_seen.items())},
                **self.policy.stats()}

    def receive(self, ident: bytes, frames: list[Any], token: str | None, max_bytes: int) -> None:
        """Decode + handle; a bad message gets an error reply and leaves the state as it was."""
        msg = None
        try:
            msg = protocol.decode(frames, token=token, max_bytes=max_bytes, ops=protocol.ALL_OPS,
                                  expect=self.layout if self.keys else None)
            self.handle(ident, msg)
        except protocol.ProtocolError as exc:
            worker, op, rid = (msg.worker, msg.op, msg.extra.get("rid")) if msg is not None else (ADMIN, None, None)
            self.error(ident, str(exc), worker, rid, op=op)
        except Exception as exc:  # a bug must not take the shard down mid-run; say so loudly
            log.exception("shard %d: internal error", self.shard_id)
            self.error(ident, f"internal server error: {type(exc).__name__}: {exc}", kind="internal")
def _rid(rid: int | None) -> dict[str, int]:
    return {} if rid is None else {"rid": rid}


PROGRESS_EVERY_S = 1.0  # how often a launched shard tells the launcher its version


def serve(shard: Shard, host: str = "127.0.0.1", port: int = 0, token: str | None = None,
          max_bytes: int = protocol.DEFAULT_MAX_BYTES, control: str | None = None,
          halt_at_version: int | None = None, curve: bool | None = None) -> None:
    """Bind a ROUTER socket and answer until a shutdown request (or the parent process dies).
    Beyond loopback with a token (or with curve=True) the socket speaks CURVE (encrypted; see
    psbench.systems.ps.curve); a frame over max_bytes drops its connection unread. With
    `control`, report readiness and then the shard's version every second (the launcher
    measures lost work from it). `halt_at_version` (fault injection): on reaching that version,
    report it and stop answering, so the launcher can SIGKILL this process at a known version."""
    import zmq

    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 2000)
    sock.setsockopt(zmq.ROUTER_MANDATORY, 0)
    protocol.limit_frames(sock, max_bytes)
    encrypted = curve_wanted(host, token, curve)
    if encrypted:
        secure_server(sock, token)
    if port:
        sock.bind(f"tcp://{host}:{port}")
    else:
        port = sock.bind_to_random_port(f"tcp://{host}")
    print(f"ps-server shard {shard.shard_id} listening on {host}:{port}", file=sys.stderr, flush=True)
    if encrypted:
        print(f"ps-server shard {shard.shard_id}: CURVE-encrypted (server key from the job's token)", file=sys.stderr,
              flush=True)
    ctl = None
    if control:
        ctl = ctx.socket(zmq.DEALER)
        ctl.setsockopt(zmq.LINGER, 0)
        ctl.connect(control)
        ctl.send_multipart(protocol.encode("server_ready", token=token, shard=shard.shard_id, port=port,
                                           version=shard.version, restored=shard.restored_version is not None))

    def report(**extra: Any) -> None:
        if ctl is not None:
            try:
                ctl.send_multipart(protocol.encode("server_progress", token=token, version=shard.version,
                                                   shard=shard.shard_id, **extra), zmq.NOBLOCK)
            except zmq.Again:
                pass

    next_report = time.monotonic() + PROGRESS_EVERY_S
    sock.rcvtimeo = 200  # a blocking receive that wakes up to do the chores (cheaper than a poll each message)
    try:
        while not shard.stopping:
            try:
                frames = protocol.recv_frames(sock)
            except zmq.Again:
                pass
            else:
                shard.receive(frames[0].bytes, frames[1:], token, max_bytes)
            shard.expire()
            shard.maybe_checkpoint()
            if halt_at_version is not None and shard.version >= halt_at_version:
                report(halted=True)  # the replies in the outbox are never sent: clients must retry
                time.sleep(120)  # killed by the launcher long before (or by watch_launcher, if it died)
                return
            for ident, out in shard.outbox:
                protocol.send_frames(sock, [ident, *out])
            shard.outbox.clear()
            if ctl is not None and time.monotonic() >= next_report:
                report()
                next_report = time.monotonic() + PROGRESS_EVERY_S
    finally:
        sock.close()
        if ctl is not None:
            ctl.close()


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--bind", default="127.0.0.1:0", help="host:port to listen on (port 0: a free one; default 127.0.0.1:0)")
    p.add_argument("--shard-id", type=int, default=0, help="this shard's index (0..servers-1)")
    p.add_argument("--servers", type=int, default=1, help="number of server shards in the job")
    p.add_argument("--workers", type=int, required=True, help="number of workers in the job")
    p.add_argument("--consistency", default="asp", help="bsp | asp | ssp:S (default asp)")
    p.add_argument("--mitigation", default="none", help="none | staleness-lr | dc-asgd:LAMBDA | gap-aware")
    p.add_argument("--workload", help="take lr/momentum/weight decay defaults from this workload")
    p.add_argument("--lr", type=float, help="learning rate as applied (already scaled)")
    p.add_argument("--lr-scaling", default="auto",
                   help="with --workload's lr, the async step's ONE reduction: auto | 1/n | none | FACTOR")
    p.add_argument("--momentum", type=float, help="SGD momentum as applied (already scaled)")
    p.add_argument("--momentum-scaling", default="auto",
                   help="with --workload's momentum m: auto (completes the one reduction: 1 - (1 - m) * workers with "
                        "the lr kept) | scaled | none | MOMENTUM")
    p.add_argument("--weight-decay", type=float, help="SGD weight decay")
    p.add_argument("--warmup", default="none", help="ramp of the step from this shard's first update: "
                                                    "none | lr:from=F,updates=U | momentum:from=M,updates=U")
    p.add_argument("--step-timeout-s", type=float, default=60.0, help="BSP/SSP wait bound in seconds (default 60)")
    p.add_argument("--worker-timeout-s", type=float, default=None,
                   help="SSP stops waiting for a worker silent this long (default: never)")
    p.add_argument("--nonfinite", default="reject", choices=NONFINITE_MODES,
                   help="a push whose gradient holds NaN or inf: reject (error reply naming the key; default; "
                        "in the error log) or skip (answered, not applied; counted as nonfinite in stats)")
    p.add_argument("--checkpoint-dir", help="write shard checkpoints here (params, momentum, version)")
    p.add_argument("--checkpoint-every", default="100",
                   help="checkpoint interval: updates (e.g. 100) or seconds (e.g. 5s); default 100")
    p.add_argument("--restore", action="store_true", help="start from the last checkpoint in --checkpoint-dir")
    p.add_argument("--halt-at-version", type=int, help=argparse.SUPPRESS)  # fault injection for tests
    p.add_argument("--max-message-mb", type=float, default=protocol.DEFAULT_MAX_BYTES / 2**20,
                   help="reject messages larger than this (default 512)")
    add_token_argument(p, "the shared token every message must carry; required when --bind is not a loopback "
                          "address")
    p.add_argument("--insecure", action="store_true",
                   help="allow a non-loopback --bind without a token (anyone who reaches the port can train)")
    add_curve_argument(p)
    p.add_argument("--control", help=argparse.SUPPRESS)  # the launcher's control socket
    p.add_argument("--log-level", default="WARNING", help=argparse.SUPPRESS)


def shard_from_args(args: argparse.Namespace) -> Shard:
    from psbench.systems.ps.policies import resolve_step
    from psbench.workloads import get_workload
    from psbench.core.errors import ConfigError

    parse_consistency(args.consistency)
    parse_mitigation(args.mitigation)
    if args.workers < 1 or not (0 <= args.shard_id < args.servers):
        raise ConfigError(f"need workers >= 1 and 0 <= shard-id < servers, got workers={args.workers} "
                          f"shard-id={args.shard_id} servers={args.servers}")
    lr, momentum, wd = args.lr, args.momentum, args.weight_decay
    if args.workload:
        opt = get_workload(args.workload).optimizer
        step = resolve_step(args.lr_scaling, args.momentum_scaling, args.consistency, args.workers, opt.momentum)
        lr = lr if lr is not None else opt.lr * step.lr_factor
        momentum = momentum if momentum is not None else step.momentum
        wd = wd if wd is not None else opt.weight_decay
    if lr is None:
        raise ConfigError("give --lr or --workload")
    if args.worker_timeout_s is not None and not args.worker_timeout_s > 0:
        raise ConfigError(f"--worker-timeout-s must be > 0, got {args.worker_timeout_s}")
    if args.restore and not args.checkpoint_dir:
        raise ConfigError("--restore needs --checkpoint-dir")
    shard = Shard(args.shard_id, args.workers, lr, momentum or 0.0, wd or 0.0, args.consistency, args.mitigation,
                  args.step_timeout_s, args.worker_timeout_s, args.checkpoint_dir, args.checkpoint_every,
                  args.nonfinite, parse_warmup(args.warmup))
    if args.restore:
        shard.restore(args.checkpoint_dir)
    return shard


def add_curve_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--curve", action="store_true", help="encrypt with CURVE on loopback too (beyond loopback a job "
                   "with a token is always encrypted); needs the token, from which the server key is derived")


def main(args: argparse.Namespace) -> int:
    logging.basicConfig(level=getattr(logging, str(args.log_level).upper(), logging.WARNING),
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    host, port = split_address(args.bind)
    token = token_from_args(args)
    check_exposure(f"ps-server --bind {args.bind}", host, token, args.insecure)
    curve_wanted(host, token, True if args.curve else None)  # --curve without a token: one line, before any work
    shard = shard_from_args(args)
    watch_launcher(or_parent=False)  # started by hand (no launcher pid): stays
    with protocol.zmq_process():
        serve(shard, host, port, token, int(args.max_message_mb * 2**20), args.control, args.halt_at_version,
              curve=True if args.curve else None)
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m psbench.systems.ps.server", description=__doc__.splitlines()[0])
    add_arguments(parser)
    sys.exit(main(parser.parse_args()))
