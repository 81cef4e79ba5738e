"""Launcher side of the allreduce systems: a job directory, process supervision (failure, timeout,
no orphans) and reading the workers' files back into the Recorder."""
from __future__ import annotations

import csv
import json
import os
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Mapping, Sequence

from psbench.core.supervisor import LAUNCHER_PID_ENV, POLL_S, Supervisor
from psbench.core.zygote import Zygote
from psbench.core.records import Recorder, split_sync_wait
from psbench.core.spec import RunSpec
from psbench.systems.allreduce_common import read_job, read_snapshots, read_state
from psbench.systems.common import evaluate_snapshots, prepare

GRACE_S = 3.0  # after a failure, how long the other processes get to write their own error files
# What the ranks' zygote imports before it forks them (torch's import is most of a rank's start:
# eight DDP ranks spent ~13 s starting on 2 cores, each importing torch).
RANK_PRELOAD = ["torch", "torch.distributed", "numpy", "psbench.systems.common", "psbench.systems.allreduce_common"]


class WorkerFailed(RuntimeError):
    """A worker process of an allreduce run failed or the run timed out; the message names the rank."""


def new_job(spec: RunSpec) -> Path:
    job = Path(tempfile.mkdtemp(prefix=f"psbench-{spec.system}-"))
    (job / "spec.json").write_text(json.dumps(spec.to_dict()))
    return job


def first_error(system: str, job: Path) -> str | None:
    """The earliest worker error is the cause; later ones are peers seeing the broken collective."""
    errors = []
    for path in job.glob("rank*.error.json"):
        try:
            errors.append(json.loads(path.read_text()))
        except (json.JSONDecodeError, OSError):
            continue
    if not errors:
        return None
    first = min(errors, key=lambda e: e["time"])
    tail = "\n".join(first["traceback"].rstrip().splitlines()[-12:])
    return f"{system} worker rank {first['rank']} failed: {first['summary']}\n{tail}"


def _log_tail(job: Path, n: int = 20) -> str:
    lines: list[str] = []
    for log in sorted(job.glob("*.log")):
        text = log.read_text(errors="replace").rstrip().splitlines()[-n:]
        if text:
            lines += [f"--- {log.name}"] + text
    return "\n".join(lines)


def spawn_ranks(sup: Supervisor, job: Path, module: str, ranks: Sequence[int], argv_of: Callable[[int], list[str]],
                env: Mapping[str, str], listener: socket.socket | None = None, listener_rank: int = 0,
                warm: bool = True) -> None:
    """Start each rank as `python -m module *argv_of(rank)` (log: job/rank{r}.log), forked from one
    warm zygote, or with warm=False each as a fresh interpreter. `listener`, the rendezvous store's
    socket bound here, goes to rank `listener_rank` only (as --listen-fd); the ranks watch this
    launcher's pid and leave if it dies."""
    fds = (listener.fileno(),) if listener is not None else ()
    env = {**env, LAUNCHER_PID_ENV: str(os.getpid())}

    def argv_log(rank: int) -> tuple[tuple[int, ...], list[str], Path]:
        keep = fds if rank == listener_rank else ()
        return keep, [*argv_of(rank), *(["--listen-fd", str(fds[0])] if keep else [])], job / f"rank{rank}.log"

    if not warm:
        for rank in ranks:
            keep, argv, log = argv_log(rank)
            sup.spawn(f"rank{rank}", [sys.executable, "-m", module, *argv], env=env, log_path=log,
                      new_session=False, pass_fds=keep)
        return
    zygote = Zygote(sup, RANK_PRELOAD, job / "zygote.log", env, pass_fds=fds)
    try:
        for rank in ranks:
            keep, argv, log = argv_log(rank)
            sup.adopt(f"rank{rank}", zygote.fork(module, argv, env, log, keep_fds=keep), log)
    finally:
        zygote.close_requests()   # it exits once the ranks have


