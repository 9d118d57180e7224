"""``kbp_batches.replay_failures``: how many replays of the batch failed since it last ran on the
main line (a failed replay, or a replay whose worker died). The replay DAG tries batches whose
replays keep failing after the others, with a growing backoff (:mod:`..replay_queue`), so a batch
refused every time (retention or a topic reset under ``"fail"``, a poison batch) never holds back
the rest. Old rows start at 0.

Revision ID: 0006
Revises: 0005
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("kbp_batches", sa.Column("replay_failures", sa.Integer, nullable=False, server_default="0"))


def downgrade() -> None:
    raise NotImplementedError("Downgrading the ledger is not supported; restore a backup instead.")
