"""What a run gathered from a cluster must share with a local run's records."""
from __future__ import annotations

from psbench.bench.harness.results import SuiteResults


def assert_local_columns(gathered: SuiteResults, local: SuiteResults) -> None:
    """The same columns in every record table as the local run's, and every run column it has
    (the gathered runs may add their options' columns)."""
    for table in ("steps", "evals", "events"):
        assert list(getattr(gathered, table).columns) == list(getattr(local, table).columns), table
    assert set(local.runs.columns) <= set(gathered.runs.columns)
