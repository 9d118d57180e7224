"""Offsets recorded as lost (``kbp_losses``): written inside the caller's transaction.

The spans of a batch stay disjoint: a span, or the part of it, that is already recorded is not
recorded again (a retried replay, or an abandon after a partial loss, adds only what is new).
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import Connection, select

from airflow_kafka_backpressure.batch.models import DataLoss, OffsetRange

from .chain import subtract_spans
from .records import BatchLosses, LossRecord
from .schema import batch_table, loss_table

__all__ = ["batch_losses", "record_spans"]

_lt = loss_table


def record_spans(
    conn: Connection,
    pipeline: str,
    batch_id: int,
    spans: Sequence[OffsetRange],
    kind: str,
    reason: str | None,
    at_ms: int,
) -> list[DataLoss]:
    """Record the parts of ``spans`` not recorded yet for ``batch_id``; returns them."""
    covered = [
        OffsetRange(t, int(p), int(a), int(b))
        for t, p, a, b in conn.execute(
            select(_lt.c.topic, _lt.c.partition, _lt.c.from_offset, _lt.c.until_offset).where(
                _lt.c.batch_id == batch_id
            )
        )
    ]
    new = subtract_spans(spans, covered)
    if new:
        conn.execute(
            _lt.insert(),
            [
                {
                    "batch_id": batch_id,
                    "pipeline": pipeline,
                    "topic": d.topic,
                    "partition": d.partition,
                    "from_offset": d.from_offset,
                    "until_offset": d.until_offset,
                    "kind": kind,
                    "reason": reason,
                    "recorded_at_ms": at_ms,
                }
                for d in new
            ],
        )
    return new


def batch_losses(conn: Connection, pipeline: str, limit: int) -> list[BatchLosses]:
    """The newest ``limit`` batches of ``pipeline`` with recorded losses, newest first (those whose
    batch was pruned from the ledger too, with status None)."""
    ids = (
        select(_lt.c.batch_id)
        .where(_lt.c.pipeline == pipeline)
        .group_by(_lt.c.batch_id)
        .order_by(_lt.c.batch_id.desc())
        .limit(int(limit))
        .subquery()
    )
    rows = conn.execute(
        # an outer join: the losses of a batch pruned from the ledger are listed too (status None)
        select(_lt, batch_table.c.status)
        .outerjoin(
            batch_table,
            (batch_table.c.batch_id == _lt.c.batch_id) & (batch_table.c.pipeline == _lt.c.pipeline),
        )
        .where(_lt.c.batch_id.in_(select(ids.c.batch_id)))
        .order_by(_lt.c.batch_id.desc(), _lt.c.topic, _lt.c.partition, _lt.c.from_offset)
    ).all()
    out: dict[int, tuple[str | None, list[LossRecord]]] = {}
    for row in rows:
        m = row._mapping
        record = LossRecord(
            batch_id=int(m["batch_id"]),
            topic=m["topic"],
            partition=int(m["partition"]),
            from_offset=int(m["from_offset"]),
            until_offset=int(m["until_offset"]),
            kind=m["kind"],
            reason=m["reason"],
            recorded_at_ms=int(m["recorded_at_ms"]),
        )
        out.setdefault(record.batch_id, (m["status"], []))[1].append(record)
    return [BatchLosses(b, status, tuple(spans)) for b, (status, spans) in out.items()]
