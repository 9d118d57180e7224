"""A queue model of the pipeline under Airflow, to compare control modes and gains.

What it models, as the pipeline runs:

* **Schedule.** The ingest DAG runs every interval ``B`` with ``max_active_runs=1`` and
  ``catchup=False``. A run scheduled for ``run_after`` starts at ``max(run_after, end of the
  previous run)`` (+ the scheduler's latency); the next run is due at
  ``max(run_after + B, floor(end / B) × B)`` — Airflow's delta timetable skips the intervals a long
  run missed. ``start − run_after`` is the scheduling delay the PID sees.
* **Plan.** At the start of a run the planner sees everything that has arrived (the broker's latest
  offsets) minus what earlier batches read (the ledger heads), and the controller's rate; the same
  :func:`~.allocation.plan_ranges` as the plan task sizes the batch (one partition here).
* **Cost.** The batch takes ``fixed_s + per_record_s × records / capacity factor × (1 + noise)``;
  an empty batch takes no time (no job is submitted).
* **Feedback.** The finished batch is fed to the controller with the same inputs as the record task.

Figures (:class:`Figures`): batches over the interval (all, and after a capacity drop), throughput
against the physical limit, lag, and the drain time of a backlog against its physical limit.
**Physical limit**: batches run back to back and each processes for exactly one whole interval at
the true capacity (:meth:`Scenario.physical_batch`); each run starts the scheduler's latency after
the previous one ended (:attr:`Scenario.physical_cycle_s`). The fastest drain of a backlog is
:func:`physical_drain_batches`, measured in intervals; :func:`physical_records` is the most any
controller reads in the run without a batch longer than the interval.

Pure: no Airflow, Spark or Kafka import.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from airflow_kafka_backpressure.batch.models import TopicPartition

from ..control.allocation import RateLimits, plan_ranges
from ..control.controller import PipelineController
from ..control.cost_mode import CostParams, PlanInputs, arrival_rate
from ..control.pid import PIDRateEstimator
from .profiles import ArrivalProfile, CapacityProfile


class ControllerSettings(Protocol):
    """What the simulator reads from the settings (``config.ControllerSettings`` has it)."""

    @property
    def mode(self) -> str: ...

    @property
    def backpressure_enabled(self) -> bool: ...

    def estimator(self, batch_interval_ms: int) -> PIDRateEstimator: ...

    def rate_limits(self, partitions: Sequence[TopicPartition] | None = None) -> RateLimits: ...

    def cost_params(self) -> CostParams: ...


#: How late Airflow starts a due run's first task (scheduler loop, task start): an assumption of a
#: couple of seconds, settable per scenario. The PID sees it as scheduling delay every batch.
DEFAULT_SCHEDULER_LATENCY_S = 2.0
_TP = TopicPartition("simulated", 0)
#: :attr:`Figures.caught_up` looks at this many first batches.
CATCH_UP_WINDOW = 10


@dataclass(frozen=True)
class Scenario:
    """One experiment: the interval, how long it runs, arrivals and capacity.

    ``drain_from_s``: measure the drain of the backlog present at the first plan at or after this
    time; with ``drain_after_change`` (capacity came back) at the plan after the first batch that
    ran at the new capacity — no feedback controller can know a capacity before one batch shows it.
    ``overload_from_s``: batches over the interval are also counted from this time (a drop).
    """

    name: str
    description: str
    batch_interval_s: float
    duration_s: float
    arrivals: ArrivalProfile
    capacity: CapacityProfile
    drain_from_s: float | None = None
    drain_after_change: bool = False
    overload_from_s: float | None = None
    scheduler_latency_s: float = DEFAULT_SCHEDULER_LATENCY_S
    #: when the first run is due (None: one interval after the arrivals start); a pipeline started
    #: on a live topic has its first run seconds after it, on the few records that arrived since
    first_run_s: float | None = None

    @property
    def batches(self) -> int:
        return int(self.duration_s // self.batch_interval_s)

    @property
    def physical_cycle_s(self) -> float:
        """How often batches start at the physical limit: back to back, each processing for one
        whole interval, each run started the scheduler's latency after the previous one ended."""
        return self.batch_interval_s + self.scheduler_latency_s

    def physical_batch(self, t: float, noise: tuple[float, float] = (0.0, 0.0)) -> float:
        """The physical limit of one batch starting at ``t``: it uses the whole interval."""
        return self.capacity.records_within(self.batch_interval_s, t, noise)

    def with_seed(self, seed: int) -> Scenario:
        return replace(self, capacity=replace(self.capacity, seed=seed))

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "batch_interval_s": self.batch_interval_s,
            "duration_s": self.duration_s,
            "arrivals": self.arrivals.to_dict(),
            "capacity": self.capacity.to_dict(),
            "drain_from_s": self.drain_from_s,
            "drain_after_change": self.drain_after_change,
            "overload_from_s": self.overload_from_s,
            "scheduler_latency_s": self.scheduler_latency_s,
            "first_run_s": self.first_run_s,
        }


