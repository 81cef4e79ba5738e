"""The figures of the several-hosts note, measured side by side (root: namespace hosts and sshd):

- Spark standalone (master + 2 workers on namespace hosts, the driver on a third) vs local[2], the
  same spark-mllib job: mean time per step (train_s / steps per worker);
- the PS job (1 server host, 2 worker hosts, bsp) launched over ssh vs the same cluster file on
  loopback (launcher = "local"): samples/s;
- horovod -np 2, one rank on each of two sshd hosts vs both on localhost: samples/s.

    python -m psbench.bench.lab.hosts_figures --repeats 3 --out results/hosts

Each pair is run `repeats` times, alternating; the table has the mean and a 95% t interval per
side and the ratio of the means. Emulated devices (step_ms=20) keep the runs within the CPU budget.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import textwrap
from pathlib import Path

from psbench.bench.lab.spark_cluster import free_port
from psbench.systems.common import child_env

PS_STEPS = 400  # ps-worker takes no --emulate-device: long enough runs instead
T95 = {2: 12.71, 3: 4.30, 4: 3.18, 5: 2.78, 6: 2.57}


def interval(values: list[float]) -> str:
    mean = statistics.fmean(values)
    if len(values) < 2:
        return f"{mean:.4g}"
    half = T95.get(len(values), 2.0) * statistics.stdev(values) / len(values) ** 0.5
    return f"{mean:.4g} ± {half:.2g}"


def summaries(folder: Path) -> list[dict]:
    return [json.loads(p.read_text())["summary"] for p in sorted(folder.glob("*/manifest.json"))]


def step_s(summary: dict) -> float:
    return summary["train_s"] / summary["steps"] * 2   # steps counts both workers' steps


SPARK_ARGS = ["--workload", "mlp-digits", "-np", "2", "--max-steps", "30", "--emulate-device", "step_ms=20",
              "--no-progress", "--no-resume"]


def spark_pair(repeats: int, out: Path) -> list[str]:
    from psbench.bench.lab.cluster.hosts import NetnsHosts
    from psbench.bench.lab.netlab import NetLab
    from psbench.bench.lab.spark_cluster import SparkCluster

    script = ("import sys\nfrom psbench.bench.cli import main\n"
              "for s in range(int(sys.argv[1])):\n"
              "    assert main(['run', '--system', 'spark-mllib', '--seed', str(s), *sys.argv[2:]]) == 0\n")
    with NetLab(hosts=4) as lab, SparkCluster(NetnsHosts(lab=lab), 0, [1, 2], interface="veth0") as sc:
        run = lab.run(3, [sys.executable, "-c", script, str(repeats), *SPARK_ARGS, *sc.driver_args(lab.addr(3)),
                          "--spark-conf", "spark.executor.memory=512m", "--results-dir", str(out), "--suite",
                          "spark-standalone"], timeout=900, env=child_env(sc.driver_env()))
        assert run.returncode == 0, run.stderr[-2000:]
    local = subprocess.run([sys.executable, "-c", script, str(repeats), *SPARK_ARGS, "--spark-master", "local[2]",
                            "--results-dir", str(out), "--suite", "spark-local"], capture_output=True, text=True,
                           timeout=900, env=child_env())
    assert local.returncode == 0, local.stderr[-2000:]
    a = [step_s(s) for s in summaries(out / "spark-standalone")]
    b = [step_s(s) for s in summaries(out / "spark-local")]
    return [f"| spark-mllib step time (s), standalone 2 hosts vs local[2] | {len(a)} | {interval(a)} | "
            f"{interval(b)} | {statistics.fmean(a) / statistics.fmean(b):.2f} |"]


CHECKOUT = Path(__file__).resolve().parents[3]


def ps_file(launcher: str, hosts: list[str], config: str, steps: int) -> str:
    """A PS cluster file (bsp, mlp-digits): hosts ps, w1, w2; suite ps-<launcher>; the ssh launcher
    runs this checkout's interpreter on every host."""
    ssh = f'[ssh]\nworkdir = "{CHECKOUT}"\npython = "{sys.executable}"\nconfig = "{config}"\n' if launcher == "ssh" else ""
    return textwrap.dedent(f"""
        launcher = "{launcher}"
        suite = "ps-{launcher}"
        port = {free_port() if launcher == "local" else 29500}
        [run]
        system = "ps"
        workload = "mlp-digits"
        max_steps = {steps}
        epochs = 1000
        [run.options]
        consistency = "bsp"
    """) + ssh + "".join(
        f'[[hosts]]\nname = "{n}"\n' + (f'address = "{a}"\n' if launcher == "ssh" else "") + f'roles = ["{r}"]\n'
        for n, a, r in zip(["ps", "w1", "w2"], hosts, ["ps-server", "worker", "worker"]))


