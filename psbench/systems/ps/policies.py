"""Consistency policies (when a shard applies and answers) and staleness mitigations (how a stale
gradient is adjusted before the optimizer sees it). Both are small objects the server calls.

Staleness tau of an update = the shard's version when it is applied minus the version of the
parameters the pushing worker last pulled from this shard.
"""
from __future__ import annotations

import math
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
    report: tuple[float, float] | None = None  # bsp: the worker's (training loss, training clock) of this step
    shared: tuple[float, float] | None = None  # bsp: the step's (mean loss, latest clock) over its reports


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
        shared = step_report(waiting)
        for req in waiting:
            req.shared = shared
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


def step_report(reqs: list[Request]) -> tuple[float, float] | None:
    """What a BSP step's reply tells every worker alike: the mean of the step's reported training
    losses and the latest training clock among them (None: nobody reported). Every worker gets the
    same pair, so a rule each evaluates on it (a switch criterion) decides the same at the same step."""
    reports = [r.report for r in reqs if r.report is not None]
    if not reports:
        return None
    return float(np.mean([loss for loss, _ in reports])), float(max(t for _, t in reports))


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


@dataclass(frozen=True)
class Warmup:
    """A ramp of the async step from its start (a Strategy-Switch's hand-over): over the first
    `updates` updates a shard applies, the lr goes linearly from `start` x its matched value to it
    ('lr'), or the momentum from `start` to its matched value ('momentum'). Right after synchronous
    training the loss is sharp, and the full matched step can spike it (Sync-Switch's notes: lr
    scaled with the batch at the restore, momentum after it zero, scaled or ramped)."""
    kind: str = "none"  # none | lr | momentum
    start: float = 1.0
    updates: int = 0

    def at(self, done: int, lr: float, momentum: float) -> tuple[float, float]:
        """(lr, momentum) for the update after `done` updates of the phase."""
        if self.kind == "none" or done >= self.updates:
            return lr, momentum
        progress = done / self.updates
        if self.kind == "lr":
            return lr * (self.start + (1.0 - self.start) * progress), momentum
        return lr, self.start + (momentum - self.start) * progress

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "start": self.start, "updates": self.updates}


WARMUPS = "none | lr:from=F,updates=U (lr from F x its value) | momentum:from=M,updates=U (momentum from M)"


def parse_warmup(text: str | None) -> Warmup:
    text = (text or "none").strip()
    if text == "none":
        return Warmup()
    kind, _, args = text.partition(":")
    values: dict[str, float] = {}
    for item in filter(None, args.split(",")):
        key, eq, value = item.partition("=")
        try:
            values[key.strip()] = float(value) if eq else math.nan
        except ValueError:
            values[key.strip()] = math.nan
    updates, start = values.get("updates", math.nan), values.get("from", math.nan)
    if kind not in ("lr", "momentum") or set(values) != {"from", "updates"} or not updates >= 1 \
            or updates != int(updates) or not (0 <= start <= 1 if kind == "lr" else 0 <= start < 1):
        raise ConfigError(f"warmup '{text}': allowed {WARMUPS} (lr: 0 <= F <= 1; momentum: 0 <= M < 1; U >= 1)")
    return Warmup(kind, start, int(updates))


@dataclass(frozen=True)
class AsyncStep:
    """The lr factor and momentum the servers apply, the rule that chose them, and the step per
    sample they give over the synchronous one's (1.0: matched).

    The step per sample of SGD with momentum m and lr over a b-sample update is lr / ((1 - m) b).
    Synchronous training over N workers (DDP, PS BSP) takes lr and m over N b samples; an
    asynchronous update (ASP, SSP) is one worker's b samples. So asynchrony matches the synchronous
    step per sample through ONE reduction: lr / N with m kept (linear scaling, Goyal et al. 2017),
    or lr kept with explicit momentum 1 - (1 - m) N ("asynchrony begets momentum", Mitliagkas et
    al. 2016). Both together make the async step N times too small per sample."""
    lr_factor: float
    momentum: float
    rule: str
    step_ratio: float  # async step per sample / the synchronous one's

    def describe(self) -> dict[str, Any]:
        return {"rule": self.rule, "lr_factor": self.lr_factor, "momentum": self.momentum,
                "step_per_sample_vs_sync": self.step_ratio}


STEP_RULES = ("auto: one reduction (lr kept and momentum 1 - (1 - m) N where that is >= 0, else lr / N with "
              "m kept)", "lr_scaling 1/n: lr / N, momentum kept", "momentum_scaling scaled: lr kept, momentum "
              "1 - (1 - m) N")


