"""One rank of a launched job, end to end: meet at the rendezvous, measure clock offsets, play
this rank's role, hand its record files to rank 0; rank 0 then writes the run folder exactly as a
local run of the same spec (its run id, its Recorder, manifest and tables), with the engine, the
ranks and their clock offsets under the manifest's extra.launch."""
from __future__ import annotations

import json
import os
import re
import shutil
import sys
from pathlib import Path

from psbench.bench.lab.launch.env import LaunchEnv
from psbench.bench.lab.launch.rendezvous import (clock_record, connect, measure_offsets, receive_files,
                                                 send_files)
from psbench.core.errors import ConfigError
from psbench.core.exposure import check_exposure, is_loopback
from psbench.core.records import Recorder, RunResult
from psbench.core.spec import RunSpec

STAGING_PREFIX = ".launch-"
DDP_FILES = re.compile(r"rank{rank}\.(?:steps\.csv|meta\.json|error\.json)")


def staging_dir(results_dir: Path, suite: str, spec: RunSpec, rank: int) -> Path:
    """This rank's own folder for its files while it runs (removed when it ends, failed or not)."""
    folder = Path(results_dir) / suite / f"{STAGING_PREFIX}{spec.run_id}" / f"rank{rank}"
    shutil.rmtree(folder, ignore_errors=True)   # a failed attempt's, of this same rank
    folder.mkdir(parents=True)
    return folder


def launch_record(env: LaunchEnv, offsets: dict, store_auth: str) -> dict:
    """The manifest's extra.launch; a warning when the ranks' clocks differ beyond the bound."""
    clock = clock_record(offsets)
    if not clock["within_bound"]:
        print(f"psbench: warning: the ranks' clocks differ by up to {clock['max_abs_offset_s']:.3f} s, beyond "
              f"{clock['bound_s']:g} s (recorded in the manifest's extra.launch.clock)", file=sys.stderr)
    return {"engine": env.engine, "world": env.world, "master_addr": env.master_addr,
            "store": "torchrun agent" if env.agent_store else "rank 0", "store_auth": store_auth, "clock": clock}


def run_ddp(spec: RunSpec, env: LaunchEnv, results_dir: Path, suite: str, record_format: str) -> RunResult | None:
    """Every rank a worker of one DDP group, running systems/ddp's rank body (worker_main) on the
    job's store; rank 0 gathers the ranks' files and records the run (None on other ranks)."""
    import torch.distributed as dist

    from psbench.bench.harness.runner import data_provenance, failure_kept
    from psbench.systems.allreduce_common import worker_main
    from psbench.systems.allreduce_launch import WorkerFailed, collect, first_error
    from psbench.systems.base import parse_options
    from psbench.systems.common import prepare
    from psbench.systems.ddp.adapter import DDP_REMEDY, DDPOptions
    from psbench.systems.ddp.worker import DDPComm
    from psbench.workloads import get_workload

    options = parse_options(DDPOptions, spec.options, "ddp")
    check_exposure("ddp's rendezvous store (MASTER_ADDR)", env.master_addr, None, options.insecure, DDP_REMEDY)
    if is_loopback(env.master_addr):   # gloo picks its interface from the hostname unless told
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    store = dist.PrefixStore(f"psbench-launch/{spec.run_id}", connect(env, options.timeout_s))
    offsets = measure_offsets(store, env.rank, env.world)
    job = staging_dir(results_dir, suite, spec, env.rank)
    try:
        (job / "spec.json").write_text(json.dumps(spec.to_dict()))
        code = worker_main(job, lambda: DDPComm(env.rank, env.world, env.master_addr, env.master_port,
                                                options.timeout_s, store=dist.PrefixStore("ddp", store)),
                           rank_hint=env.rank)
        if env.rank != 0:
            send_files(store, env.rank, job, [f"rank{env.rank}.{n}" for n in ("steps.csv", "meta.json", "error.json")])
            if code:
                raise RuntimeError(f"ddp rank {env.rank} failed (its error went to rank 0)")
            return None
        try:
            receive_files(store, range(1, env.world), job, DDP_FILES)
            failed = first_error("ddp", job)
            if failed:
                raise WorkerFailed(failed)
            recorder = Recorder(spec, target_accuracy=get_workload(spec.workload).target_accuracy)
            prep = prepare(spec)
            recorder.shard_report = prep.plan.report(prep.data.y_train, prep.data.n_classes)
            recorder.extra["ddp_store"] = {"master_addr": env.master_addr,
                                           "auth": "loopback" if is_loopback(env.master_addr) else "insecure"}
            collect(job, list(range(env.world)), recorder, True, None)
            recorder.extra["data"] = data_provenance(spec, recorder.shard_report)
            recorder.extra["launch"] = launch_record(env, offsets, recorder.extra["ddp_store"]["auth"])
        except RuntimeError as exc:   # as a local run's failure: one line, the whole story under failed/
            raise failure_kept(exc, results_dir, suite, spec.run_id) from exc
        return recorder.finish(results_dir, suite, record_format)
    finally:
        shutil.rmtree(job, ignore_errors=True)
        if env.rank == 0:
            try:
                job.parent.rmdir()   # empty once every rank on this host has cleaned its own
            except OSError:
                pass


def launch(spec: RunSpec, env: LaunchEnv, results_dir: Path, suite: str, record_format: str) -> RunResult | None:
    """Run this rank of `spec`; rank 0 returns the recorded run, the others None."""
    if spec.system == "ddp":
        return run_ddp(spec, env, results_dir, suite, record_format)
    raise ConfigError(f"psbench launch runs --system ddp or ps, not {spec.system!r}")
