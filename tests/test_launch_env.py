"""psbench launch, fast: ranks and rendezvous from torchrun's, Slurm's and Open MPI's variables,
ranks to roles, the store's clock offsets and file hand-over, Horovod's slots and environment
without horovodrun, and the CLI's one-line refusals."""
from __future__ import annotations

import json
import threading
from datetime import timedelta

import pytest

from psbench.bench.cli import main
from psbench.bench.lab.launch import run as launch_run
from psbench.bench.lab.launch.env import LaunchEnv, Role, first_host, read_env, role_of, workers_of
from psbench.bench.lab.launch.rendezvous import (Offset, clock_record, estimate_offset, measure_offsets,
                                                 receive_files, send_files)
from psbench.bench.lab.launch.horovod import check_hostnames, rank_env, slot_plan
from psbench.bench.lab.launch.run import agree_on_run
from psbench.core.errors import ConfigError
from psbench.core.spec import RunSpec
from psbench.systems.horovod.adapter import HorovodSystem

TORCHRUN = {"RANK": "1", "WORLD_SIZE": "3", "LOCAL_RANK": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500",
            "TORCHELASTIC_USE_AGENT_STORE": "True"}
SLURM = {"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_NODELIST": "node[03-06],gpu1",
         "SLURM_JOB_ID": "4242"}
MPI = {"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "0",
       "MASTER_ADDR": "198.18.1.1", "MASTER_PORT": "6000"}


def test_each_engine_read_and_torchrun_first():
    assert read_env(TORCHRUN) == LaunchEnv("torchrun", 1, 3, 1, "127.0.0.1", 29500, agent_store=True)
    assert read_env(SLURM) == LaunchEnv("slurm", 5, 8, 1, "node03", 24242)
    assert read_env({**SLURM, "MASTER_ADDR": "10.0.0.9", "MASTER_PORT": "7000"}).master_addr == "10.0.0.9"
    assert read_env(MPI) == LaunchEnv("mpi", 2, 4, 0, "198.18.1.1", 6000)
    # torchrun inside an srun step: torchrun's variables win, unless --env names Slurm's
    both = {**SLURM, **TORCHRUN}
    assert read_env(both).engine == "torchrun"
    assert read_env(both, "slurm").rank == 5


@pytest.mark.parametrize("nodelist, first", [("node[03-06],gpu1", "node03"), ("a1", "a1"), ("gpu5,node[1-2]", "gpu5"),
                                              ("rack[2-3]-n[07,09]", "rack2-n07"), ("n[1,4-5]", "n1")])
def test_first_host_of_a_slurm_node_list(nodelist, first):
    assert first_host(nodelist) == first


@pytest.mark.parametrize("environ, engine, named", [
    ({}, None, r"no launcher environment: set RANK, WORLD_SIZE.*SLURM_PROCID.*OMPI_COMM_WORLD_RANK"),
    ({k: v for k, v in TORCHRUN.items() if k != "MASTER_PORT"}, None, r"torchrun environment incomplete: MASTER_PORT unset"),
    ({**TORCHRUN, "RANK": "3"}, None, r"RANK=3 must be in 0..WORLD_SIZE-1 \(WORLD_SIZE=3\)"),
    ({**TORCHRUN, "WORLD_SIZE": "two"}, None, r"WORLD_SIZE='two' must be integers"),
    ({**TORCHRUN, "MASTER_PORT": "70000"}, None, r"MASTER_PORT='70000' must be a port"),
    ({**MPI, "OMPI_COMM_WORLD_LOCAL_RANK": "3"}, None, r"OMPI_COMM_WORLD_LOCAL_RANK=3 must be in 0..OMPI_COMM_WORLD_RANK"),
    ({k: v for k, v in MPI.items() if not k.startswith("MASTER")}, None, r"mpi environment incomplete: MASTER_ADDR, MASTER_PORT unset"),
    ({k: v for k, v in SLURM.items() if k not in ("SLURM_NODELIST", "SLURM_JOB_ID")}, None,
     r"slurm environment incomplete: SLURM_NODELIST \(or MASTER_ADDR\), SLURM_JOB_ID \(or MASTER_PORT\) unset"),
    (TORCHRUN, "slurm", r"slurm environment incomplete: SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID"),
])
def test_a_missing_or_inconsistent_environment_names_its_variables(environ, engine, named):
    with pytest.raises(ConfigError, match=named):
        read_env(environ, engine)


