"""A Slurm cluster on namespace hosts: Debian's slurm-wlm and munge, one slurmctld on host 0 and one
slurmd per host (its own node name, spool folder and log), every file under one private temp
folder, torn down completely on exit (no daemon, job step or file left).

    with NetLab(hosts=2) as lab, SlurmLab(lab) as slurm:
        lab.run(0, ["sbatch", "--wait", "deploy/slurm/psbench.sbatch", ...], env=slurm.env())

MUNGE: one key made for the lab (mode 400) and one munged, whose socket every daemon and client
is told of (slurm.conf's AuthInfo). The namespace hosts share this machine's file system, so a
Unix socket's path reaches it from each of them; on a real cluster every host runs its own munged
with the same key, and a credential any of them makes any other accepts: one munged with that key
is the same trust, with no per-host copies of the key to make and remove.

Node names (psbLhI) resolve to the hosts' 198.18 addresses through /etc/netns/<namespace>/hosts,
which `ip netns exec` mounts over /etc/hosts for slurmd and the job steps it starts, as DNS would on
a cluster; this machine's hostname maps to the host's own address there too, so gloo (ddp) picks
the lab's interface. No cgroups (this container may not allow them): proctrack/linuxproc,
task/none, no accounting.

Needs root (namespaces) and slurm-wlm with munge (.ci/install-slurm.sh).
"""
from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import psutil

from psbench.bench.lab.netlab import NetLab, namespace_pids, write_netns_hosts
from psbench.core.errors import ConfigError
from psbench.core.supervisor import failure_cause, stop_tree

TOOLS = ("slurmctld", "slurmd", "slurmstepd", "munged", "mungekey", "sbatch", "srun", "sinfo")
CTLD_PORT, SLURMD_PORT = 6817, 6818
PARTITION = "lab"
# slurmd loads a cgroup plugin even when nothing uses it, and its autodetection looks at
# /sys/fs/cgroup, which `ip netns exec` hides under a fresh sysfs: name v1, which only loads.
CGROUP_CONF = "CgroupPlugin=cgroup/v1\nCgroupAutomount=no\n"
READY_TIMEOUT_S = 60.0
# errors every start logs here, which say nothing of why a daemon failed: no PMIx library (an MPI
# plugin nothing uses), no state files yet (a new controller)
BENIGN = re.compile(r"pmix|MPI: Cannot create context|state file|Trying backup state", re.I)
STOP_GRACE_S = 5.0


def unavailable_reason() -> str | None:
    """None if a Slurm lab can be made here, else why not."""
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        return f"{', '.join(missing)} not installed (Debian: apt-get install slurm-wlm munge; .ci/install-slurm.sh)"
    return None


def node_name(lab: int, host: int) -> str:
    return f"psb{lab}h{host}"


