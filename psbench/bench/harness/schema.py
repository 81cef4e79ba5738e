"""The shape of the files psbench reads: experiment files (matrix.py) and run manifests (results.py).

Each check raises ConfigError naming the file, the field and what is allowed, so a bad file is one
line from the CLI (exit 2), never a traceback from deep inside the planner or pandas. Only types,
ranges and names are checked here; what a value means (a system's name, an option's value, a
budget's syntax) is checked where it is used.

A manifest that fails is refused with its suite, not skipped: a report, comparison or verdict that
silently drops a run would mislead, as pytest-benchmark and asv refuse a results file they cannot read.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from psbench.core.errors import ConfigError

# Every worker is its own process (a fork holding torch, a socket to every shard) and the CPU planner
# loops over each before a run starts. The largest shipped experiment uses 16 (extra/switch_map.toml;
# the README's examples 12 at most) and a host here runs a few dozen such processes at most: 256, 16x
# that, refuses a typo (4000 for 4) before a launcher forks it, without narrowing any real design.
MAX_WORKERS = 256
# numpy's RandomState and torch.manual_seed both take it; seeds are small indices in practice.
MAX_SEED = 2**31 - 1
# One path component that stays inside results/: no '/', no '..', no leading '.' (our staging and
# old-run folders) or '-' (read as an option), not empty.
SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+=-]{0,127}")
SAFE_NAME_TEXT = ("a name of letters, digits and . _ + = - (starting with a letter or digit, at most 128 "
                  "characters, no path separator)")


@dataclass(frozen=True)
class Rule:
    """What one field may hold."""
    kind: type             # int, float (a number: an int or a float), or str
    low: float | None = None
    high: float | None = None
    optional: bool = True  # null (YAML, JSON) allowed: the default

    def describe(self) -> str:
        names = {int: "an integer", float: "a number", str: "text"}
        text = names[self.kind]
        if self.low is not None and self.high is not None:
            text += f" from {self.low:,} to {self.high:,}"
        elif self.low is not None:
            text += f" > {self.low}" if self.kind is float else f" >= {self.low}"
        return text + (" or null" if self.optional else "")

    def allows(self, value: Any) -> bool:
        if value is None:
            return self.optional
        if isinstance(value, bool):
            return False  # true is no integer here, whatever Python says
        if self.kind is float:
            if not isinstance(value, (int, float)) or not math.isfinite(value):
                return False
            return (self.low is None or value > self.low) and (self.high is None or value <= self.high)
        if not isinstance(value, self.kind):
            return False
        if self.kind is int:
            return (self.low is None or value >= self.low) and (self.high is None or value <= self.high)
        return True


# The run settings of a RunSpec (psbench/core/spec.py), as files may give them.
SPEC_RULES: dict[str, Rule] = {
    "system": Rule(str, optional=False),
    "workload": Rule(str, optional=False),
    "workers": Rule(int, 1, MAX_WORKERS, optional=False),
    "seed": Rule(int, 0, MAX_SEED, optional=False),
    "epochs": Rule(int, 1),
    "batch_size": Rule(int, 1),
    "lr": Rule(float, 0),
    "sharding": Rule(str),
    "max_steps": Rule(int, 1),
    "evals_per_epoch": Rule(int, 1, optional=False),
    "data_dir": Rule(str),
    "emulate_device": Rule(str),
    "stragglers": Rule(str),
    "budget": Rule(str),
    "eval_every_s": Rule(float, 0),
    "device": Rule(str),
}
SCALAR = (str, int, float, bool)


def describe_value(value: Any) -> str:
    """'true (a boolean)', "'4' (text)", '[...] (a list)': what a file holds, in its words."""
    kinds = {bool: "a boolean", str: "text", int: "an integer", float: "a number", list: "a list",
             dict: "a table", type(None): "null"}
    shown = repr(value) if not isinstance(value, (list, dict)) else ("[...]" if isinstance(value, list) else "{...}")
    if isinstance(value, bool) or value is None:
        shown = "null" if value is None else str(value).lower()
    return f"{shown[:60]} ({kinds.get(type(value), type(value).__name__)})"


def refuse(where: str, field: str, value: Any, allowed: str) -> ConfigError:
    return ConfigError(one_line(f"{where}: {field}: got {describe_value(value)}; allowed: {allowed}"))


def one_line(text: str) -> str:
    """Control characters (a key or path with a newline in it) shown escaped: an error stays one line."""
    return re.sub(r"[\x00-\x1f\x7f]", lambda m: repr(m.group())[1:-1], text)


def check_field(where: str, field: str, name: str | None, value: Any) -> None:
    """A value of a run setting `name` (a RunSpec field), or of an option (None: any scalar; its
    system checks the rest)."""
    rule = SPEC_RULES.get(name) if name is not None else None
    if rule is None:
        if not isinstance(value, SCALAR):
            raise refuse(where, field, value, "text, a number or true/false")
    elif not rule.allows(value):
        raise refuse(where, field, value, rule.describe())


def check_spec(spec: dict[str, Any], where: str, section: str = "spec.", complete: bool = True) -> None:
    """A run's settings as one table (a manifest's spec, a run by hand; a cluster file's [run],
    not `complete`: a setting left out takes its default)."""
    for name, rule in SPEC_RULES.items():
        if name in spec or (complete and not rule.optional):
            label = name.replace("_", "-") if section == "--" else name  # a command line's flag
            check_field(where, f"{section}{label}", name, spec.get(name))


def check_suite_name(name: Any, where: str, field: str = "suite") -> str:
    """A suite (a folder under results/) or run name: one safe path component."""
    if not isinstance(name, str) or not SAFE_NAME.fullmatch(name):
        raise refuse(where, field, name, SAFE_NAME_TEXT)
    return name


# ---- experiment files -------------------------------------------------------------------------

def _table(where: str, field: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise refuse(where, field, value, "a table")
    return value


def _values(where: str, field: str, name: str | None, value: Any, lists: bool) -> None:
    """One setting's value, or with `lists` a list of them (a matrix axis, an exclude's choices)."""
    if isinstance(value, list) and lists:
        for i, item in enumerate(value):
            if isinstance(item, (list, dict)):
                raise refuse(where, f"{field}[{i}]", item, "a single value (no nested list or table)")
            check_field(where, f"{field}[{i}]", name, item)
    else:
        check_field(where, field, name, value)


def _settings(where: str, section: str, table: Any, lists: bool, options: bool = False) -> None:
    """A table of run settings (or, with `options`, of a system's options)."""
    for key, value in _table(where, section, table).items():
        field = f"{section} {key}" if section.startswith("[") else f"{section}.{key}"  # TOML's words, JSON's
        _values(where, field, None if options else key, value, lists)


def _system_options(where: str, prefix: str, table: Any, lists: bool) -> None:
    """[options.<system>] / [matrix.options.<system>]: a table of option tables."""
    for system, options in _table(where, f"[{prefix}]", table).items():
        _settings(where, f"[{prefix}.{system}]", options, lists, options=True)


def _array_of_tables(where: str, section: str, value: Any) -> list[dict[str, Any]]:
    if not isinstance(value, list) or not all(isinstance(entry, dict) for entry in value):
        raise refuse(where, f"[{section}]", value, f"an array of tables ([[{section}]] entries)")
    return value


def check_experiment(config: Any, source: Path | str | None) -> None:
    """The types and ranges of an experiment file's sections (matrix.py's format); unknown
    sections and settings are left to matrix.expand, which names what is allowed."""
    where = str(source) if source is not None else "experiment"
    config = _table(where, "top level", config)
    if "suite" in config:
        check_suite_name(config["suite"], where)
    if "description" in config and not isinstance(config["description"], str):
        raise refuse(where, "description", config["description"], "text")
    if "allow_oversubscribe" in config and not isinstance(config["allow_oversubscribe"], bool):
        raise refuse(where, "allow_oversubscribe", config["allow_oversubscribe"], "true or false")
    if "report" in config:
        _settings(where, "[report]", config["report"], lists=False, options=True)
    matrix = dict(_table(where, "[matrix]", config.get("matrix", {})))
    _system_options(where, "matrix.options", matrix.pop("options", {}), lists=True)
    _settings(where, "[matrix]", matrix, lists=True)
    _settings(where, "[settings]", config.get("settings", {}), lists=False)
    _settings(where, "[quick]", config.get("quick", {}), lists=True)  # a matrix key's list, or a setting
    _system_options(where, "options", config.get("options", {}), lists=False)
    for i, entry in enumerate(_array_of_tables(where, "exclude", config.get("exclude", []))):
        _settings(where, f"[[exclude]] #{i + 1}", entry, lists=True)
    for i, entry in enumerate(_array_of_tables(where, "override", config.get("override", []))):
        section = f"[[override]] #{i + 1}"
        _settings(where, section, {k: v for k, v in entry.items() if k != "settings"}, lists=True)
        if "settings" in entry:
            _settings(where, f"{section} settings", entry["settings"], lists=False)


# ---- run manifests ------------------------------------------------------------------------------

# Summary fields the reports compute with (psbench/core/records.py Recorder.summary); others pass as written.
SUMMARY_NUMBERS = ("train_s", "samples", "samples_per_s", "steps", "mean_step_s", "median_step_s",
                   "window_samples_per_s", "target_accuracy", "time_to_target_s", "time_to_target_with_launch_s",
                   "final_train_loss", "final_train_accuracy", "final_val_loss", "final_val_accuracy",
                   "staleness_mean", "staleness_p95", "staleness_max")
SUMMARY_TEXTS = ("budget", "time_to_target_rule")
EXTRA_NUMBERS = ("setup_s", "allreduce_alone_s")
CONDITIONS_NUMBERS = ("cores", "cpu_demand", "cpu_measured")


def _number_or_null(value: Any) -> bool:
    # NaN passes: a summary may record one (json writes it), the reports treat it as missing
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool))


