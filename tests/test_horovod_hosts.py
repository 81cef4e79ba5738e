"""Horovod across hosts: `horovodrun -H a:1,b:1` from one namespace host to two others over ssh (sshd
in each, bound to its 198.18 address, a key made for the test); each host has its own job folder,
and the ranks' records come back by scp into one run folder."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from psbench.bench.lab import netlab, sshlab
from psbench.bench.lab.netlab import NetLab
from psbench.bench.lab.sshlab import SshLab
from psbench.core.tables import read_table
from psbench.systems.horovod.adapter import HorovodSystem

REASON = netlab.unavailable_reason() or sshlab.unavailable_reason() or HorovodSystem.unavailable_reason()
# slow: sshd hosts in namespaces and horovodrun, ~12 s: `make test-slow` (CI runs it)
pytestmark = [pytest.mark.slow, pytest.mark.netns, pytest.mark.horovod,
              pytest.mark.skipif(REASON is not None, reason=f"horovod across hosts: {REASON}")]


def horovod_argv(lab: NetLab, config: Path, results: Path, steps: int, insecure: bool = True) -> list[str]:
    return [sys.executable, "-m", "psbench", "run", "--system", "horovod", "-np", "2", "--workload", "mlp-digits",
            "--max-steps", str(steps), "--emulate-device", "step_ms=20",
            "--hosts", f"{lab.addr(1)}:1,{lab.addr(2)}:1", "--ssh-config", str(config), "--network-interface", "veth0",
            *(["--insecure", "true"] if insecure else []), "--timeout-s", "240",
            "--results-dir", str(results), "--suite", "hvd-hosts", "--no-progress", "--no-resume"]


def test_horovodrun_across_two_sshd_hosts_collects_one_run_folder(tmp_path: Path):
    results = tmp_path / "results"
    before = set(Path("/tmp").glob("psbench-horovod-*-hosts"))
    with NetLab(hosts=3) as lab, SshLab(lab, hosts=[1, 2]) as ssh:
        refused = lab.run(0, horovod_argv(lab, ssh.kit.config, results, 30, insecure=False), timeout=60)
        assert refused.returncode == 2 and "insecure=true" in refused.stderr, refused.stderr[-1000:]
        run = lab.run(0, horovod_argv(lab, ssh.kit.config, results, 30), timeout=300)
        assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
        leftovers = [p for h in (1, 2) for p in netlab.namespace_pids(lab.ns(h))
                     if "horovod.worker" in Path(f"/proc/{p}/cmdline").read_text(errors="replace")]
        assert leftovers == []
        assert set(Path("/tmp").glob("psbench-horovod-*-hosts")) == before   # every host's job folder removed
    assert not Path(f"/etc/netns/{lab.ns(1)}").exists()                  # the hosts' /etc/hosts too
    (run_dir,) = [p.parent for p in (results / "hvd-hosts").glob("*/manifest.json")]
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["extra"]["horovod_hosts"] == {"hosts": f"{lab.addr(1)}:1,{lab.addr(2)}:1", "auth": "insecure"}
    steps = read_table(run_dir, "steps")
    assert steps.groupby("worker")["step"].count().to_dict() == {0: 30, 1: 30}
    val = read_table(run_dir, "evals").query("split == 'val'")["accuracy"].tolist()
    assert val[-1] > val[0] + 0.3
