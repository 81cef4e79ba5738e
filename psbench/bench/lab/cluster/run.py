"""Running a cluster file: its roles started stage by stage on its hosts (servers, then workers,
then the finisher), waited for and stopped, their records collected into one run under
results/<suite>/<run-id>/ like any run. `--dry-run` prints the commands instead. A role that fails
stops the run with one line, `<host> <role>: <first cause>`, and its whole log under
results/<suite>/failed/, as a local run's failure (runner.failure_kept)."""
from __future__ import annotations

import math
import os
import re
import secrets
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Sequence

from psbench.bench.lab.cluster.file import ClusterFile
from psbench.bench.lab.cluster.hosts import Hosts, hosts_for, ssh_argv
from psbench.bench.lab.cluster.records import collect_ddp, collect_ps, recorded_spec
from psbench.bench.lab.cluster.roles import PlannedRole, RoleFailed, plan_roles
from psbench.core.errors import ConfigError
from psbench.core.exposure import TOKEN_ENV
from psbench.core.supervisor import describe_exit, failure_cause, stop_tree

# a role's failure that reads as a peer gone (gloo's words) waits up to PEERS_FAIL_S for the peer's own
PEER_LOST = re.compile(r"Connection (?:reset|closed) by peer|Broken pipe|pair closure", re.IGNORECASE)
PEERS_FAIL_S = 5.0


def role_failed(cf: ClusterFile, failures: Sequence[tuple[PlannedRole, Path, str]], cause: str | None = None) -> RoleFailed:
    """One error for roles that failed, each (role, its log, how it ended), the first one's first:
    its cause, unless given, is read from its log (on an ssh host: the remote role's output and
    ssh's own errors). Every role's whole log follows the first line."""
    texts = [_role_log(role, log) for role, log, _ in failures]
    role, _, how = failures[0]
    cause = cause or failure_cause(texts[0]) or how
    return RoleFailed(f"{cf.hosts[role.host].name} {role.name}: {cause}" + "".join(
        f"\n--- {r.name} on {cf.hosts[r.host].name} ({h}), its log:\n{text}" for (r, _, h), text in zip(failures, texts)))


def _role_log(role: PlannedRole, log: Path) -> str:
    try:
        text = log.read_text(errors="replace").rstrip()
    except OSError:
        text = ""
    if role.out and os.path.isdir(role.out):   # a psbench run's own failure log, on this machine (not ssh)
        text += "".join(f"\n--- {kept.name}:\n{kept.read_text(errors='replace')}"
                        for kept in sorted(Path(role.out).glob("*/failed/*.log")))
    return text


def _last_written(log: Path) -> float:
    try:
        return os.stat(log).st_mtime
    except OSError:
        return math.inf


def _wait(cf: ClusterFile, started: list[tuple[PlannedRole, subprocess.Popen, Path]],
          servers: list[tuple[PlannedRole, subprocess.Popen, Path]], deadline: float) -> None:
    """Until every process of `started` exits 0. Its first failure, a server that stops meanwhile
    (fail now, not at the workers' reply timeout) or the deadline raises RoleFailed."""
    first_failure = None
    while True:
        codes = [p.poll() for _, p, _ in started]
        failed = [(role, log, describe_exit(c)) for (role, _, log), c in zip(started, codes) if c not in (None, 0)]
        if failed:
            # A role that only lost a peer (a broken collective) is rarely the first cause: up to
            # PEERS_FAIL_S for the role that broke it, then the failure whose log ended first.
            first_failure = first_failure or time.monotonic()
            lost_peer = {r.name: bool(PEER_LOST.search(failure_cause(_role_log(r, log)) or "")) for r, log, _ in failed}
            if (not all(lost_peer.values()) or None not in codes
                    or time.monotonic() - first_failure > PEERS_FAIL_S):
                raise role_failed(cf, sorted(failed, key=lambda f: (lost_peer[f[0].name], _last_written(f[1]))))
        elif all(c == 0 for c in codes):
            return
        for role, proc, log in servers:
            if proc.poll() is not None:
                how = f"stopped early, {describe_exit(proc.returncode)}"
                raise role_failed(cf, [(role, log, how)], None if proc.returncode else how)
        if time.monotonic() > deadline:
            slow = [f"{cf.hosts[r.host].name} {r.name}" for (r, _, _), c in zip(started, codes) if c is None]
            raise RoleFailed(f"cluster run timed out after {cf.timeout_s:g}s; still running: {', '.join(slow)}")
        time.sleep(0.1)