@dataclass(frozen=True)
class BatchRow:
    """One simulated batch (times in seconds from the start)."""

    batch_id: int
    run_after: float
    start: float
    scheduling_delay: float
    available: int  # records arrived and not yet read, at plan time
    rate: float | None  # what the planner got (records/s; <= 0: no estimate)
    records: int
    processing: float
    end: float
    regime: str
    physical_batch: float  # records a whole-interval batch could have read at this batch's capacity

    def ratio(self, batch_interval_s: float) -> float:
        return self.processing / batch_interval_s

    @property
    def lag_after(self) -> int:
        return self.available - self.records


def physical_drain_batches(backlog: float, physical_batch: float, arrivals_per_batch: float) -> float:
    """The fastest possible drain, in batches: every batch uses the whole interval (it reads
    ``physical_batch`` records; longer batches would run over the interval).

    With ``backlog`` records available at the first plan, each batch reading ``physical_batch``
    records and ``arrivals_per_batch`` arriving per interval, the k-th batch reads the rest when
    ``backlog − (k − 1) × (physical_batch − arrivals_per_batch) <= physical_batch``, i.e.
    ``k = (backlog − arrivals) / (physical_batch − arrivals)`` (fractional; at least 1). Infinite
    when the capacity does not exceed the arrivals.
    """
    if backlog <= physical_batch:
        return 1.0
    surplus = physical_batch - arrivals_per_batch
    if surplus <= 0:
        return math.inf
    return max((backlog - arrivals_per_batch) / surplus, 1.0)


def physical_records(scenario: Scenario) -> int:
    """Records the physical limit reads by the end of the run: batches back to back, each
    processing for one whole interval (so it reads what arrived, up to what the true capacity —
    noise included — allows in one interval), each run starting the scheduler's latency after the
    previous one ended."""
    b, cycle = scenario.batch_interval_s, scenario.physical_cycle_s
    noise = scenario.capacity.noise_series(scenario.batches + 1)
    head, k, start = 0, 0, b + scenario.scheduler_latency_s
    while start + b <= scenario.duration_s and k < len(noise):
        head += min(scenario.arrivals.arrived(start) - head, int(scenario.physical_batch(start, noise[k])))
        start, k = start + cycle, k + 1
    return head


