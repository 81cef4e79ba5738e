"""One rank of a launched job, end to end: meet at the rendezvous, measure clock offsets, play
this rank's role, hand its record files to rank 0; rank 0 then writes the run folder exactly as a
local run of the same spec (its run id, its Recorder, manifest and tables), with the engine, the
ranks and their clock offsets under the manifest's extra.launch."""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import shutil
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from psbench.bench.lab.launch.env import PLAN_ENV, LaunchEnv, role_of
from psbench.bench.lab.launch.rendezvous import (clock_record, connect, measure_offsets, receive_files,
                                                 send_files)
from psbench.core.errors import ConfigError
from psbench.core.exposure import TOKEN_ENV, check_exposure, is_loopback
from psbench.core.records import Recorder, RunResult
from psbench.core.spec import RunSpec

STAGING_PREFIX = ".launch-"
# ps: shard j listens on MASTER_PORT + 1 + j of its host (known before it starts: no free-port race)
SHARD_PORT_OFFSET = 1
HOROVOD_REMEDY = ("Horovod's rendezvous server, torch's store and gloo have no authentication: pass --insecure true "
                  "to accept any client (recorded in the manifest)")
TOKEN_NEEDED = (f"ps under psbench launch needs the job's token, the same on every rank: env {TOKEN_ENV} or "
                "--token-file FILE (mode 600), never the command line")


def staging_dir(results_dir: Path, suite: str, spec: RunSpec, rank: int) -> Path:
    """This rank's own folder for its files while it runs (removed when it ends, failed or not)."""
    folder = Path(results_dir) / suite / f"{STAGING_PREFIX}{spec.run_id}" / f"rank{rank}"
    shutil.rmtree(folder, ignore_errors=True)   # a failed attempt's, of this same rank
    folder.mkdir(parents=True)
    return folder


def remove_staging(job: Path) -> None:
    """This rank's folder; the job's folder too once it is empty (the last rank of a host leaves none)."""
    shutil.rmtree(job, ignore_errors=True)
    try:
        job.parent.rmdir()
    except OSError:
        pass   # another rank of this host still has its own there


def settings_differ(mine: dict, theirs: dict) -> list[str]:
    """The settings two ranks' runs differ in (options named options.NAME)."""
    flat = [({**{k: v for k, v in d.items() if k != "options"},
              **{f"options.{k}": v for k, v in d.get("options", {}).items()}}) for d in (mine, theirs)]
    return sorted(k for k in set(flat[0]) | set(flat[1]) if flat[0].get(k) != flat[1].get(k))


def agree_on_run(raw_store, spec: RunSpec, rank: int, world: int) -> None:
    """Every rank shows its run's settings; rank 0 checks all of them and every other rank checks
    rank 0's. Ranks given other settings would meet under other run ids and wait there until the
    store's timeout; here it is one line naming the settings."""
    shown = json.dumps(spec.hashed_settings(), sort_keys=True, default=str)
    raw_store.set(f"psbench-launch/settings/{rank}", shown)
    mine = json.loads(shown)   # as the others read it
    for other in (range(1, world) if rank == 0 else [0]):
        differ = settings_differ(mine, json.loads(raw_store.get(f"psbench-launch/settings/{other}")))
        if differ:
            raise ConfigError(f"rank {other} was given another run than rank {rank} ({', '.join(differ)} differ): "
                              f"every rank of a launched job takes the same settings")


def job_store(env: LaunchEnv, spec: RunSpec, timeout_s: float):
    """The job's store under this run's prefix, once the ranks agree on the run."""
    import torch.distributed as dist

    raw = connect(env, timeout_s)
    agree_on_run(raw, spec, env.rank, env.world)
    return dist.PrefixStore(f"psbench-launch/{spec.run_id}", raw)


def launch_record(env: LaunchEnv, offsets: dict, store_auth: str) -> dict:
    """The manifest's extra.launch; a warning when the ranks' clocks differ beyond the bound."""
    clock = clock_record(offsets)
    if not clock["within_bound"]:
        print(f"psbench: warning: the ranks' clocks differ by up to {clock['max_abs_offset_s']:.3f} s, beyond "
              f"{clock['bound_s']:g} s (recorded in the manifest's extra.launch.clock)", file=sys.stderr)
    record = {"engine": env.engine, "world": env.world, "master_addr": env.master_addr,
              "store": "torchrun agent" if env.agent_store else "rank 0", "store_auth": store_auth, "clock": clock}
    if os.environ.get(PLAN_ENV):   # submitted by `psbench run --launcher slurm`: its nodes' CPU plan
        record["slurm_plan"] = json.loads(os.environ[PLAN_ENV])
    return record


