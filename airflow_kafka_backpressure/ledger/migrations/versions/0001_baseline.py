"""Baseline: the ledger as created before migrations existed (batches and ranges).

A ledger made by ``create_all`` (no version table) is stamped with this revision, then upgraded.

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

_Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
_BATCH_STATUSES = "'planned', 'running', 'succeeded', 'failed', 'replaying', 'replayed'"


def upgrade() -> None:
    op.create_table(
        "kbp_batches",
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
        sa.CheckConstraint(f"status IN ({_BATCH_STATUSES})", name=op.f("ck_kbp_batches_status")),
        sa.CheckConstraint("attempts >= 0", name=op.f("ck_kbp_batches_attempts")),
        sqlite_autoincrement=True,
    )
    op.create_index(op.f("ix_kbp_batches_pipeline_status"), "kbp_batches", ["pipeline", "status"])
    op.create_table(
        "kbp_ranges",
        sa.Column("id", _Id, nullable=False, autoincrement=True),
        sa.Column("batch_id", _Id, nullable=False),
        sa.Column("pipeline", sa.String(200), nullable=False),
        sa.Column("topic", sa.String(249), nullable=False),
        sa.Column("partition", sa.Integer, nullable=False),
        sa.Column("from_offset", sa.BigInteger, nullable=False),
        sa.Column("until_offset", sa.BigInteger, nullable=False),
        sa.Column("prev_until", sa.BigInteger, nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_kbp_ranges")),
        sa.ForeignKeyConstraint(
            ["batch_id", "pipeline"],
            ["kbp_batches.batch_id", "kbp_batches.pipeline"],
            name=op.f("fk_kbp_ranges_batch_id_pipeline"),
        ),
        sa.UniqueConstraint(
            "pipeline",
            "topic",
            "partition",
            "from_offset",
            name=op.f("uq_kbp_ranges_pipeline_topic_partition_from_offset"),
        ),
        sa.UniqueConstraint(
            "pipeline",
            "topic",
            "partition",
            "until_offset",
            name=op.f("uq_kbp_ranges_pipeline_topic_partition_until_offset"),
        ),
        sa.ForeignKeyConstraint(
            ["pipeline", "topic", "partition", "prev_until"],
            ["kbp_ranges.pipeline", "kbp_ranges.topic", "kbp_ranges.partition", "kbp_ranges.until_offset"],
            name=op.f("fk_kbp_ranges_chain"),
        ),
        sa.CheckConstraint("until_offset > from_offset", name=op.f("ck_kbp_ranges_non_empty")),
        sa.CheckConstraint("from_offset >= 0 AND partition >= 0", name=op.f("ck_kbp_ranges_non_negative")),
        sa.CheckConstraint(
            "prev_until IS NULL OR prev_until = from_offset", name=op.f("ck_kbp_ranges_chained")
        ),
        sa.CheckConstraint(f"status IN ({_BATCH_STATUSES}, 'lost')", name=op.f("ck_kbp_ranges_status")),
    )
    op.create_index(op.f("ix_kbp_ranges_batch_id"), "kbp_ranges", ["batch_id"])
    op.create_index(
        op.f("uq_kbp_ranges_chain_start"),
        "kbp_ranges",
        ["pipeline", "topic", "partition"],
        unique=True,
        sqlite_where=sa.text("prev_until IS NULL"),
        postgresql_where=sa.text("prev_until IS NULL"),
    )


def downgrade() -> None:
    op.drop_table("kbp_ranges")
    op.drop_table("kbp_batches")
