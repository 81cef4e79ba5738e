"""What a run gathered from a cluster must share with a local run's records."""
from __future__ import annotations

from pathlib import Path

from psbench.bench.harness.results import SuiteResults, load_suite
from psbench.core.spec import RunSpec


def assert_local_columns(gathered: SuiteResults, local: SuiteResults) -> None:
    """The same columns in every record table as the local run's, and every run column it has
    (the gathered runs may add their options' columns)."""
    for table in ("steps", "evals", "events"):
        assert list(getattr(gathered, table).columns) == list(getattr(local, table).columns), table
    assert set(local.runs.columns) <= set(gathered.runs.columns), set(local.runs.columns) - set(gathered.runs.columns)


def recorded_locally(results_dir: Path, system: str, options: dict | None = None) -> SuiteResults:
    """A local run's records of `system` as the harness's Recorder writes them (a short run, suite
    'local', that reaches no target: the run columns every run has, not those of an outcome): the
    columns a gathered run must share, without paying a second launch of the system."""
    from report_fixtures import fake_run

    fake_run(results_dir, "local", RunSpec(system, "mlp-digits", workers=2, options=options or {}), step_s=0.01,
             steps=6, target=1.0)
    return load_suite(results_dir / "local")
