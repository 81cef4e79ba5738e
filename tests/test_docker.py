"""docker/, checked without an engine (fast, in `make test`): the compose file's structure,
scalability, network range and token, the Dockerfile's base argument and offline path, and every
command against the real parsers. tests/test_docker_run.py builds and runs it all for real
(`make test-docker`)."""
from __future__ import annotations

import argparse
import functools
import ipaddress
import re
import shlex
import zipfile
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
DOCKER = ROOT / "docker"
COMPOSE = yaml.safe_load((DOCKER / "docker-compose.yml").read_text())
SERVICES = COMPOSE["services"]
DOCKERFILE = (DOCKER / "Dockerfile").read_text()
JOB_FLAGS = ("--workers", "--workload", "--max-steps", "--seed")

# Flags of Spark's standalone daemons (MasterArguments.scala, WorkerArguments.scala in Spark 4).
SPARK_CLASSES = {
    "master": {"--host", "-h", "--port", "-p", "--webui-port", "--properties-file"},
    "worker": {"--host", "-h", "--port", "-p", "--cores", "-c", "--memory", "-m",
               "--work-dir", "-d", "--webui-port", "--properties-file"},
}


def expand(text: str, **env: str) -> str:
    """Compose interpolation, every variable at its default unless given: ${VAR:-default} -> default;
    $$ is a literal $ (left for the container's shell)."""
    def sub(m: re.Match) -> str:
        if m.group(1) in env:
            return env[m.group(1)]
        if m.group(2) is None:
            raise AssertionError(f"${{{m.group(1)}}} has no default; use ${{{m.group(1)}:-value}}")
        return m.group(2)
    parts = text.split("$$")
    return "$".join(re.sub(r"\$\{(\w+)(?::-([^}]*))?\}", sub, part) for part in parts)


def commands_of(service: str, **env: str) -> list[list[str]]:
    """The command(s) a service runs: its argv, or each psbench command of its `sh -c` loop."""
    command = SERVICES[service]["command"]
    if isinstance(command, list) and command[:1] == ["sh"]:
        script = expand(command[-1], **env)
        body = re.search(r"do (.*?);\s*done", script, re.S).group(1)
        return [shlex.split(body.replace("$system", system).replace("${PSBENCH_INSECURE:+--insecure true}", ""))
                for system in re.search(r"for system in (.*?); do", script).group(1).split()]
    return [shlex.split(expand(command if isinstance(command, str) else " ".join(command), **env))]


def argv_of(service: str, **env: str) -> list[str]:
    (argv,) = commands_of(service, **env)
    return argv


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


@functools.lru_cache(maxsize=1)
def psbench_parser() -> argparse.ArgumentParser:
    from psbench.bench.cli import build_parser

    return build_parser()


def test_services_scaling_and_network():
    assert {"ps-server", "worker", "ps-job", "spark-master", "spark-worker", "spark-driver"} == set(SERVICES)
    for name in ("worker", "spark-worker"):  # `--scale` starts identical replicas
        svc = SERVICES[name]
        assert "container_name" not in svc, f"{name}: a fixed container_name breaks --scale"
        assert "hostname" not in svc, f"{name}: a fixed hostname makes replicas indistinguishable"
        for port in svc.get("ports", []):
            assert ":" not in str(port), f"{name}: fixed host port {port} breaks --scale"
    for name, svc in SERVICES.items():
        for dep in svc.get("depends_on", []):
            assert dep in SERVICES, f"{name} depends on unknown service {dep}"
        assert svc["networks"] == ["psbench"], f"{name} must be on the psbench network"
        assert svc.get("init") is True, f"{name}: without an init, PID 1 ignores SIGTERM"
    assert {n for n, s in SERVICES.items() if "spark" in s.get("profiles", [])} == {"spark-master", "spark-worker",
                                                                                    "spark-driver"}
    # Servers are found by name: the workers' and the finisher's --servers and the Spark URLs name real services.
    for name in ("worker", "ps-job"):
        assert flag(argv_of(name), "--servers").split(":")[0] in SERVICES
    assert argv_of("spark-worker")[-1].startswith("spark://spark-master:")
    (subnet,) = [c["subnet"] for c in COMPOSE["networks"]["psbench"]["ipam"]["config"]]
    assert ipaddress.ip_network(expand(subnet)).subnet_of(ipaddress.ip_network("198.18.0.0/15"))


def test_daemon_json_keeps_docker_in_the_benchmark_range():
    import json

    conf = json.loads((DOCKER / "daemon.json").read_text())
    allowed = ipaddress.ip_network("198.18.0.0/15")
    assert ipaddress.ip_interface(conf["bip"]).network.subnet_of(allowed)
    assert all(ipaddress.ip_network(p["base"]).subnet_of(allowed) for p in conf["default-address-pools"])
    assert conf["iptables"] is False and conf["ip-forward"] is False  # the host's firewall is left alone


def test_one_image_built_from_the_dockerfile():
    images = {svc["image"] for svc in SERVICES.values()}
    builds = {(svc["build"]["context"], svc["build"]["dockerfile"]) for svc in SERVICES.values()}
    assert len(images) == 1 and expand(images.pop()) == "psbench:latest"
    assert len(builds) == 1
    context, dockerfile = builds.pop()
    assert (DOCKER / context / dockerfile).resolve() == (DOCKER / "Dockerfile").resolve()
    assert expand(SERVICES["worker"]["build"]["args"]["BASE"]) == "python:3.11-slim"


