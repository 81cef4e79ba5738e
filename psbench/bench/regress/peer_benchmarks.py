"""Our parameter server against its peers (`ray-ps`, `rpc-ps`), side by side: samples/s of `ps`
divided by a peer's, each system run through the harness in turn (registered in
psbench.bench.regress.check.RATIO_BENCHMARKS as 'peers'; the goal is >= 2 at 4 workers).

mlp-digits keeps compute per step small, so the ratio measures what the systems differ in: moving
gradients and parameters. A peer that is not installed (Ray) is left out; its metric then reads
'not measured'. Run one set by hand: `python -m psbench.bench.regress.peer_benchmarks [WORKERS...]` (JSON).
"""
from __future__ import annotations

import json
import sys

from psbench.bench.harness.runner import run_summary
from psbench.core.spec import RunSpec
from psbench.systems import get_system, names_where

PEERS = names_where(peer_of="ps")


def samples_per_s(system: str, workers: int, consistency: str, max_steps: int,
                  workload: str = "mlp-digits") -> float:
    spec = RunSpec(system, workload, workers=workers, epochs=100, max_steps=max_steps, evals_per_epoch=1,
                   options={"consistency": consistency})
    # 4 compute-bound workers and the shards on 2 cores oversubscribe them, said so here: the ratio
    # measures what each system spends per step beyond compute, under the same contention.
    return float(run_summary(spec, allow_oversubscribe=True)["samples_per_s"])


def ps_vs_peers(quick: bool = False, workers: int = 4, consistency: str = "asp") -> dict[str, float]:
    """ps samples/s ÷ each installed peer's, `workers` workers; ps runs between the peers so a
    drift in machine load hits both sides of each ratio alike. Higher is better."""
    steps = 150 if quick else 300
    peers = [p for p in PEERS if get_system(p).unavailable_reason() is None]
    measured = {}
    for system in peers[:1] + ["ps"] + peers[1:]:
        measured[system] = samples_per_s(system, workers, consistency, steps)
    return {f"ps_vs_{peer.replace('-', '_')}_{consistency}{workers}": measured["ps"] / measured[peer]
            for peer in peers}


def main(argv: list[str]) -> int:
    from psbench.systems.common import configure_threads

    configure_threads(1)
    out = {}
    for workers in [int(a) for a in argv] or [4]:
        out.update(ps_vs_peers(workers=workers))
    print(json.dumps(out, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
