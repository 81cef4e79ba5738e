"""The worker side: `KVWorker`, a ps-lite style client of all server shards (push / pull / push-pull),
and the training loop a worker process runs on its data shard.

One step = one multipart message to each shard (the gradients of the shard's keys, zero-copy from
the model's .grad tensors) and one reply from each (staleness, and the fresh parameters, copied
straight into the model's weights). Shards are asked in parallel: send to all, then receive.

Run by hand: `psbench ps-worker --servers 127.0.0.1:5555 --worker-id 0 --workers 2 --workload mlp-digits`
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from psbench.core.accelerator import timed_copy
from psbench.core.supervisor import watch_launcher
from psbench.systems.ps import protocol
from psbench.core.exposure import add_token_argument, address_host, token_from_args
from psbench.systems.ps.curve import secure_client
from psbench.systems.ps.curve import wanted as curve_wanted
from psbench.systems.ps.partition import partition_keys
from psbench.systems.ps.server import add_curve_argument

ADMIN = -1
PROGRESS_EVERY_S = 1.0  # how often a launched worker sends its new step rows to the launcher


@dataclass
class PushReply:
    staleness: int | None  # max over shards; None if no shard applied it (skipped, or a duplicate's unknown)
    version: int
    replies: dict[int, protocol.Message] = field(default_factory=dict)  # shard -> its answer
    nbytes: int = 0

    @property
    def params(self) -> dict[int, np.ndarray]:
        """The parameters of the answers, per key (views on the received frames)."""
        return {k: a for m in self.replies.values() for k, a in zip(m.keys, m.arrays)}


@dataclass
class InFlight:
    """Requests sent and not yet answered (their frames are kept for resending)."""
    rid: int
    requests: dict[int, list[Any]]
    nbytes: int


class KVWorker:
    """Client of S shards. Keys are model tensor indices; `partition_keys` says which shard owns which."""

    def __init__(self, addresses: Sequence[str], worker_id: int, shapes: Sequence[Sequence[int]],
                 token: str | None = None, timeout_s: float = 120.0, max_bytes: int = protocol.DEFAULT_MAX_BYTES,
                 retry_s: float = 5.0, curve: bool | None = None):
        """`curve`: None speaks CURVE to a non-loopback address when there is a token (as the shard
        bound there does), True and False to every address."""
        import zmq

        self.worker_id = worker_id
        self.token = token
        self.timeout_ms = int(timeout_s * 1000)
        # A request unanswered for retry_s is sent again (a shard that crashed and restarted lost
        # it); each carries a request id, so the shard never applies a retried push twice and we
        # drop late answers to requests already answered.
        self.retry_ms = max(1, int(retry_s * 1000))
        self.rid = 0
        self.retries = 0
        self.max_bytes = max_bytes
        self.addresses = list(addresses)
        self.shapes = [tuple(s) for s in shapes]
        # no shapes: a client that only registers or administers (it never routes keys)
        self.layout = (partition_keys([math.prod(s) for s in self.shapes], len(self.addresses)) if self.shapes
                       else [[] for _ in self.addresses])
        self.owner = {k: j for j, ks in enumerate(self.layout) for k in ks}
        # Tensor fusion: a shard's keys are a contiguous slice [lo, hi) of the model's flat vector,
        # pushed and answered as one packed frame (header layout computed once).
        sizes = [math.prod(s) for s in self.shapes]
        starts = [sum(sizes[:k]) for k in range(len(sizes))]
        self.spans = [(starts[ks[0]], starts[ks[-1]] + sizes[ks[-1]]) if ks else (0, 0) for ks in self.layout]
        self.wire_layouts = [protocol.PackedLayout(ks, [list(self.shapes[k]) for k in ks]) for ks in self.layout]
        self.versions = [0] * len(self.addresses)  # the version of each shard's parameters we hold
        self._again, self._rcvtimeo_opt = zmq.Again, zmq.RCVTIMEO
        self.ctx = zmq.Context.instance()
        self.sockets = []
        for addr in self.addresses:
            sock = self.ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 2000)
            protocol.limit_frames(sock, max_bytes)
            if curve_wanted(address_host(addr), token, curve):
                secure_client(sock, token)
            sock.connect(addr if "://" in addr else f"tcp://{addr}")
            self.sockets.append(sock)
        self._rcvtimeo = [-1] * len(self.sockets)  # the receive timeout each socket has now (ms)

    def close(self) -> None:
        for sock in self.sockets:
            sock.close()
        self.sockets = []

    def __enter__(self) -> "KVWorker":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ---- one round: a message to some shards, their replies ------------------------------------
    def _round(self, requests: dict[int, list[Any]]) -> tuple[dict[int, protocol.Message], int]:
        return self._collect(self._send(requests))

    def _send(self, requests: dict[int, list[Any]]) -> InFlight:
        nbytes = 0
        rid = self.rid  # the id _msg put into every request of this round
        self.rid += 1
        for j, frames in requests.items():
            protocol.send_frames(self.sockets[j], frames)
            nbytes += sum(memoryview(f).nbytes if not isinstance(f, bytes) else len(f) for f in frames)
        return InFlight(rid, requests, nbytes)

    def _collect(self, flight: InFlight) -> tuple[dict[int, protocol.Message], int]:
        nbytes = flight.nbytes
        replies: dict[int, protocol.Message] = {}
        for j, frames in flight.requests.items():
            msg = self._receive(j, flight.rid, frames)
            replies[j] = protocol.check_error(msg, f"server shard {j} ({self.addresses[j]})")
            if msg.op == "params":
                self.versions[j] = msg.version
            nbytes += msg.nbytes
        return replies, nbytes

    def _receive(self, j: int, rid: int, frames: list[Any]) -> protocol.Message:
        """Shard j's answer to request `rid`: resend every retry_s, drop answers to older requests,
        give up after the timeout or when our launcher is gone. An answer that names no request id
        (or a newer one) answers nothing we asked: an error, never taken for the one in flight."""
        sock = self.sockets[j]
        waited = 0
        next_retry = self.retry_ms
        while True:
            step_ms = max(1, min(1000, next_retry - waited, self.timeout_ms - waited))
            if self._rcvtimeo[j] != step_ms:
                sock.setsockopt(self._rcvtimeo_opt, step_ms)
                self._rcvtimeo[j] = step_ms
            try:  # a blocking receive with a timeout: one call, where a poll and a receive are two
                raw = protocol.recv_frames(sock)
            except self._again:
                waited += step_ms
                if waited >= self.timeout_ms:
                    raise protocol.PSError(f"server shard {j} at {self.addresses[j]} did not answer within "
                                           f"{self.timeout_ms / 1000:.0f}s") from None
                if waited >= next_retry:
                    protocol.send_frames(sock, frames)
                    self.retries += 1
                    next_retry += self.retry_ms
                continue
            msg = protocol.decode(raw, max_bytes=self.max_bytes, ops=protocol.REPLY_OPS, expect=self.wire_layouts[j])
            got = msg.extra.get("rid")
            if got == rid:
                return msg
            if got is None or got > rid:
                said = f" ({msg.op}: {msg.extra['error']})" if msg.op == "error" and "error" in msg.extra else ""
                raise protocol.PSError(f"server shard {j} ({self.addresses[j]}) sent an answer "
                                       f"{'without a request id' if got is None else f'to request {got}'} while "
                                       f"request {rid} was in flight{said}")
            # else: a late answer to a request we already have the answer to

    def _by_shard(self, keys: Sequence[int], arrays: Sequence[np.ndarray] | None = None) -> dict[int, tuple[list, list]]:
        owner = self.owner
        out: dict[int, tuple[list, list]] = {}
        for i, k in enumerate(keys):
            ks, arrs = out.setdefault(owner[k], ([], []))
            ks.append(k)
            if arrays is not None:
                arrs.append(arrays[i])
        return out

    def _msg(self, op: str, step: int, keys: Sequence[int] = (), arrays: Sequence[np.ndarray] = (),
             version: int = 0, packed: Any = None, **extra: Any) -> list[Any]:
        return protocol.encode(op, worker=self.worker_id, step=step, version=version, keys=keys, arrays=arrays,
                               token=self.token, rid=self.rid, packed=packed, **extra)

    # ---- the ps-lite API ----------------------------------------------------------------
    def pull(self, keys: Sequence[int] | None = None, step: int = 0) -> tuple[dict[int, np.ndarray], int]:
        """Parameters of `keys` (default all) and the lowest shard version among them."""
        keys = list(range(len(self.shapes))) if keys is None else list(keys)
        groups = self._by_shard(keys)
        replies, self.last_bytes = self._round({j: self._msg("pull", step, want_keys=ks) for j, (ks, _) in groups.items()})
        params = {k: a for m in replies.values() for k, a in zip(m.keys, m.arrays)}
        return params, min(m.version for m in replies.values())

    def push(self, keys: Sequence[int], grads: Sequence[np.ndarray], step: int = 0,
             want_params: bool = False) -> PushReply:
        """Send gradients (each shard gets exactly its keys). With want_params the reply carries
        the shard's parameters after the update (ps-lite's PushPull): one round trip per step."""
        return self.push_wait(self.push_start(keys, grads, step, want_params))

    def push_start(self, keys: Sequence[int], grads: Sequence[np.ndarray], step: int = 0, want_params: bool = False,
                   based_on: Sequence[int] | None = None) -> InFlight:
        """Send a push without waiting for its replies (ps-lite's asynchronous Push; finish it with
        push_wait). `based_on`: per shard, the version the gradients were computed on, for a worker
        that computes before the previous reply is in (the shard then counts the staleness from it)."""
        groups = self._by_shard(keys, grads)
        # the header's version says which parameters the worker holds (informational: the shard's
        # own record of what it sent, or `based_on`, decides the staleness)
        extra = {} if based_on is None else {j: {"based_on": int(based_on[j])} for j in groups}
        requests = {}
        for j, (ks, arrs) in groups.items():
            # a shard's whole key range goes packed: one array as is, several joined (a copy; the
            # training loop's push_flat_start sends slices of one buffer instead, no copy)
            packed = None
            if ks == self.layout[j]:
                packed = (np.ascontiguousarray(arrs[0]) if len(arrs) == 1 else
                          np.concatenate([np.asarray(a).reshape(-1) for a in arrs]))
            requests[j] = self._msg("push", step, ks, arrs, version=self.versions[j], want_params=want_params,
                                    packed=packed, **extra.get(j, {}))
        return self._send(requests)

    def push_flat_start(self, flat: np.ndarray, step: int = 0, want_params: bool = False,
                        based_on: Sequence[int] | None = None, report: tuple[float, float] | None = None) -> InFlight:
        """push_start of every key's gradient, given as one flat float32 vector in key order: each
        shard gets its slice, one packed frame, zero-copy. `report` (bsp): this step's (training
        loss, training clock), to shard 0, whose reply shares the step's mean with every worker."""
        requests = {}
        for j, (lo, hi) in enumerate(self.spans):
            extra = {} if based_on is None else {"based_on": int(based_on[j])}
            if report is not None and j == 0:
                extra["report"] = [float(report[0]), float(report[1])]
            requests[j] = protocol.encode("push", worker=self.worker_id, step=step, version=self.versions[j],
                                          keys=self.layout[j], layout=self.wire_layouts[j], packed=flat[lo:hi],
                                          token=self.token, rid=self.rid, want_params=want_params, **extra)
        return self._send(requests)

    def push_wait(self, flight: InFlight) -> PushReply:
        replies, nbytes = self._collect(flight)
        taus = [int(m.extra["staleness"]) for m in replies.values() if m.extra.get("staleness") is not None]
        return PushReply(max(taus) if taus else None, min(m.version for m in replies.values()), replies, nbytes)

    def push_pull(self, grads: Sequence[np.ndarray], step: int) -> PushReply:
        return self.push(range(len(grads)), grads, step, want_params=True)

    # ---- set-up and tear-down (admin or any worker) ----------------------------------------
    def init(self, tensors: Sequence[np.ndarray], slot: str = "params", version: int = 0, step: int = 0,
             if_absent: bool = False) -> bool:
        """Load initial tensors into every shard; True if this call initialised them."""
        groups = self._by_shard(range(len(tensors)), tensors)
        replies, _ = self._round({j: self._msg("init", step, ks, arrs, version=version, slot=slot, if_absent=if_absent)
                                  for j, (ks, arrs) in groups.items()})
        return all(m.extra.get("initialised", False) for m in replies.values())

    def state(self, slot: str = "params") -> list[np.ndarray]:
        return self.state_at(slot)[0]

    def state_at(self, slot: str = "params") -> tuple[list[np.ndarray], int]:
        """A slot's tensors (admin) and the lowest shard version they were read at."""
        replies, _ = self._round({j: self._msg("state", 0, slot=slot) for j in range(len(self.sockets))})
        tensors = {k: a for m in replies.values() for k, a in zip(m.keys, m.arrays)}
        return [tensors[k] for k in range(len(self.shapes))], min(m.version for m in replies.values())

    def stats(self) -> list[dict[str, Any]]:
        replies, _ = self._round({j: self._msg("stats", 0) for j in range(len(self.sockets))})
        return [replies[j].extra["stats"] for j in range(len(self.sockets))]

    def register(self, nonce: str) -> int:
        """Ask shard 0 for the next free worker id (for workers started without one)."""
        replies, _ = self._round({0: self._msg("register", 0, nonce=nonce)})
        return int(replies[0].extra["assigned"])

    def bye(self) -> None:
        self._round({j: self._msg("bye", 0) for j in range(len(self.sockets))})

    def shutdown(self) -> None:
        self._round({j: self._msg("shutdown", 0) for j in range(len(self.sockets))})


