"""`horovod`: real Horovod (horovod.torch, hvd.DistributedOptimizer), gloo controller, horovodrun."""
from __future__ import annotations

import dataclasses
import shutil
import sys
from pathlib import Path

from psbench.core.records import Recorder
from psbench.core.spec import RunSpec
from psbench.core.supervisor import Supervisor
from psbench.systems.allreduce_launch import run_job
from psbench.systems.base import option
from psbench.systems.common import child_env, prepare
from psbench.systems.horovod.run import LOOPBACK_ENV
from psbench.core.errors import ConfigError

NOT_INSTALLED = "horovod is not installed: run `make horovod`"


@dataclasses.dataclass(frozen=True)
class HorovodOptions:
    hosts: str = option("", "horovodrun -H list, e.g. 'h1:2,h2:2'; empty: localhost:<workers>")
    timeout_s: float = option(1800.0, "stop every worker and fail after this many seconds")

    def __post_init__(self) -> None:
        if self.timeout_s <= 0:
            raise ConfigError(f"option timeout_s must be > 0, got {self.timeout_s}")
        for entry in filter(None, self.hosts.split(",")):
            host, _, slots = entry.partition(":")
            if not host or (slots and not slots.isdigit()):
                raise ConfigError(f"option hosts: '{entry}' is not HOST or HOST:SLOTS (e.g. localhost:2)")


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


class HorovodSystem:
    name = "horovod"
    Options = HorovodOptions

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
        # Local runs stay on loopback: gloo on `lo`, horovodrun's servers on 127.0.0.1.
        extra = ["--network-interfaces", "lo"] if local else []
        env = child_env({"HOROVOD_GLOO_IFACE": "lo", LOOPBACK_ENV: "1"} if local else None)

        def launch(job: Path, sup: Supervisor) -> None:
            cmd = horovodrun_command(local) + ["--gloo", "-np", str(spec.workers), "-H", hosts, *extra,
                                          sys.executable, "-m", "psbench.systems.horovod.worker", "--job", str(job)]
            sup.spawn("horovodrun", cmd, env=env, log_path=job / "horovodrun.log", new_session=False)

        # One horovodrun process runs every rank; the ranks' files live in the job directory.
        run_job(self.name, spec, recorder, launch, options.timeout_s, list(range(spec.workers)), state_out,
                rank_of=lambda i: None)
