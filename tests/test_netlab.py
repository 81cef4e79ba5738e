"""Network lab: namespaces as hosts, bandwidth caps, cleanup, and running psbench inside a host."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from psbench.bench.lab import netlab
from psbench.bench.lab.netlab import NetLab, Role
from psbench.core.errors import ConfigError

REASON = netlab.unavailable_reason()
pytestmark = [pytest.mark.netns, pytest.mark.skipif(REASON is not None, reason=f"netlab: {REASON}")]

PY = sys.executable


def lab_leftovers(lab: int) -> list[str]:
    """Anything of this lab still present: namespaces, and root-namespace links with its prefix."""
    names = [ns for ns in netlab.list_namespaces() if ns.startswith(f"psb-{lab}-")]
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    names += [line.split(":")[1].strip() for line in links.splitlines() if f"psb{lab}-" in line]
    return names


def transfer(lab: NetLab, src: int, dst: int, nbytes: int, port: int) -> dict:
    """Send nbytes over TCP from host src to host dst; the receiver's measurement (JSON)."""
    results = lab.run_cluster([
        Role("sink", dst, [PY, "-m", "psbench.bench.lab.netprobe", "sink", "--bind", f"{{h{dst}}}", "--port", str(port)],
             ready_port=port),
        Role("source", src, [PY, "-m", "psbench.bench.lab.netprobe", "source", "--host", f"{{h{dst}}}", "--port", str(port),
                             "--bytes", str(nbytes)]),
    ], timeout=60)
    for r in results.values():
        assert r.returncode == 0, f"{r.name}: {r.stderr}"
    received = json.loads(results["sink"].stdout)
    assert received["bytes"] == nbytes
    return received


def test_hosts_reach_each_other_and_cap_is_honoured():
    cap = 50.0
    with NetLab(hosts=3, caps_mbit={1: cap}) as lab:
        assert [lab.addr(h) for h in range(3)] == [f"198.18.{lab.lab}.{h + 1}" for h in range(3)]
        # Only the lab's own subnet is routable from a host: no default route, nothing else.
        routes = lab.run(0, ["ip", "-4", "route"]).stdout.strip().splitlines()
        assert routes and all(r.startswith(f"198.18.{lab.lab}.0/24") for r in routes), routes
        for src, dst in [(0, 1), (1, 2), (2, 0)]:   # every host sends and receives
            transfer(lab, src, dst, 100_000, 6100 + src)
        uncapped = transfer(lab, 2, 0, 200_000_000, 6200)["mbit_s"]
        up = transfer(lab, 1, 0, 3_000_000, 6201)["mbit_s"]     # the capped host's uploads
        down = transfer(lab, 0, 1, 3_000_000, 6202)["mbit_s"]   # ... and its downloads
    print(f"\nuncapped {uncapped:.0f} Mbit/s; capped {cap:.0f}: up {up:.1f}, down {down:.1f} Mbit/s; "
          f"capped/uncapped {up / uncapped:.4f}")
    for measured in (up, down):
        assert 0.6 <= measured / cap <= 1.1, f"{measured:.1f} Mbit/s under a {cap} Mbit/s cap"
        assert measured / uncapped < 0.25, "the capped link is not clearly slower than the uncapped one"
    assert lab_leftovers(lab.lab) == []


def test_exception_inside_the_lab_leaves_nothing_behind():
    lab = NetLab(hosts=3, caps_mbit={0: 100})
    with pytest.raises(RuntimeError, match="boom"):
        with lab:
            assert len(lab_leftovers(lab.lab)) == 4  # three hosts and the bridge namespace
            # A process still running inside a host must not keep its namespace alive.
            lab.exec(2, ["sleep", "600"])
            raise RuntimeError("boom")
    assert lab_leftovers(lab.lab) == []
    assert all(not ns.startswith(f"psb-{lab.lab}-") for ns in
               subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split())


def test_cli_up_status_down(capsys):
    from psbench.bench.cli import main

    lab_id = netlab.free_lab_id()
    try:
        assert main(["netlab", "up", "--hosts", "2", "--lab", str(lab_id), "--cap", "h1=20"]) == 0
        assert main(["netlab", "status", "--lab", str(lab_id)]) == 0
        out = capsys.readouterr().out
        assert f"198.18.{lab_id}.2/24" in out and "cap 20Mbit" in out
        assert main(["netlab", "up", "--hosts", "2", "--lab", str(lab_id)]) == 2  # exists already
    finally:
        assert main(["netlab", "down", "--lab", str(lab_id)]) == 0
    assert lab_leftovers(lab_id) == []
    assert main(["netlab", "up", "--hosts", "2", "--cap", "h7=20"]) == 2  # bad host: one-line error
    assert lab_leftovers(lab_id) == []


def test_bad_caps_are_config_errors():
    with pytest.raises(ConfigError, match="hosts are 0..2"):
        NetLab(hosts=3, caps_mbit={3: 10})
    with pytest.raises(ConfigError, match="> 0"):
        NetLab(hosts=3, caps_mbit={0: 0})


def test_run_cluster_runs_psbench_inside_a_host(tmp_path: Path):
    """The mechanism the cross-host PS/DDP tests use: roles on hosts, a daemon waited for and stopped,
    and a real `psbench run` inside a namespace writing its results."""
    results_dir = tmp_path / "results"
    listener = ("import socket, time; s = socket.socket(); s.bind(('{h0}', 7000)); s.listen(); "
                "print('listening', flush=True); time.sleep(600)")
    with NetLab(hosts=3) as lab:
        out = lab.run_cluster([
            Role("server", 0, [PY, "-c", listener], daemon=True, ready_port=7000),
            Role("client", 2, [PY, "-c", "import socket; socket.create_connection(('{h0}', 7000), 5); print('ok')"]),
            Role("trainer", 1, [PY, "-m", "psbench", "run", "--system", "single", "--workload", "logreg-digits",
                                "--max-steps", "30", "--results-dir", str(results_dir), "--suite", "netlab",
                                "--no-progress"]),
        ], timeout=120)
        lab_id = lab.lab
    assert out["client"].returncode == 0 and out["client"].stdout.strip() == "ok"
    assert out["server"].returncode is None and "listening" in out["server"].stdout  # stopped by the launcher
    assert out["trainer"].returncode == 0, out["trainer"].stderr
    manifests = list((results_dir / "netlab").glob("*/manifest.json"))
    assert len(manifests) == 1
    summary = json.loads(manifests[0].read_text())["summary"]
    assert summary["steps"] == 30 and summary["samples_per_s"] > 0
    assert lab_leftovers(lab_id) == []
