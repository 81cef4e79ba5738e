"""The one small interface every system adapter implements, and typed system options.

A system is a class with a `name`, an `Options` dataclass (its own settings: each field's metadata
holds the --help text) and `run(spec, options, recorder)`; its one-line description and the packages
it needs are in the registry (systems/__init__.py). The harness knows nothing else about it.
"""
from __future__ import annotations

import dataclasses
import typing
from typing import Any, ClassVar, Protocol

from psbench.core.records import Recorder
from psbench.core.spec import RunSpec
from psbench.core.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class NoOptions:
    pass


class System(Protocol):
    name: ClassVar[str]
    Options: ClassVar[type]

    def run(self, spec: RunSpec, options: Any, recorder: Recorder) -> None:
        """Train spec.workload with spec.workers workers, recording steps and evals."""

    @classmethod
    def unavailable_reason(cls) -> str | None:
        """None if the system can run here, else why not (e.g. a package that is not installed)."""


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
