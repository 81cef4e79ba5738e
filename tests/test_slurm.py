"""Slurm for real: Debian's slurm-wlm on two namespace hosts (psbench/bench/lab/slurm.py), where
`sbatch --wait deploy/slurm/psbench.sbatch` runs a PS job (the script's 2 nodes x 2 tasks: 1 shard +
3 workers) and a DDP job (a rank a node), each across both hosts, into run folders with a local
run's columns; a job that fails is one line; nothing of the cluster is left afterwards; `psbench
netlab slurm` brings the same up and down. Skipped only where slurm-wlm or namespaces are not."""
from __future__ import annotations

import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from psbench.bench.harness.results import load_suite
from psbench.bench.lab import netlab, slurm
from psbench.bench.lab.launch.run import TOKEN_NEEDED
from psbench.bench.lab.netlab import NetLab
from psbench.bench.lab.slurm import SlurmLab
from psbench.core.spec import RunSpec
from suite_helpers import assert_local_columns, recorded_locally

REASON = netlab.unavailable_reason() or slurm.unavailable_reason()
pytestmark = [pytest.mark.slow, pytest.mark.netns, pytest.mark.skipif(REASON is not None, reason=f"slurm lab: {REASON}")]
ROOT = Path(__file__).resolve().parent.parent
SCRIPT = str(ROOT / "deploy" / "slurm" / "psbench.sbatch")
WORKLOAD, STEPS = "mlp-digits", 200
# enough epochs that every worker's shard lasts the steps (digits: 1,437 rows, 15 batches a worker an epoch)
EPOCHS = 20
# psbench as the nodes run it: this checkout's Python (sbatch passes the environment on)
PSBENCH = f"{sys.executable} -m psbench"


def shown_job(lab: NetLab, cluster: SlurmLab, job_id: str, tries: int = 5) -> str:
    """`scontrol show job`'s one line for a finished job. Right after `sbatch --wait` returns it can
    print nothing (the record not yet answerable); asked again, it answers: a few tries a second
    apart, the last attempt's error kept for the assertion."""
    for _ in range(tries):
        shown = lab.run(1, ["scontrol", "--oneliner", "show", "job", job_id], env=cluster.env())
        if shown.stdout.strip():
            return shown.stdout
        time.sleep(1)
    return f"(scontrol printed nothing; exit {shown.returncode}: {shown.stderr.strip()})"


def test_sbatch_runs_ps_and_ddp_across_two_namespace_hosts(tmp_path):
    token = tmp_path / "token"
    token.write_text(secrets.token_hex(16) + "\n")
    os.chmod(token, 0o600)
    jobs = {  # system: (sbatch's own flags, psbench launch's flags, ranks)
        "ps": ([], ["--system", "ps", "--token-file", str(token)], 4),   # the script's 2 nodes x 2 tasks
        "ddp": (["--nodes=2", "--ntasks-per-node=1"], ["--system", "ddp", "--insecure", "true"], 2),
    }
    with NetLab(hosts=2) as lab:
        with SlurmLab(lab) as cluster:
            done = {}
            for system, (sbatch_args, launch_args, _) in jobs.items():
                job = cluster.submit(1, SCRIPT, [*launch_args, "--workload", WORKLOAD, "--max-steps", str(STEPS),
                                                 "--epochs", str(EPOCHS), "--results-dir", str(tmp_path / system), "--suite", "slurm"],
                                     tmp_path / f"{system}.out", sbatch_args, env={"PSBENCH": PSBENCH})
                assert job.failure() is None, job.failure() + "\n" + job.output[-3000:]
                done[system] = (job, shown_job(lab, cluster, job.job_id))
            # a job that fails says why in one line: a ps job without its token
            bad = cluster.submit(1, SCRIPT, ["--system", "ps", "--workload", WORKLOAD, "--results-dir",
                                             str(tmp_path / "bad")], tmp_path / "bad.out", ["--nodes=2", "--ntasks=2"],
                                 env={"PSBENCH": PSBENCH, "PSBENCH_PS_TOKEN": ""})
        assert cluster.leftover() == [], "the Slurm lab left processes behind"
        host0 = lab.addr(0)
        assert not cluster.dir.exists() and not list(Path("/etc/netns").glob(f"{lab.ns(0)[:-1]}*"))
    # the exit code is the step's: the first rank's 2, or 143 where srun's SIGTERM to the others came first
    assert re.fullmatch(rf"Slurm job {bad.job_id} failed \(sbatch exit \d+\): {re.escape(TOKEN_NEEDED)}",
                        bad.failure() or ""), bad.failure()
    assert not list((tmp_path / "bad").rglob("manifest.json"))

    report = []
    for system, (job, shown) in done.items():
        ranks = jobs[system][2]
        assert f"NodeList={cluster.names[0][:-1]}[0-1]" in shown and f"NumTasks={ranks}" in shown, shown
        run = load_suite(tmp_path / system / "slurm")
        assert len(run.runs) == 1 and len(run.steps) == (ranks - (system == "ps")) * STEPS
        assert_local_columns(run, recorded_locally(tmp_path / f"local-{system}", system))
        accuracy = float(run.runs["final_val_accuracy"][0])
        assert accuracy > 0.8, accuracy   # chance is 0.1 on digits
        launch = run.manifests[run.runs["run_id"][0]]["extra"]["launch"]
        assert launch["engine"] == "slurm" and launch["world"] == ranks and launch["master_addr"] == cluster.names[0]
        assert launch["clock"]["within_bound"] is True and len(launch["clock"]["offsets_s"]) == ranks
        if system == "ps":   # rank 0, the shard, on host 0, reached at its lab address
            assert [s.rsplit(":", 1)[0] for s in launch["shards"]] == [host0], launch["shards"]
        assert not [p for p in (tmp_path / system / "slurm").iterdir() if p.name.startswith(".")], "staging left"
        written = [p.read_text(errors="replace") for p in (tmp_path / system).rglob("*") if p.is_file()]
        assert not [t for t in [job.output, shown, *written] if token.read_text().strip() in t], "the token leaked"
        run_time = re.search(r"RunTime=(\S+)", shown).group(1)
        report.append(f"{system} {ranks} ranks: {job.wall_s:.1f} s wall (sbatch --wait), RunTime {run_time}, accuracy {accuracy:.3f}, "
                      f"clock offsets {json.dumps(launch['clock']['offsets_s'])}, rtt {json.dumps(launch['clock']['rtt_s'])}")
    print("\n".join(["Slurm on two namespace hosts:", *report]))


