"""Retention: delete old finished batches from the fronts of the chains, one chunk per transaction;
and, separately, old recorded losses whose batch is gone (:func:`prune_losses`).

Only batches that are succeeded, replayed or abandoned go, only from the front of each partition's
chain, never past a partition's commit watermark, never the range at a partition's head and never
the pipeline's newest batch (:func:`~airflow_kafka_backpressure.ledger.chain.prunable_batches`). In
the same transaction the first kept range of each chain becomes its start (``prev_until`` = NULL),
so the chain constraints hold at every commit. The chain's foreign key is deferred to the commit for
that moment; commit watermarks and heads are not touched.

A pruned batch's recorded losses (``kbp_losses``) stay: they are the record of offsets that were
never written, and an operator looks for them long after the batch's row stopped mattering. They go
only by their own retention, :func:`prune_losses`.
"""

from __future__ import annotations

from sqlalchemy import Connection, bindparam, delete, exists, func, select, update

from airflow_kafka_backpressure.batch.models import TopicPartition

from .chain import PrunableRange, prunable_batches
from .records import PruneResult
from .schema import CHAIN_FOREIGN_KEY, batch_table, loss_table, partition_table, range_table
from .states import FINISHED_BATCH_STATUSES

__all__ = ["prune_chunk", "prune_cutoff", "prune_losses"]

_bt, _rt, _pt = batch_table, range_table, partition_table


def prune_cutoff(conn: Connection, pipeline: str, keep_batches: int | None) -> int | None:
    """Batches with an id below the returned one may go (None: none may)."""
    newest = conn.execute(select(func.max(_bt.c.batch_id)).where(_bt.c.pipeline == pipeline)).scalar()
    if newest is None:
        return None
    if keep_batches is None:
        return int(newest)
    kept = conn.execute(
        select(_bt.c.batch_id)
        .where(_bt.c.pipeline == pipeline)
        .order_by(_bt.c.batch_id.desc())
        .offset(int(keep_batches) - 1)
        .limit(1)
    ).scalar()
    return None if kept is None else int(kept)


def prune_chunk(
    conn: Connection, pipeline: str, cutoff: int, older_than_ms: int | None, after_id: int, limit: int
) -> tuple[PruneResult, int | None]:
    """Prune among the next ``limit`` candidates with ids in (after_id, cutoff); returns what was
    deleted and the last candidate id looked at (None: no candidates left)."""
    cond = [
        _bt.c.pipeline == pipeline,
        _bt.c.batch_id > after_id,
        _bt.c.batch_id < cutoff,
        _bt.c.status.in_(FINISHED_BATCH_STATUSES),
    ]
    if older_than_ms is not None:
        cond.append(func.coalesce(_bt.c.ended_at_ms, _bt.c.created_at_ms) < int(older_than_ms))
    # Row locks (PostgreSQL): a batch cannot be re-run (a cleared run) while it is being deleted.
    ids = [
        int(b)
        for b in conn.execute(
            select(_bt.c.batch_id).where(*cond).order_by(_bt.c.batch_id).limit(int(limit)).with_for_update()
        ).scalars()
    ]
    if not ids:
        return PruneResult(), None
    ranges: dict[int, list[PrunableRange]] = {b: [] for b in ids}
    for b, t, p, a, u in conn.execute(
        select(_rt.c.batch_id, _rt.c.topic, _rt.c.partition, _rt.c.from_offset, _rt.c.until_offset).where(
            _rt.c.batch_id.in_(ids)
        )
    ):
        ranges[int(b)].append(PrunableRange(t, int(p), int(a), int(u)))
    topics = sorted({r.topic for rs in ranges.values() for r in rs})
    heads: dict[TopicPartition, int] = {}
    watermarks: dict[TopicPartition, int] = {}
    starts: dict[TopicPartition, int] = {}
    if topics:
        for t, p, head, committed in conn.execute(
            select(_pt.c.topic, _pt.c.partition, _pt.c.head, _pt.c.committed_until)
            .where(_pt.c.pipeline == pipeline, _pt.c.topic.in_(topics))
            .order_by(_pt.c.topic, _pt.c.partition)
            .with_for_update()
        ):
            if head is not None:
                heads[TopicPartition(t, int(p))] = int(head)
                watermarks[TopicPartition(t, int(p))] = int(committed)
        for t, p, a in conn.execute(
            select(_rt.c.topic, _rt.c.partition, _rt.c.from_offset).where(
                _rt.c.pipeline == pipeline, _rt.c.topic.in_(topics), _rt.c.prev_until.is_(None)
            )
        ):
            starts[TopicPartition(t, int(p))] = int(a)
    chosen, new_starts = prunable_batches([(b, ranges[b]) for b in ids], starts, heads, watermarks)
    if not chosen:
        return PruneResult(), ids[-1]
    _defer_chain_check(conn)
    n_ranges = conn.execute(delete(_rt).where(_rt.c.batch_id.in_(chosen))).rowcount
    if new_starts:
        conn.execute(
            update(_rt)
            .where(
                _rt.c.pipeline == pipeline,
                _rt.c.topic == bindparam("t"),
                _rt.c.partition == bindparam("n"),
                _rt.c.from_offset == bindparam("f"),
            )
            .values(prev_until=None),
            [{"t": tp.topic, "n": tp.partition, "f": f} for tp, f in sorted(new_starts.items())],
        )
    n_batches = conn.execute(delete(_bt).where(_bt.c.batch_id.in_(chosen))).rowcount
    return PruneResult(n_batches, n_ranges), ids[-1]


def prune_losses(conn: Connection, pipeline: str, older_than_ms: int) -> int:
    """Delete the recorded losses of ``pipeline`` recorded before ``older_than_ms`` whose batch is no
    longer in the ledger (a batch still there keeps every loss of it); returns the rows deleted."""
    lt = loss_table
    batch_gone = ~exists().where(_bt.c.batch_id == lt.c.batch_id, _bt.c.pipeline == lt.c.pipeline)
    return int(
        conn.execute(
            delete(lt).where(lt.c.pipeline == pipeline, lt.c.recorded_at_ms < int(older_than_ms), batch_gone)
        ).rowcount
    )


def _defer_chain_check(conn: Connection) -> None:
    if conn.dialect.name == "postgresql":
        conn.exec_driver_sql(f"SET CONSTRAINTS {CHAIN_FOREIGN_KEY} DEFERRED")
    elif conn.dialect.name == "sqlite":
        conn.exec_driver_sql("PRAGMA defer_foreign_keys = ON")  # until this transaction ends
