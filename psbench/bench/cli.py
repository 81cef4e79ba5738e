"""psbench command line: `psbench run`, `psbench bench`, `psbench list`, and the role commands.

Only the command being run is built: `psbench --help` and `psbench list` import no adapter, no
torch and no pyspark (tests/test_architecture.py checks it)."""
from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
import sys
from pathlib import Path
from typing import Any, Callable

from psbench.core.errors import ConfigError

EXPERIMENTS_DIR = Path(__file__).resolve().parent / "experiments"
DEFAULT_RESULTS = Path("results")

# Commands that live beside the code they drive: name -> (module, one-line help). Each module
# has add_arguments(parser) and main(args) -> int; imported only when that command is run.
EXTRA_COMMANDS: dict[str, tuple[str, str]] = {
    "netlab": ("psbench.bench.lab.command", "network namespaces as separate hosts (root): up | down | status | exec | slurm"),
    "simulate": ("psbench.bench.sim.command", "the scale model: --from RESULTS, costs measured from its runs, checked "
                 "against them, projected to 8..1024 workers (without --from: the analytic model)"),
    "report": ("psbench.bench.report.document", "write report.md/html and plots for suite folder(s) (results/<suite>)"),
    "thesis": ("psbench.bench.report.thesis", "the thesis' findings beside ours, with verdicts, over the "
               "suites of a results folder (writes RESULTS_DIR/thesis.md)"),
    "compare": ("psbench.bench.report.compare", "compare two result sets (suites, runs, results roots): ratios B/A "
                "with bootstrap intervals, matched by run spec"),
    "regress": ("psbench.bench.regress.check", "CI regression check of throughput ratios: against the baseline commit measured side by side (--against), or the stored values in bench/regress/baselines/regress.json"),
    "ps-server": ("psbench.systems.ps.server", "run one parameter-server shard (for multi-host runs by hand)"),
    "ps-worker": ("psbench.systems.ps.worker", "run one parameter-server worker against running shards"),
    "spark-cluster": ("psbench.bench.lab.spark_cluster", "a Spark standalone cluster (master + workers) on loopback or "
                      "namespace hosts, in the foreground until Ctrl-C"),
    "neighbourhoods": ("psbench.workloads.neighbourhoods", "where sharding has something to balance: a data set's "
                       "sparse neighbourhoods per k and random shards' class mix"),
    "slim": ("psbench.bench.harness.slim", "drop a suite's per-step records but for the runs of its first N seeds "
             "(the rest of every run kept), so a results folder stays small enough to commit"),
    "pack": ("psbench.bench.harness.pack", "pack a suite's run folders into one compressed table a kind "
             "(<suite>/records/), checked to read back the same; every reader takes either form"),
    "gpu-check": ("psbench.bench.gpu_check", "the GPU paths on this machine's CUDA devices (single, ddp with NCCL, "
                  "ps with one shard), a few hundred steps each: samples/s and the step's time columns; exit 3 "
                  "without CUDA"),
    "ps-job": ("psbench.bench.lab.compose_job", "finish a PS job run elsewhere (docker compose): wait for the workers' "
               "bye, fetch, shut the servers down, write one run folder"),
}


