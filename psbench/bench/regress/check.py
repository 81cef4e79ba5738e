"""`psbench regress`: CI regression check of throughput, by ratios measured side by side.

A benchmark is a function returning {metric: ratio} (e.g. PS samples/s ÷ single samples/s, measured
in the same run), so its value carries across machines and loads where an absolute time would not.
Each is repeated and the median kept; the medians are compared with bench/regress/baselines/regress.json
(value, tolerance and direction per metric, and the machine it was measured on), or, with
`--against [REV]` (what `make regress` and CI do), with the baseline's commit measured now on this
machine beside this checkout (side_by_side.py): a ratio still shifts from one processor to another.

A metric's tolerance comes from its own measured spread: the baseline keeps the repeats it was
measured from, and `--update-baseline` sets tolerance = max(floor, mads x spread), spread being the
repeats' median absolute deviation over their median (`tolerance_rule` in the file). The floor keeps
a lucky-tight baseline from failing the next ordinary run; a noisy metric gets the wide tolerance
its noise needs, a steady one a tight one, so a 20% slow-down of the PS path fails the check.

Adding a benchmark is one line in RATIO_BENCHMARKS:
    "name": "package.module:function"   one function; metrics are 'name.<key>'
    "name": "package.module"            every ratio_* function in the module; 'name.<fn>.<key>'
A function may take `quick: bool`; a value may be a float (higher is better) or a Ratio that
declares lower-is-better.
"""
from __future__ import annotations

import argparse
import importlib
import inspect
import json
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from psbench.core.atomic import atomic_write_json
from psbench.core.errors import ConfigError

RATIO_BENCHMARKS: dict[str, str] = {
    "harness_overhead": "psbench.bench.regress.benchmarks:harness_overhead",
    "ps": "psbench.bench.regress.benchmarks:ps_overhead",
    "peers": "psbench.bench.regress.peer_benchmarks:ps_vs_peers",
    # decode of the layout a shard and a worker exchange every step vs the full check (its fast path)
    "ps_wire": "psbench.bench.regress.ps_benchmarks:ratio_layout_decode",
    # wire, push+pull round trip, shard apply, training step: timed by pytest-benchmark (tests/microbench)
    "micro": "psbench.bench.regress.micro:micro_ratios",
}
DEFAULT_BASELINE = Path(__file__).resolve().parent / "baselines" / "regress.json"
DEFAULT_TOLERANCE = 0.25  # a metric measured without repeats (no spread to go by)
DEFAULT_REPEATS = 5


@dataclass(frozen=True)
class ToleranceRule:
    """tolerance = max(floor, mads x spread). For medians of 5 repeats on both sides, the relative
    difference of two runs of the same code has a standard deviation of about 1.2 spreads (iid
    repeats), so 4 spreads is ~3.4 of them; the floor covers what a run's own repeats cannot see
    (the state of the machine between runs)."""
    mads: float = 4.0
    floor: float = 0.10

    def tolerance(self, samples: tuple[float, ...] | list[float]) -> float:
        return self.tolerance_for(spread(samples))

    def tolerance_for(self, spread_: float) -> float:
        return round(max(self.floor, self.mads * spread_), 4)

    @classmethod
    def of(cls, baseline: dict[str, Any] | None) -> "ToleranceRule":
        raw = (baseline or {}).get("tolerance_rule", {})
        if not (isinstance(raw, dict) and set(raw) <= {"mads", "floor"}
                and all(isinstance(v, (int, float)) and v > 0 for v in raw.values())):
            raise ConfigError(f"a baseline's tolerance_rule is {{'mads': > 0, 'floor': > 0}}, got {raw!r}")
        return cls(**raw)


def spread(samples: tuple[float, ...] | list[float]) -> float:
    """Median absolute deviation of the repeats over their median (0 with fewer than 2)."""
    if len(samples) < 2:
        return 0.0
    mid = statistics.median(samples)
    return statistics.median(abs(v - mid) for v in samples) / abs(mid) if mid else 0.0


@dataclass(frozen=True)
class Ratio:
    value: float
    higher_is_better: bool = True


@dataclass(frozen=True)
class Measured:
    value: float  # median over repeats
    higher_is_better: bool
    samples: tuple[float, ...]


@dataclass(frozen=True)
class Row:
    metric: str
    baseline: float | None
    measured: float | None
    change: float | None  # (measured - baseline) / baseline
    tolerance: float
    status: str  # ok | REGRESSION | improved | new | not measured
    samples: tuple[float, ...] = ()  # the repeats behind `measured`, when known


# ---- running -------------------------------------------------------------------------------

