"""One run's records from a cluster run's files: the PS workers' --out files and what the
finisher role (`ps-fetch`: the final parameters and the shards' stats, then the shards shut down)
saved, or each DDP node's own run folder.

Clock of a PS run: each worker's rows are timed from its own start; the start is placed on the
common clock as (--out file's mtime) - (its last t_wall), which is exact to a round trip on one
kernel. The run's clock spans the first worker's start to the last worker's end."""
from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
from dataclasses import replace
from pathlib import Path
from typing import Sequence

from psbench.bench.lab.cluster.file import ClusterFile
from psbench.bench.lab.cluster.roles import PlannedRole, RoleFailed
from psbench.core.spec import RunSpec


def recorded_spec(cf: ClusterFile) -> RunSpec:
    """The run's spec as recorded: the cluster's launcher and caps are part of what was run."""
    return replace(cf.spec, options={**cf.spec.options, "launcher": cf.launcher, "caps": cf.caps_label()})


def collect_ps(cf: ClusterFile, roles: list[PlannedRole], recorder) -> None:
    collect_ps_files(cf.spec, [str(r.out) for r in roles if r.stage == "worker"],
                     next(str(r.out) for r in roles if r.stage == "finish"), recorder)


def collect_ps_files(spec: RunSpec, worker_outs: Sequence[str], fetched_npz: str, recorder) -> None:
    """Step rows from the workers' --out files, evals of the seeded model and of the final
    parameters ps-fetch saved, the shards' stats: one run's records from a PS job run elsewhere."""
    import numpy as np

    from psbench.core.records import STEP_TIME_COLUMNS, split_sync_wait
    from psbench.systems.common import evaluate_splits, prepare, record_evals, set_flat_params

    starts, ends, rows_by_worker = [], [], {}
    for out in worker_outs:
        data = json.loads(Path(out).read_text())
        rows = data["rows"]
        # The worker's clock start (epoch s; t_wall counts from it). Files from before it was written:
        # estimated from the file's time, which is late by however long the worker took to write it.
        end = os.stat(out).st_mtime
        start = data["t0"] if "t0" in data else end - (rows["t_wall"][-1] if rows["t_wall"] else 0.0)
        end = start + (rows["t_wall"][-1] if rows["t_wall"] else 0.0)
        starts.append(start)
        ends.append(end)
        rows_by_worker[data["worker"]] = (start, rows)
    t0 = min(starts)
    recorder.adopt_clock(t0, max(ends), 0.0)
    steps = []
    for w, (start, rows) in sorted(rows_by_worker.items()):
        kept = [c for c in ("step", "n_samples", "loss", "staleness", "bytes", *STEP_TIME_COLUMNS) if c in rows]
        steps += [{"worker": w, "t_wall": start - t0 + t, **dict(zip(kept, values))}
                  for t, *values in zip(rows["t_wall"], *(rows[c] for c in kept))]
    if str(spec.options.get("consistency", "asp")).split(":")[0] != "asp":
        split_sync_wait(steps)  # bsp/ssp: as the local launcher's records (systems/ps/adapter.py)
    recorder.add_steps(steps)
    fetched = np.load(fetched_npz)
    prep = prepare(spec)
    model = prep.build_model()
    loss_fn = prep.workload.loss_fn()
    record_evals(recorder, 0, evaluate_splits(model, loss_fn, prep.data), t_wall=0.0)
    set_flat_params(model, fetched["params"])
    last = max(len(rows["step"]) for _, rows in rows_by_worker.values())
    record_evals(recorder, last, evaluate_splits(model, loss_fn, prep.data), t_wall=max(ends) - t0)
    recorder.extra["ps"] = {"shards": json.loads(str(fetched["stats"]))}


def collect_ddp(roles: list[PlannedRole], recorder) -> None:
    from psbench.core.tables import read_table

    for rank, role in enumerate(roles):
        run_dirs = sorted(Path(role.out, "node").glob("*/manifest.json"))
        if len(run_dirs) != 1:
            raise RoleFailed(f"{role.name}: expected one run folder in {role.out}, found {len(run_dirs)}")
        run_dir = run_dirs[0].parent
        manifest = json.loads(run_dirs[0].read_text())
        if rank == 0:
            eval_s = manifest["extra"].get("eval_s", 0.0)
            recorder.adopt_clock(manifest["start"], manifest["end"], eval_s)
            recorder.extra["eval_s"] = eval_s
            for row in read_table(run_dir, "evals").to_dict("records"):
                recorder.eval(int(row["step"]), row["split"], row["loss"], row["accuracy"], t_wall=row["t_wall"])
        steps = read_table(run_dir, "steps")
        recorder.add_steps([{k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in row.items()}
                            for row in steps.to_dict("records")])


def ps_fetch(argv: list[str] | None = None) -> int:
    """`python -m psbench.bench.lab.cluster.records ps-fetch --servers A,B --workload W --seed S --out final.npz`: runs on a
    cluster host (it must reach the shards), saves params + shard stats, shuts the shards down."""
    import numpy as np

    from psbench.systems.common import prepare
    from psbench.core.exposure import read_token
    from psbench.systems.ps.worker import ADMIN, KVWorker

    p = argparse.ArgumentParser(prog="python -m psbench.bench.lab.cluster.records ps-fetch")
    p.add_argument("--servers", required=True)
    p.add_argument("--workload", required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    model = prepare(RunSpec("ps", args.workload, seed=args.seed)).build_model()
    shapes = [tuple(t.shape) for t in model.parameters()]
    with KVWorker(args.servers.split(","), ADMIN, shapes, read_token(None), 60.0) as kv:
        params = np.concatenate([a.reshape(-1) for a in kv.state("params")])
        stats = kv.stats()
        kv.shutdown()
    tmp = Path(args.out).with_suffix(".tmp.npz")
    np.savez(tmp, params=params, stats=np.array(json.dumps(stats)))
    os.replace(tmp, args.out)
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["ps-fetch"]:
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        sys.exit(ps_fetch(sys.argv[2:]))
    sys.exit("usage: python -m psbench.bench.lab.cluster.records ps-fetch ...")
