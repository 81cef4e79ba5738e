"""The cores a run may use, and the CPU its process tree used.

usable_cores(): what this process may keep busy: its affinity mask (taskset, a CI runner's cpuset)
capped by the cgroup's CPU quota (docker --cpus: cgroup v2 `cpu.max`, v1 `cpu.cfs_quota_us` /
`cpu.cfs_period_us`, the tightest along the cgroup's path), or $PSBENCH_CORES where set (tests and
users inject a count). os.cpu_count() sees neither.

TreeSampler: a thread that samples the cumulative CPU seconds of this process and every descendant,
summed by role (a system's workers, its servers, daemons...), so the CPU a run used over its
training span can be read afterwards. Children that exited count through their parent's
`children_user/children_system` (the kernel adds a reaped child's times there).
"""
from __future__ import annotations

import os
import re
import resource
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

import numpy as np

from psbench.core.errors import ConfigError

CORES_ENV = "PSBENCH_CORES"
WORKERS = "workers"    # the role whose processes run the training steps
LAUNCHER = "launcher"  # this process and anything of the run no declared role matches
# Workers forked from the zygote (psbench.core.zygote) keep its command line.
FORKED = r"psbench\.core\.zygote"
SAMPLE_INTERVAL_S = 0.25  # a scan of the tree costs ~1.5 ms: well under 1% of a core at this rate


@dataclass(frozen=True)
class Cores:
    count: float            # cores a run may keep busy
    source: str             # where the count came from
    affinity: int           # CPUs in this process's affinity mask
    quota: float | None     # CPUs the cgroup quota allows, None when unlimited

    def describe(self) -> dict:
        return {"cores": self.count, "cores_source": self.source, "affinity_cpus": self.affinity,
                "cgroup_quota_cpus": self.quota}


def usable_cores(environ: dict[str, str] | None = None) -> Cores:
    env = (os.environ if environ is None else environ).get(CORES_ENV, "").strip()
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    quota = cgroup_quota()
    if env:
        try:
            count = float(env)
        except ValueError:
            count = -1.0
        if not count > 0:
            raise ConfigError(f"{CORES_ENV}='{env}': expected a number of cores > 0, e.g. 2 or 1.5")
        return Cores(count, CORES_ENV, affinity, quota)
    if quota is not None and quota < affinity:
        return Cores(quota, "cgroup cpu quota", affinity, quota)
    return Cores(float(affinity), "affinity mask", affinity, quota)


def cgroup_quota(mountinfo: Path = Path("/proc/self/mountinfo"), cgroup: Path = Path("/proc/self/cgroup")) -> float | None:
    """CPUs this process's cgroup may use (quota / period), the tightest limit from its cgroup up to
    the mount's root (the kernel enforces every level); None when there is none or no cgroup fs."""
    try:
        mounts, groups = mountinfo.read_text().splitlines(), cgroup.read_text().splitlines()
    except OSError:
        return None
    paths: dict[str, str] = {}  # "v2" | "v1" -> this process's cgroup path
    for line in groups:
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and controllers == "":
            paths["v2"] = path
        elif "cpu" in controllers.split(","):
            paths["v1"] = path
    limits: list[float] = []
    for line in mounts:
        fields = line.split()
        if "-" not in fields:
            continue
        sep = fields.index("-")
        root, mount_point, fstype = fields[3], fields[4], fields[sep + 1]
        options = fields[sep + 3].split(",") if len(fields) > sep + 3 else []
        if fstype == "cgroup2" and "v2" in paths:
            limits += _along(Path(mount_point), root, paths["v2"], _quota_v2)
        elif fstype == "cgroup" and "cpu" in options and "v1" in paths:
            limits += _along(Path(mount_point), root, paths["v1"], _quota_v1)
    return min(limits) if limits else None


def _along(mount_point: Path, root: str, path: str, read: Callable[[Path], float | None]) -> list[float]:
    """The quotas set from the process's cgroup directory up to the mount point. In a container the
    mount's root is the container's cgroup, which /proc/self/cgroup may name in full."""
    relative = path[len(root):] if root != "/" and path.startswith(root) else path
    directory = mount_point / relative.lstrip("/")
    found = []
    while True:
        quota = read(directory) if directory.is_dir() else None
        if quota is not None:
            found.append(quota)
        if directory == mount_point or mount_point not in directory.parents:
            return found
        directory = directory.parent


