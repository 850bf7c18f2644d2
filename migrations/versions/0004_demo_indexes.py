"""Indexes the demo shop needs once its tables grow: the foreign keys' referencing columns and
orders by status.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-25

PostgreSQL does not index a foreign key's referencing column. Without these, every DELETE of a
customer scans orders and every DELETE of a product scans order_items (the foreign key's check),
and "is this customer referenced?" scans too: at 100,000 orders the demo workload's deletions
took 62-80 ms each and capped the load generator (docs/benchmarks.md, The load generator).
orders (status, id) is the order desk's index: the next pending order, the next paid one.
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0004"
down_revision: str | Sequence[str] | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

INDEXES = {
    "orders_customer_id_idx": ("orders", ["customer_id"]),
    "order_items_product_id_idx": ("order_items", ["product_id"]),
    "orders_status_id_idx": ("orders", ["status", "id"]),
}


def upgrade() -> None:
    for name, (table, columns) in INDEXES.items():
        op.create_index(name, table, columns)


def downgrade() -> None:
    for name, (table, _) in INDEXES.items():
        op.drop_index(name, table_name=table)
