"""The ledger's tables, as the newest migration leaves them (a test checks the two agree).

``kbp_batches`` (control table), ``kbp_ranges`` (range / failure-record table), ``kbp_partitions``
(per-partition bookkeeping) and ``kbp_losses`` (offsets recorded as lost, with why). See the package docstring for the constraints they enforce. SQLAlchemy
Core only.
"""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import (
    DDL,
    BigInteger,
    CheckConstraint,
    Column,
    Float,
    ForeignKeyConstraint,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
    UniqueConstraint,
    event,
)

from .states import BATCH_STATUSES, LOSS_KINDS, RANGE_STATUSES

__all__ = ["CHAIN_FOREIGN_KEY", "batch_table", "loss_table", "metadata", "partition_table", "range_table"]

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


#: The chain's foreign key. Checked per statement; pruning defers it to the commit for the moment
#: between deleting a chain's first ranges and making the next one the chain start (PostgreSQL:
#: ``SET CONSTRAINTS … DEFERRED``, which needs it DEFERRABLE; SQLite: ``PRAGMA defer_foreign_keys``).
CHAIN_FOREIGN_KEY = "fk_kbp_ranges_chain"
#: PostgreSQL: room on each page for the next version of its rows, so that a range's status changes
#: and a partition's bookkeeping are updated in place (migration 0008 says why).
ROOM_FOR_UPDATES = {"fillfactor": 50}

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
    # The attempt that owns the running batch and until when (epoch ms): see Ledger.renew_lease.
    Column("owner_token", String(64)),
    Column("lease_expires_at_ms", BigInteger),
    # Replays of the batch that failed since it last ran on the main line: orders the replay queue.
    Column("replay_failures", Integer, nullable=False, default=0, server_default="0"),
    # Records of the batch that did not decode and went to the error table (null: nothing decoded).
    Column("bad_records", BigInteger),
    UniqueConstraint("pipeline", "run_id"),
    # Lets kbp_ranges reference (batch_id, pipeline): a range cannot belong to another pipeline's batch.
    UniqueConstraint("batch_id", "pipeline"),
    CheckConstraint(_in("status", BATCH_STATUSES), name="status"),
    CheckConstraint("attempts >= 0", name="attempts"),
    Index(None, "pipeline", "status"),
    Index(None, "pipeline", "batch_id"),  # the newest batches of a pipeline
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
        name=CHAIN_FOREIGN_KEY,
    ),
    CheckConstraint("until_offset > from_offset", name="non_empty"),
    CheckConstraint("from_offset >= 0 AND partition >= 0", name="non_negative"),
    CheckConstraint("prev_until IS NULL OR prev_until = from_offset", name="chained"),
    CheckConstraint(_in("status", RANGE_STATUSES), name="status"),
    Index(None, "batch_id"),
    postgresql_with=ROOM_FOR_UPDATES,
)

event.listen(
    range_table,
    "after_create",
    DDL(
        f"ALTER TABLE kbp_ranges ALTER CONSTRAINT {CHAIN_FOREIGN_KEY} DEFERRABLE INITIALLY IMMEDIATE"
    ).execute_if(dialect="postgresql"),
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

#: Per (pipeline, topic, partition): where its chain starts and ends and how far it is done, kept in
#: the same transactions as the plans and transitions that change them, so that heads, commits and
#: plans cost O(partitions) whatever the length of the history.
partition_table = Table(
    "kbp_partitions",
    metadata,
    Column("pipeline", String(200), nullable=False),
    Column("topic", String(249), nullable=False),
    Column("partition", Integer, nullable=False),
    # ``from`` of the partition's first stored range ever (pruning old ranges keeps it); NULL: none yet.
    Column("start_offset", BigInteger),
    # ``until`` of its last stored range: where the main line continues. NULL: no stored range yet.
    Column("head", BigInteger),
    # The end of the contiguous run of done ranges from ``start_offset`` (== start_offset: none done).
    Column("committed_until", BigInteger),
    # Where its range in the latest plan that listed it ended (empty ranges too), and that plan's batch.
    Column("position", BigInteger, nullable=False),
    Column("planned_batch_id", _Id, nullable=False),
    PrimaryKeyConstraint("pipeline", "topic", "partition"),
    # The head is the end of a stored range (so the range at the head can never be deleted).
    ForeignKeyConstraint(
        ["pipeline", "topic", "partition", "head"],
        ["kbp_ranges.pipeline", "kbp_ranges.topic", "kbp_ranges.partition", "kbp_ranges.until_offset"],
        name="fk_kbp_partitions_head",
    ),
    CheckConstraint(
        "(head IS NULL AND start_offset IS NULL AND committed_until IS NULL) OR "
        "(start_offset <= committed_until AND committed_until <= head)",
        name="watermark",
    ),
    postgresql_with=ROOM_FOR_UPDATES,
)

#: Offsets recorded as lost, per batch: found by its plan, by its replay, or given up by abandon().
#: Disjoint spans inside the batch's ranges; the monitoring page lists them. No foreign key to the
#: batch: a loss outlives its batch when old batches are pruned (``batch_id`` stays as a number) and
#: has its own retention (:meth:`~.repository.Ledger.prune_losses`, ``ledger_keep_losses_days``).
loss_table = Table(
    "kbp_losses",
    metadata,
    Column("id", _Id, primary_key=True, autoincrement=True),
    Column("batch_id", _Id, nullable=False),
    Column("pipeline", String(200), nullable=False),
    Column("topic", String(249), nullable=False),
    Column("partition", Integer, nullable=False),
    Column("from_offset", BigInteger, nullable=False),
    Column("until_offset", BigInteger, nullable=False),
    Column("kind", String(16), nullable=False),
    Column("reason", Text),
    Column("recorded_at_ms", BigInteger, nullable=False),
    UniqueConstraint("batch_id", "topic", "partition", "from_offset"),
    CheckConstraint("until_offset > from_offset AND from_offset >= 0", name="non_empty"),
    CheckConstraint(_in("kind", LOSS_KINDS), name="kind"),
    Index(None, "pipeline", "batch_id"),
)