def supervise(system: str, sup: Supervisor, job: Path, timeout_s: float,
              rank_of: Callable[[int], int | None] = lambda i: i,
              gather: Callable[[], None] = lambda: None) -> None:
    """Wait for every process; on the first failure or at the timeout, stop them all and raise one
    WorkerFailed naming the rank. On success nothing is left running either. `gather` brings
    files written on other hosts into `job` before a failure is described."""
    deadline = time.monotonic() + timeout_s
    children = [c for c in sup.children if c.role != "zygote"]   # the ranks' parent reports through them
    try:
        while True:
            codes = [c.poll() for c in children]
            if all(c == 0 for c in codes):
                return
            failed = [i for i, c in enumerate(codes) if c not in (None, 0)]
            if failed:
                # Give peers a moment to record their view, then name the earliest error.
                end = time.monotonic() + GRACE_S
                while time.monotonic() < end and sup.running(children):
                    time.sleep(POLL_S)
                sup.stop()
                gather()
                message = first_error(system, job)
                if message is None:
                    i = failed[0]
                    rank = rank_of(i)
                    who = f"rank {rank}" if rank is not None else "launcher"
                    message = (f"{system} worker {who} exited with code {codes[i]} and no error report\n"
                               + _log_tail(job))
                raise WorkerFailed(message)
            if time.monotonic() > deadline:
                sup.stop()
                raise WorkerFailed(f"{system} run timed out after {timeout_s:g} s; all workers stopped "
                                   f"(raise the timeout_s option for longer runs)")
            time.sleep(POLL_S)
    finally:
        sup.stop()  # no-op when all exited; never leaves orphans on any exit path


def collect(job: Path, ranks: list[int], recorder: Recorder, has_rank0: bool, state_out: Path | None) -> None:
    """Step rows of the given ranks, and rank 0's clock and evals, into the Recorder."""
    if has_rank0:
        meta = json.loads((job / "rank0.meta.json").read_text())
        recorder.adopt_clock(meta["t_start"], meta["t_end"], meta["paused_s"])
        recorder.extra["eval_s"] = meta["paused_s"]  # evaluation time, kept off the training clock
        recorder.extra["steps_per_worker"] = meta["steps"]
        # the gradients' allreduce timed alone in the same ranks after training (the comm_s reference)
        recorder.extra["allreduce_alone_s"] = meta.get("allreduce_alone_s")
        for row in meta["evals"]:
            recorder.eval(row["step"], row["split"], row["loss"], row["accuracy"], t_wall=row["t_wall"])
        if (job / "snapshots.npz").is_file():  # the timer evaluator's: rank 0 kept them, evaluated here
            prep = prepare(read_job(job))
            evaluate_snapshots(recorder, prep.build_model(), prep.workload.loss_fn(), prep.data,
                               read_snapshots(job / "snapshots.npz"))
    rows = []
    for rank in ranks:
        with open(job / f"rank{rank}.steps.csv", newline="") as fh:
            rows += [{"worker": int(r["worker"]), "step": int(r["step"]), "t_wall": float(r["t_wall"]),
                      "n_samples": int(r["n_samples"]), "loss": float(r["loss"]),
                      "bytes": int(r["bytes"]) if r["bytes"] else None,
                      **{c: float(r[c]) if r.get(c) else None
                         for c in ("compute_s", "emulated_s", "comm_s", "update_s", "data_s")}}
                     for r in csv.DictReader(fh)]
    split_sync_wait(rows)  # an allreduce waits for the slowest rank
    recorder.add_steps(rows)
    if state_out is not None and has_rank0:
        Path(state_out).mkdir(parents=True, exist_ok=True)
        for name in ("weights.npy", "momentum.npy", "buffers.npy"):
            if name == "buffers.npy" and not (job / name).is_file():
                continue  # older workers, or none written
            shutil.copyfile(job / name, Path(state_out) / name)
        read_state(Path(state_out))  # fail here, not later, if the copy is unreadable


def run_job(system: str, spec: RunSpec, recorder: Recorder,
            launch: Callable[[Path, Supervisor], None],
            timeout_s: float, ranks: list[int], state_out: Path | None = None,
            rank_of: Callable[[int], int | None] = lambda i: i,
            gather: Callable[[Path], None] | None = None) -> None:
    """Make a job directory, start the processes (`launch` spawns each with the supervisor, so a
    failed start still stops the earlier ones), supervise them, read their records back.
    `gather(job)`, for ranks on other hosts, copies their files into the job directory first."""
    job = new_job(spec)
    fetch = (lambda: gather(job)) if gather else (lambda: None)
    with Supervisor() as sup:
        try:
            launch(job, sup)
            supervise(system, sup, job, timeout_s, rank_of, fetch)
            fetch()
            collect(job, ranks, recorder, 0 in ranks, state_out)
        finally:
            sup.stop()
            shutil.rmtree(job, ignore_errors=True)
