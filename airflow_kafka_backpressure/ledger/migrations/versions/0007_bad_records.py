"""``kbp_batches.bad_records``: how many of the batch's records did not decode (a pipeline with a
``key_format`` or ``value_format``) and went to the error table with its commit. Null: the batch
decoded nothing, or ran before this revision.

Revision ID: 0007
Revises: 0006
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("kbp_batches", sa.Column("bad_records", sa.BigInteger, nullable=True))


def downgrade() -> None:
    raise NotImplementedError("Downgrading the ledger is not supported; restore a backup instead.")
