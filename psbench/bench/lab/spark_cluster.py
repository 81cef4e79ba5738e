"""A real Spark standalone cluster on lab hosts or on loopback: a master and N workers, each a
`python -m psbench.systems.spark.daemon master|worker` process (Spark's own spark-class daemons),
all sharing one authentication secret (PSBENCH_SPARK_TOKEN), which also turns on Spark's network
encryption (spark.network.crypto.enabled) on the daemons (systems/spark/daemon.py) and the driver
(systems/spark/session.py).

    with NetLab(hosts=4) as lab, SparkCluster(NetnsHosts(lab=lab), master=0, workers=[1, 2]) as sc:
        lab.run(3, [python, "-m", "psbench", "run", "--system", "spark-mllib", "-np", "2",
                    *sc.driver_args(lab.addr(3))], env=child_env(sc.driver_env()))

    with SparkCluster(LocalHosts(3), master=0, workers=[1, 2]) as sc:   # loopback: 127.0.0.1
        ...

Every daemon binds its host's address only (SPARK_LOCAL_IP and --host), web UIs on random ports;
each worker has its own work folder (executor logs, shipped files). Executors inherit their
worker's environment: GLOO_SOCKET_IFNAME names the host's interface so torch ranks started in
tasks (spark-torch with local_mode=false) talk over the lab link.

CLI: `psbench spark-cluster --workers 2 [--netns]` starts one in the foreground (until Ctrl-C),
printing the master URL and the driver flags; `--netns` puts it on a new lab whose last host is
left for the driver (`psbench netlab exec --lab L --host H -- psbench run ...`).
"""
from __future__ import annotations

import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from psbench.core.errors import ConfigError
from psbench.core.supervisor import stop_tree, tail

if TYPE_CHECKING:
    from psbench.bench.lab.cluster.hosts import Hosts

REGISTERED = "Successfully registered with master"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SparkCluster:
    """Context manager: the master on host `master`, one worker per entry of `workers` (a host may
    repeat), all started through `hosts` (cluster.hosts.LocalHosts or NetnsHosts), stopped and
    their folders removed on exit. Ready when every worker has registered with the master."""

    def __init__(self, hosts: Hosts, master: int, workers: Sequence[int], cores: int = 1, memory: str = "1g",
                 port: int | None = None, token: str | None = None, interface: str | None = None,
                 start_timeout_s: float = 120.0):
        if not workers:
            raise ConfigError("a Spark cluster needs at least one worker")
        if cores < 1:
            raise ConfigError(f"cores per worker must be >= 1, got {cores}")
        if not re.fullmatch(r"\d+[mg]", memory):
            raise ConfigError(f"worker memory must look like 512m or 2g, got '{memory}'")
        self.hosts = hosts
        self.master_host = master
        self.worker_hosts = list(workers)
        self.cores, self.memory = cores, memory
        self.port = port or (free_port() if hosts.addr(master).startswith("127.") else 7077)
        self.token = token or secrets.token_hex(16)
        self.interface = interface
        self.start_timeout_s = start_timeout_s
        self.dir: Path | None = None
        self.procs: list[subprocess.Popen] = []
        self.logs: list[Path] = []

    # ---- what a driver needs -------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"spark://{self.hosts.addr(self.master_host)}:{self.port}"

    def driver_args(self, driver_addr: str) -> list[str]:
        """psbench run flags for a driver at driver_addr (it binds that address too)."""
        return ["--spark-master", self.url, "--driver-host", driver_addr]

    def driver_env(self) -> dict[str, str]:
        return {"PSBENCH_SPARK_TOKEN": self.token}

    def submit_argv(self, driver_addr: str, folder: Path, job_args: Sequence[str],
                    conf: dict[str, str] | None = None) -> list[str]:
        """pyspark's spark-submit of deploy/spark/psbench_job.py to this cluster, as a user types it: the
        secret in a properties file of this user's only, written into `folder` (never a --conf: `ps`
        shows command lines), the executors importing this checkout (its path on every host here)."""
        import pyspark

        from psbench.systems.common import REPO_ROOT

        secret = folder / "secret.properties"
        fd = os.open(secret, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(f"spark.authenticate.secret={self.token}\n")
        settings = {"spark.authenticate": "true", "spark.network.crypto.enabled": "true",
                    "spark.driver.host": driver_addr, "spark.driver.bindAddress": driver_addr,
                    "spark.executorEnv.PYTHONPATH": str(REPO_ROOT), "spark.local.dir": str(folder), **(conf or {})}
        return [str(Path(pyspark.__file__).parent / "bin" / "spark-submit"), "--master", self.url,
                "--properties-file", str(secret), *[a for k, v in settings.items() for a in ("--conf", f"{k}={v}")],
                str(REPO_ROOT / "deploy" / "spark" / "psbench_job.py"), *job_args]

    # ---- life cycle ----------------------------------------------------------------------------
    def __enter__(self) -> "SparkCluster":
        try:
            self.hosts.__enter__()
            self.dir = Path(tempfile.mkdtemp(prefix="psbench-spark-cluster-"))
            os.chmod(self.dir, 0o755)
            master_addr = self.hosts.addr(self.master_host)
            self._start("master", self.master_host, ["master", "--host", master_addr, "--port", str(self.port),
                                                     "--webui-port", "0"])
            self.hosts.wait_listening(self.master_host, self.port, self.start_timeout_s)
            for i, h in enumerate(self.worker_hosts):
                work = self.dir / f"worker{i}-{self.hosts.addr(h)}"   # each worker's own folder
                work.mkdir()
                self._start(f"worker{i}", h, ["worker", "--host", self.hosts.addr(h), "--webui-port", "0",
                                              "--cores", str(self.cores), "--memory", self.memory,
                                              "--work-dir", str(work), self.url])
            self._wait_registered()
        except BaseException:
            self.__exit__()
            raise
        return self

    def _start(self, name: str, host: int, args: list[str]) -> None:
        assert self.dir is not None
        log = self.dir / f"{name}.log"
        env = {"PSBENCH_SPARK_TOKEN": self.token, "SPARK_LOCAL_IP": self.hosts.addr(host),
               "SPARK_NO_DAEMONIZE": "1", "PYSPARK_PYTHON": sys.executable}
        if self.interface:
            env["GLOO_SOCKET_IFNAME"] = self.interface
        elif self.hosts.addr(host).startswith("127."):
            env["GLOO_SOCKET_IFNAME"] = "lo"
        with open(log, "wb") as fh:
            proc = self.hosts.start(host, [sys.executable, "-m", "psbench.systems.spark.daemon", *args], env, fh)
        self.procs.append(proc)
        self.logs.append(log)

    def _wait_registered(self) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        workers = list(zip(self.procs[1:], self.logs[1:]))
        while True:
            for proc, log in [(self.procs[0], self.logs[0])] + workers:
                if proc.poll() is not None:
                    raise RuntimeError(f"Spark {log.stem} exited ({proc.returncode}):\n{tail(log)}")
            pending = [log for _, log in workers if REGISTERED not in log.read_text(errors="replace")]
            if not pending:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"Spark {pending[0].stem} did not register with {self.url} within "
                                   f"{self.start_timeout_s:.0f}s:\n{tail(pending[0])}")
            time.sleep(0.2)

    def executor_pids(self) -> list[int]:
        """Executor JVMs started by this cluster's workers (their command names the worker folder)."""
        import psutil

        pids = []
        for proc in self.procs[1:]:
            try:
                children = psutil.Process(proc.pid).children(recursive=True)
            except psutil.NoSuchProcess:
                continue
            for child in children:
                try:   # per child: a zombie among them (spark-class' bash) must not hide its siblings
                    if "CoarseGrainedExecutorBackend" in " ".join(child.cmdline()):
                        pids.append(child.pid)
                except psutil.NoSuchProcess:   # ZombieProcess too
                    continue
        return pids

    def __exit__(self, *exc) -> None:
        stop_tree(list(reversed(self.procs)), 5.0)   # workers (and their executors), then the master
        self.procs.clear()
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
        self.hosts.__exit__(*exc)


