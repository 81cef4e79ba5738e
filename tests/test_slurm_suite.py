"""`psbench run --config FILE --launcher slurm`, its planning without a cluster (sinfo's answer
given): ranks by role onto nodes, each node's CPU plan against the CPUs Slurm reports, the refusals
(a system psbench launch cannot run, a ps run without a token file, an allreduce run over nodes
without insecure) in one line before anything is submitted, and `psbench launch --spec` taking the
run whole. Jobs for real: tests/test_slurm.py."""
from __future__ import annotations

import json
import os
from types import SimpleNamespace

import pytest

from psbench.bench.cli import main
from psbench.bench.lab.launch import slurm_suite
from psbench.bench.lab.launch.slurm_suite import Nodes, Placement, node_plan, parse_sinfo, plan_slurm
from psbench.core.errors import ConfigError
from psbench.core.spec import RunSpec


@pytest.fixture
def token(tmp_path) -> str:
    path = tmp_path / "token"
    path.write_text("0123456789abcdef\n")
    os.chmod(path, 0o600)
    return str(path)


def test_sinfo_gives_the_default_partitions_usable_nodes_and_the_fewest_cpus_of_one():
    assert parse_sinfo("n0 8 idle lab*\nn1 4 mix lab*\nn0 8 idle big\n") == Nodes(2, 4)
    # down, drained or not responding nodes left out; another partition's nodes too
    assert parse_sinfo("n0 8 idle lab*\nn1 2 down lab*\nn2 2 idle* lab*\nn3 1 drain lab*\nn4 1 idle gpu\n") == Nodes(1, 8)
    assert parse_sinfo("n0 4 alloc a\nn1 4 idle b\n") == Nodes(2, 4)   # no default partition: all of them
    with pytest.raises(ConfigError, match=r"sinfo lists no usable node \(states idle, mix"):
        parse_sinfo("n0 8 down lab*\n")


def test_ps_shards_are_the_first_ranks_and_each_node_is_planned_against_its_cpus(token):
    spec = RunSpec("ps", "mlp-digits", workers=3, max_steps=20, options={"servers": 1})
    [run] = plan_slurm([spec], Nodes(2, 2), token, allow_oversubscribe=False)
    assert run.placement.roles == ("ps shard", "workers", "workers", "workers")
    assert run.placement.sbatch_args() == ["--nodes=2", "--ntasks=4", "--ntasks-per-node=2"]
    # the token's path goes with the run, not into its id (a location, not a setting)
    assert run.planned.spec.options["token_file"] == token and run.planned.spec.run_id == spec.run_id
    plan = run.slurm_plan
    assert plan["node_cpus"] == 2 and plan["nodes"] == 2 and not plan["oversubscribed"]
    # the busiest node holds two workers (a core each, computing flat out)
    assert plan["node_cpu_plan"] == {"workers": {"count": 2, "cores": pytest.approx(2.0, abs=0.01)}}


def test_a_node_the_cpu_plan_oversubscribes_is_refused_or_warned_and_recorded(token, monkeypatch, capsys):
    """Processes of more than a core each (a figure above 1: a JVM's threads) on a node's CPUs."""
    planned = SimpleNamespace(conditions={"cpu_plan": {"workers": {"count": 2, "cores": 2.6}}})
    placement = Placement(("workers", "workers"), 1, 2)
    plan = node_plan(planned, placement, Nodes(1, 2))
    assert plan["node_cpu_demand"] == 2.6 and plan["oversubscribed"] is True
    assert node_plan(planned, placement, Nodes(1, 3))["oversubscribed"] is False
    monkeypatch.setattr(slurm_suite, "node_plan", lambda *a: plan)
    spec = RunSpec("ddp", "mlp-digits", workers=2)
    with pytest.raises(ConfigError) as refused:
        plan_slurm([spec], Nodes(1, 2), None, allow_oversubscribe=False)
    assert str(refused.value) == (f"run {spec.run_id} needs about 2.6 cores on a node (2 workers x 1.30), a Slurm node "
                                  "has 2 (sinfo): use an emulated device (--emulate-device step_ms=20), fewer workers, "
                                  "more nodes, or --allow-oversubscribe (recorded in the manifest)")
    [crowded] = plan_slurm([spec], Nodes(1, 2), None, allow_oversubscribe=True)
    assert crowded.slurm_plan["oversubscribed"] is True and "recorded as oversubscribed" in capsys.readouterr().err