def _add_run_arguments(p: argparse.ArgumentParser) -> None:
    from psbench.core.spec import RunSpec

    defaults = RunSpec("x", "y")
    g = p.add_argument_group("what to run")
    g.add_argument("--config", type=Path, help="experiment file (TOML/YAML): a matrix of runs; other flags then ignored")
    g.add_argument("--cluster", type=Path, help="cluster file (TOML/YAML): one run placed on hosts (bench/lab/cluster/file.py)")
    g.add_argument("--dry-run", action="store_true",
                   help="print each run's plan (its cores; done or to run), or with --cluster each role's command; "
                        "run nothing")
    g.add_argument("--launcher", choices=("local", "slurm"), default="local",
                   help="where the runs run: here (default), or each run not complete one Slurm job "
                        "(sbatch --wait deploy/slurm/psbench.sbatch; ddp, ps, horovod; a ps run's token from "
                        "--token-file; --results-dir on a file system every node shares; docs/hosts.md)")
    g.add_argument("--system", help="system adapter (see `psbench list`)")
    g.add_argument("--workload", help="workload name (see `psbench list`), or a workload file (path.toml: your model, "
                                      "data, optimiser, batch size and target; docs/workloads.md)")
    g.add_argument("--model", metavar="PKG.MODULE:FACTORY",
                   help="your model: factory(input_shape, n_classes) -> nn.Module, seeded first; with --dataset, "
                        "instead of --workload")
    g.add_argument("--dataset", metavar="PKG.MODULE:LOADER",
                   help="your data: loader(seed, data_dir) -> (x_train, y_train, x_val, y_val) or a Dataset")
    g.add_argument("-np", "--workers", type=int, default=defaults.workers, help="number of worker processes (default 1)")
    g.add_argument("--epochs", type=int, help="epochs (default: the workload's)")
    g.add_argument("--batch-size", type=int, help="mini-batch size per worker (default: the workload's)")
    g.add_argument("--lr", type=float, help="learning rate (default: the workload's)")
    g.add_argument("--seed", type=int, default=defaults.seed, help="seed for data split, shards and init (default 0)")
    g.add_argument("--sharding", default=defaults.sharding,
                   help="random | stratified | distribution-aware:K (default random)")
    g.add_argument("--max-steps", type=int, help="stop each worker after this many steps")
    g.add_argument("--evals-per-epoch", type=int, default=defaults.evals_per_epoch, help="evaluations per epoch (default 2)")
    g.add_argument("--eval-every-s", type=float, metavar="T",
                   help="a timer evaluator: snapshot the model every T s of the training clock and evaluate it off "
                        "the clock, the same schedule for every system (single, ps, ddp, horovod, switch)")
    g.add_argument("--data-dir", help="folder with MNIST IDX / CIFAR-10 binary files, for workloads that read files")
    g.add_argument("--device", default=defaults.device, metavar="cpu|cuda|auto",
                   help="where the model and batches live: cpu (default), cuda (single, ddp with NCCL, ps, "
                        "spark-torch; refused without CUDA), auto (cuda where torch sees it and the system has "
                        "it, else cpu); the resolved device is recorded (docs/devices.md)")
    c = p.add_argument_group("cluster conditions (psbench/core/emulation.py)")
    c.add_argument("--emulate-device", metavar="SPEC",
                   help="each worker's mini-batch takes at least this long (the real gradient is computed, the "
                        "rest slept): step_ms=X, example_ms=Y (x batch), both, or a profile: cluster-node, "
                        "cluster-node-batch")
    c.add_argument("--stragglers", metavar="SPEC",
                   help="seeded stragglers: slow:W=F (worker W F times slower), transient:p=P,ms=MS (a step stalls "
                        "MS ms with probability P), spread:lo=A,hi=B (per-worker factor ~ U(A,B)); join with +")
    c.add_argument("--budget", metavar="KIND=N",
                   help="a global budget instead of --max-steps per worker: updates=N or samples=N over all "
                        "workers (ps), or seconds=T of the training clock (single, ps, ddp, horovod, switch: "
                        "both phases)")
    c.add_argument("--allow-oversubscribe", action="store_true",
                   help="with --config: run even the runs whose processes need more cores than this machine has "
                        "(recorded; a single run asked for by hand always runs, with a warning)")
    o = p.add_argument_group("where results go")
    o.add_argument("--results-dir", type=Path, default=DEFAULT_RESULTS, help="results root (default ./results)")
    o.add_argument("--suite", help="results sub-folder (default: the config's suite, or 'runs')")
    o.add_argument("--no-resume", action="store_true", help="re-run runs that are already complete")
    o.add_argument("--quick", action="store_true", help="with --config: the config's [quick] sizes")
    o.add_argument("--no-progress", action="store_true", help="no progress bar")
    _add_output_arguments(o)
    _add_system_option_groups(p)


def _add_output_arguments(group: argparse._ActionsContainer) -> None:
    """Where records go besides results/ and in which format (shared by `run` and `bench`)."""
    from psbench.core.records import DEFAULT_FORMAT, RECORD_FORMATS

    group.add_argument("--format", dest="record_format", choices=RECORD_FORMATS, default=DEFAULT_FORMAT,
                       help=f"record tables as {' or '.join(RECORD_FORMATS)} files (default {DEFAULT_FORMAT}); "
                            "readers take either")
    group.add_argument("--mlflow", metavar="URI", help="also log each run (params, per-step metrics) and the "
                       "suite's report plots to MLflow, e.g. file:./mlruns (needs the mlflow extra)")
    group.add_argument("--tensorboard", metavar="DIR", type=Path, help="also write TensorBoard event files of each "
                       "run and the report plots under DIR/<suite>/ (needs the tensorboard extra)")
    group.add_argument("--mllog", metavar="PATH", type=Path, help="also write each run's MLPerf Training MLLOG "
                       "events (run_start, eval_accuracy, run_stop, ...): `psbench run` of one run to the file PATH, "
                       "with --config or `bench` one file a run, PATH/<suite>/<run-id>.txt (needs the mllog extra)")
    group.add_argument("--mllog-submission", metavar="K=V,...", help="the MLLOG submission fields over their "
                       "defaults: org=psbench, division=open|closed, status=research|onprem|cloud|preview, "
                       "platform=(the machine's cores)")


