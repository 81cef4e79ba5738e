"""RunSpec: everything that defines one run. Its hash names the run, so a suite can resume."""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from psbench.core.accelerator import CPU, DEVICES
from psbench.core.errors import ConfigError


OPTIONAL_IN_HASH = ("emulate_device", "stragglers", "budget", "eval_every_s")
# Where a run's secret is read from, not what the run is: ranks handed one token by different paths
# run one experiment, under one run id.
LOCATION_OPTIONS = ("token_file",)
# Settings left out of the hash at their default, so runs made before they existed keep their hash.
DEFAULT_NOT_IN_HASH = {"device": CPU}


def budget_kind(budget: str) -> str | None:
    """'updates', 'samples' or 'seconds' for a well-formed budget, else None."""
    kind, _, value = str(budget).partition("=")
    if kind in ("updates", "samples"):
        return kind if value.isdigit() and int(value) >= 1 else None
    try:
        return kind if kind == "seconds" and float(value) > 0 else None
    except ValueError:
        return None


RUN_ID_LABEL_CHARS = 72  # a run id is one path component of at most 128 characters (harness/schema.py)


def workload_label(workload: str) -> str:
    """A workload's name in run ids, record tables and reports: a registry name as it is; the user's
    own (psbench/workloads/user.py) by the names the user gave: a workload file by its file name
    (stem), a model+dataset pair by its import strings, each pkg.module:callable read pkg.module.callable."""
    if workload.endswith(".toml"):
        workload = workload.replace("\\", "/").rsplit("/", 1)[-1][: -len(".toml")]
    return re.sub(r"[^A-Za-z0-9._+=-]", "-", workload.replace(":", ".")).lstrip(".-+=") or "workload"


@dataclass(frozen=True)
class RunSpec:
    system: str
    workload: str
    workers: int = 1
    seed: int = 0
    epochs: int | None = None        # None: the workload's default
    batch_size: int | None = None    # per worker (Horovod's convention); None: the workload's default
    lr: float | None = None          # None: the workload's default
    sharding: str = "random"
    max_steps: int | None = None     # cap on steps per worker, for quick runs
    evals_per_epoch: int = 2
    data_dir: str | None = None
    options: dict[str, Any] = field(default_factory=dict)  # system-specific, validated by the system
    # Cluster conditions (psbench.core.emulation): an emulated device and seeded stragglers.
    emulate_device: str | None = None   # step_ms=X / example_ms=Y / a profile name
    stragglers: str | None = None       # slow:W=F / transient:p=P,ms=MS / spread:lo=A,hi=B
    # A global budget instead of steps per worker: updates=N or samples=N summed over all workers (the
    # PS stops every worker when its shards have applied that many: TensorFlow's global step), or
    # seconds=T of the training clock (every worker stops there: the same budget for every system).
    budget: str | None = None
    # A timer evaluator instead of evals_per_epoch: the model (the PS servers', allreduce rank 0's) is
    # snapshotted every T seconds of the training clock and evaluated off it, the same T for every
    # system; time to target is then read from these evaluations (the mean of the last k).
    eval_every_s: float | None = None
    # Where the model and batches live (psbench.core.accelerator): cpu, cuda, or auto (resolved at
    # plan time, so a planned spec and its manifest carry cpu or cuda).
    device: str = CPU

    def __post_init__(self) -> None:
        checks = [
            (self.workers >= 1, f"workers must be >= 1, got {self.workers}"),
            (self.epochs is None or self.epochs >= 1, f"epochs must be >= 1, got {self.epochs}"),
            (self.batch_size is None or self.batch_size >= 1, f"batch_size must be >= 1, got {self.batch_size}"),
            (self.lr is None or self.lr > 0, f"lr must be > 0, got {self.lr}"),
            (self.max_steps is None or self.max_steps >= 1, f"max_steps must be >= 1, got {self.max_steps}"),
            (self.evals_per_epoch >= 1, f"evals_per_epoch must be >= 1, got {self.evals_per_epoch}"),
            (self.eval_every_s is None or self.eval_every_s > 0, f"eval_every_s must be > 0, got {self.eval_every_s}"),
            (self.device in DEVICES, f"device must be {', '.join(DEVICES)}, got '{self.device}'"),
        ]
        if self.budget is not None:
            checks.append((budget_kind(self.budget) is not None,
                           f"budget must be updates=N or samples=N (N >= 1), or seconds=T (T > 0), got "
                           f"'{self.budget}'"))
        for ok, message in checks:
            if not ok:
                raise ConfigError(message)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> "RunSpec":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ConfigError(f"unknown run setting(s) {', '.join(unknown)}; allowed: {', '.join(sorted(known))}")
        return cls(**raw)

    def hashed_settings(self) -> dict[str, Any]:
        """What the run id stands for: every setting but where data and secrets are read from
        (data_dir, LOCATION_OPTIONS); the cluster-condition settings only when set and the device
        only when not cpu, so runs made before they existed keep their hash."""
        payload = {k: v for k, v in self.to_dict().items()
                   if k != "data_dir" and not (k in OPTIONAL_IN_HASH and v is None)
                   and not (k in DEFAULT_NOT_IN_HASH and v == DEFAULT_NOT_IN_HASH[k])}
        payload["options"] = {k: v for k, v in payload["options"].items() if k not in LOCATION_OPTIONS}
        return payload

    def config_hash(self) -> str:
        """Stable over runs and machines (hashed_settings)."""
        return hashlib.sha1(json.dumps(self.hashed_settings(), sort_keys=True, default=str).encode()).hexdigest()[:10]

    @property
    def run_id(self) -> str:
        return (f"{self.system}-{workload_label(self.workload)[:RUN_ID_LABEL_CHARS]}-w{self.workers}-s{self.seed}-"
                f"{self.config_hash()}")
