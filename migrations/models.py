"""The demo domain as typed SQLAlchemy models: a small shop whose tables Tideline captures.

The migrations in versions/ create these tables with explicit DDL (a migration
must not change when a model does); these models are the readable reference
and what `alembic revision --autogenerate` and the drift test compare against.
"""

from __future__ import annotations

import enum
from datetime import datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import (
    CHAR,
    BigInteger,
    DateTime,
    Enum,
    ForeignKey,
    Identity,
    Index,
    Integer,
    MetaData,
    Numeric,
    String,
    Text,
    func,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

Money = Numeric(12, 2)


class Base(DeclarativeBase):
    # Predictable constraint names, so migrations can refer to them and autogenerate stays quiet.
    metadata = MetaData(
        naming_convention={
            "pk": "%(table_name)s_pkey",
            "fk": "%(table_name)s_%(column_0_name)s_fkey",
            "uq": "%(table_name)s_%(column_0_name)s_key",
            "ix": "%(table_name)s_%(column_0_N_name)s_idx",
        }
    )


def _created() -> Mapped[datetime | None]:
    return mapped_column(DateTime(timezone=True), server_default=func.now())


class OrderStatus(enum.StrEnum):
    pending = "pending"
    paid = "paid"
    shipped = "shipped"
    cancelled = "cancelled"


class Customer(Base):
    __tablename__ = "customers"

    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    email: Mapped[str] = mapped_column(Text, unique=True)
    name: Mapped[str] = mapped_column(Text)
    country: Mapped[str | None] = mapped_column(CHAR(2))
    created_at: Mapped[datetime | None] = _created()
    updated_at: Mapped[datetime | None] = _created()


class Product(Base):
    __tablename__ = "products"

    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    sku: Mapped[str] = mapped_column(Text, unique=True)
    name: Mapped[str] = mapped_column(Text)
    # Can be tens of KB: stored out of line (TOAST), so an update that leaves it
    # unchanged reaches Debezium as a placeholder, merged downstream.
    description: Mapped[str | None] = mapped_column(Text)
    price: Mapped[Decimal] = mapped_column(Money)
    tags: Mapped[list[str] | None] = mapped_column(ARRAY(Text))
    attributes: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    updated_at: Mapped[datetime | None] = _created()


class Order(Base):
    __tablename__ = "orders"
    # Migration 0004: the foreign key's column (deletes of customers check it) and the order desk's
    # (status, id).
    __table_args__ = (Index(None, "customer_id"), Index(None, "status", "id"))

    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    customer_id: Mapped[int | None] = mapped_column(BigInteger, ForeignKey("customers.id"))
    status: Mapped[OrderStatus | None] = mapped_column(
        Enum(OrderStatus, name="order_status", values_callable=lambda e: [m.value for m in e])
    )
    total: Mapped[Decimal | None] = mapped_column(Money)
    created_at: Mapped[datetime | None] = _created()
    updated_at: Mapped[datetime | None] = _created()


class OrderItem(Base):
    __tablename__ = "order_items"

    # Composite key: Debezium's message key (and every sink's document key) is (order_id, line_no).
    order_id: Mapped[int] = mapped_column(BigInteger, ForeignKey("orders.id"), primary_key=True)
    line_no: Mapped[int] = mapped_column(Integer, primary_key=True)
    product_id: Mapped[int | None] = mapped_column(BigInteger, ForeignKey("products.id"), index=True)  # 0004
    quantity: Mapped[int | None] = mapped_column(Integer)
    unit_price: Mapped[Decimal | None] = mapped_column(Money)


# Capture support tables (migration 0002); modelled so autogenerate does not propose dropping them.


class DebeziumSignal(Base):
    """Debezium's signalling table: the layout Debezium expects (id, type, data)."""

    __tablename__ = "debezium_signal"

    id: Mapped[str] = mapped_column(String(42), primary_key=True)
    type: Mapped[str] = mapped_column(String(32))
    data: Mapped[str | None] = mapped_column(String(2048))


class Heartbeat(Base):
    """One row Debezium's heartbeat action query upserts, so a quiet database still advances the slot."""

    __tablename__ = "tideline_heartbeat"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    beat_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


# Chaos runner tables (migration 0003; services/chaos/): captured only by the chaos pipeline.


class _Ledger:
    """One writer's append-only ledger: seq 1, 2, 3, ... with no gap, one per committed transaction."""

    seq: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    operation: Mapped[str] = mapped_column(Text)
    written_at: Mapped[datetime | None] = _created()


class Ledger1(_Ledger, Base):
    __tablename__ = "chaos_ledger_1"


class Ledger2(_Ledger, Base):
    __tablename__ = "chaos_ledger_2"


class Ledger3(_Ledger, Base):
    __tablename__ = "chaos_ledger_3"


class Ledger4(_Ledger, Base):
    __tablename__ = "chaos_ledger_4"


class Bulk(Base):
    """Rows loaded before capture starts, so the full profile's snapshot is large (1M rows)."""

    __tablename__ = "chaos_bulk"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    payload: Mapped[str] = mapped_column(Text)