# ---- CLI: psbench spark-cluster ---------------------------------------------------------------

def add_arguments(p) -> None:
    p.add_argument("--workers", type=int, default=2, help="worker daemons (default 2)")
    p.add_argument("--cores", type=int, default=1, help="task slots per worker (default 1)")
    p.add_argument("--memory", default="1g", help="memory per worker for executors (default 1g)")
    p.add_argument("--netns", action="store_true",
                   help="on a new network lab: master on host 0, workers on hosts 1..N, host N+1 for the driver")


def main(args) -> int:
    from psbench.bench.lab.cluster.hosts import LocalHosts, NetnsHosts

    if args.workers < 1:
        raise ConfigError(f"--workers must be >= 1, got {args.workers}")
    if args.netns:
        from psbench.bench.lab.netlab import NetLab

        hosts = NetnsHosts(lab=NetLab(hosts=args.workers + 2).up())
        driver = args.workers + 1
    else:
        hosts, driver = LocalHosts(args.workers + 1), 0
    stop = {"now": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))
    try:
        with SparkCluster(hosts, 0, list(range(1, args.workers + 1)), args.cores, args.memory) as sc:
            where = (f"on lab {hosts.lab.lab}; driver host {driver}: psbench netlab exec --lab {hosts.lab.lab} "
                     f"--host {driver} -- " if args.netns else "")
            print(f"spark master {sc.url} with {args.workers} worker(s) {where}".rstrip(), flush=True)
            print(f"  PSBENCH_SPARK_TOKEN={sc.token} psbench run --system spark-mllib -np {args.workers} "
                  f"{' '.join(sc.driver_args(hosts.addr(driver)))} ...", flush=True)
            print("Ctrl-C stops the cluster", flush=True)
            while not stop["now"] and all(p.poll() is None for p in sc.procs):
                time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        if args.netns:
            hosts.lab.down()
    return 0