def run_ddp(spec: RunSpec, env: LaunchEnv, results_dir: Path, suite: str, record_format: str) -> RunResult | None:
    """Every rank a worker of one DDP group, running systems/ddp's rank body on the job's store."""
    import torch.distributed as dist

    from psbench.systems.base import parse_options
    from psbench.systems.ddp.adapter import DDP_REMEDY, DDPOptions
    from psbench.systems.ddp.worker import DDPComm

    options = parse_options(DDPOptions, spec.options, "ddp")
    check_exposure("ddp's rendezvous store (MASTER_ADDR)", env.master_addr, None, options.insecure, DDP_REMEDY)
    if is_loopback(env.master_addr):   # gloo picks its interface from the hostname unless told
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")  # NCCL's bootstrap too, on a GPU
    store = job_store(env, spec, options.timeout_s)
    offsets = measure_offsets(store, env.rank, env.world)
    auth = "loopback" if is_loopback(env.master_addr) else "insecure"
    return allreduce_rank(spec, env, Output(results_dir, suite, record_format), store, offsets,
                          lambda device: DDPComm(env.rank, env.world, env.master_addr, env.master_port,
                                                 options.timeout_s, store=dist.PrefixStore("ddp", store),
                                                 device=device),
                          auth, {"ddp_store": {"master_addr": env.master_addr, "auth": auth}})


def run_horovod(spec: RunSpec, env: LaunchEnv, results_dir: Path, suite: str, record_format: str) -> RunResult | None:
    """Every rank a Horovod worker (systems/horovod's rank body), started by the engine, not
    horovodrun: the ranks' hosts go through the store, rank 0 serves Horovod's rendezvous on its
    address facing MASTER_ADDR and publishes it there, and each rank sets the environment horovodrun
    would have given it before hvd.init()."""
    from psbench.bench.lab.launch.horovod import (Rendezvous, check_hostnames, hostname_address, interface_of,
                                                  rank_env, slot_plan)
    from psbench.systems.base import parse_options
    from psbench.systems.horovod.adapter import NOT_INSTALLED, HorovodOptions, HorovodSystem
    from psbench.systems.horovod.worker import HorovodComm

    if HorovodSystem.unavailable_reason():
        raise ConfigError(NOT_INSTALLED)
    options = parse_options(HorovodOptions, spec.options, "horovod")
    host = host_facing(env.master_addr)
    check_exposure("horovod's rendezvous server and the job's store", host, None, options.insecure, HOROVOD_REMEDY)
    interface = options.network_interface or interface_of(host)
    store = job_store(env, spec, options.timeout_s)
    offsets = measure_offsets(store, env.rank, env.world)
    store.set(f"horovod/host/{env.rank}", json.dumps([host, hostname_address()]))
    hosts, named = zip(*(json.loads(store.get(f"horovod/host/{r}")) for r in range(env.world)))
    check_hostnames(list(hosts), list(named))   # on every rank: each leaves with the same line
    plan = slot_plan(hosts)
    server = Rendezvous(host, plan) if env.rank == 0 else None
    try:
        if server is not None:
            store.set("horovod/rendezvous", f"{host}:{server.port}")
        rendezvous = store.get("horovod/rendezvous").decode()
        addr, _, port = rendezvous.rpartition(":")
        os.environ.update(rank_env(plan[env.rank], addr, int(port), interface))
        auth = "loopback" if is_loopback(host) else "insecure"
        return allreduce_rank(spec, env, Output(results_dir, suite, record_format), store, offsets, HorovodComm,
                              auth, launch_extra={"horovod_rendezvous": rendezvous,
                                                  "hosts": sorted({s.hostname for s in plan})})
    finally:
        if server is not None:   # every rank's files are in by now: no rank needs it any more
            server.stop()


@dataclass(frozen=True)
class Output:
    """Where rank 0 writes the run folder, as `psbench run` would."""
    results_dir: Path
    suite: str
    record_format: str


