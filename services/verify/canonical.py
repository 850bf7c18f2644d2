"""Canonical rows for `tide verify`, free of any store: one JSON object per row, typed by PostgreSQL.

PostgreSQL and each sink hand over rows in their own encodings (psycopg's
Decimal and aware datetime, Elasticsearch's JSON strings, Redis's JSON field
values, Spark's typed columns). Every row is first brought to one canonical
JSON object of the source table's columns, typed by the *PostgreSQL* column
types, so equal content always hashes equal whichever side it came from.
services/verify/reconcile.py compares the hashes.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time
from decimal import Context, Decimal
from typing import Any
from uuid import UUID

from spark_jobs.changes.envelope import row_id
from spark_jobs.sinks.base import META_PREFIX

# Decimal arithmetic with room for any NUMERIC (up to 131072 digits before the point).
_EXACT = Context(prec=200_000, Emax=1_000_000, Emin=-1_000_000)


# ---- source table shape ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Column:
    """A source column as PostgreSQL types it: the base type name (pg_type.typname, domains resolved,
    the element type for arrays), whether it is an array, and NUMERIC's declared scale."""

    name: str
    type: str
    array: bool = False
    scale: int | None = None


@dataclass(frozen=True)
class TableShape:
    """What verify needs to know about a source table: its columns and its primary key, in key order."""

    schema: str
    table: str
    columns: tuple[Column, ...]
    key: tuple[str, ...]

    @property
    def column_names(self) -> list[str]:
        return [column.name for column in self.columns]

    def column(self, name: str) -> Column:
        return next(column for column in self.columns if column.name == name)


# ---- canonical values -------------------------------------------------------------------------------

Canon = Callable[[Any], Any]


def _numeric(scale: int | None) -> Canon:
    """Exact decimal text, never exponent notation. NUMERIC(p, s) is shown at its declared scale
    ("12.50"), so a sink value with fewer or more zero digits ("12.5", "12.500") compares equal and
    any other digit differs. Unconstrained NUMERIC keeps the scale PostgreSQL gives ("12.50" is not
    "12.5"): every sink stores it as exact text (the warehouse as a string column)."""

    def canon(value: Any) -> str:
        number = _decimal(value)
        if not number.is_finite():
            return str(number)  # NaN, Infinity
        if scale is None:
            return format(number, "f")
        exact = number.quantize(Decimal(1).scaleb(-scale), context=_EXACT)
        return format(exact if exact == number else number, "f")

    return canon


def _decimal(value: Any) -> Decimal:
    if isinstance(value, Decimal):
        return value
    if isinstance(value, float):
        return Decimal(repr(value))  # the shortest text that round-trips, not the binary expansion
    if isinstance(value, (int, str)) and not isinstance(value, bool):
        return Decimal(value)
    raise TypeError(f"not a number: {value!r}")


def _datetime(value: Any) -> datetime:
    if isinstance(value, datetime):
        return value
    if isinstance(value, str):
        return datetime.fromisoformat(value)
    raise TypeError(f"not a timestamp: {value!r}")


def _timestamptz(value: Any) -> str:
    """UTC with microseconds and offset. A naive value is taken as UTC: Spark's sessions run in UTC."""
    moment = _datetime(value)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).isoformat(timespec="microseconds")


def _timestamp(value: Any) -> str:
    """Wall-clock time with microseconds, no offset; an aware value (a sink that added one) as UTC."""
    moment = _datetime(value)
    if moment.tzinfo is not None:
        moment = moment.astimezone(UTC).replace(tzinfo=None)
    return moment.isoformat(timespec="microseconds")


def _date(value: Any) -> str:
    if isinstance(value, datetime):
        return value.date().isoformat()
    if isinstance(value, date):
        return value.isoformat()
    return date.fromisoformat(value).isoformat()


def _time(value: Any) -> str:
    moment = value if isinstance(value, time) else time.fromisoformat(value)
    return moment.isoformat(timespec="microseconds")


def _json(value: Any) -> Any:
    # Already parsed on both sides (psycopg, Elasticsearch, Redis; the Delta reader parses its JSON
    # text); key order is made canonical when the whole row is serialised with sorted keys.
    return value


def _integer(value: Any) -> int:
    if isinstance(value, bool):
        raise TypeError(f"not an integer: {value!r}")
    if isinstance(value, float) and not value.is_integer():
        raise TypeError(f"not an integer: {value!r}")
    return int(value)


