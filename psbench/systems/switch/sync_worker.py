"""One DDP rank of a Strategy-Switch's sync phase: systems.ddp.worker plus `--criterion TEXT`.

Rank 0 shows the criterion its training loss after every step; when it fires, every rank stops
after that step (run_sync shares the decision) and rank 0 leaves weights/momentum/buffers.npy
in the job directory for the asynchronous phase.
"""
from __future__ import annotations

from psbench.systems.allreduce_common import exit_now, worker_main
from psbench.systems.ddp.worker import build_parser, comm_factory
from psbench.systems.switch.criteria import step_stop_for


def main(argv: list[str] | None = None) -> int:
    parser = build_parser("python -m psbench.systems.switch.sync_worker")
    parser.add_argument("--criterion", required=True, help="switch criterion (systems/switch/criteria.py)")
    args = parser.parse_args(argv)
    return worker_main(args.job, comm_factory(args), rank_hint=args.rank,
                       make_step_stop=lambda prep: step_stop_for(args.criterion, prep, args.world))


if __name__ == "__main__":
    exit_now(main())