def test_roles_ddp_every_rank_ps_first_ranks_shards():
    assert [role_of("ddp", r, 3) for r in range(3)] == [Role("worker", 0), Role("worker", 1), Role("worker", 2)]
    assert [role_of("horovod", r, 3, servers=2) for r in range(3)] == [role_of("ddp", r, 3) for r in range(3)]
    assert workers_of("horovod", 3, 2) == 3
    assert [role_of("ps", r, 5, servers=2) for r in range(5)] == [
        Role("shard", 0), Role("shard", 1), Role("worker", 0), Role("worker", 1), Role("worker", 2)]
    assert workers_of("ps", 5, 2) == 3 and workers_of("ddp", 5, 2) == 5
    with pytest.raises(ConfigError, match="ps with --servers 2 needs at least 3 ranks"):
        role_of("ps", 0, 2, servers=2)


def test_offset_from_the_shortest_round_trip_and_the_bound():
    # (sent, rank 0's time, received): the second is the shortest; rank 0 is 0.2 s ahead
    est = estimate_offset([(10.0, 10.4, 10.3), (11.0, 11.21, 11.02), (12.0, 12.3, 12.2)])
    assert est.offset_s == pytest.approx(0.2) and est.rtt_s == pytest.approx(0.02)
    within = clock_record({0: Offset(0.0, 0.0), 1: Offset(-0.01, 0.001)})
    beyond = clock_record({0: Offset(0.0, 0.0), 1: Offset(0.01, 0.001), 2: Offset(-0.2, 0.002)})
    assert within["within_bound"] and within["max_abs_offset_s"] == 0.01
    assert not beyond["within_bound"] and beyond["max_abs_offset_s"] == 0.2


def _store_pair():
    import torch.distributed as dist

    server = dist.TCPStore("127.0.0.1", 0, 2, is_master=True, timeout=timedelta(seconds=20), wait_for_workers=False)
    client = dist.TCPStore("127.0.0.1", server.port, 2, is_master=False, timeout=timedelta(seconds=20))
    return server, client


def test_offsets_and_files_through_a_store(tmp_path):
    server, client = _store_pair()
    got: dict = {}
    other = threading.Thread(target=lambda: got.update(rank1=measure_offsets(client, 1, 2)))
    other.start()
    offsets = measure_offsets(server, 0, 2)
    other.join()
    assert got["rank1"] == {} and set(offsets) == {0, 1}
    assert abs(offsets[1].offset_s) <= offsets[1].rtt_s   # one clock: zero within the round trip
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "rank1.steps.csv").write_text("worker,step\n1,0\n")
    send_files(client, 1, tmp_path / "a", ["rank1.steps.csv", "rank1.error.json"])   # the second: none written
    receive_files(server, [1], tmp_path / "b", lambda r: rf"rank{r}\.(?:steps\.csv|error\.json)")
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == ["rank1.steps.csv"]
    assert (tmp_path / "b" / "rank1.steps.csv").read_text() == "worker,step\n1,0\n"
    client.set("files/2/rank1.meta.json", b"{}")   # a rank sending another's file is refused
    client.set("files/2", '["rank1.meta.json"]')
    with pytest.raises(RuntimeError, match="rank 2 sent a file named 'rank1.meta.json'"):
        receive_files(server, [2], tmp_path / "b", lambda r: rf"rank{r}\.meta\.json")


def test_ranks_given_other_settings_fail_in_one_line_and_a_token_files_path_is_not_the_run(tmp_path):
    """The token file's path is where a secret lies, not the run: ranks handed it at other paths are one run.
    Other settings are another run: both sides say which, instead of waiting under other run ids."""
    import torch.distributed as dist

    spec = RunSpec("ps", "mlp-digits", workers=2, options={"token_file": "/a/token", "lr": 0.1})
    assert spec.run_id == RunSpec("ps", "mlp-digits", workers=2, options={"token_file": "/b/token", "lr": 0.1}).run_id
    other = RunSpec("ps", "mlp-digits", workers=2, seed=3, options={"token_file": "/b/token", "lr": 0.2})
    assert other.run_id != spec.run_id
    same = dist.HashStore()
    same.set("psbench-launch/settings/1", json.dumps(spec.hashed_settings(), default=str))
    agree_on_run(same, spec, 0, 2)          # rank 1 showed the same run
    agree_on_run(same, spec, 1, 2)
    for rank, mine, theirs in ((0, spec, other), (1, other, spec)):
        store = dist.HashStore()
        store.set(f"psbench-launch/settings/{1 - rank}", json.dumps(theirs.hashed_settings(), default=str))
        with pytest.raises(ConfigError, match=r"\(options\.lr, seed differ\): every rank of a launched job"):
            agree_on_run(store, mine, rank, 2)