def slurm_conf(folder: Path, names: list[str], addresses: list[str], cpus: int, munge_socket: Path) -> str:
    """slurm.conf for one controller on the first node and a slurmd on each, every path in `folder`
    (%n: the node's name, so each slurmd keeps its own)."""
    nodes = "\n".join(f"NodeName={n} NodeAddr={a} NodeHostname={n} CPUs={cpus} State=UNKNOWN"
                      for n, a in zip(names, addresses))
    return f"""\
ClusterName=psblab
# the controller is named by this machine's hostname (slurmctld checks it) at host 0's lab address
SlurmctldHost={socket.gethostname()}({addresses[0]})
SlurmctldPort={CTLD_PORT}
SlurmdPort={SLURMD_PORT}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={munge_socket}
CredType=cred/munge
StateSaveLocation={folder}/ctld
SlurmdSpoolDir={folder}/spool/%n
SlurmctldPidFile={folder}/slurmctld.pid
SlurmdPidFile={folder}/slurmd-%n.pid
SlurmctldLogFile={folder}/log/slurmctld.log
SlurmdLogFile={folder}/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
# no cgroups: plain process tracking, no task binding, no accounting
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
MpiDefault=none
ReturnToService=2
MailProg=/bin/true
SlurmdTimeout=60
InactiveLimit=0
# completed jobs kept (scontrol shows them); with 0 `sbatch --wait` also polls every 2 s, not 2, 8, 32 s
MinJobAge=0
KillWait=5
{nodes}
PartitionName={PARTITION} Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


@dataclass(frozen=True)
class Job:
    """A batch job that `sbatch --wait` saw to its end."""
    job_id: str
    returncode: int      # sbatch's: the job's exit code
    wall_s: float        # submission to end, as sbatch --wait saw it
    output: str          # the job's --output file (its tasks' stdout and stderr)
    sbatch_err: str

    def failure(self) -> str | None:
        """None if the job succeeded, else why not in one line."""
        if self.returncode == 0:
            return None
        cause = failure_cause(self.output) or failure_cause(self.sbatch_err) or "no output"
        return f"Slurm job {self.job_id or '?'} failed (sbatch exit {self.returncode}): {cause}"


class SlurmLab:
    """Context manager: munged, slurmctld on host 0 and a slurmd on each host of `lab`, ready (every
    node idle) on enter; on exit every daemon and job step stopped and the folder removed."""

    def __init__(self, lab: NetLab, cpus: int | None = None):
        reason = unavailable_reason()
        if reason:
            raise ConfigError(f"cannot start Slurm on lab hosts: {reason}")
        if lab.lab is None:
            raise ConfigError("SlurmLab needs a NetLab that is up")
        self.lab = lab
        self.cpus = cpus or os.cpu_count() or 1   # each slurmd sees this machine's CPUs
        self.names = [node_name(lab.lab, h) for h in range(lab.hosts)]
        self.dir: Path | None = None
        self.procs: dict[str, subprocess.Popen] = {}
        self.netns_etc: list[Path] = []

    @property
    def conf(self) -> Path:
        assert self.dir is not None
        return self.dir / "slurm.conf"

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        """The environment of a Slurm client (sbatch, srun, sinfo) on a lab host."""
        from psbench.systems.common import child_env

        return child_env({"SLURM_CONF": str(self.conf), **(extra or {})})

    def __enter__(self) -> "SlurmLab":
        try:
            self._start()
        except BaseException:
            self.__exit__()
            raise
        return self

    def _start(self) -> None:
        folder = self.dir = Path(tempfile.mkdtemp(prefix="psbench-slurm-"))
        os.chmod(folder, 0o700)
        for sub in ("munge", "ctld", "log", *(f"spool/{n}" for n in self.names)):
            (folder / sub).mkdir(parents=True, mode=0o700)
        key, sock = folder / "munge" / "munge.key", folder / "munge" / "munge.socket"
        subprocess.run(["mungekey", "--create", "--keyfile", str(key)], check=True, capture_output=True)
        os.chmod(key, 0o400)
        addresses = [self.lab.addr(h) for h in range(self.lab.hosts)]
        for h in range(self.lab.hosts):
            self.netns_etc.append(write_netns_hosts(self.lab, h, {
                **dict(zip(self.names, addresses)), socket.gethostname(): addresses[h]}))
        self.conf.write_text(slurm_conf(folder, self.names, addresses, self.cpus, sock))
        (folder / "cgroup.conf").write_text(CGROUP_CONF)
        env = self.env()
        # --force: the socket's folder is root's alone (mode 700, beside the key), where munged wants
        # every user able to reach it; in the lab only root submits jobs
        self._daemon("munged", 0, ["munged", "--foreground", "--force", f"--socket={sock}", f"--key-file={key}",
                                   f"--pid-file={folder}/munge/munged.pid", f"--log-file={folder}/log/munged.log",
                                   f"--seed-file={folder}/munge/munged.seed"], env)
        self._wait(lambda: sock.exists(), "munged's socket", "munged.log")
        self._daemon("slurmctld", 0, ["slurmctld", "-D", "-f", str(self.conf)], env)
        self._wait(self._controller_up, "slurmctld", "slurmctld.log")
        for h, name in enumerate(self.names):
            self._daemon(f"slurmd {name}", h, ["slurmd", "-D", "-N", name, "-f", str(self.conf)], env)
        self._wait(self._all_idle, f"nodes {', '.join(self.names)} idle", "slurmctld.log")

    def _daemon(self, name: str, host: int, argv: list[str], env: dict[str, str]) -> None:
        assert self.dir is not None
        with open(self.dir / "log" / f"{name.replace(' ', '-')}.out", "wb") as out:
            self.procs[name] = self.lab.exec(host, argv, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                             stderr=subprocess.STDOUT)

    def _why(self, what: str, log: str) -> str:
        """One line: what did not come up and why: the first error of the first daemon that exited,
        else the last error in `log`."""
        assert self.dir is not None
        exited = [n for n, p in self.procs.items() if p.poll() is not None]
        dead = [f"{n} ({self.procs[n].returncode})" for n in exited]
        path = self.dir / "log" / (f"{exited[0].replace(' ', '-')}.out" if exited else log)
        try:
            errors = [ln.strip() for ln in path.read_text(errors="replace").splitlines()
                      if re.search(r"error|fatal", ln, re.I) and not BENIGN.search(ln)]
        except OSError:
            errors = []
        return (f"Slurm lab: {what} " + (f"did not come up; exited: {', '.join(dead)}" if dead else
                                         f"not ready after {READY_TIMEOUT_S:g} s")
                + (f"; {errors[0] if dead else errors[-1]}" if errors else ""))

    def _wait(self, ready, what: str, log: str) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not ready():
            if time.monotonic() > deadline or any(p.poll() is not None for p in self.procs.values()):
                raise RuntimeError(self._why(what, log))
            time.sleep(0.2)

    def _controller_up(self) -> bool:
        return self.lab.run(0, ["scontrol", "ping"], env=self.env(), timeout=30).returncode == 0

    def _all_idle(self) -> bool:
        done = self.lab.run(0, ["sinfo", "--noheader", "--Node", "--format=%N %t"], env=self.env(), timeout=30)
        states = dict(line.split() for line in done.stdout.splitlines() if len(line.split()) == 2)
        return all(states.get(n) == "idle" for n in self.names)

    def sinfo(self) -> str:
        return self.lab.run(0, ["sinfo", "--Node", "--long"], env=self.env(), timeout=30).stdout

    def submit(self, host: int, script: str, args: Sequence[str], output: Path, sbatch_args: Sequence[str] = (),
               env: dict[str, str] | None = None, timeout_s: float = 300) -> Job:
        """`sbatch --wait` of `script args` from lab host `host` (a login node: any host reaches the
        controller over the lab); the job's output in `output`."""
        argv = ["sbatch", "--wait", "--parsable", f"--output={output}", *sbatch_args, script, *args]
        began = time.monotonic()
        done = self.lab.run(host, argv, env=self.env(env), timeout=timeout_s)
        wall = time.monotonic() - began
        text = output.read_text(errors="replace") if output.is_file() else ""
        return Job(done.stdout.strip().split(";")[0], done.returncode, wall, text, done.stderr)

    def leftover(self) -> list[str]:
        """Processes of this lab still running: its daemons, and anything in its hosts' namespaces."""
        pids = {p.pid for p in self.procs.values() if p.poll() is None}
        for h in range(self.lab.hosts):
            pids.update(namespace_pids(self.lab.ns(h)))
        names = []
        for pid in sorted(pids):
            try:
                names.append(f"{pid} {psutil.Process(pid).name()}")
            except psutil.NoSuchProcess:
                pass
        return names

    def __exit__(self, *exc) -> None:
        # slurmd first (its job steps are daemons of their own: found through the namespaces), then
        # the controller, then munged, which the others need until they stop.
        order = [n for n in self.procs if n.startswith("slurmd")] + ["slurmctld", "munged"]
        for name in order:
            if name in self.procs:
                stop_tree([self.procs[name]], STOP_GRACE_S)
            if name.startswith("slurmd"):
                self._stop_steps()
        self.procs.clear()
        for folder in self.netns_etc:
            shutil.rmtree(folder, ignore_errors=True)
        self.netns_etc.clear()
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)

    def _stop_steps(self) -> None:
        """Job steps (slurmstepd and its tasks) slurmd left in the lab's namespaces."""
        steps = []
        for h in range(self.lab.hosts):
            for pid in namespace_pids(self.lab.ns(h)):
                try:
                    proc = psutil.Process(pid)
                    if proc.name() == "slurmstepd":
                        steps.append(proc)
                except psutil.NoSuchProcess:
                    pass
        for proc in steps:
            try:
                for child in [*proc.children(recursive=True), proc]:
                    child.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(steps, timeout=5)