def resolve(name: str) -> list[tuple[str, Callable[..., dict[str, Any]]]]:
    """(metric prefix, function) pairs for one registry entry."""
    target = RATIO_BENCHMARKS[name]
    module_name, _, attr = target.partition(":")
    module = importlib.import_module(module_name)
    if attr:
        return [(name, getattr(module, attr))]
    found = [(f"{name}.{fn_name[len('ratio_'):]}", fn) for fn_name, fn in sorted(vars(module).items())
             if fn_name.startswith("ratio_") and callable(fn)]
    if not found:
        raise ConfigError(f"benchmark '{name}': module {module_name} has no ratio_* functions")
    return found


def _call(fn: Callable[..., dict[str, Any]], quick: bool) -> dict[str, Any]:
    return fn(quick=quick) if "quick" in inspect.signature(fn).parameters else fn()


def measure(names: list[str], quick: bool = False, repeats: int = DEFAULT_REPEATS,
            log: Callable[[str], None] = lambda s: None) -> dict[str, Measured]:
    """Run each benchmark `repeats` times; the median of each metric tames noise from other load."""
    out: dict[str, Measured] = {}
    for name in names:
        for prefix, fn in resolve(name):
            start = time.perf_counter()
            samples: dict[str, list[float]] = {}
            direction: dict[str, bool] = {}
            for _ in range(repeats):
                for key, value in _call(fn, quick).items():
                    ratio = value if isinstance(value, Ratio) else Ratio(float(value))
                    samples.setdefault(f"{prefix}.{key}", []).append(float(ratio.value))
                    direction[f"{prefix}.{key}"] = ratio.higher_is_better
            for metric, values in samples.items():
                out[metric] = Measured(statistics.median(values), direction[metric], tuple(values))
            log(f"{prefix}: {repeats} repeat(s) in {time.perf_counter() - start:.1f}s")
    return out


# ---- comparing -----------------------------------------------------------------------------

def compare(baseline: dict[str, Any], measured: dict[str, float | Measured | Ratio],
            tolerance: float | None = None) -> list[Row]:
    """Rows for every metric in either side. `baseline` is a baseline file's content (or just its
    'metrics' mapping: metric -> {value, tolerance?, higher_is_better?}). `tolerance`, if given,
    overrides every metric's own; else the metric's, else the file's default, else 0.25.
    A regression is a change against the metric's direction by more than its tolerance."""
    metrics = baseline.get("metrics", baseline) if isinstance(baseline, dict) else {}
    default = baseline.get("default_tolerance", DEFAULT_TOLERANCE) if "metrics" in baseline else DEFAULT_TOLERANCE
    rows = []
    for metric in sorted(set(metrics) | set(measured)):
        base = metrics.get(metric)
        tol = tolerance if tolerance is not None else float((base or {}).get("tolerance", default))
        got = measured.get(metric)
        value = None if got is None else float(got.value if isinstance(got, (Measured, Ratio)) else got)
        samples = got.samples if isinstance(got, Measured) else ()
        if base is None:
            rows.append(Row(metric, None, value, None, tol, "new", samples))
            continue
        if value is None:
            rows.append(Row(metric, float(base["value"]), None, None, tol, "not measured"))
            continue
        higher = bool(base.get("higher_is_better", True))
        change = (value - float(base["value"])) / float(base["value"])
        worse = -change if higher else change
        status = "REGRESSION" if worse > tol else ("improved" if -worse > tol else "ok")
        rows.append(Row(metric, float(base["value"]), value, change, tol, status, samples))
    return rows


