"""Side-by-side measurements of the parameter server; each returns a dict of ratios / figures.

    ratio_roundtrip()        push+pull of 1/10/100 MB vs a raw pyzmq echo of the same bytes (goal:
                             >= 0.8 at 1 MB, >= 0.9 at 10 MB), and vs an echo doing the shard's arithmetic
    ratio_asp_vs_single()    ps strict ASP with 1 worker vs `single`, samples/s (goal: >= 0.9 on cnn-mnist1d,
                             >= 0.6 on mlp-digits); also with --pipeline (the round trip overlaps the next
                             step; staleness 1)
    ratio_asp_vs_single_interleaved()  the same per step, in alternating bursts in one process (steady
                             under load; what `psbench regress` tracks)
    ratio_consistency()      2 workers, 1 and 2 shards, BSP vs ASP vs SSP: samples/s and final accuracy

Both sides of a ratio are measured in the same call, interleaved, so machine load cancels out as
far as it can. Run all: `python -m psbench.bench.regress.ps_benchmarks` (prints JSON).
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time
from contextlib import contextmanager
from typing import Any, Iterator

import numpy as np

MB = 2**20
# Tests only: the PS side of ratio_asp_vs_single_interleaved loses this fraction of its throughput
# (each burst sleeps in proportion to its own time), as a slower PS would; the gate must see it.
SLOWDOWN_ENV = "PSBENCH_REGRESS_PS_SLOWDOWN"


def injected_slowdown() -> float:
    """The fraction of the PS side's throughput to take away (0: none), from SLOWDOWN_ENV."""
    from psbench.core.errors import ConfigError

    raw = os.environ.get(SLOWDOWN_ENV, "").strip()
    try:
        value = float(raw or 0)
    except ValueError:
        value = -1.0
    if not 0 <= value < 1:
        raise ConfigError(f"{SLOWDOWN_ENV}={raw!r}: a fraction of throughput in [0, 1), e.g. 0.2")
    return value


# ---- (a) the wire against raw pyzmq ------------------------------------------------------------

SGD_ECHO = b"sgd"  # a header that asks the echo to do a shard's arithmetic on the payload first


def _echo_server(port_file: str) -> None:
    """A raw pyzmq ROUTER that sends every message straight back (the 'no PS' baseline). A message
    whose header is SGD_ECHO gets the arithmetic a shard does on a push first (the finite check and
    the SGD update into the received frame, with the shard's own code) and no protocol: the floor
    of any PS that checks and applies the gradient it is sent."""
    import numpy as np
    import zmq

    from psbench.systems.ps.server import SGD, all_finite

    sock = zmq.Context.instance().socket(zmq.ROUTER)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    with open(port_file, "w") as f:
        f.write(str(port))
    weights: np.ndarray | None = None
    sgd = SGD()  # lr 0, momentum 0: as the roundtrip benchmark's shard
    while True:
        frames = sock.recv_multipart(copy=False)
        if len(frames) == 2 and frames[1].bytes == b"stop":
            return
        if len(frames) == 3 and frames[1].bytes == SGD_ECHO:
            grad = np.frombuffer(frames[2].buffer, np.float32)
            if weights is None or weights.shape != grad.shape:
                weights = np.zeros_like(grad)
            if all_finite(grad):  # as the shard: new weights written into the gradient's frame
                weights = sgd.step(weights, grad, None, 0.0, out=grad)
        sock.send_multipart(frames, copy=False)


@contextmanager
def echo() -> Iterator[Any]:
    """A raw pyzmq ROUTER echo in its own process (the 'no PS' baseline), and a DEALER to it."""
    import tempfile
    from pathlib import Path

    import zmq

    from psbench.core.supervisor import Supervisor
    from psbench.systems.common import child_env

    port_file = Path(tempfile.mkdtemp(prefix="psbench-echo-")) / "port"
    with Supervisor() as sup:
        sup.spawn("echo", [sys.executable, "-c", "from psbench.bench.regress.ps_benchmarks import _echo_server; "
                           f"_echo_server({str(port_file)!r})"], env=child_env())
        deadline = time.monotonic() + 60
        while not (port_file.is_file() and port_file.read_text()):
            if time.monotonic() > deadline or sup.failed():
                raise RuntimeError("the echo server did not start")
            time.sleep(0.05)
        sock = zmq.Context.instance().socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(f"tcp://127.0.0.1:{port_file.read_text()}")
        try:
            yield sock
        finally:
            sock.send_multipart([b"stop"])
            sock.close()
            port_file.unlink(missing_ok=True)
            port_file.parent.rmdir()


