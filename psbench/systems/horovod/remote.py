"""Horovod ranks on other hosts: each host gets its own job folder, reached over ssh.

`horovodrun -H a:1,b:1` starts every rank with HOROVOD_HOSTNAME set to its host's entry; the worker
is given `--job ROOT/{host}` and uses ROOT/<its host> (systems/horovod/worker.py). Before the run
the spec goes to each host's folder (ssh mkdir + scp); after it (or after a failure, so a remote
rank's error report is read) every host's files come back by scp into the launcher's job folder,
where they are read as for a local run; the remote folders are then removed. Nothing relies on a
file system shared between the hosts.

ssh: the user's own set-up, or `ssh_config` (an `ssh -F` file: key, known_hosts, port); horovodrun
calls plain `ssh`, so the job folder gets `bin/ssh` and `bin/scp` wrappers that add `-F FILE`, put
first on horovodrun's PATH. Every ssh and scp here ends its options with "--" before the host; the
hosts themselves are checked where the option is read (horovodrun's own ssh calls have no "--").
"""
from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path

LOCAL_NAMES = ("localhost", "127.0.0.1")


class RemoteJob:
    def __init__(self, job: Path, hosts: list[str], ssh_config: str = ""):
        self.job = job
        self.hosts = hosts
        self.root = f"/tmp/{job.name}-hosts"          # on every host: ROOT/<host>/
        self.config = os.path.expanduser(ssh_config) if ssh_config else ""
        self.bin = job / "bin"
        if self.config:
            self.bin.mkdir(exist_ok=True)
            for tool in ("ssh", "scp"):
                wrapper = self.bin / tool
                wrapper.write_text(f"#!/bin/sh\nexec {shutil.which(tool) or tool} -F {shlex.quote(self.config)} \"$@\"\n")
                wrapper.chmod(0o755)

    @property
    def job_arg(self) -> str:
        return f"{self.root}/{{host}}"

    def env(self, environ: dict[str, str]) -> dict[str, str]:
        """horovodrun's environment: the wrappers first on PATH."""
        if not self.config:
            return environ
        return {**environ, "PATH": f"{self.bin}:{environ.get('PATH', os.environ.get('PATH', ''))}"}

    def _ssh(self) -> list[str]:
        return ["-F", self.config] if self.config else []

    def _run(self, argv: list[str], what: str) -> None:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
        if proc.returncode != 0:
            raise RuntimeError(f"horovod: {what} failed ({proc.returncode}): {proc.stderr.strip()[-400:]}")

    def stage(self) -> None:
        """Each host's folder with the run's spec in it."""
        for host in self.hosts:
            folder = f"{self.root}/{host}"
            if host in LOCAL_NAMES:
                Path(folder).mkdir(parents=True, exist_ok=True)
                shutil.copyfile(self.job / "spec.json", f"{folder}/spec.json")
                continue
            self._run(["ssh", *self._ssh(), "-o", "BatchMode=yes", "--", host, f"mkdir -p {shlex.quote(folder)}"],
                      f"making the job folder on {host}")
            self._run(["scp", *self._ssh(), "-q", "-o", "BatchMode=yes", "--", str(self.job / "spec.json"),
                       f"{host}:{folder}/spec.json"], f"copying the spec to {host}")

    def gather(self, job: Path) -> None:
        """Every host's files into `job` (ranks write distinct names: rank{r}.*; rank 0's state)."""
        for host in self.hosts:
            folder = f"{self.root}/{host}"
            if host in LOCAL_NAMES:
                for f in Path(folder).glob("*"):
                    if f.name != "spec.json":
                        shutil.copyfile(f, job / f.name)
                continue
            into = job / "hosts"
            into.mkdir(exist_ok=True)
            # a host whose ranks wrote nothing (an early failure) is not an error here
            subprocess.run(["scp", *self._ssh(), "-q", "-r", "-o", "BatchMode=yes", "--", f"{host}:{folder}", str(into)],
                           capture_output=True, timeout=300, stdin=subprocess.DEVNULL)
            for f in (into / host).glob("*"):
                if f.is_file() and f.name != "spec.json":
                    shutil.copyfile(f, job / f.name)

    def cleanup(self) -> None:
        for host in self.hosts:
            if host in LOCAL_NAMES:
                shutil.rmtree(self.root, ignore_errors=True)
                continue
            subprocess.run(["ssh", *self._ssh(), "-o", "BatchMode=yes", "--", host, f"rm -rf {shlex.quote(self.root)}"],
                           capture_output=True, timeout=60, stdin=subprocess.DEVNULL)
