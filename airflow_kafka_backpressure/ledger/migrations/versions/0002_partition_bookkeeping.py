"""Per-partition heads and commit watermarks (kbp_partitions), so per-batch bookkeeping is
O(partitions) instead of O(history); an index for the newest batches of a pipeline.

The table is filled from the existing ranges: start = the chain start, head = the largest ``until``,
committed_until = the end of the contiguous run of done ranges from the start (what
``committable_offsets`` computed from every row before), and the positions of the partitions in each
pipeline's latest plan (idle partitions keep their position).

Revision ID: 0002
Revises: 0001
"""

import json

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

_Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
_DONE = "'succeeded', 'replayed', 'lost'"


def upgrade() -> None:
    op.create_index(op.f("ix_kbp_batches_pipeline_batch_id"), "kbp_batches", ["pipeline", "batch_id"])
    partitions = op.create_table(
        "kbp_partitions",
        sa.Column("pipeline", sa.String(200), nullable=False),
        sa.Column("topic", sa.String(249), nullable=False),
        sa.Column("partition", sa.Integer, nullable=False),
        sa.Column("start_offset", sa.BigInteger),
        sa.Column("head", sa.BigInteger),
        sa.Column("committed_until", sa.BigInteger),
        sa.Column("position", sa.BigInteger, nullable=False),
        sa.Column("planned_batch_id", _Id, nullable=False),
        sa.PrimaryKeyConstraint("pipeline", "topic", "partition", name=op.f("pk_kbp_partitions")),
        sa.ForeignKeyConstraint(
            ["pipeline", "topic", "partition", "head"],
            ["kbp_ranges.pipeline", "kbp_ranges.topic", "kbp_ranges.partition", "kbp_ranges.until_offset"],
            name=op.f("fk_kbp_partitions_head"),
        ),
        sa.CheckConstraint(
            "(head IS NULL AND start_offset IS NULL AND committed_until IS NULL) OR "
            "(start_offset <= committed_until AND committed_until <= head)",
            name=op.f("ck_kbp_partitions_watermark"),
        ),
    )
    bind = op.get_bind()
    bind.execute(
        sa.text(
            'INSERT INTO kbp_partitions (pipeline, topic, "partition", start_offset, head, committed_until, '
            "position, planned_batch_id) "
            'SELECT pipeline, topic, "partition", MIN(from_offset), MAX(until_offset), '
            f"COALESCE(MIN(CASE WHEN status NOT IN ({_DONE}) THEN from_offset END), MAX(until_offset)), "
            'MAX(until_offset), MAX(batch_id) FROM kbp_ranges GROUP BY pipeline, topic, "partition"'
        )
    )
    latest = bind.execute(
        sa.text(
            "SELECT b.pipeline, b.batch_id, b.plan_json FROM kbp_batches b JOIN (SELECT pipeline, "
            "MAX(batch_id) AS batch_id FROM kbp_batches GROUP BY pipeline) m ON m.batch_id = b.batch_id"
        )
    ).all()
    for pipeline, batch_id, plan_json in latest:
        for r in json.loads(plan_json)["ranges"]:
            key = {"p": pipeline, "t": r["topic"], "n": int(r["partition"])}
            values = {**key, "pos": int(r["until_offset"]), "b": int(batch_id)}
            updated = bind.execute(
                sa.text(
                    "UPDATE kbp_partitions SET position = :pos, planned_batch_id = :b "
                    'WHERE pipeline = :p AND topic = :t AND "partition" = :n'
                ),
                values,
            ).rowcount
            if not updated:
                bind.execute(
                    partitions.insert().values(
                        pipeline=pipeline,
                        topic=r["topic"],
                        partition=int(r["partition"]),
                        position=int(r["until_offset"]),
                        planned_batch_id=int(batch_id),
                    )
                )


def downgrade() -> None:
    op.drop_table("kbp_partitions")
    op.drop_index(op.f("ix_kbp_batches_pipeline_batch_id"), "kbp_batches")
