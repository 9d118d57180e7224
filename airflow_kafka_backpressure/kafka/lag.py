"""A pipeline's lag and retention risk, per topic-partition.

Definitions (the sensor, its trigger and the monitoring page all use these):

* **position** — the oldest offset of the partition that is not yet durably written: the pipeline's
  consumer-group committed offset. The pipeline commits the group only up to the end of the
  contiguous run of batches whose output was swapped into the sink, never past a failed batch that
  still waits for its replay, so everything below the position is in the sink and everything from it
  on may still have to be read. A partition the group never committed counts from where the
  pipeline starts reading it (``starting_offsets``: the earliest or the latest offset), as the
  planner does.
* **head** — where the pipeline's next batch starts (the ledger: the end of the partition's last
  planned range). ``head - position`` records are planned, running or failed, not yet committed.
* **lag** — ``latest - position``: records the sink does not hold yet.
* **seconds behind** — the age, by its Kafka timestamp, of the record at the position (the oldest
  record not yet written): ``now - timestamp``; 0 when the lag is 0, None when it could not be read.
  The timestamp is the producer's (``CreateTime``) or the broker's (``LogAppendTime``), whichever the
  topic keeps; a producer with a skewed clock skews it.
* **retention margin** — ``position - earliest``: how many records retention may still delete
  before it deletes data the pipeline has not written. A partition with unread data (lag > 0) is
  **at risk** when its margin is at or below the chosen margin (Camus' "falling behind" rule), and
  has **lost** ``earliest - position`` records when retention already went past its position.

Pure: no Airflow, Kafka or Spark import. :func:`measure_lag` takes the clients it reads from.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from airflow_kafka_backpressure.batch.models import TopicPartition


@dataclass(frozen=True)
class PartitionLag:
    topic: str
    partition: int
    earliest: int
    latest: int
    position: int
    position_source: str  # "committed" or "starting_offsets=<policy>"
    head: int | None
    lag: int
    in_flight: int | None
    retention_margin: int
    at_risk: bool
    lost: int
    oldest_unwritten_ts_ms: int | None = None
    seconds_behind: float | None = None

    @property
    def tp(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def partition_lag(
    tp: TopicPartition,
    *,
    earliest: int,
    latest: int,
    committed: int | None,
    head: int | None,
    starting_offsets: str,
    retention_margin_records: int,
    timestamp_ms: int | None = None,
    now_ms: int,
) -> PartitionLag:
    """One partition's figures (see the module docstring for the definitions)."""
    if committed is not None:
        position, source = committed, "committed"
    else:
        position = earliest if starting_offsets == "earliest" else latest
        source = f"starting_offsets={starting_offsets}"
    lag = max(latest - position, 0)
    margin = position - earliest
    if lag == 0:
        seconds: float | None = 0.0
    elif timestamp_ms is not None and timestamp_ms >= 0:
        seconds = max(now_ms - timestamp_ms, 0) / 1000.0
    else:
        seconds = None
    return PartitionLag(
        topic=tp.topic,
        partition=tp.partition,
        earliest=earliest,
        latest=latest,
        position=position,
        position_source=source,
        head=head,
        lag=lag,
        in_flight=None if head is None else max(head - position, 0),
        retention_margin=margin,
        at_risk=lag > 0 and margin <= retention_margin_records,
        lost=max(earliest - position, 0),
        oldest_unwritten_ts_ms=timestamp_ms
        if lag > 0 and timestamp_ms is not None and timestamp_ms >= 0
        else None,
        seconds_behind=seconds,
    )


@dataclass(frozen=True)
class LagReport:
    """A pipeline's partitions at one moment; ``to_dict()`` is JSON-safe (XCom, trigger events, UI)."""

    pipeline: str
    group: str
    measured_at_ms: int
    retention_margin_records: int
    partitions: tuple[PartitionLag, ...]

    @property
    def total_lag(self) -> int:
        return sum(p.lag for p in self.partitions)

    @property
    def max_seconds_behind(self) -> float | None:
        """The largest known seconds behind; None if a partition with lag has no timestamp."""
        known = [p.seconds_behind for p in self.partitions if p.seconds_behind is not None]
        if len(known) < len(self.partitions):
            return None
        return max(known, default=0.0)

    @property
    def at_risk(self) -> list[PartitionLag]:
        return [p for p in self.partitions if p.at_risk]

    def to_dict(self) -> dict[str, Any]:
        return {
            "pipeline": self.pipeline,
            "group": self.group,
            "measured_at_ms": self.measured_at_ms,
            "retention_margin_records": self.retention_margin_records,
            "total_lag": self.total_lag,
            "max_seconds_behind": self.max_seconds_behind,
            "at_risk": [str(p.tp) for p in self.at_risk],
            "partitions": [p.to_dict() for p in self.partitions],
        }


