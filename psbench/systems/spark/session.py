"""What the Spark adapters share: options, the SparkSession (created quiet, bound to 127.0.0.1
unless driver_host/driver_bind say otherwise, executors importing this checkout, reused across
runs with the same master), and turning a Spark job failure into one clear line.

A driver bound beyond loopback (executors on other hosts connect to it) needs a token: env
PSBENCH_SPARK_TOKEN turns on Spark's own authentication (spark.authenticate, a shared secret the
standalone master and workers must be given too: systems/spark/daemon.py) and, with it, its network
encryption (spark.network.crypto.enabled), or the run says insecure=true, which its manifest records.

The secret reaches the driver's JVM through a properties file readable by this user only (spark-submit
--properties-file, in PYSPARK_SUBMIT_ARGS), removed once the JVM is up: pyspark passes every conf
entry given to the session builder as `--conf key=value` on spark-submit's command line, which `ps`
shows to every local user. (The driver needs it in its conf: for a spark:// master Spark requires
spark.authenticate.secret there; the env variable the daemons use is not enough.)"""
from __future__ import annotations

import os
import re
import shutil
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from psbench.core.cpu import WORKERS, Proc
from psbench.core.supervisor import python_error
from psbench.systems.base import System, option
from psbench.systems.common import child_env
from psbench.core.errors import ConfigError
from psbench.core.exposure import address_host

LOCAL_DEFAULT = "local[N]"  # the default master: local mode with one task slot per worker
_MASTER_RE = re.compile(r"^(local(\[(\d+|\*)(,\d+)?\])?|local-cluster\[.+\]|spark://.+|yarn|k8s://.+)$")
SPARK_JVM = r"\bjava\b.*org\.apache\.spark"  # the driver's JVM (spark-submit's command line)
LOG4J_FILE = Path(__file__).resolve().parent / "log4j2.properties"


HOLD_S = 60.0  # the longest an injected hold pauses


@dataclass(frozen=True)
class Hold:
    """Option hold (tests): at `step`, the last worker's task ('task', inside that step's job) or
    the driver ('driver', between that step's job and the next) creates `marker` and pauses."""
    where: str
    step: int
    marker: str

    @classmethod
    def parse(cls, text: str) -> "Hold | None":
        if not text:
            return None
        where, _, rest = text.partition(":")
        step, _, marker = rest.partition(":")
        if where not in ("task", "driver") or not step.isdigit() or not marker:
            raise ConfigError(f"option hold: '{text}' is not 'task:STEP:FILE' or 'driver:STEP:FILE'")
        return cls(where, int(step), marker)

    def pause(self, where: str, step: int, worker: int | None = None, workers: int | None = None,
              until: Any = None) -> None:
        """Pause here if this is the hold's point (a task: only the last worker's); `until()`
        returning True ends the pause early."""
        if where != self.where or step != self.step or (worker is not None and worker != (workers or 0) - 1):
            return
        Path(self.marker).touch()
        deadline = time.monotonic() + HOLD_S
        while time.monotonic() < deadline and not (until is not None and until()):
            time.sleep(0.1)