def ps_pair(repeats: int, out: Path) -> list[str]:
    from psbench.bench.lab.netlab import NetLab
    from psbench.bench.lab.sshlab import SshLab

    with NetLab(hosts=4) as lab, SshLab(lab, hosts=[1, 2, 3]) as ssh:
        files = {}
        for launcher in ("ssh", "local"):
            files[launcher] = out / f"ps-{launcher}.toml"
            files[launcher].write_text(ps_file(launcher, [lab.addr(h) for h in (1, 2, 3)], str(ssh.kit.config), PS_STEPS))
        for seed in range(repeats):
            for launcher in ("ssh", "local"):
                text = files[launcher].read_text().replace(f"max_steps = {PS_STEPS}", f"max_steps = {PS_STEPS}\nseed = {seed}")
                path = out / f"ps-{launcher}-{seed}.toml"
                path.write_text(text)
                argv = [sys.executable, "-m", "psbench", "run", "--cluster", str(path), "--results-dir", str(out),
                        "--no-progress"]
                run = lab.run(0, argv, timeout=600) if launcher == "ssh" else \
                    subprocess.run(argv, capture_output=True, text=True, timeout=600, env=child_env())
                assert run.returncode == 0, run.stderr[-2000:]
    a = [s["samples_per_s"] for s in summaries(out / "ps-ssh")]
    b = [s["samples_per_s"] for s in summaries(out / "ps-local")]
    return [f"| PS bsp samples/s, ssh launcher on 3 hosts vs loopback | {len(a)} | {interval(a)} | {interval(b)} | "
            f"{statistics.fmean(a) / statistics.fmean(b):.2f} |"]


def hvd_pair(repeats: int, out: Path) -> list[str]:
    """horovod -np 2: one rank on each of two sshd hosts (launched from a third) vs localhost:2."""
    from psbench.bench.lab.netlab import NetLab
    from psbench.bench.lab.sshlab import SshLab

    common = [sys.executable, "-m", "psbench", "run", "--system", "horovod", "-np", "2", "--workload", "mlp-digits",
              "--max-steps", "60", "--epochs", "1000", "--emulate-device", "step_ms=20", "--results-dir", str(out),
              "--no-progress", "--no-resume"]
    with NetLab(hosts=3) as lab, SshLab(lab, hosts=[1, 2]) as ssh:
        for seed in range(repeats):
            hosts = ["--hosts", f"{lab.addr(1)}:1,{lab.addr(2)}:1", "--ssh-config", str(ssh.kit.config),
                     "--network-interface", "veth0", "--insecure", "true"]
            run = lab.run(0, [*common, "--seed", str(seed), *hosts, "--suite", "hvd-hosts"], timeout=600)
            assert run.returncode == 0, run.stderr[-2000:]
            run = subprocess.run([*common, "--seed", str(seed), "--suite", "hvd-local"], capture_output=True,
                                 text=True, timeout=600, env=child_env())
            assert run.returncode == 0, run.stderr[-2000:]
    a = [s["samples_per_s"] for s in summaries(out / "hvd-hosts")]
    b = [s["samples_per_s"] for s in summaries(out / "hvd-local")]
    return [f"| horovod -np 2 samples/s, 2 hosts (ssh) vs localhost:2 | {len(a)} | {interval(a)} | {interval(b)} | "
            f"{statistics.fmean(a) / statistics.fmean(b):.2f} |"]


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m psbench.bench.lab.hosts_figures")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", type=Path, default=Path("results/hosts"))
    p.add_argument("--only", choices=["spark", "ps", "horovod"])
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = ["| figure | n | across hosts (mean ± 95% CI) | one host | ratio |", "|---|---|---|---|---|"]
    if args.only in (None, "ps"):
        rows += ps_pair(args.repeats, args.out)
    if args.only in (None, "horovod"):
        rows += hvd_pair(args.repeats, args.out)
    if args.only in (None, "spark"):
        rows += spark_pair(args.repeats, args.out)
    table = "\n".join(rows)
    (args.out / "figures.md").write_text(table + "\n")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