def _numbers(where: str, section: str, table: dict[str, Any], keys: tuple[str, ...]) -> None:
    for key in keys:
        if key in table and not _number_or_null(table[key]):
            raise refuse(where, f"{section}.{key}", table[key], "a number or null")


def check_manifest(manifest: Any, file: Path) -> dict[str, Any]:
    """A run's manifest.json as results.load_suite reads it; returns it."""
    where = str(file)
    if not isinstance(manifest, dict) or "psbench_manifest" not in manifest:
        raise ConfigError(f"{where}: not a psbench manifest (no 'psbench_manifest' key)")
    for key in ("run_id", "spec", "summary"):
        if key not in manifest:
            raise ConfigError(f"{where}: corrupt manifest, missing {key}")
    check_suite_name(manifest["run_id"], where, "run_id")
    spec = _table(where, "spec", manifest["spec"])
    check_spec(spec, where)
    options = spec.get("options")
    if options is not None:
        _settings(where, "spec.options", options, lists=True, options=True)
    summary = _table(where, "summary", manifest["summary"])
    # the summary's fields join the spec's in one row per run (results._run_row): none may replace one
    shadowing = sorted(set(summary) & (set(SPEC_RULES) - set(SUMMARY_TEXTS)))
    if shadowing:
        raise ConfigError(f"{where}: summary.{shadowing[0]}: a run setting, allowed only in spec")
    _numbers(where, "summary", summary, SUMMARY_NUMBERS)
    for key in SUMMARY_TEXTS:
        if key in summary and not isinstance(summary[key], (str, type(None))):
            raise refuse(where, f"summary.{key}", summary[key], "text or null")
    extra = manifest.get("extra")
    if extra is not None:
        _numbers(where, "extra", _table(where, "extra", extra), EXTRA_NUMBERS)
        if isinstance(extra.get("switch"), dict):
            _numbers(where, "extra.switch", extra["switch"], ("handover_s",))
        conditions = extra.get("conditions")
        if isinstance(conditions, dict):
            _numbers(where, "extra.conditions", conditions, CONDITIONS_NUMBERS)
            if not isinstance(conditions.get("oversubscribed"), (bool, type(None))):
                raise refuse(where, "extra.conditions.oversubscribed", conditions["oversubscribed"], "true, false or null")
    for key, kinds, allowed in (("git_sha", (str, type(None)), "text or null"),
                                ("git_dirty", (bool, type(None)), "true, false or null")):
        if not isinstance(manifest.get(key), kinds):
            raise refuse(where, key, manifest[key], allowed)
    return manifest