@dataclass(frozen=True)
class LagThresholds:
    """When a lag sensor fires: any threshold crossed.

    :param max_lag_records: the pipeline's total lag (over all its partitions) is above this.
    :param max_seconds_behind: some partition's oldest unwritten record is older than this (s).
    :param retention_margin_records: some partition with unread data has its position within this
        many records of the earliest retained offset (0: at the earliest offset or past it).
    """

    max_lag_records: int | None = None
    max_seconds_behind: float | None = None
    retention_margin_records: int | None = None

    def __post_init__(self) -> None:
        for name in ("max_lag_records", "max_seconds_behind", "retention_margin_records"):
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0
            ):
                raise ValueError(f"{name} = {value!r} is invalid: give a number >= 0, or None to not use it")
        if (
            self.max_lag_records is None
            and self.max_seconds_behind is None
            and self.retention_margin_records is None
        ):
            raise ValueError(
                "No threshold given: set max_lag_records, max_seconds_behind or retention_margin_records"
            )

    @property
    def needs_timestamps(self) -> bool:
        return self.max_seconds_behind is not None

    def crossed(self, report: LagReport) -> list[str]:
        """Why the report crosses the thresholds (empty: it does not)."""
        reasons = []
        if self.max_lag_records is not None and report.total_lag > self.max_lag_records:
            reasons.append(
                f"lag of pipeline {report.pipeline!r} is {report.total_lag} records, above "
                f"max_lag_records={self.max_lag_records}"
            )
        if self.max_seconds_behind is not None:
            for p in report.partitions:
                if p.seconds_behind is not None and p.seconds_behind > self.max_seconds_behind:
                    reasons.append(
                        f"{p.tp}: the oldest unwritten record (offset {p.position}) is {p.seconds_behind:g} s "
                        f"old, above max_seconds_behind={self.max_seconds_behind:g}"
                    )
        if self.retention_margin_records is not None:
            for p in report.partitions:
                if p.lag > 0 and p.retention_margin <= self.retention_margin_records:
                    reasons.append(_retention_reason(p, self.retention_margin_records))
        return reasons

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _retention_reason(p: PartitionLag, margin: int) -> str:
    if p.lost:
        return (
            f"{p.tp}: retention already deleted {p.lost} unwritten records (position {p.position}, "
            f"earliest retained offset {p.earliest})"
        )
    return (
        f"{p.tp}: position {p.position} is {p.retention_margin} records from the earliest retained offset "
        f"{p.earliest} (retention_margin_records={margin}); retention will delete unwritten data next"
    )


class OffsetSource(Protocol):
    """What :func:`measure_lag` reads from the broker (``KafkaOffsets`` implements it)."""

    def partitions(self, topics: Iterable[str]) -> list[TopicPartition]: ...
    def earliest_offsets(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]: ...
    def latest_offsets(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]: ...
    def committed_offsets(
        self, group_id: str, tps: Iterable[TopicPartition]
    ) -> dict[TopicPartition, int]: ...
    def record_timestamps(self, offsets: Mapping[TopicPartition, int]) -> dict[TopicPartition, int]: ...


class HeadSource(Protocol):
    """What :func:`measure_lag` reads from the ledger (``Ledger`` implements it)."""

    def heads(self, pipeline: str) -> dict[TopicPartition, int]: ...


def measure_lag(
    kafka: OffsetSource,
    ledger: HeadSource | None,
    *,
    pipeline: str,
    topics: Iterable[str],
    group: str,
    starting_offsets: str = "earliest",
    retention_margin_records: int = 0,
    with_timestamps: bool = False,
    now_ms: int | None = None,
) -> LagReport:
    """Read the broker (and the ledger's heads) and compute every partition's figures.

    Timestamps are read only with ``with_timestamps`` (one fetch per partition that has lag)."""
    tps = kafka.partitions(topics)
    earliest = kafka.earliest_offsets(tps)
    latest = kafka.latest_offsets(tps)
    committed = kafka.committed_offsets(group, tps)
    heads = ledger.heads(pipeline) if ledger is not None else {}
    now = int(time.time() * 1000) if now_ms is None else now_ms
    rows = {
        tp: partition_lag(
            tp,
            earliest=earliest[tp],
            latest=latest[tp],
            committed=committed.get(tp),
            head=heads.get(tp),
            starting_offsets=starting_offsets,
            retention_margin_records=retention_margin_records,
            now_ms=now,
        )
        for tp in tps
    }
    if with_timestamps:
        lagging = {tp: max(r.position, r.earliest) for tp, r in rows.items() if r.lag > 0}
        stamps = kafka.record_timestamps(lagging) if lagging else {}
        now = int(time.time() * 1000) if now_ms is None else now_ms
        rows = {
            tp: partition_lag(
                tp,
                earliest=r.earliest,
                latest=r.latest,
                committed=committed.get(tp),
                head=r.head,
                starting_offsets=starting_offsets,
                retention_margin_records=retention_margin_records,
                timestamp_ms=stamps.get(tp),
                now_ms=now,
            )
            for tp, r in rows.items()
        }
    return LagReport(pipeline, group, now, retention_margin_records, tuple(rows[tp] for tp in tps))
