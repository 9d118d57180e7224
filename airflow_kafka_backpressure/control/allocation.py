"""The next batch's offset ranges: Spark's per-partition backpressure rules, plus what Spark lacks.

:func:`max_messages_per_partition` and :func:`clamp` follow ``DirectKafkaInputDStream``:

* with a rate estimate (or, before the first estimate, the initial rate) the rate is split across
  partitions in proportion to their lag, each share capped by the partition's max rate;
* without any rate (backpressure off and no initial rate), only the max rate per partition limits;
* each partition then gets ``batch seconds * rate`` records, truncated, but at least
  ``min_rate_per_partition`` records. As in Spark, that floor is a count per batch, not a rate;
* no limit at all when the limits add up to zero (no rate, no caps, or no lag anywhere);
* a range never goes past the latest offset.

:func:`cap_records` then applies a cap of records per batch over all partitions, like Structured
Streaming's ``maxOffsetsPerTrigger`` (which DStreams lack): when the ranges hold more, the cap is
shared in proportion to each range's size. It bounds every batch, the first batches of a new
pipeline included, whatever the rate says.

:func:`plan_ranges` adds what a scheduler that owns positions needs: first positions for partitions
never seen before (the group's committed offset, else ``earliest`` or ``latest`` for a topic not
read yet, else its earliest offset: a partition added later), detection of
positions below the earliest retained offset (data loss: fail, or skip and record it), and clear
errors for positions beyond the log end or partitions that disappeared.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from airflow_kafka_backpressure.batch.models import DataLoss, OffsetRange, TopicPartition

from .scala import to_long

STARTING_OFFSETS = ("earliest", "latest")
ON_DATA_LOSS = ("fail", "skip")
#: What the pipeline does when a topic was deleted and created again (see ``topic_identity``).
ON_TOPIC_RESET = ("fail", "earliest")


class PlanningError(ValueError):
    """The positions and the broker's offsets do not fit together; the message says how to fix it."""


class DataLossError(PlanningError):
    def __init__(self, losses: list[DataLoss]):
        self.losses = losses
        detail = "; ".join(
            f"{TopicPartition(d.topic, d.partition)}: offsets [{d.from_offset}, {d.until_offset}) "
            f"({d.lost} records) were deleted by retention before they were read"
            for d in losses
        )
        super().__init__(
            f"Data loss: {detail}. Set on_data_loss='skip' to continue from the earliest available "
            "offset and record the loss in the ledger, or restore the data."
        )


@dataclass(frozen=True)
class RateLimits:
    """Spark's ``spark.streaming.kafka.{max,min}RatePerPartition`` and ``backpressure.initialRate``.

    ``max_rate_per_partition`` may be overridden for single partitions (``max_rate_overrides``).
    """

    max_rate_per_partition: int = 0
    min_rate_per_partition: int = 1
    initial_rate: int = 0
    max_rate_overrides: Mapping[TopicPartition, int] = field(default_factory=dict)
    max_records_per_batch: int = 0  # 0: no cap (Spark's DStreams have none)

    def max_rate(self, tp: TopicPartition) -> int:
        return int(self.max_rate_overrides.get(tp, self.max_rate_per_partition))

    def min_rate(self, tp: TopicPartition) -> int:
        return self.min_rate_per_partition


def max_messages_per_partition(
    current: Mapping[TopicPartition, int],
    latest: Mapping[TopicPartition, int],
    batch_interval_ms: int,
    limits: RateLimits,
    latest_rate: float | None,
) -> dict[TopicPartition, int] | None:
    """Records each partition may read in the next batch, or None for no limit.

    ``latest_rate`` is the rate controller's last rate limit (records/s; <= 0 or None when there is
    no estimate yet), or None when backpressure is off. As in Spark, the initial rate replaces a
    missing estimate only while backpressure is on.
    """
    estimated: float | None = None
    if latest_rate is not None:
        estimated = latest_rate if latest_rate > 0 else limits.initial_rate

    if estimated is not None and estimated > 0:
        lag = {tp: max(latest[tp] - current[tp], 0) for tp in latest}
        total_lag = sum(lag.values())
        if total_lag == 0:
            # Spark divides 0 by 0 here and ends up with no limit; there is nothing to read anyway.
            return None
        effective: dict[TopicPartition, float] = {}
        for tp, tp_lag in lag.items():
            backpressure_rate = tp_lag / total_lag * estimated
            cap = limits.max_rate(tp)
            effective[tp] = min(backpressure_rate, cap) if cap > 0 else backpressure_rate
    else:
        effective = {tp: float(limits.max_rate(tp)) for tp in latest}

    if sum(effective.values()) > 0:
        secs_per_batch = batch_interval_ms / 1000
        return {
            tp: max(to_long(secs_per_batch * limit), limits.min_rate(tp)) for tp, limit in effective.items()
        }
    return None


def clamp(
    current: Mapping[TopicPartition, int],
    latest: Mapping[TopicPartition, int],
    max_messages: Mapping[TopicPartition, int] | None,
) -> dict[TopicPartition, int]:
    """Until-offsets: ``current + max messages``, never past ``latest``."""
    if max_messages is None:
        return dict(latest)
    return {tp: min(current[tp] + max_messages[tp], latest[tp]) for tp in latest}


