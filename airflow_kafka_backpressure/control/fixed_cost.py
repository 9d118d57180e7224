"""What a fitted cost model says about the fixed cost to the user and the planner: the warning
that it takes too much of the interval, and the smallest batch whose fixed cost is at most a share
of its time (``min_batch_fixed_share``).

Pure: no Airflow, Spark or Kafka import.
"""

from __future__ import annotations

import math

from .cost import CostFit

#: The warning fires when the fixed cost is at least this share of the interval ...
FIXED_COST_WARNING_SHARE = 0.5
#: ... this many standard errors below its estimate: an intercept measured on batches of nearly one
#: size under noise is not evidence (noise-90, a true share of 25%, warned in 7 of 20 seeds; with 1σ: 2,
#: and fixed-80 still warns in 20 of 20; 2σ would miss 5 of those).
FIXED_COST_WARNING_SIGMAS = 1.0


def fixed_cost_warning(fit: CostFit | None, batch_interval_s: float) -> str | None:
    """The warning shown in the task log and on the monitoring page, or None."""
    if fit is None or batch_interval_s <= 0:
        return None
    share = fit.fixed_s / batch_interval_s
    surely = fit.fixed_s - FIXED_COST_WARNING_SIGMAS * (fit.fixed_se_s or 0.0)
    if surely < FIXED_COST_WARNING_SHARE * batch_interval_s:
        return None
    return (
        f"fixed cost {fit.fixed_s:.1f} s is {share:.0%} of the interval: raise the interval or use the "
        "connect engine"
    )


def records_for_fixed_share(fit: CostFit | None, share: float, executors: int = 1) -> int:
    """The smallest batch whose fixed cost is at most ``share`` of its predicted time (the cost
    mode's own ``min_records_per_batch``): ``fixed / (fixed + per_record × n / executors) <= share``.
    0 without a model, with ``share`` 0 (off) or without a per-record cost."""
    if fit is None or share <= 0 or fit.per_record_s <= 0 or fit.fixed_s <= 0:
        return 0
    if share >= 1:
        return 0
    return math.ceil(fit.fixed_s * (1 - share) / share / fit.per_record_s * max(executors, 1))
