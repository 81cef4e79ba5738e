"""The thesis' claims, each typed once: the papers' figures as they reported them, the bounds our
rules test them against, and the words a verdict can take. The findings' modules and the report's
captions read them from here; none of these is a measured figure."""
from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Verdict(StrEnum):
    """A finding's verdict, printed as its value."""
    REPRODUCED = "reproduced"
    NOT_REPRODUCED = "not reproduced"
    INCONCLUSIVE = "inconclusive"
    SUBSET = "shown, not the verdict"  # a smaller design's, beside the design with the most seeds


@dataclass(frozen=True)
class KasselaClaim:
    """Kassela et al., IEEE BigData 2019: per-mini-batch time against the mini-batch."""
    finding: str
    ps_fall: float          # the paper: the PS's time fell up to this much as mini-batches shrank
    spark_fall: float       # ... Spark MLlib's at most this much
    ps_fall_min: float      # our rule: the PS's fall 100 % -> 1 % at least this
    spark_fall_max: float   # ... Spark MLlib's at most this

    @property
    def paper(self) -> str:
        return (f"PS per-mini-batch time fell up to {self.ps_fall:g}x as mini-batches shrank; Spark MLlib's at most "
                f"{self.spark_fall:g}x (Kassela et al., IEEE BigData 2019)")


@dataclass(frozen=True)
class ThroughputClaim:
    """The thesis' abstract: specialised systems above general-purpose data-processing frameworks."""
    finding: str
    paper: str
    margin: float  # "substantially higher": a twin's interval must clear this, not merely 1


@dataclass(frozen=True)
class SwitchClaim:
    """Strategy-Switch (Provatas et al., IEEE Access 2025) against its own synchronous system."""
    finding: str
    paper: str
    speedup_min: float  # our rule: time to target, sync's ÷ switch's, at least this
    accuracy_pp: float  # ... final accuracy at most this many points below sync's


@dataclass(frozen=True)
class ShardingClaim:
    """Provatas et al., IEEE BigData 2021: variance of final metrics, random shards ÷ a strategy's."""
    finding: str            # one finding a strategy: '{strategy} shards lower run-to-run variance'
    distribution_aware: float  # on training accuracy (CIFAR-10, k=30)
    stratified: float       # on validation accuracy (CIFAR-100 coarse)
    validation: float       # distribution-aware on validation, about; the smallest reduction reported,
                            # so the effect a design is powered to detect or rule out
    runs: int               # runs a strategy
    paper_source: str = "Provatas et al., IEEE BigData 2021"

    @property
    def effect(self) -> float:
        return self.validation

    @property
    def paper(self) -> str:
        return (f"variance of final metrics, random ÷ strategy: distribution-aware {self.distribution_aware:g}x on "
                f"training accuracy (CIFAR-10, k=30), ~{self.validation:g}x on validation; stratified "
                f"{self.stratified:g}x on validation accuracy (CIFAR-100 coarse) ({self.paper_source})")

    def per_strategy(self, family: str) -> str | None:
        """The paper's figure for one strategy (None: a strategy the paper did not report alone)."""
        return {
            "stratified": f"stratified shards: validation-accuracy variance {self.stratified:g}x lower than random "
                          f"(CIFAR-100 coarse, {self.runs} runs a strategy; {self.paper_source})",
            "distribution-aware": f"distribution-aware shards: training-accuracy variance {self.distribution_aware:g}x "
                                  f"lower than random (CIFAR-10, k=30), ~{self.validation:g}x on validation "
                                  f"({self.runs} runs a strategy; {self.paper_source})",
        }.get(family)


KASSELA = KasselaClaim(finding="per-mini-batch time falls with the mini-batch for the PS, not for Spark MLlib",
                       ps_fall=14.0, spark_fall=1.36, ps_fall_min=10.0, spark_fall_max=1.5)
THROUGHPUT = ThroughputClaim(
    finding="specialised systems' throughput above Spark's data-processing paths, like for like",
    paper="specialised architectures deliver substantially higher throughput than general-purpose data-processing "
          "frameworks at large scales (the thesis' abstract; a claim, no figure)",
    margin=1.2)
SWITCH = SwitchClaim(
    finding="Strategy-Switch: sync accuracy, sooner to target",
    paper="Strategy-Switch: accuracy comparable to synchronous all-reduce while training much faster (Provatas et al., "
          "IEEE Access 2025); Sync-Switch: up to 5x faster to target (ICDCS 2021)",
    speedup_min=1.3, accuracy_pp=0.5)
SHARDING = ShardingClaim(finding="{} shards lower run-to-run variance", distribution_aware=8.48, stratified=6.11,
                         validation=2.0, runs=5)
SHARDING_ANY = "smarter sharding lowers run-to-run variance"  # the claim over every strategy at once