def _add_system_option_groups(p: argparse.ArgumentParser) -> None:
    """One group per system, built from its Options dataclass; a field shared by systems is one flag."""
    from psbench import systems

    seen: set[str] = set()
    for name in systems.names():
        option_fields = dataclasses.fields(systems.get_system(name).Options)
        if not option_fields:
            continue
        group = p.add_argument_group(f"{name} options ({systems.describe(name)})")
        for f in option_fields:
            if f.name in seen:
                continue
            seen.add(f.name)
            default = f.default if f.default is not dataclasses.MISSING else None
            group.add_argument(f"--{f.name.replace('_', '-')}", dest=f"opt_{f.name}", default=None, metavar="V",
                               help=f"{f.metadata.get('help', '')} (default {default})")


def options_from_args(args: argparse.Namespace, system: str) -> dict[str, Any]:
    from psbench import systems
    given = {k[4:]: v for k, v in vars(args).items() if k.startswith("opt_") and v is not None}
    allowed = {f.name for f in dataclasses.fields(systems.get_system(system).Options)}
    stray = sorted(set(given) - allowed)
    if stray:
        flags = ", ".join("--" + s.replace("_", "-") for s in stray)
        raise ConfigError(f"{flags} does not apply to system '{system}'; its options: "
                          f"{', '.join('--' + a.replace('_', '-') for a in sorted(allowed)) or 'none'}")
    return given


def cmd_run(args: argparse.Namespace) -> int:
    from psbench.bench.harness.matrix import load_experiment
    from psbench.bench.harness.runner import run_all

    _check_trackers(args)
    if args.cluster:
        from psbench.bench.lab.cluster.file import load as load_cluster
        from psbench.bench.lab.cluster.run import dry_run, run_file

        cf = load_cluster(args.cluster)
        if args.dry_run:
            print("\n".join(dry_run(cf)))
            return 0
        result = run_file(cf, args.results_dir, resume=not args.no_resume, record_format=args.record_format)
        _print_summaries([result] if result else [])
        print(f"results: {Path(args.results_dir) / cf.suite}")
        _track(args, Path(args.results_dir) / cf.suite, [result])
        return 0
    from psbench.bench.harness.schema import check_suite_name

    if args.suite is not None:
        check_suite_name(args.suite, "psbench run", "--suite")
    if args.config:
        experiment = load_experiment(args.config, quick=args.quick)
        specs, suite = experiment.specs, args.suite or experiment.suite_folder
    else:
        workload = _workload_from_args(args)
        if not args.system or not workload:
            raise ConfigError("give --system and --workload (or --model and --dataset), or --config FILE "
                              "(see `psbench list`)")
        specs = [_spec_from_args(args, workload, args.workers, "psbench run")]
        suite = args.suite or "runs"
    # One run asked for by hand runs as asked, oversubscribed or not (as horovodrun or spark-submit
    # would), with a warning and the plan in its manifest; a suite refuses unless allowed.
    allow = args.allow_oversubscribe or args.config is None or experiment.allow_oversubscribe
    if args.launcher == "slurm":
        from psbench.bench.lab.launch.slurm_suite import run_suite

        run_suite(specs, args.results_dir, suite, args.opt_token_file, resume=not args.no_resume,
                  allow_oversubscribe=allow, record_format=args.record_format, dry_run=args.dry_run)
        if not args.dry_run:
            print(f"results: {Path(args.results_dir) / suite}")
        return 0
    results = run_all(specs, args.results_dir, suite, resume=not args.no_resume, progress=not args.no_progress,
                      allow_oversubscribe=allow, record_format=args.record_format, dry_run=args.dry_run)
    if args.dry_run:
        return 0
    _print_summaries([r for r in results if r is not None])
    print(f"results: {Path(args.results_dir) / suite}")
    _track(args, Path(args.results_dir) / suite, results)
    return 0


