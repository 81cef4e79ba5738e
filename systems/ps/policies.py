"""Consistency policies (when a shard applies and answers) and staleness mitigations (how a stale
gradient is adjusted before the optimizer sees it). Both are small objects the server calls.

Staleness tau of an update = the shard's version when it is applied minus the version of the
parameters the pushing worker last pulled from this shard.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from psbench.core.errors import ConfigError
from psbench.systems.ps.protocol import ProtocolError

# ---- mitigations ------------------------------------------------------------------------------

GAP_AWARE_BETA = 0.9  # running average of |g| for gap-aware: avg <- beta*avg + (1-beta)*|g|
GAP_EPS = 1e-12


class Mitigation:
    """`adjust(key, g, lr, tau, w_now, w_pulled) -> (g', lr')`; the base class changes nothing.
    A mitigation with state across updates gives it as per-key tensors (`tensors`, `load_tensors`),
    so a shard checkpoint holds it bit for bit."""
    name = "none"

    def adjust(self, key: int, g: np.ndarray, lr: float, tau: int, w_now: np.ndarray,
               w_pulled: np.ndarray) -> tuple[np.ndarray, float]:
        return g, lr

    def tensors(self) -> dict[int, np.ndarray]:
        return {}

    def load_tensors(self, tensors: dict[int, np.ndarray]) -> None:
        if tensors:
            raise ConfigError(f"mitigation {self.name} keeps no state, but the checkpoint holds some")


class StalenessLR(Mitigation):
    """Zhang et al., IJCAI 2016: divide the learning rate by the staleness, lr / max(1, tau)."""
    name = "staleness-lr"

    def adjust(self, key, g, lr, tau, w_now, w_pulled):
        return g, lr / max(1, tau)


@dataclass
class DCASGD(Mitigation):
    """Zheng et al., ICML 2017: g + lambda * g * g * (w_now - w_pulled) (diagonal Hessian approx.)."""
    lam: float
    name = "dc-asgd"

    def adjust(self, key, g, lr, tau, w_now, w_pulled):
        if w_now is w_pulled:  # nothing moved since the pull (tau == 0): skip the arithmetic
            return g, lr
        return g + self.lam * g * g * (w_now - w_pulled), lr


@dataclass
class GapAware(Mitigation):
    """Barkai, Hakimi, Schuster, ICLR 2020, in this form: per element,
        avg_k   <- beta * avg_k + (1 - beta) * |g|         (avg_k := |g| on the key's first update)
        gap      = max(1, |w_now - w_pulled| / (lr * avg_k + eps))
        g'       = g / gap
    i.e. the gap is the distance the parameter moved since the worker pulled, measured in units of
    a typical single step (lr * average |g|); a gradient that is G steps stale is damped by G.
    The paper normalises the same way (by the average step size C); beta=0.9 and the max(1, .)
    floor are our choices, so fresh gradients (gap < 1 step) pass unchanged."""
    beta: float = GAP_AWARE_BETA
    avg: dict[int, np.ndarray] = field(default_factory=dict)
    name = "gap-aware"

    def adjust(self, key, g, lr, tau, w_now, w_pulled):
        magnitude = np.abs(g)
        prev = self.avg.get(key)
        self.avg[key] = magnitude.copy() if prev is None else self.beta * prev + (1 - self.beta) * magnitude
        if w_now is w_pulled:
            return g, lr
        gap = np.maximum(1.0, np.abs(w_now - w_pulled) / (lr * self.avg[key] + GAP_EPS))
        return (g / gap).astype(g.dtype, copy=False), lr

    def tensors(self) -> dict[int, np.ndarray]:
        return self.avg

    def load_tensors(self, tensors: dict[int, np.ndarray]) -> None:
        self.avg = {k: np.array(a, copy=True) for k, a in tensors.items()}


def parse_mitigation(text: str) -> Mitigation:
    allowed = "none | staleness-lr | dc-asgd:LAMBDA | gap-aware"
    text = str(text).strip()
    if text == "none":
        return Mitigation()
    if text == "staleness-lr":
        return StalenessLR()
    if text == "gap-aware":
        return GapAware()
    if text.startswith("dc-asgd:"):
        try:
            lam = float(text.split(":", 1)[1])
        except ValueError:
            raise ConfigError(f"mitigation '{text}': LAMBDA must be a number, e.g. dc-asgd:0.04") from None
        if not lam >= 0:
            raise ConfigError(f"mitigation '{text}': LAMBDA must be >= 0")
        return DCASGD(lam)
    raise ConfigError(f"unknown mitigation '{text}'; allowed: {allowed}")


# ---- consistency ------------------------------------------------------------------------------

def parse_consistency(text: str) -> tuple[str, int]:
    """'bsp' | 'asp' | 'ssp:S' -> (kind, bound); bound is 0 for bsp/asp."""
    text = str(text).strip()
    if text in ("bsp", "asp"):
        return text, 0
    if text.startswith("ssp:"):
        raw = text.split(":", 1)[1]
        if not raw.isdigit():
            raise ConfigError(f"consistency '{text}': the staleness bound must be an integer >= 0, e.g. ssp:2")
        return "ssp", int(raw)
    raise ConfigError(f"unknown consistency '{text}'; allowed: bsp | asp | ssp:S (S >= 0)")


@dataclass
class Request:
    """A push or pull waiting for its answer. A push's gradient is one flat array over the shard's
    keys in key order; `grad` None: the push was skipped (a non-finite gradient under --nonfinite
    skip): it counts as the worker's step but changes no parameter."""
    ident: bytes
    worker: int
    step: int
    t_arrival: float
    op: str = "push"  # push | pull
    grad: np.ndarray | None = None
    want_params: bool = False
    keys: list[int] | None = None
    staleness: int | None = None
    rid: int | None = None  # the client's request id: echoed in the reply, used to spot retries
    based_on: int | None = None  # pipelined push: the version its gradient was computed on
    reusable: bool = False  # `grad`'s buffer is ours to overwrite (with the new weights)
    frame: Any = None       # the zmq frame `grad` lives in, if it came off a socket (sent back by reference)


class Server(Protocol):
    """What a policy needs from its shard (see server.Shard)."""
    def apply(self, grad: np.ndarray | None, reqs: list[Request], reusable: bool = False,
              frame: Any = None) -> int | None: ...
    def reply_push(self, req: Request, staleness: int | None) -> None: ...
    def reply_pull(self, req: Request) -> None: ...
    def reply_error(self, req: Request, text: str) -> None: ...


class Policy:
    """ASP: apply each gradient on arrival and answer at once.

    Every policy keeps each worker's clock (the step it is at: its last push's step + 1), which the
    shard checks a worker's claimed step against and SSP gates on. `check_push` raises before the
    shard changes anything; `push` and `pull` then act."""
    kind = "asp"

    def __init__(self, n_workers: int, start_step: int = 0):
        self.n_workers = n_workers
        self.live = set(range(n_workers))
        self.max_gap = 0  # largest (step - slowest live worker's step) a worker was let through at
        self.clock = {w: start_step for w in range(n_workers)}  # the step each worker is at

    def reset(self, start_step: int) -> None:
        self.clock = {w: start_step for w in range(self.n_workers)}

    def _advance(self, worker: int, step: int) -> None:
        if step > self.clock[worker]:
            self.clock[worker] = step

    def check_push(self, req: Request) -> None:
        """Raise ProtocolError if this policy would refuse the push (nothing has changed yet)."""

    def push(self, srv: Server, req: Request) -> None:
        self._advance(req.worker, req.step + 1)
        srv.reply_push(req, srv.apply(req.grad, [req], req.reusable, req.frame))

    def pull(self, srv: Server, req: Request) -> None:
        self._advance(req.worker, req.step)
        srv.reply_pull(req)

    def bye(self, srv: Server, worker: int) -> None:
        self.live.discard(worker)

    def expire(self, srv: Server, now: float, timeout_s: float) -> None:
        pass

    def stats(self) -> dict[str, Any]:
        return {"policy": self.kind, "max_gap": self.max_gap}

    # ---- fault tolerance ----------------------------------------------------------------
    def waiting_requests(self) -> list[Request]:
        """Requests held for an answer (a worker with one is alive: it is waiting on us)."""
        return []

    def find_pending(self, worker: int, rid: int | None) -> Request | None:
        """The held request of `worker` with request id `rid` (a retry of it must not count twice)."""
        if rid is None:
            return None
        return next((r for r in self.waiting_requests() if r.worker == worker and r.rid == rid), None)

    def drop_dead(self, srv: Server, worker: int) -> bool:
        """A worker not heard from for worker_timeout_s: True if the policy stops waiting for it.
        ASP never waits; SSP stops counting it; BSP keeps waiting (its step times out instead)."""
        return False

    def state_dict(self) -> dict[str, Any]:
        return {"live": sorted(self.live), "clock": {str(w): c for w, c in self.clock.items()},
                "max_gap": self.max_gap}

    def load_state(self, state: dict[str, Any]) -> None:
        self.live = {int(w) for w in state.get("live", self.live)}
        self.clock.update({int(w): int(c) for w, c in state.get("clock", {}).items()})
        self.max_gap = int(state.get("max_gap", self.max_gap))


class BSP(Policy):
    """Wait for a gradient from every live worker for the step, average, apply once, answer all."""
    kind = "bsp"

    def __init__(self, n_workers: int, start_step: int = 0):
        super().__init__(n_workers, start_step)
        self.pending: dict[int, Request] = {}
        self.acc: np.ndarray | None = None  # the sum of the step's gradients (flat)
        self.acc_frame: Any = None  # the zmq frame acc lives in (the first gradient's own), if any
        self.n_acc = 0  # pushes summed into acc (a skipped push waits with the others, adds nothing)

    def check_push(self, req):
        if req.worker in self.pending:
            raise ProtocolError(f"worker {req.worker} pushed twice for step {req.step} under bsp")
        if self.pending:
            step = next(iter(self.pending.values())).step
            if req.step != step:
                raise ProtocolError(f"bsp: worker {req.worker} pushed step {req.step} while step {step} is open")

    def push(self, srv, req):
        self._advance(req.worker, req.step + 1)
        if req.grad is not None:
            if self.acc is not None:
                self.acc += req.grad
            elif req.reusable:  # the first gradient's own buffer holds the sum: no copy
                self.acc, self.acc_frame = req.grad, req.frame
            else:
                self.acc, self.acc_frame = np.array(req.grad, copy=True), None
            self.n_acc += 1
        req.grad = req.frame = None  # the sum holds it; let the frame go
        self.pending[req.worker] = req
        self._maybe_apply(srv)

    def _maybe_apply(self, srv) -> None:
        if not self.pending or not self.live.issubset(self.pending):
            return
        avg = None if self.acc is None else np.divide(self.acc, np.float32(self.n_acc), out=self.acc)
        waiting = sorted(self.pending.values(), key=lambda r: r.worker)
        staleness = srv.apply(avg, waiting, True, self.acc_frame)
        self._clear()
        for req in waiting:
            srv.reply_push(req, staleness)

    def _clear(self) -> None:
        self.pending, self.acc, self.acc_frame, self.n_acc = {}, None, None, 0

    def bye(self, srv, worker):
        super().bye(srv, worker)
        self._maybe_apply(srv)

    def waiting_requests(self):
        return list(self.pending.values())

    def expire(self, srv, now, timeout_s):
        if self.pending and now - min(r.t_arrival for r in self.pending.values()) > timeout_s:
            missing = sorted(self.live - set(self.pending))
            waiting = list(self.pending.values())
            self._clear()
            for req in waiting:  # nothing was applied: the shard's parameters are unchanged
                srv.reply_error(req, f"bsp: timed out after {timeout_s:.0f}s waiting for worker(s) {missing}")


class SSP(Policy):
    """Apply on arrival (as ASP), but a worker about to compute step t gets its parameters only
    when t - (slowest live worker's step) <= bound; otherwise its pull (or push-pull) waits."""
    kind = "ssp"

    def __init__(self, n_workers: int, bound: int, start_step: int = 0):
        super().__init__(n_workers, start_step)
        self.bound = bound
        self.waiting: list[Request] = []

    def _slowest(self) -> int | None:
        return min((self.clock[w] for w in self.live), default=None)

    def push(self, srv, req):
        staleness = srv.apply(req.grad, [req], req.reusable, req.frame)
        req.grad = req.frame = None
        self._advance(req.worker, req.step + 1)
        if req.want_params:  # the reply carries the parameters for step+1: gate it
            req.staleness = staleness
            req.step += 1
            self.waiting.append(req)
        else:
            srv.reply_push(req, staleness)
        self._release(srv)

    def pull(self, srv, req):
        self._advance(req.worker, req.step)
        self.waiting.append(req)
        self._release(srv)

    def _release(self, srv) -> None:
        slowest = self._slowest()
        still: list[Request] = []
        for req in self.waiting:
            gap = 0 if slowest is None else req.step - slowest
            if gap <= self.bound:
                self.max_gap = max(self.max_gap, gap)
                if req.op == "push":  # held after its update
                    srv.reply_push(req, req.staleness)
                else:
                    srv.reply_pull(req)
            else:
                still.append(req)
        self.waiting = still

    def bye(self, srv, worker):
        super().bye(srv, worker)
        self._release(srv)

    def waiting_requests(self):
        return list(self.waiting)

    def drop_dead(self, srv, worker):
        self.bye(srv, worker)
        return True

    def expire(self, srv, now, timeout_s):
        late = [r for r in self.waiting if now - r.t_arrival > timeout_s]
        if late:
            self.waiting = [r for r in self.waiting if r not in late]
            slowest = self._slowest()
            behind = sorted(w for w in self.live if self.clock[w] == slowest)
            for req in late:
                srv.reply_error(req, f"ssp:{self.bound}: timed out after {timeout_s:.0f}s waiting for slow "
                                     f"worker(s) {behind} at step {slowest}")


def make_policy(consistency: str, n_workers: int, start_step: int = 0) -> Policy:
    kind, bound = parse_consistency(consistency)
    if kind == "bsp":
        return BSP(n_workers, start_step)
    if kind == "ssp":
        return SSP(n_workers, bound, start_step)
    return Policy(n_workers, start_step)


def resolve_lr(lr_scaling: str, consistency: str, n_workers: int) -> float:
    """The factor the workload's lr is multiplied by on the servers. 'auto': 1 under every
    consistency. A worker's batch is the workload's whatever N is, so each asp/ssp update is one
    worker's gradient of one such batch, as in `single`, and bsp applies the mean of N of them once.
    (The thesis' lr / N went with a batch / N per worker; with the batch kept, lr / N only halves
    the progress of 2 async workers: measured, mlp-digits ended 0.94 where `single` ends 0.95, still
    climbing. '1/n' is that setting.)"""
    text = str(lr_scaling).strip().lower()
    parse_consistency(consistency)
    if text == "auto":
        return 1.0
    if text == "none":
        return 1.0
    if text == "1/n":
        return 1.0 / n_workers
    try:
        factor = float(text)
    except ValueError:
        raise ConfigError(f"lr_scaling '{lr_scaling}' unknown; allowed: auto | none | 1/n | a factor > 0") from None
    if not factor > 0:
        raise ConfigError(f"lr_scaling must be > 0, got {lr_scaling}")
    return factor


def resolve_momentum(momentum_scaling: str, consistency: str, n_workers: int, momentum: float) -> float:
    """The SGD momentum the servers apply, from the workload's `momentum`. 'auto': under asp/ssp,
    1 - (1 - momentum) * N, at least 0; under bsp the workload's. Asynchrony brings momentum of its
    own (Mitliagkas et al., "Asynchrony begets momentum", 2016: about 1 - 1/N with N workers), and the
    two compound: 1 - (1 - explicit) * (1 - implicit) = momentum with the explicit value above, so
    the total stays the one the workload was tuned with. 'none': the workload's momentum as is."""
    text = str(momentum_scaling).strip().lower()
    kind, _ = parse_consistency(consistency)
    if text == "none":
        return momentum
    if text == "auto":
        return momentum if kind == "bsp" or not momentum else max(0.0, 1.0 - (1.0 - momentum) * n_workers)
    raise ConfigError(f"momentum_scaling '{momentum_scaling}' unknown; allowed: auto | none")