@dataclass(frozen=True)
class SparkOptions:
    spark_master: str = option(LOCAL_DEFAULT, "Spark master: local[N] (N = workers), local[K], or spark://host:port")
    spark_conf: str = option("", "extra Spark settings, 'key=value,key=value'")
    fail_at_step: int = option(-1, "make the last worker's task fail at this step (fault injection; -1 = never)")
    hold: str = option("", "fault injection for tests: 'task:STEP:FILE' (the last worker's task, inside the step's "
                           "job) or 'driver:STEP:FILE' (the driver, after the step's job) creates FILE and pauses, "
                           f"up to {HOLD_S:.0f} s, so an executor can be killed at that point")
    driver_host: str = option("127.0.0.1", "address executors reach the driver at (spark.driver.host)")
    driver_bind: str = option("", "address the driver binds (spark.driver.bindAddress; default: driver_host)")
    insecure: bool = option(False, "allow a driver bound beyond loopback without a token (env PSBENCH_SPARK_TOKEN)")

    def __post_init__(self) -> None:
        if self.spark_master != LOCAL_DEFAULT and not _MASTER_RE.match(self.spark_master):
            raise ConfigError(f"option spark_master: '{self.spark_master}' is not a Spark master; "
                              "use local[N], local[K], local[*] or spark://host:port")
        parse_conf(self.spark_conf)
        Hold.parse(self.hold)

    def master(self, workers: int) -> str:
        return f"local[{workers}]" if self.spark_master == LOCAL_DEFAULT else self.spark_master

    def local_workers(self, workers: int) -> int:
        """Workers whose tasks run on this machine: all in local mode; none on a cluster master
        (spark://, yarn, k8s), whose executors' cores are the cluster's, not the driver's host's."""
        return workers if self.master(workers).startswith("local") else 0

    def driver_conf(self, token: str | None) -> dict[str, str]:
        """The driver's addresses, Spark's authentication when there is a token (its secret goes
        to get_session apart: never a --conf), then spark_conf (which may override any of them)."""
        conf = {"spark.driver.host": self.driver_host, "spark.driver.bindAddress": self.driver_bind or self.driver_host}
        if token:
            conf["spark.authenticate"] = "true"
        conf = {**conf, **parse_conf(self.spark_conf)}
        if conf.get("spark.authenticate") == "true":
            # authenticated is not encrypted: Spark's RPC and block transfers go in the clear unless
            # this is on (AES-GCM keyed from the same secret); spark_conf may still turn it off
            conf.setdefault("spark.network.crypto.enabled", "true")
        return conf


class SparkJobFailed(RuntimeError):
    """A Spark run failed (a task, a job, the JVM, a lost executor); the message is one line that
    names the first cause."""


class SparkSystem(System):
    """What every Spark adapter shares for the harness: the CPU budget counts the driver (its JVM;
    the Python side is this launcher) and, in local mode only, the workers (Python workers forked
    by pyspark's daemon); availability is pyspark's. `run` is the adapter boundary:
    the adapter's `_train` runs under it, and whatever Spark, Py4J or the JVM raises leaves it as
    one SparkJobFailed line (its cause chained, for the run's failure log); a run that loses an
    executor fails with that loss as its reason (ExecutorWatch)."""

    name = "spark"
    no_cuda_reason = "Spark's own trainers and task loops run on the host here"

    def _train(self, spec: Any, options: Any, recorder: Any) -> None:
        raise NotImplementedError

    def run(self, spec: Any, options: Any, recorder: Any) -> None:
        try:
            self._train(spec, options, recorder)
            check_executors()
        except ConfigError:
            raise
        except Exception as exc:  # noqa: BLE001 - py4j, pyspark and the JVM raise many types
            # a lost executor often fails the job before the watch's next look: it is the first cause
            lost = _WATCH.confirm_loss() if _WATCH is not None else None
            if lost:
                raise SparkJobFailed(f"{self.name}: {lost}") from exc
            if isinstance(exc, SparkJobFailed):
                raise
            raise SparkJobFailed(f"{self.name}: {error_line(exc)}") from exc
        finally:
            stop_watch()

    @staticmethod
    def cpu_processes(options: SparkOptions, workers: int) -> list[Proc]:
        return [Proc(WORKERS, workers, r"pyspark[./](daemon|worker)"), Proc("spark driver", 1, SPARK_JVM)]

    @staticmethod
    def local_workers(options: SparkOptions, workers: int) -> int:
        return options.local_workers(workers)

    @classmethod
    def unavailable_reason(cls) -> str | None:
        return pyspark_unavailable_reason()

    @classmethod
    def calibrates_here(cls) -> bool:
        return _submitted is None  # a calibration run would need a local session beside the submitted one


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
    from psbench.core.exposure import check_exposure

    check_exposure("the Spark driver", conf.get("spark.driver.bindAddress", "127.0.0.1"),
                   conf.get("spark.authenticate") == "true", insecure,
                   "set PSBENCH_SPARK_TOKEN (Spark authentication; give the master and workers the same) "
                   "or the option insecure=true")


_session_secret: str | None = None  # the authentication secret the active session was started with
_submitted: Any = None  # the SparkSession spark-submit made for this job (use_submitted_session), or None
_submitted_start_s = 0.0  # what starting it took, until a run has recorded it