@pytest.mark.parametrize("argv, said", [
    ([], "no launcher environment"),
    (["-np", "4"], "psbench launch does not take --workers"),
    (["--master-port", "5"], "psbench launch does not take --master-port"),
    (["--config", "x.toml"], "psbench launch does not take --config"),
    (["--hosts", "a:2,b:2"], "psbench launch does not take --hosts"),
])
def test_cli_refuses_in_one_line(argv, said, monkeypatch, capsys, tmp_path):
    for name in ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK"):
        monkeypatch.delenv(name, raising=False)
    code = main(["launch", "--system", "ddp", "--workload", "mlp-digits", "--results-dir", str(tmp_path), *argv])
    err = capsys.readouterr().err
    assert code == 2 and said in err and len(err.strip().splitlines()) == 1
    assert not any(tmp_path.iterdir())


def test_ps_without_the_jobs_token_is_refused_before_any_rendezvous(monkeypatch, capsys, tmp_path):
    for name, value in {**TORCHRUN, "RANK": "0", "LOCAL_RANK": "0", "MASTER_PORT": "1"}.items():   # port 1: nothing to reach
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("PSBENCH_PS_TOKEN", raising=False)
    code = main(["launch", "--system", "ps", "--workload", "mlp-digits", "--results-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and "needs the job's token" in err and len(err.strip().splitlines()) == 1
    assert not any(tmp_path.iterdir())


HOROVOD = HorovodSystem.unavailable_reason()


@pytest.mark.skipif(HOROVOD is not None, reason=f"{HOROVOD}")
def test_horovod_slots_as_horovodrun_assigns_them_and_when_ranks_interleave():
    from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts

    placed = ["a", "a", "b", "b", "c"]   # host by host, as torchrun and Slurm's block distribution place them
    assert slot_plan(placed) == get_host_assignments(parse_hosts("a:2,b:2,c:1"), 5)
    plan = slot_plan(["a", "b", "a", "b", "a"])   # Slurm's cyclic distribution
    assert [(s.local_rank, s.local_size, s.cross_rank, s.cross_size) for s in plan] == [
        (0, 3, 0, 2), (0, 2, 1, 2), (1, 3, 0, 2), (1, 2, 1, 2), (2, 3, 0, 1)]
    env = rank_env(plan[3], "198.18.0.1", 4321, "veth0")
    assert env["HOROVOD_RANK"] == "3" and env["HOROVOD_SIZE"] == "5" and env["HOROVOD_HOSTNAME"] == "b"
    assert env["HOROVOD_LOCAL_RANK"] == "1" and env["HOROVOD_CROSS_RANK"] == "1"
    assert (env["HOROVOD_GLOO_RENDEZVOUS_ADDR"], env["HOROVOD_GLOO_RENDEZVOUS_PORT"]) == ("198.18.0.1", "4321")
    assert env["HOROVOD_CONTROLLER"] == env["HOROVOD_CPU_OPERATIONS"] == "gloo" and env["HOROVOD_GLOO_IFACE"] == "veth0"


@pytest.mark.skipif(HOROVOD is not None, reason=f"{HOROVOD}")
def test_horovod_beyond_loopback_without_insecure_is_refused_before_any_rendezvous(monkeypatch, capsys, tmp_path):
    for name, value in {**TORCHRUN, "RANK": "0", "LOCAL_RANK": "0", "MASTER_PORT": "1"}.items():   # port 1: nothing to reach
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(launch_run, "host_facing", lambda master_addr: "198.18.0.1")   # a host facing others
    code = main(["launch", "--system", "horovod", "--workload", "mlp-digits", "--results-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and "198.18.0.1" in err and "--insecure true" in err and len(err.strip().splitlines()) == 1
    assert not any(tmp_path.iterdir())


def test_horovod_across_hosts_needs_hostnames_beyond_loopback():
    check_hostnames(["127.0.0.1", "127.0.0.1"], ["127.0.1.1", "127.0.1.1"])   # one host: loopback is right
    check_hostnames(["198.18.0.1", "198.18.0.2"], ["198.18.0.1", "198.18.0.2"])
    with pytest.raises(ConfigError, match=r"hostname of host 198\.18\.0\.2 resolves to 127\.0\.1\.1;.*map the "
                                          r"hostname to 198\.18\.0\.2 in that host's /etc/hosts"):
        check_hostnames(["198.18.0.1", "198.18.0.2"], ["198.18.0.1", "127.0.1.1"])
