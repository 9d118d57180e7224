"""What a replay does with a batch whose offsets retention already deleted (pure: no Airflow, Spark
or Kafka import; the replay operator passes in the earliest offsets the broker reports).

A failed (or abandoned-by-its-worker) batch keeps its planned ranges. By the time it is replayed,
retention may have deleted the start of some of them: every offset below the partition's earliest
offset is gone for good. Per the pipeline's ``on_data_loss``:

* ``"skip"`` — the deleted offsets are recorded as lost (``kbp_losses``, kind ``replay``, shown with
  their counts on the monitoring page) and the replay reads what is left: each range starts at the
  earliest offset instead. A batch whose offsets are all gone is finished with 0 records.
* ``"fail"`` — the batch stays failed with a message naming it, the offsets that are gone and the
  command that gives them up (``python -m airflow_kafka_backpressure.ledger abandon ...``); the
  consumer group stays before it until someone decides.

Either way nothing is passed silently: the consumer group only moves past offsets that are written
or recorded as lost.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from airflow_kafka_backpressure.batch.models import BatchPlan, DataLoss, OffsetRange, TopicPartition
from airflow_kafka_backpressure.ledger.commands import abandon_command

__all__ = ["ReplayDecision", "retention_decision", "trimmed_plan"]


@dataclass(frozen=True)
class ReplayDecision:
    """``lost``: offsets below the earliest offset; ``ranges``: what the replay reads (the planned
    ranges, each starting at the earliest offset at least); ``refusal``: the error to record instead
    of replaying (``on_data_loss="fail"`` with offsets lost), else None."""

    lost: tuple[DataLoss, ...]
    ranges: tuple[OffsetRange, ...]
    refusal: str | None = None

    @property
    def lost_records(self) -> int:
        return sum(d.lost for d in self.lost)

    @property
    def records(self) -> int:
        return sum(r.count for r in self.ranges)


def retention_decision(
    plan: BatchPlan,
    earliest: Mapping[TopicPartition, int],
    on_data_loss: str,
    *,
    ledger_conn_id: str | None = None,
) -> ReplayDecision:
    """Compare ``plan``'s ranges with the partitions' ``earliest`` offsets and decide (see module doc).

    A partition missing from ``earliest`` is left as planned (the job itself reports a missing
    topic or partition)."""
    if on_data_loss not in ("fail", "skip"):
        raise ValueError(f"on_data_loss must be 'fail' or 'skip', got {on_data_loss!r}")
    lost: list[DataLoss] = []
    ranges: list[OffsetRange] = []
    for r in plan.ranges:
        lo = earliest.get(r.tp)
        if r.count <= 0 or lo is None or r.from_offset >= lo:
            ranges.append(r)
            continue
        cut = min(lo, r.until_offset)
        lost.append(DataLoss(r.topic, r.partition, r.from_offset, cut))
        ranges.append(OffsetRange(r.topic, r.partition, cut, r.until_offset))
    if not lost:
        return ReplayDecision((), tuple(plan.ranges))
    if on_data_loss == "skip":
        return ReplayDecision(tuple(lost), tuple(ranges))
    spans = ", ".join(f"{d} ({d.lost} records)" for d in lost)
    now = ", ".join(f"{d.topic}-{d.partition}: {earliest[d.tp]}" for d in lost)
    reason = f"retention deleted {sum(d.lost for d in lost)} offsets before the replay"
    refusal = (
        f"Batch {plan.batch_id} of pipeline {plan.pipeline!r} cannot be replayed: offsets {spans} were "
        f"deleted by retention before it was read (earliest offsets now {now}). on_data_loss='fail' keeps "
        "the batch failed and the consumer group before it; later batches are replayed and written but not "
        "committed past it. To give these offsets up, run: "
        f"{abandon_command(plan.batch_id, ledger_conn_id, reason=reason)} "
        "(or set on_data_loss='skip' in the pipeline to record such losses and replay the rest)."
    )
    return ReplayDecision(tuple(lost), tuple(ranges), refusal)


def trimmed_plan(plan: BatchPlan, decision: ReplayDecision) -> BatchPlan:
    """The plan the replay runs: same batch id and sink path, the decision's ranges, its losses
    added to the plan's ``data_loss``."""
    if not decision.lost:
        return plan
    return replace(plan, ranges=decision.ranges, data_loss=tuple(plan.data_loss) + decision.lost)
