"""Debezium records read in Python, one at a time: raw Kafka key/value bytes → a `Change`.

For inspection tools only (`tide tail`, status, chaos, snapshot checks): the apply jobs decode in the
JVM (stream.py). Both are built from envelope.py. A record written without a schema (the connector's
setting) keeps the values JSON gives (NUMERIC and times as text, jsonb as its text); a record of an
older topic that carries Connect's schema is typed from it as before: NUMERIC as an exact Decimal,
timestamptz as an aware datetime, jsonb as parsed JSON.

Unchanged TOASTed columns arrive as Debezium's placeholder; they are removed from `after` and named
in `unavailable`, so the placeholder never reaches a view.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal, InvalidOperation
from typing import Any, Literal

from spark_jobs.changes import envelope
from spark_jobs.changes.envelope import UNAVAILABLE
from spark_jobs.model.errors import ChangeError

Op = Literal["r", "c", "u", "d", "t"]
OPS: frozenset[str] = frozenset(envelope.OPS)

Row = dict[str, Any]


@dataclass(frozen=True)
class ColumnType:
    """A column's PostgreSQL type as Debezium propagates it (`column.propagate.source.type`).

    `name` is upper-case (NUMERIC, TEXT, INT8, TIMESTAMPTZ, JSONB, _TEXT for text[], or the
    enum's own type name); `length`/`scale` are the declared precision and scale where relevant.
    """

    name: str
    length: int | None = None
    scale: int | None = None

    @property
    def is_array(self) -> bool:
        return self.name.startswith("_")


class DecodeError(ChangeError):
    """A record is not a Debezium change event we can read; the message is the dead-letter reason."""


@dataclass(frozen=True)
class Change:
    """One change to one row (or, for op 't', to a whole table), in commit order by `sequence`.

    `sequence` is Debezium's source.sequence: (end LSN of the previous commit,
    LSN of this change). The first element grows with commit order, so the pair
    orders every change to a row even when its transaction began long before it
    committed. Initial-snapshot records have no commit and get first element 0;
    the first transaction streamed after them has no previous commit and gets its
    own LSN (see `_sequence`).
    """

    table: str
    op: Op
    key: Row
    before: Row | None
    after: Row | None
    sequence: tuple[int, int]
    lsn: int | None
    tx_id: int | None
    commit_ts_ms: int | None
    snapshot: str | None
    unavailable: frozenset[str] = field(default_factory=frozenset)
    # Columns of `after` filled from an older change of the same row (`spark_jobs/changes/newest.py`), with the
    # version of the change each value came from: a sink holding that version or newer keeps its own.
    filled: dict[str, tuple[int, int]] = field(default_factory=dict)
    # Source types of the after (or before) image's columns, for sinks that need explicit types.
    columns: dict[str, ColumnType] = field(default_factory=dict)
    # Where the record was read: (topic, partition, offset), for dead letters.
    origin: tuple[str, int, int] | None = None

    @property
    def is_delete(self) -> bool:
        return self.op == "d"


def _zoned_timestamp(value: str) -> datetime:
    return datetime.fromisoformat(value)


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_EPOCH_DATE = date(1970, 1, 1)

# Logical types Debezium names in the field schema.
_BY_NAME: dict[str, Callable[[Any], Any]] = {
    "io.debezium.time.ZonedTimestamp": _zoned_timestamp,
    "io.debezium.time.Timestamp": lambda ms: (_EPOCH + timedelta(milliseconds=ms)).replace(tzinfo=None),
    "io.debezium.time.MicroTimestamp": lambda us: (_EPOCH + timedelta(microseconds=us)).replace(tzinfo=None),
    "io.debezium.time.NanoTimestamp": lambda ns: (_EPOCH + timedelta(microseconds=ns // 1000)).replace(tzinfo=None),
    "io.debezium.time.Date": lambda days: _EPOCH_DATE + timedelta(days=days),
    "io.debezium.data.Json": json.loads,
}
# PostgreSQL types (from column.propagate.source.type) whose Connect type is too coarse.
_BY_SOURCE_TYPE: dict[str, Callable[[Any], Any]] = {
    "NUMERIC": Decimal,
    "DECIMAL": Decimal,
    "MONEY": Decimal,
}


def _converter(schema: dict[str, Any]) -> Callable[[Any], Any]:
    if schema.get("type") == "array":
        element = _converter(schema.get("items", {}))
        return lambda values: [None if v is None else element(v) for v in values]
    if schema.get("type") == "bytes" and "name" not in schema:
        return base64.b64decode
    if (name := schema.get("name")) in _BY_NAME:
        return _BY_NAME[name]
    source_type = (schema.get("parameters") or {}).get("__debezium.source.column.type", "")
    return _BY_SOURCE_TYPE.get(source_type.upper(), lambda value: value)


def _is_placeholder(value: Any) -> bool:
    # Text and json columns carry the placeholder itself, array columns a one-element list of it,
    # bytea columns its base64 (envelope.UNAVAILABLE_FORMS).
    return value in envelope.UNAVAILABLE_FORMS or (isinstance(value, list) and value == [UNAVAILABLE])


def _row(payload: Row | None, schema: dict[str, Any] | None) -> tuple[Row | None, frozenset[str]]:
    """Typed row and the names of columns that arrived as the unchanged-TOAST placeholder."""
    if payload is None:
        return None, frozenset()
    fields = {f["field"]: f for f in (schema or {}).get("fields", [])}
    row: Row = {}
    unavailable = set()
    for column, value in payload.items():
        if _is_placeholder(value):
            unavailable.add(column)
        elif value is None:
            row[column] = None
        else:
            try:
                row[column] = _converter(fields.get(column, {}))(value)
            # OverflowError: a date or time past Python's range (year 1-9999), e.g. an infinity.
            except (ValueError, TypeError, InvalidOperation, OverflowError) as exc:
                raise DecodeError(f"column {column}: cannot convert {str(value)[:80]!r}: {exc}") from exc
    return row, frozenset(unavailable)


def _column_types(schema: dict[str, Any] | None) -> dict[str, ColumnType]:
    types = {}
    for item in (schema or {}).get("fields", []):
        params = item.get("parameters") or {}
        if "__debezium.source.column.type" in params:
            length, scale = params.get("__debezium.source.column.length"), params.get("__debezium.source.column.scale")
            types[item["field"]] = ColumnType(
                name=params["__debezium.source.column.type"].upper(),
                length=int(length) if length is not None else None,
                scale=int(scale) if scale is not None else None,
            )
    return types


def _field_schema(envelope_schema: dict[str, Any] | None, name: str) -> dict[str, Any] | None:
    for item in (envelope_schema or {}).get("fields", []):
        if item.get("field") == name:
            return item
    return None


def _sequence(source: Row) -> tuple[int, int]:
    try:
        return envelope.version(source.get("sequence"), source.get("lsn"), source.get("snapshot"))
    except (ValueError, TypeError) as exc:
        raise DecodeError(f"source.sequence is not a two-element list: {source.get('sequence')!r}") from exc


def _json(data: bytes, what: str) -> Any:
    try:
        return json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise DecodeError(f"{what} is not JSON: {exc}") from exc


def _layout(document: Any) -> tuple[Any, Any]:
    """(payload, schema) of a record written with Connect's schema, else (the document, None)."""
    if isinstance(document, dict) and set(document) == {"schema", "payload"}:
        return document["payload"], document["schema"]
    return document, None