def _float8(value: Any) -> Any:
    number = float(value) if not isinstance(value, bool) else math.nan
    return number if math.isfinite(number) else str(number)  # JSON has no NaN or Infinity


def _float4(value: Any) -> Any:
    # PostgreSQL prints real as its shortest text ("0.1"), Spark widens the float32 (0.10000000149...):
    # rounding both to float32 makes them agree.
    number = _float8(value)
    return struct.unpack("f", struct.pack("f", number))[0] if isinstance(number, float) else number


def _bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"not a boolean: {value!r}")
    return value


def _bytes(value: Any) -> str:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(value)).decode()
    if isinstance(value, str):
        return value  # sinks keep bytea as base64 text already
    raise TypeError(f"not bytes: {value!r}")


def _text(value: Any) -> str:
    return value if isinstance(value, str) else str(value)  # uuid, enums, anything printed as text


_BY_TYPE: dict[str, Canon] = {
    "timestamptz": _timestamptz,
    "timestamp": _timestamp,
    "date": _date,
    "time": _time,
    "timetz": _time,
    "json": _json,
    "jsonb": _json,
    "int2": _integer,
    "int4": _integer,
    "int8": _integer,
    "oid": _integer,
    "float4": _float4,
    "float8": _float8,
    "bool": _bool,
    "bytea": _bytes,
}


def canonicaliser(column: Column) -> Canon:
    """The function that turns any side's value of `column` into its canonical JSON value.

    Never raises: a value that does not parse as the column's type becomes a marker that cannot
    equal a well-formed value, so the row is reported `different` instead of aborting the run.
    """
    scalar = _numeric(column.scale) if column.type == "numeric" else _BY_TYPE.get(column.type, _text)

    def element(value: Any) -> Any:
        if value is None:
            return None
        if column.array and isinstance(value, list):  # multi-dimensional arrays nest
            return [element(item) for item in value]
        return scalar(value)

    def canon(value: Any) -> Any:
        if column.array and value is not None and not isinstance(value, list):
            return _unreadable(column, value)
        try:
            return element(value)
        except (TypeError, ValueError, ArithmeticError, OverflowError, struct.error):
            return _unreadable(column, value)

    return canon


def _unreadable(column: Column, value: Any) -> str:
    return f"\x00unreadable {column.type}: {value!r}"[:500]


@dataclass(frozen=True)
class Canonicaliser:
    """Canonical rows and content hashes of one source table, for rows from any side."""

    shape: TableShape
    _canons: tuple[tuple[str, Canon], ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        # A source column named like sink metadata could not be told apart from it: left out, as `tl_*` is.
        canons = tuple(
            (column.name, canonicaliser(column)) for column in self.shape.columns if not is_metadata(column.name)
        )
        object.__setattr__(self, "_canons", canons)

    def row(self, row: Mapping[str, Any]) -> dict[str, Any]:
        """The source columns only: `tl_*` metadata and any other sink-side field are left out.

        A column the sink's row lacks counts as NULL: `ALTER TABLE ... ADD COLUMN` emits no change
        events, so rows untouched since then carry no field for it, and PostgreSQL reads NULL too.
        """
        return {name: canon(row[name]) if name in row else None for name, canon in self._canons}

    def digest(self, row: Mapping[str, Any]) -> str:
        return content_hash(self.row(row))

    def doc_id(self, row: Mapping[str, Any]) -> str:
        return row_doc_id(self.shape, row)


def content_hash(canonical: Mapping[str, Any]) -> str:
    text = json.dumps(canonical, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


def is_metadata(name: str) -> bool:
    return name.startswith(META_PREFIX)


# ---- doc ids ------------------------------------------------------------------------------------------


def key_value(value: Any) -> Any:
    """A key column's value as Debezium puts it in the record key (what the sinks' ids are built from):
    numbers and text as JSON, NUMERIC as its exact string (decimal.handling.mode=string), uuid as text."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, Decimal):
        return format(value, "f")
    if isinstance(value, UUID):
        return str(value)
    # Temporal keys: Debezium's encodings (epoch days, micros, zoned text) are not reproduced here.
    return str(value)


def row_doc_id(shape: TableShape, row: Mapping[str, Any]) -> str:
    """The id a sink gives this row: spark_jobs.changes.envelope.row_id of the key columns in key order."""
    return row_id([key_value(row[name]) for name in shape.key])


__all__ = ["Canon", "Canonicaliser", "Column", "TableShape", "canonicaliser", "content_hash", "is_metadata",
           "key_value", "row_doc_id"]
