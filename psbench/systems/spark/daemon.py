"""`python -m psbench.systems.spark.daemon master|worker ARGS...`: Spark's standalone master or worker
(`spark-class org.apache.spark.deploy.master.Master ARGS`, shipped in the pyspark wheel), with
Spark's authentication on when env PSBENCH_SPARK_TOKEN is set: the master, the workers, the driver
(systems/spark/session.py) and the executors then share that secret. A daemon reachable from other
hosts (--host not loopback; a worker binds its host's address unless --host says otherwise) needs
the token or an explicit --insecure.

The secret goes to the daemon's JVM in its environment (`_SPARK_AUTH_SECRET`, which Spark's
SecurityManager reads before its conf, and which a worker hands on to the executors it starts),
never as a -D option: `ps` shows any process's command line to every local user.

    python -m psbench.systems.spark.daemon master --host spark-master --port 7077 --webui-port 8080
    python -m psbench.systems.spark.daemon worker --cores 1 --memory 2g spark://spark-master:7077
"""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from psbench.core.errors import ConfigError

CLASSES = {"master": "org.apache.spark.deploy.master.Master", "worker": "org.apache.spark.deploy.worker.Worker"}
CRYPTO = "spark.network.crypto.enabled"  # AES-based encryption of RPC and block transfers, keyed by the secret
SPARK_SECRET_ENV = "_SPARK_AUTH_SECRET"  # SecurityManager.ENV_AUTH_SECRET: read before spark.authenticate.secret


def spark_class() -> str:
    import pyspark

    found = shutil.which("spark-class") or str(Path(pyspark.__file__).parent / "bin" / "spark-class")
    if not Path(found).is_file():
        raise ConfigError("spark-class not found (it ships with the pyspark wheel)")
    return found


def command(argv: list[str], environ: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """The spark-class argv and environment for `master|worker ARGS [--insecure]`."""
    from psbench.core.exposure import check_exposure

    if not argv or argv[0] not in CLASSES:
        raise ConfigError(f"first argument must be one of {', '.join(CLASSES)}, got {argv[:1]}")
    role, args = argv[0], [a for a in argv[1:] if a != "--insecure"]
    insecure = "--insecure" in argv[1:]
    token = environ.get("PSBENCH_SPARK_TOKEN") or None
    host = next((args[i + 1] for i, a in enumerate(args[:-1]) if a in ("--host", "-h")), None)
    check_exposure(f"the Spark {role}", host or "its host address", token, insecure,
                   "set PSBENCH_SPARK_TOKEN (the same on master, workers and driver) or pass --insecure")
    env = dict(environ)
    if token:
        # spark-class adds SPARK_DAEMON_JAVA_OPTS to both daemons' JVM options: the switches, not the
        # secret; encryption as the driver has it (session.driver_conf), else they could not talk
        env["SPARK_DAEMON_JAVA_OPTS"] = (f"{env.get('SPARK_DAEMON_JAVA_OPTS', '')} -Dspark.authenticate=true "
                                         f"-D{CRYPTO}=true").strip()
        env[SPARK_SECRET_ENV] = token
    return [spark_class(), CLASSES[role], *args], env


def main(argv: list[str] | None = None) -> int:
    try:
        cmd, env = command(sys.argv[1:] if argv is None else argv, dict(os.environ))
    except ConfigError as exc:
        print(f"psbench: error: {exc}", file=sys.stderr)
        return 2
    os.execvpe(cmd[0], cmd, env)
    return 1  # not reached


if __name__ == "__main__":
    sys.exit(main())