def _spec_from_args(args: argparse.Namespace, workload: str, workers: int, command: str):
    from psbench.bench.harness.schema import check_spec
    from psbench.core.spec import RunSpec

    spec = RunSpec(system=args.system, workload=workload, workers=workers, seed=args.seed,
                   epochs=args.epochs, batch_size=args.batch_size, lr=args.lr, sharding=args.sharding,
                   max_steps=args.max_steps, evals_per_epoch=args.evals_per_epoch, data_dir=args.data_dir,
                   options=options_from_args(args, args.system), emulate_device=args.emulate_device,
                   stragglers=args.stragglers, budget=args.budget, eval_every_s=args.eval_every_s,
                   device=args.device)
    check_spec(spec.to_dict(), command, "--")  # e.g. -np 4000: the same bound as a file's
    return spec


# `psbench run` flags that a launched rank does not take (the engine starts the ranks; one run)
NOT_LAUNCH = ("config", "cluster", "dry_run", "quick", "allow_oversubscribe", "mlflow", "tensorboard", "mllog",
              "mllog_submission", "no_resume")
# options of ddp and horovod that place ranks themselves; under an engine the environment does
LAUNCH_PLACED = ("master_addr", "master_port", "nnodes", "node_rank", "hosts", "ssh_config")


def cmd_launch(args: argparse.Namespace) -> int:
    """One rank of a run started by an engine (torchrun, srun, mpirun): psbench/bench/lab/launch/."""
    from psbench.bench.harness.runner import planned_device
    from psbench.bench.harness.schema import check_suite_name
    from psbench.bench.lab.launch.env import read_env
    from psbench.bench.lab.launch.run import launch
    from psbench.core.emulation import parse_device
    from psbench.systems import get_system
    from psbench.systems.allreduce_common import exit_now

    given = [n for n in NOT_LAUNCH if getattr(args, n, None)] + [n for n in LAUNCH_PLACED
                                                                   if getattr(args, f"opt_{n}", None) is not None]
    if args.workers != 1:
        given.append("workers")
    if args.launcher != "local":
        given.append("launcher")
    if given:
        raise ConfigError(f"psbench launch does not take --{given[0].replace('_', '-')}: the engine starts one "
                          "process per rank and the environment gives ranks, world size and rendezvous")
    env = read_env(os.environ, args.env)
    spec = _launched_spec(args, env.world) if args.spec is not None else _launch_spec_from_args(args, env.world)
    if args.suite is not None:
        check_suite_name(args.suite, "psbench launch", "--suite")
    # the rank's device, auto made concrete and refused as a planned run's is (with an emulated device too)
    spec = dataclasses.replace(spec, device=planned_device(spec, get_system(spec.system),
                                                           parse_device(spec.emulate_device) is not None))
    result = launch(spec, env, args.results_dir, args.suite or "runs", args.record_format)
    if result is not None:
        _print_summaries([result])
        print(f"results: {Path(args.results_dir) / (args.suite or 'runs')}")
    exit_now(0)   # every file is written; torch's teardown of the process group's threads can hang
    return 0


def _launch_spec_from_args(args: argparse.Namespace, world: int):
    """The run from psbench run's flags; its workers from the ranks the engine started."""
    from psbench.bench.lab.launch.env import LAUNCHED_SYSTEMS, workers_of

    workload = _workload_from_args(args)
    if args.system not in LAUNCHED_SYSTEMS or not workload:
        raise ConfigError(f"psbench launch needs --system {'|'.join(LAUNCHED_SYSTEMS)} and --workload (or --model "
                          "and --dataset)")
    servers = int(args.opt_servers) if args.system == "ps" and args.opt_servers else 1  # ps: ranks 0..S-1
    return _spec_from_args(args, workload, workers_of(args.system, world, servers), "psbench launch")


def _launched_spec(args: argparse.Namespace, world: int):
    """--spec JSON: the run exactly as `psbench run --launcher slurm` planned it (its run id the
    matrix's: an option given as a flag would be a string, in the file a number)."""
    from psbench.bench.harness.schema import check_spec
    from psbench.bench.lab.launch.env import LAUNCHED_SYSTEMS, workers_of
    from psbench.core.spec import RunSpec

    if args.system or args.workload or args.model or args.dataset:
        raise ConfigError("psbench launch takes --spec JSON or the run's flags (--system, --workload, ...), not both")
    try:
        raw = json.loads(args.spec)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--spec is no JSON object of a run's settings: {exc}") from exc
    if not isinstance(raw, dict):
        raise ConfigError("--spec is no JSON object of a run's settings")
    spec = RunSpec.from_dict(raw)
    check_spec(spec.to_dict(), "psbench launch", "--spec ")
    if spec.system not in LAUNCHED_SYSTEMS:
        raise ConfigError(f"psbench launch runs --system {'|'.join(LAUNCHED_SYSTEMS)}, not {spec.system!r}")
    servers = int(spec.options.get("servers", 1)) if spec.system == "ps" else 1
    if workers_of(spec.system, world, servers) != spec.workers:
        shape = f"{servers} shard(s) and the workers" if spec.system == "ps" else "a rank a worker"
        raise ConfigError(f"--spec has {spec.workers} worker(s); the engine started {world} rank(s) ({shape})")
    return spec