def format_table(rows: list[Row]) -> str:
    header = ("metric", "baseline", "measured", "repeats (min-max)", "change %", "tolerance", "status")
    cells = [header] + [(r.metric, _num(r.baseline), _num(r.measured),
                         f"{len(r.samples)} ({min(r.samples):.3f}-{max(r.samples):.3f})" if r.samples else "",
                         "" if r.change is None else f"{r.change * 100:+.1f}%", f"±{r.tolerance * 100:.0f}%",
                         r.status) for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(header))]
    lines = ["  ".join(c[i].ljust(widths[i]) if i == 0 else c[i].rjust(widths[i]) for i in range(len(header)))
             for c in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


GATED_CHANGE = 0.20  # the slow-down the gate is meant to catch


def gate_coverage(rows: list[Row], change: float = GATED_CHANGE) -> str:
    """Which metrics this run could have caught a `change` slow-down on (tolerance under it): a
    metric whose repeats were too noisy here passes anything smaller than its tolerance, and says so."""
    measured = [r for r in rows if r.status in ("ok", "REGRESSION", "improved")]
    loose = [r for r in measured if r.tolerance >= change]
    line = (f"this run gates a {change:.0%} slow-down on {len(measured) - len(loose)} of {len(measured)} "
            f"metrics")
    if loose:
        line += "; too noisy here to: " + ", ".join(f"{r.metric} (±{r.tolerance:.0%})" for r in loose)
    return line


def _num(value: float | None) -> str:
    return "" if value is None else f"{value:.4f}"


# ---- the baseline file -----------------------------------------------------------------------

def load_baseline(path: Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"no baseline file {path}; measure one with `psbench regress --update-baseline`")
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: corrupt baseline, not valid JSON ({exc})") from None
    metrics = data.get("metrics") if isinstance(data, dict) else None
    if not isinstance(metrics, dict) or not all(
            isinstance(m, dict) and isinstance(m.get("value"), (int, float)) and m["value"] > 0
            for m in metrics.values()):
        raise ConfigError(f"{path}: a baseline needs 'metrics': {{name: {{'value': > 0, 'tolerance'?, "
                          f"'higher_is_better'?}}}}")
    return data


def updated_baseline(old: dict[str, Any] | None, measured: dict[str, Measured], quick: bool) -> dict[str, Any]:
    """The baseline with each measured metric's median, repeats, spread and the tolerance the rule
    gives them; metrics not measured this time are kept as they were."""
    from psbench.core.records import git_sha, machine, versions

    old = old or {}
    rule = ToleranceRule.of(old)
    metrics = dict(old.get("metrics", {}))
    for metric, m in measured.items():
        samples = [round(v, 6) for v in m.samples]
        metrics[metric] = {"value": round(m.value, 6), "higher_is_better": m.higher_is_better,
                           "spread": round(spread(samples), 4), "tolerance": rule.tolerance(samples),
                           "samples": samples}
    return {
        "about": "psbench regress baseline: ratios measured side by side in one run (no absolute times), each "
                 "metric's tolerance = max(floor, mads x spread of its repeats). Update with "
                 "`psbench regress --update-baseline --repeats 10` on a quiet machine.",
        "tolerance_rule": {"mads": rule.mads, "floor": rule.floor},
        "default_tolerance": old.get("default_tolerance", DEFAULT_TOLERANCE),
        "sizes": "quick" if quick else "full",
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine(), "versions": {k: v for k, v in versions().items() if v}, "git_sha": git_sha(),
        "metrics": dict(sorted(metrics.items())),
    }


# ---- CLI ---------------------------------------------------------------------------------

def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true", help="small sizes (CI)")
    p.add_argument("--baseline", type=Path, default=DEFAULT_BASELINE, help=f"baseline JSON (default {DEFAULT_BASELINE})")
    p.add_argument("--tolerance", type=float, help="allowed fractional change against a metric's direction, "
                   "overriding the baseline's per-metric tolerance (e.g. 0.25) in this check only")
    p.add_argument("--repeats", type=int, default=DEFAULT_REPEATS, help=f"runs per benchmark, median kept "
                   f"(default {DEFAULT_REPEATS})")
    p.add_argument("--update-baseline", action="store_true", help="write the measured medians into the baseline, "
                   "each with its repeats, their spread and the tolerance the baseline's tolerance_rule gives it")
    p.add_argument("--against", nargs="?", const="", metavar="REV",
                   help="run REV's benchmarks (a git commit; alone: the baseline file's git_sha) on this machine "
                        "beside this checkout's, interleaved, and compare with those rather than with the stored "
                        "values: ratios shift from one processor to another, so CI checks this way")
    p.add_argument("--only", action="append", metavar="NAME",
                   help=f"run only this benchmark (repeatable): {', '.join(RATIO_BENCHMARKS)}")


def _against_commit(rev: str, baseline: dict[str, Any], log: Callable[[str], None]) -> str | None:
    """The commit --against names (the baseline's git_sha when none is named). None when that
    default is not in this clone: the check then goes on against the stored values, and says so."""
    from .side_by_side import resolve_commit

    if rev:
        return resolve_commit(rev)
    if not baseline.get("git_sha"):
        raise ConfigError("--against without a REV uses the baseline file's git_sha, and this baseline has none")
    try:
        return resolve_commit(baseline["git_sha"])
    except ConfigError as exc:
        log(f"{exc}; comparing with the baseline's stored values instead")
        return None


def side_by_side_baseline(there: dict[str, Measured], here: dict[str, Measured], rule: ToleranceRule,
                          recorded: dict[str, Any] | None = None) -> dict[str, Any]:
    """The other commit's medians as a baseline for compare(). Each metric's tolerance is the rule
    applied to its spread: the larger of this run's (its noisier side's repeats) and the one the
    baseline file recorded from its own repeats (`recorded`: that file's content). A few repeats a
    side can look tight by luck: CI once saw micro.roundtrip_10mb's 4 + 4 within a few percent and
    failed a 12% gap between two commits with the same PS code, a metric whose 10 recorded repeats
    spread 5% (tolerance 20%). Drawn from the recorded repeats, that made a false alarm on some
    metric in about 6% of CI runs; with the recorded spread as a lower bound, about 0.4%."""
    known = (recorded or {}).get("metrics", {})
    metrics = {}
    for metric, m in there.items():
        noisier = max(spread(m.samples), spread(here[metric].samples) if metric in here else 0.0)
        spread_ = max(noisier, float(known.get(metric, {}).get("spread", 0.0)))
        metrics[metric] = {"value": m.value, "higher_is_better": m.higher_is_better,
                           "tolerance": rule.tolerance_for(spread_)}
    return {"metrics": metrics}


def _check_against(sha: str, baseline: dict[str, Any], args: argparse.Namespace, log: Callable[[str], None]) -> int:
    from .side_by_side import measure_side_by_side

    there, here = ({m: Measured(statistics.median(v), higher, tuple(v)) for m, (higher, v) in side.items()}
                   for side in measure_side_by_side(sha, args.only, args.quick, args.repeats, log))
    rows = compare(side_by_side_baseline(there, here, ToleranceRule.of(baseline), baseline), here, args.tolerance)
    print(format_table(rows))
    print(f"baseline: commit {sha[:12]} measured on this machine beside this checkout, {args.repeats} interleaved "
          f"repeat(s) each ({'quick' if args.quick else 'full'} sizes)")
    print(gate_coverage(rows))
    return _verdict(rows)


def _verdict(rows: list[Row]) -> int:
    regressions = [r.metric for r in rows if r.status == "REGRESSION"]
    if regressions:
        print(f"psbench regress: REGRESSION in {', '.join(regressions)}", file=sys.stderr)
        return 1
    return 0


def main(args: argparse.Namespace) -> int:
    names = args.only or list(RATIO_BENCHMARKS)
    unknown = [n for n in names if n not in RATIO_BENCHMARKS]
    if unknown:
        raise ConfigError(f"unknown benchmark(s) {', '.join(unknown)}; choose from: {', '.join(RATIO_BENCHMARKS)}")
    if args.repeats < 1:
        raise ConfigError(f"--repeats must be >= 1, got {args.repeats}")
    if args.tolerance is not None and not 0 < args.tolerance < 10:
        raise ConfigError(f"--tolerance is a fraction (e.g. 0.25), got {args.tolerance}")
    if args.tolerance is not None and args.update_baseline:
        raise ConfigError("--tolerance applies to a check; a baseline's tolerances come from its repeats' spread "
                          "(tolerance_rule in the baseline file)")
    if args.against is not None and args.update_baseline:
        raise ConfigError("--against compares with another commit measured now; --update-baseline writes this "
                          "checkout's values: use one")
    baseline = None
    if not args.update_baseline or Path(args.baseline).is_file():
        baseline = load_baseline(args.baseline)
    log = lambda s: print(f"psbench regress: {s}", file=sys.stderr)  # noqa: E731
    if args.against is not None:
        assert baseline is not None
        sha = _against_commit(args.against, baseline, log)
        if sha is not None:
            return _check_against(sha, baseline, args, log)
    measured = measure(names, quick=args.quick, repeats=args.repeats, log=log)
    if args.update_baseline:
        atomic_write_json(args.baseline, updated_baseline(baseline, measured, args.quick))
        print(format_table(compare(load_baseline(args.baseline), measured)))
        print(f"baseline written: {args.baseline}")
        return 0
    assert baseline is not None
    if args.only:  # metrics of benchmarks not run are not compared
        prefixes = tuple(f"{n}." for n in names)
        baseline = {**baseline, "metrics": {k: v for k, v in baseline["metrics"].items() if k.startswith(prefixes)}}
    rows = compare(baseline, measured, args.tolerance)
    print(format_table(rows))
    print(gate_coverage(rows))
    base_machine = baseline.get("machine") or {}
    if base_machine:
        print(f"baseline measured on {base_machine.get('cores')} cores, {base_machine.get('processor')}, "
              f"{baseline.get('measured_at', '?')} ({baseline.get('sizes', '?')} sizes)")
    return _verdict(rows)
