"""`horovod`: real Horovod (horovod.torch, hvd.DistributedOptimizer), gloo controller, horovodrun."""
from __future__ import annotations

import dataclasses
import shutil
import sys
from pathlib import Path

from psbench.core.cpu import WORKERS, Proc
from psbench.core.hosts import HOST_RULE, is_host_address
from psbench.core.records import Recorder
from psbench.core.spec import RunSpec
from psbench.core.supervisor import Supervisor
from psbench.systems.allreduce_launch import run_job
from psbench.systems.base import System, option
from psbench.systems.common import child_env, prepare
from psbench.systems.horovod.remote import RemoteJob
from psbench.systems.horovod.run import LOOPBACK_ENV
from psbench.core.errors import ConfigError

NOT_INSTALLED = "horovod is not installed: run `make horovod`"


@dataclasses.dataclass(frozen=True)
class HorovodOptions:
    hosts: str = option("", "horovodrun -H list, e.g. 'h1:2,h2:2'; empty: localhost:<workers>")
    timeout_s: float = option(1800.0, "stop every worker and fail after this many seconds")
    ssh_config: str = option("", "hosts beyond localhost: an `ssh -F` file for horovodrun and the job's file "
                                 "copies (default: the user's own ssh set-up)")
    network_interface: str = option("", "hosts beyond localhost: the interface gloo uses (horovodrun "
                                        "--network-interfaces), e.g. veth0; default: horovodrun finds one")
    insecure: bool = option(False, "hosts beyond localhost: allow horovodrun's rendezvous (no authentication) "
                                   "to listen beyond loopback; required there, and recorded")

    def __post_init__(self) -> None:
        if self.timeout_s <= 0:
            raise ConfigError(f"option timeout_s must be > 0, got {self.timeout_s}")
        for entry in filter(None, self.hosts.split(",")):
            host, _, slots = entry.partition(":")
            if not host or (slots and not slots.isdigit()):
                raise ConfigError(f"option hosts: '{entry}' is not HOST or HOST:SLOTS (e.g. localhost:2)")
            if not is_host_address(host):   # horovodrun passes it to ssh, where '-...' is an option
                raise ConfigError(f"option hosts: '{host}' is not a host address; allowed: {HOST_RULE}")


def horovodrun_command(local: bool) -> list[str]:
    """horovodrun of this interpreter's environment. For localhost-only runs it goes through
    systems.horovod.run, the same command line with horovodrun's servers bound to 127.0.0.1."""
    if local:
        return [sys.executable, "-m", "psbench.systems.horovod.run"]
    beside = Path(sys.executable).parent / "horovodrun"
    if beside.exists():
        return [str(beside)]
    found = shutil.which("horovodrun")
    return [found] if found else [sys.executable, "-m", "psbench.systems.horovod.run"]


def is_local(hosts: str) -> bool:
    return all(e.partition(":")[0] in ("localhost", "127.0.0.1") for e in filter(None, hosts.split(",")))


class HorovodSystem(System):
    name = "horovod"
    no_cuda_reason = ("this Horovod is built without GPU operations: gloo on host tensors; its NCCL path needs "
                      "a CUDA build of Horovod (HOROVOD_GPU_OPERATIONS=NCCL), not built here")
    budgets = ("seconds",)  # rank 0's training clock decides, every rank stops after the same step
    timer_evaluator = True  # --eval-every-s: snapshots on the training clock, evaluated off it
    Options = HorovodOptions

    @staticmethod
    def cpu_processes(options: HorovodOptions, workers: int) -> list[Proc]:
        # horovodrun's command line names the worker module too: it is matched first
        return [Proc("horovodrun", 1, r"psbench\.systems\.horovod\.run\b|horovodrun"),
                Proc(WORKERS, workers, r"psbench\.systems\.horovod\.worker")]

    @classmethod
    def unavailable_reason(cls) -> str | None:
        try:
            import horovod.torch  # noqa: F401
        except Exception:  # ImportError, or a wheel built against another torch
            return NOT_INSTALLED
        return None

    def run(self, spec: RunSpec, options: HorovodOptions, recorder: Recorder, state_out: Path | None = None) -> None:
        """Train; rank 0's final flat weights and momentum go to `state_out` (npy) when given."""
        reason = self.unavailable_reason()
        if reason:
            raise ConfigError(reason)
        prep = prepare(spec)
        recorder.shard_report = prep.plan.report(prep.data.y_train, prep.data.n_classes)
        hosts = options.hosts or f"localhost:{spec.workers}"
        local = is_local(hosts)
        if not local and not options.insecure:
            raise ConfigError("horovod across hosts: horovodrun's rendezvous server has no authentication and "
                              "listens beyond loopback; pass the option insecure=true (recorded in the manifest)")
        # Local runs stay on loopback: gloo on `lo`, horovodrun's servers on 127.0.0.1.
        extra = (["--network-interfaces", "lo"] if local else
                 ["--network-interfaces", options.network_interface] if options.network_interface else [])
        env = child_env({"HOROVOD_GLOO_IFACE": "lo", LOOPBACK_ENV: "1"} if local else None)
        remote: list[RemoteJob] = []

        def launch(job: Path, sup: Supervisor) -> None:
            job_arg = str(job)
            run_env = env
            if not local:   # each host its own job folder, staged and gathered over ssh
                remote.append(RemoteJob(job, [e.partition(":")[0] for e in hosts.split(",") if e], options.ssh_config))
                remote[0].stage()
                job_arg, run_env = remote[0].job_arg, remote[0].env(env)
            cmd = horovodrun_command(local) + ["--gloo", "-np", str(spec.workers), "-H", hosts, *extra,
                                          sys.executable, "-m", "psbench.systems.horovod.worker", "--job", job_arg]
            sup.spawn("horovodrun", cmd, env=run_env, log_path=job / "horovodrun.log", new_session=False)

        if not local:
            recorder.extra["horovod_hosts"] = {"hosts": hosts, "auth": "insecure"}
        # One horovodrun process runs every rank; the ranks' files end up in the job directory.
        try:
            run_job(self.name, spec, recorder, launch, options.timeout_s, list(range(spec.workers)), state_out,
                    rank_of=lambda i: None, gather=lambda job: remote[0].gather(job) if remote else None)
        finally:
            if remote:
                remote[0].cleanup()
