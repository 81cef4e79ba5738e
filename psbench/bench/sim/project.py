"""Projections of the event model (events.py, its costs measured by costs.py) to clusters this
machine cannot host: each worker on its own machine (no shared cores), the measured per-message
software costs kept, and a cluster's links added (bandwidth per link, full duplex, and a one-way
latency: both stated assumptions, not measurements).

What it writes: samples/s and scaling efficiency (÷ N x one worker's samples/s on the same device)
for 8..1024 workers at 1, 10 and 25 Gbit/s; where one PS shard saturates and how many shards a
model size needs; the thesis' setups (the Kassela fall at the paper's scale from the kassela
suite's fit, the sharding study's 12 workers and 2 servers, Strategy-Switch's 8 and 16 workers
under the switch suite's stragglers); the specialised ÷ general-purpose throughput ratio against
workers; and published anchors beside what the model says of their setting.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pandas as pd

from psbench.bench.harness.steady import steady_rate
from psbench.bench.sim.costs import MeasuredCosts
from psbench.bench.sim.events import Network, SimSpec, SystemCosts, simulate_run
from psbench.core.emulation import parse_device
from psbench.core.errors import ConfigError
from psbench import systems
from psbench.systems import entry

WORKERS = (8, 16, 32, 64, 128, 256, 512, 1024)
LINKS_GBIT = (1.0, 10.0, 25.0)
ONE_WAY_LATENCY_S = 25e-6   # assumed: a datacentre network's one-way latency (no measurement here)
DEVICE = "cluster-node"     # the suites' emulated device (psbench/core/device_profiles.toml)
STEPS = 30                  # per worker in a projected run: the warm-up rule leaves 27
ASSUMPTIONS = (f"each worker on its own machine; links: the stated bandwidth per link, full duplex, "
               f"{ONE_WAY_LATENCY_S * 1e6:.0f} us one way (assumed, a datacentre's); device '{DEVICE}' for every "
               f"worker, no stragglers unless a row says so; software costs per message as measured here "
               f"(calibration.json); a shard's CPU per update as measured at the model size of its runs, "
               f"growing with the bytes of its slice beyond it (assumed: update work per parameter)")


@dataclass(frozen=True)
class Curve:
    label: str
    system: str
    consistency: str = "bsp"
    servers: str = "1"       # a number, or 'n/16': one shard per 16 workers


CURVES = (
    Curve("ps (asp)", "ps", "asp"), Curve("ps (bsp)", "ps", "bsp"), Curve("ps (asp), a shard per 16 workers", "ps", "asp", "n/16"),
    Curve("ddp", "ddp"), Curve("horovod", "horovod"),
    Curve("spark-mllib", "spark-mllib"), Curve("spark-barrier", "spark-barrier"), Curve("spark-torch", "spark-torch"),
)
# The gap's sides, by the registry's kind: each specialised system at one PS shard (the sharded curve
# shows what more shards buy, not the framework's gap) against each of Spark's paths.
SPECIALISED = tuple(c.label for c in CURVES if entry(c.system).kind == systems.SPECIALISED and c.servers == "1")
GENERAL = tuple(c.label for c in CURVES if entry(c.system).kind == systems.GENERAL_PURPOSE)


def shard_costs(costs: SystemCosts, servers: int, calibration_bytes: int) -> SystemCosts:
    """A shard's CPU per update for a slice of M / S bytes: the measured figure, and more only for a
    slice larger than the model it was measured on."""
    slice_bytes = costs.model_bytes / servers
    return replace(costs, server_cpu_s=costs.server_cpu_s * max(1.0, slice_bytes / max(1, calibration_bytes)))


def simulate_curve(measured: MeasuredCosts, curve: Curve, workload: str, batch: int, workers: int, net: Network,
                   stragglers: str | None = None, seed: int = 0) -> float | None:
    """Steady samples/s of one projected run, or None where no costs of the system were measured."""
    servers = max(1, workers // 16) if curve.servers == "n/16" else int(curve.servers)
    try:
        costs = measured.for_run(curve.system, workload, batch)
    except ConfigError:  # a system this results folder has no runs of
        return None
    if curve.system == "ps":
        costs = shard_costs(costs, servers, costs.model_bytes)
    spec = SimSpec(curve.system, workload, workers, batch, seed=seed, consistency=curve.consistency, servers=servers,
                   emulate_device=DEVICE, stragglers=stragglers, max_steps=STEPS)
    return steady_rate(pd.DataFrame(simulate_run(spec, costs, net).steps))


def single_rate(measured: MeasuredCosts, workload: str, batch: int) -> float:
    costs = measured.for_run("ps", workload, batch) if ("ps", workload) in measured.costs else next(
        c for (s, w), c in measured.costs.items() if w == workload)
    spec = SimSpec("single", workload, 1, batch, emulate_device=DEVICE, max_steps=STEPS)
    return steady_rate(pd.DataFrame(simulate_run(spec, replace(costs, comm_fixed_s=0.0)).steps))


def scaling_table(measured: MeasuredCosts, workload: str, batch: int, workers: tuple[int, ...] = WORKERS,
                  links: tuple[float, ...] = LINKS_GBIT) -> pd.DataFrame:
    one = single_rate(measured, workload, batch)
    rows = []
    for gbit in links:
        net = Network(bandwidth_Bps=gbit * 1e9 / 8, latency_s=ONE_WAY_LATENCY_S)
        for curve in CURVES:
            for n in workers:
                rate = simulate_curve(measured, curve, workload, batch, n, net)
                if rate is None:
                    continue
                rows.append({"workload": workload, "link_gbit": gbit, "system": curve.label, "workers": n,
                             "samples_per_s": rate, "efficiency": rate / (n * one)})
    return pd.DataFrame(rows)


def gap_table(scaling: pd.DataFrame) -> pd.DataFrame:
    """The fastest specialised system's samples/s ÷ each general-purpose one's, per link and N."""
    rows = []
    for (workload, gbit, n), group in scaling.groupby(["workload", "link_gbit", "workers"]):
        rates = dict(zip(group["system"], group["samples_per_s"]))
        best = max(((rates[s], s) for s in SPECIALISED if s in rates), default=None)
        if best is None:
            continue
        for general in GENERAL:
            if general in rates and rates[general] > 0:
                rows.append({"workload": workload, "link_gbit": gbit, "workers": n, "specialised": best[1],
                             "general": general, "ratio": best[0] / rates[general]})
    return pd.DataFrame(rows)


def shard_saturation(measured: MeasuredCosts, workload: str, batch: int, model_sizes: dict[str, int],
                     links: tuple[float, ...] = LINKS_GBIT, workers: tuple[int, ...] = WORKERS) -> pd.DataFrame:
    """Per model size and link: the workers one shard serves before it is busy all the time, and the
    shards N workers need (each shard handles every worker's update of its slice: N / T updates/s,
    each costing its CPU and its slice's bytes on the shard's link)."""
    costs = measured.for_run("ps", workload, batch)
    device = parse_device(DEVICE)
    step = device.target_s(workload, batch) + costs.comm_fixed_s + costs.update_cpu_s
    rows = []
    for name, size in model_sizes.items():
        for gbit in links:
            bandwidth = gbit * 1e9 / 8

            def per_update(servers: int) -> float:
                sized = shard_costs(replace(costs, model_bytes=size), servers, costs.model_bytes)
                return sized.server_cpu_s + size / servers / bandwidth

            serves = math.floor((step + 2 * size / bandwidth) / per_update(1))
            row: dict[str, Any] = {"model": name, "model_mb": size / 1e6, "link_gbit": gbit,
                                   "step_ms": step * 1e3 + size / bandwidth * 2e3,
                                   "one shard saturates at workers": serves if serves >= 1 else "< 1 (one worker's "
                                                                                                "updates keep it busy)"}
            for n in workers:
                t = step + 2 * size / bandwidth
                need = next((s for s in range(1, 4097) if n / t * per_update(s) < 1.0), None)
                row[f"shards for {n}"] = need if need is not None else "> 4096 (CPU per update caps it)"
            rows.append(row)
    return pd.DataFrame(rows)


def thesis_setups(measured: MeasuredCosts, workload: str, batch: int, kassela_costs: Path | None,
                  switch_stragglers: str | None) -> pd.DataFrame:
    rows: list[dict[str, Any]] = []
    if kassela_costs is not None and kassela_costs.is_file():
        falls = json.loads(kassela_costs.read_text()).get("predicted_falls", [])
        for f in falls:
            if f["setup"].startswith("Kassela"):
                rows.append({"setup": f["setup"], "system": f["system"], "figure": "fall 100 % ÷ 1 %",
                             "value": f["fall_to_1pct"]["x"], "lo": f["fall_to_1pct"]["lo"], "hi": f["fall_to_1pct"]["hi"],
                             "note": "validated at a second size" if f["validated"] else f"not validated: {f['why']}"})
        if not falls:
            rows.append({"setup": "Kassela 2019 (141 VMs)", "system": "-", "figure": "fall", "value": math.nan,
                         "note": f"{kassela_costs} predates predicted falls: rerun `psbench report` on the kassela suite"})
    one = single_rate(measured, workload, batch)
    for gbit in (1.0, 10.0):
        net = Network(gbit * 1e9 / 8, ONE_WAY_LATENCY_S)
        rate = simulate_curve(measured, Curve("ps (asp), 2 servers", "ps", "asp", "2"), workload, batch, 12, net)
        if rate is not None:
            rows.append({"setup": f"sharding study: 12 workers, 2 servers, {gbit:g} Gbit/s", "system": "ps (asp)",
                         "figure": "samples/s (efficiency)", "value": rate, "note": f"efficiency {rate / (12 * one):.0%}"})
    for n in (8, 16):
        net = Network(10e9 / 8, ONE_WAY_LATENCY_S)
        rates = {c.label: simulate_curve(measured, c, workload, batch, n, net, stragglers=switch_stragglers)
                 for c in (Curve("ps (asp)", "ps", "asp"), Curve("ps (bsp)", "ps", "bsp"), Curve("ddp", "ddp"))}
        for label, rate in rates.items():
            if rate is not None:
                rows.append({"setup": f"Strategy-Switch: {n} workers, 10 Gbit/s, stragglers {switch_stragglers or 'none'}",
                             "system": label, "figure": "samples/s", "value": rate, "note": ""})
        if rates.get("ps (asp)") and rates.get("ps (bsp)"):
            rows.append({"setup": f"Strategy-Switch: {n} workers, 10 Gbit/s, stragglers {switch_stragglers or 'none'}",
                         "system": "ASP ÷ BSP", "figure": "throughput ratio", "value": rates["ps (asp)"] / rates["ps (bsp)"],
                         "note": "Sync-Switch (ResNet-32/CIFAR-10, 8 and 16 GPUs): up to 5.13x BSP's throughput"})
    return pd.DataFrame(rows)


def anchors(measured: MeasuredCosts) -> pd.DataFrame:
    """Published figures beside the model run in their setting (a sanity check, never a cost input)."""
    rows = []
    # Sergeev & Del Balso 2018: ResNet-101 (44.5 M parameters, 178 MB), 25 Gbit/s, ~110 images/s per
    # P100 at 64 images: ~88% efficiency at 128 GPUs with ring allreduce.
    net = Network(25e9 / 8, ONE_WAY_LATENCY_S)
    ddp = next((c for (s, _), c in sorted(measured.costs.items()) if s == "ddp"), None)
    if ddp is not None:
        gloo = replace(ddp, compute_cpu_s=0.0, update_cpu_s=0.0, model_bytes=178_000_000)
        links_only = replace(gloo, comm_fixed_s=0.0, allreduce_alpha_s=0.0, allreduce_beta_s_per_byte=0.0)
        for label, costs, why in (
                ("ring with this machine's gloo costs", gloo,
                 "gloo's per-byte cost here (CPU copies and sums, fitted on small models) is paid on 178 MB each "
                 "step, where the paper's GPUs reduce over NCCL/RDMA; and the ring starts after the whole backward "
                 "pass (one bucket, the pacing contract) where Horovod overlaps it with backprop"),
                ("ring on the links alone", links_only,
                 "only the wire (2 (N - 1)/N x 178 MB at 25 Gbit/s, 25 us a hop); still no overlap with backprop, "
                 "which the paper's 88% includes")):
            for n in (16, 128):
                spec = SimSpec("ddp", "resnet-101", n, 64, emulate_device="step_ms=581.8", max_steps=STEPS)
                one = 64 / 0.5818
                rate = steady_rate(pd.DataFrame(simulate_run(spec, costs, net).steps))
                rows.append({"anchor": "Horovod paper (Sergeev & Del Balso 2018), ResNet-101, 25 Gbit/s, 64 images "
                                       "at ~110 images/s per GPU", "model run": label,
                             "workers": n, "published": "88% at 128 GPUs" if n == 128 else "",
                             "model": f"{rate / (n * one):.0%}", "why it differs": why})
    return pd.DataFrame(rows)
