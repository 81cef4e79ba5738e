"""deploy/k8s's PyTorchJobs: their shape (fast), and each replica's container command run with the
environment the Kubeflow training operator (v1) sets for it, in namespace hosts (slow).

`operator_env` is training-operator v1.9.0's pkg/controller.v1/pytorch/envvar.go and master.go
(setPodEnv, MasterEnvVarGenerator) for a job with a Master and no elasticPolicy, read from the
manifest. What the slow test does not reproduce, as no cluster, operator or image is here:
- the Master's DNS name `<job>-master-0` (MASTER_ADDR, PET_MASTER_ADDR) is host 0's 198.18 address;
- the checkout instead of the image: `torchrun` is `python -m torch.distributed.run` of this
  virtualenv, psbench imported from the checkout (PYTHONPATH), on the test's own environment less
  every engine variable (RANK, MASTER_*, PET_*, TORCHELASTIC_*, SLURM_*, OMPI_*, the token);
- each volume is a folder: the PVC one, the Secret one (its file written with the manifest's
  defaultMode), the emptyDir one a replica; mount paths in the arguments point at them;
- GLOO_SOCKET_IFNAME=veth0: the namespace hosts share the machine's hostname, which gloo would
  resolve to an address not in them (a pod's hostname resolves to the pod's address)."""
from __future__ import annotations

import itertools
import json
import re
import secrets
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from psbench.bench.harness.results import load_suite
from psbench.bench.lab import netlab
from psbench.bench.lab.launch.env import read_env
from psbench.bench.lab.launch.run import SHARD_PORT_OFFSET
from psbench.core.errors import ConfigError
from suite_helpers import assert_local_columns, recorded_locally

DEPLOY = Path(__file__).resolve().parent.parent / "deploy" / "k8s"
JOB_FILES = {"ddp": "pytorchjob-ddp.yaml", "ps": "pytorchjob-ps.yaml"}
# The operator's defaults (pkg/apis/kubeflow.org/v1: pytorch_types.go, pytorch_defaults.go)
CONTAINER, PORT_NAME, DEFAULT_PORT, DEFAULT_NPROC = "pytorch", "pytorchjob-port", 23456, "auto"
ENGINE_VARIABLES = re.compile(r"^(RANK|WORLD_SIZE|LOCAL_RANK|LOCAL_WORLD_SIZE|GROUP_RANK|MASTER_ADDR|MASTER_PORT|"
                              r"PET_.*|TORCHELASTIC_.*|SLURM_.*|OMPI_.*|PSBENCH_PS_TOKEN|GLOO_SOCKET_IFNAME)$")


def documents(name: str) -> list[dict]:
    return [doc for doc in yaml.safe_load_all((DEPLOY / name).read_text()) if doc]


def pytorchjob(system: str) -> dict:
    [job] = [doc for doc in documents(JOB_FILES[system]) if doc["kind"] == "PyTorchJob"]
    return job


def replicas(job: dict) -> list[tuple[str, int]]:
    """(replica type, index) of every pod the operator makes: the Master, then Worker 0, 1, ..."""
    specs = job["spec"]["pytorchReplicaSpecs"]
    return [(rtype, i) for rtype in ("Master", "Worker") if rtype in specs for i in range(specs[rtype].get("replicas", 1))]


def container(job: dict, rtype: str) -> dict:
    [found] = [c for c in job["spec"]["pytorchReplicaSpecs"][rtype]["template"]["spec"]["containers"]
               if c["name"] == CONTAINER]
    return found


