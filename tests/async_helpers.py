"""The accuracy bar for asynchronous runs (PS ASP/SSP, Strategy-Switch's async phase): mlp-digits,
2 workers, ASYNC_EPOCHS epochs (`single` ends 5 at 0.95-0.96).

The async curves used to zigzag by up to ±0.1 near the end and the bar had been loosened twice to
let them pass (best of the last three >= 0.85, last >= 0.5). The cause was the settings:
- lr / N (the old `lr_scaling auto`) with the per-worker batch kept at the workload's: two async
  workers moved half as far as `single` and were still climbing, noisily, at the end;
- server momentum 0.9 on top of the momentum asynchrony brings by itself (about 1 - 1/N,
  Mitliagkas et al. 2016): an effective ~0.95 that overshoots, most after a switch's hand-over.
Now lr is the workload's and momentum 1 - (1 - 0.9) * N (`momentum_scaling auto`). Measured on this
2-core machine under other load (final val accuracy; seeds 0-9 for ASP, 0-4 otherwise):

    setting       ASP (n=10)     SSP:1 (n=5)    switch (n=5)   ASP, 4 workers (n=3 / 2)
    before        0.897-0.953    0.900-0.958    0.889-0.955    0.758-0.894
    now           0.944-0.969    0.866-0.950    0.922-0.964    0.894-0.919

and the mean of the last three evaluations was >= 0.90 in every 2-worker run of that sample.

That did not make the tests reliable: on a quiet machine 2 of 20 ASP runs (seeds 0-19) still had a
last-three mean below 0.85 (0.773, 0.822), with evaluations as low as 0.58 two before the end, and
CI failed an SSP:1 run at [0.82, 0.79, 0.91]. The cause is the length of the run, not noise on the
validation set: 5 epochs are 115 steps a worker, and delayed gradients slow and shake the early,
fast-moving phase of training. An in-process replay (two workers alternating, each gradient taken
on the weights one update old, the same data and lr; 10 seeds) zigzags (the mean |change| over the
last five evaluations, median over seeds) by 0.042 at 5 epochs with momentum 0.8 (`auto` for 2
workers) and by 0.022 at 10, against 0.017 and 0.010 with no delay; momentum 0.9 kept gave 0.061,
and other lr or momentum at 5 epochs 0.038-0.071. So the async tests train ASYNC_EPOCHS = 10
(230 steps a worker). Measured, the real PS, seeds 0-19 each, with another CPU-bound process
running beside it:

    10 epochs   last-three mean min / median   last min   zigzag (as above)
    ASP         0.941 / 0.963                  0.947      0.009
    SSP:1       0.912 / 0.964                  0.905      0.013

and, the same way: switch (fixed:fraction=0.4) seeds 0-9 0.866 / 0.964 (seed 4; seed 0, the
test's, 0.938-0.969 in 7 runs), rpc-ps and ray-ps ASP seeds 0-5 0.931 / 0.964.

The bar: the mean of the last three evaluations >= ASYNC_ACCURACY and the last >= ASYNC_FLOOR.
A run ending at 0.6 fails, and so does one that zigzags around 0.8 (its mean is below 0.85); the
floor catches a run that diverges at its very end (it ends near 0.1). Both keep a margin of 0.06
and 0.1 to the lowest run measured: a single evaluation on 360 examples still dips (one of the 40
runs above had 0.836 two evaluations before its end)."""
from __future__ import annotations

from collections.abc import Iterable

ASYNC_EPOCHS = 10      # how long an async test trains mlp-digits with 2 workers (the workload default is 5)
ASYNC_ACCURACY = 0.85  # mean of the last 3 val evaluations: >= 0.912 measured at ASYNC_EPOCHS (n=40 runs)
ASYNC_FLOOR = 0.80     # the last evaluation: >= 0.905 measured; a diverged run ends near 0.1
RECENT_EVALS = 3


def check_async_learned(val_accuracies: Iterable[float]) -> None:
    """Assert the bar above on validation accuracies in step order."""
    accuracies = [float(a) for a in val_accuracies]
    assert len(accuracies) >= RECENT_EVALS, f"need {RECENT_EVALS} val evaluations, got {len(accuracies)}"
    recent = accuracies[-RECENT_EVALS:]
    assert sum(recent) / RECENT_EVALS >= ASYNC_ACCURACY, \
        f"mean of the last {RECENT_EVALS} val accuracies {recent} < {ASYNC_ACCURACY}"
    assert recent[-1] >= ASYNC_FLOOR, f"last val accuracy {recent[-1]} < {ASYNC_FLOOR}"