def decode_key(key: bytes | None) -> Row:
    if key is None:
        return {}
    payload, _ = _layout(_json(key, "key"))
    if not isinstance(payload, dict):
        raise DecodeError("key is not a JSON object")
    return payload


def decode(
    topic: str, key: bytes | None, value: bytes | None, partition: int = -1, offset: int = -1
) -> Change | None:
    """Decode one Kafka record of a change topic; None for a tombstone (the delete marker's companion).

    Raises DecodeError (with the reason for the dead-letter record) for anything
    that is not a readable Debezium change event.
    """
    if value is None:
        return None
    payload, schema = _layout(_json(value, "value"))
    if not isinstance(payload, dict):
        raise DecodeError("value is not a Debezium change event (not a JSON object)")
    op = payload.get("op")
    if op not in OPS:
        raise DecodeError(f"unknown op {op!r}")
    source = payload.get("source")
    if not isinstance(source, dict) or not source.get("table"):
        raise DecodeError("payload has no source.table")
    before_schema, after_schema = _field_schema(schema, "before"), _field_schema(schema, "after")
    before, _ = _row(payload.get("before"), before_schema)
    after, unavailable = _row(payload.get("after"), after_schema)
    if op in ("c", "u", "r") and after is None:
        raise DecodeError(f"op {op} without an after image")
    return Change(
        table=source["table"],
        op=op,
        key=decode_key(key) if op != "t" else {},
        before=before,
        after=after,
        sequence=_sequence(source),
        lsn=source.get("lsn"),
        tx_id=source.get("txId"),
        commit_ts_ms=source.get("ts_ms"),
        snapshot=source.get("snapshot"),
        unavailable=unavailable,
        columns=_column_types(after_schema if after is not None else before_schema),
        origin=(topic, partition, offset),
    )
