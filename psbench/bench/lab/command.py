"""`psbench netlab up|down|status|exec|slurm|bench`: namespace hosts by hand, a Slurm cluster on them,
and the bandwidth experiment."""
from __future__ import annotations

import re

from psbench.bench.lab import netbench
from psbench.bench.lab.netlab import NetLab, describe, down, labs_present, unavailable_reason
from psbench.core.errors import ConfigError


def _parse_caps(items: list[str] | None) -> dict[int, float]:
    caps: dict[int, float] = {}
    for item in items or []:
        m = re.fullmatch(r"h?(\d+)=(\d+(?:\.\d+)?)", item.strip())
        if not m:
            raise ConfigError(f"--cap '{item}': expected HOST=MBIT, e.g. h0=100")
        caps[int(m.group(1))] = float(m.group(2))
    return caps


def add_arguments(p) -> None:
    sub = p.add_subparsers(dest="netlab_cmd", required=True)
    up = sub.add_parser("up", help="create a lab (stays up until `down`)")
    up.add_argument("--hosts", type=int, default=3, help="number of hosts (default 3)")
    up.add_argument("--lab", type=int, help="lab id 0..255 (default: lowest free); hosts get 198.18.LAB.(i+1)")
    up.add_argument("--cap", action="append", metavar="HOST=MBIT",
                    help="bandwidth cap on a host's link, both directions, e.g. h0=100 (repeatable)")
    dn = sub.add_parser("down", help="remove a lab's namespaces, veths and bridge")
    g = dn.add_mutually_exclusive_group(required=True)
    g.add_argument("--lab", type=int)
    g.add_argument("--all", action="store_true", help="every psbench lab")
    st = sub.add_parser("status", help="list labs, host addresses and caps")
    st.add_argument("--lab", type=int)
    ex = sub.add_parser("exec", help="run a command inside a lab host: psbench netlab exec --lab L --host H -- CMD")
    ex.add_argument("--lab", type=int, required=True)
    ex.add_argument("--host", type=int, required=True)
    ex.add_argument("cmd", nargs="+")
    sl = sub.add_parser("slurm", help="a Slurm cluster (slurmctld, a slurmd per host) on a new lab, until Ctrl-C "
                                      "(bench/lab/slurm.py)")
    sl.add_argument("--hosts", type=int, default=2, help="number of hosts, each a Slurm node (default 2)")
    sl.add_argument("--lab", type=int, help="lab id 0..255 (default: lowest free)")
    sl.add_argument("--seconds", type=float, help="tear down after this long instead of at Ctrl-C")
    netbench.add_arguments(sub.add_parser("bench", help="PS vs ring allreduce under per-host bandwidth caps "
                                                        "(bench/lab/netbench.py)"))


def main(args) -> int:
    if args.netlab_cmd == "up":
        lab = NetLab(hosts=args.hosts, caps_mbit=_parse_caps(args.cap), lab=args.lab).up()
        print(describe(lab.lab))
        print(f"remove with: psbench netlab down --lab {lab.lab}")
        return 0
    if args.netlab_cmd == "down":
        reason = unavailable_reason()
        if reason:
            raise ConfigError(f"cannot remove labs: {reason}")
        removed = down(None if args.all else args.lab)
        print(f"removed {len(removed)} namespace(s)/link(s)" + (f": {' '.join(removed)}" if removed else ""))
        return 0
    if args.netlab_cmd == "status":
        print(describe(args.lab))
        return 0
    if args.netlab_cmd == "exec":
        hosts = [n for n in labs_present().get(args.lab, []) if not n.endswith("-br")]
        lab = NetLab(hosts=max(len(hosts), 1), lab=args.lab)
        cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
        proc = lab.exec(args.host, cmd, start_new_session=False)
        return proc.wait()
    if args.netlab_cmd == "slurm":
        return slurm_main(args)
    if args.netlab_cmd == "bench":
        return netbench.main(args)
    raise ConfigError(f"unknown netlab command {args.netlab_cmd}")



def slurm_main(args) -> int:
    """Bring a Slurm cluster up on a new lab, say how to submit to it, keep it up until Ctrl-C or
    SIGTERM (or --seconds), then take everything down."""
    import signal
    import threading

    from psbench.bench.lab.slurm import SlurmLab

    if args.seconds is not None and not args.seconds >= 0:
        raise ConfigError(f"--seconds must be >= 0, got {args.seconds}")
    stop = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        with NetLab(hosts=args.hosts, lab=args.lab) as lab, SlurmLab(lab) as cluster:
            print(cluster.sinfo().rstrip())
            print(f"submit from any lab host, e.g.:\n  psbench netlab exec --lab {lab.lab} --host {lab.hosts - 1} -- "
                  f"env SLURM_CONF={cluster.conf} sbatch --wait deploy/slurm/psbench.sbatch --system ddp --insecure true "
                  "--workload mlp-digits --results-dir results --suite slurm")
            print("Ctrl-C (or SIGTERM) stops every daemon and removes the lab", flush=True)
            try:
                stop.wait(args.seconds)
            except KeyboardInterrupt:
                pass
        print(f"Slurm lab {lab.lab} down")
    finally:
        signal.signal(signal.SIGTERM, previous)
    return 0
