"""Per-partition bookkeeping (``kbp_partitions``): heads, positions and commit watermarks.

Every function runs inside the caller's transaction, the one that changes the ranges, so the
bookkeeping never disagrees with them. Each costs O(partitions touched) index lookups — never a scan
of the history:

* a plan sets the head (``until`` of the last stored range), the position (where the partition's
  range in this plan ended, empty ranges too) and, for a partition's first range, its start;
* a range that becomes done (succeeded, replayed, lost) at the watermark moves the watermark over it
  and over every done range after it (one recursive query per batch, following the chain through the
  unique ``(pipeline, topic, partition, from_offset)`` index);
* a done range that becomes unfinished again (a cleared run re-runs a finished batch) pulls the
  watermark back to its start.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, and_, func, select

from airflow_kafka_backpressure.batch.models import OffsetRange, TopicPartition

from . import bulk
from .chain import ChainSegment
from .schema import batch_table, partition_table, range_table
from .states import DONE_RANGE_STATUSES, LOST

__all__ = [
    "PartitionRow",
    "advance_watermarks",
    "committable",
    "heads",
    "heads_of",
    "partition_rows",
    "record_positions",
    "retreat_watermarks",
    "stored_heads",
]

_pt = partition_table
_rt = range_table


@dataclass(frozen=True)
class PartitionRow:
    tp: TopicPartition
    start_offset: int | None
    head: int | None
    committed_until: int | None
    position: int
    planned_batch_id: int


def partition_rows(
    conn: Connection, pipeline: str, tps: Iterable[TopicPartition]
) -> dict[TopicPartition, PartitionRow]:
    """The rows of ``tps`` (those that exist)."""
    wanted = set(tps)
    if not wanted:
        return {}
    rows = conn.execute(
        select(_pt).where(_pt.c.pipeline == pipeline, _pt.c.topic.in_(sorted({tp.topic for tp in wanted})))
    ).all()
    out = {}
    for row in rows:
        m = row._mapping
        tp = TopicPartition(m["topic"], int(m["partition"]))
        if tp in wanted:
            out[tp] = PartitionRow(
                tp,
                m["start_offset"],
                m["head"],
                m["committed_until"],
                int(m["position"]),
                int(m["planned_batch_id"]),
            )
    return out


def stored_heads(conn: Connection, pipeline: str, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
    """``until`` of the last stored range of each of ``tps`` that has one."""
    return heads_of(partition_rows(conn, pipeline, tps))


def heads_of(rows: Mapping[TopicPartition, PartitionRow]) -> dict[TopicPartition, int]:
    """The heads of partition rows already read (those with a stored range)."""
    return {tp: r.head for tp, r in rows.items() if r.head is not None}


def heads(conn: Connection, pipeline: str) -> dict[TopicPartition, int]:
    """Per partition: its head; a partition without stored ranges gets its position if the pipeline's
    latest plan listed it (an idle partition keeps its place instead of jumping to the log end)."""
    latest = (
        select(func.max(batch_table.c.batch_id)).where(batch_table.c.pipeline == pipeline).scalar_subquery()
    )
    rows = conn.execute(
        select(_pt.c.topic, _pt.c.partition, func.coalesce(_pt.c.head, _pt.c.position))
        .where(_pt.c.pipeline == pipeline, (_pt.c.head.is_not(None)) | (_pt.c.planned_batch_id == latest))
        .order_by(_pt.c.topic, _pt.c.partition)
    ).all()
    return {TopicPartition(t, int(p)): int(h) for t, p, h in rows}


def committable(conn: Connection, pipeline: str) -> dict[TopicPartition, int]:
    """Per partition with something done from its start: the end of that contiguous done run."""
    rows = conn.execute(
        select(_pt.c.topic, _pt.c.partition, _pt.c.committed_until)
        .where(_pt.c.pipeline == pipeline, _pt.c.committed_until > _pt.c.start_offset)
        .order_by(_pt.c.topic, _pt.c.partition)
    ).all()
    return {TopicPartition(t, int(p)): int(c) for t, p, c in rows}


def record_positions(
    conn: Connection,
    pipeline: str,
    batch_id: int,
    ranges: Sequence[OffsetRange],
    segments: Sequence[ChainSegment],
    existing: Mapping[TopicPartition, PartitionRow],
) -> None:
    """After a plan stored ``segments`` (chain order): move heads and positions, start new chains."""
    segs: dict[TopicPartition, list[ChainSegment]] = {}
    for seg in segments:
        segs.setdefault(seg.tp, []).append(seg)
    position = {tp: s[-1].until_offset for tp, s in segs.items()}
    position.update({r.tp: r.until_offset for r in ranges})
    updates: list[dict] = []
    inserts: list[dict] = []
    for tp in sorted(position):
        row = existing.get(tp)
        own = segs.get(tp, [])
        start = (
            row.start_offset
            if row is not None and row.start_offset is not None
            else (own[0].from_offset if own else None)
        )
        given = {
            "p": pipeline,
            "t": tp.topic,
            "n": tp.partition,
            "start": start,
            "hd": own[-1].until_offset if own else (row.head if row is not None else None),
            "committed": row.committed_until
            if row is not None and row.committed_until is not None
            else start,
            "pos": position[tp],
            "b": batch_id,
        }
        (updates if row is not None else inserts).append(given)
    assign = {
        "start_offset": "start",
        "head": "hd",
        "committed_until": "committed",
        "position": "pos",
        "planned_batch_id": "b",
    }
    _update_partitions(conn, pipeline, updates, assign)
    named = {"pipeline": "p", "topic": "t", "partition": "n", **assign}
    bulk.insert_rows(conn, _pt, [{c: row[key] for c, key in named.items()} for row in inserts])


def advance_watermarks(conn: Connection, pipeline: str, batch_id: int) -> None:
    """Move each watermark that sits at a done range of ``batch_id`` over the run of done ranges
    that starts there (it jumps over every done range after a replayed one)."""
    done = _rt.c.status.in_(DONE_RANGE_STATUSES)
    seed = (
        select(_rt.c.topic, _rt.c.partition, _rt.c.until_offset)
        .select_from(
            _rt.join(
                _pt,
                and_(
                    _pt.c.pipeline == _rt.c.pipeline,
                    _pt.c.topic == _rt.c.topic,
                    _pt.c.partition == _rt.c.partition,
                ),
            )
        )
        .where(_rt.c.batch_id == batch_id, done, _rt.c.from_offset == _pt.c.committed_until)
    )
    run = seed.cte("kbp_done_run", recursive=True)
    nxt = _rt.alias("kbp_next")
    # Each step looks up the range after each run's end in a correlated subquery: one probe of the
    # unique (pipeline, topic, partition, from_offset) index per partition, whatever the planner
    # believes of the table. A join there let PostgreSQL, before its first ANALYZE of a new ledger,
    # compare every range with every run (10,000 x 10,000 rows: 5-10 s for a batch's first commit).
    # A run ends with a step whose next range is missing (NULL), which max() below ignores.
    following = (
        select(nxt.c.until_offset)
        .where(
            nxt.c.pipeline == pipeline,
            nxt.c.topic == run.c.topic,
            nxt.c.partition == run.c.partition,
            nxt.c.from_offset == run.c.until_offset,
            nxt.c.status.in_(DONE_RANGE_STATUSES),
        )
        .scalar_subquery()
    )
    run = run.union_all(
        select(run.c.topic, run.c.partition, following).where(run.c.until_offset.is_not(None))
    )
    ends = conn.execute(
        select(run.c.topic, run.c.partition, func.max(run.c.until_offset)).group_by(
            run.c.topic, run.c.partition
        )
    ).all()
    _move_watermarks(conn, pipeline, ends, forward=True)


def retreat_watermarks(conn: Connection, pipeline: str, batch_id: int) -> None:
    """Pull each watermark past the start of a (no longer done) range of ``batch_id`` back to it."""
    starts = conn.execute(
        select(_rt.c.topic, _rt.c.partition, func.min(_rt.c.from_offset))
        .where(_rt.c.batch_id == batch_id, _rt.c.status != LOST)
        .group_by(_rt.c.topic, _rt.c.partition)
    ).all()
    _move_watermarks(conn, pipeline, starts, forward=False)


def _move_watermarks(conn: Connection, pipeline: str, targets: Sequence[Any], *, forward: bool) -> None:
    """Set each (topic, partition, offset)'s watermark to offset if that moves it the given way."""
    _update_partitions(
        conn,
        pipeline,
        [{"t": t, "n": int(n), "o": int(o)} for t, n, o in targets],
        {"committed_until": "o"},
        moves=lambda o: _pt.c.committed_until < o if forward else _pt.c.committed_until > o,
    )


def _update_partitions(
    conn: Connection,
    pipeline: str,
    rows: Sequence[Mapping[str, Any]],
    assign: Mapping[str, str],
    *,
    moves: Callable[[Any], Any] | None = None,
) -> None:
    """Update ``pipeline``'s partition rows, one per row of ``rows`` (keys ``t``: topic, ``n``:
    partition) as :func:`.bulk.update_rows` does."""
    bulk.update_rows(
        conn,
        _pt,
        rows,
        match={"topic": "t", "partition": "n"},
        assign=assign,
        where=[_pt.c.pipeline == pipeline],
        moves=moves,
    )