# ---- the training loop ----------------------------------------------------------------------

@dataclass
class WorkerResult:
    rows: dict[str, list]                       # columns: step, t_wall, n_samples, loss, staleness, bytes
    snapshot_steps: list[int] = field(default_factory=list)
    snapshot_t: list[float] = field(default_factory=list)
    snapshots: list[np.ndarray] = field(default_factory=list)  # flat params (+ float buffers) at those steps
    final_buffers: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))  # e.g. BatchNorm stats
    stopped_at: int | None = None               # the steps done when the shared step stop fired (None: never)


class Trainer:
    """A worker's training loop. `__init__` does the set-up (model, views) before the clock starts;
    `run` pulls, then per mini-batch: forward/backward, push the gradients, take the fresh parameters
    from the reply. With `pipeline` (ASP only) the push's round trip overlaps the next step's
    forward/backward, which therefore runs on the parameters of the reply before (staleness >= 1),
    as ps-lite's asynchronous Push allows. With `snapshots`, keep a copy of the parameters every
    eval_every steps (the launcher evaluates them off the clock). With `step_stop` (bsp: a switch's
    sync phase), every push reports the step's loss and clock to shard 0, and the worker stops
    after the step whose shared report (the mean over workers, the same in every reply) makes
    step_stop(steps done, mean loss, clock) true: every worker at the same step."""

    def __init__(self, prep, kv: KVWorker, worker_id: int, start_step: int = 0, snapshots: bool = False,
                 fail_at_step: int | None = None, progress=None, halt_at_step: int | None = None,
                 pipeline: bool = False, step_stop: Callable[[int, float, float], bool] | None = None):
        self.prep, self.kv, self.worker_id, self.pipeline = prep, kv, worker_id, pipeline
        self.step_stop = step_stop
        self.start_step, self.snapshots, self.fail_at_step = start_step, snapshots, fail_at_step
        # progress(step, new_rows, halted): called every PROGRESS_EVERY_S with the rows made since
        # the last call, so a worker that dies has sent most of its rows; at halt_at_step (fault
        # injection) it is called with halted=True and is expected not to return (SIGKILL).
        self.progress, self.halt_at_step = progress, halt_at_step
        import torch

        from psbench.core.accelerator import torch_device

        self.device = torch_device(prep.spec.device, worker_id)  # on a GPU: one a worker, modulo those seen
        on_gpu = self.device.type == "cuda"
        self.model = prep.build_model().to(self.device)
        self.loss_fn = prep.workload.loss_fn()
        self.params = list(self.model.parameters())
        # Tensor fusion: the weights are views of one flat vector (a reply is one copy per shard),
        # the gradients views of one flat buffer that backward accumulates into (a push sends a slice
        # per shard, zero-copy). Pipelined, two gradient buffers take turns: a push still in flight
        # keeps its values while the next backward runs. On a CPU the wire's host buffers are the
        # model's own; on a GPU the model's are on the device, the wire's pinned host buffers beside
        # them, and each step copies the gradients out and the parameters back (h2d_d2h_s).
        flat = torch.cat([p.detach().reshape(-1) for p in self.params])
        n_buffers = 2 if pipeline else 1
        self.device_flat = flat
        self.device_grads = [torch.zeros_like(flat) for _ in range(n_buffers)]
        host_flat = flat.cpu().pin_memory() if on_gpu else flat
        self.host_flat = host_flat
        self.flat = host_flat.numpy()  # the wire's parameters (on a CPU: shared with the model's weights)
        self.grad_flats = [g.cpu().pin_memory() for g in self.device_grads] if on_gpu else self.device_grads
        self.grad_views: list[list] = [[] for _ in self.device_grads]
        offset = 0
        self.views = []  # per key, views of self.flat
        for p in self.params:
            n = p.numel()
            p.data = flat[offset:offset + n].view_as(p)
            for views, g in zip(self.grad_views, self.device_grads):
                views.append(g[offset:offset + n].view_as(p))
            self.views.append(self.flat[offset:offset + n].reshape(p.shape))
            offset += n
        # Buffers (BatchNorm running statistics) are not trained by the PS: each worker keeps its own;
        # worker 0's go with its snapshots so evaluation uses them.

    def flat_buffers(self) -> np.ndarray:
        from psbench.systems.common import flat_buffers

        return flat_buffers(self.model)

    def load_buffers(self, flat: np.ndarray) -> None:
        """Start from another phase's BatchNorm running statistics (a Strategy-Switch hand-off)."""
        from psbench.systems.common import set_flat_buffers

        set_flat_buffers(self.model, flat)

    def load(self, tensors: dict[int, np.ndarray]) -> None:
        for k, a in tensors.items():
            np.copyto(self.views[k], a)

    def parameters_to_device(self) -> float:
        """The wire's parameters into the model's (host->device): the seconds it took, 0 on a CPU."""
        return timed_copy(self.device_flat, self.host_flat, self.device)

    def gradients_to_host(self, buffer: int) -> float:
        """A step's gradients into the wire's buffer (device->host): the seconds it took, 0 on a CPU."""
        return timed_copy(self.grad_flats[buffer], self.device_grads[buffer], self.device)

    def load_reply(self, reply: PushReply) -> None:
        """The fresh parameters of a push's answers: one copy per shard (a packed answer)."""
        for j, msg in reply.replies.items():
            if msg.flat is not None and msg.keys == self.kv.layout[j]:
                lo, hi = self.kv.spans[j]
                np.copyto(self.flat[lo:hi], msg.flat)
            else:
                self.load(dict(zip(msg.keys, msg.arrays)))

    def push(self, step: int, buffer: int, based_on: Sequence[int] | None = None,
             report: tuple[float, float] | None = None) -> InFlight:
        """Send the gradients in grad_flats[buffer] (each shard its slice) asking for the new weights."""
        return self.kv.push_flat_start(self.grad_flats[buffer].numpy(), step, True, based_on, report)

    def stops_after(self, step: int, reply: PushReply) -> bool:
        """step_stop on the step's shared report (shard 0's reply)."""
        shared = reply.replies[0].extra
        if "step_loss" not in shared:
            raise protocol.PSError(f"worker {self.worker_id}: shard 0's reply to step {step} carries no step report; "
                                   f"a shared step stop needs the shards to run bsp")
        return bool(self.step_stop(step + 1, float(shared["step_loss"]), float(shared["step_clock_s"])))

    def exchange(self, flight: InFlight) -> PushReply:
        """Wait for a push's answers and load the weights they carry."""
        reply = self.kv.push_wait(flight)
        self.load_reply(reply)
        return reply

    def run(self, t0: float) -> WorkerResult:
        from psbench.systems.common import StepClock, compute_step
        from psbench.systems.ps.launch import WORKER_ROW_COLUMNS

        prep, kv, worker_id = self.prep, self.kv, self.worker_id
        tensors, _ = kv.pull(step=self.start_step)
        self.load(tensors)
        self.parameters_to_device()
        every, last = prep.eval_every(worker_id), prep.total_steps(worker_id)
        cols: dict[str, list] = {c: [] for c in WORKER_ROW_COLUMNS}
        out = WorkerResult(cols)
        clock = StepClock(prep.pacer(worker_id), device=self.device)
        bsp = str(prep.spec.options.get("consistency", "asp")) == "bsp"  # one bsp update: every worker's batch
        budget = prep.budget_updates(prep.batch_size * (prep.spec.workers if bsp else 1))
        deadline = prep.budget_seconds()  # --budget seconds=T on the run's clock (t0: its zero, epoch s)

        def finish(step: int, n_samples: int, loss: float, flight: InFlight,
                   times: tuple[float, float, float, float]) -> PushReply:
            """Take step's reply: load the fresh parameters (update_s) and copy them to the device,
            record the row (and a snapshot). comm_s: the whole push+pull (a pipelined push: only the
            time blocked on its reply); the adapter splits off the wait for other workers under
            bsp/ssp. h2d_d2h_s: the step's gradients out and these parameters in (0 on a CPU)."""
            blocked = time.perf_counter()
            reply = self.kv.push_wait(flight)
            loading = time.perf_counter()
            self.load_reply(reply)
            update = time.perf_counter() - loading
            compute, emulated, data, to_host = times
            copies = to_host + self.parameters_to_device()
            comm = loading - blocked if self.pipeline else clock.split().comm_s - update - copies
            t = time.time() - t0
            for name, value in zip(cols, (step, t, n_samples, loss, reply.staleness, reply.nbytes, compute, emulated,
                                          comm, 0.0, update, data, copies), strict=True):
                cols[name].append(value)
            if self.snapshots and (step + 1) % every == 0 and step + 1 < last:
                out.snapshot_steps.append(step + 1)
                out.snapshot_t.append(t)
                out.snapshots.append(np.concatenate([self.flat, self.flat_buffers()]))
            return reply

        in_flight: tuple[int, int, float, InFlight] | None = None  # pipeline: the push not yet answered
        sent, next_progress = 0, time.monotonic() + PROGRESS_EVERY_S
        for step, x, y in itertools.islice(prep.batches(worker_id, clock), self.start_step, None):
            if self.fail_at_step is not None and step == self.fail_at_step:
                raise RuntimeError(f"injected failure in worker {worker_id} at step {step}")
            if deadline is not None and time.time() - t0 >= deadline:
                break  # out of time: this worker trains no further step (under bsp the round goes on without it)
            halt = self.halt_at_step is not None and step >= self.halt_at_step
            if self.progress is not None and (halt or time.monotonic() >= next_progress):
                self.progress(step, {c: v[sent:] for c, v in cols.items()}, halt)
                sent, next_progress = len(cols["step"]), time.monotonic() + PROGRESS_EVERY_S
            buffer = step % len(self.grad_flats)  # pipelined: not the one of the push in flight
            loss = compute_step(self.model, self.loss_fn, x, y, clock, step, self.grad_views[buffer])
            times = (clock.compute_s, clock.emulated_s, clock.data_s, self.gradients_to_host(buffer))
            if self.pipeline:
                based_on = list(kv.versions)  # the parameters these gradients were computed on
                if in_flight is not None:
                    finish(*in_flight)
                in_flight = (step, len(y), loss, self.push(step, buffer, based_on), times)
            elif self.step_stop is not None:
                reply = finish(step, len(y), loss, self.push(step, buffer, report=(loss, time.time() - t0)), times)
                if step + 1 < last and self.stops_after(step, reply):  # (at the last step the phase ends anyway)
                    out.stopped_at = step + 1
                    break
            else:
                finish(step, len(y), loss, self.push(step, buffer), times)
            if budget is not None and min(kv.versions) >= budget:
                break  # the global step reached the budget (TensorFlow's global step, seen in each reply)
        if in_flight is not None:
            finish(*in_flight)
        out.final_buffers = self.flat_buffers()
        kv.bye()
        return out


