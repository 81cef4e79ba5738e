"""--device cpu|cuda|auto: parsed from the command line and experiment files, resolved at plan time and
recorded, refused in one line where it cannot run; `psbench gpu-check` without CUDA. The CUDA paths
themselves run where torch sees a GPU (the last test, and `make gpu-check`)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from psbench import systems
from psbench.bench import cli
from psbench.bench.gpu_check import NO_CUDA_EXIT
from psbench.bench.harness.matrix import load_experiment
from psbench.bench.harness.runner import plan, planned_device
from psbench.core.accelerator import timed_copy
from psbench.core.errors import ConfigError
from psbench.core.spec import RunSpec

HAS_CUDA = torch.cuda.is_available()
# A run id of a cpu spec as the code before --device named it: a cpu run keeps its hash (and so its results).
CPU_RUN_ID = "single-mlp-digits-w1-s0-3e078cc6c0"


def _plan(spec: RunSpec):
    return plan(spec, allow_oversubscribe=True, calibrator=lambda *_: None)


def test_the_flag_and_the_file_key_parse(tmp_path: Path) -> None:
    parser = cli.build_parser("run")
    args = parser.parse_args(["run", "--system", "single", "--workload", "mlp-digits", "--device", "auto"])
    assert cli._spec_from_args(args, "mlp-digits", 1, "psbench run").device == "auto"
    default = parser.parse_args(["run", "--system", "single", "--workload", "mlp-digits"])
    assert cli._spec_from_args(default, "mlp-digits", 1, "psbench run").device == "cpu"
    config = tmp_path / "e.toml"
    config.write_text('suite = "d"\n[matrix]\nsystem = ["single"]\nworkload = ["mlp-digits"]\n'
                      'device = ["cpu", "auto"]\n')
    assert [s.device for s in load_experiment(config).specs] == ["cpu", "auto"]
    config.write_text('suite = "d"\n[matrix]\nsystem = ["single"]\nworkload = ["mlp-digits"]\n'
                      '[settings]\ndevice = "tpu"\n')
    with pytest.raises(ConfigError, match="device must be cpu, cuda, auto, got 'tpu'"):
        load_experiment(config)


def test_cpu_keeps_its_hash_and_cuda_has_its_own() -> None:
    assert RunSpec("single", "mlp-digits", max_steps=30).run_id == CPU_RUN_ID
    assert RunSpec("single", "mlp-digits", max_steps=30, device="cuda").run_id != CPU_RUN_ID


@pytest.mark.skipif(HAS_CUDA, reason="auto resolves to cuda where torch sees a GPU")
def test_auto_is_planned_as_cpu_here_and_the_plan_says_so() -> None:
    """(The manifest's record of it: tests/test_harness.py's records test, run with --device auto.)"""
    planned = _plan(RunSpec("single", "mlp-digits", max_steps=3, epochs=1, device="auto"))
    assert planned.spec.device == "cpu" and planned.conditions["device_requested"] == "auto"
    assert planned.spec.run_id == RunSpec("single", "mlp-digits", max_steps=3, epochs=1).run_id  # the same run
    assert "device_requested" not in _plan(RunSpec("single", "mlp-digits", max_steps=3, epochs=1)).conditions


@pytest.mark.skipif(HAS_CUDA, reason="a CUDA device is here: cuda is not refused")
@pytest.mark.parametrize("system", systems.names())
def test_cuda_is_one_line_before_anything_starts(system: str) -> None:
    with pytest.raises(ConfigError, match=r"^--device cuda: ") as refused:
        _plan(RunSpec(system, "mlp-digits", workers=2 if system != "single" else 1, device="cuda"))
    assert "\n" not in str(refused.value)
    gpu_path = "cuda" in systems.get_system(system).devices
    assert ("no CUDA device" in str(refused.value) or "without CUDA" in str(refused.value)) == gpu_path
    assert ("runs on cpu only" in str(refused.value)) == (not gpu_path)


@pytest.mark.skipif(HAS_CUDA, reason="a CUDA device is here: cuda is not refused")
def test_the_command_line_exits_2_with_one_line(capsys) -> None:
    code = cli.main(["run", "--system", "ddp", "--workload", "mlp-digits", "-np", "2", "--device", "cuda",
                     "--results-dir", "/nonexistent/never-written"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "allowed here: cpu, auto" in err, err


@pytest.mark.skipif(HAS_CUDA, reason="a CUDA device is here: cuda is not refused")
def test_a_launched_rank_refuses_cuda_before_its_rendezvous(monkeypatch, capsys) -> None:
    for key, value in {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": "9"}.items():  # port 9: nothing listens; the refusal comes first
        monkeypatch.setenv(key, value)
    assert cli.main(["launch", "--system", "ps", "--workload", "mlp-digits", "--device", "cuda"]) == 2
    assert capsys.readouterr().err.startswith("psbench: error: --device cuda: ")


@pytest.fixture
def cuda_seen_but_never_used(monkeypatch):
    """torch says CUDA is there; anything that would really use it fails the test."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)

    def used(*_a, **_k):
        raise AssertionError("CUDA was used")

    for name in ("_lazy_init", "get_device_name", "set_device", "synchronize", "device_count"):
        monkeypatch.setattr(torch.cuda, name, used)


