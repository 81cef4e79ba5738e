"""psbench command line: `psbench run`, `psbench bench`, `psbench list`, and the role commands."""
from __future__ import annotations

import argparse
import dataclasses
import importlib
import os
import sys
from pathlib import Path
from typing import Any, Callable

from workloads.errors import ConfigError

EXPERIMENTS_DIR = Path(__file__).resolve().parent / "experiments"
DEFAULT_RESULTS = Path("results")

# Commands that live beside the code they drive: name -> (module, one-line help). Each module
# has add_arguments(parser) and main(args) -> int; imported only when used or for --help.
EXTRA_COMMANDS: dict[str, tuple[str, str]] = {
    "netlab": ("bench.netlab", "network namespaces as separate hosts (root): up | down | status | exec"),
    "simulate": ("bench.simulate", "project PS / allreduce / Spark throughput to 8..512 workers from measured costs"),
    "report": ("bench.report", "write report.md/html and plots for suite folder(s) (results/<suite>)"),
    "regress": ("bench.regress", "CI regression check of throughput ratios against bench/baselines/regress.json"),
    "ps-server": ("systems.ps.server", "run one parameter-server shard (for multi-host runs by hand)"),
    "ps-worker": ("systems.ps.worker", "run one parameter-server worker against running shards"),
    "ps-job": ("bench.compose_job", "finish a PS job run elsewhere (docker compose): wait for the workers' bye, "
                                    "fetch, shut the servers down, write one run folder"),
}


def _system_classes() -> dict[str, type]:
    import systems

    return {name: systems.get_system(name) for name in systems.names()}


def _add_run_arguments(p: argparse.ArgumentParser) -> None:
    from bench.spec import RunSpec

    defaults = RunSpec("x", "y")
    g = p.add_argument_group("what to run")
    g.add_argument("--config", type=Path, help="experiment file (TOML/YAML): a matrix of runs; other flags then ignored")
    g.add_argument("--cluster", type=Path, help="cluster file (TOML/YAML): one run placed on hosts (bench/cluster.py)")
    g.add_argument("--dry-run", action="store_true", help="with --cluster: print each role's command, run nothing")
    g.add_argument("--system", help="system adapter (see `psbench list`)")
    g.add_argument("--workload", help="workload name (see `psbench list`)")
    g.add_argument("-np", "--workers", type=int, default=defaults.workers, help="number of worker processes (default 1)")
    g.add_argument("--epochs", type=int, help="epochs (default: the workload's)")
    g.add_argument("--batch-size", type=int, help="mini-batch size per worker (default: the workload's)")
    g.add_argument("--lr", type=float, help="learning rate (default: the workload's)")
    g.add_argument("--seed", type=int, default=defaults.seed, help="seed for data split, shards and init (default 0)")
    g.add_argument("--sharding", default=defaults.sharding,
                   help="random | stratified | distribution-aware:K (default random)")
    g.add_argument("--max-steps", type=int, help="stop each worker after this many steps")
    g.add_argument("--evals-per-epoch", type=int, default=defaults.evals_per_epoch, help="evaluations per epoch (default 2)")
    g.add_argument("--data-dir", help="folder with MNIST IDX / CIFAR-10 binary files, for workloads that read files")
    o = p.add_argument_group("where results go")
    o.add_argument("--results-dir", type=Path, default=DEFAULT_RESULTS, help="results root (default ./results)")
    o.add_argument("--suite", help="results sub-folder (default: the config's suite, or 'runs')")
    o.add_argument("--no-resume", action="store_true", help="re-run runs that are already complete")
    o.add_argument("--quick", action="store_true", help="with --config: the config's [quick] sizes")
    o.add_argument("--no-progress", action="store_true", help="no progress bar")
    _add_system_option_groups(p)


