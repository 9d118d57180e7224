"""The ledger: the SQL record of every micro-batch and every offset range it claimed.

It is the source of truth for positions (where the next range of a partition starts), for the
replay of failed ranges and for consumer-group commits. It follows the control (schedule) table and
failure-record table of seed 001:

``kbp_batches`` (control table)
    One row per batch: ``batch_id`` (it keys the sink path), ``(pipeline, run_id)`` (unique: a plan is
    reused by retries, cleared tasks and backfills of the same run), status, times in epoch ms,
    measured metrics and the full plan as JSON.

``kbp_ranges`` (range / failure-record table)
    One row per non-empty offset range a batch claimed, plus ``lost`` rows for offsets that
    retention deleted before they were read. Its status follows its batch (``lost`` stays ``lost``).

**The database itself keeps the ranges of one pipeline on one contiguous chain per partition**, so
two batches can never claim overlapping offsets, whatever the code that writes them:

* ``CHECK (until_offset > from_offset)`` — only non-empty ranges are rows;
* ``UNIQUE (pipeline, topic, partition, from_offset)`` and ``UNIQUE (..., until_offset)`` — a range has
  at most one successor and at most one predecessor;
* ``prev_until`` with ``CHECK (prev_until IS NULL OR prev_until = from_offset)`` and a composite
  ``FOREIGN KEY (pipeline, topic, partition, prev_until) -> (pipeline, topic, partition, until_offset)``
  — every range except the first starts exactly where an existing range ends;
* a partial ``UNIQUE`` index on ``(pipeline, topic, partition) WHERE prev_until IS NULL`` — one chain
  start per partition.

Following predecessors strictly decreases ``from_offset``, so it ends at the one chain start: the rows
form a single path, contiguous, with no overlap and no gap. A range that overlaps or leaves a gap is
refused by the database (unique, foreign-key, check or partial-index violation). The foreign key is
``NO ACTION``: a range in the middle of a chain cannot be deleted or have its ``until`` changed.

Pure: SQLAlchemy only, no Airflow import. Works on SQLite (default; foreign keys, WAL and a busy
timeout are set on every connection, write transactions use ``BEGIN IMMEDIATE``) and PostgreSQL.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    Column,
    Connection,
    Engine,
    Float,
    ForeignKeyConstraint,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    and_,
    case,
    create_engine,
    event,
    func,
    or_,
    select,
    update,
)
from sqlalchemy.exc import IntegrityError
from sqlalchemy.pool import StaticPool

from .models import BatchPlan, DataLoss, OffsetRange, TopicPartition

__all__ = [
    "ALLOWED_TRANSITIONS",
    "BATCH_STATUSES",
    "DONE_RANGE_STATUSES",
    "RANGE_STATUSES",
    "BatchRecord",
    "ChainSegment",
    "InvalidTransition",
    "Ledger",
    "LedgerConflict",
    "LedgerError",
    "RangeRecord",
    "UnknownBatch",
    "batch_table",
    "check_transition",
    "chain_segments",
    "default_ledger_url",
    "metadata",
    "range_table",
]

# --------------------------------------------------------------------------------------------------
# Statuses and transitions
# --------------------------------------------------------------------------------------------------

PLANNED = "planned"
RUNNING = "running"
SUCCEEDED = "succeeded"
FAILED = "failed"
REPLAYING = "replaying"
REPLAYED = "replayed"
LOST = "lost"

BATCH_STATUSES: tuple[str, ...] = (PLANNED, RUNNING, SUCCEEDED, FAILED, REPLAYING, REPLAYED)
RANGE_STATUSES: tuple[str, ...] = BATCH_STATUSES + (LOST,)
#: Range statuses that count as processed for consumer-group commits.
DONE_RANGE_STATUSES: tuple[str, ...] = (SUCCEEDED, REPLAYED, LOST)
#: Batch statuses in which a worker may be (or may have died) working on the batch.
IN_FLIGHT_STATUSES: tuple[str, ...] = (PLANNED, RUNNING, REPLAYING)

#: target status -> the statuses a batch may move to it from.
#:
#: * ``running``: the ingest task starts the batch (``planned``), retries it (``running`` after a worker
#:   died, ``failed``), or re-runs it because a user cleared a finished Airflow run (``succeeded``,
#:   ``replayed``): the sink path is keyed by batch id, so the rewrite is idempotent. Not from
#:   ``replaying``: the replay DAG owns the batch until the replay ends.
#: * ``succeeded`` from ``running`` (and again from ``succeeded``: a retried record task).
#: * ``failed`` from ``planned`` (failed before launch), ``running``, ``replaying`` (the replay failed: it
#:   stays replayable) and ``failed`` (a retried task updates the error).
#: * ``replaying`` from ``failed``; from ``planned``/``running``/``replaying`` only when the batch is
#:   stale (no activity since ``stale_before_ms``: its worker died), see :meth:`Ledger.mark_replaying`.
#: * ``replayed`` from ``replaying`` (and again from ``replayed``).
ALLOWED_TRANSITIONS: dict[str, frozenset[str]] = {
    RUNNING: frozenset({PLANNED, RUNNING, FAILED, SUCCEEDED, REPLAYED}),
    SUCCEEDED: frozenset({RUNNING, SUCCEEDED}),
    FAILED: frozenset({PLANNED, RUNNING, REPLAYING, FAILED}),
    REPLAYING: frozenset({FAILED, PLANNED, RUNNING, REPLAYING}),
    REPLAYED: frozenset({REPLAYING, REPLAYED}),
}
#: Sources of ``replaying`` that need the batch to be stale (a live worker may still own it).
STALE_ONLY_REPLAY_SOURCES: frozenset[str] = frozenset({PLANNED, RUNNING, REPLAYING})


class LedgerError(RuntimeError):
    """A ledger operation was refused; the message says what was wrong and what to do."""


class LedgerConflict(LedgerError):
    """Offsets of a plan are already claimed by another batch (or would leave a gap in the chain)."""


class InvalidTransition(LedgerError):
    """A batch cannot move from its current status to the requested one."""


class UnknownBatch(LedgerError, KeyError):
    """No batch has the given id."""

    def __str__(self) -> str:  # KeyError would print the repr of the message
        return str(self.args[0]) if self.args else ""


def check_transition(batch_id: int, current: str, target: str, *, stale: bool = False) -> None:
    """Raise :class:`InvalidTransition` unless ``current -> target`` is allowed (see the table above)."""
    if target not in ALLOWED_TRANSITIONS:
        raise InvalidTransition(
            f"Batch {batch_id}: {target!r} is not a status a batch can be moved to; "
            f"use one of {sorted(ALLOWED_TRANSITIONS)}"
        )
    allowed = ALLOWED_TRANSITIONS[target]
    if current not in allowed:
        raise InvalidTransition(
            f"Batch {batch_id} is {current!r} and cannot become {target!r} (allowed from: "
            f"{', '.join(sorted(allowed))}). {_transition_hint(current, target)}"
        )
    if target == REPLAYING and current in STALE_ONLY_REPLAY_SOURCES and not stale:
        raise InvalidTransition(
            f"Batch {batch_id} is {current!r} and may still be in progress: it can only become "
            f"{target!r} once it is stale (pass stale_before_ms and make sure no worker is running it), or after "
            "it has been marked failed."
        )


def _transition_hint(current: str, target: str) -> str:
    if target == REPLAYING and current in (SUCCEEDED, REPLAYED):
        return "It already processed its offsets: there is nothing to replay."
    if target == RUNNING and current == REPLAYING:
        return "The replay DAG is replaying it; wait for the replay to finish or fail, then retry."
    if target in (SUCCEEDED, REPLAYED):
        return f"Mark it {'running' if target == SUCCEEDED else 'replaying'} first."
    if target == FAILED and current in (SUCCEEDED, REPLAYED):
        return "A finished batch fails only by running it again: mark it running first."
    return "Check which task owns the batch."


# --------------------------------------------------------------------------------------------------
# Schema
# --------------------------------------------------------------------------------------------------

metadata = MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
        "fk": "fk_%(table_name)s_%(column_0_N_name)s",
        "pk": "pk_%(table_name)s",
    }
)

# BIGINT on PostgreSQL; INTEGER PRIMARY KEY (the rowid alias) on SQLite, which autoincrements.
_Id = BigInteger().with_variant(Integer(), "sqlite")


def _in(column: str, values: Iterable[str]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


batch_table = Table(
    "kbp_batches",
    metadata,
    Column("batch_id", _Id, primary_key=True, autoincrement=True),
    Column("pipeline", String(200), nullable=False),
    Column("run_id", String(250), nullable=False),
    Column("status", String(16), nullable=False),
    Column("created_at_ms", BigInteger, nullable=False),
    Column("started_at_ms", BigInteger),
    Column("ended_at_ms", BigInteger),
    Column("records", BigInteger),
    Column("processing_ms", BigInteger),
    Column("scheduling_delay_ms", BigInteger),
    Column("rate", Float),
    Column("executors", Integer),
    Column("attempts", Integer, nullable=False, default=0),
    Column("error", Text),
    Column("plan_json", Text, nullable=False),
    Column("sink", Text, nullable=False),
    UniqueConstraint("pipeline", "run_id"),
    # Lets kbp_ranges reference (batch_id, pipeline): a range cannot belong to another pipeline's batch.
    UniqueConstraint("batch_id", "pipeline"),
    CheckConstraint(_in("status", BATCH_STATUSES), name="status"),
    CheckConstraint("attempts >= 0", name="attempts"),
    Index(None, "pipeline", "status"),
    # Never reuse an id on SQLite (ids key sink paths), as a PostgreSQL sequence never does.
    sqlite_autoincrement=True,
)

range_table = Table(
    "kbp_ranges",
    metadata,
    Column("id", _Id, primary_key=True, autoincrement=True),
    Column("batch_id", _Id, nullable=False),
    Column("pipeline", String(200), nullable=False),
    Column("topic", String(249), nullable=False),
    Column("partition", Integer, nullable=False),
    Column("from_offset", BigInteger, nullable=False),
    Column("until_offset", BigInteger, nullable=False),
    # NULL only for the first range of a partition (the chain start); else equal to from_offset.
    Column("prev_until", BigInteger, nullable=True),
    Column("status", String(16), nullable=False),
    ForeignKeyConstraint(["batch_id", "pipeline"], ["kbp_batches.batch_id", "kbp_batches.pipeline"]),
    UniqueConstraint("pipeline", "topic", "partition", "from_offset"),
    UniqueConstraint("pipeline", "topic", "partition", "until_offset"),
    ForeignKeyConstraint(
        ["pipeline", "topic", "partition", "prev_until"],
        ["kbp_ranges.pipeline", "kbp_ranges.topic", "kbp_ranges.partition", "kbp_ranges.until_offset"],
        name="fk_kbp_ranges_chain",
    ),
    CheckConstraint("until_offset > from_offset", name="non_empty"),
    CheckConstraint("from_offset >= 0 AND partition >= 0", name="non_negative"),
    CheckConstraint("prev_until IS NULL OR prev_until = from_offset", name="chained"),
    CheckConstraint(_in("status", RANGE_STATUSES), name="status"),
    Index(None, "batch_id"),
)

# One chain start per (pipeline, topic, partition).
Index(
    "uq_kbp_ranges_chain_start",
    range_table.c.pipeline,
    range_table.c.topic,
    range_table.c.partition,
    unique=True,
    sqlite_where=range_table.c.prev_until.is_(None),
    postgresql_where=range_table.c.prev_until.is_(None),
)


# --------------------------------------------------------------------------------------------------
# Records returned by the repository
# --------------------------------------------------------------------------------------------------


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
    plan: BatchPlan

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
        """JSON-safe (XCom, UI)."""
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


def _batch_record(row: Any) -> BatchRecord:
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
        plan=BatchPlan.from_json(m["plan_json"]),
    )


def _range_record(row: Any) -> RangeRecord:
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


# --------------------------------------------------------------------------------------------------
# Pure helpers
# --------------------------------------------------------------------------------------------------


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def _at(at_ms: int | None) -> int:
    return now_ms() if at_ms is None else int(at_ms)


def default_ledger_url() -> str:
    """``sqlite:///$AIRFLOW_HOME/kafka_backpressure_ledger.db`` (AIRFLOW_HOME defaults to ~/airflow)."""
    home = os.environ.get("AIRFLOW_HOME") or str(Path("~/airflow").expanduser())
    return f"sqlite:///{Path(home) / 'kafka_backpressure_ledger.db'}"


