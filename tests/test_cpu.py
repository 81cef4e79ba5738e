"""psbench.core.cpu: the usable cores (affinity, cgroup v1/v2 quotas, PSBENCH_CORES) and the
process-tree sampler that measures what a run's processes used, children that exited included."""
from __future__ import annotations

import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from psbench.core.cpu import (CORES_ENV, LAUNCHER, Proc, TreeSampler, active_spans, cgroup_quota, classifier,
                              measured_cores, usable_cores)
from psbench.core.errors import ConfigError


def _cgroup_fs(tmp_path: Path, version: int, files: dict[str, str], self_path: str = "/psbench.slice/job",
               mount_root: str = "/") -> tuple[Path, Path]:
    """A fake /proc/self/mountinfo and /proc/self/cgroup over a cgroup tree under tmp_path."""
    mount = tmp_path / "cgroup"
    for rel, text in files.items():
        (mount / rel).parent.mkdir(parents=True, exist_ok=True)
        (mount / rel).write_text(text)
    if version == 2:
        mountinfo = f"30 23 0:26 {mount_root} {mount} rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
        cgroup = f"0::{self_path}\n"
    else:
        mountinfo = f"32 31 0:29 {mount_root} {mount} rw,nosuid - cgroup cgroup rw,cpu,cpuacct\n"
        cgroup = f"5:memory:{self_path}\n3:cpu,cpuacct:{self_path}\n"
    (tmp_path / "mountinfo").write_text("25 1 8:1 / / rw - ext4 /dev/sda1 rw\n" + mountinfo)
    (tmp_path / "cgroup.txt").write_text(cgroup)
    return tmp_path / "mountinfo", tmp_path / "cgroup.txt"


def test_cgroup_v2_quota_is_the_tightest_along_the_path(tmp_path):
    files = {"psbench.slice/cpu.max": "100000 100000\n", "psbench.slice/job/cpu.max": "150000 100000\n"}
    assert cgroup_quota(*_cgroup_fs(tmp_path, 2, files)) == 1.0   # the parent's 1 CPU caps the child's 1.5
    files = {"psbench.slice/cpu.max": "max 100000\n", "psbench.slice/job/cpu.max": "250000 100000\n"}
    assert cgroup_quota(*_cgroup_fs(tmp_path / "b", 2, files)) == 2.5


def test_cgroup_v2_without_a_limit_is_none(tmp_path):
    assert cgroup_quota(*_cgroup_fs(tmp_path, 2, {"psbench.slice/job/cpu.max": "max 100000\n"})) is None
    assert cgroup_quota(tmp_path / "absent", tmp_path / "absent") is None   # no cgroup fs at all


def test_cgroup_v1_cfs_quota(tmp_path):
    files = {"psbench.slice/job/cpu.cfs_quota_us": "50000\n", "psbench.slice/job/cpu.cfs_period_us": "100000\n"}
    assert cgroup_quota(*_cgroup_fs(tmp_path, 1, files)) == 0.5
    unlimited = {"psbench.slice/job/cpu.cfs_quota_us": "-1\n", "psbench.slice/job/cpu.cfs_period_us": "100000\n"}
    assert cgroup_quota(*_cgroup_fs(tmp_path / "b", 1, unlimited)) is None


def test_cgroup_in_a_container_reads_the_mounts_own_root(tmp_path):
    """docker --cpus=1.5: the container sees its cgroup mounted at the fs root, /proc/self/cgroup
    naming the host's path (or '/')."""
    files = {"cpu.max": "150000 100000\n"}
    assert cgroup_quota(*_cgroup_fs(tmp_path, 2, files, self_path="/docker/abc", mount_root="/docker/abc")) == 1.5
    assert cgroup_quota(*_cgroup_fs(tmp_path / "b", 2, files, self_path="/")) == 1.5


def test_usable_cores_injected_and_bad_values(monkeypatch):
    monkeypatch.setenv(CORES_ENV, "64")
    cores = usable_cores()
    assert cores.count == 64 and cores.source == CORES_ENV
    monkeypatch.setenv(CORES_ENV, "1.5")
    assert usable_cores().count == 1.5
    for bad in ("0", "-2", "two"):
        monkeypatch.setenv(CORES_ENV, bad)
        with pytest.raises(ConfigError, match=rf"{CORES_ENV}='{bad}': expected a number of cores > 0"):
            usable_cores()
    monkeypatch.delenv(CORES_ENV)
    real = usable_cores()
    assert 0 < real.count <= real.affinity <= (os.cpu_count() or 1)


