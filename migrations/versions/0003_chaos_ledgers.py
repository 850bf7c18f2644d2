"""Chaos runner tables: one append-only ledger per concurrent writer, and a bulk table for the
large-snapshot scenario (services/chaos/, docs/reliability.md "Chaos runner").

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-22

Each writer appends seq 1, 2, 3, ... to its own ledger in the same transaction as its demo
change, so a sink that lost or invented a transaction shows a gap or an extra row. Only the
chaos pipeline captures them; pipeline.yaml does not.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | Sequence[str] | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Keep in step with services/chaos/ledger.py (MAX_WRITERS) and migrations/models.py.
LEDGERS = [f"chaos_ledger_{n}" for n in range(1, 5)]
BULK = "chaos_bulk"


def upgrade() -> None:
    for name in LEDGERS:
        op.create_table(
            name,
            sa.Column("seq", sa.BigInteger, autoincrement=False, nullable=False),
            sa.Column("operation", sa.Text, nullable=False),
            sa.Column("written_at", sa.DateTime(timezone=True), server_default=sa.func.now()),
            sa.PrimaryKeyConstraint("seq", name=f"{name}_pkey"),
        )
    op.create_table(
        BULK,
        sa.Column("id", sa.BigInteger, autoincrement=False, nullable=False),
        sa.Column("payload", sa.Text, nullable=False),
        sa.PrimaryKeyConstraint("id", name=f"{BULK}_pkey"),
    )


def downgrade() -> None:
    for name in [BULK, *LEDGERS]:
        op.drop_table(name)
