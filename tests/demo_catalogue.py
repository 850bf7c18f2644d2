"""The demo schema's catalogue without a database: migrations/models.py (kept equal to the migrated
catalogue by tests/e2e/test_derived_views.py) as spark_jobs.model.catalogue describes a live PostgreSQL."""

from __future__ import annotations

from functools import cache

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from spark_jobs.model.catalogue import Catalogue, Column, TableSchema

# SQLAlchemy type → (PostgreSQL type name, typcategory), most specific first.
_TYPES: list[tuple[type, str, str]] = [
    (sa.SmallInteger, "INT2", "N"), (sa.BigInteger, "INT8", "N"), (sa.Integer, "INT4", "N"), (sa.Float, "FLOAT8", "N"),
    (sa.Boolean, "BOOL", "B"), (sa.Date, "DATE", "D"), (postgresql.JSONB, "JSONB", "U"), (sa.JSON, "JSON", "U"),
    (sa.LargeBinary, "BYTEA", "U"),
]


def _column(column: sa.Column) -> Column:
    kind = column.type
    if isinstance(kind, sa.ARRAY):
        element = _column(sa.Column(column.name, kind.item_type))
        return Column(column.name, "_" + element.type, element.precision, element.scale, element.values,
                      element.category)
    if isinstance(kind, sa.Enum):
        if kind.name is None:
            raise ValueError(f"{column.name}: a PostgreSQL enum needs a type name")
        return Column(column.name, kind.name.upper(), values=tuple(kind.enums), category="E")
    if isinstance(kind, sa.Numeric) and not isinstance(kind, sa.Float):
        return Column(column.name, "NUMERIC", kind.precision, kind.scale, category="N")
    if isinstance(kind, sa.DateTime):
        return Column(column.name, "TIMESTAMPTZ" if kind.timezone else "TIMESTAMP", category="D")
    if isinstance(kind, sa.String) and kind.length:  # CHAR(n) is PostgreSQL's bpchar
        return Column(column.name, "BPCHAR" if isinstance(kind, sa.CHAR) else "VARCHAR", kind.length, category="S")
    name, category = next(((name, category) for cls, name, category in _TYPES if isinstance(kind, cls)), ("TEXT", "S"))
    return Column(column.name, name, category=category)


@cache
def demo_catalogue() -> Catalogue:
    from migrations.models import Base

    return {
        name: TableSchema({c.name: _column(c) for c in table.columns}, tuple(c.name for c in table.primary_key.columns))
        for name, table in Base.metadata.tables.items()
    }