def _lr_spec(text: str, n_workers: int) -> float | None:
    """None for auto, else the factor."""
    if text == "auto":
        return None
    if text == "none":
        return 1.0
    if text == "1/n":
        return 1.0 / n_workers
    try:
        factor = float(text)
    except ValueError:
        raise ConfigError(f"lr_scaling '{text}' unknown; allowed: auto | none | 1/n | a factor > 0") from None
    if not factor > 0:
        raise ConfigError(f"lr_scaling must be > 0, got {text}")
    return factor


def _momentum_spec(text: str, n_workers: int, momentum: float) -> float | None:
    """None for auto, else the momentum."""
    if text == "auto":
        return None
    if text == "none":
        return momentum
    if text == "scaled":
        value = 1.0 - (1.0 - momentum) * n_workers
        if value < 0:
            raise ConfigError(f"momentum_scaling scaled: 1 - (1 - {momentum:g}) x {n_workers} = {value:.3g} < 0: "
                              f"momentum alone cannot match the synchronous step at {n_workers} workers; use "
                              f"lr_scaling 1/n (lr / N, momentum kept)")
        return value
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"momentum_scaling '{text}' unknown; allowed: auto | none | scaled | a momentum in "
                          f"[0, 1)") from None
    if not 0 <= value < 1:
        raise ConfigError(f"momentum_scaling must be a momentum in [0, 1), got {text}")
    return value


def resolve_step(lr_scaling: str, momentum_scaling: str, consistency: str, n_workers: int,
                 momentum: float) -> AsyncStep:
    """The servers' lr factor and momentum for a workload of momentum `momentum` (see AsyncStep).

    lr_scaling: auto | none (1) | 1/n | a factor. momentum_scaling: auto | none (m) | scaled
    (1 - (1 - m) N) | a momentum. Under bsp an update is N workers' mean, already the synchronous
    step: auto is 1 and m. Under asp/ssp, auto completes ONE reduction: both auto, lr kept and
    momentum 1 - (1 - m) N where that is >= 0 (else lr / N, m kept); one given, the other is what
    matches the synchronous step per sample (lr 1/n: m kept; momentum m': lr x (1 - m') / ((1 - m) N));
    both given, they are taken as asked and the ratio is recorded. No combination is refused."""
    kind, _ = parse_consistency(consistency)
    lr_text, m_text = str(lr_scaling).strip().lower(), str(momentum_scaling).strip().lower()
    n = n_workers if kind != "bsp" else 1  # samples per update, in worker batches
    lr_f, m = _lr_spec(lr_text, n_workers), _momentum_spec(m_text, n, momentum)
    if kind == "bsp" or n == 1:
        lr_f, m = (1.0 if lr_f is None else lr_f), (momentum if m is None else m)
        rule = "synchronous step" if kind == "bsp" else "one worker: nothing to reduce"
    elif lr_f is None and m is None:
        scaled = 1.0 - (1.0 - momentum) * n
        if momentum > 0 and scaled >= 0:
            lr_f, m, rule = 1.0, scaled, "momentum: lr kept, momentum 1 - (1 - m) N"
        else:
            lr_f, m, rule = 1.0 / n, momentum, "lr / N, momentum kept (1 - (1 - m) N < 0)"
    elif m is None:
        m = 1.0 - lr_f * (1.0 - momentum) * n
        if not 0 <= m < 1:
            raise ConfigError(f"lr_scaling {lr_scaling} with {n} workers: the matching momentum 1 - {lr_f:g} x "
                              f"(1 - {momentum:g}) x {n} = {m:.3g} is not in [0, 1); give momentum_scaling "
                              f"none (or a momentum) to take that step as asked, or lr_scaling 1/n")
        rule = "lr / N, momentum kept" if abs(lr_f * n - 1) < 1e-9 else f"lr x {lr_f:g}, momentum matched"
    elif lr_f is None:
        lr_f = (1.0 - m) / ((1.0 - momentum) * n)
        rule = ("momentum: lr kept, momentum 1 - (1 - m) N" if abs(lr_f - 1) < 1e-9
                else f"momentum {m:g}, lr matched")
    else:
        rule = "as given (lr and momentum both set)"
    ratio = (lr_f * (1.0 - momentum) * n / (1.0 - m)) if momentum < 1 else 1.0
    if kind != "bsp" and n > 1 and lr_text != "auto" and m_text != "auto" and abs(ratio - 1) > 0.01:
        rule += f": step per sample {ratio:.3g}x the synchronous one"
    return AsyncStep(lr_f, m, rule, ratio)