@dataclass(frozen=True)
class ChainSegment:
    """A non-empty range to store: read by the batch (``planned``) or deleted by retention (``lost``)."""

    topic: str
    partition: int
    from_offset: int
    until_offset: int
    status: str  # planned | lost

    @property
    def tp(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)


def chain_segments(
    pipeline: str,
    ranges: Sequence[OffsetRange],
    data_loss: Sequence[DataLoss],
    heads: Mapping[TopicPartition, int],
) -> list[ChainSegment]:
    """The rows a plan adds to the chains, in insertion order (by topic, partition, offset).

    Empty ranges and empty losses are not stored. Per partition, the stored segments must be
    contiguous and start at the partition's head (the ``until`` of its last stored range); a partition
    without stored ranges may start anywhere. An empty range must sit at the partition's position after
    its losses. Raises :class:`LedgerConflict` (head mismatch: another batch claimed the offsets, or a
    gap) or :class:`ValueError` (the plan itself is inconsistent).
    """
    by_tp: dict[TopicPartition, list[ChainSegment]] = {}
    empty: dict[TopicPartition, int] = {}
    for r in ranges:
        if r.until_offset > r.from_offset:
            by_tp.setdefault(r.tp, []).append(
                ChainSegment(r.topic, r.partition, r.from_offset, r.until_offset, PLANNED)
            )
        else:
            empty[r.tp] = r.from_offset
    for d in data_loss:
        if d.until_offset < d.from_offset or d.from_offset < 0:
            raise ValueError(
                f"Pipeline {pipeline!r}: data loss of {TopicPartition(d.topic, d.partition)} "
                f"[{d.from_offset}, {d.until_offset}) is not a valid offset range"
            )
        if d.until_offset > d.from_offset:
            by_tp.setdefault(TopicPartition(d.topic, d.partition), []).append(
                ChainSegment(d.topic, d.partition, d.from_offset, d.until_offset, LOST)
            )

    out: list[ChainSegment] = []
    for tp in sorted(set(by_tp) | set(empty)):
        segs = sorted(by_tp.get(tp, []), key=lambda s: (s.from_offset, s.until_offset))
        for a, b in zip(segs, segs[1:]):
            if b.from_offset != a.until_offset:
                what = "overlap" if b.from_offset < a.until_offset else "leave a gap"
                raise ValueError(
                    f"Pipeline {pipeline!r}, {tp}: the plan's {a.status} range "
                    f"[{a.from_offset}, {a.until_offset}) and {b.status} range "
                    f"[{b.from_offset}, {b.until_offset}) {what}; a plan must cover one contiguous "
                    "run of offsets per partition (data loss first, then the range read)."
                )
        head = heads.get(tp)
        start = segs[0].from_offset if segs else empty[tp]
        if head is not None and start != head:
            claimed = start < head
            raise LedgerConflict(
                f"Pipeline {pipeline!r}, {tp}: the plan starts at offset {start} but the ledger's "
                f"head for this partition is {head}: "
                + (
                    f"offsets [{start}, {head}) are already claimed by another batch"
                    if claimed
                    else f"offsets [{head}, {start}) would never be read (record them as data loss "
                    "if retention deleted them)"
                )
                + ". Another writer probably planned concurrently; re-run the plan task so it plans "
                "from the current head."
            )
        end = segs[-1].until_offset if segs else start
        if tp in empty and segs and empty[tp] != end:
            raise ValueError(
                f"Pipeline {pipeline!r}, {tp}: the empty range at offset {empty[tp]} does not follow "
                f"the plan's data loss, which ends at {end}"
            )
        out.extend(segs)
    return out