# ---- the process entry point ----------------------------------------------------------------

def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--servers", required=True, help="comma-separated host:port of the server shards, in shard order")
    p.add_argument("--worker-id", required=True,
                   help="this worker's index (0..workers-1), or auto: ask shard 0 for the next free one")
    add_spec_arguments(p)
    add_token_argument(p, "the job's shared token")
    add_curve_argument(p)
    p.add_argument("--timeout-s", type=float, default=120.0, help="how long to wait for a server reply")
    p.add_argument("--out", help="write this worker's step rows here (JSON) when done; {worker} is replaced "
                                 "by the worker id (e.g. /results/w{worker}.json)")
    p.add_argument("--init", action="store_true", help="initialise the shards from the seeded model if not yet done")
    p.add_argument("--spec-json", help=argparse.SUPPRESS)  # the launcher passes its RunSpec whole
    p.add_argument("--start-step", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--control", help=argparse.SUPPRESS)
    p.add_argument("--snapshots", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--fail-at-step", type=int, help=argparse.SUPPRESS)  # fault injection for tests
    p.add_argument("--init-buffers", help=argparse.SUPPRESS)  # .npy of BatchNorm statistics to start from
    p.add_argument("--halt-at-step", type=int, help=argparse.SUPPRESS)  # the launcher SIGKILLs us there
    p.add_argument("--retry-s", type=float, default=5.0, help="resend a request unanswered this long (default 5)")
    p.add_argument("--pipeline", action="store_true",
                   help="asp only: overlap each push's round trip with the next step's compute (staleness >= 1)")
    p.add_argument("--stop-criterion", help=argparse.SUPPRESS)  # bsp: a switch's criterion on the shared step report


def add_spec_arguments(p: argparse.ArgumentParser) -> None:
    """The job's settings every worker (and a job's finisher, bench.compose_job) must agree on."""
    p.add_argument("--workers", type=int, default=1, help="number of workers in the job (for the data shards)")
    p.add_argument("--workload", help="workload name (see `psbench list`)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--epochs", type=int)
    p.add_argument("--batch-size", type=int)
    p.add_argument("--max-steps", type=int)
    p.add_argument("--sharding", default="random")
    p.add_argument("--evals-per-epoch", type=int, default=2)
    p.add_argument("--data-dir")


def spec_from_args(args: argparse.Namespace):
    """The run a worker command line describes: its --spec-json, or the flags of a hand-started worker."""
    from psbench.core.spec import RunSpec
    from psbench.core.errors import ConfigError

    if args.spec_json:
        return RunSpec.from_dict(json.loads(args.spec_json))
    if not args.workload:
        raise ConfigError("give --workload")
    return RunSpec(system="ps", workload=args.workload, workers=args.workers, seed=args.seed, epochs=args.epochs,
                   batch_size=args.batch_size, sharding=args.sharding, max_steps=args.max_steps,
                   evals_per_epoch=args.evals_per_epoch, data_dir=args.data_dir)


def parse_worker_id(text: str, workers: int) -> int | None:
    """An id in 0..workers-1, or None for 'auto'."""
    from psbench.core.errors import ConfigError

    text = str(text).strip()
    if text == "auto":
        return None
    if not text.lstrip("-").isdigit() or not 0 <= int(text) < workers:
        raise ConfigError(f"--worker-id must be auto or in 0..{workers - 1}, got {text}")
    return int(text)


def main(args: argparse.Namespace) -> int:
    with protocol.zmq_process():  # every zero-copy frame sent and released before the interpreter exits
        return _main(args)


def _main(args: argparse.Namespace) -> int:
    import secrets

    from psbench.systems.common import configure_threads, prepare

    configure_threads(1)
    watch_launcher(or_parent=False)  # started by hand (no launcher pid): stays
    spec = spec_from_args(args)
    worker_id = parse_worker_id(args.worker_id, spec.workers)
    token = token_from_args(args)
    addresses = [a.strip() for a in args.servers.split(",") if a.strip()]
    curve = True if args.curve else None  # None: CURVE to non-loopback shards (as they speak it)
    if worker_id is None:  # ids are handed out before the data shard (which depends on the id) loads
        with KVWorker(addresses[:1], ADMIN, [], token, args.timeout_s, retry_s=args.retry_s, curve=curve) as reg:
            worker_id = reg.register(secrets.token_hex(8))
        print(f"ps-worker: registered as worker {worker_id} of {spec.workers}", file=sys.stderr, flush=True)
    prep = prepare(spec)
    step_stop = None
    if args.stop_criterion:
        from psbench.systems.switch.criteria import step_stop_for

        step_stop = step_stop_for(args.stop_criterion, prep, spec.workers)
    model = prep.build_model()
    shapes = [tuple(p.shape) for p in model.parameters()]
    if args.init:  # the launcher's request, made as the admin (the job's token is ours too)
        with KVWorker(addresses, ADMIN, shapes, token, args.timeout_s, retry_s=args.retry_s, curve=curve) as admin:
            admin.init([p.detach().numpy() for p in model.parameters()], if_absent=True, step=args.start_step)
    with KVWorker(addresses, worker_id, shapes, token, args.timeout_s, retry_s=args.retry_s, curve=curve) as kv:
        del model
        init_buffers = np.load(args.init_buffers, allow_pickle=False) if args.init_buffers else None
        if args.control:
            from psbench.systems.ps.launch import WorkerControl

            with WorkerControl(args.control, worker_id, token) as ctl:
                trainer = Trainer(prep, kv, worker_id, args.start_step, args.snapshots, args.fail_at_step,
                                  ctl.progress, args.halt_at_step, args.pipeline, step_stop)
                if init_buffers is not None:
                    trainer.load_buffers(init_buffers)
                t0, start_step, go_buffers = ctl.wait_go()  # a phase before may set where to start
                trainer.start_step = max(trainer.start_step, start_step)
                if go_buffers is not None:
                    trainer.load_buffers(go_buffers)
                result = trainer.run(t0)
                ctl.done(result)
        else:
            trainer = Trainer(prep, kv, worker_id, args.start_step, args.snapshots, args.fail_at_step,
                              pipeline=args.pipeline, step_stop=step_stop)
            if init_buffers is not None:
                trainer.load_buffers(init_buffers)
            t0 = time.time()
            result = trainer.run(t0)
    if args.out:
        from psbench.core.atomic import atomic_write_json

        atomic_write_json(args.out.replace("{worker}", str(worker_id)), {"worker": worker_id, "t0": t0, "rows": result.rows})
    if not args.control:
        n = len(result.rows["step"])
        mean_loss = float(np.mean(result.rows["loss"][-10:])) if n else float("nan")
        print(f"ps-worker {worker_id}: {n} steps, last losses {mean_loss:.4f}, "
              f"mean staleness {np.mean(result.rows['staleness']) if n else 0:.2f}")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m psbench.systems.ps.worker", description=__doc__.splitlines()[0])
    add_arguments(parser)
    sys.exit(main(parser.parse_args()))