def test_dockerfile_base_argument_and_offline_path():
    assert re.search(r"^ARG BASE=python:3\.11-slim$", DOCKERFILE, re.M), "a normal public base by default"
    assert re.findall(r"^FROM (\S+)", DOCKERFILE, re.M) == ["${BASE}", "${BASE}"]
    # the pins come from pyproject (one source of truth); CPU torch from the CPU index without a wheelhouse
    assert "tomllib.load(open('/tmp/pyproject.toml'" in DOCKERFILE
    assert "--index-url https://download.pytorch.org/whl/cpu \"$torch\"" in DOCKERFILE
    assert "export PIP_NO_INDEX=1 PIP_FIND_LINKS=/wheels" in DOCKERFILE
    assert "torchvision" not in DOCKERFILE
    ignore = (ROOT / ".dockerignore").read_text().split()
    for src in re.findall(r"^COPY (?!--from)(\S+)", DOCKERFILE, re.M):
        assert (ROOT / src).exists(), f"COPY {src}: not in the repository"
        assert f"!{src.rstrip('/')}/" in ignore or f"!{src}" in ignore, f"COPY {src}: excluded by .dockerignore"


def test_psbench_commands_parse():
    parser = psbench_parser()
    for service in ("ps-server", "worker", "ps-job", "spark-driver"):
        for argv in commands_of(service):
            assert argv[0] == "psbench", f"{service}: {argv}"
            try:
                args = parser.parse_args(argv[1:])
            except SystemExit as exc:
                pytest.fail(f"{service}: `{shlex.join(argv)}` is rejected by the psbench parser (exit {exc.code})")
            if argv[1] == "run":
                from psbench.bench.cli import options_from_args

                options = options_from_args(args, args.system)  # system options such as --spark-master apply
                assert options["driver_host"] == "spark-driver" and options["driver_bind"] == "0.0.0.0"


def test_finisher_command_parses_and_matches_the_workers():
    argv = argv_of("ps-job")
    assert argv[:2] == ["psbench", "ps-job"]
    args = psbench_parser().parse_args(argv[1:])
    worker = argv_of("worker")
    for name in JOB_FLAGS:  # the finisher rebuilds the workers' job: the same flags, the same values
        assert flag(argv, name) == flag(worker, name), name
    assert flag(argv, "--consistency") == flag(argv_of("ps-server"), "--consistency")
    assert args.scratch == str(Path(flag(worker, "--out")).parent)
    assert "{worker}" in flag(worker, "--out"), "replicas must not write the same file"
    # JOB_ARGS reaches both alike
    extra = argv_of("worker", JOB_ARGS="--epochs 7")
    assert flag(extra, "--epochs") == flag(argv_of("ps-job", JOB_ARGS="--epochs 7"), "--epochs") == "7"
    # a lost worker fails the job unless a fault experiment says otherwise
    assert args.tolerate_worker_loss is False
    tolerant = argv_of("ps-job", TOLERATE_WORKER_LOSS="--tolerate-worker-loss")
    assert psbench_parser().parse_args(tolerant[1:]).tolerate_worker_loss is True


def test_ps_workers_scale_with_runtime_ids():
    server, worker = argv_of("ps-server"), argv_of("worker")
    assert flag(worker, "--worker-id") == "auto" and "--init" in worker
    assert flag(worker, "--workers") == flag(server, "--workers")
    assert flag(server, "--bind").startswith("0.0.0.0:")


def test_each_system_gets_its_own_secret_from_the_environment():
    """The PS and Spark have separate secrets, and each service holds only its own system's."""
    for name, svc in SERVICES.items():
        env = svc["environment"]
        own, other = ("PSBENCH_SPARK_TOKEN", "PSBENCH_PS_TOKEN") if name.startswith("spark") else \
            ("PSBENCH_PS_TOKEN", "PSBENCH_SPARK_TOKEN")
        assert env[own] == f"${{{own}:-}}" and other not in env, name
    # PSBENCH_INSECURE=--insecure is the only way round the token, and it reaches every exposed role
    for name in ("ps-server", "ps-job", "spark-master", "spark-worker"):
        assert "--insecure" in argv_of(name, PSBENCH_INSECURE="--insecure"), name
        assert "--insecure" not in argv_of(name), name


@pytest.mark.parametrize("service", ["spark-master", "spark-worker"])
def test_spark_daemon_commands(service: str):
    """Run through systems.spark.daemon: spark-class ships with pyspark, the class exists in its
    jars, and every flag is one the class takes."""
    import pyspark

    from psbench.systems.spark import daemon

    argv = argv_of(service)
    assert argv[:3] == ["python", "-m", "psbench.systems.spark.daemon"]
    cmd, env = daemon.command(argv[3:], {"PSBENCH_SPARK_TOKEN": "t"})
    assert Path(cmd[0]).is_file() and "-Dspark.authenticate=true" in env["SPARK_DAEMON_JAVA_OPTS"]
    home = Path(pyspark.__file__).parent
    entry = cmd[1].replace(".", "/") + ".class"
    assert any(entry in zipfile.ZipFile(jar).namelist() for jar in (home / "jars").glob("spark-core_*.jar")), \
        f"{cmd[1]} is not in pyspark's spark-core jar"
    flags = [a for a in cmd[2:] if a.startswith("-")]
    assert set(flags) <= SPARK_CLASSES[argv[3]], f"{service}: unknown flags {set(flags) - SPARK_CLASSES[argv[3]]}"


def test_expand():
    assert expand("a ${X:-1} b ${Y:-two} $$z") == "a 1 b two $z"
    assert expand("${X:-1}", X="9") == "9"
    with pytest.raises(AssertionError, match="no default"):
        expand("${X}")
