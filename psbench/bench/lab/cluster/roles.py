"""The roles of a cluster run: every process it starts (PS shards, workers, DDP nodes, the
finisher), on which host, in which stage, with which command line. Every role is a plain psbench
command: `ps-server --bind ADDR:PORT`, `ps-worker --servers ...`, and for DDP
`run --system ddp --nnodes H --node-rank i --master-addr <first worker host>` per host; the workers'
step rows come back through files (ps-worker --out, each node's results folder)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from psbench.bench.lab.cluster.file import ClusterFile
from psbench.core.exposure import TOKEN_ENV
from psbench.core.spec import RunSpec


class RoleFailed(RuntimeError):
    """A role of a cluster run failed or the run timed out. The first line is `<host> <role>: <first
    cause>`; the role's whole log follows (kept under the suite's failed/ folder by run_file)."""


@dataclass
class PlannedRole:
    name: str
    host: int
    argv: list[str]
    stage: str                      # "server" (daemon, waited for on ready_port), "worker", "finish"
    env: dict[str, str] = field(default_factory=dict)
    ready_port: int | None = None
    out: str | None = None          # file the role writes its records to


def _spec_args(spec: RunSpec) -> list[str]:
    args = ["--workload", spec.workload, "--workers", str(spec.workers), "--seed", str(spec.seed),
            "--sharding", spec.sharding, "--evals-per-epoch", str(spec.evals_per_epoch)]
    for flag, value in (("--epochs", spec.epochs), ("--batch-size", spec.batch_size),
                        ("--max-steps", spec.max_steps), ("--data-dir", spec.data_dir)):
        if value is not None:
            args += [flag, str(value)]
    return args


def ps_server_args(spec: RunSpec, servers: Sequence[str], shard: int) -> list[str]:
    """`ps-server` arguments of shard `shard` of a PS run whose shards listen at `servers`: the
    step (lr, momentum) as applied, scaled by the run's policies."""
    from psbench.systems.base import parse_options
    from psbench.systems.ps.adapter import PSOptions
    from psbench.systems.ps.policies import resolve_step
    from psbench.workloads import get_workload

    opts = parse_options(PSOptions, spec.options, "ps")
    w = get_workload(spec.workload)
    step = resolve_step(opts.lr_scaling, opts.momentum_scaling, opts.consistency, spec.workers, w.optimizer.momentum)
    lr, momentum = (spec.lr or w.optimizer.lr) * step.lr_factor, step.momentum
    return ["--bind", servers[shard], "--shard-id", str(shard), "--servers", str(len(servers)),
            "--workers", str(spec.workers), "--consistency", opts.consistency, "--mitigation", opts.mitigation,
            "--lr", repr(lr), "--momentum", repr(momentum), "--weight-decay", repr(w.optimizer.weight_decay),
            "--step-timeout-s", repr(opts.step_timeout_s)]


def ps_worker_args(spec: RunSpec, servers: Sequence[str], worker: int, out: str) -> list[str]:
    """`ps-worker` arguments of worker `worker`, its step rows written to `out`."""
    from psbench.systems.base import parse_options
    from psbench.systems.ps.adapter import PSOptions

    opts = parse_options(PSOptions, spec.options, "ps")
    return ["--servers", ",".join(servers), "--worker-id", str(worker), *_spec_args(spec), "--init",
            "--timeout-s", repr(opts.step_timeout_s + 60), "--out", out]


def plan_roles(cf: ClusterFile, addrs: Sequence[str], python: str, scratch: str,
               token: str | None = None) -> list[PlannedRole]:
    """Every process of the run, in start order, with its argv (addresses resolved). A "{host}" in
    `scratch` becomes the role's host name (one folder per host: ssh)."""
    roles = _plan_roles(cf, addrs, python, scratch, token)
    for role in roles:
        here = scratch.replace("{host}", cf.hosts[role.host].name)
        role.argv = [a.replace(scratch, here) for a in role.argv]
        role.out = role.out.replace(scratch, here) if role.out else None
    return roles


def _plan_roles(cf: ClusterFile, addrs: Sequence[str], python: str, scratch: str,
                token: str | None = None) -> list[PlannedRole]:
    spec = cf.spec
    py = [python, "-m", "psbench"]
    if spec.system == "ps":
        token_env = {TOKEN_ENV: token} if token else {}
        servers = [f"{addrs[h]}:{cf.port + j}" for j, h in enumerate(cf.role_hosts("ps-server"))]
        roles = [PlannedRole(f"ps-server{j}", h, py + ["ps-server", *ps_server_args(spec, servers, j)], "server",
                             token_env, ready_port=cf.port + j)
                 for j, h in enumerate(cf.role_hosts("ps-server"))]
        for k, h in enumerate(cf.role_hosts("worker")):
            out = f"{scratch}/worker{k}.json"
            roles.append(PlannedRole(f"worker{k}", h, py + ["ps-worker", *ps_worker_args(spec, servers, k, out)],
                                     "worker", token_env, out=out))
        first = cf.role_hosts("worker")[0]
        out = f"{scratch}/final.npz"
        roles.append(PlannedRole("ps-fetch", first, [python, "-m", "psbench.bench.lab.cluster.records", "ps-fetch", "--servers",
                                                     ",".join(servers), "--workload", spec.workload, "--seed",
                                                     str(spec.seed), "--out", out], "finish", token_env, out=out))
        return roles
    nodes = [i for i, h in enumerate(cf.hosts) if h.roles]
    master = addrs[nodes[0]]
    env = {"GLOO_SOCKET_IFNAME": "veth0"} if cf.launcher == "netns" else {}
    extra = [a for k, v in spec.options.items() for a in (f"--{k.replace('_', '-')}", str(v))]
    roles = []
    for rank, h in enumerate(nodes):
        out = f"{scratch}/node{rank}"
        argv = py + ["run", "--system", "ddp", *_spec_args(spec), *extra, "--master-addr", master,
                     "--master-port", str(cf.port), "--nnodes", str(len(nodes)), "--node-rank", str(rank),
                     "--results-dir", out, "--suite", "node", "--no-progress", "--no-resume"]
        if spec.lr is not None:
            argv += ["--lr", repr(spec.lr)]
        roles.append(PlannedRole(f"node{rank}", h, argv, "worker", env, out=out))
    return roles
