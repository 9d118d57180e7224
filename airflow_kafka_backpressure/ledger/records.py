"""Rows of the ledger as frozen records."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from airflow_kafka_backpressure.batch.models import BatchPlan, DataLoss, OffsetRange, TopicPartition

__all__ = ["BatchLosses", "BatchRecord", "LossRecord", "PruneResult", "RangeRecord"]


@dataclass(frozen=True)
class BatchRecord:
    """One row of the control table, with its plan."""

    batch_id: int
    pipeline: str
    run_id: str
    status: str
    created_at_ms: int
    started_at_ms: int | None
    ended_at_ms: int | None
    records: int | None
    processing_ms: int | None
    scheduling_delay_ms: int | None
    rate: float | None
    executors: int | None
    attempts: int
    error: str | None
    sink: str
    #: the stored plan, parsed on first use (:attr:`plan`): most transitions read the row's state
    #: only, and a plan of 10,000 ranges takes ~0.1 s to parse and check
    plan_json: str
    #: The attempt that owns the batch while it runs (set by mark_running / mark_replaying with a token).
    owner_token: str | None = None
    #: Until when (epoch ms) that attempt holds it; after that the batch counts as abandoned by its
    #: worker and may be replayed. None: no lease (``stale_before_ms`` decides instead).
    lease_expires_at_ms: int | None = None
    #: Replays of this batch that failed (or whose worker died) since it last ran on the main line;
    #: the replay queue tries such batches after the others, with a backoff (``replay_queue``).
    replay_failures: int = 0
    #: Records of the batch that did not decode and went to the error table (None: nothing decoded).
    bad_records: int | None = None

    @functools.cached_property
    def plan(self) -> BatchPlan:
        return BatchPlan.from_json(self.plan_json)

    @property
    def ranges(self) -> tuple[OffsetRange, ...]:
        """Every range of the plan, empty ones included."""
        return self.plan.ranges

    @property
    def output_path(self) -> str:
        return self.plan.output_path

    @property
    def last_activity_ms(self) -> int:
        """When a worker last took the batch (its latest start), else when it was planned."""
        return self.started_at_ms if self.started_at_ms is not None else self.created_at_ms

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe (XCom, UI). The owner token stays out: it is the running attempt's to hold."""
        return {
            "batch_id": self.batch_id,
            "pipeline": self.pipeline,
            "run_id": self.run_id,
            "status": self.status,
            "created_at_ms": self.created_at_ms,
            "started_at_ms": self.started_at_ms,
            "ended_at_ms": self.ended_at_ms,
            "records": self.records,
            "processing_ms": self.processing_ms,
            "scheduling_delay_ms": self.scheduling_delay_ms,
            "rate": self.rate,
            "executors": self.executors,
            "attempts": self.attempts,
            "error": self.error,
            "sink": self.sink,
            "lease_expires_at_ms": self.lease_expires_at_ms,
            "replay_failures": self.replay_failures,
            "bad_records": self.bad_records,
            "plan": self.plan.to_dict(),
        }


@dataclass(frozen=True)
class RangeRecord:
    """One row of the range table."""

    id: int
    batch_id: int
    pipeline: str
    topic: str
    partition: int
    from_offset: int
    until_offset: int
    status: str

    @property
    def tp(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)

    @property
    def offset_range(self) -> OffsetRange:
        return OffsetRange(self.topic, self.partition, self.from_offset, self.until_offset)


def batch_record(row: Any) -> BatchRecord:
    m = row._mapping
    return BatchRecord(
        batch_id=int(m["batch_id"]),
        pipeline=m["pipeline"],
        run_id=m["run_id"],
        status=m["status"],
        created_at_ms=int(m["created_at_ms"]),
        started_at_ms=m["started_at_ms"],
        ended_at_ms=m["ended_at_ms"],
        records=m["records"],
        processing_ms=m["processing_ms"],
        scheduling_delay_ms=m["scheduling_delay_ms"],
        rate=m["rate"],
        executors=m["executors"],
        attempts=int(m["attempts"]),
        error=m["error"],
        sink=m["sink"],
        plan_json=m["plan_json"],
        owner_token=m["owner_token"],
        lease_expires_at_ms=m["lease_expires_at_ms"],
        replay_failures=int(m["replay_failures"] or 0),
        bad_records=m["bad_records"],
    )


def range_record(row: Any) -> RangeRecord:
    m = row._mapping
    return RangeRecord(
        id=int(m["id"]),
        batch_id=int(m["batch_id"]),
        pipeline=m["pipeline"],
        topic=m["topic"],
        partition=int(m["partition"]),
        from_offset=int(m["from_offset"]),
        until_offset=int(m["until_offset"]),
        status=m["status"],
    )


@dataclass(frozen=True)
class LossRecord:
    """Offsets recorded as lost: ``kind`` is ``plan``, ``replay`` or ``abandon`` (see ``LOSS_KINDS``)."""

    batch_id: int
    topic: str
    partition: int
    from_offset: int
    until_offset: int
    kind: str
    reason: str | None
    recorded_at_ms: int

    @property
    def loss(self) -> DataLoss:
        return DataLoss(self.topic, self.partition, self.from_offset, self.until_offset)

    @property
    def lost(self) -> int:
        """Offsets lost (records, on a topic without compaction or transactions)."""
        return self.until_offset - self.from_offset

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.loss.to_dict(),
            "lost": self.lost,
            "kind": self.kind,
            "reason": self.reason,
            "recorded_at_ms": self.recorded_at_ms,
        }


@dataclass(frozen=True)
class BatchLosses:
    """Everything recorded as lost for one batch (monitoring page). ``status``: the batch's status,
    None once the batch itself was pruned from the ledger (its losses stay: see ``prune_losses``)."""

    batch_id: int
    status: str | None
    spans: tuple[LossRecord, ...]

    @property
    def lost(self) -> int:
        return sum(s.lost for s in self.spans)

    def to_dict(self) -> dict[str, Any]:
        return {
            "batch_id": self.batch_id,
            "status": self.status,
            "lost": self.lost,
            "spans": [s.to_dict() for s in self.spans],
        }


@dataclass(frozen=True)
class PruneResult:
    """What :meth:`Ledger.prune` deleted (``losses``: loss records, deleted only by their own
    retention, :meth:`Ledger.prune_losses`)."""

    batches: int = 0
    ranges: int = 0
    losses: int = 0

    def __add__(self, other: PruneResult) -> PruneResult:
        return PruneResult(
            self.batches + other.batches, self.ranges + other.ranges, self.losses + other.losses
        )