def use_submitted_session(spark: Any, start_s: float = 0.0) -> None:
    """Make `spark`, the session spark-submit created for this job (in `start_s` seconds), the one
    every run uses: its master, addresses and authentication are spark-submit's, and no run starts
    or stops another. The first run records its start as a run that started its session does."""
    global _submitted, _submitted_start_s
    _submitted, _submitted_start_s = spark, start_s


def submitted_session() -> Any:
    return _submitted


def master_hosts(master: str) -> list[str]:
    """The hosts a driver on `master` talks to: none for local modes, spark://'s hosts (a list for
    a standby master), and the unknown cluster of yarn or k8s:// ('yarn', 'k8s')."""
    if master.startswith("local"):
        return []
    if master.startswith("spark://"):
        return [address_host(h) or h for h in master[len("spark://"):].split(",")]
    return ["k8s" if master.startswith("k8s://") else master]


def check_submitted_exposure(conf: dict[str, str], insecure: bool) -> None:
    """A submitted session talks beyond loopback when its master or its driver's address does: then
    it must run with Spark's authentication (the secret in spark-submit's --properties-file), or
    the run's option insecure=true; ConfigError (one line) otherwise."""
    from psbench.core.exposure import check_exposure

    auth = conf.get("spark.authenticate") == "true"
    remedy = ("submit with --conf spark.authenticate=true --conf spark.network.crypto.enabled=true and "
              "--properties-file FILE (spark.authenticate.secret=..., the cluster's secret; mode 600), "
              "or pass --insecure true")
    for host in master_hosts(conf.get("spark.master", "")):
        check_exposure(f"the submitted job's master {conf.get('spark.master')}", host, auth, insecure, remedy)
    driver = (conf.get("spark.driver.bindAddress") or conf.get("spark.driver.host") or os.environ.get("SPARK_LOCAL_IP")
              or "the machine's host name (Spark's default: no spark.driver.host)")
    check_exposure("the submitted job's driver", driver, auth, insecure, remedy)


@contextmanager
def secret_properties(secret: str | None) -> Iterator[None]:
    """spark-submit reads spark.authenticate.secret from a properties file of this user's only
    (named in PYSPARK_SUBMIT_ARGS), not from its command line; the file goes once the JVM is up."""
    if secret is None:
        yield
        return
    folder = tempfile.mkdtemp(prefix="psbench-spark-secret-")  # mode 0700
    path = Path(folder) / "secret.properties"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(f"spark.authenticate.secret={secret}\n")
    before = os.environ.get("PYSPARK_SUBMIT_ARGS")
    os.environ["PYSPARK_SUBMIT_ARGS"] = f"--properties-file {path} {before or 'pyspark-shell'}"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("PYSPARK_SUBMIT_ARGS", None)
        else:
            os.environ["PYSPARK_SUBMIT_ARGS"] = before
        shutil.rmtree(folder, ignore_errors=True)


SPARK_SECRET_LOOKUP_KEY = "sparkCookie"  # SecurityManager.SECRET_LOOKUP_KEY: the secret in the user's credentials


def pin_jvm_secret(secret: str) -> None:
    """Put `secret` where a cluster session's SecurityManager looks first, when this process's JVM
    is already up. A local-mode session with spark.authenticate makes up its own secret and leaves it
    in the JVM user's credentials, which Spark reads before spark.authenticate.secret: a cluster
    session started after it in the same JVM (a run after its CPU calibration, which runs in local
    mode) would authenticate with that one and the master would refuse it (SASL "Mismatched
    response", then "All masters are unresponsive")."""
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    if gateway is None:  # the JVM starts with this session: nothing made up yet
        return
    jvm = gateway.jvm
    credentials = jvm.org.apache.hadoop.security.Credentials()
    credentials.addSecretKey(jvm.org.apache.hadoop.io.Text(SPARK_SECRET_LOOKUP_KEY), bytearray(secret.encode()))
    jvm.org.apache.hadoop.security.UserGroupInformation.getCurrentUser().addCredentials(credentials)


