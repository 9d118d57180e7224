"""Plans: recording a batch's ranges on the chains, and where each partition continues."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError

from airflow_kafka_backpressure.batch.models import BatchPlan, DataLoss, OffsetRange, TopicPartition

from . import bookkeeping, bulk
from .base import LedgerBase, first_line, now_ms
from .chain import ChainSegment, chain_segments
from .losses import record_spans
from .schema import batch_table, loss_table, partition_table, range_table
from .states import FINISHED_BATCH_STATUSES, LOST, PLANNED, LedgerConflict

__all__ = ["PlansMixin"]


class PlansMixin(LedgerBase):
    """Plans: a batch claims the next offsets of each partition's chain, once per (pipeline, run)."""

    def get_plan(self, pipeline: str, run_id: str) -> BatchPlan | None:
        """The plan stored for ``(pipeline, run_id)``, or None."""
        with self._read() as conn:
            plan_json = conn.execute(
                select(batch_table.c.plan_json).where(
                    batch_table.c.pipeline == pipeline, batch_table.c.run_id == run_id
                )
            ).scalar_one_or_none()
        return None if plan_json is None else BatchPlan.from_json(plan_json)

    def heads(self, pipeline: str) -> dict[TopicPartition, int]:
        """Where the main line continues per partition: the ``until`` of its last stored range.

        Failed ranges do not hold it back (they are replayed on the side). A partition that so far
        only had empty ranges gets the position its range had in the latest plan, so an idle
        partition does not jump forward each run (``starting_offsets='latest'``).
        """
        with self._read() as conn:
            return bookkeeping.heads(conn, pipeline)

    def record_plan(
        self,
        pipeline: str,
        run_id: str,
        ranges: Sequence[OffsetRange],
        sink: str,
        batch_interval_ms: int,
        planned_at_ms: int,
        rate: float | None = None,
        data_loss: Sequence[DataLoss] = (),
        lag: int | None = None,
        lease_ms: int | None = None,
        topic_ids: Mapping[str, str] | None = None,
    ) -> BatchPlan:
        """Store a new batch and its ranges in one transaction and return its plan (with its id).

        ``lease_ms``: how long the planned batch may wait for its ingest task to claim it before it
        counts as abandoned (the plan or the ingest task died in between) and the replay DAG may take
        it, as it takes a running batch whose lease expired. No attempt owns it meanwhile.
        ``topic_ids``: Kafka's id of each topic as planned (kept in the plan: see :meth:`known_topic_ids`).

        If ``(pipeline, run_id)`` already has a plan (a retry, or a concurrent writer of the same run),
        that stored plan is returned unchanged. Raises :class:`LedgerConflict` when the offsets are
        already claimed by another batch (the plan is stale: re-run the plan task).
        """
        if not pipeline:
            raise ValueError("record_plan: pipeline must be a non-empty string")
        if not run_id:
            raise ValueError(f"record_plan: pipeline {pipeline!r}: run_id must be a non-empty string")
        if lease_ms is not None and not lease_ms > 0:
            raise ValueError(f"record_plan: pipeline {pipeline!r}: lease_ms must be > 0, got {lease_ms!r}")
        existing = self.get_plan(pipeline, run_id)
        if existing is not None:
            return existing
        ranges = tuple(ranges)
        data_loss = tuple(data_loss)
        # Validate the plan itself (one range per partition, ...) before touching the database.
        BatchPlan(
            pipeline, 0, run_id, ranges, sink, int(batch_interval_ms), int(planned_at_ms), rate, data_loss
        )
        segments: list[ChainSegment] = []
        try:
            with self.engine.begin() as conn:
                stored = conn.execute(
                    select(batch_table.c.plan_json).where(
                        batch_table.c.pipeline == pipeline, batch_table.c.run_id == run_id
                    )
                ).scalar_one_or_none()
                if stored is not None:
                    return BatchPlan.from_json(stored)
                tps = {r.tp for r in ranges} | {TopicPartition(d.topic, d.partition) for d in data_loss}
                known = bookkeeping.partition_rows(conn, pipeline, tps)
                heads = self._stored_heads(known)
                segments = chain_segments(pipeline, ranges, data_loss, heads)
                created = now_ms()
                inserted = conn.execute(
                    batch_table.insert().values(
                        pipeline=pipeline,
                        run_id=run_id,
                        status=PLANNED,
                        created_at_ms=created,
                        rate=rate,
                        attempts=0,
                        plan_json="",
                        sink=sink,
                        lease_expires_at_ms=None if lease_ms is None else created + int(lease_ms),
                    )
                ).inserted_primary_key
                assert inserted is not None  # a single-row INSERT
                batch_id = int(inserted[0])
                plan = BatchPlan(
                    pipeline=pipeline,
                    batch_id=batch_id,
                    run_id=run_id,
                    ranges=ranges,
                    sink=sink,
                    batch_interval_ms=int(batch_interval_ms),
                    planned_at_ms=int(planned_at_ms),
                    rate=rate,
                    data_loss=data_loss,
                    lag=lag,
                    topic_ids=dict(topic_ids or {}),
                )
                conn.execute(
                    update(batch_table)
                    .where(batch_table.c.batch_id == batch_id)
                    .values(plan_json=plan.to_json())
                )
                prev_until = dict(heads)
                rows = []
                for seg in segments:  # sorted by (topic, partition, offset): a fixed lock order
                    rows.append(
                        {
                            "batch_id": batch_id,
                            "pipeline": pipeline,
                            "topic": seg.topic,
                            "partition": seg.partition,
                            "from_offset": seg.from_offset,
                            "until_offset": seg.until_offset,
                            "prev_until": prev_until.get(seg.tp),
                            "status": seg.status,
                        }
                    )
                    prev_until[seg.tp] = seg.until_offset
                bulk.insert_rows(conn, range_table, rows)
                bookkeeping.record_positions(conn, pipeline, batch_id, ranges, segments, known)
                lost = [seg.offset_range for seg in segments if seg.status == LOST]
                if lost:
                    record_spans(conn, pipeline, batch_id, lost, "plan", None, created)
                    bookkeeping.advance_watermarks(conn, pipeline, batch_id)
                return plan
        except IntegrityError as e:
            stored_plan = self.get_plan(pipeline, run_id)
            if stored_plan is not None:  # the same run was recorded concurrently: reuse it
                return stored_plan
            raise self._conflict(pipeline, segments, e) from e

    def known_topic_ids(self, pipeline: str) -> dict[str, str]:
        """Kafka's topic ids as the pipeline's newest plan recorded them ({} before any plan, or for a
        plan made before ids were recorded). Pruning never deletes the newest batch."""
        with self._read() as conn:
            plan_json = conn.execute(
                select(batch_table.c.plan_json)
                .where(batch_table.c.pipeline == pipeline)
                .order_by(batch_table.c.batch_id.desc())
                .limit(1)
            ).scalar_one_or_none()
        return {} if not plan_json else dict(BatchPlan.from_json(plan_json).topic_ids)

    def reset_topic(self, pipeline: str, topic: str, archived_as: str) -> int:
        """Start ``topic`` afresh in this pipeline's ledger after it was deleted and created again:
        the old topic's ranges, partition rows and losses are kept under the name ``archived_as``
        (not a valid Kafka topic name, so no real topic meets them), and the next plan starts the new
        topic's chains. Refused (:class:`LedgerConflict`, naming the batches) while an unfinished
        batch still reads the old topic: replay or abandon it first. Returns the ranges moved."""
        from sqlalchemy import delete, insert

        with self.engine.begin() as conn:
            unfinished = sorted(
                int(b)
                for b in conn.execute(
                    select(range_table.c.batch_id)
                    .join(batch_table, batch_table.c.batch_id == range_table.c.batch_id)
                    .where(
                        range_table.c.pipeline == pipeline,
                        range_table.c.topic == topic,
                        batch_table.c.status.not_in(FINISHED_BATCH_STATUSES),
                    )
                    .distinct()
                ).scalars()
            )
            if unfinished:
                raise LedgerConflict(
                    f"Pipeline {pipeline!r}: topic {topic!r} cannot start afresh while batches {unfinished} still "
                    "read its old offsets: let the replay DAG run (with on_topic_reset='earliest' it records "
                    "the old topic's offsets of those batches as lost and replays the rest), or abandon them "
                    "(python -m airflow_kafka_backpressure.ledger abandon --batch N --reason ...)."
                )
            # the partition rows point at their head range: move them out of the way, rename, put back
            rows = [
                dict(r._mapping)
                for r in conn.execute(
                    select(partition_table).where(
                        partition_table.c.pipeline == pipeline, partition_table.c.topic == topic
                    )
                )
            ]
            conn.execute(
                delete(partition_table).where(
                    partition_table.c.pipeline == pipeline, partition_table.c.topic == topic
                )
            )
            moved = conn.execute(
                update(range_table)
                .where(range_table.c.pipeline == pipeline, range_table.c.topic == topic)
                .values(topic=archived_as)
            ).rowcount
            conn.execute(
                update(loss_table)
                .where(loss_table.c.pipeline == pipeline, loss_table.c.topic == topic)
                .values(topic=archived_as)
            )
            if rows:
                conn.execute(insert(partition_table), [{**r, "topic": archived_as} for r in rows])
        return int(moved or 0)

    def _stored_heads(
        self, known: Mapping[TopicPartition, bookkeeping.PartitionRow]
    ) -> dict[TopicPartition, int]:
        """The heads of the partition rows a plan read (the seam a test bypasses to stale them)."""
        return bookkeeping.heads_of(known)

    def _conflict(
        self, pipeline: str, segments: Sequence[ChainSegment], err: IntegrityError
    ) -> LedgerConflict:
        """Name the first partition whose plan no longer starts at its (now committed) head."""
        firsts: dict[TopicPartition, ChainSegment] = {}
        for seg in segments:
            firsts.setdefault(seg.tp, seg)
        with self._read() as conn:
            now = bookkeeping.stored_heads(conn, pipeline, firsts)
        moved = next((s for tp, s in firsts.items() if tp in now and now[tp] != s.from_offset), None)
        if moved is None:
            return LedgerConflict(
                f"Pipeline {pipeline!r}: the ledger refused the plan ({first_line(err.orig)}). Another writer "
                "probably planned concurrently; re-run the plan task."
            )
        return LedgerConflict(
            f"Pipeline {pipeline!r}, {moved.tp}: offsets [{moved.from_offset}, {moved.until_offset}) "
            f"could not be claimed: another batch claimed overlapping offsets or the chain moved "
            f"(the partition's head is now {now[moved.tp]}). Re-run the plan task so it plans from the "
            f"current head. Database said: {first_line(err.orig)}"
        )