def _add_system_option_groups(p: argparse.ArgumentParser) -> None:
    """One group per system, built from its Options dataclass; a field shared by systems is one flag."""
    seen: set[str] = set()
    for name, cls in _system_classes().items():
        option_fields = dataclasses.fields(cls.Options)
        if not option_fields:
            continue
        group = p.add_argument_group(f"{name} options ({cls.description})")
        for f in option_fields:
            if f.name in seen:
                continue
            seen.add(f.name)
            default = f.default if f.default is not dataclasses.MISSING else None
            group.add_argument(f"--{f.name.replace('_', '-')}", dest=f"opt_{f.name}", default=None, metavar="V",
                               help=f"{f.metadata.get('help', '')} (default {default})")


def _options_from_args(args: argparse.Namespace, system: str) -> dict[str, Any]:
    import systems

    given = {k[4:]: v for k, v in vars(args).items() if k.startswith("opt_") and v is not None}
    allowed = {f.name for f in dataclasses.fields(systems.get_system(system).Options)}
    stray = sorted(set(given) - allowed)
    if stray:
        flags = ", ".join("--" + s.replace("_", "-") for s in stray)
        raise ConfigError(f"{flags} does not apply to system '{system}'; its options: "
                          f"{', '.join('--' + a.replace('_', '-') for a in sorted(allowed)) or 'none'}")
    return given


def cmd_run(args: argparse.Namespace) -> int:
    from bench.matrix import load_experiment
    from bench.runner import run_all
    from bench.spec import RunSpec

    if args.cluster:
        from bench import cluster

        cf = cluster.load(args.cluster)
        if args.dry_run:
            print("\n".join(cluster.dry_run(cf)))
            return 0
        result = cluster.run_file(cf, args.results_dir, resume=not args.no_resume)
        _print_summaries([result] if result else [])
        print(f"results: {Path(args.results_dir) / cf.suite}")
        return 0
    if args.config:
        experiment = load_experiment(args.config, quick=args.quick)
        specs, suite = experiment.specs, args.suite or experiment.suite
    else:
        if not args.system or not args.workload:
            raise ConfigError("give --system and --workload, or --config FILE (see `psbench list`)")
        specs = [RunSpec(system=args.system, workload=args.workload, workers=args.workers, seed=args.seed,
                         epochs=args.epochs, batch_size=args.batch_size, lr=args.lr, sharding=args.sharding,
                         max_steps=args.max_steps, evals_per_epoch=args.evals_per_epoch, data_dir=args.data_dir,
                         options=_options_from_args(args, args.system))]
        suite = args.suite or "runs"
    results = run_all(specs, args.results_dir, suite, resume=not args.no_resume, progress=not args.no_progress)
    _print_summaries([r for r in results if r is not None])
    print(f"results: {Path(args.results_dir) / suite}")
    return 0


def _print_summaries(results: list) -> None:
    import pandas as pd

    if not results:
        return
    rows = []
    for r in results:
        s = r.summary
        options = ",".join(f"{k}={v}" for k, v in sorted(r.options.items())) if getattr(r, "options", None) else ""
        rows.append({"run": r.run_id, "options": options, "samples/s": s.get("samples_per_s"), "train s": s.get("train_s"),
                     "val acc": s.get("final_val_accuracy"), "time to target s": s.get("time_to_target_s"),
                     "staleness mean": s.get("staleness_mean")})
    with pd.option_context("display.width", 200, "display.max_columns", 20, "display.float_format", "{:.3f}".format):
        print(pd.DataFrame(rows).to_string(index=False))


