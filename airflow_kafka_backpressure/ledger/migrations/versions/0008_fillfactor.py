"""PostgreSQL: leave half of each page of ``kbp_ranges`` and ``kbp_partitions`` free.

A range row is written three times (planned, running, done) and a partition row twice per batch.
With room on its page for the next version of each row, PostgreSQL updates it in place (a HOT
update: no new entry in any of the table's indexes), and the page's dead versions are reclaimed as
it fills. Full pages made each status change of a batch of 10,000 ranges rewrite five index entries
per range (0.31-0.43 s per batch's transitions against 0.13-0.19 s, bench/ledger_growth.py). The
tables take up to twice the space. Pages written before this revision stay as they are; SQLite has
no such setting.

Revision ID: 0008
Revises: 0007
"""

from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE kbp_ranges SET (fillfactor = 50)")
        op.execute("ALTER TABLE kbp_partitions SET (fillfactor = 50)")


def downgrade() -> None:
    raise NotImplementedError("Downgrading the ledger is not supported; restore a backup instead.")