def run_settings(workers: int, barrier_timeout_s: int = 300) -> dict[str, str]:
    """How a session must behave for psbench's runs, whoever starts it (a submitted job's too)."""
    return {
        "spark.ui.enabled": "false",               # its web UI would listen on every address, unauthenticated
        "spark.ui.showConsoleProgress": "false",
        "spark.task.maxFailures": "1",             # a failing task fails the run, no silent retries
        "spark.stage.maxConsecutiveAttempts": "1",
        "spark.barrier.sync.timeout": str(barrier_timeout_s),  # a lost peer cannot hang allGather forever
        "spark.scheduler.barrier.maxConcurrentTasksCheck.maxFailures": "1",
        "spark.ui.retainedJobs": "100000",         # per-step job timings are read back after the run
        "spark.ui.retainedStages": "100000",
        "spark.sql.shuffle.partitions": str(max(1, workers)),
    }


def get_session(master: str, workers: int, extra_conf: dict[str, str] | None = None,
                barrier_timeout_s: int = 300, insecure: bool = False, secret: str | None = None) -> SessionInfo:
    """The active session if it runs on `master` with `extra_conf` (and `secret`, Spark's
    authentication secret), else a fresh one."""
    global _session_secret, _submitted_start_s
    slots = _local_slots(master)
    if slots is not None and slots < workers:
        raise ConfigError(f"Spark master {master} has {slots} task slot(s), fewer than {workers} workers")
    if _submitted is not None:
        submitted_master = _submitted.sparkContext.master
        if master != submitted_master:
            raise ConfigError(f"this job's session (from spark-submit) runs on {submitted_master}; a run on {master} "
                              f"would need a second session: submit the job with --master {master}")
        start_s, _submitted_start_s = _submitted_start_s, 0.0
        return SessionInfo(_submitted, start_s, start_s == 0.0, master)
    check_driver_exposure({"spark.driver.bindAddress": "127.0.0.1", **(extra_conf or {})}, insecure)
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    extra_conf = extra_conf or {}
    active = SparkContext._active_spark_context
    if active is not None:
        conf = active.getConf()
        if active.master == master and all(conf.get(k) == v for k, v in extra_conf.items()) \
                and secret == _session_secret:
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
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.driver.extraJavaOptions": f"-Dlog4j.configurationFile=file:{LOG4J_FILE}",
        "spark.executorEnv.PYTHONPATH": env["PYTHONPATH"],
        "spark.executorEnv.OMP_NUM_THREADS": "1",
        "spark.executorEnv.PYSPARK_PYTHON": sys.executable,
        "spark.pyspark.python": sys.executable,
        **run_settings(workers, barrier_timeout_s),
        "spark.driver.memory": "2g",
        **extra_conf,
    }
    builder = SparkSession.builder
    for key, value in settings.items():
        builder = builder.config(key, value)
    start = time.perf_counter()
    if secret is not None and not master.startswith("local"):
        pin_jvm_secret(secret)
    with secret_properties(secret):
        spark = builder.getOrCreate()
    _session_secret = secret
    spark.sparkContext.setLogLevel("ERROR")
    return SessionInfo(spark, time.perf_counter() - start, False, master)


def stop_session() -> None:
    from pyspark import SparkContext

    if SparkContext._active_spark_context is not None:
        from pyspark.sql import SparkSession

        SparkSession.builder.getOrCreate().stop()


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
            # Py4J prints the JVM's exception as ': org.apache.spark.SparkException: <why>': keep <why>
            return re.sub(r"^:?\s*(org\.apache\.spark\.SparkException:\s*)?", "", line)[:500]
    return next((line for line in lines if line), type(exc).__name__)[:500]


