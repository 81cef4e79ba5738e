"""Horovod's own synthetic benchmark beside psbench (psbench/bench/regress/horovod_script.py): the
script is vendored unchanged, its shim serves psbench's ResNets as `torchvision.models`, both sides'
images/s come from one rule. (The side-by-side check itself is docs/workloads.md's: too noisy at a
test's size to show 10 % equivalence.)"""
from __future__ import annotations

import hashlib
import importlib.util
import re

import pandas as pd
import pytest

from psbench.bench.regress import horovod_script as hs
from psbench.core.errors import ConfigError


def test_the_vendored_script_is_horovods_file_unchanged() -> None:
    readme = (hs.SCRIPT.parent / "README.md").read_text()
    recorded = re.search(r"sha256 ([0-9a-f]{64})", readme).group(1)
    assert hashlib.sha256(hs.SCRIPT.read_bytes()).hexdigest() == recorded
    assert "Apache License" in (hs.SCRIPT.parent / "LICENSE").read_text()
    assert "data = torch.randn(args.batch_size, 3, 224, 224)" in hs.SCRIPT.read_text()


def test_the_shim_serves_psbenchs_resnets_as_torchvisions() -> None:
    spec = importlib.util.spec_from_file_location("shim_models", hs.SHIM / "torchvision" / "models.py")
    models = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(models)
    assert sum(p.numel() for p in models.resnet18().parameters()) == 11_689_512
    env = hs.script_env()
    assert env["PYTHONPATH"].split(":")[0] == str(hs.SHIM) and env["OMP_NUM_THREADS"] == "1"
    command = hs.script_command(hs.Setting(batch_size=4, iters=3))
    assert command[command.index("-np") + 1] == "2" and str(hs.SCRIPT) in command
    assert command[-11:] == ["--model", "resnet18", "--batch-size", "4", "--num-warmup-batches", "10",
                             "--num-batches-per-iter", "10", "--num-iters", "3", "--no-cuda"]


def test_the_scripts_iteration_lines_are_read_from_rank_0_as_horovodrun_forwards_them() -> None:
    out = ("[0]<stdout>:Model: resnet18\n[0]<stdout>:Iter #0: 12.5 img/sec per CPU\n"
           "[1]<stderr>:noise\n[0]<stdout>:Iter #1: 11.0 img/sec per CPU\n"
           "[0]<stdout>:Img/sec per CPU: 11.8 +-1.5\n")
    assert hs.parse_iterations(out, hs.Setting(iters=2)) == [12.5, 11.0]
    with pytest.raises(ConfigError, match="printed 2 of 3 iteration lines"):
        hs.parse_iterations(out, hs.Setting(iters=3))


def test_psbench_records_are_read_by_the_scripts_rule() -> None:
    """Warm-up steps left out, then iterations of batches_per_iter steps, each its images over the
    time from the end of the step before it, rounded as the script prints; rank 0 only."""
    setting = hs.Setting(batch_size=4, warmup_batches=2, batches_per_iter=2, iters=2)
    ends = [5.0, 6.0, 7.0, 8.0, 8.5, 9.0]  # warm-up ends at 6.0; iterations 6 -> 8 and 8 -> 9
    rows = [{"worker": w, "step": i, "t_wall": t * (1 + w), "n_samples": 4} for w in (0, 1) for i, t in enumerate(ends)]
    assert hs.iteration_rates(pd.DataFrame(rows), setting) == [4.0, 8.0]
    with pytest.raises(ConfigError, match="recorded 6 steps, the setting times 7"):
        hs.iteration_rates(pd.DataFrame(rows), hs.Setting(batch_size=4, warmup_batches=3, batches_per_iter=2, iters=2))
    spec = hs.psbench_spec("ddp", setting)
    assert (spec.workload, spec.batch_size, spec.max_steps, spec.workers) == ("horovod-synthetic", 4, 6, 2)


def test_a_wrong_setting_is_one_line() -> None:
    with pytest.raises(ConfigError, match="model 'vgg16': allowed resnet18, resnet50"):
        hs.Setting(model="vgg16")
    with pytest.raises(ConfigError, match="iters must be >= 1"):
        hs.Setting(iters=0)
