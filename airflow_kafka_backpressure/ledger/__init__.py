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
    retention deleted before they were read. Its status follows its batch (``lost`` stays ``lost``;
    the ranges of an ``abandoned`` batch become ``lost``).

``kbp_partitions`` (bookkeeping)
    Per partition: where its chain started, its head and its commit watermark (the end of the
    contiguous run of done ranges), kept in the same transactions as the ranges, so every per-batch
    call costs O(partitions), not O(history).

``kbp_losses``
    Offsets recorded as lost per batch (by the plan, a replay, or :meth:`Ledger.abandon`), with why.

The schema evolves through Alembic migrations (:mod:`.migrate`, version table ``kbp_alembic_version``);
``python -m airflow_kafka_backpressure.ledger`` upgrades, abandons and prunes.

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

from .chain import ChainSegment, chain_segments
from .commands import abandon_command, ledger_command
from .engine import DEFAULT_TIMEOUT_S, default_ledger_url
from .records import BatchLosses, BatchRecord, LossRecord, PruneResult, RangeRecord
from .replay_queue import REPLAY_BACKOFF_MAX_S, ReplayQueue
from .repository import Ledger, now_ms
from .schema import batch_table, loss_table, metadata, partition_table, range_table
from .states import (
    ABANDONED,
    ALLOWED_TRANSITIONS,
    BATCH_STATUSES,
    DONE_RANGE_STATUSES,
    FAILED,
    FINISHED_BATCH_STATUSES,
    IN_FLIGHT_STATUSES,
    LOSS_KINDS,
    LOST,
    PLANNED,
    RANGE_STATUSES,
    REPLAYED,
    REPLAYING,
    RUNNING,
    STALE_ONLY_REPLAY_SOURCES,
    STALE_ONLY_SOURCES,
    SUCCEEDED,
    InvalidTransition,
    LeaseLost,
    LedgerConflict,
    LedgerError,
    LedgerNotInitialised,
    LedgerUnavailable,
    UnknownBatch,
    check_transition,
    is_stale,
)
from .transitions import new_attempt_token

__all__ = [
    "ABANDONED",
    "DEFAULT_TIMEOUT_S",
    "ALLOWED_TRANSITIONS",
    "BATCH_STATUSES",
    "DONE_RANGE_STATUSES",
    "FAILED",
    "FINISHED_BATCH_STATUSES",
    "IN_FLIGHT_STATUSES",
    "LOSS_KINDS",
    "LOST",
    "PLANNED",
    "RANGE_STATUSES",
    "REPLAY_BACKOFF_MAX_S",
    "REPLAYED",
    "REPLAYING",
    "RUNNING",
    "STALE_ONLY_REPLAY_SOURCES",
    "STALE_ONLY_SOURCES",
    "SUCCEEDED",
    "BatchLosses",
    "BatchRecord",
    "ChainSegment",
    "InvalidTransition",
    "LeaseLost",
    "Ledger",
    "LedgerConflict",
    "LedgerError",
    "LedgerNotInitialised",
    "LedgerUnavailable",
    "LossRecord",
    "PruneResult",
    "RangeRecord",
    "ReplayQueue",
    "UnknownBatch",
    "abandon_command",
    "batch_table",
    "check_transition",
    "chain_segments",
    "default_ledger_url",
    "is_stale",
    "ledger_command",
    "loss_table",
    "metadata",
    "new_attempt_token",
    "now_ms",
    "partition_table",
    "range_table",
]
