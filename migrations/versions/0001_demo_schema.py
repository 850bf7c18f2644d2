"""Demo schema: customers, products, orders, order_items.

Revision ID: 0001
Revises:
Create Date: 2025-11-22

Default replica identity on purpose (primary key only): update and delete
events carry the key, not a full old image, and unchanged TOASTed columns
(products.description) arrive as Debezium's placeholder, merged downstream.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

order_status = postgresql.ENUM("pending", "paid", "shipped", "cancelled", name="order_status", create_type=False)


def _money() -> sa.Numeric:
    return sa.Numeric(12, 2)


def _timestamp(name: str) -> sa.Column:
    return sa.Column(name, sa.DateTime(timezone=True), server_default=sa.func.now())


def upgrade() -> None:
    order_status.create(op.get_bind())
    op.create_table(
        "customers",
        sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
        sa.Column("email", sa.Text, nullable=False),
        sa.Column("name", sa.Text, nullable=False),
        sa.Column("country", sa.CHAR(2)),
        _timestamp("created_at"),
        _timestamp("updated_at"),
        sa.PrimaryKeyConstraint("id", name="customers_pkey"),
        sa.UniqueConstraint("email", name="customers_email_key"),
    )
    op.create_table(
        "products",
        sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
        sa.Column("sku", sa.Text, nullable=False),
        sa.Column("name", sa.Text, nullable=False),
        sa.Column("description", sa.Text),  # default storage EXTENDED: large values are TOASTed
        sa.Column("price", _money(), nullable=False),
        sa.Column("tags", postgresql.ARRAY(sa.Text)),
        sa.Column("attributes", postgresql.JSONB),
        _timestamp("updated_at"),
        sa.PrimaryKeyConstraint("id", name="products_pkey"),
        sa.UniqueConstraint("sku", name="products_sku_key"),
    )
    op.create_table(
        "orders",
        sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
        sa.Column("customer_id", sa.BigInteger),
        sa.Column("status", order_status),
        sa.Column("total", _money()),
        _timestamp("created_at"),
        _timestamp("updated_at"),
        sa.PrimaryKeyConstraint("id", name="orders_pkey"),
        sa.ForeignKeyConstraint(["customer_id"], ["customers.id"], name="orders_customer_id_fkey"),
    )
    op.create_table(
        "order_items",
        sa.Column("order_id", sa.BigInteger, nullable=False),
        sa.Column("line_no", sa.Integer, nullable=False),
        sa.Column("product_id", sa.BigInteger),
        sa.Column("quantity", sa.Integer),
        sa.Column("unit_price", _money()),
        sa.PrimaryKeyConstraint("order_id", "line_no", name="order_items_pkey"),
        sa.ForeignKeyConstraint(["order_id"], ["orders.id"], name="order_items_order_id_fkey"),
        sa.ForeignKeyConstraint(["product_id"], ["products.id"], name="order_items_product_id_fkey"),
    )


def downgrade() -> None:
    for table in ("order_items", "orders", "products", "customers"):
        op.drop_table(table)
    order_status.drop(op.get_bind())