def allreduce_rank(spec: RunSpec, env: LaunchEnv, out: Output, store, offsets: dict, make_comm: Callable[[Any], Any],
                   auth: str, recorder_extra: dict | None = None, launch_extra: dict | None = None) -> RunResult | None:
    """One rank of an allreduce system (every rank a worker) on the job's store: the system's rank
    body (worker_main) in this rank's staging folder; the other ranks hand their files to rank 0,
    which records the run as a local run's (None on other ranks)."""
    from psbench.bench.harness.runner import data_provenance, failure_kept
    from psbench.systems.allreduce_common import worker_main
    from psbench.systems.allreduce_launch import WorkerFailed, collect, first_error
    from psbench.systems.common import prepare
    from psbench.workloads import get_workload

    job = staging_dir(out.results_dir, out.suite, spec, env.rank)
    try:
        (job / "spec.json").write_text(json.dumps(spec.to_dict()))
        code = worker_main(job, make_comm, rank_hint=env.rank)
        if env.rank != 0:
            send_files(store, env.rank, job, [f"rank{env.rank}.{n}" for n in ("steps.csv", "meta.json", "error.json")])
            if code:   # said here too: the engine may stop rank 0 before it can
                raise RuntimeError(first_error(spec.system, job) or f"{spec.system} rank {env.rank} failed (exit {code})")
            return None
        try:
            receive_files(store, range(1, env.world), job, lambda r: rf"rank{r}\.(?:steps\.csv|meta\.json|error\.json)")
            failed = first_error(spec.system, job)
            if failed:
                raise WorkerFailed(failed)
            recorder = Recorder(spec, target_accuracy=get_workload(spec.workload).target_accuracy)
            prep = prepare(spec)
            recorder.shard_report = prep.plan.report(prep.data.y_train, prep.data.n_classes)
            recorder.extra.update(recorder_extra or {})
            collect(job, list(range(env.world)), recorder, True, None)
            recorder.extra["data"] = data_provenance(spec, recorder.shard_report)
            recorder.extra["launch"] = {**launch_record(env, offsets, auth), **(launch_extra or {})}
        except RuntimeError as exc:   # as a local run's failure: one line, the whole story under failed/
            raise failure_kept(exc, out.results_dir, out.suite, spec.run_id) from exc
        return recorder.finish(out.results_dir, out.suite, out.record_format)
    finally:
        remove_staging(job)


def signed(token: str, text: str) -> str:
    return hmac.new(token.encode(), text.encode(), hashlib.sha256).hexdigest()


def publish_shard(store, token: str, run_id: str, shard: int, address: str) -> None:
    """A shard's address in the store, with its MAC under the job's token (the store itself takes
    any client: a worker connects only to an address a holder of the token wrote)."""
    store.set(f"shard/{shard}", json.dumps([address, signed(token, f"{run_id}/shard/{shard}/{address}")]))


def shard_addresses(store, token: str, run_id: str, servers: int) -> list[str]:
    addresses = []
    for j in range(servers):
        address, mac = json.loads(store.get(f"shard/{j}"))
        if not hmac.compare_digest(mac, signed(token, f"{run_id}/shard/{j}/{address}")):
            raise RuntimeError(f"shard {j}'s address in the rendezvous store is not signed with the job's token")
        addresses.append(address)
    return addresses


def host_facing(master_addr: str) -> str:
    """The address of this host that faces MASTER_ADDR (loopback for a loopback rendezvous)."""
    if is_loopback(master_addr):
        return "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:   # no packet: a route lookup
        probe.connect((master_addr, 9))
        return probe.getsockname()[0]