def _workload_from_args(args: argparse.Namespace) -> str | None:
    """--workload NAME or FILE.toml (made absolute: every process of the run reads it), or --model
    with --dataset (workloads/user.py)."""
    from psbench.workloads.user import canonical_name, pair_name

    if args.model or args.dataset:
        if args.workload or not (args.model and args.dataset):
            raise ConfigError("give --model with --dataset (your own workload), or --workload, not both")
        return pair_name(args.model, args.dataset)
    return canonical_name(args.workload) if args.workload else None


def _plotting_trackers(args: argparse.Namespace) -> bool:
    return bool(getattr(args, "mlflow", None) or getattr(args, "tensorboard", None))


def _tracking(args: argparse.Namespace) -> bool:
    return _plotting_trackers(args) or bool(getattr(args, "mllog", None))


def _check_trackers(args: argparse.Namespace) -> None:
    if _tracking(args):
        from psbench.bench.report.mlperf_log import parse_submission
        from psbench.bench.report.trackers import check_available

        parse_submission(args.mllog_submission)
        check_available(args.mlflow, args.tensorboard, args.mllog)


def _track(args: argparse.Namespace, suite_dir: Path, results: list, report: Any = None) -> None:
    """Send the runs just completed (None: skipped), and the suite's report plots (the report is
    built if not given and MLflow or TensorBoard is asked for), to the trackers asked for."""
    done = [r for r in results if r is not None]
    if not _tracking(args) or not done:
        return
    from psbench.bench.report.mlperf_log import Target, parse_submission
    from psbench.bench.report.trackers import log_all

    if _plotting_trackers(args):
        report = report or _report(suite_dir)
    mllog = (Target(args.mllog, one_file=args.command == "run" and not args.config,
                    submission=parse_submission(args.mllog_submission)) if args.mllog else None)
    for line in log_all(suite_dir, [r.out_dir for r in done], report.plots if report else {}, args.mlflow,
                        args.tensorboard, mllog):
        print(line, file=sys.stderr)


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
    from psbench import systems
    from psbench.workloads import WORKLOADS
    from psbench.workloads.sharding import STRATEGIES

    print("systems:")
    for name in systems.names():
        reason = systems.quick_unavailable_reason(name)
        status = "" if reason is None else f"  [unavailable: {reason}]"
        print(f"  {name:<16} {systems.describe(name)}{status}")
    print("workloads:")
    for w in WORKLOADS.values():
        print(f"  {w.name:<24} {w.description}")
    print(f"  {'(your own)':<24} --model pkg.module:factory --dataset pkg.module:loader, or --workload "
          "file.toml (docs/workloads.md)")
    print(f"sharding: {', '.join(STRATEGIES)}")
    experiments = sorted(p.stem for p in EXPERIMENTS_DIR.glob("*.toml"))
    if experiments:
        print(f"experiments (bench/experiments): {', '.join(experiments)}")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from psbench.bench.harness.matrix import load_experiment
    from psbench.bench.harness.runner import run_all

    names = args.experiments or sorted(p.stem for p in EXPERIMENTS_DIR.glob("*.toml"))
    known = {p.stem: p for p in EXPERIMENTS_DIR.glob("*.toml")}
    known.update({n: Path(n) for n in names if n.endswith((".toml", ".yaml", ".yml")) and Path(n).is_file()})
    for name in names:
        if name not in known:
            raise ConfigError(f"unknown experiment '{name}'; choose from: {', '.join(sorted(known))}")
    experiments = [load_experiment(known[n], quick=args.quick) for n in names]  # validate all first
    _check_trackers(args)
    for experiment in experiments:
        suite = experiment.suite_folder
        print(f"== {experiment.suite}: {experiment.description} ({len(experiment.specs)} runs)", file=sys.stderr)
        results = run_all(experiment.specs, args.results_dir, suite, resume=not args.no_resume,
                          progress=not args.no_progress, skip_unavailable=True, record_format=args.record_format,
                          allow_oversubscribe=args.allow_oversubscribe or experiment.allow_oversubscribe)
        _print_summaries([r for r in results if r is not None])
        _track(args, Path(args.results_dir) / suite, results, _report(Path(args.results_dir) / suite))
    from psbench.bench.report.thesis import write as write_thesis

    out, found, left_out = write_thesis(Path(args.results_dir), args.quick)
    if left_out:
        print(f"thesis: {left_out}", file=sys.stderr)
    print(f"thesis: {out} ({', '.join(f'{f.suite}: {f.verdict}' for f in found) or 'no finding in these suites'})",
          file=sys.stderr)
    return 0


