"""Index mappings from the source's catalogue: each column mapped explicitly by its PostgreSQL type.

The driver keeps every search index's mapping equal to its table's columns before each batch: a
column added at the source (`ALTER TABLE ADD COLUMN`) is mapped before any record carries it. A column
Elasticsearch refuses to map (its type changed incompatibly) is reported, and the rows that carry a
value there are rejected to the dead-letter topic with the reason.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from elasticsearch import BadRequestError, Elasticsearch

from spark_jobs.model.catalogue import Column
from spark_jobs.sinks.base import COMMIT_TS, META_PREFIX, VERSION_MAJOR, VERSION_MINOR

# A keyword term may not exceed 32766 bytes; 8191 characters of up to 4 bytes each always fit.
KEYWORD_IGNORE_ABOVE = 8191
# The exact-match sub-field of a full-text column, as Elasticsearch's own dynamic default.
SUBFIELD_IGNORE_ABOVE = 256

_LONGS = {"INT2", "INT4", "INT8", "OID"}
_DOUBLES = {"NUMERIC", "DECIMAL", "MONEY", "FLOAT4", "FLOAT8"}
_DATES = {"TIMESTAMPTZ", "TIMESTAMP", "DATE"}
_OBJECTS = {"JSONB", "JSON"}

META_PROPERTIES = {VERSION_MAJOR: {"type": "long"}, VERSION_MINOR: {"type": "long"}, COMMIT_TS: {"type": "date"}}
# Side documents (tombstones, watermarks): the alias (and row id) they belong to and a version; a
# tombstone of a row that moved to another key keeps the row's image, unindexed.
SIDE_MAPPING: dict[str, Any] = {
    "dynamic": "strict",
    "properties": {"alias": {"type": "keyword"}, "id": {"type": "keyword"},
                   "image": {"type": "object", "enabled": False}, **META_PROPERTIES},
}


def string_mapping(full_text: bool) -> dict[str, Any]:
    if full_text:
        return {"type": "text", "fields": {"keyword": {"type": "keyword", "ignore_above": SUBFIELD_IGNORE_ABOVE}}}
    return {"type": "keyword", "ignore_above": KEYWORD_IGNORE_ABOVE}


def field_mapping(column: Column, full_text: bool = False) -> dict[str, Any]:
    """The mapping of one column from its PostgreSQL type; an array maps as its element type."""
    name = column.element.type
    if name in _LONGS:
        return {"type": "long"}
    if name in _DOUBLES:
        # NUMERIC is stored exact as a string in _source; Elasticsearch coerces it to double to search.
        return {"type": "double"}
    if name == "BOOL":
        return {"type": "boolean"}
    if name in _DATES:
        return {"type": "date"}
    if name in _OBJECTS:
        return {"type": "object", "dynamic": True}
    if name == "BYTEA":
        return {"type": "binary"}
    return string_mapping(full_text)  # TEXT, VARCHAR, BPCHAR, UUID, enums, anything else


def properties(columns: Iterable[Column], full_text: Iterable[str] = ()) -> dict[str, dict[str, Any]]:
    text = set(full_text)
    return {column.name: field_mapping(column, column.name in text) for column in columns}


def restyled(mappings: dict[str, Any], full_text: Iterable[str]) -> dict[str, Any]:
    """A copy of an index's mappings whose string columns follow `full_text` (a rebuild picks up
    a changed `search.text`; an existing index cannot change a field's type)."""
    text = set(full_text)
    props = {
        name: string_mapping(name in text)
        if mapping.get("type") in ("text", "keyword") and not name.startswith(META_PREFIX) else mapping
        for name, mapping in mappings.get("properties", {}).items()
    }
    return {**mappings, "properties": props}


def mapped_fields(es: Elasticsearch, index: str) -> set[str]:
    return {name for m in es.indices.get_mapping(index=index).values() for name in m["mappings"].get("properties", {})}


def put_mappings(es: Elasticsearch, target: str, new: dict[str, dict[str, Any]]) -> dict[str, str]:
    """Add `new` fields to the mapping; the reasons of those Elasticsearch refuses, by column. Tries
    all at once, then one by one so one conflicting column does not block the others."""
    if not new:
        return {}
    try:
        es.indices.put_mapping(index=target, properties=new)
        return {}
    except BadRequestError:
        pass
    refused = {}
    for column, mapping in new.items():
        try:
            es.indices.put_mapping(index=target, properties={column: mapping})
        except BadRequestError as exc:
            refused[column] = f"elasticsearch mapping conflict on {column}: {exc.message}"
    return refused
