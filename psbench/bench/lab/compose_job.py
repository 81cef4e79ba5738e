"""`psbench ps-job`: the finisher of a PS job whose server and workers run elsewhere
(docker compose: a ps-server container and N identical worker containers; see docker/README.md).

It watches the job through shard 0's `stats` (which workers said bye, which are waiting on the
server, how long each has been silent), then does what `psbench run --cluster` does at the end of
a PS job: `ps-fetch` (final parameters and shard stats, then the shards are told to shut down) and
`collect_ps_files` (the workers' --out files, evaluations) into one ordinary run folder,
results/<suite>/<run-id>/. So `docker compose up` ends by itself: workers exit after bye, the
server on shutdown, this process after the run folder is in place.

A worker silent for --lost-after-s (not waiting on the server, not finished) is lost. A lost worker
ends the job with one error, exit 1 (under bsp with the server's own reason, e.g. its step timeout);
under asp/ssp with --tolerate-worker-loss (fault experiments) the job finishes without it (an event
`worker_lost`, the summary's lost_workers and the manifest say so).
"""
from __future__ import annotations

import argparse
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from psbench.core.errors import ConfigError
from psbench.core.spec import RunSpec

POLL_S = 1.0


@dataclass
class JobState:
    """What the job's workers are doing, from shard 0's stats at one poll."""
    finished: set[int]
    lost: set[int]
    never_seen: set[int]
    last_error: str = ""

    def settled(self, n_workers: int) -> bool:
        return len(self.finished | self.lost) == n_workers


@dataclass
class Tracker:
    """Turns successive stats into a JobState. A worker is quiet from its last message, or from
    the last poll at which it was still waiting on the server (a bsp step, an ssp bound): waiting
    is not silence. Quiet for more than lost_after_s and not finished: lost."""
    n_workers: int
    lost_after_s: float
    quiet_since: dict[int, float] = field(default_factory=dict)

    def update(self, stats: dict, now: float) -> JobState:
        finished = {int(w) for w in stats.get("finished", [])}
        waiting = {int(w) for w in stats.get("waiting", [])}
        for w, idle in stats.get("idle_s", {}).items():
            w = int(w)
            since = now if w in waiting else now - float(idle)
            self.quiet_since[w] = max(self.quiet_since.get(w, since), since)
        lost = {w for w, t in self.quiet_since.items() if w not in finished and now - t > self.lost_after_s}
        never_seen = set(range(self.n_workers)) - set(self.quiet_since) - finished
        return JobState(finished, lost, never_seen, stats.get("last_error", ""))


@dataclass
class Watch:
    servers: list[str]
    n_workers: int
    consistency: str
    token: str | None
    lost_after_s: float = 30.0
    tolerate_loss: bool = False  # asp/ssp: finish without a lost worker
    startup_timeout_s: float = 600.0
    timeout_s: float = 3600.0

    def until_settled(self) -> JobState:
        """Poll until every worker finished or is lost; a bsp loss, no progress or a timeout raises."""
        from psbench.systems.ps.worker import ADMIN, KVWorker

        start = time.monotonic()
        tracker = Tracker(self.n_workers, self.lost_after_s)
        with KVWorker(self.servers[:1], ADMIN, [], self.token, self.startup_timeout_s) as kv:
            while True:
                state = tracker.update(kv.stats()[0], time.monotonic())
                waited = time.monotonic() - start
                if state.lost and self.consistency == "bsp":
                    raise RuntimeError(self._why(state, "under bsp a lost worker stops the job"))
                if state.lost and not self.tolerate_loss:
                    raise RuntimeError(self._why(state, "a lost worker stops the job (--tolerate-worker-loss "
                                                        "finishes without it)"))
                if state.settled(self.n_workers):
                    if not state.finished:
                        raise RuntimeError(self._why(state, "no worker finished"))
                    return state
                if state.never_seen and waited > self.startup_timeout_s:
                    raise RuntimeError(f"worker(s) {sorted(state.never_seen)} never reached the server in "
                                       f"{self.startup_timeout_s:.0f}s (started with --workers {self.n_workers}?)")
                if waited > self.timeout_s:
                    raise RuntimeError(self._why(state, f"the job did not finish in {self.timeout_s:.0f}s"))
                time.sleep(POLL_S)

    def _why(self, state: JobState, what: str) -> str:
        lost = f"worker(s) {sorted(state.lost)} silent for over {self.lost_after_s:.0f}s" if state.lost else ""
        parts = [p for p in (what, lost, f"server: {state.last_error}" if state.last_error else "") if p]
        return "; ".join(parts)

    def shutdown(self) -> None:
        """Tell the shards to exit (after a failure: nothing to fetch)."""
        from psbench.systems.ps.worker import ADMIN, KVWorker

        with KVWorker(self.servers, ADMIN, [], self.token, 30.0) as kv:
            kv.shutdown()


def wait_for_files(paths: list[Path], timeout_s: float = 120.0) -> None:
    """A worker writes its --out file right after its bye (and closing its sockets)."""
    deadline = time.monotonic() + timeout_s
    while (missing := [p for p in paths if not p.exists()]) and time.monotonic() < deadline:
        time.sleep(0.2)
    if missing:
        raise RuntimeError(f"worker file(s) {', '.join(map(str, missing))} did not appear in {timeout_s:.0f}s "
                           "after the workers said bye (is --scratch the workers' --out folder?)")