def ratio_roundtrip(sizes_mb: tuple[int, ...] = (1, 10, 100), reps: dict[int, int] | None = None) -> dict[str, float]:
    """Per size: raw round-trip time / PS push+pull time (1.0 = the PS adds nothing). Interleaved
    with both, the echo doing a shard's arithmetic (SGD_ECHO): `sgd_echo_vs_raw` is the most a PS
    that checks and applies each gradient with numpy can reach, `vs_sgd_echo` what the PS's
    protocol and bookkeeping cost beyond it."""
    from psbench.systems.ps.alone import one_shard

    reps = reps or {1: 40, 10: 15, 100: 5}
    out: dict[str, float] = {}
    with echo() as raw:
        for size in sizes_mb:
            shape = (size * MB // 4,)
            grad = np.ones(shape, np.float32)
            with one_shard([shape], "bench", max_bytes=1024 * MB) as kv:  # a fresh shard per size: one shape
                raw_t, sgd_t, ps_t = [], [], []
                for i in range(reps.get(size, 5) + 1):  # the first of each is a warm-up
                    for header, times in ((b"h" * 120, raw_t), (SGD_ECHO, sgd_t)):
                        t = time.perf_counter()
                        raw.send_multipart([header, grad], copy=False)
                        reply = raw.recv_multipart(copy=False)
                        np.frombuffer(reply[1].buffer, np.float32)
                        times.append(time.perf_counter() - t)
                    t = time.perf_counter()
                    kv.push_pull([grad], i)
                    ps_t.append(time.perf_counter() - t)
            raw_s, sgd_s, ps_s = (statistics.median(t[1:]) for t in (raw_t, sgd_t, ps_t))
            out[f"roundtrip_{size}mb"] = raw_s / ps_s
            out[f"roundtrip_{size}mb_sgd_echo_vs_raw"] = raw_s / sgd_s
            out[f"roundtrip_{size}mb_vs_sgd_echo"] = sgd_s / ps_s
            out[f"roundtrip_{size}mb_ps_ms"] = ps_s * 1e3
            out[f"roundtrip_{size}mb_raw_ms"] = raw_s * 1e3
    return out


# ---- (b) and (c): whole runs ----------------------------------------------------------------------

def _run(system: str, workload: str, workers: int, options: dict[str, Any], **spec_kw: Any) -> dict[str, Any]:
    from psbench.bench.harness.runner import run_summary
    from psbench.core.spec import RunSpec

    # Compute-bound workers plus the shard may need more than 2 cores (ratio_consistency's 2
    # workers): said so here; both sides of each ratio run under the same contention.
    return run_summary(RunSpec(system=system, workload=workload, workers=workers, options=options, **spec_kw),
                       allow_oversubscribe=True)


ASP_VS_SINGLE_STEPS = {"mlp-digits": 400, "cnn-mnist1d": 300, "resnet-synthetic": 40}


def ratio_asp_vs_single(workloads: dict[str, int] | None = None, repeats: int = 2,
                        pipelined: bool = True) -> dict[str, float]:
    """ps ASP with 1 worker / single, samples per second, per workload ({name: max_steps}; best of
    `repeats` each, alternating the systems so load drifts hit all). The PS adds a fixed cost per
    step (one round trip), so the ratio grows with the model's compute per step; `pipeline` hides
    the round trip behind the next step's compute, at the price of staleness 1."""
    out: dict[str, float] = {}
    sides = {"single": ("single", {}), "asp1": ("ps", {"consistency": "asp"})}
    if pipelined:
        sides["asp1_pipelined"] = ("ps", {"consistency": "asp", "pipeline": True})
    for workload, max_steps in (workloads or ASP_VS_SINGLE_STEPS).items():
        best = dict.fromkeys(sides, 0.0)
        for _ in range(repeats):
            for name, (system, options) in sides.items():
                summary = _run(system, workload, 1, options, max_steps=max_steps)
                best[name] = max(best[name], summary["samples_per_s"])
        out[f"asp1_vs_single_{workload}"] = best["asp1"] / best["single"]
        if pipelined:
            out[f"asp1_pipelined_vs_single_{workload}"] = best["asp1_pipelined"] / best["single"]
        for name, value in best.items():
            out[f"{name}_{workload}_samples_per_s"] = value
    return out


def ratio_asp_vs_single_interleaved(workloads: tuple[str, ...] = ("cnn-mnist1d", "mlp-digits"), rounds: int = 20,
                                    burst: int = 50) -> dict[str, float]:
    """Strict ASP with 1 worker vs `single`, per step, measured in alternating bursts: `burst` steps
    of `single` (forward, backward, torch SGD), then `burst` steps of a PS worker (the Trainer's
    gradient buffers, push and exchange, in this process, against a real shard process), `rounds`
    times; ratio = single's total time / the worker's. Both sides run the same batches, and a slow
    spell of the machine lands on both within a fraction of a second, so the ratio holds still where
    whole runs of a few hundred ms each (ratio_asp_vs_single) swing 3x on a loaded machine. The
    runs' bookkeeping (rows, evaluation snapshots) is left out on both sides (regress.benchmarks'
    harness_overhead measures the harness). Per workload: the ratio and its rounds' quartiles.

    A third side, interleaved too, is the floor any PS over pyzmq has here: the same forward and
    backward, then the gradient's bytes sent to a raw pyzmq echo process and received back (no
    protocol, no update): echo_vs_single = single / that; asp1_vs_echo = that / the PS worker."""
    import itertools

    from psbench.core.spec import RunSpec
    from psbench.systems.common import configure_threads, forward_backward, make_optimizer, prepare
    from psbench.systems.ps.launch import Cluster
    from psbench.systems.ps.worker import ADMIN, KVWorker, Trainer

    configure_threads(1)
    slowdown = injected_slowdown()
    out: dict[str, float] = {}
    for workload in workloads:
        prep = prepare(RunSpec(system="ps", workload=workload, workers=1, epochs=1000))
        batches = itertools.cycle(list(itertools.islice(prep.batches(0), 100)))
        model = prep.build_model()
        loss_fn = prep.workload.loss_fn()
        optimizer = make_optimizer(model, prep.workload, prep.lr)
        step = 0

        def single(n: int) -> float:
            t = time.perf_counter()
            for _ in range(n):
                _, x, y = next(batches)
                forward_backward(model, loss_fn, x, y)
                optimizer.step()
            return time.perf_counter() - t

        def ps(n: int) -> float:
            nonlocal step
            t = time.perf_counter()
            for _ in range(n):
                _, x, y = next(batches)
                forward_backward(trainer.model, trainer.loss_fn, x, y, trainer.grad_views[0])
                trainer.exchange(trainer.push(step, 0))
                step += 1
            if slowdown:  # the burst takes 1 / (1 - slowdown) of its time: throughput x (1 - slowdown)
                time.sleep((time.perf_counter() - t) * slowdown / (1 - slowdown))
            return time.perf_counter() - t

        def echo_step(n: int) -> float:  # the PS worker's step, with a raw echo for push and answer
            header, scratch = b"h" * 120, np.empty_like(trainer.flat)
            t = time.perf_counter()
            for _ in range(n):
                _, x, y = next(batches)
                forward_backward(trainer.model, trainer.loss_fn, x, y, trainer.grad_views[0])
                raw.send_multipart([header, trainer.grad_flats[0].numpy()], copy=False)
                np.copyto(scratch, np.frombuffer(raw.recv_multipart(copy=False)[1].buffer, np.float32))
            return time.perf_counter() - t

        with echo() as raw, Cluster(1, 1, "bench") as cluster:
            [address] = cluster.start_servers(["--workload", workload, "--workers", "1", "--consistency", "asp"])
            shapes = [tuple(p.shape) for p in model.parameters()]
            with KVWorker([address], ADMIN, shapes, "bench") as admin, KVWorker([address], 0, shapes, "bench") as kv:
                admin.init([p.detach().numpy() for p in prep.build_model().parameters()])
                trainer = Trainer(prep, kv, 0)
                trainer.load(kv.pull()[0])
                single(burst), ps(burst), echo_step(burst)  # warm-up: first-call costs belong to no side
                rows = [(single(burst), ps(burst), echo_step(burst)) for _ in range(rounds)]
                admin.shutdown()
            cluster.wait_servers()
        t_single, t_ps, t_echo = (sum(r[i] for r in rows) for i in range(3))
        ratios = sorted(a / b for a, b, _ in rows)
        name = workload.replace("-", "_")
        out[f"asp1_vs_single_{name}"] = t_single / t_ps
        out[f"asp1_vs_single_{name}_q1"] = ratios[len(ratios) // 4]
        out[f"asp1_vs_single_{name}_q3"] = ratios[(3 * len(ratios)) // 4]
        out[f"echo_vs_single_{name}"] = t_single / t_echo
        out[f"asp1_vs_echo_{name}"] = t_echo / t_ps
        for side, total in (("single", t_single), ("asp1", t_ps), ("echo", t_echo)):
            out[f"{side}_{name}_step_ms"] = total / (rounds * burst) * 1e3
    return out


def ratio_layout_decode(workload: str = "mlp-digits", rounds: int = 20, burst: int = 500) -> dict[str, float]:
    """decode of a push in the layout the shard expects (`expect=`: a few list comparisons) against
    the full element-by-element check of the same frames, in alternating bursts: full / fast (> 1:
    what the fast path saves on every push and every reply; about 1 if it were lost). Off the
    socket, so it is the Python cost alone; the median of the rounds' ratios."""
    from psbench.core.spec import RunSpec
    from psbench.systems.common import prepare
    from psbench.systems.ps import protocol

    shapes = [list(p.shape) for p in prepare(RunSpec(system="ps", workload=workload, workers=1)).build_model().parameters()]
    layout = protocol.PackedLayout(list(range(len(shapes))), shapes)
    flat = np.zeros(layout.nbytes // 4, np.float32)
    frames = [bytes(memoryview(f)) for f in protocol.encode("push", worker=0, step=1, version=1, keys=layout.keys,
                                                              layout=layout, packed=flat, rid=2, want_params=True)]

    def timed(expect: protocol.PackedLayout | None) -> float:
        t = time.perf_counter()
        for _ in range(burst):
            protocol.decode(frames, expect=expect)
        return time.perf_counter() - t

    timed(layout), timed(None)  # warm-up
    ratios = [timed(None) / timed(layout) for _ in range(rounds)]
    return {f"layout_decode_speedup_{workload.replace('-', '_')}": statistics.median(ratios)}


def ratio_consistency(workload: str = "mlp-digits", epochs: int = 5) -> dict[str, float]:
    """2 workers; 1 and 2 shards; bsp / asp / ssp:2: samples/s, final val accuracy, mean staleness,
    and samples/s relative to bsp with 1 shard."""
    out: dict[str, float] = {}
    for servers in (1, 2):
        for consistency in ("bsp", "asp", "ssp:2"):
            s = _run("ps", workload, 2, {"consistency": consistency, "servers": servers}, epochs=epochs)
            tag = f"{consistency.replace(':', '')}_s{servers}"
            out[f"{tag}_samples_per_s"] = s["samples_per_s"]
            out[f"{tag}_val_accuracy"] = s.get("final_val_accuracy", float("nan"))
            out[f"{tag}_staleness_mean"] = s.get("staleness_mean", float("nan"))
    base = out["bsp_s1_samples_per_s"]
    for key in [k for k in out if k.endswith("_samples_per_s")]:
        out[key.replace("_samples_per_s", "_speed_vs_bsp_s1")] = out[key] / base
    return out


def main() -> int:
    from psbench.systems.common import configure_threads

    configure_threads(1)
    which = sys.argv[1:] or ["roundtrip", "asp_vs_single", "consistency"]
    results: dict[str, float] = {}
    for name in which:
        results.update(globals()[f"ratio_{name}"]())
        print(json.dumps(results, indent=1, sort_keys=True), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