def test_classifier_takes_the_first_matching_role():
    role_of = classifier([Proc("horovodrun", 1, r"horovod\.run"), Proc("workers", 2, r"horovod\.worker"), Proc(LAUNCHER, 1)])
    assert role_of("python -m psbench.systems.horovod.run -np 2 python -m psbench.systems.horovod.worker") == "horovodrun"
    assert role_of("python -m psbench.systems.horovod.worker --job x") == "workers"
    assert role_of("java -cp x") == LAUNCHER


BURN = "import time, sys\nend = time.process_time() + float(sys.argv[1])\nwhile time.process_time() < end: pass\n" \
       "print(time.process_time())\n"


def _own_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def test_sampler_counts_a_child_that_exited_under_its_role():
    """A child burns ~0.6 s of CPU and exits (reaped) inside the span: the sampler counts its CPU
    under its role (the ratio to what the child itself reports), and the launcher's is this
    process's own (the sampling), none of the child's."""
    with TreeSampler(classifier([Proc("burner", 1, r"psbench-burn")]), interval_s=0.05) as sampler:
        t0, own0 = time.time(), _own_cpu_s()
        out = subprocess.run([sys.executable, "-c", BURN, "0.6", "psbench-burn"], capture_output=True, text=True,
                             check=True)
        time.sleep(0.2)  # a sample or two after the child is gone
        t1, own = time.time(), _own_cpu_s() - own0
    burned = float(out.stdout)
    cpu = sampler.cpu_between([(t0, t1)])
    # The sampler's stated resolution: what the child burns after its last sample goes to its reaper
    # (this process), at most one sampling gap of one core; the gap is the one measured (a loaded
    # machine stretches the 50 ms), plus two clock ticks of /proc's 10 ms figures.
    times = [t for t, _ in sampler.samples if t0 <= t <= t1]
    resolution = max(np.diff(times)) + 0.02
    misplaced = cpu.get(LAUNCHER, 0.0) - own
    assert burned - resolution <= cpu["burner"] <= 1.1 * burned, (cpu, burned, resolution)
    assert misplaced <= resolution, (cpu, own, resolution)
    assert measured_cores(cpu, t1 - t0)["total"] == pytest.approx(sum(cpu.values()) / (t1 - t0), abs=1e-3)


def test_active_spans_leave_out_the_pauses():
    assert active_spans(0.0, 10.0, [(2.0, 3.0), (9.5, 12.0), (-1.0, 0.5)]) == [(0.5, 2.0), (3.0, 9.5)]
    assert active_spans(0.0, 1.0, []) == [(0.0, 1.0)]


def test_a_process_left_by_an_earlier_run_is_not_this_runs():
    """A child already running when sampling starts, claimed by no role (pyspark's gateway JVM after
    a Spark run), is left out, burning or reaped; one the run claims counts."""
    # burns long against the sampling interval: what a process burns after its last sample goes to its
    # reaper (the sampler's stated resolution, one interval), a few % of 1.2 s (10% of 0.3 s, loaded)
    leftover = subprocess.Popen([sys.executable, "-c", BURN, "1.5", "psbench-leftover"], stdout=subprocess.PIPE, text=True)
    with TreeSampler(classifier([Proc("burner", 1, r"psbench-burn\b")]), interval_s=0.05) as sampler:
        t0, own0 = time.time(), _own_cpu_s()
        out = subprocess.run([sys.executable, "-c", BURN, "1.2", "psbench-burn"], capture_output=True, text=True,
                             check=True)
        leftover_burned = float(leftover.communicate()[0])   # reaped inside the span
        time.sleep(0.2)
        t1, own = time.time(), _own_cpu_s() - own0
    cpu = sampler.cpu_between([(t0, t1)])
    assert 0.9 <= cpu["burner"] / float(out.stdout) <= 1.1, cpu
    # at most what it burned between the last sample and its exit leaks in (one 50 ms interval)
    assert cpu.get(LAUNCHER, 0.0) <= own + 0.15 * leftover_burned, (cpu, own, leftover_burned)
