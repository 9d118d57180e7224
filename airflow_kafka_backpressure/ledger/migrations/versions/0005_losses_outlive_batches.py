"""Recorded losses outlive their batches: ``kbp_losses`` no longer references ``kbp_batches``.

Pruning old batches (``ledger_keep_batches``) used to delete their recorded losses with them, so a
retention or topic-reset loss vanished from the ledger and the monitoring page a few days after it
happened. Loss rows now stay when their batch is pruned (``batch_id`` stays, as a plain number) and
have their own retention (``ledger_keep_losses_days``, :meth:`Ledger.prune_losses`).

PostgreSQL drops the foreign key; SQLite cannot, so the table is rebuilt as SQLite's ALTER TABLE
guide prescribes (new table, copy, drop, rename), with every row and constraint name kept.

Revision ID: 0005
Revises: 0004
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

_Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
_COLUMNS = "id, batch_id, pipeline, topic, partition, from_offset, until_offset, kind, reason, recorded_at_ms"


def upgrade() -> None:
    if op.get_bind().dialect.name != "sqlite":
        op.drop_constraint(op.f("fk_kbp_losses_batch_id_pipeline"), "kbp_losses", type_="foreignkey")
        return
    op.create_table(
        "_kbp_new_losses",
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
    columns = _COLUMNS.replace("partition", '"partition"')
    op.execute(f"INSERT INTO _kbp_new_losses ({columns}) SELECT {columns} FROM kbp_losses")
    op.execute("DROP TABLE kbp_losses")
    op.execute("ALTER TABLE _kbp_new_losses RENAME TO kbp_losses")
    op.create_index(op.f("ix_kbp_losses_pipeline_batch_id"), "kbp_losses", ["pipeline", "batch_id"])


def downgrade() -> None:
    raise NotImplementedError("Downgrading the ledger is not supported; restore a backup instead.")