# --------------------------------------------------------------------------------------------------
# Engine set-up
# --------------------------------------------------------------------------------------------------

_READ_ONLY = "kbp_read_only"


def _configure_sqlite(engine: Engine) -> None:
    if getattr(engine, "_kbp_sqlite_configured", False):
        return
    engine._kbp_sqlite_configured = True  # type: ignore[attr-defined]

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Take over transaction control from the sqlite3 module (it does not BEGIN before SELECTs).
        dbapi_connection.isolation_level = None
        cur = dbapi_connection.cursor()
        try:
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA busy_timeout=30000")
            if engine.url.database not in (None, "", ":memory:"):
                cur.execute("PRAGMA journal_mode=WAL")
                cur.execute("PRAGMA synchronous=NORMAL")
        finally:
            cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        # Writers take the write lock up front: a deferred transaction that read first would fail
        # with "database is locked" instead of waiting when another writer committed meanwhile.
        if conn.get_execution_options().get(_READ_ONLY):
            conn.exec_driver_sql("BEGIN")
        else:
            conn.exec_driver_sql("BEGIN IMMEDIATE")


def _make_engine(url: str, engine_kwargs: Mapping[str, Any] | None) -> Engine:
    kwargs: dict[str, Any] = dict(engine_kwargs or {})
    if url.startswith("sqlite"):
        if url in ("sqlite://", "sqlite:///:memory:") or ":memory:" in url:
            kwargs.setdefault("poolclass", StaticPool)
            kwargs.setdefault("connect_args", {"check_same_thread": False})
        else:
            kwargs.setdefault("connect_args", {"timeout": 30})
        engine = create_engine(url, **kwargs)
        _configure_sqlite(engine)
        return engine
    kwargs.setdefault("pool_pre_ping", True)
    return create_engine(url, **kwargs)


