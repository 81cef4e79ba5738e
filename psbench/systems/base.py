"""The one interface every system adapter implements (`System`), and typed system options.

A system is a subclass of `System` that sets `name` and `Options` (a dataclass of its own settings:
each field's metadata holds the --help text) and implements `run(spec, options, recorder)`; every
other hook the harness calls is declared here with the default that fits a plain system, and a
subclass overrides only what differs. Its facts (description, packages, family, kind, colour) are
data in the registry (systems/__init__.py). The harness knows nothing else about it.
"""
from __future__ import annotations

import dataclasses
import typing
from typing import Any, ClassVar

from psbench.core.accelerator import CPU
from psbench.core.cpu import LAUNCHER, WORKERS, Proc
from psbench.core.records import Recorder
from psbench.core.spec import RunSpec
from psbench.core.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class NoOptions:
    pass


class System:
    """The hooks the harness calls on a system class (bench/harness/runner.py), each with its default.
    The harness calls them on the class, before any instance exists, except `run`."""

    name: ClassVar[str] = ""
    """The registry name; records carry it as the run's system."""
    Options: ClassVar[type] = NoOptions
    """The system's options: a dataclass whose fields use `option`, parsed from --<field> / a file's options."""
    budgets: ClassVar[tuple[str, ...]] = ()
    """The --budget kinds it honours (updates, samples, seconds); planning refuses the others."""
    devices: ClassVar[tuple[str, ...]] = (CPU,)
    """The resolved --device values it runs on: cpu, and cuda where its engine has a GPU path here;
    planning refuses cuda otherwise (and resolves --device auto to cpu)."""
    no_cuda_reason: ClassVar[str] = "its engine has no GPU path here"
    """Why it has no cuda, in a few words: the refusal's line and the docs say it."""
    timer_evaluator: ClassVar[bool] = False
    """It honours --eval-every-s (snapshots on the training clock, evaluated off it); planning refuses it otherwise."""
    max_workers: ClassVar[int | None] = None
    """The most workers it runs (None: no limit); planning refuses more."""
    paces_steps: ClassVar[bool] = True
    """False: its steps run where no pacer can slow them (a JVM's loop): workers count as busy cores, the
    calibration is unpaced and the manifest's conditions say `emulate_device_applied: false`."""
    calibration_workload: ClassVar[str | None] = None
    """The workload its CPU figures are measured on (None: the harness' default, mlp-digits)."""
    calibration_min_step_s: ClassVar[float] = 0.0
    """A step it never takes faster (e.g. a Spark job per mini-batch): the CPU calibration paces no faster."""
    cpu_self_role: ClassVar[str] = LAUNCHER
    """The role of the harness' own process in a run: the launcher, or the worker itself (as in `single`)."""

    @classmethod
    def unavailable_reason(cls) -> str | None:
        """None if the system can run here, else why not (e.g. a package that is not installed)."""
        return None

    @classmethod
    def check_spec(cls, spec: RunSpec, options: Any, workload: Any, device: Any, stragglers: Any) -> None:
        """Raise ConfigError at plan time for what the system cannot train at all (before any run starts)."""

    @classmethod
    def calibrates_here(cls) -> bool:
        """Whether a plan may measure the system's CPU figures now (a few local runs, once); False where
        those runs would upset the job (one spark-submit made: its one session): cached figures or none."""
        return True

    @classmethod
    def local_workers(cls, options: Any, workers: int) -> int:
        """The workers a run starts on this machine (a multi-node run's local share): the CPU budget counts these."""
        return workers

    @classmethod
    def cpu_processes(cls, options: Any, workers: int) -> list[Proc]:
        """Every process a run starts here, by role (workers, servers, daemons, drivers, each recognised by
        its command line): the CPU budget plans each at its measured cost. Default: the workers alone."""
        return [Proc(WORKERS, workers)]

    def run(self, spec: RunSpec, options: Any, recorder: Recorder) -> None:
        """Train spec.workload with spec.workers workers, recording steps and evals."""
        raise NotImplementedError(f"system '{self.name}' implements no run()")


HOOKS = frozenset(name for name in vars(System) if not name.startswith("_"))
"""Every hook the harness may read on a system class: what `System` declares."""


def option(default: Any, help: str) -> Any:
    """A dataclass field for a system option, carrying its --help text."""
    return dataclasses.field(default=default, metadata={"help": help})


def _convert(name: str, raw: Any, annotation: Any) -> Any:
    if isinstance(annotation, str):
        annotation = {"int": int, "float": float, "str": str, "bool": bool}.get(annotation.split(" |")[0], str)
    origin_args = typing.get_args(annotation)
    if origin_args:  # Optional[X]
        if raw is None:
            return None
        annotation = next(a for a in origin_args if a is not type(None))
    if annotation is bool and isinstance(raw, str):
        if raw.lower() in ("1", "true", "yes", "on"):
            return True
        if raw.lower() in ("0", "false", "no", "off"):
            return False
        raise ConfigError(f"option {name}: expected true/false, got '{raw}'")
    try:
        return annotation(raw)
    except (TypeError, ValueError):
        raise ConfigError(f"option {name}: expected {annotation.__name__}, got '{raw}'") from None


def parse_options(options_cls: type, raw: dict[str, Any], system: str) -> Any:
    """Turn user strings/values into the system's Options; unknown keys and bad values are
    ConfigErrors naming what is allowed. The dataclass's __post_init__ validates ranges."""
    fields = {f.name: f for f in dataclasses.fields(options_cls)}
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        allowed = ", ".join(sorted(fields)) or "none"
        raise ConfigError(f"system '{system}' has no option(s) {', '.join(unknown)}; allowed: {allowed}")
    hints = typing.get_type_hints(options_cls)
    values = {k: _convert(k, v, hints.get(k, str)) for k, v in raw.items()}
    return options_cls(**values)


def options_dict(options: Any) -> dict[str, Any]:
    return dataclasses.asdict(options)