@dataclass(frozen=True)
class Figures:
    batches: int
    over_interval: int
    over_after_drop: int | None
    throughput: float  # records/s read by batches finished within the run
    physical_throughput: float
    final_lag: int
    max_lag: int
    lag_trend: float  # records/batch, least squares over the second half of the run
    drain_batches: float | None
    physical_drain: float | None
    mean_ratio: float
    p95_ratio: float
    min_rate: float | None  # the lowest rate the planner got after the first estimate
    read_share: float = 1.0  # records read / records arrived by the last finished batch's plan
    #: the first batch from which on every one of the first ``CATCH_UP_WINDOW`` batches read all that
    #: had arrived (1: none left anything behind)
    caught_up: int = 1

    @property
    def over_share(self) -> float:
        return self.over_interval / self.batches if self.batches else 0.0

    @property
    def throughput_share(self) -> float:
        return self.throughput / self.physical_throughput if self.physical_throughput > 0 else math.nan

    @property
    def drain_factor(self) -> float | None:
        if self.drain_batches is None or self.physical_drain in (None, 0):
            return None
        return self.drain_batches / self.physical_drain

    def lag_bounded(self, arrivals_per_batch: float) -> bool:
        """The lag does not grow: its trend over the second half is under 1% of the arrivals per
        batch, or the final lag is at most two batches of arrivals."""
        return self.lag_trend <= 0.01 * arrivals_per_batch or self.final_lag <= 2 * arrivals_per_batch

    def to_dict(self) -> dict[str, Any]:
        return {
            "batches": self.batches,
            "over_interval": self.over_interval,
            "over_share": self.over_share,
            "over_after_drop": self.over_after_drop,
            "throughput": self.throughput,
            "physical_throughput": self.physical_throughput,
            "throughput_share": self.throughput_share,
            "final_lag": self.final_lag,
            "max_lag": self.max_lag,
            "lag_trend": self.lag_trend,
            "drain_batches": self.drain_batches,
            "physical_drain": self.physical_drain,
            "drain_factor": self.drain_factor,
            "mean_ratio": self.mean_ratio,
            "p95_ratio": self.p95_ratio,
            "min_rate": self.min_rate,
            "read_share": self.read_share,
            "caught_up": self.caught_up,
        }


@dataclass
class SimulationResult:
    scenario: Scenario
    mode: str
    rows: list[BatchRow] = field(default_factory=list)
    events: list[str] = field(default_factory=list)
    warning: str | None = None
    controller: PipelineController | None = None

    def figures(self) -> Figures:
        return compute_figures(self.scenario, self.rows)


def _slope(ys: list[float]) -> float:
    n = len(ys)
    if n < 2:
        return 0.0
    mx, my = (n - 1) / 2, statistics.fmean(ys)
    den = sum((i - mx) ** 2 for i in range(n))
    return sum((i - mx) * (y - my) for i, y in enumerate(ys)) / den


def _drain(scenario: Scenario, rows: list[BatchRow]) -> tuple[float | None, float | None]:
    if scenario.drain_from_s is None:
        return None, None
    b = scenario.batch_interval_s
    idx = next((i for i, r in enumerate(rows) if r.start >= scenario.drain_from_s), None)
    if idx is not None and scenario.drain_after_change:
        idx += 1
    if idx is None or idx >= len(rows):
        return None, None
    first = rows[idx]
    cycles = scenario.physical_cycle_s / b  # a physical batch takes this many intervals
    arrivals = scenario.arrivals.rate_at(first.start) * scenario.physical_cycle_s
    physical = (
        physical_drain_batches(first.available, scenario.physical_batch(first.start), arrivals) * cycles
    )
    done = next((r for r in rows[idx:] if r.lag_after <= 0), None)
    if done is None:
        return math.inf, physical
    # the last batch counts for the share of a surplus batch it needed, as in the physical limit
    phys = scenario.physical_batch(done.start)
    last = min(max((done.available - arrivals) / (phys - arrivals), 0.0), 1.0) if phys > arrivals else 1.0
    return (done.start - first.start) / b + last * cycles, physical


