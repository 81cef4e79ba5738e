"""What the Spark adapters share: options, the SparkSession (created quiet, bound to 127.0.0.1
unless driver_host/driver_bind say otherwise, executors importing this checkout, reused across
runs with the same master), and turning a Spark job failure into one clear line.

A driver bound beyond loopback (executors on other hosts connect to it) needs a token: env
PSBENCH_SPARK_TOKEN turns on Spark's own authentication (spark.authenticate, a shared secret the
standalone master and workers must be given too: systems/spark/daemon.py), or the run says
insecure=true, which its manifest records."""
from __future__ import annotations

import os
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from psbench.core.cpu import WORKERS, Proc
from psbench.systems.base import option
from psbench.systems.common import child_env
from psbench.core.errors import ConfigError

LOCAL_DEFAULT = "local[N]"  # the default master: local mode with one task slot per worker
_MASTER_RE = re.compile(r"^(local(\[(\d+|\*)(,\d+)?\])?|local-cluster\[.+\]|spark://.+|yarn|k8s://.+)$")
SPARK_JVM = r"\bjava\b.*org\.apache\.spark"  # the driver's JVM (spark-submit's command line)
LOG4J_FILE = Path(__file__).resolve().parent / "log4j2.properties"


@dataclass(frozen=True)
class SparkOptions:
    spark_master: str = option(LOCAL_DEFAULT, "Spark master: local[N] (N = workers), local[K], or spark://host:port")
    spark_conf: str = option("", "extra Spark settings, 'key=value,key=value'")
    fail_at_step: int = option(-1, "make the last worker's task fail at this step (fault injection; -1 = never)")
    driver_host: str = option("127.0.0.1", "address executors reach the driver at (spark.driver.host)")
    driver_bind: str = option("", "address the driver binds (spark.driver.bindAddress; default: driver_host)")
    insecure: bool = option(False, "allow a driver bound beyond loopback without a token (env PSBENCH_SPARK_TOKEN)")

    def __post_init__(self) -> None:
        if self.spark_master != LOCAL_DEFAULT and not _MASTER_RE.match(self.spark_master):
            raise ConfigError(f"option spark_master: '{self.spark_master}' is not a Spark master; "
                              "use local[N], local[K], local[*] or spark://host:port")
        parse_conf(self.spark_conf)

    def master(self, workers: int) -> str:
        return f"local[{workers}]" if self.spark_master == LOCAL_DEFAULT else self.spark_master

    def local_workers(self, workers: int) -> int:
        """Workers whose tasks run on this machine: all in local mode; none on a cluster master
        (spark://, yarn, k8s), whose executors' cores are the cluster's, not the driver's host's."""
        return workers if self.master(workers).startswith("local") else 0

    def driver_conf(self, token: str | None) -> dict[str, str]:
        """The driver's addresses, Spark's authentication when there is a token, then spark_conf
        (which may override any of them)."""
        conf = {"spark.driver.host": self.driver_host, "spark.driver.bindAddress": self.driver_bind or self.driver_host}
        if token:
            conf.update({"spark.authenticate": "true", "spark.authenticate.secret": token})
        return {**conf, **parse_conf(self.spark_conf)}


class SparkSystem:
    """What every Spark adapter shares for the harness: the CPU budget counts the driver (its JVM;
    the Python side is this launcher) and, in local mode only, the workers (Python workers forked
    by pyspark's daemon); availability is pyspark's."""

    @staticmethod
    def cpu_processes(options: SparkOptions, workers: int) -> list[Proc]:
        return [Proc(WORKERS, workers, r"pyspark[./](daemon|worker)"), Proc("spark driver", 1, SPARK_JVM)]

    @staticmethod
    def local_workers(options: SparkOptions, workers: int) -> int:
        return options.local_workers(workers)

    @classmethod
    def unavailable_reason(cls) -> str | None:
        return pyspark_unavailable_reason()