def cmd_list(args: argparse.Namespace) -> int:
    from workloads import WORKLOADS
    from workloads.sharding import STRATEGIES

    print("systems:")
    for name, cls in _system_classes().items():
        reason = cls.unavailable_reason()
        status = "" if reason is None else f"  [unavailable: {reason}]"
        print(f"  {name:<16} {cls.description}{status}")
    print("workloads:")
    for w in WORKLOADS.values():
        print(f"  {w.name:<24} {w.description}")
    print(f"sharding: {', '.join(STRATEGIES)}")
    experiments = sorted(p.stem for p in EXPERIMENTS_DIR.glob("*.toml"))
    if experiments:
        print(f"experiments (bench/experiments): {', '.join(experiments)}")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from bench.matrix import load_experiment
    from bench.runner import run_all

    names = args.experiments or sorted(p.stem for p in EXPERIMENTS_DIR.glob("*.toml"))
    known = {p.stem: p for p in EXPERIMENTS_DIR.glob("*.toml")}
    known.update({n: Path(n) for n in names if n.endswith((".toml", ".yaml", ".yml")) and Path(n).is_file()})
    for name in names:
        if name not in known:
            raise ConfigError(f"unknown experiment '{name}'; choose from: {', '.join(sorted(known))}")
    experiments = [load_experiment(known[n], quick=args.quick) for n in names]  # validate all first
    for experiment in experiments:
        suite = experiment.suite + ("-quick" if args.quick else "")
        print(f"== {experiment.suite}: {experiment.description} ({len(experiment.specs)} runs)", file=sys.stderr)
        results = run_all(experiment.specs, args.results_dir, suite, resume=not args.no_resume,
                          progress=not args.no_progress, skip_unavailable=True)
        _print_summaries([r for r in results if r is not None])
        _report(Path(args.results_dir) / suite)
    return 0


def _report(suite_dir: Path) -> None:
    """Tables and plots for a suite just run; a suite with no runs (all unavailable) has none."""
    from bench.report import build_report

    if not any(p.is_dir() and not p.name.startswith(".") and p.name != "plots" for p in suite_dir.glob("*")):
        print(f"psbench: no runs in {suite_dir}, no report", file=sys.stderr)
        return
    report = build_report(suite_dir)
    print(f"report: {report.markdown} ({len(report.plots)} plots)", file=sys.stderr)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="psbench",
        description="Benchmark distributed training: a parameter server (BSP/ASP/SSP), allreduce (DDP, "
                    "Horovod) and Spark on the same workloads; records throughput, staleness and accuracy.",
        epilog="examples:\n"
               "  psbench list\n"
               "  psbench run --system single --workload mlp-digits --epochs 2\n"
               "  psbench run --config bench/experiments/systems.toml --quick\n"
               "  psbench bench --quick",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    p = sub.add_parser("run", help="run one configuration or an experiment file",
                       description="Run one training configuration, or every run of an experiment file.")
    _add_run_arguments(p)
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("list", help="list systems, workloads, sharding strategies and experiments")
    p.set_defaults(func=cmd_list)

    p = sub.add_parser("bench", help="run the benchmark suite (bench/experiments/*.toml)",
                       description="Run the shipped experiments; completed runs are skipped (resume).")
    p.add_argument("experiments", nargs="*", help="experiment names or experiment files (default: all shipped)")
    p.add_argument("--quick", action="store_true", help="a few-minute version of every experiment")
    p.add_argument("--results-dir", type=Path, default=DEFAULT_RESULTS, help="results root (default ./results)")
    p.add_argument("--no-resume", action="store_true", help="re-run runs that are already complete")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=cmd_bench)

    for name, (module, help_text) in EXTRA_COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        mod = importlib.import_module(module)
        mod.add_arguments(p)
        p.set_defaults(func=mod.main)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return int(func(args) or 0)
    except ConfigError as exc:
        print(f"psbench: error: {exc}", file=sys.stderr)
        return 2
    except RuntimeError as exc:
        # A run that failed (a worker or task died): one line, no traceback; completed runs are kept.
        # PSBENCH_DEBUG=1 shows the traceback.
        if os.environ.get("PSBENCH_DEBUG"):
            raise
        print(f"psbench: run failed: {str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__}",
              file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("psbench: interrupted; completed runs are kept, re-run to resume", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
