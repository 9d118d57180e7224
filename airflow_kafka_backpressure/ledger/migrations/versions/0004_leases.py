"""Leases: the attempt that owns an in-flight batch (``owner_token``) and until when
(``lease_expires_at_ms``). Old rows have none; ``stale_before_ms`` still decides for them.

Revision ID: 0004
Revises: 0003
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("kbp_batches", sa.Column("owner_token", sa.String(64)))
    op.add_column("kbp_batches", sa.Column("lease_expires_at_ms", sa.BigInteger))


def downgrade() -> None:
    raise NotImplementedError("Downgrading the ledger is not supported; restore a backup instead.")