def parse_conf(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip().startswith("spark."):
            raise ConfigError(f"option spark_conf: '{item}' is not 'spark.key=value'")
        out[key.strip()] = value.strip()
    return out


def pyspark_unavailable_reason() -> str | None:
    import importlib.util
    import shutil

    if importlib.util.find_spec("pyspark") is None:
        return "pyspark is not installed"
    if not (os.environ.get("JAVA_HOME") or shutil.which("java")):
        return "Java is not installed (pyspark needs a JVM)"
    return None


@dataclass
class SessionInfo:
    spark: Any     # pyspark.sql.SparkSession
    start_s: float  # seconds spent starting it here; 0.0 when an existing session was reused
    reused: bool
    master: str


def _local_slots(master: str) -> int | None:
    m = re.match(r"^local\[(\d+)", master)
    return int(m.group(1)) if m else (1 if master == "local" else None)


def check_driver_exposure(conf: dict[str, str], insecure: bool) -> None:
    """A driver bound beyond loopback accepts connections from other hosts: it needs Spark's
    authentication (a token), or an explicit insecure=true."""
    from psbench.systems.ps.server import is_loopback

    bind = conf.get("spark.driver.bindAddress", "127.0.0.1")
    if not is_loopback(bind) and conf.get("spark.authenticate") != "true" and not insecure:
        raise ConfigError(f"the Spark driver binds {bind}, which is reachable from other hosts: set "
                          "PSBENCH_SPARK_TOKEN (Spark authentication; give the master and workers the same) "
                          "or the option insecure=true")


def get_session(master: str, workers: int, extra_conf: dict[str, str] | None = None,
                barrier_timeout_s: int = 300, insecure: bool = False) -> SessionInfo:
    """The active session if it runs on `master` with `extra_conf`, else a fresh one."""
    slots = _local_slots(master)
    if slots is not None and slots < workers:
        raise ConfigError(f"Spark master {master} has {slots} task slot(s), fewer than {workers} workers")
    check_driver_exposure({"spark.driver.bindAddress": "127.0.0.1", **(extra_conf or {})}, insecure)
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    extra_conf = extra_conf or {}
    active = SparkContext._active_spark_context
    if active is not None:
        conf = active.getConf()
        if active.master == master and all(conf.get(k) == v for k, v in extra_conf.items()):
            return SessionInfo(SparkSession.builder.getOrCreate(), 0.0, True, master)
        SparkSession.builder.getOrCreate().stop()

    env = child_env()
    # Python workers inherit the driver JVM's environment in local mode; executors elsewhere get it
    # from spark.executorEnv.*. Either way they import this checkout first, with one thread each.
    for key in ("PYTHONPATH", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[key] = env[key]
    os.environ["PYSPARK_PYTHON"] = sys.executable
    settings = {
        "spark.master": master,
        "spark.app.name": "psbench",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.driver.extraJavaOptions": f"-Dlog4j.configurationFile=file:{LOG4J_FILE}",
        "spark.executorEnv.PYTHONPATH": env["PYTHONPATH"],
        "spark.executorEnv.OMP_NUM_THREADS": "1",
        "spark.executorEnv.PYSPARK_PYTHON": sys.executable,
        "spark.pyspark.python": sys.executable,
        "spark.task.maxFailures": "1",             # a failing task fails the run, no silent retries
        "spark.stage.maxConsecutiveAttempts": "1",
        "spark.barrier.sync.timeout": str(barrier_timeout_s),  # a lost peer cannot hang allGather forever
        "spark.scheduler.barrier.maxConcurrentTasksCheck.maxFailures": "1",
        "spark.ui.retainedJobs": "100000",         # per-step job timings are read back after the run
        "spark.ui.retainedStages": "100000",
        "spark.sql.shuffle.partitions": str(max(1, workers)),
        "spark.driver.memory": "2g",
        **extra_conf,
    }
    builder = SparkSession.builder
    for key, value in settings.items():
        builder = builder.config(key, value)
    start = time.perf_counter()
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return SessionInfo(spark, time.perf_counter() - start, False, master)


def stop_session() -> None:
    from pyspark import SparkContext

    if SparkContext._active_spark_context is not None:
        from pyspark.sql import SparkSession

        SparkSession.builder.getOrCreate().stop()


_RANK_PREFIX = re.compile(r"^\[(?:default)?rank\d+\]: ?")
_PY_ERROR = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit)): ?(.*)$")


def error_line(exc: BaseException, output: str = "") -> str:
    """The one line that says why a Spark job failed: the Python exception raised inside a task (or
    in `output`, a launched process's captured output) if there is one, else Spark's own reason."""
    for text in (str(exc), output):
        found = python_error(text)
        if found:
            return found
    lines = [line.strip() for line in str(exc).splitlines()]
    for line in lines:
        if "SparkException:" in line or "Job aborted" in line:
            return line[:500]
    return next((line for line in lines if line), type(exc).__name__)[:500]


def python_error(text: str) -> str | None:
    """'Type: message' of the first Python traceback in text (torchrun's '[rankN]:' prefixes dropped)."""
    lines = [_RANK_PREFIX.sub("", line).rstrip() for line in text.splitlines()]
    for i, line in enumerate(lines):
        if "Traceback (most recent call last)" in line:
            for later in lines[i + 1:]:
                m = _PY_ERROR.match(later)
                if m and not later.startswith(("org.apache", "java.", "py4j.", "scala.")):
                    return f"{m.group(1)}: {m.group(2)}".strip()
    return None


def start_session(spec: Any, options: SparkOptions, recorder: Any, **session_kw: Any) -> SessionInfo:
    """The session for one run; its start-up cost goes to the manifest, not to samples/s."""
    from psbench.systems.common import configure_threads

    configure_threads(1)
    token = os.environ.get("PSBENCH_SPARK_TOKEN") or None
    conf = options.driver_conf(token)
    session = get_session(options.master(spec.workers), spec.workers, conf, insecure=options.insecure, **session_kw)
    recorder.extra.update(spark_session_start_s=session.start_s, spark_session_reused=session.reused,
                          spark_master=session.master, spark_driver=conf["spark.driver.host"],
                          spark_auth="token" if conf.get("spark.authenticate") == "true" else
                          "insecure" if options.insecure else "loopback")
    return session
