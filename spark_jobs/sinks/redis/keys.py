"""The cache's key names and how its stored text reads back, for the sink, its shipper and every
reader of the cache (verify, the API, the CLI's printed lines)."""

from __future__ import annotations

import json
import re
from typing import Any

import redis


def row_key(table: str, row_id: str, prefix: str = "") -> str:
    return f"{prefix}{table}:{row_id}"


def tombstone_key(table: str, row_id: str, prefix: str = "") -> str:
    return f"{prefix}tideline:tombstone:{table}:{row_id}"


def watermark_key(table: str, prefix: str = "") -> str:
    return f"{prefix}tideline:truncated:{table}"


def columns_key(table: str, prefix: str = "") -> str:
    """A hash of the table's column types (catalogue names), for readers to type the stored text."""
    return f"{prefix}tideline:columns:{table}"


def spec_key(prefix: str = "") -> str:
    return f"{prefix}tideline:aggregates"


def glob_escape(text: str) -> str:
    """`text` as a literal in a SCAN MATCH pattern."""
    return re.sub(r"([*?\[\]\\])", r"\\\1", text)


_INTEGERS = {"INT2", "INT4", "INT8", "OID"}
_FLOATS = {"FLOAT4", "FLOAT8"}


def typed_value(text: str, type_name: str | None) -> Any:
    """A stored text as the JSON value its column's type gives: integers, floats and booleans as such,
    json and arrays parsed; anything else (NUMERIC, times, text, enums) stays text, exactly."""
    if type_name is None:
        return text
    if type_name.startswith("_") or type_name in ("JSON", "JSONB"):
        return json.loads(text)
    if type_name in _INTEGERS:
        return int(text)
    if type_name in _FLOATS:
        number = float(text)
        return number if number == number and abs(number) != float("inf") else text  # JSON has no NaN
    if type_name == "BOOL":
        return text == "true"
    return text


def text_of(reply: bytes | str) -> str:
    """A key or value Redis answered, as text. The sink's clients are made without decode_responses,
    so it is bytes; redis-py types it bytes | str (a client may decode)."""
    return reply.decode() if isinstance(reply, bytes) else reply


def decode_row(fields: dict[bytes | str, bytes | str], types: dict[str, str] | None = None) -> dict[str, Any]:
    """A stored hash (HGETALL) as a row: each column typed by `types` (column -> catalogue type name),
    metadata fields as text; columns `types` names that the hash lacks are NULL."""
    types = types or {}
    texts = {text_of(k): text_of(v) for k, v in fields.items()}
    row: dict[str, Any] = dict.fromkeys(types)
    row |= {name: typed_value(text, types.get(name)) for name, text in texts.items()}
    return row


def read_types(client: redis.Redis, table: str, prefix: str = "") -> dict[str, str]:
    return {text_of(k): text_of(v) for k, v in client.hgetall(columns_key(table, prefix)).items()}
