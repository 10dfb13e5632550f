"""``python -m serving.tune --model PATH [--p99-ms 50]``: measure, then recommend settings.

Runs the batch-size sweep (``predict_batch`` in-process at 1, 2, 4, ..., 1024 instances,
rows drawn from the model's input schema, typed columns included) on this machine and
prints recommended ``SERVING_MAX_BATCH_SIZE``,
``SERVING_BATCH_POLICY``/``SERVING_MAX_BATCH_LATENCY_MS``, workers and threads for the p99
latency budget, with the reasoning:

- **plateau start**: the smallest batch size within 10 % of the best rows/s. Past it a
  bigger batch buys almost no throughput and only adds latency.
- **concurrency**: a worker can only batch the requests in flight in it, so no batch
  larger than (concurrent clients / workers) ever forms; bigger settings are no use.
- **queueing budget**: under the adaptive policy a request waits at most for the predict
  call running when it arrives, then its own: about ``2 x t(b)`` for a call of ``b``
  instances taking ``t(b)``. Keep that under half the p99 budget; the other half is
  headroom for HTTP, parsing and bursts.
- **Little's law**: instances in flight per worker = arrival rate x time in system; a
  batch of ``b`` can only form with ``b`` requests waiting, so threads = 2 x b (one batch
  filling while the previous runs).
- **utilisation**: plan for at most 70 % of measured capacity, where queueing delay is
  still small (M/D/1 waiting time grows as rho / (1 - rho)).
- **when no setting meets the budget** (even two calls of one instance exceed half of
  it): the tool says so and recommends the *knee*, the largest batch whose call costs at
  most 25 % more than a call of one instance: the most capacity for about the latency
  that cannot be avoided anyway (a 300-tree forest costs ~the same for 1 and 64 rows).

Measurement: every size is first called a few times (warmup: lazy initialisation, caches,
the allocator), then timed in several rounds interleaved over the sizes, so a burst of
noise from another process spreads over sizes instead of landing on one; each size's cost
is the median of its calls. The recommendation then reads the costs through a monotone
envelope (a batch never costs more than a bigger one), which absorbs a slow outlier that
survives the median.
"""

from __future__ import annotations

from serving.tune.advice import Recommendation, recommend
from serving.tune.cli import load_as_served, main, plot
from serving.tune.sweep import SweepPoint, knee, monotone, plateau_start, schema_rows, sweep

__all__ = [
    "Recommendation",
    "SweepPoint",
    "knee",
    "load_as_served",
    "main",
    "monotone",
    "plateau_start",
    "plot",
    "recommend",
    "schema_rows",
    "sweep",
]
