"""`psbench run --config FILE --launcher slurm`: every run of an experiment that is not already
complete (resume, as a local suite) becomes one Slurm job, `sbatch --wait deploy/slurm/psbench.sbatch`
with the run's settings, one job at a time; the job's rank 0 writes the run folder into the suite
folder (a file system every node shares) under the run id a local run has.

Always a batch job of its own, also inside an allocation (SLURM_JOB_ID set): each run then has its
own job id, output and accounting, and a suite outlives the allocation it was started from.

Ranks: ddp and horovod a rank a worker, ps its shards (ranks 0..S-1) and its workers; spread over
min(ranks, nodes) nodes, ceil(ranks / nodes) a node (sinfo gives the nodes and their CPUs; more
tasks a node than its CPUs is refused, as Slurm would hold the job). The CPU
plan is the local one's per process (runner.plan), summed over the ranks each node holds and set
against that node's CPUs as Slurm reports them; a node it oversubscribes is refused, or with
--allow-oversubscribe warned of and recorded (the manifest's extra.launch.slurm_plan).
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from psbench.bench.harness import store
from psbench.bench.harness.results import FAILED_DIR
from psbench.bench.harness.runner import PLAN_DECIMALS, PlannedRun, clean_staging, is_complete, plan, plan_text
from psbench.bench.lab.launch.env import LAUNCHED_SYSTEMS, PLAN_ENV
from psbench.bench.lab.slurm import Job
from psbench.core.cpu import LAUNCHER, WORKERS
from psbench.core.errors import ConfigError
from psbench.core.exposure import read_token
from psbench.core.spec import RunSpec

SCRIPT = Path(__file__).resolve().parents[4] / "deploy" / "slurm" / "psbench.sbatch"
TOKEN_NEEDED = ("ps under --launcher slurm needs the job's token: --token-file FILE (mode 600, readable on "
                "every node), never the command line")
ALLREDUCE_REMEDY = ("torch's store, gloo and Horovod's rendezvous have no authentication: set the option "
                    "insecure = true for that system in the experiment (recorded in the manifest)")


@dataclass(frozen=True)
class Nodes:
    """The cluster as sinfo reports it: how many nodes, and the CPUs of the smallest."""
    count: int
    cpus: int


# node states a job can be placed on (now or once their jobs end); sinfo marks others' flags with a
# suffix (* not responding, ~ powered off, ...), which leaves the node out
USABLE_STATES = ("idle", "mix", "alloc", "comp", "resv", "plnd")
SINFO_FORMAT = "%N %c %t %P"


def parse_sinfo(text: str) -> Nodes:
    """`sinfo --noheader --Node --format='%N %c %t %P'`: the usable nodes of the default partition
    (sbatch's, marked *; every partition where none is), a node once."""
    rows = [line.split() for line in text.splitlines() if len(line.split()) == 4 and line.split()[1].isdigit()]
    if any(row[3].endswith("*") for row in rows):
        rows = [row for row in rows if row[3].endswith("*")]
    cpus = {name: int(count) for name, count, state, _ in rows if state in USABLE_STATES}
    if not cpus:
        raise ConfigError(f"sinfo lists no usable node (states {', '.join(USABLE_STATES)}) with its CPUs; got "
                          f"{text.strip()[:200]!r}")
    return Nodes(len(cpus), min(cpus.values()))


def read_nodes() -> Nodes:
    try:
        done = subprocess.run(["sinfo", "--noheader", "--Node", f"--format={SINFO_FORMAT}"], capture_output=True,
                              text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ConfigError(f"--launcher slurm needs Slurm's sinfo here: {exc}") from exc
    if done.returncode != 0:
        raise ConfigError(f"sinfo failed (exit {done.returncode}): {(done.stderr.strip() or 'no output').splitlines()[0]}")
    return parse_sinfo(done.stdout)


@dataclass(frozen=True)
class Placement:
    """One run's job: its ranks (by role, in rank order), nodes and tasks a node."""
    roles: tuple[str, ...]
    nodes: int
    tasks_per_node: int

    @property
    def ranks(self) -> int:
        return len(self.roles)

    def node_roles(self, node: int) -> tuple[str, ...]:
        """The ranks srun's block distribution puts on `node`: the next tasks_per_node in rank order."""
        return self.roles[node * self.tasks_per_node:(node + 1) * self.tasks_per_node]

    def sbatch_args(self) -> list[str]:
        return [f"--nodes={self.nodes}", f"--ntasks={self.ranks}", f"--ntasks-per-node={self.tasks_per_node}"]


def rank_roles(planned: PlannedRun) -> tuple[str, ...]:
    """A rank per process psbench launch starts: ps its shards first (ranks 0..S-1), then every
    system its workers; a local run's other processes (its launcher, horovodrun) have no rank."""
    procs = [p for p in planned.processes if p.role == WORKERS or (planned.spec.system == "ps" and p.role != LAUNCHER)]
    return tuple(p.role for p in sorted(procs, key=lambda p: p.role == WORKERS) for _ in range(p.count))


def place(spec: RunSpec, roles: tuple[str, ...], nodes: Nodes) -> Placement:
    """The ranks spread over the nodes. Slurm gives each task a CPU: a run with more tasks a node
    than a node's CPUs is refused here (the script asks for --ntasks-per-node, which --overcommit
    does not lift: slurm-wlm 22.05 rejects the job, "Requested node configuration is not available")."""
    used = min(len(roles), nodes.count)
    per_node = math.ceil(len(roles) / used)
    if per_node > nodes.cpus:
        raise ConfigError(f"run {spec.run_id} has {len(roles)} ranks, {per_node} a node on {used} node(s); a Slurm "
                          f"node has {nodes.cpus} CPUs (sinfo) and Slurm gives each task one: use fewer workers, "
                          "or a cluster of more nodes")
    return Placement(roles, used, per_node)


def node_plan(planned: PlannedRun, placement: Placement, nodes: Nodes) -> dict[str, Any]:
    """The busiest node's cores by role (each process at the local plan's figure) against a node's CPUs."""
    per_process = {role: b["cores"] / b["count"] for role, b in planned.conditions["cpu_plan"].items()}
    busiest: dict[str, dict[str, float]] = {}
    for node in range(placement.nodes):
        breakdown: dict[str, dict[str, float]] = {}
        for role in placement.node_roles(node):
            entry = breakdown.setdefault(role, {"count": 0, "cores": 0.0})
            entry["count"] += 1
            entry["cores"] = round(entry["cores"] + per_process.get(role, 1.0), 4)
        if sum(b["cores"] for b in breakdown.values()) > sum(b["cores"] for b in busiest.values()):
            busiest = breakdown
    demand = sum(b["cores"] for b in busiest.values())
    return {"nodes": placement.nodes, "ranks": placement.ranks, "tasks_per_node": placement.tasks_per_node,
            "node_cpus": nodes.cpus, "node_cpu_demand": round(demand, 3), "node_cpu_plan": busiest,
            "oversubscribed": round(demand, PLAN_DECIMALS) > nodes.cpus}


@dataclass
class SlurmRun:
    planned: PlannedRun
    placement: Placement
    slurm_plan: dict[str, Any]


def refuse_unlaunchable(specs: list[RunSpec]) -> None:
    refused = sorted({s.system for s in specs} - set(LAUNCHED_SYSTEMS))
    if refused:
        raise ConfigError(f"--launcher slurm cannot run system(s) {', '.join(refused)} (psbench launch runs "
                          f"{', '.join(LAUNCHED_SYSTEMS)}): drop them from the experiment, or run it without --launcher")


def plan_slurm(specs: list[RunSpec], nodes: Nodes, token_file: str | None, allow_oversubscribe: bool) -> list[SlurmRun]:
    """Every run's job, checked before any is submitted: its system, its token, its exposure, its CPU plan."""
    refuse_unlaunchable(specs)
    if any(s.system == "ps" for s in specs):
        if not token_file:
            raise ConfigError(TOKEN_NEEDED)
        read_token(token_file)   # missing, empty or readable by others: one line now
    runs = []
    for spec in specs:
        if spec.system == "ps":
            spec = RunSpec.from_dict({**spec.to_dict(), "options": {**spec.options, "token_file": str(Path(token_file).resolve())}})
        planned = plan(spec, allow_oversubscribe=True)   # the local figures; the nodes' CPUs decide below
        placement = place(spec, rank_roles(planned), nodes)
        if spec.system != "ps" and placement.nodes > 1 and not getattr(planned.options, "insecure", False):
            raise ConfigError(f"run {spec.run_id} spans {placement.nodes} nodes: {ALLREDUCE_REMEDY}")
        slurm_plan = node_plan(planned, placement, nodes)
        if slurm_plan["oversubscribed"]:
            needs = (f"run {spec.run_id} needs about {slurm_plan['node_cpu_demand']:.1f} cores on a node "
                     f"({plan_text(slurm_plan['node_cpu_plan'])}), a Slurm node has {nodes.cpus} (sinfo)")
            if not allow_oversubscribe:
                raise ConfigError(f"{needs}: use an emulated device (--emulate-device step_ms=20), fewer workers, "
                                  "more nodes, or --allow-oversubscribe (recorded in the manifest)")
            print(f"psbench: warning: {needs}: its timings will measure contention; recorded as oversubscribed",
                  file=sys.stderr)
        runs.append(SlurmRun(planned, placement, slurm_plan))
    return runs


def submit(run: SlurmRun, results_dir: Path, suite: str, record_format: str, script: Path = SCRIPT) -> Job:
    """`sbatch --wait` of one run; its job's output kept under <suite>/failed/ if it fails."""
    spec = run.planned.spec
    failed = results_dir / suite / FAILED_DIR
    failed.mkdir(parents=True, exist_ok=True)
    output = failed / f"{spec.run_id}.slurm-%j.out"
    argv = ["sbatch", "--wait", "--parsable", f"--job-name=psbench-{spec.system}", f"--output={output}",
            *run.placement.sbatch_args(), str(script), "--spec", json.dumps(spec.to_dict()),
            "--results-dir", str(results_dir), "--suite", suite, "--format", record_format]
    env = {**os.environ, PLAN_ENV: json.dumps(run.slurm_plan)}
    env.setdefault("PSBENCH", f"{sys.executable} -m psbench")   # the nodes share this install's path
    began = time.monotonic()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    job_id = proc.stdout.readline().strip().split(";")[0]   # --parsable: the id at submission, then the wait
    try:
        _, err = proc.communicate()
    except BaseException:   # interrupted: sbatch --wait leaves its job queued; cancel it
        proc.kill()
        if job_id:
            subprocess.run(["scancel", job_id], capture_output=True, timeout=60)
        raise
    out_file = Path(str(output).replace("%j", job_id))
    text = out_file.read_text(errors="replace") if job_id and out_file.is_file() else ""
    job = Job(job_id, proc.returncode, time.monotonic() - began, text, err)
    if job.failure() is not None:   # refused by sbatch: no job, no output file
        raise RuntimeError(f"{job.failure()} (log: {out_file})" if job_id else job.failure())
    out_file.unlink(missing_ok=True)
    try:
        failed.rmdir()   # none failed: no failed/ folder, as a local suite's
    except OSError:
        pass
    if not is_complete(results_dir, suite, spec):
        raise RuntimeError(f"Slurm job {job_id} ended but wrote no complete run {spec.run_id} in "
                           f"{results_dir / suite} (is --results-dir on a file system every node shares?)")
    return job


def run_suite(specs: list[RunSpec], results_dir: Path, suite: str, token_file: str | None, resume: bool = True,
              allow_oversubscribe: bool = False, record_format: str = "parquet", dry_run: bool = False) -> list[Job]:
    """Plan every run against the cluster, then submit each one not complete, one job at a time."""
    results_dir = Path(results_dir).resolve()
    refuse_unlaunchable(specs)   # before asking Slurm anything
    runs = plan_slurm(specs, read_nodes(), token_file, allow_oversubscribe)
    packed = store.packed_hashes(results_dir / suite)
    todo = [r for r in runs if not (resume and is_complete(results_dir, suite, r.planned.spec, packed))]
    if dry_run:
        for r in runs:
            p = r.slurm_plan
            print(f"{r.planned.spec.run_id}  {'to run' if r in todo else 'done'}  {' '.join(r.placement.sbatch_args())}  "
                  f"{p['node_cpu_demand']:.2f} of {p['node_cpus']} cores a node"
                  f"{', oversubscribed' if p['oversubscribed'] else ''}: {plan_text(p['node_cpu_plan'])}")
        print(f"{len(todo)} of {len(runs)} run(s) of suite '{suite}' to submit (a dry run: nothing submitted)")
        return []
    clean_staging(results_dir, suite)
    if len(runs) > len(todo):
        print(f"psbench: {len(runs) - len(todo)} run(s) of suite '{suite}' already complete, skipping (resume)",
              file=sys.stderr)
    jobs = []
    for r in todo:
        job = submit(r, results_dir, suite, record_format)
        print(f"psbench: {r.planned.spec.run_id}: Slurm job {job.job_id}, {' '.join(r.placement.sbatch_args())}, "
              f"{job.wall_s:.1f} s", file=sys.stderr)
        jobs.append(job)
    return jobs
