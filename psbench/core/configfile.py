"""Reading a settings file (an experiment, a cluster file, a workload file): TOML or YAML by its
suffix, its top level a table; anything else one line naming the file."""
from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from psbench.core.errors import ConfigError


def load_config(path: Path, what: str = "config file") -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{what} {path} does not exist")
    try:
        text = path.read_text()  # a file that is not UTF-8 text: the ValueError below
        if path.suffix == ".toml":
            return tomllib.loads(text)
        if path.suffix in (".yaml", ".yml"):
            import yaml

            try:
                loaded = yaml.safe_load(text)
            except yaml.YAMLError as exc:
                raise ConfigError(f"{path}: not valid YAML: {str(exc).splitlines()[0]}") from None
            if not isinstance(loaded, dict):
                raise ConfigError(f"{path}: the top level must be a mapping")
            return loaded
    except (tomllib.TOMLDecodeError, ValueError) as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(f"{path}: not valid {path.suffix[1:].upper()}: {exc}") from None
    raise ConfigError(f"{what} {path}: use .toml, .yaml or .yml")