def test_more_tasks_a_node_than_its_cpus_is_refused_as_slurm_would_hold_it(token):
    """8 workers sleeping an emulated device and a shard: 5 tasks a 2-CPU node. The CPU plan says
    they fit, but Slurm gives each task a CPU (and rejects --ntasks-per-node beyond them even with
    --overcommit): one line at plan time, not a job sbatch refuses mid-suite."""
    spec = RunSpec("ps", "mlp-digits", workers=8, max_steps=20, emulate_device="cluster-node")
    with pytest.raises(ConfigError) as refused:
        plan_slurm([spec], Nodes(2, 2), token, allow_oversubscribe=True)
    assert str(refused.value) == (f"run {spec.run_id} has 9 ranks, 5 a node on 2 node(s); a Slurm node has 2 CPUs "
                                  "(sinfo) and Slurm gives each task one: use fewer workers, or a cluster of more nodes")
    [fits] = plan_slurm([spec], Nodes(2, 8), token, allow_oversubscribe=False)
    assert fits.placement.sbatch_args() == ["--nodes=2", "--ntasks=9", "--ntasks-per-node=5"]
    assert fits.slurm_plan["oversubscribed"] is False


def test_refusals_are_one_line_before_anything_is_submitted(token, monkeypatch):
    monkeypatch.setattr(slurm_suite, "submit", lambda *a, **k: pytest.fail("submitted"))
    ddp = RunSpec("ddp", "mlp-digits", workers=2)
    with pytest.raises(ConfigError, match=r"spans 2 nodes: .*insecure = true"):
        plan_slurm([ddp], Nodes(2, 2), None, False)
    assert plan_slurm([ddp], Nodes(1, 2), None, False)[0].placement.nodes == 1   # one node: loopback
    # horovod: a rank a worker (the horovodrun of a local run has none)
    hvd = RunSpec("horovod", "mlp-digits", workers=2, options={"insecure": True})
    assert plan_slurm([hvd], Nodes(2, 2), None, False)[0].placement.roles == ("workers", "workers")
    with pytest.raises(ConfigError, match=r"needs the job's token: --token-file FILE"):
        plan_slurm([RunSpec("ps", "mlp-digits")], Nodes(2, 2), None, False)
    os.chmod(token, 0o644)
    with pytest.raises(ConfigError, match="token"):
        plan_slurm([RunSpec("ps", "mlp-digits")], Nodes(2, 2), token, False)


def test_a_system_psbench_launch_cannot_run_is_refused_at_plan_time_in_one_line(tmp_path, capsys):
    config = tmp_path / "mixed.toml"
    config.write_text('suite = "mixed"\n[matrix]\nsystem = ["ps", "spark-mllib", "single"]\nworkload = "mlp-digits"\n')
    # no sinfo is asked: the refusal comes first, so it holds on a machine without Slurm too
    assert main(["run", "--config", str(config), "--launcher", "slurm", "--results-dir", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("psbench: error: --launcher slurm cannot run system(s) single, spark-mllib (psbench launch runs "
                   "ddp, ps, horovod): drop them from the experiment, or run it without --launcher")
    assert not (tmp_path / "r").exists()


def test_launch_takes_the_run_whole_as_json_and_checks_it_against_the_ranks(monkeypatch, capsys):
    spec = RunSpec("ps", "mlp-digits", workers=3, options={"servers": 1})
    for name, value in {"SLURM_PROCID": "0", "SLURM_NTASKS": "3", "SLURM_LOCALID": "0", "MASTER_ADDR": "127.0.0.1",
                        "MASTER_PORT": "29999"}.items():
        monkeypatch.setenv(name, value)
    assert main(["launch", "--spec", json.dumps(spec.to_dict())]) == 2
    assert capsys.readouterr().err.strip() == ("psbench: error: --spec has 3 worker(s); the engine started 3 rank(s) "
                                               "(1 shard(s) and the workers)")
    assert main(["launch", "--spec", json.dumps(spec.to_dict()), "--system", "ps"]) == 2
    assert "takes --spec JSON or the run's flags" in capsys.readouterr().err
    assert main(["launch", "--spec", "[1]"]) == 2
    assert capsys.readouterr().err.strip() == "psbench: error: --spec is no JSON object of a run's settings"


def test_dry_run_prints_each_jobs_shape_and_node_plan_and_submits_nothing(tmp_path, token, monkeypatch, capsys):
    monkeypatch.setattr(slurm_suite, "read_nodes", lambda: Nodes(2, 2))
    monkeypatch.setattr(slurm_suite, "submit", lambda *a, **k: pytest.fail("submitted"))
    config = tmp_path / "ps.toml"
    config.write_text('suite = "dry"\n[matrix]\nsystem = "ps"\nworkload = "mlp-digits"\nworkers = 3\nseed = [0, 1]\n')
    assert main(["run", "--config", str(config), "--launcher", "slurm", "--dry-run", "--token-file", token,
                 "--results-dir", str(tmp_path / "r")]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 3 and lines[-1] == "2 of 2 run(s) of suite 'dry' to submit (a dry run: nothing submitted)"
    assert all(" to run  --nodes=2 --ntasks=4 --ntasks-per-node=2  2.00 of 2 cores a node: 2 workers x 1.00" in line
               for line in lines[:2]), lines
    assert not (tmp_path / "r").exists()