def test_netlab_slurm_command_stays_up_until_sigterm_and_leaves_nothing():
    proc = subprocess.Popen([sys.executable, "-m", "psbench", "netlab", "slurm", "--hosts", "2"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    for line in proc.stdout:   # up: sinfo's nodes idle, then how to submit
        lines.append(line)
        if line.startswith("Ctrl-C"):
            break
    conf = re.search(r"SLURM_CONF=(\S+)", "".join(lines))
    proc.send_signal(signal.SIGTERM)
    out = "".join(lines) + proc.communicate(timeout=60)[0]
    assert proc.returncode == 0 and conf, out
    lab = re.search(r"--lab (\d+)", out).group(1)
    assert re.search(rf"psb{lab}h0 .* idle", out) and re.search(rf"psb{lab}h1 .* idle", out), out
    folder = str(Path(conf.group(1)).parent)
    assert f"Slurm lab {lab} down" in out and not Path(folder).exists()
    assert not [p.pid for p in psutil.process_iter(["cmdline"]) if folder in " ".join(p.info["cmdline"] or [])]
    assert f"psb-{lab}-h0" not in netlab.list_namespaces() and not list(Path("/etc/netns").glob(f"psb-{lab}-*"))


def test_a_daemon_that_does_not_start_is_one_line_and_leaves_nothing(monkeypatch):
    """slurmd with cgroup autodetection, which fails under `ip netns exec` (its fresh sysfs has no
    /sys/fs/cgroup): the lab says which daemon and its first error, and stops the others."""
    monkeypatch.setattr(slurm, "CGROUP_CONF", "CgroupPlugin=autodetect\n")
    with NetLab(hosts=2) as lab:
        cluster = SlurmLab(lab)
        with pytest.raises(RuntimeError) as failed:
            cluster.__enter__()
        assert cluster.leftover() == [] and not cluster.dir.exists()
    # one slurmd or both, as they happened to exit before the lab looked
    node = rf"slurmd psb{lab.lab}h[01] \(1\)"
    assert re.fullmatch(rf"Slurm lab: nodes {cluster.names[0]}, {cluster.names[1]} idle did not come up; exited: "
                        rf"{node}(, {node})?; slurmd: error: No filesystem mounted on /sys/fs/cgroup",
                        str(failed.value)), failed.value


SUITE_TOML = """\
suite = "slurm-suite"
[matrix]
system = ["ddp", "ps"]
workload = "mlp-digits"
workers = 2
seed = [0, 1]
[settings]
max_steps = {steps}
epochs = {epochs}
[options.ddp]
insecure = true      # its ranks on two hosts: torch's store and gloo have no authentication
[options.ps]
servers = 1
"""


def test_a_suite_runs_as_one_slurm_job_a_run_and_resumes(tmp_path):
    """`psbench run --config FILE --launcher slurm` from lab host 1 (a login node): ddp (a rank a
    node) and ps (shard + 2 workers: 3 ranks on 2 nodes), 2 seeds each, four jobs, every run
    folder under its matrix run id with a local run's columns; a second invocation submits nothing;
    a system psbench launch cannot run is one line before any job."""
    from psbench.bench.harness.matrix import load_experiment
    from report_fixtures import fake_run

    token = tmp_path / "token"
    token.write_text(secrets.token_hex(16) + "\n")
    os.chmod(token, 0o600)
    config = tmp_path / "suite.toml"
    config.write_text(SUITE_TOML.format(steps=STEPS // 2, epochs=EPOCHS))
    mixed = tmp_path / "mixed.toml"
    mixed.write_text(SUITE_TOML.format(steps=STEPS // 2, epochs=EPOCHS).replace('["ddp", "ps"]', '["ddp", "ps", "spark-mllib"]'))
    results = tmp_path / "results"
    command = [sys.executable, "-m", "psbench", "run", "--launcher", "slurm", "--results-dir", str(results),
               "--token-file", str(token), "--no-progress", "--config"]
    with NetLab(hosts=2) as lab:
        with SlurmLab(lab) as cluster:
            def psbench_run(config_file: Path) -> subprocess.CompletedProcess:
                return lab.run(1, [*command, str(config_file)], env=cluster.env({"PSBENCH": PSBENCH}), timeout=170,
                               cwd=ROOT)

            first = psbench_run(config)
            assert first.returncode == 0, first.stderr[-3000:]
            suite_dir = results / "slurm-suite"
            manifests = {p: p.stat().st_mtime_ns for p in suite_dir.glob("*/manifest.json")}
            again = psbench_run(config)
            refused = psbench_run(mixed)
        assert cluster.leftover() == [], "the Slurm lab left processes behind"

    specs = load_experiment(config).specs
    suite = load_suite(suite_dir)
    assert sorted(suite.runs["run_id"]) == sorted(s.run_id for s in specs)
    jobs = re.findall(r"psbench: (\S+): Slurm job (\d+), (--nodes=\d --ntasks=\d --ntasks-per-node=\d), ([\d.]+) s",
                      first.stderr)
    assert sorted((run_id, shape) for run_id, _, shape, _ in jobs) == sorted(
        (s.run_id, "--nodes=2 --ntasks=3 --ntasks-per-node=2" if s.system == "ps" else
         "--nodes=2 --ntasks=2 --ntasks-per-node=1") for s in specs), first.stderr
    for spec in specs:
        launch = suite.manifests[spec.run_id]["extra"]["launch"]
        ranks = 3 if spec.system == "ps" else 2
        assert launch["engine"] == "slurm" and launch["world"] == ranks and launch["master_addr"] == cluster.names[0]
        plan = launch["slurm_plan"]
        assert plan["nodes"] == 2 and plan["ranks"] == ranks and plan["node_cpus"] == cluster.cpus
        assert plan["oversubscribed"] is False
    assert len(suite.steps) == len(specs) * 2 * (STEPS // 2)   # every run: 2 workers x its steps
    local_dir = tmp_path / "local"
    for spec in specs[:2]:   # a ddp and a ps run as the harness's Recorder writes them here
        fake_run(local_dir, "local", RunSpec(spec.system, "mlp-digits", workers=2, options=spec.options),
                 step_s=0.01, steps=6, target=1.0)
    local = load_suite(local_dir / "local")
    for table in ("steps", "evals", "events"):
        assert set(getattr(suite, table).columns) == set(getattr(local, table).columns), table
    assert set(local.runs.columns) <= set(suite.runs.columns)
    assert not [p.name for p in suite_dir.iterdir() if p.name.startswith(".") or p.name == "failed"]
    assert not [p for p in suite_dir.rglob("*") if p.is_file() and token.read_text().strip() in p.read_text(errors="replace")]

    # resumed: nothing submitted, nothing rewritten
    assert again.returncode == 0 and "Slurm job" not in again.stderr, again.stderr
    assert f"{len(specs)} run(s) of suite 'slurm-suite' already complete" in again.stderr
    assert {p: p.stat().st_mtime_ns for p in suite_dir.glob("*/manifest.json")} == manifests
    # refused at plan time, one line, before any job
    assert refused.returncode == 2 and refused.stderr.strip() == (
        "psbench: error: --launcher slurm cannot run system(s) spark-mllib (psbench launch runs ddp, ps, horovod): "
        "drop them from the experiment, or run it without --launcher"), refused.stderr
    print("psbench run --launcher slurm on two namespace hosts: " + "; ".join(
        f"{run_id} job {job} {shape}: {wall} s" for run_id, job, shape, wall in jobs))