# --------------------------------------------------------------------------------------------------
# Repository
# --------------------------------------------------------------------------------------------------


class Ledger:
    """Repository over the ledger tables.

    :param url: a SQLAlchemy URL (``sqlite:///...``, ``postgresql+psycopg2://...``) or an ``Engine``;
        defaults to :func:`default_ledger_url`.
    :param engine_kwargs: extra ``create_engine`` arguments (ignored when an Engine is given).
    """

    def __init__(self, url: str | Engine | None = None, *, engine_kwargs: Mapping[str, Any] | None = None):
        if isinstance(url, Engine):
            self.engine = url
            if url.dialect.name == "sqlite":
                _configure_sqlite(url)
        else:
            self.engine = _make_engine(url or default_ledger_url(), engine_kwargs)
        self.url = self.engine.url.render_as_string(hide_password=True)

    # -- lifecycle -------------------------------------------------------------------------------

    def create_all(self) -> None:
        """Create the tables and indexes that do not exist yet (idempotent)."""
        if self.engine.dialect.name == "sqlite" and self.engine.url.database not in (None, "", ":memory:"):
            Path(self.engine.url.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
        with self.engine.begin() as conn:
            metadata.create_all(conn, checkfirst=True)

    def drop_all(self) -> None:
        """Drop the ledger tables (tests, or a deliberate reset)."""
        with self.engine.begin() as conn:
            metadata.drop_all(conn, checkfirst=True)

    def dispose(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.dispose()

    def __repr__(self) -> str:
        return f"Ledger({self.url!r})"

    def _read(self) -> Any:
        conn = self.engine.connect().execution_options(**{_READ_ONLY: True})
        return _ReadContext(conn)

    # -- plans -----------------------------------------------------------------------------------

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
            rows = conn.execute(
                select(range_table.c.topic, range_table.c.partition, func.max(range_table.c.until_offset))
                .where(range_table.c.pipeline == pipeline)
                .group_by(range_table.c.topic, range_table.c.partition)
            ).all()
            latest_plan = conn.execute(
                select(batch_table.c.plan_json)
                .where(batch_table.c.pipeline == pipeline)
                .order_by(batch_table.c.batch_id.desc())
                .limit(1)
            ).scalar_one_or_none()
        out = {TopicPartition(t, int(p)): int(u) for t, p, u in rows}
        if latest_plan is not None:
            for r in BatchPlan.from_json(latest_plan).ranges:
                out.setdefault(r.tp, r.until_offset)
        return dict(sorted(out.items()))

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
    ) -> BatchPlan:
        """Store a new batch and its ranges in one transaction and return its plan (with its id).

        If ``(pipeline, run_id)`` already has a plan (a retry, or a concurrent writer of the same run),
        that stored plan is returned unchanged. Raises :class:`LedgerConflict` when the offsets are
        already claimed by another batch (the plan is stale: re-run the plan task).
        """
        if not pipeline:
            raise ValueError("record_plan: pipeline must be a non-empty string")
        if not run_id:
            raise ValueError(f"record_plan: pipeline {pipeline!r}: run_id must be a non-empty string")
        existing = self.get_plan(pipeline, run_id)
        if existing is not None:
            return existing
        ranges = tuple(ranges)
        data_loss = tuple(data_loss)
        # Validate the plan itself (one range per partition, ...) before touching the database.
        BatchPlan(pipeline, 0, run_id, ranges, sink, int(batch_interval_ms), int(planned_at_ms), rate, data_loss)
        current: ChainSegment | None = None
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
                heads = self._stored_heads(conn, pipeline, tps)
                segments = chain_segments(pipeline, ranges, data_loss, heads)
                created = now_ms()
                batch_id = int(
                    conn.execute(
                        batch_table.insert().values(
                            pipeline=pipeline,
                            run_id=run_id,
                            status=PLANNED,
                            created_at_ms=created,
                            rate=rate,
                            attempts=0,
                            plan_json="",
                            sink=sink,
                        )
                    ).inserted_primary_key[0]
                )
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
                )
                conn.execute(
                    update(batch_table).where(batch_table.c.batch_id == batch_id).values(plan_json=plan.to_json())
                )
                prev_until = {tp: h for tp, h in heads.items()}
                for seg in segments:  # sorted by (topic, partition, offset): a fixed lock order
                    current = seg
                    conn.execute(
                        range_table.insert().values(
                            batch_id=batch_id,
                            pipeline=pipeline,
                            topic=seg.topic,
                            partition=seg.partition,
                            from_offset=seg.from_offset,
                            until_offset=seg.until_offset,
                            prev_until=prev_until.get(seg.tp),
                            status=seg.status,
                        )
                    )
                    prev_until[seg.tp] = seg.until_offset
                current = None
                return plan
        except IntegrityError as e:
            stored_plan = self.get_plan(pipeline, run_id)
            if stored_plan is not None:  # the same run was recorded concurrently: reuse it
                return stored_plan
            raise self._conflict(pipeline, current, e) from e

    def _stored_heads(
        self, conn: Connection, pipeline: str, tps: Iterable[TopicPartition]
    ) -> dict[TopicPartition, int]:
        wanted = set(tps)
        if not wanted:
            return {}
        rows = conn.execute(
            select(range_table.c.topic, range_table.c.partition, func.max(range_table.c.until_offset))
            .where(
                range_table.c.pipeline == pipeline,
                range_table.c.topic.in_(sorted({tp.topic for tp in wanted})),
            )
            .group_by(range_table.c.topic, range_table.c.partition)
        ).all()
        heads = {TopicPartition(t, int(p)): int(u) for t, p, u in rows}
        return {tp: h for tp, h in heads.items() if tp in wanted}

    def _conflict(self, pipeline: str, seg: ChainSegment | None, err: IntegrityError) -> LedgerConflict:
        if seg is None:
            return LedgerConflict(
                f"Pipeline {pipeline!r}: the ledger refused the plan ({err.orig}). Another writer "
                "probably planned concurrently; re-run the plan task."
            )
        head = self.heads(pipeline).get(seg.tp)
        return LedgerConflict(
            f"Pipeline {pipeline!r}, {seg.tp}: offsets [{seg.from_offset}, {seg.until_offset}) "
            f"could not be claimed: another batch claimed overlapping offsets or the chain moved "
            f"(the partition's head is now {head}). Re-run the plan task so it plans from the "
            f"current head. Database said: {_first_line(err.orig)}"
        )

    # -- status transitions --------------------------------------------------------------------

    def mark_running(self, batch_id: int, executors: int | None = None, *, at_ms: int | None = None) -> BatchRecord:
        """The ingest task starts (or retries / re-runs) the batch: ``attempts`` += 1, new start time."""
        values: dict[str, Any] = {"started_at_ms": _at(at_ms), "ended_at_ms": None}
        if executors is not None:
            values["executors"] = int(executors)
        return self._transition(batch_id, RUNNING, values, count_attempt=True)

    def mark_succeeded(
        self, batch_id: int, records: int, processing_ms: int, *, at_ms: int | None = None
    ) -> BatchRecord:
        """The batch's output is committed to the sink."""
        values = {"ended_at_ms": _at(at_ms), "records": int(records), "processing_ms": int(processing_ms)}
        return self._transition(batch_id, SUCCEEDED, values)

    def mark_failed(self, batch_id: int, error: str, *, at_ms: int | None = None) -> BatchRecord:
        """The batch (or its replay) failed; it becomes replayable. ``error`` is kept for the UI."""
        return self._transition(batch_id, FAILED, {"ended_at_ms": _at(at_ms), "error": str(error)})

    def mark_replaying(
        self, batch_id: int, *, stale_before_ms: int | None = None, at_ms: int | None = None
    ) -> BatchRecord:
        """The replay DAG claims the batch: from ``failed``; from planned/running/replaying only when
        its last activity is before ``stale_before_ms``. Atomic: two replayers cannot both claim it."""
        values = {"started_at_ms": _at(at_ms), "ended_at_ms": None}
        return self._transition(
            batch_id, REPLAYING, values, count_attempt=True, stale_before_ms=stale_before_ms
        )

    def mark_replayed(
        self, batch_id: int, records: int, processing_ms: int, *, at_ms: int | None = None
    ) -> BatchRecord:
        """The replay rewrote the batch's sink path."""
        values = {"ended_at_ms": _at(at_ms), "records": int(records), "processing_ms": int(processing_ms)}
        return self._transition(batch_id, REPLAYED, values)

    def record_metrics(
        self,
        batch_id: int,
        *,
        scheduling_delay_ms: int | None = None,
        rate: float | None = None,
        executors: int | None = None,
    ) -> BatchRecord:
        """Store measurements that are not part of a transition (only the arguments given)."""
        values: dict[str, Any] = {}
        if scheduling_delay_ms is not None:
            values["scheduling_delay_ms"] = int(scheduling_delay_ms)
        if rate is not None:
            values["rate"] = float(rate)
        if executors is not None:
            values["executors"] = int(executors)
        with self.engine.begin() as conn:
            if values:
                n = conn.execute(update(batch_table).where(batch_table.c.batch_id == batch_id).values(**values)).rowcount
                if n == 0:
                    raise self._unknown(batch_id)
            row = conn.execute(select(batch_table).where(batch_table.c.batch_id == batch_id)).first()
        if row is None:
            raise self._unknown(batch_id)
        return _batch_record(row)

    def _transition(
        self,
        batch_id: int,
        target: str,
        values: dict[str, Any],
        *,
        count_attempt: bool = False,
        stale_before_ms: int | None = None,
    ) -> BatchRecord:
        with self.engine.begin() as conn:
            # Row lock on PostgreSQL (SQLite's BEGIN IMMEDIATE already serialises writers).
            row = conn.execute(
                select(batch_table).where(batch_table.c.batch_id == batch_id).with_for_update()
            ).first()
            if row is None:
                raise self._unknown(batch_id)
            current = _batch_record(row)
            stale = stale_before_ms is not None and current.last_activity_ms < stale_before_ms
            check_transition(batch_id, current.status, target, stale=stale)
            new_values = dict(values)
            new_values["status"] = target
            if count_attempt:
                new_values["attempts"] = batch_table.c.attempts + 1
            # Compare-and-set on the status read above (belt and braces with the row lock).
            n = conn.execute(
                update(batch_table)
                .where(batch_table.c.batch_id == batch_id, batch_table.c.status == current.status)
                .values(**new_values)
            ).rowcount
            if n != 1:
                raise InvalidTransition(
                    f"Batch {batch_id} changed status concurrently while moving from "
                    f"{current.status!r} to {target!r}; read it again and retry if still appropriate."
                )
            conn.execute(
                update(range_table)
                .where(range_table.c.batch_id == batch_id, range_table.c.status != LOST)
                .values(status=target)
            )
            row = conn.execute(select(batch_table).where(batch_table.c.batch_id == batch_id)).first()
        return _batch_record(row)

    def _unknown(self, batch_id: int) -> UnknownBatch:
        return UnknownBatch(
            f"No batch {batch_id} in the ledger at {self.url}. Check the batch id (XCom of the plan "
            "task) and that every task uses the same ledger URL."
        )

    # -- queries ---------------------------------------------------------------------------------

    def batch(self, batch_id: int) -> BatchRecord | None:
        """One batch, or None."""
        with self._read() as conn:
            row = conn.execute(select(batch_table).where(batch_table.c.batch_id == batch_id)).first()
        return None if row is None else _batch_record(row)

    def batch_ranges(self, batch_id: int) -> list[RangeRecord]:
        """The stored (non-empty) ranges of a batch, lost ones included, by topic-partition."""
        with self._read() as conn:
            rows = conn.execute(
                select(range_table)
                .where(range_table.c.batch_id == batch_id)
                .order_by(range_table.c.topic, range_table.c.partition, range_table.c.from_offset)
            ).all()
        return [_range_record(r) for r in rows]

    def replayable_batches(self, pipeline: str, stale_before_ms: int | None = None) -> list[BatchRecord]:
        """Batches to replay, earliest first (batch ids grow with offsets on every partition).

        Failed batches, plus — with ``stale_before_ms`` — batches stuck in planned, running or
        replaying whose last activity (latest start, else creation) is before it: their worker died.
        """
        cond = batch_table.c.status == FAILED
        if stale_before_ms is not None:
            activity = func.coalesce(batch_table.c.started_at_ms, batch_table.c.created_at_ms)
            cond = or_(
                cond,
                and_(batch_table.c.status.in_(IN_FLIGHT_STATUSES), activity < int(stale_before_ms)),
            )
        with self._read() as conn:
            rows = conn.execute(
                select(batch_table)
                .where(batch_table.c.pipeline == pipeline, cond)
                .order_by(batch_table.c.batch_id.asc())
            ).all()
        return [_batch_record(r) for r in rows]

    def committable_offsets(self, pipeline: str) -> dict[TopicPartition, int]:
        """Per partition, the end of the contiguous run of done ranges (succeeded, replayed, lost)
        from the chain start: never past an unfinished or failed range. Partitions without any done
        range at the chain start are left out (nothing to commit)."""
        not_done = case((range_table.c.status.not_in(DONE_RANGE_STATUSES), range_table.c.from_offset))
        with self._read() as conn:
            rows = conn.execute(
                select(
                    range_table.c.topic,
                    range_table.c.partition,
                    func.min(range_table.c.from_offset),
                    func.max(range_table.c.until_offset),
                    func.min(not_done),
                )
                .where(range_table.c.pipeline == pipeline)
                .group_by(range_table.c.topic, range_table.c.partition)
            ).all()
        out: dict[TopicPartition, int] = {}
        for topic, partition, start, end, first_not_done in rows:
            commit = int(end) if first_not_done is None else int(first_not_done)
            if commit > int(start):
                out[TopicPartition(topic, int(partition))] = commit
        return dict(sorted(out.items()))

    def recent_batches(
        self, pipeline: str, limit: int = 50, statuses: Iterable[str] | None = None
    ) -> list[BatchRecord]:
        """The newest batches first (scaling operator, UI)."""
        q = select(batch_table).where(batch_table.c.pipeline == pipeline)
        if statuses is not None:
            statuses = list(statuses)
            unknown = sorted(set(statuses) - set(BATCH_STATUSES))
            if unknown:
                raise ValueError(f"Unknown batch statuses {unknown}; use some of {list(BATCH_STATUSES)}")
            q = q.where(batch_table.c.status.in_(statuses))
        with self._read() as conn:
            rows = conn.execute(q.order_by(batch_table.c.batch_id.desc()).limit(int(limit))).all()
        return [_batch_record(r) for r in rows]

    def pipelines(self) -> list[str]:
        """Every pipeline with a batch (UI)."""
        with self._read() as conn:
            return list(conn.execute(select(batch_table.c.pipeline).distinct().order_by(batch_table.c.pipeline)).scalars())


class _ReadContext:
    """A read-only connection whose transaction is always rolled back (nothing to commit)."""

    def __init__(self, conn: Connection):
        self.conn = conn

    def __enter__(self) -> Connection:
        return self.conn

    def __exit__(self, *exc: object) -> None:
        self.conn.close()


def _first_line(err: BaseException | None) -> str:
    return str(err).strip().splitlines()[0] if err is not None and str(err).strip() else "integrity error"