def compute_figures(scenario: Scenario, rows: list[BatchRow]) -> Figures:
    b = scenario.batch_interval_s
    horizon = scenario.duration_s
    ratios = [r.ratio(b) for r in rows if r.records > 0]
    over = [r for r in rows if r.processing > b]
    over_after = (
        None
        if scenario.overload_from_s is None
        else sum(1 for r in over if r.start >= scenario.overload_from_s)
    )
    read = sum(r.records for r in rows if r.end <= horizon)
    lags = [r.available for r in rows]
    half = lags[len(lags) // 2 :]
    rates = [r.rate for r in rows[2:] if r.rate is not None and r.rate > 0]
    drain, physical_drain = _drain(scenario, rows)
    last = rows[-1] if rows else None
    final_lag = scenario.arrivals.arrived(horizon) - sum(r.records for r in rows if r.end <= horizon)
    sorted_ratios = sorted(ratios)
    finished = [r for r in rows if r.end <= horizon]
    could_read = scenario.arrivals.arrived(finished[-1].start) if finished else 0
    return Figures(
        batches=len(rows),
        over_interval=len(over),
        over_after_drop=over_after,
        throughput=read / horizon,
        physical_throughput=physical_records(scenario) / horizon,
        final_lag=max(final_lag, 0) if last else 0,
        max_lag=max(lags) if lags else 0,
        lag_trend=_slope([float(x) for x in half]),
        drain_batches=drain,
        physical_drain=physical_drain,
        mean_ratio=statistics.fmean(ratios) if ratios else 0.0,
        p95_ratio=sorted_ratios[min(len(sorted_ratios) - 1, int(0.95 * len(sorted_ratios)))]
        if ratios
        else 0.0,
        min_rate=min(rates) if rates else None,
        read_share=read / could_read if could_read > 0 else 1.0,
        caught_up=1 + max((r.batch_id for r in rows[:CATCH_UP_WINDOW] if r.lag_after > 0), default=0),
    )


def simulate(scenario: Scenario, settings: ControllerSettings) -> SimulationResult:
    """Run ``scenario`` under ``settings`` (mode, gains, limits: the settings Variable's keys)."""
    b = scenario.batch_interval_s
    b_ms = int(round(b * 1000))
    cap = scenario.capacity
    params = settings.cost_params()
    controller = PipelineController.new(settings.mode, settings, b_ms)
    limits = settings.rate_limits([_TP])
    noise = cap.noise_series(scenario.batches + 1)
    result = SimulationResult(scenario, settings.mode, controller=controller)

    # the first run is due one interval after the arrivals start, unless the scenario says when
    head, prev_end = 0, 0.0
    run_after = b if scenario.first_run_s is None else scenario.first_run_s
    history: list[tuple[int, int]] = []
    previous_budget: int | None = None
    draining = False
    k = 0
    while run_after < scenario.duration_s and k < len(noise):
        start = max(run_after, prev_end) + scenario.scheduler_latency_s
        delay = start - run_after
        latest = scenario.arrivals.arrived(start)
        available = latest - head
        history.append((int(start * 1000), latest))
        decision = controller.plan(
            params,
            PlanInputs(available, b, 1, arrival_rate(history), previous_budget, draining),
        )
        allocation = plan_ranges(
            {_TP: head},
            {_TP: 0},
            {_TP: latest},
            batch_interval_ms=b_ms,
            limits=limits,
            latest_rate=decision.rate if settings.backpressure_enabled else None,
        )
        records = allocation.records
        processing = cap.processing_s(records, start, noise[k], batch=k)
        startup = cap.startup_share * cap.fixed_at(k, noise[k][1]) if records > 0 else 0.0
        end = start + processing
        feedback = controller.on_batch_completed(
            batch_id=k + 1,
            time_ms=int(round(end * 1000)),
            records=records,
            processing_ms=int(round(processing * 1000)),
            scheduling_delay_ms=int(round(delay * 1000)),
            executors=1,
            window_batches=params.window_batches,
            params=params,
            left_behind=available - records,
            budget=None
            if decision.budget is None or decision.budget.records is None
            else float(decision.budget.records),
            batch_interval_s=b,
            startup_ms=int(round(startup * 1000)),
        )
        result.events.extend(controller.events(feedback))
        result.rows.append(
            BatchRow(
                batch_id=k + 1,
                run_after=run_after,
                start=start,
                scheduling_delay=delay,
                available=available,
                rate=decision.rate,
                records=records,
                processing=processing,
                end=end,
                regime=decision.budget.regime
                if decision.budget
                else ("pid" if decision.rate > 0 else "initial"),
                physical_batch=scenario.physical_batch(start, noise[k]),
            )
        )
        previous_budget = decision.budget.records if decision.budget else None
        draining = available - records > 0
        head += records
        prev_end = end
        run_after = max(run_after + b, math.floor(end / b) * b)
        k += 1
    result.warning = controller.warning(b)
    return result