def _report(suite_dir: Path) -> Any:
    """Tables and plots for a suite just run; a suite with no runs (all unavailable) has none."""
    from psbench.bench.harness.results import OnlyLostRuns
    from psbench.bench.report.document import build_report

    if not any(p.is_dir() and not p.name.startswith(".") and p.name != "plots" for p in suite_dir.glob("*")):
        print(f"psbench: no runs in {suite_dir}, no report", file=sys.stderr)
        return None
    try:
        report = build_report(suite_dir)
    except OnlyLostRuns as only_lost:  # a fault experiment: its runs are kept, its report asks for the flag
        print(f"psbench: {only_lost}; no report", file=sys.stderr)
        return None
    if report.left_out:
        print(f"report: {report.left_out}", file=sys.stderr)
    print(f"report: {report.markdown} ({len(report.plots)} plots)", file=sys.stderr)
    return report


ALL = "*"  # build_parser(ALL): every command's arguments (for tests and tools)


def command_of(argv: list[str]) -> str | None:
    """The command named on a command line (the first word that is not an option), or None."""
    return next((a for a in argv if not a.startswith("-")), None)


def build_parser(command: str | None = ALL) -> argparse.ArgumentParser:
    """The parser, with the arguments of `command` alone (ALL: of every command; None: of none,
    enough for `psbench --help`), so a command never pays for another's imports."""
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
    if command in (ALL, "run"):
        _add_run_arguments(p)
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("launch", help="one rank of a run an engine starts once per rank (torchrun, srun, mpirun)",
                       description="One rank of a ddp, ps or horovod run started by torchrun, Slurm or Open MPI: rank, "
                                   "world size and rendezvous come from the environment; rank 0 writes the run "
                                   "folder (docs/hosts.md).")
    if command in (ALL, "launch"):
        _add_run_arguments(p)
        e = p.add_argument_group("psbench launch")
        e.add_argument("--env", choices=("torchrun", "slurm", "mpi"),
                       help="whose variables give rank and rendezvous (default: the first set of torchrun's "
                            "RANK, Slurm's SLURM_PROCID, Open MPI's OMPI_COMM_WORLD_RANK)")
        e.add_argument("--spec", metavar="JSON", help="the run's settings as a JSON object (a RunSpec), in place of "
                       "--system, --workload, ...: what `psbench run --launcher slurm` submits")
    p.set_defaults(func=cmd_launch)

    p = sub.add_parser("list", help="list systems, workloads, sharding strategies and experiments")
    p.set_defaults(func=cmd_list)

    p = sub.add_parser("bench", help="run the benchmark suite (bench/experiments/*.toml)",
                       description="Run the shipped experiments; completed runs are skipped (resume).")
    if command in (ALL, "bench"):
        p.add_argument("experiments", nargs="*", help="experiment names or experiment files (default: all shipped)")
        p.add_argument("--quick", action="store_true", help="a few-minute version of every experiment")
        p.add_argument("--results-dir", type=Path, default=DEFAULT_RESULTS, help="results root (default ./results)")
        p.add_argument("--no-resume", action="store_true", help="re-run runs that are already complete")
        p.add_argument("--no-progress", action="store_true", help="no progress bars")
        p.add_argument("--allow-oversubscribe", action="store_true",
                       help="run every experiment even where it needs more cores than this machine has (recorded)")
        _add_output_arguments(p)
    p.set_defaults(func=cmd_bench)

    for name, (module, help_text) in EXTRA_COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if command in (ALL, name):
            mod = importlib.import_module(module)
            mod.add_arguments(p)
            p.set_defaults(func=mod.main)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(command_of(argv))
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
