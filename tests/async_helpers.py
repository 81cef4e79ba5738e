"""The accuracy bar for asynchronous runs (PS ASP/SSP, Strategy-Switch's async phase).

An async run's order of updates depends on scheduling, so a single evaluation can land in a dip:
mlp-digits with 2 workers and 5 epochs ends at 0.86-0.96 val accuracy, but CI once saw 0.78 at the
last evaluation of an SSP run. The bar is on the median of the last three evaluations, which a dip
at one of them does not move, while a run that stopped learning or diverged still fails it."""
from __future__ import annotations

import statistics
from collections.abc import Iterable

ASYNC_ACCURACY = 0.85  # mlp-digits, 2 workers, 5 epochs: 0.86-0.96 measured at the last evaluation
SETTLED_EVALS = 3


def settled_accuracy(val_accuracies: Iterable[float]) -> float:
    """Median of the last SETTLED_EVALS validation accuracies (in step order)."""
    tail = list(val_accuracies)[-SETTLED_EVALS:]
    assert len(tail) == SETTLED_EVALS, f"need {SETTLED_EVALS} val evaluations, got {len(tail)}"
    return statistics.median(tail)