def run_ps(spec: RunSpec, env: LaunchEnv, results_dir: Path, suite: str, record_format: str) -> RunResult | None:
    """Ranks 0..S-1 the shards (`psbench ps-server`, a child of the rank), the rest workers
    (`ps-worker`'s main, here); the shards' addresses go through the store signed with the job's
    token. Rank 0, after every worker's rows have come, fetches the final parameters and shuts the
    shards down (the cluster launcher's ps-fetch) and records the run as a cluster run's files."""
    from psbench.bench.harness.runner import data_provenance, failure_kept
    from psbench.bench.lab.cluster.records import collect_ps_files, ps_fetch
    from psbench.bench.lab.cluster.roles import ps_server_args, ps_worker_args
    from psbench.core.exposure import read_token
    from psbench.core.supervisor import LAUNCHER_PID_ENV, stop_tree
    from psbench.systems.base import parse_options
    from psbench.systems.common import prepare
    from psbench.systems.ps import worker as ps_worker
    from psbench.systems.ps.adapter import PSOptions
    from psbench.workloads import get_workload

    options = parse_options(PSOptions, spec.options, "ps")
    token = read_token(options.token_file)
    if not token:
        raise ConfigError(TOKEN_NEEDED)
    os.environ[TOKEN_ENV] = token   # where this rank's PS roles read it (never a command line)
    role = role_of("ps", env.rank, env.world, options.servers)
    timeout_s = options.step_timeout_s + 600.0
    store = job_store(env, spec, timeout_s)
    offsets = measure_offsets(store, env.rank, env.world)
    job = staging_dir(results_dir, suite, spec, env.rank)
    server = None
    try:
        if role.kind == "shard":
            host = str(spec.options.get("host") or host_facing(env.master_addr))
            check_exposure(f"ps shard {role.index}", host, token, False)
            publish_shard(store, token, spec.run_id, role.index,
                          f"{host}:{env.master_port + SHARD_PORT_OFFSET + role.index}")
        servers = shard_addresses(store, token, spec.run_id, options.servers)
        if role.kind == "worker":
            out = job / f"worker{role.index}.json"
            args = parse_ps_worker_args(ps_worker, [*ps_worker_args(spec, servers, role.index, str(out)),
                                                  "--spec-json", json.dumps(spec.to_dict())])
            code = ps_worker.main(args)
            send_files(store, env.rank, job, [out.name])
            if code:
                raise RuntimeError(f"ps worker {role.index} (rank {env.rank}) failed (exit {code})")
            return None
        log = job / f"shard{role.index}.log"
        with open(log, "wb") as fh:   # the shard leaves with this rank (LAUNCHER_PID_ENV)
            server = subprocess.Popen([sys.executable, "-m", "psbench", "ps-server",
                                       *ps_server_args(spec, servers, role.index)], stdout=fh, stderr=subprocess.STDOUT,
                                      env={**os.environ, LAUNCHER_PID_ENV: str(os.getpid())})
        if env.rank != 0:
            if server.wait():
                raise RuntimeError(f"ps shard {role.index} (rank {env.rank}) exited with {server.returncode}: "
                                   + log.read_text(errors="replace")[-2000:])
            return None
        try:
            workers = range(options.servers, env.world)
            names = receive_files(store, workers, job, lambda r: rf"worker{r - options.servers}\.json")
            if len(names) != len(workers):
                lost = sorted(set(range(len(workers))) - {int(n[6:-5]) for n in names})
                raise RuntimeError(f"ps worker(s) {lost} sent no rows (they failed; see their ranks' output)")
            for r in workers:   # each worker's clock start placed on rank 0's clock
                path = job / f"worker{r - options.servers}.json"
                data = json.loads(path.read_text())
                data["t0"] += offsets[r].offset_s
                path.write_text(json.dumps(data))
            ps_fetch(["--servers", ",".join(servers), "--workload", spec.workload, "--seed", str(spec.seed),
                      "--out", str(job / "final.npz")])   # the final parameters; the shards shut down
            server.wait(timeout=30)
            recorder = Recorder(spec, target_accuracy=get_workload(spec.workload).target_accuracy)
            prep = prepare(spec)
            recorder.shard_report = prep.plan.report(prep.data.y_train, prep.data.n_classes)
            collect_ps_files(spec, [str(job / f"worker{k}.json") for k in range(len(workers))],
                             str(job / "final.npz"), recorder)
            recorder.extra["data"] = data_provenance(spec, recorder.shard_report)
            recorder.extra["launch"] = {**launch_record(env, offsets, "token"), "shards": servers}
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
            raise failure_kept(RuntimeError(str(exc)), results_dir, suite, spec.run_id) from exc
        return recorder.finish(results_dir, suite, record_format)
    finally:
        if server is not None:
            stop_tree([server])
        remove_staging(job)


def parse_ps_worker_args(module, argv: list[str]):
    """`ps-worker`'s own parser over `argv` (its main runs in this rank's process)."""
    import argparse

    parser = argparse.ArgumentParser(prog="psbench ps-worker")
    module.add_arguments(parser)
    return parser.parse_args(argv)


def launch(spec: RunSpec, env: LaunchEnv, results_dir: Path, suite: str, record_format: str) -> RunResult | None:
    """Run this rank of `spec`; rank 0 returns the recorded run, the others None."""
    if spec.system == "ddp":
        return run_ddp(spec, env, results_dir, suite, record_format)
    if spec.system == "ps":
        return run_ps(spec, env, results_dir, suite, record_format)
    if spec.system == "horovod":
        return run_horovod(spec, env, results_dir, suite, record_format)
    raise ConfigError(f"psbench launch runs --system ddp, ps or horovod, not {spec.system!r}")