def operator_env(job: dict, rtype: str, index: int) -> dict[str, str]:
    """What the operator adds to the container's environment of replica `rtype` `index`."""
    specs, name = job["spec"]["pytorchReplicaSpecs"], job["metadata"]["name"]
    assert "Master" in specs and "elasticPolicy" not in job["spec"], "envvar.go's other branches are not modelled"
    total = sum(spec.get("replicas", 1) for spec in specs.values())
    nproc = str(job["spec"].get("nprocPerNode", DEFAULT_NPROC))
    nproc_int = int(nproc) if nproc.isdigit() else 1                      # getNprocPerNodeInt
    port = next((p["containerPort"] for p in container(job, "Master").get("ports", []) if p["name"] == PORT_NAME),
                DEFAULT_PORT)                                                # getPortFromPyTorchJob, defaulted
    master = f"{name}-master-0".replace("/", "-")                          # replicaName(job, Master, 0)
    rank = index + (1 if rtype == "Worker" else 0)
    return {"PYTHONUNBUFFERED": "1", "MASTER_PORT": str(port), "PET_MASTER_PORT": str(port), "MASTER_ADDR": master,
            "PET_MASTER_ADDR": master, "WORLD_SIZE": str(total * nproc_int), "RANK": str(rank),
            "PET_NODE_RANK": str(rank), "PET_NPROC_PER_NODE": nproc, "PET_NNODES": str(total)}


def container_env(job: dict, rtype: str, index: int) -> dict[str, str]:
    """The container's environment in its pod: the manifest's own entries, then the operator's
    (appended after them, as setPodEnv does)."""
    own = container(job, rtype).get("env", [])
    assert all("value" in e for e in own), "valueFrom is not modelled"
    return {**{e["name"]: str(e["value"]) for e in own}, **operator_env(job, rtype, index)}


def volumes(job: dict, rtype: str) -> dict[str, tuple[str, dict]]:
    """mount path -> (volume name, volume) of the replica type's container."""
    pod = job["spec"]["pytorchReplicaSpecs"][rtype]["template"]["spec"]
    by_name = {v["name"]: v for v in pod.get("volumes", [])}
    return {m["mountPath"]: (m["name"], by_name[m["name"]]) for m in container(job, rtype).get("volumeMounts", [])}