def test_a_system_without_a_gpu_path_refuses_cuda_where_cuda_exists(cuda_seen_but_never_used) -> None:
    no_gpu = [n for n in systems.names() if "cuda" not in systems.get_system(n).devices]
    assert {"spark-mllib", "spark-barrier", "spark-mllib-native", "rpc-ps", "ray-ps", "horovod"} <= set(no_gpu)
    for name in no_gpu:
        cls = systems.get_system(name)
        with pytest.raises(ConfigError, match=rf"^--device cuda: system '{name}' runs on cpu only \(.+\); "
                                              r"allowed: --device cpu or auto$"):
            _plan(RunSpec(name, "mlp-digits", workers=2, device="cuda"))
        assert planned_device(RunSpec(name, "mlp-digits", device="auto"), cls, emulated=False) == "cpu"
    assert "CUDA build of Horovod" in systems.get_system("horovod").no_cuda_reason


def test_auto_takes_cuda_where_it_is_and_the_emulated_device_is_refused_with_it(cuda_seen_but_never_used) -> None:
    single = systems.get_system("single")
    assert planned_device(RunSpec("single", "mlp-digits", device="auto"), single, emulated=False) == "cuda"
    assert planned_device(RunSpec("single", "mlp-digits", device="cuda"), single, emulated=False) == "cuda"
    assert planned_device(RunSpec("single", "mlp-digits", device="auto"), single, emulated=True) == "cpu"
    with pytest.raises(ConfigError, match=r"^--emulate-device with --device cuda: refused"):
        _plan(RunSpec("ps", "mlp-digits", workers=2, device="cuda", emulate_device="step_ms=20"))


def test_a_cluster_file_keeps_to_cpu() -> None:
    from psbench.bench.lab.cluster.file import parse

    run = {"system": "ps", "workload": "mlp-digits", "device": "auto"}
    with pytest.raises(ConfigError, match=r"\[run\] device 'auto': a cluster file's roles run on cpu; allowed: cpu"):
        parse({"run": run, "hosts": [{"roles": ["ps-server", "worker"]}]})


def test_a_copy_is_timed_and_none_is_made_on_one_tensor() -> None:
    host, other = torch.arange(4.0), torch.zeros(4)
    assert timed_copy(host, host, torch.device("cpu")) == 0.0
    assert timed_copy(other, host, torch.device("cpu")) > 0.0 and torch.equal(other, host)


@pytest.mark.skipif(HAS_CUDA, reason="a CUDA device is here: gpu-check runs (make gpu-check)")
def test_gpu_check_without_cuda_says_so_and_exits_3(capsys) -> None:
    assert cli.main(["gpu-check"]) == NO_CUDA_EXIT == 3
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("psbench gpu-check: no CUDA device (") and "nothing ran" in err


@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device here: the GPU paths run where one is (make gpu-check)")
def test_the_gpu_paths_train_on_cuda(capsys) -> None:
    assert cli.main(["gpu-check", "--steps", "20", "--batch-size", "32"]) == 0
    table = capsys.readouterr().out
    assert all(f"| {name} |" in table for name in ("single", "ddp", "ps")), table


@pytest.mark.parametrize("copied", [0.0, 0.1])
def test_the_report_shows_host_gpu_copies_only_where_a_run_copied(tmp_path: Path, copied: float) -> None:
    from psbench.bench.harness.results import load_suite
    from psbench.bench.report.tables import breakdown_table
    from report_fixtures import fake_run

    parts = {"compute_s": 0.5, "comm_s": 0.4 - copied, "update_s": 0.1, "h2d_d2h_s": copied}
    fake_run(tmp_path, "s", RunSpec("ps", "mlp-digits", workers=2), step_s=0.01, parts=parts)
    table = breakdown_table(load_suite(tmp_path / "s"))
    assert ("host-GPU copies (ms)" in table) == (copied > 0)
    if copied:
        assert table["host-GPU copies (ms)"].iloc[0] == pytest.approx(copied * 10, rel=0.05)