def cap_records(
    current: Mapping[TopicPartition, int], until: Mapping[TopicPartition, int], cap: int
) -> dict[TopicPartition, int]:
    """Until-offsets holding at most ``cap`` records in total (``cap`` <= 0: unchanged).

    Each partition keeps the floor of its proportional share of the cap; the records left by the
    rounding go to the largest remainders (ties: topic-partition order), so the total is exactly
    ``cap`` whenever the ranges held more.
    """
    counts = {tp: until[tp] - current[tp] for tp in until}
    total = sum(counts.values())
    if cap <= 0 or total <= cap:
        return dict(until)
    shares = {tp: cap * n / total for tp, n in counts.items()}
    kept = {tp: int(share) for tp, share in shares.items()}
    left = cap - sum(kept.values())
    for tp in sorted(counts, key=lambda t: (-(shares[t] - kept[t]), t))[:left]:
        kept[tp] += 1
    return {tp: current[tp] + kept[tp] for tp in until}


@dataclass(frozen=True)
class Allocation:
    ranges: tuple[OffsetRange, ...]
    data_loss: tuple[DataLoss, ...]
    new_partitions: tuple[TopicPartition, ...]
    rate_limit: float | None  # the rate the limits were computed from (None: no backpressure rate)
    limited: bool  # False when no limit applied and every range runs to the latest offset

    @property
    def records(self) -> int:
        return sum(r.count for r in self.ranges)


def starting_positions(
    positions: Mapping[TopicPartition, int],
    earliest: Mapping[TopicPartition, int],
    latest: Mapping[TopicPartition, int],
    committed: Mapping[TopicPartition, int],
    starting_offsets: str,
) -> tuple[dict[TopicPartition, int], tuple[TopicPartition, ...]]:
    """Where each partition starts: the ledger position, else the committed offset, else the
    policy. ``starting_offsets`` is for a topic the pipeline has not read yet: a partition added to
    a topic it already reads starts at its earliest offset, as in Spark (what was produced into it
    before the plan saw it would be skipped at ``latest``)."""
    if starting_offsets not in STARTING_OFFSETS:
        raise PlanningError(f"starting_offsets must be one of {STARTING_OFFSETS}, got {starting_offsets!r}")
    gone = sorted(tp for tp in positions if tp not in latest)
    if gone:
        raise PlanningError(
            f"Partitions {[str(tp) for tp in gone]} have recorded positions but the broker no longer "
            "lists them (topic deleted or recreated with fewer partitions?). Restore the topic, or "
            "remove the topic from the pipeline."
        )
    start: dict[TopicPartition, int] = {}
    new: list[TopicPartition] = []
    read_topics = {tp.topic for tp in positions}
    for tp in sorted(latest):
        if tp in positions:
            start[tp] = positions[tp]
        elif committed.get(tp) is not None and committed[tp] >= 0:
            start[tp] = committed[tp]
            new.append(tp)
        else:
            from_earliest = starting_offsets == "earliest" or tp.topic in read_topics
            start[tp] = earliest[tp] if from_earliest else latest[tp]
            new.append(tp)
    return start, tuple(new)


def plan_ranges(
    positions: Mapping[TopicPartition, int],
    earliest: Mapping[TopicPartition, int],
    latest: Mapping[TopicPartition, int],
    *,
    batch_interval_ms: int,
    limits: RateLimits = RateLimits(),
    latest_rate: float | None = None,
    committed: Mapping[TopicPartition, int] | None = None,
    starting_offsets: str = "earliest",
    on_data_loss: str = "fail",
) -> Allocation:
    """The next batch: one ``[from, until)`` range for every partition the broker lists.

    :param positions: where each known partition's last range ended (the ledger's heads).
    :param earliest: earliest retained offset of every partition.
    :param latest: log-end offset of every partition (the set of partitions to plan).
    :param latest_rate: the rate controller's rate limit; None when backpressure is off.
    :param committed: the consumer group's committed offsets, used for partitions never planned.
    """
    if batch_interval_ms <= 0:
        raise PlanningError(f"batch_interval_ms must be > 0, got {batch_interval_ms}")
    if on_data_loss not in ON_DATA_LOSS:
        raise PlanningError(f"on_data_loss must be one of {ON_DATA_LOSS}, got {on_data_loss!r}")
    missing = sorted(tp for tp in latest if tp not in earliest)
    if missing:
        raise PlanningError(f"No earliest offset for {[str(tp) for tp in missing]}")

    current, new_partitions = starting_positions(
        positions, earliest, latest, committed or {}, starting_offsets
    )

    beyond = sorted(tp for tp in current if current[tp] > latest[tp])
    if beyond:
        detail = ", ".join(f"{tp} at {current[tp]} > latest {latest[tp]}" for tp in beyond)
        raise PlanningError(
            f"Positions are beyond the end of the log: {detail}. The topic was probably deleted and "
            "recreated, or the broker lost its data. Nothing was planned; reset the pipeline's "
            "positions (a new pipeline name or a cleaned ledger) once you know which data is wanted."
        )

    losses = [
        DataLoss(tp.topic, tp.partition, current[tp], earliest[tp])
        for tp in sorted(current)
        if current[tp] < earliest[tp]
    ]
    if losses:
        if on_data_loss == "fail":
            raise DataLossError(losses)
        for d in losses:
            current[TopicPartition(d.topic, d.partition)] = d.until_offset

    max_messages = max_messages_per_partition(current, latest, batch_interval_ms, limits, latest_rate)
    until = clamp(current, latest, max_messages)
    capped = cap_records(current, until, limits.max_records_per_batch)
    limited = max_messages is not None or capped != until
    until = capped
    ranges = tuple(OffsetRange(tp.topic, tp.partition, current[tp], until[tp]) for tp in sorted(latest))
    rate_used: float | None = None
    if latest_rate is not None:
        rate_used = float(latest_rate if latest_rate > 0 else limits.initial_rate) or None
    return Allocation(
        ranges=ranges,
        data_loss=tuple(losses),
        new_partitions=new_partitions,
        rate_limit=rate_used,
        limited=limited,
    )