def execute(cf: ClusterFile, hosts: Hosts, scratch: Path, token: str | None = None) -> list[PlannedRole]:
    """Start the roles stage by stage on `hosts` (servers, then workers, then the finisher), wait for
    each stage, and stop whatever still runs at the end. Returns the planned roles, whose `out`
    names a local file (copied back from its host by an ssh launcher)."""
    roles = plan_roles(cf, [hosts.addr(i) for i in range(len(cf.hosts))], hosts.python, hosts.scratch(scratch), token)
    deadline = time.monotonic() + cf.timeout_s
    servers: list[tuple[PlannedRole, subprocess.Popen, Path]] = []
    try:
        for stage in ("server", "worker", "finish"):
            started = []
            for role in (r for r in roles if r.stage == stage):
                log = scratch / f"{role.name}.log"
                with open(log, "wb") as fh:
                    proc = hosts.start(role.host, role.argv, role.env, fh)
                started.append((role, proc, log))
                if role.ready_port is not None:
                    try:
                        hosts.wait_listening(role.host, role.ready_port, max(1.0, min(60.0, deadline - time.monotonic())))
                    except TimeoutError as exc:
                        raise role_failed(cf, [(role, log, "not listening")], str(exc)) from None
            if stage == "server":
                servers = started
                continue
            _wait(cf, started, servers if stage == "worker" else [], deadline)
        for _, proc, _ in servers:  # ps-fetch told them to shut down
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                stop_tree([proc])
    finally:
        for _, proc, _ in servers:
            stop_tree([proc])
    # the records travel back (ssh: every role's files, by scp, into this machine's scratch)
    roles = [replace(r, out=hosts.fetch(r, scratch / "fetched")) if r.out else r for r in roles]
    return roles


def run_file(cf: ClusterFile, results_dir: Path, resume: bool = True, record_format: str = "parquet"):
    """Run the cluster file once; returns the RunResult (None if already complete and resume).
    Record tables are written as `record_format` (psbench.core.records.RECORD_FORMATS)."""
    from psbench.core.records import Recorder
    from psbench.bench.harness.runner import failure_kept, is_complete
    from psbench.workloads import get_workload

    spec = recorded_spec(cf)
    if resume and is_complete(results_dir, cf.suite, spec):
        print(f"psbench: {spec.run_id} already complete in suite '{cf.suite}' (resume)", file=sys.stderr)
        return None
    if cf.launcher == "netns":
        from psbench.bench.lab.netlab import unavailable_reason

        reason = unavailable_reason()
        if reason:
            raise ConfigError(f"launcher \"netns\" is not available here: {reason}")
    recorder = Recorder(spec, target_accuracy=get_workload(spec.workload).target_accuracy)
    from psbench.systems.common import prepare

    prep = prepare(cf.spec)  # validates the workload before any process starts
    recorder.shard_report = prep.plan.report(prep.data.y_train, prep.data.n_classes)
    token = secrets.token_hex(16) if cf.spec.system == "ps" else None
    job = secrets.token_hex(6)
    hosts = hosts_for(cf, job)
    try:
        with tempfile.TemporaryDirectory(prefix="psbench-cluster-") as tmp, hosts:
            os.chmod(tmp, 0o755)
            roles = execute(cf, hosts, Path(tmp), token)
            if cf.spec.system == "ps":
                collect_ps(cf, roles, recorder)
            else:
                collect_ddp(roles, recorder)
            recorder.extra["cluster"] = {"launcher": cf.launcher, "source": cf.source,
                                         "hosts": [{"name": h.name, "address": hosts.addr(i), "roles": list(h.roles),
                                                    "cap_mbit": h.cap_mbit} for i, h in enumerate(cf.hosts)]}
    except RuntimeError as exc:   # as a local run's failure: one line, the whole story under failed/
        raise failure_kept(exc, results_dir, cf.suite, spec.run_id) from exc
    return recorder.finish(results_dir, cf.suite, record_format)


def dry_run(cf: ClusterFile) -> list[str]:
    """The command line of every role, per host, without running anything."""
    if cf.launcher == "ssh":
        addrs = [str(h.address) for h in cf.hosts]
        python, scratch = cf.ssh.python, ".psbench-cluster"
    else:
        addrs = [("198.18.L." + str(i + 1)) if cf.launcher == "netns" else "127.0.0.1" for i in range(len(cf.hosts))]
        python, scratch = sys.executable, "$SCRATCH"
    token = f"${TOKEN_ENV}" if cf.spec.system == "ps" else None
    lines = []
    for role in plan_roles(cf, addrs, python, scratch, token):
        argv = ssh_argv(cf, role) if cf.launcher == "ssh" else role.argv
        given = f"; stdin: {', '.join(sorted(role.env))}, a line each" if cf.launcher == "ssh" and role.env else ""
        lines.append(f"# {role.name} on {cf.hosts[role.host].name} ({role.stage}{given})\n{shlex.join(argv)}")
    return lines