def _quota_v2(directory: Path) -> float | None:
    try:
        quota, period = (directory / "cpu.max").read_text().split()[:2]
    except (OSError, ValueError):
        return None
    return None if quota == "max" else int(quota) / int(period)


def _quota_v1(directory: Path) -> float | None:
    try:
        quota = int((directory / "cpu.cfs_quota_us").read_text())
        period = int((directory / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return None if quota <= 0 or period <= 0 else quota / period


# ---- the processes of a run ---------------------------------------------------------------

@dataclass(frozen=True)
class Proc:
    """Processes of one role that a run starts on this machine (a system declares all of them).
    `pattern` is searched in a process's command line ('' matches none: e.g. the role is this
    process); the first matching Proc of a system names a process's role."""
    role: str
    count: int
    pattern: str = ""
    max_cores: float | None = None  # None: one core a process (single-threaded Python)

    @property
    def cap(self) -> float:
        return float(self.count) if self.max_cores is None else self.max_cores


def classifier(procs: Iterable[Proc]) -> Callable[[str], str]:
    """Role of a process by its command line: the first Proc whose pattern it matches, else LAUNCHER."""
    rules = [(re.compile(p.pattern), p.role) for p in procs if p.pattern]

    def role_of(cmdline: str) -> str:
        return next((role for rule, role in rules if rule.search(cmdline)), LAUNCHER)

    return role_of


@dataclass(frozen=True)
class _Seen:
    """One process at a sample."""
    role: str
    own: float       # its CPU seconds
    children: float  # its reaped children's
    ppid: int

    @property
    def total(self) -> float:
        return self.own + self.children


@dataclass
class TreeSampler:
    """Samples this process tree's cumulative CPU seconds by role, every `interval_s`, on a thread.

        with TreeSampler(classify, self_role) as sampler:
            run()
        cpu = sampler.cpu_between([(t0, t1)])   # {role: CPU seconds}, interpolated between samples

    A process's figure is its own CPU plus its reaped children's. When one leaves the tree (it
    exited, or was reaped), its last figure stays with its role, and as much is taken from the role
    of its nearest ancestor still there as that ancestor's children's times take in, now or when it
    reaps it: so a role keeps what its processes used, and the total stays the kernel's. A process
    reaped unaccounted (its parent ignores SIGCHLD) or moved out of the tree (its parent died) adds
    nothing there, and nothing is taken. A process already there at the first
    sample that no role claims is not the run's (a Spark gateway JVM an earlier run left, which
    pyspark keeps for the life of this process): it counts nowhere, nor does its reaping.
    """
    classify: Callable[[str], str]
    self_role: str = LAUNCHER
    interval_s: float = SAMPLE_INTERVAL_S
    samples: list[tuple[float, dict[str, float]]] = field(default_factory=list, init=False)
    _roles: dict[int, str] = field(default_factory=dict, init=False)  # pid -> role, kept for a zombie
    _last: dict[int, _Seen] = field(default_factory=dict, init=False)
    _moved: dict[str, float] = field(default_factory=lambda: defaultdict(float), init=False)
    _foreign: set[int] | None = field(default=None, init=False)
    _owed: dict[int, float] = field(default_factory=lambda: defaultdict(float), init=False)  # per reaper
    _cost: float = field(default=0.0, init=False)  # CPU seconds the sampling itself took
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    _stop: threading.Event = field(default_factory=threading.Event, init=False, repr=False)
    _thread: threading.Thread | None = field(default=None, init=False, repr=False)

    def __enter__(self) -> "TreeSampler":
        self.sample()
        self._thread = threading.Thread(target=self._loop, name="psbench-cpu-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.sample()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def sample(self) -> None:
        """Take one sample now (the thread does every interval_s; a caller may at a moment that
        matters, such as the start of training)."""
        with self._lock:
            start = time.thread_time()
            self._sample()
            self._cost += time.thread_time() - start  # the measuring is not the run's: left out

    def _sample(self) -> None:
        import psutil

        me = psutil.Process()
        try:
            tree = [me, *me.children(recursive=True)]
        except psutil.Error:
            tree = [me]
        own, children = _own_usage()
        now: dict[int, _Seen] = {me.pid: _Seen(self.self_role, own - self._cost, children, 0)}
        for proc in tree[1:]:
            try:
                t = proc.cpu_times()  # in clock ticks (10 ms): fine over a span of seconds
                ppid = proc.ppid()
            except psutil.Error:
                continue
            now[proc.pid] = _Seen(self._role(proc), t.user + t.system, t.children_user + t.children_system, ppid)
        for pid, seen in now.items():  # renamed (a Ray worker took an actor): its past stays with its old role
            before = self._last.get(pid)
            if before is not None and before.role != seen.role:
                self._moved[before.role] += before.total
                self._moved[seen.role] -= before.total
        if self._foreign is None:
            self._foreign = {pid for pid, seen in now.items() if pid != me.pid and seen.role == LAUNCHER}
        for pid in sorted(self._last.keys() - now.keys()):  # left the tree since the last sample
            gone = self._last[pid]
            if pid not in self._foreign:
                self._moved[gone.role] += gone.total
            reaper = self._ancestor_in(pid, now)
            if reaper is not None:  # its reaper's children's times take it in now, or once it is reaped
                self._owed[reaper] += gone.total
        for pid in [p for p in self._owed if p in now]:
            grew = now[pid].children - (self._last[pid].children if pid in self._last else 0.0)
            paid = min(self._owed[pid], max(0.0, grew))
            self._moved[now[pid].role] -= paid
            self._owed[pid] -= paid
        self._owed = defaultdict(float, {pid: v for pid, v in self._owed.items() if pid in now and v > 0})
        self._last = now
        totals: dict[str, float] = defaultdict(float, self._moved)
        for pid, seen in now.items():
            if pid not in self._foreign:
                totals[seen.role] += seen.total
        self.samples.append((time.time(), dict(totals)))

    def _ancestor_in(self, pid: int, now: dict[int, _Seen]) -> int | None:
        """The nearest ancestor of a departed process that is still in the tree (its reaper)."""
        seen = set()
        while pid in self._last and pid not in seen:
            seen.add(pid)
            pid = self._last[pid].ppid
            if pid in now:
                return pid
        return None

    def _role(self, proc) -> str:
        import psutil

        try:  # read each time: a Ray worker renames itself once it hosts an actor
            cmdline = " ".join(proc.cmdline())
        except psutil.Error:
            cmdline = ""
        if cmdline:  # empty for a process on its way out: it keeps its role
            self._roles[proc.pid] = self.classify(cmdline)
        return self._roles.get(proc.pid, LAUNCHER)

    def cpu_between(self, spans: list[tuple[float, float]]) -> dict[str, float]:
        """CPU seconds each role used over the spans (epoch seconds), read off the samples by
        linear interpolation; a role absent from a sample had no process then (0 s so far)."""
        if not self.samples:
            return {}
        times = np.array([t for t, _ in self.samples])
        roles = sorted({role for _, totals in self.samples for role in totals})
        out = {}
        for role in roles:
            series = np.array([totals.get(role, 0.0) for _, totals in self.samples])
            out[role] = float(sum(np.interp(t1, times, series) - np.interp(t0, times, series) for t0, t1 in spans))
        return out


def active_spans(t0: float, t1: float, pauses: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """[t0, t1] without the paused intervals (evaluation, teardown kept off the training clock)."""
    spans, start = [], t0
    for p0, p1 in sorted(pauses):
        if p1 <= start or p0 >= t1:
            continue
        if p0 > start:
            spans.append((start, p0))
        start = max(start, p1)
    if t1 > start:
        spans.append((start, t1))
    return spans


def _own_usage() -> tuple[float, float]:
    """(this process's CPU seconds, its reaped children's), to the microsecond (getrusage)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


def measured_cores(cpu_s: dict[str, float], span_s: float) -> dict[str, float]:
    """CPU seconds by role over a span, as cores kept busy (and their total under 'total')."""
    if span_s <= 0:
        return {}
    out = {role: round(max(0.0, s) / span_s, 4) for role, s in cpu_s.items()}
    out["total"] = round(max(0.0, sum(cpu_s.values())) / span_s, 4)
    return out