def arg_after(argv: list[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv else None


# ---- shape (fast) ----------------------------------------------------------------------------------

@pytest.mark.parametrize("system", sorted(JOB_FILES))
def test_manifest_shape(system):
    docs = documents(JOB_FILES[system])
    assert sorted(d["kind"] for d in docs) == ["NetworkPolicy", "PyTorchJob"]
    job = pytorchjob(system)
    assert job["apiVersion"] == "kubeflow.org/v1" and job["spec"]["nprocPerNode"] == "1"
    specs, name = job["spec"]["pytorchReplicaSpecs"], job["metadata"]["name"]
    assert set(specs) == {"Master", "Worker"} and specs["Master"]["replicas"] == 1 and specs["Worker"]["replicas"] >= 1
    [policy] = [d for d in docs if d["kind"] == "NetworkPolicy"]
    label = {"training.kubeflow.org/job-name": name}
    assert policy["spec"]["podSelector"]["matchLabels"] == label
    assert policy["spec"]["ingress"] == [{"from": [{"podSelector": {"matchLabels": label}}]}]
    [claim] = documents("results-pvc.yaml")
    for rtype, spec in specs.items():
        box = container(job, rtype)
        argv = box["command"] + box["args"]
        assert spec["restartPolicy"] == "Never"
        assert box["image"] == "psbench:latest" and box["imagePullPolicy"] == "IfNotPresent"
        assert argv[:4] == ["torchrun", "-m", "psbench", "launch"] and arg_after(argv, "--system") == system
        mounts = volumes(job, rtype)
        results = mounts[arg_after(argv, "--results-dir")][1]
        if rtype == "Master":   # rank 0 writes the run onto the claim; the Workers only stage
            assert results["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
        else:
            assert results == {"name": "results", "emptyDir": {}}
        if system == "ddp":
            assert arg_after(argv, "--insecure") == "true" and "--token-file" not in argv
            continue
        assert arg_after(argv, "--servers") == "1" and "--insecure" not in argv
        token_file = Path(arg_after(argv, "--token-file"))   # a file of the Secret, only its owner reads
        secret = mounts[str(token_file.parent)][1]["secret"]
        assert secret["defaultMode"] in (0o400, 0o600) and secret["items"] == [{"key": "token", "path": token_file.name}]
        assert secret["secretName"] == "psbench-ps-token"
        assert next(m for m in box["volumeMounts"] if m["mountPath"] == str(token_file.parent))["readOnly"] is True
    if system == "ps":   # the shard's port, declared on the Master, is the one launch gives shard 0
        ports = {p["name"]: p["containerPort"] for p in container(job, "Master")["ports"]}
        assert ports["ps-shard"] == ports[PORT_NAME] + SHARD_PORT_OFFSET


@pytest.mark.parametrize("name", [*JOB_FILES.values(), "results-pvc.yaml"])
def test_no_token_in_any_manifest(name):
    text = (DEPLOY / name).read_text()
    docs = documents(name)
    assert not [d for d in docs if d["kind"] == "Secret"]
    assert not re.search(r"\b[0-9a-fA-F]{32,}\b", text), "something like a token"
    for doc in docs:
        if doc["kind"] != "PyTorchJob":
            continue
        for rtype in doc["spec"]["pytorchReplicaSpecs"]:
            box = container(doc, rtype)
            assert not [e for e in box.get("env", []) if "TOKEN" in e["name"].upper()]
            assert "--token" not in box["command"] + box["args"]


def test_operator_env_of_a_ps_worker_and_why_torchrun_runs_first():
    job = pytorchjob("ps")
    env = operator_env(job, "Worker", 1)
    assert env == {"PYTHONUNBUFFERED": "1", "MASTER_PORT": "23456", "PET_MASTER_PORT": "23456",
                   "MASTER_ADDR": "psbench-ps-master-0", "PET_MASTER_ADDR": "psbench-ps-master-0", "WORLD_SIZE": "3",
                   "RANK": "2", "PET_NODE_RANK": "2", "PET_NPROC_PER_NODE": "1", "PET_NNODES": "3"}
    # the operator sets no LOCAL_RANK: `psbench launch` alone would stop; torchrun sets it
    with pytest.raises(ConfigError, match="LOCAL_RANK unset"):
        read_env(env)
    # nprocPerNode left out: the operator's default "auto", world size counted as one rank a pod
    bare = {**job, "spec": {k: v for k, v in job["spec"].items() if k != "nprocPerNode"}}
    assert operator_env(bare, "Master", 0)["PET_NPROC_PER_NODE"] == "auto"
    assert operator_env(bare, "Master", 0)["WORLD_SIZE"] == "3"


# ---- the container commands in namespace hosts (slow) ------------------------------------------------

def replica_command(job: dict, rtype: str, index: int, root: Path, token: str) -> tuple[list[str], Path]:
    """The container's argv with its mount paths turned into folders under root (made here), and
    its working directory (the image's WORKDIR, /results: the results volume's folder)."""
    box = container(job, rtype)
    argv = box["command"] + box["args"]
    folders = {}
    for mount, (name, volume) in volumes(job, rtype).items():
        if "persistentVolumeClaim" in volume:
            folder = root / "pvc" / volume["persistentVolumeClaim"]["claimName"]
        elif "secret" in volume:   # one folder a Secret: the ranks' --token-file is one path, as in pods
            folder = root / "secret" / volume["secret"]["secretName"]
        else:
            folder = root / f"{rtype.lower()}-{index}" / name
        folder.mkdir(parents=True, exist_ok=True)
        for item in volume.get("secret", {}).get("items", []):
            if not (folder / item["path"]).exists():   # the replicas' one Secret
                (folder / item["path"]).write_text(token + "\n")
                (folder / item["path"]).chmod(volume["secret"]["defaultMode"])
        folders[mount] = folder
    for i, arg in enumerate(argv):
        for mount, folder in folders.items():
            if arg == mount or arg.startswith(mount + "/"):
                argv[i] = str(folder) + arg[len(mount):]
    assert argv[0] == "torchrun"
    return [sys.executable, "-m", "torch.distributed.run", *argv[1:]], folders[arg_after(box["args"], "--results-dir")]


def start_job(lab, system: str, root: Path, first_host: int) -> tuple[list[subprocess.Popen], str]:
    """Every replica of the job's manifest on its own namespace host, the Master on `first_host`,
    its output in root/logs/<replica>.log; the processes and the job's token."""
    from psbench.systems.common import child_env

    job, token = pytorchjob(system), secrets.token_hex(16)
    base = {k: v for k, v in child_env().items() if not ENGINE_VARIABLES.match(k)}
    master, procs = f"{job['metadata']['name']}-master-0", []
    for host, (rtype, index) in enumerate(replicas(job), start=first_host):
        argv, cwd = replica_command(job, rtype, index, root, token)
        env = {**base, **{k: lab.addr(first_host) if v == master else v
                          for k, v in container_env(job, rtype, index).items()}, "GLOO_SOCKET_IFNAME": "veth0"}
        (root / "logs").mkdir(exist_ok=True)
        with open(root / "logs" / f"{rtype.lower()}-{index}.log", "wb") as log:
            procs.append(lab.exec(host, argv, env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT))
    return procs, token


def wait_jobs(started: dict[str, list[subprocess.Popen]], began: float, timeout_s: float) -> dict[str, float]:
    """Until every process has ended; each job's wall time from `began` to its last replica's end."""
    ended: dict[str, float] = {}
    while len(ended) < len(started):
        for system, procs in started.items():
            if system not in ended and all(p.poll() is not None for p in procs):
                ended[system] = time.monotonic() - began
        assert time.monotonic() - began < timeout_s, f"jobs not done after {timeout_s} s: {set(started) - set(ended)}"
        time.sleep(0.1)
    return ended


def check_job(system: str, root: Path, procs: list[subprocess.Popen], token: str) -> dict:
    """Every replica ended well, rank 0 wrote one run folder onto the claim's folder, with a local
    run's columns, and the workers' emptyDirs kept nothing; the run's manifest."""
    job = pytorchjob(system)
    outs = [log.read_text(errors="replace") for log in sorted((root / "logs").iterdir())]
    assert [p.returncode for p in procs] == [0] * len(procs), "\n".join(o[-3000:] for o in outs)
    box = container(job, "Master")
    suite = root / "pvc" / "psbench-results" / arg_after(box["args"], "--suite")
    assert len(list(suite.glob("*/manifest.json"))) == 1, list(root.rglob("*"))
    assert not [p for p in suite.iterdir() if p.name.startswith(".")], "rank 0 left staging behind"
    assert not [p for p in root.glob("worker-*/**/*") if p.is_file()], "a worker kept files"
    gathered = load_suite(suite)
    assert_local_columns(gathered, recorded_locally(root / "local", system))
    world, steps = len(replicas(job)), int(arg_after(box["args"], "--max-steps"))
    assert len(gathered.steps) == (world - (1 if system == "ps" else 0)) * steps
    assert float(gathered.runs["final_val_accuracy"][0]) > 0.3   # chance is 0.1 on digits
    manifest = gathered.manifests[gathered.runs["run_id"][0]]
    assert token not in json.dumps(manifest) and not [o for o in outs if token in o]
    return manifest


REASON = netlab.unavailable_reason()


@pytest.mark.slow
@pytest.mark.netns
@pytest.mark.skipif(REASON is not None, reason=f"netlab: {REASON}")
def test_container_commands_with_the_operators_environment_in_namespace_hosts(tmp_path):
    """Both jobs at once, each on its own hosts (the ddp job's Master on host 0, the ps job's after
    the ddp job's replicas)."""
    from psbench.bench.lab.netlab import NetLab

    systems = sorted(JOB_FILES)
    first = dict(zip(systems, [0, *itertools.accumulate(len(replicas(pytorchjob(s))) for s in systems)]))
    with NetLab(hosts=sum(len(replicas(pytorchjob(s))) for s in systems)) as lab:
        began = time.monotonic()
        started = {s: start_job(lab, s, tmp_path / s, first[s]) for s in systems}
        walls = wait_jobs({s: procs for s, (procs, _) in started.items()}, began, timeout_s=120)
        for system in systems:
            launch = check_job(system, tmp_path / system, *started[system])["extra"]["launch"]
            assert launch["engine"] == "torchrun" and launch["store"] == "torchrun agent"
            assert launch["world"] == len(replicas(pytorchjob(system)))
            assert launch["master_addr"] == lab.addr(first[system]) and launch["clock"]["within_bound"] is True
            if system == "ps":
                assert launch["store_auth"] == "token" and launch["shards"][0].startswith(lab.addr(first[system]) + ":")
    print("PyTorchJob container commands in namespace hosts, both jobs at once: "
          + ", ".join(f"{s} {w:.1f} s" for s, w in sorted(walls.items())))
