"""A terminal batch status ``abandoned``, recorded losses (kbp_losses), prunable chains.

* ``kbp_batches.status`` may be ``abandoned``. PostgreSQL swaps the check constraint; SQLite cannot
  alter one, so the table is rebuilt as SQLite's ALTER TABLE guide prescribes (new table, copy, drop,
  rename; foreign keys are off for the upgrading connection and checked before the commit), keeping
  its AUTOINCREMENT counter so no batch id is ever handed out twice.
* ``kbp_losses``: offsets recorded as lost per batch, filled from the existing ``lost`` ranges.
* PostgreSQL: the chain's foreign key becomes DEFERRABLE (still checked per statement unless a
  transaction defers it), so pruning can move a chain's start in one transaction.

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

_Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
_STATUSES = "'planned', 'running', 'succeeded', 'failed', 'replaying', 'replayed', 'abandoned'"
_BATCH_COLUMNS = (
    "batch_id, pipeline, run_id, status, created_at_ms, started_at_ms, ended_at_ms, records, processing_ms, "
    "scheduling_delay_ms, rate, executors, attempts, error, plan_json, sink"
)


def upgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name == "sqlite":
        _rebuild_sqlite_batches(bind)
    else:
        op.drop_constraint(op.f("ck_kbp_batches_status"), "kbp_batches", type_="check")
        op.create_check_constraint(op.f("ck_kbp_batches_status"), "kbp_batches", f"status IN ({_STATUSES})")
    if bind.dialect.name == "postgresql":
        op.execute(
            "ALTER TABLE kbp_ranges ALTER CONSTRAINT fk_kbp_ranges_chain DEFERRABLE INITIALLY IMMEDIATE"
        )
    op.create_table(
        "kbp_losses",
        sa.Column("id", _Id, nullable=False, autoincrement=True),
        sa.Column("batch_id", _Id, nullable=False),
        sa.Column("pipeline", sa.String(200), nullable=False),
        sa.Column("topic", sa.String(249), nullable=False),
        sa.Column("partition", sa.Integer, nullable=False),
        sa.Column("from_offset", sa.BigInteger, nullable=False),
        sa.Column("until_offset", sa.BigInteger, nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text),
        sa.Column("recorded_at_ms", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_kbp_losses")),
        sa.ForeignKeyConstraint(
            ["batch_id", "pipeline"],
            ["kbp_batches.batch_id", "kbp_batches.pipeline"],
            name=op.f("fk_kbp_losses_batch_id_pipeline"),
        ),
        sa.UniqueConstraint(
            "batch_id",
            "topic",
            "partition",
            "from_offset",
            name=op.f("uq_kbp_losses_batch_id_topic_partition_from_offset"),
        ),
        sa.CheckConstraint(
            "until_offset > from_offset AND from_offset >= 0", name=op.f("ck_kbp_losses_non_empty")
        ),
        sa.CheckConstraint("kind IN ('plan', 'replay', 'abandon')", name=op.f("ck_kbp_losses_kind")),
    )
    op.create_index(op.f("ix_kbp_losses_pipeline_batch_id"), "kbp_losses", ["pipeline", "batch_id"])
    op.execute(
        'INSERT INTO kbp_losses (batch_id, pipeline, topic, "partition", from_offset, until_offset, kind, '
        'recorded_at_ms) SELECT r.batch_id, r.pipeline, r.topic, r."partition", r.from_offset, r.until_offset, '
        "'plan', b.created_at_ms FROM kbp_ranges r JOIN kbp_batches b ON b.batch_id = r.batch_id "
        "WHERE r.status = 'lost'"
    )


def _rebuild_sqlite_batches(bind: sa.Connection) -> None:
    seq = bind.exec_driver_sql("SELECT seq FROM sqlite_sequence WHERE name = 'kbp_batches'").scalar()
    op.create_table(
        "_kbp_new_batches",
        sa.Column("batch_id", _Id, nullable=False, autoincrement=True),
        sa.Column("pipeline", sa.String(200), nullable=False),
        sa.Column("run_id", sa.String(250), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("created_at_ms", sa.BigInteger, nullable=False),
        sa.Column("started_at_ms", sa.BigInteger),
        sa.Column("ended_at_ms", sa.BigInteger),
        sa.Column("records", sa.BigInteger),
        sa.Column("processing_ms", sa.BigInteger),
        sa.Column("scheduling_delay_ms", sa.BigInteger),
        sa.Column("rate", sa.Float),
        sa.Column("executors", sa.Integer),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("error", sa.Text),
        sa.Column("plan_json", sa.Text, nullable=False),
        sa.Column("sink", sa.Text, nullable=False),
        sa.PrimaryKeyConstraint("batch_id", name=op.f("pk_kbp_batches")),
        sa.UniqueConstraint("pipeline", "run_id", name=op.f("uq_kbp_batches_pipeline_run_id")),
        sa.UniqueConstraint("batch_id", "pipeline", name=op.f("uq_kbp_batches_batch_id_pipeline")),
        sa.CheckConstraint(f"status IN ({_STATUSES})", name=op.f("ck_kbp_batches_status")),
        sa.CheckConstraint("attempts >= 0", name=op.f("ck_kbp_batches_attempts")),
        sqlite_autoincrement=True,
    )
    op.execute(f"INSERT INTO _kbp_new_batches ({_BATCH_COLUMNS}) SELECT {_BATCH_COLUMNS} FROM kbp_batches")
    op.execute("DROP TABLE kbp_batches")
    op.execute("ALTER TABLE _kbp_new_batches RENAME TO kbp_batches")
    op.create_index(op.f("ix_kbp_batches_pipeline_status"), "kbp_batches", ["pipeline", "status"])
    op.create_index(op.f("ix_kbp_batches_pipeline_batch_id"), "kbp_batches", ["pipeline", "batch_id"])
    if seq is not None:  # the highest id ever handed out, deleted batches included
        bind.exec_driver_sql("DELETE FROM sqlite_sequence WHERE name = 'kbp_batches'")
        bind.exec_driver_sql("INSERT INTO sqlite_sequence (name, seq) VALUES ('kbp_batches', ?)", (int(seq),))


def downgrade() -> None:
    raise NotImplementedError("Downgrading the ledger is not supported; restore a backup instead.")
