"""Experiment configs (TOML or YAML) expanded into RunSpecs.

    suite = "systems"                     # results go to results/<suite>/
    [matrix]                              # cross product of every list
    system = ["single", "ps"]
    workload = ["mlp-digits"]
    workers = [1, 2]
    seed = [0, 1, 2]
    [matrix.options.ps]                   # option lists crossed for that system's runs only
    consistency = ["bsp", "asp"]
    [settings]                            # fixed for every run
    epochs = 2
    [options.ps]                          # fixed options for one system
    servers = 1
    [quick]                               # overrides for `--quick` (any [settings] key, and seed lists)
    max_steps = 40
    seed = [0]
    [[exclude]]                           # drop runs matching every key given (a list: any of
    system = "ps"                         # its items), e.g. a slice with fewer seeds:
    workers = 1                           #   stragglers = ""; seed = [3, 4, 5]
    [[override]]                          # runs matching every key but `settings` get those settings
    workload = "logreg-digits"            # (a [quick] key still wins in --quick)
    settings = { epochs = 50 }

The user's own workload goes where `workload` goes: `workload = "path/to/workload.toml"` (a path
relative to this file), or `model = "pkg.module:factory"` with `dataset = "pkg.module:loader"`
instead of `workload` (docs/workloads.md).

Every value's type and range (workers 1..256, a suite name that stays inside results/) is checked
first (schema.py), so a bad file is one line naming the field.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from psbench.bench.harness.schema import check_experiment
from psbench.core.configfile import load_config
from psbench.core.spec import RunSpec
from psbench.core.errors import ConfigError
from psbench.workloads.user import canonical_name, pair_name

SPEC_FIELDS = {f.name for f in fields(RunSpec)}
USER_WORKLOAD_KEYS = {"model", "dataset"}  # the user's own model and loader, in place of a workload
TOP_LEVEL_KEYS = {"suite", "description", "matrix", "settings", "options", "quick", "exclude", "override",
                  "report", "allow_oversubscribe"}


@dataclass
class Experiment:
    suite: str
    description: str
    specs: list[RunSpec]
    report: dict[str, Any] = field(default_factory=dict)  # hints for the report (which plots/tables)
    source: Path | None = None
    quick: bool = False
    allow_oversubscribe: bool = False  # run even where the CPU budget says the cores are oversubscribed

    @property
    def suite_folder(self) -> str:
        """Where its runs go: quick runs have their own folder, so they never mix with full runs
        in one report (and a full run never resumes from a quick one's records)."""
        return f"{self.suite}-quick" if self.quick else self.suite


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def expand(config: dict[str, Any], quick: bool = False, source: Path | None = None) -> Experiment:
    check_experiment(config, source)
    unknown = sorted(set(config) - TOP_LEVEL_KEYS)
    if unknown:
        raise ConfigError(f"unknown config section(s) {', '.join(unknown)}; allowed: {', '.join(sorted(TOP_LEVEL_KEYS))}")
    matrix = dict(config.get("matrix", {}))
    option_matrix: dict[str, dict[str, list[Any]]] = matrix.pop("options", {})
    settings = dict(config.get("settings", {}))
    quick_keys = set(config.get("quick", {})) if quick else set()
    if quick:
        for key, value in config.get("quick", {}).items():
            (matrix if key in matrix else settings)[key] = value
    overrides = _overrides(config.get("override", []))
    for key in list(matrix) + list(settings) + [k for o in overrides for k in o["settings"]]:
        if key not in (SPEC_FIELDS | USER_WORKLOAD_KEYS) - {"options"}:
            raise ConfigError(f"unknown run setting '{key}'; allowed: "
                              f"{', '.join(sorted((SPEC_FIELDS | USER_WORKLOAD_KEYS) - {'options'}))}")
    if "system" not in matrix and "system" not in settings:
        raise ConfigError("config needs a system (in [matrix] or [settings])")
    if not any(k in matrix or k in settings for k in ("workload", "model")):
        raise ConfigError("config needs a workload, or a model and a dataset (in [matrix] or [settings])")
    fixed_options: dict[str, dict[str, Any]] = config.get("options", {})
    excludes = config.get("exclude", [])

    keys = list(matrix)
    specs: list[RunSpec] = []
    for combo in itertools.product(*(_as_list(matrix[k]) for k in keys)):
        base = {**settings, **dict(zip(keys, combo))}
        system = base["system"]
        sys_matrix = option_matrix.get(system, {})
        opt_keys = list(sys_matrix)
        for opt_combo in itertools.product(*(_as_list(sys_matrix[k]) for k in opt_keys)):
            options = {**fixed_options.get(system, {}), **dict(zip(opt_keys, opt_combo))}
            run = {**base, "options": options}
            if any(_matches(run, ex) for ex in excludes):
                continue
            for override in overrides:
                if _matches(run, override["match"]):
                    run.update({k: v for k, v in override["settings"].items() if k not in quick_keys})
            specs.append(RunSpec.from_dict(_workload_named(run, source)))
    if not specs:
        raise ConfigError("the config expands to no runs")
    # Seed outermost: the systems compared within one seed run close together in time, so a drift
    # in machine load hits every system alike rather than whichever ran last.
    specs.sort(key=lambda spec: spec.seed)
    return Experiment(config.get("suite", "default"), config.get("description", ""), specs,
                      config.get("report", {}), source, quick, bool(config.get("allow_oversubscribe", False)))


def _workload_named(run: dict[str, Any], source: Path | None) -> dict[str, Any]:
    """The run's workload as a RunSpec names it: model and dataset joined into one name, a workload
    file's path made absolute (relative to the experiment file), so every process of the run reads it."""
    run = dict(run)
    model, dataset = run.pop("model", None), run.pop("dataset", None)
    if model is not None or dataset is not None:
        if "workload" in run or model is None or dataset is None:
            raise ConfigError("a run takes a workload, or a model with a dataset, not both; got "
                              f"workload={run.get('workload')!r} model={model!r} dataset={dataset!r}")
        run["workload"] = pair_name(model, dataset)
    elif "workload" in run:
        run["workload"] = canonical_name(run["workload"], Path(source).parent if source else None)
    return run


def _overrides(entries: list[dict[str, Any]]) -> list[dict[str, dict[str, Any]]]:
    """[[override]] tables as {"match": keys that select runs, "settings": what they get}."""
    found = []
    for entry in entries:
        settings = entry.get("settings")
        match = {k: v for k, v in entry.items() if k != "settings"}
        if not isinstance(settings, dict) or not settings or not match:
            raise ConfigError("each [[override]] needs keys that select runs and a non-empty settings table, "
                              f"got {entry}")
        found.append({"match": match, "settings": settings})
    return found


def _matches(run: dict[str, Any], selector: dict[str, Any]) -> bool:
    """Whether a run has every key of an [[exclude]] or [[override]] table: a value, or a list of
    values (any of them); no run setting or option takes a list, so a list is never a value."""
    for key, value in selector.items():
        have = run.get("options", {}).get(key) if key not in run else run[key]
        if have not in (value if isinstance(value, list) else [value]):
            return False
    return True


def load_experiment(path: Path, quick: bool = False) -> Experiment:
    return expand(load_config(path), quick=quick, source=Path(path))
