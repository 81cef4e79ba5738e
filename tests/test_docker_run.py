"""docker/ for real: starts dockerd when none answers, builds the image offline (`make docker-image`:
a debootstrap base, a host-built wheelhouse, `docker build --network none`), then runs the compose
file: a PS job to the end, a worker container killed under asp (the job finishes) and under bsp
(one clear error), a server refusing to listen beyond loopback without a token, and the Spark
profile (standalone master, 2 workers, a driver running spark-mllib and spark-barrier).

Marked `docker` (left out of a plain pytest run; `make test-docker` runs it, and so does .ci/run).
Where no engine can be had it fails in CI (CI=true) and skips, saying why, elsewhere. Timings of
each phase are printed (run with -s) for the build-time figures.
"""
from __future__ import annotations

import ipaddress
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from psbench.core.tables import read_table, table_files

pytestmark = pytest.mark.docker

ROOT = Path(__file__).resolve().parent.parent
COMPOSE_FILE = ROOT / "docker" / "docker-compose.yml"
ALLOWED_NET = ipaddress.ip_network("198.18.0.0/15")
TIMINGS: dict[str, float] = {}


def _run(argv: list[str], timeout: float = 600, check: bool = True, **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run(argv, cwd=kw.pop("cwd", ROOT), capture_output=True, text=True, timeout=timeout, **kw)
    if check and proc.returncode != 0:
        raise AssertionError(f"`{' '.join(argv)}` exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


def _no_engine(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"docker test cannot run in CI: {reason}")
    pytest.skip(reason)


def compose_base() -> list[str]:
    if subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    _no_engine("neither `docker compose` nor docker-compose is installed (bash docker/ci-setup.sh)")
    raise AssertionError  # not reached


@pytest.fixture(scope="module")
def engine():
    """A Docker engine that answers: dockerd is started here when none does, and stopped at the end."""
    if not shutil.which("docker") or not shutil.which("dockerd"):
        _no_engine("the Docker engine is not installed (bash docker/ci-setup.sh installs Debian's docker.io)")
    if os.geteuid() != 0 and subprocess.run(["docker", "info"], capture_output=True).returncode != 0:
        _no_engine("no Docker engine answers and starting dockerd needs root")
    out = _run(["bash", "docker/dockerd.sh"], timeout=120).stdout.strip().splitlines()[-1]
    started = int(out.split()[1]) if out.startswith("started") else None
    yield compose_base()
    if started is not None:
        os.kill(started, 15)
        for _ in range(60):
            try:
                os.kill(started, 0)
            except ProcessLookupError:
                break
            time.sleep(0.5)


@pytest.fixture(scope="module")
def image(engine):
    """`make docker-image`, timed: a cold build where the base/wheelhouse/image are missing, then
    a second, cached one."""
    make = ["make", "docker-image", f"PYTHON={sys.executable}"]
    t0 = time.perf_counter()
    _run(make, timeout=1800)
    TIMINGS["make docker-image (first)"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    _run(make, timeout=600)
    TIMINGS["make docker-image (cached)"] = time.perf_counter() - t0
    yield engine
    print("\ndocker test timings (s): " + ", ".join(f"{k} {v:.1f}" for k, v in TIMINGS.items()))


class Compose:
    """One compose project (its own name and results folder); `down` removes its containers and network."""

    def __init__(self, base: list[str], name: str, results: Path, **env: str):
        self.base, self.name, self.results = base, name, results
        self.env = {**os.environ, "RESULTS_DIR": str(results), "PSBENCH_PS_TOKEN": secrets.token_hex(16),
                    "PSBENCH_SPARK_TOKEN": secrets.token_hex(16),
                    "PSBENCH_INSECURE": "", **env}

    def __call__(self, *args: str, timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess:
        return _run([*self.base, "-f", str(COMPOSE_FILE), "-p", self.name, *args], timeout=timeout, check=check,
                    env=self.env)

    def containers(self, service: str) -> list[str]:
        return self("ps", "-q", service).stdout.split()

    def exit_code(self, container: str) -> int:
        return int(_run(["docker", "inspect", "-f", "{{.State.ExitCode}}", container]).stdout)

    def logs(self, container: str) -> str:
        proc = _run(["docker", "logs", container])
        return proc.stdout + proc.stderr

    def addresses(self) -> list[str]:
        net = f"{self.name}_psbench"
        info = json.loads(_run(["docker", "network", "inspect", net]).stdout)[0]
        return ([c["Subnet"] for c in info["IPAM"]["Config"]] +
                [c["IPv4Address"] for c in info.get("Containers", {}).values()])

    def down(self) -> None:
        self("--profile", "spark", "down", "--remove-orphans", "-t", "5", check=False)

    def wait(self, container: str, timeout: float) -> int:
        return int(_run(["docker", "wait", container], timeout=timeout).stdout.strip())


def _in_allowed_range(addresses: list[str]) -> None:
    assert addresses
    for a in addresses:
        assert ipaddress.ip_network(a, strict=False).subnet_of(ALLOWED_NET), f"{a} is outside 198.18.0.0/15"


def _run_folder(suite_dir: Path) -> Path:
    runs = [p.parent for p in suite_dir.glob("*/manifest.json")]
    assert len(runs) == 1, f"expected one run folder in {suite_dir}, found {runs}"
    return runs[0]


@pytest.fixture
def project(image, tmp_path, request):
    made: list[Compose] = []

    def make(**env: str) -> Compose:
        name = re.sub(r"[^a-z0-9]", "", request.node.name.lower())[:40]
        job = Compose(image, f"psb{name}", tmp_path / "results", **env)
        job.down()  # a leftover of an interrupted run holds the subnet
        made.append(job)
        return job

    yield make
    for job in made:
        job.down()


def test_ps_job_runs_to_the_end(project):
    """Three workers register, train, say bye; the server is shut down; one ordinary run folder."""
    job = project(WORKERS="3", WORKLOAD="mlp-higgs-synthetic", MAX_STEPS="120", CONSISTENCY="asp")
    t0 = time.perf_counter()
    job("up", "--scale", "worker=3", timeout=600)  # returns only once every container has exited
    TIMINGS["compose PS job (3 workers)"] = time.perf_counter() - t0
    containers = {s: job.containers(s) for s in ("ps-server", "worker", "ps-job")}
    assert len(containers["worker"]) == 3
    assert {c: job.exit_code(c) for cs in containers.values() for c in cs} == {c: 0 for cs in containers.values() for c in cs}
    _in_allowed_range(job.addresses())
    run = _run_folder(job.results / "compose")
    assert {p.name for p in run.iterdir()} >= {"manifest.json", "shards.json"}
    assert set(table_files(run)) >= {"steps", "evals", "events"}  # in the default record format
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["spec"]["system"] == "ps" and manifest["spec"]["workers"] == 3
    assert manifest["spec"]["options"] == {"consistency": "asp", "servers": 1, "launcher": "compose"}
    assert manifest["extra"]["compose"]["finished"] == [0, 1, 2] and manifest["extra"]["compose"]["auth"] == "token"
    steps = read_table(run, "steps")
    assert sorted(steps.worker.unique()) == [0, 1, 2] and (steps.groupby("worker").size() == 120).all()
    assert manifest["extra"]["ps"]["shards"][0]["applied"] == 360  # every push applied once
    assert manifest["summary"]["samples_per_s"] > 0 and set(read_table(run, "evals").split) == {"train", "val"}
    report = _run([sys.executable, "-m", "psbench", "report", str(job.results / "compose")], timeout=300)
    assert (job.results / "compose" / "report.md").is_file(), report.stdout


def test_server_without_token_refuses_to_listen(project):
    """The server binds 0.0.0.0 inside its container: without PSBENCH_PS_TOKEN it exits with one line."""
    job = project(PSBENCH_PS_TOKEN="")
    proc = job("run", "--rm", "--no-deps", "ps-server", check=False, timeout=180)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert re.search(r"psbench: error: ps-server --bind 0\.0\.0\.0:5555 binds 0\.0\.0\.0, which is reachable "
                     r"from other hosts: give a token", proc.stdout + proc.stderr), proc.stdout + proc.stderr


def _server_stats(job: Compose) -> dict:
    """Shard 0's stats, asked from this host over the compose network's bridge (with the token)."""
    from psbench.systems.ps.worker import ADMIN, KVWorker

    server = job.containers("ps-server")[0]
    ip = _run(["docker", "inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}", server]).stdout
    with KVWorker([f"{ip.strip()}:5555"], ADMIN, [], job.env["PSBENCH_PS_TOKEN"], timeout_s=10.0) as kv:
        return kv.stats()[0]


def _kill_one_worker_mid_run(job: Compose, n: int, victim_id: int = 1, timeout: float = 300) -> int:
    """Once the server has heard every worker train (its stats), SIGKILL worker `victim_id`'s
    container (a host dying); returns its id."""
    deadline = time.monotonic() + timeout
    while True:
        assert time.monotonic() < deadline, "the workers did not all start training"
        try:
            stats = _server_stats(job)
        except Exception:  # not listening yet
            stats = {}
        if len(stats.get("idle_s", {})) == n and stats.get("applied", 0) >= 30 * n:
            break
        time.sleep(1)
    assert not stats["finished"], f"a worker finished before the kill: {stats['finished']}"
    victim = next(c for c in job.containers("worker") if f"registered as worker {victim_id} " in job.logs(c))
    _run(["docker", "kill", victim])
    return victim_id


LONG_JOB = dict(WORKERS="3", WORKLOAD="mlp-higgs-synthetic", MAX_STEPS="100000", JOB_ARGS="--epochs 30",
                LOST_AFTER_S="10", STEP_TIMEOUT_S="5")


def test_asp_job_finishes_without_a_killed_worker(project):
    job = project(**LONG_JOB, CONSISTENCY="asp", TOLERATE_WORKER_LOSS="--tolerate-worker-loss")
    job("up", "-d", "--scale", "worker=3")
    lost = _kill_one_worker_mid_run(job, 3)
    finisher = job.containers("ps-job")[0]
    assert job.wait(finisher, 600) == 0, job.logs(finisher)
    run = _run_folder(job.results / "compose")
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["extra"]["compose"]["lost"] == [lost] == manifest["summary"]["lost_workers"]
    events = read_table(run, "events")
    assert list(events.kind) == ["worker_lost"] and list(events.worker) == [lost]
    steps = read_table(run, "steps")
    assert lost not in set(steps.worker) and len(set(steps.worker)) == 2
    # the lost worker trained before it died: the server applied more pushes than the others made
    assert manifest["extra"]["ps"]["shards"][0]["applied"] > len(steps)
    server = job.containers("ps-server")[0]
    assert job.wait(server, 60) == 0


def test_bsp_job_ends_with_one_clear_error(project):
    job = project(**LONG_JOB, CONSISTENCY="bsp")
    job("up", "-d", "--scale", "worker=3")
    lost = _kill_one_worker_mid_run(job, 3)
    finisher = job.containers("ps-job")[0]
    assert job.wait(finisher, 300) == 1
    last = job.logs(finisher).strip().splitlines()[-1]
    assert re.fullmatch(rf"psbench: run failed: under bsp a lost worker stops the job; worker\(s\) \[{lost}\] "
                        rf"silent for over 10s; server: bsp: timed out after 5s waiting for worker\(s\) \[{lost}\]",
                        last), last
    assert job.wait(job.containers("ps-server")[0], 60) == 0  # told to shut down: compose up ends
    assert not (job.results / "compose").exists() or not list((job.results / "compose").glob("*/manifest.json"))


def test_spark_profile_runs_mllib_and_barrier_on_a_standalone_cluster(project):
    job = project(SPARK_SYSTEMS="spark-mllib spark-barrier", SPARK_WORKERS="2", SPARK_MAX_STEPS="10")
    t0 = time.perf_counter()
    proc = job("--profile", "spark", "up", "--scale", "spark-worker=2", "--exit-code-from", "spark-driver",
               "spark-driver", timeout=900, check=False)
    TIMINGS["compose spark profile (2 systems)"] = time.perf_counter() - t0
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    assert len(job.containers("spark-worker")) == 2
    _in_allowed_range(job.addresses())
    suite = job.results / "compose-spark"
    runs = {json.loads(m.read_text())["spec"]["system"]: m.parent for m in suite.glob("*/manifest.json")}
    assert set(runs) == {"spark-mllib", "spark-barrier"}
    for system, run in runs.items():
        manifest = json.loads((run / "manifest.json").read_text())
        extra = manifest["extra"]
        assert extra["spark_master"] == "spark://spark-master:7077" and extra["spark_auth"] == "token"
        assert extra["spark_driver"] == "spark-driver"
        steps = read_table(run, "steps")
        assert sorted(steps.worker.unique()) == [0, 1] and sorted(steps.step.unique()) == list(range(10)), system
        assert set(read_table(run, "evals").split) == {"train", "val"}