def run_job(args: argparse.Namespace) -> Path:
    from psbench.bench.lab.cluster.records import collect_ps_files, ps_fetch
    from psbench.core.records import Recorder
    from psbench.systems.common import prepare
    from psbench.systems.ps.policies import parse_consistency
    from psbench.core.exposure import TOKEN_ENV, check_exposure, split_address, token_from_args
    import psutil

    from psbench.systems.ps.worker import spec_from_args

    spec = spec_from_args(args)
    kind, _ = parse_consistency(args.consistency)
    servers = [s.strip() for s in args.servers.split(",") if s.strip()]
    token = token_from_args(args)
    for address in servers:  # the same rule as the server's: a reachable job needs a token
        check_exposure(f"server {address}", split_address(address)[0], token, args.insecure)
    if args.tolerate_worker_loss and kind == "bsp":
        raise ConfigError("--tolerate-worker-loss needs --consistency asp or ssp:S: under bsp every step needs "
                          "every worker")
    options = {"consistency": args.consistency, "servers": len(servers), "launcher": "compose"}
    if args.tolerate_worker_loss:
        options["tolerate_worker_loss"] = True  # the PS option's name: a fault experiment's run
    if args.insecure and not token:
        options["insecure"] = True  # recorded: this run accepted unauthenticated clients
    recorded = RunSpec(**{**spec.to_dict(), "options": options})
    scratch = Path(args.scratch)
    scratch.mkdir(parents=True, exist_ok=True)
    # A failed job's leftovers go; this job's workers may already have written theirs (they can
    # finish before this process has imported torch), so only files older than this process.
    started = psutil.Process().create_time()
    for stale in scratch.glob("worker*.json"):
        if stale.stat().st_mtime < started:
            stale.unlink()
    prep = prepare(spec)  # validates the workload before waiting on anything
    recorder = Recorder(recorded, target_accuracy=prep.workload.target_accuracy)
    recorder.shard_report = prep.plan.report(prep.data.y_train, prep.data.n_classes)

    watch = Watch(servers, spec.workers, kind, token, args.lost_after_s, args.tolerate_worker_loss,
                  args.startup_timeout_s, args.timeout_s)
    try:
        state = watch.until_settled()
    except Exception:
        watch.shutdown()
        raise
    fetched = scratch / "final.npz"
    env_token = {TOKEN_ENV: token} if token else {}
    os.environ.update(env_token)
    ps_fetch(["--servers", ",".join(servers), "--workload", spec.workload, "--seed", str(spec.seed),
              "--out", str(fetched)])
    outs = [scratch / f"worker{w}.json" for w in sorted(state.finished)]
    wait_for_files(outs)
    collect_ps_files(spec, [str(p) for p in outs], str(fetched), recorder)
    for w in sorted(state.lost):
        recorder.event("worker_lost", worker=w, t_wall=recorder.now(), how=f"silent for over {args.lost_after_s:.0f}s")
    recorder.extra["compose"] = {"servers": servers, "finished": sorted(state.finished), "lost": sorted(state.lost),
                                 "auth": "token" if token else "insecure"}
    result = recorder.finish(Path(args.results_dir), args.suite)
    for p in [*outs, fetched]:
        p.unlink(missing_ok=True)
    return result.out_dir


def add_arguments(p: argparse.ArgumentParser) -> None:
    from psbench.core.exposure import add_token_argument

    from psbench.systems.ps.worker import add_spec_arguments

    p.add_argument("--servers", required=True, help="host:port of the server shards, in shard order")
    add_spec_arguments(p)
    p.set_defaults(spec_json=None)  # the workers' hidden --spec-json: the job is given by the flags above
    p.add_argument("--consistency", default="asp", help="the servers' consistency: bsp | asp | ssp:S")
    p.add_argument("--scratch", required=True, help="the folder the workers write their --out files to")
    p.add_argument("--results-dir", default="results", help="results root (default ./results)")
    p.add_argument("--suite", default="compose", help="results sub-folder (default compose)")
    add_token_argument(p, "the job's shared token")
    p.add_argument("--insecure", action="store_true", help="talk to non-loopback servers without a token")
    p.add_argument("--lost-after-s", type=float, default=30.0, help="a worker silent this long is lost (default 30)")
    p.add_argument("--tolerate-worker-loss", action="store_true",
                   help="asp/ssp, for fault experiments: finish without a lost worker (recorded); by default a "
                        "lost worker fails the job")
    p.add_argument("--startup-timeout-s", type=float, default=600.0,
                   help="how long every worker has to reach the server (default 600)")
    p.add_argument("--timeout-s", type=float, default=3600.0, help="the whole job's limit (default 3600)")


def main(args: argparse.Namespace) -> int:
    """Run by `psbench ps-job`: a ConfigError is exit 2, a failed job (RuntimeError) exit 1, one line each."""
    print(f"psbench: compose job done: {run_job(args)}")
    return 0