class ExecutorWatch:
    """Ends a run that loses an executor. Spark counts an executor's loss as no task failure: its
    tasks run again elsewhere, a barrier stage is resubmitted or waits for slots, so even with
    spark.task.maxFailures=1 a lost executor means silent retries, or a hang. A thread polls the
    driver's live executors; once one it saw is gone it cancels every job (the call blocked on
    one raises at once) and keeps the loss as the run's reason."""

    def __init__(self, sc: Any, interval_s: float = 0.5):
        self.sc = sc
        self.interval_s = interval_s
        self.lost: str | None = None
        self._stop = threading.Event()
        self._seen = self._live()
        self._thread = threading.Thread(target=self._poll, name="psbench-executor-watch", daemon=True)
        self._thread.start()

    def _live(self) -> set[str]:
        ids = self.sc._jsc.sc().getExecutorIds()
        return {str(ids.apply(i)) for i in range(ids.length())}

    def _poll(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                if self._look():
                    self.sc.cancelAllJobs()
                    return
            except Exception:  # noqa: BLE001 - the context is stopping: nothing left to watch
                return

    def _look(self) -> bool:
        """Compare the live executors with those seen; True (and `lost` set) once one is gone."""
        if self.lost:
            return True
        live = self._live()
        gone = sorted(self._seen - live)
        if gone:
            self.lost = f"executor {gone[0]} was lost{self._reason(gone[0])}; the run ends (psbench retries no lost work)"
            return True
        self._seen |= live
        return False

    def confirm_loss(self, within_s: float = 3.0) -> str | None:
        """After a failed job: the loss that caused it, if the driver learns of one within `within_s`
        (it hears of a killed executor a moment after the tasks that died with it)."""
        deadline = time.monotonic() + within_s
        while True:
            try:
                if self._look():
                    return self.lost
            except Exception:  # noqa: BLE001 - the context is stopping
                return self.lost
            if time.monotonic() > deadline:
                return None
            time.sleep(0.2)

    def _reason(self, executor_id: str) -> str:
        """' on HOST: REASON' from Spark's status store, where it has them."""
        try:
            summaries = self.sc._jsc.sc().statusStore().executorList(False)
            for i in range(summaries.length()):
                entry = summaries.apply(i)
                if str(entry.id()) == executor_id:
                    reason = entry.removeReason()
                    return f" on {entry.hostPort()}" + (f": {reason.get()}" if reason.isDefined() else "")
        except Exception:  # noqa: BLE001 - the reason is a courtesy; the loss itself is known
            pass
        return ""

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


_WATCH: ExecutorWatch | None = None  # the running Spark run's watch (one run at a time per driver)


def executor_lost() -> bool:
    return _WATCH is not None and _WATCH.lost is not None


def check_executors() -> None:
    """Raise SparkJobFailed if the running run lost an executor (between jobs nothing else notices)."""
    if _WATCH is not None and _WATCH.lost:
        raise SparkJobFailed(_WATCH.lost)


def stop_watch() -> None:
    global _WATCH
    if _WATCH is not None:
        _WATCH.stop()
        _WATCH = None


def start_session(spec: Any, options: SparkOptions, recorder: Any, **session_kw: Any) -> SessionInfo:
    """The session for one run; its start-up cost goes to the manifest, not to samples/s. On a
    cluster master (executors that can be lost) an ExecutorWatch runs until the run ends."""
    global _WATCH
    from psbench.systems.common import configure_threads

    configure_threads(1)
    if _submitted is not None:  # spark-submit set the master, addresses and secret: record what it set
        conf = dict(_submitted.sparkContext.getConf().getAll())
        check_submitted_exposure(conf, options.insecure)
        session = get_session(options.master(spec.workers), spec.workers)
    else:
        token = os.environ.get("PSBENCH_SPARK_TOKEN") or None
        conf = options.driver_conf(token)
        session = get_session(options.master(spec.workers), spec.workers, conf, insecure=options.insecure,
                              secret=token, **session_kw)
    recorder.extra.update(spark_session_start_s=session.start_s, spark_session_reused=session.reused,
                          spark_master=session.master, spark_driver=conf.get("spark.driver.host", ""),
                          spark_submitted=_submitted is not None,
                          spark_auth="token" if conf.get("spark.authenticate") == "true" else
                          "insecure" if options.insecure else "loopback",
                          # read back from the running JVM's conf: what the RPC really does
                          spark_network_crypto=session.spark.conf.get("spark.network.crypto.enabled", "false") == "true")
    stop_watch()
    if not session.master.startswith("local"):
        _WATCH = ExecutorWatch(session.spark.sparkContext)
    return session
