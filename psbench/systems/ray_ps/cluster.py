"""Where ray-ps' actors run: a private Ray instance on loopback (the default), or a Ray cluster the
user already runs (`--ray-address auto|HOST:PORT`, the address `ray start --head` prints).

A private instance is Ray's single-node mode: every server it starts binds 127.0.0.1, its session
files live in a temp folder removed afterwards, and ray.shutdown() stops it. A joined cluster is the
user's: the driver connects to it, places the actors with Ray's SPREAD strategy (Ray's default
packs actors onto the driver's node until it is half full, which would put every worker on the
head), kills its actors at the end and disconnects, leaving the cluster up. Its nodes must hold this
checkout at the same path (as for `--cluster`): the actors import psbench from the driver's
PYTHONPATH, passed in the job's runtime_env.

Exposure (SECURITY.md): joining a cluster beyond loopback makes this process a node's client and
a listener on its address. That needs Ray's own token authentication (RAY_AUTH_MODE=token, the
cluster's token in RAY_AUTH_TOKEN_PATH or RAY_AUTH_TOKEN, as on every node of the cluster) or the
explicit `--insecure true`, asked of check_exposure as for the other systems."""
from __future__ import annotations

import logging
import os
import shutil
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator

from psbench.core.errors import ConfigError
from psbench.core.exposure import check_exposure, is_loopback, split_address
from psbench.systems.common import child_env

AUTO = "auto"
RAY_REMEDY = ("turn on Ray's token authentication here as on the cluster (RAY_AUTH_MODE=token, the cluster's token "
              "in RAY_AUTH_TOKEN_PATH or RAY_AUTH_TOKEN), or pass --insecure true to join it unauthenticated "
              "(recorded in the manifest)")
SPREAD = "SPREAD"  # the joined cluster's placement strategy (see the module's docstring)


def token_auth() -> bool:
    """Ray's token authentication is on for this process (it then sends the cluster's token)."""
    return os.environ.get("RAY_AUTH_MODE", "").strip().lower() == "token"


def check_address(address: str, insecure: bool) -> None:
    """'' (a private instance), 'auto' (resolved when joining) or HOST:PORT, whose host beyond
    loopback needs Ray's token authentication or --insecure true."""
    if address in ("", AUTO):
        return
    if "://" in address:
        raise ConfigError(f"ray_address '{address}': expected auto or HOST:PORT (a GCS address, as `ray start "
                          f"--head` prints), not a URL; Ray Client (ray://) is not supported")
    host, _ = split_address(address)
    check_exposure(f"ray-ps --ray-address {address}", host, token_auth(), insecure, RAY_REMEDY)


def auth_mode(address: str) -> str:
    """How the run's Ray traffic is guarded, for the manifest."""
    if is_loopback(address.rpartition(":")[0]):
        return "loopback"
    return "ray-token" if token_auth() else "insecure"


@dataclass
class RaySession:
    """A connected Ray: the module, whether it is the user's cluster, its GCS address and the
    actor options that place the run's actors."""
    ray: Any
    joined: bool
    address: str
    actor_options: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> dict[str, Any]:
        nodes = [n for n in self.ray.nodes() if n.get("Alive")]
        return {"joined": self.joined, "address": self.address, "nodes": len(nodes),
                "node_ips": sorted(n["NodeManagerAddress"] for n in nodes), "ray_version": self.ray.__version__,
                "scheduling": SPREAD if self.joined else "default",
                "auth": auth_mode(self.address) if self.joined else "loopback"}


def _import_ray(loopback: bool):
    """Import ray; loopback: its single-node mode, where every server it starts binds 127.0.0.1
    (the default binds the host's address). The raylet and workers inherit this process's environment."""
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0" if loopback else "1"
    if loopback:
        os.environ["PYTHONPATH"] = child_env()["PYTHONPATH"]  # workers import this checkout's packages
    import ray
    from ray._private import ray_constants

    ray_constants.ENABLE_RAY_CLUSTER = not loopback  # in case ray was imported before the variable was set
    return ray


def _resolve(ray, address: str, insecure: bool) -> str:
    """HOST:PORT of the cluster to join: 'auto' is what Ray finds (RAY_ADDRESS, else the last `ray
    start` on this machine), checked for exposure as a given address is."""
    if address != AUTO:
        return address
    from ray._private.services import canonicalize_bootstrap_address

    try:
        found = canonicalize_bootstrap_address(AUTO)
    except ConnectionError as exc:
        found, why = None, str(exc).strip().splitlines()[0]
    else:
        why = "no RAY_ADDRESS and no `ray start` on this machine"
    if not found:
        raise ConfigError(f"ray_address auto: found no running Ray cluster ({why}); start one with `ray start --head`")
    check_address(found, insecure)
    return found


@contextmanager
def ray_session(address: str, slots: int, insecure: bool) -> Iterator[RaySession]:
    """Ray for one run: a private instance with `slots` CPUs on loopback (address ''), or the
    cluster at `address`, joined. Either way nothing of the run is left when the block ends."""
    ray = _import_ray(loopback=not address)
    if ray.is_initialized():
        raise ConfigError("ray-ps connects to Ray itself; this process already has Ray initialised (call ray.shutdown())")
    quiet = {"log_to_driver": False, "logging_level": logging.ERROR}
    if not address:
        temp = tempfile.mkdtemp(prefix="psbench-ray-")  # Ray's session files and logs, removed after
        try:
            info = ray.init(num_cpus=slots, include_dashboard=False, _temp_dir=temp, **quiet)
            yield RaySession(ray, False, info.address_info["gcs_address"])
        finally:
            ray.shutdown()
            shutil.rmtree(temp, ignore_errors=True)
        return
    target = _resolve(ray, address, insecure)
    env = child_env()
    runtime_env = {"env_vars": {k: env[k] for k in ("PYTHONPATH", "OMP_NUM_THREADS", "MKL_NUM_THREADS")}}
    try:
        ray.init(address=target, runtime_env=runtime_env, **quiet)
    except ConnectionError as exc:
        ray.shutdown()
        raise ConfigError(f"ray_address {target}: cannot join the Ray cluster there ({str(exc).strip().splitlines()[0]})"
                          ) from None
    session = RaySession(ray, True, target, {"scheduling_strategy": SPREAD})
    try:
        yield session
    finally:
        ray.shutdown()  # disconnects; the job's actors, owned by this driver, die with its job


def kill_actors(ray, actors: list) -> None:
    """End the run's actors now, not when the cluster notices the driver is gone."""
    for actor in actors:
        try:
            ray.kill(actor, no_restart=True)
        except Exception:  # already dead: nothing to end
            pass


def actor_node() -> dict[str, str]:
    """Where the calling actor runs (called inside it)."""
    import ray

    return {"node_ip": ray.util.get_node_ip_address(), "node_id": ray.get_runtime_context().get_node_id()}
