"""The source's column types, from PostgreSQL's own catalogue: what every typed view is built from.

Change records carry no schema (Connect's JSON converter runs with `schemas.enable=false`, which
makes them several times smaller: docs/apply.md), so a column's type comes from here: the apply
jobs read the catalogue of the captured tables at the start of every micro-batch (one query on a
connection they keep), after the batch's records were committed, so a column added by
`ALTER TABLE ... ADD COLUMN` is known before any record that carries it is applied. If PostgreSQL
cannot be reached, the last catalogue read is used (kept in memory and in a file beside the
checkpoints), so a rebuild from the topics never needs the database to be up.

Type names follow Debezium's `column.propagate.source.type`: PostgreSQL's `typname` upper-cased
(INT8, NUMERIC, TIMESTAMPTZ, _TEXT for text[], an enum's own name).
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from spark_jobs.model.errors import TidelineError
from spark_jobs.model.files import replace_text

if TYPE_CHECKING:
    import psycopg

log = logging.getLogger("tideline.catalogue")

# How aggregates and windows see a column: decimal is numeric(p,s); number any other numeric type;
# time a date or timestamp.
ColumnKind = Literal["integer", "decimal", "number", "enum", "time", "other"]
# How Debezium writes a value in schemaless JSON with the connector's settings (connectors/):
# raw = a JSON number, boolean or array; text = a JSON string (NUMERIC with decimal.handling.mode=string,
# times with time.precision.mode=isostring, bytea as base64, json/jsonb as their text).
JsonKind = Literal["raw", "text"]

_INTEGERS = frozenset({"INT2", "INT4", "INT8", "OID"})
_FLOATS = frozenset({"FLOAT4", "FLOAT8"})
_JSON_TYPES = frozenset({"JSON", "JSONB"})
# The kind of a column that is neither an integer, a decimal nor an enum, by PostgreSQL's typcategory.
_KIND_OF_CATEGORY: dict[str, ColumnKind] = {"N": "number", "D": "time"}


@dataclass(frozen=True)
class Column:
    """One column as the catalogue has it. `precision` is numeric's precision or a character length;
    `scale` numeric's scale; `values` an enum's labels; `category` PostgreSQL's typcategory."""

    name: str
    type: str
    precision: int | None = None
    scale: int | None = None
    values: tuple[str, ...] = ()
    category: str = "U"

    @property
    def is_array(self) -> bool:
        return self.type.startswith("_")

    @property
    def element(self) -> Column:
        """The element column of an array (itself otherwise)."""
        if not self.is_array:
            return self
        return Column(self.name, self.type[1:], self.precision, self.scale, self.values, self.category)

    @property
    def kind(self) -> ColumnKind:
        if self.type in ("INT2", "INT4", "INT8"):
            return "integer"
        if self.type == "NUMERIC" and self.scale is not None:
            return "decimal"
        if self.values:
            return "enum"
        return _KIND_OF_CATEGORY.get(self.category, "other")

    @property
    def json_kind(self) -> JsonKind:
        """Whether the record's value is raw JSON (a number, boolean, array or a JSON column's text)."""
        if self.is_array or self.type in _INTEGERS or self.type in _FLOATS or self.type == "BOOL":
            return "raw"
        return "raw" if self.type in _JSON_TYPES else "text"

    @property
    def is_json(self) -> bool:
        return self.element.type in _JSON_TYPES


@dataclass(frozen=True)
class TableSchema:
    """A table's columns in the table's order, and its primary key in key order."""

    columns: dict[str, Column]
    primary_key: tuple[str, ...] = ()


Catalogue = dict[str, TableSchema]

# Each column of the schema's ordinary and partitioned tables: type name, modifiers, category, enum
# labels, and its place in the primary key (NULL when not in it).
_QUERY = """
SELECT c.relname, a.attname, upper(t.typname), a.atttypmod, t.typcategory,
       coalesce(et.typcategory, ''),
       ARRAY(SELECT e.enumlabel FROM pg_enum e WHERE e.enumtypid = coalesce(et.oid, t.oid) ORDER BY e.enumsortorder),
       array_position(i.indkey::int2[], a.attnum)
FROM pg_class c
JOIN pg_namespace n ON n.oid = c.relnamespace
JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
JOIN pg_type t ON t.oid = a.atttypid
LEFT JOIN pg_type et ON et.oid = t.typelem AND t.typcategory = 'A'
LEFT JOIN pg_index i ON i.indrelid = c.oid AND i.indisprimary
WHERE n.nspname = %s AND c.relkind IN ('r', 'p') AND (cardinality(%s::text[]) = 0 OR c.relname = ANY(%s))
ORDER BY c.relname, a.attnum
"""


def column_of(name: str, type_name: str, typmod: int, category: str, element_category: str,
              labels: list[str]) -> Column:
    """A Column from a catalogue row: numeric's typmod packs precision and scale; varchar's the length."""
    base = type_name.lstrip("_")
    precision = scale = None
    if base == "NUMERIC" and typmod >= 4:
        precision, scale = ((typmod - 4) >> 16) & 65535, (typmod - 4) & 65535
    elif base in ("VARCHAR", "BPCHAR") and typmod >= 4:
        precision = typmod - 4
    kind = element_category if type_name.startswith("_") and element_category else category
    return Column(name, type_name, precision, scale, tuple(labels), kind)


def read(conn: psycopg.Connection[Any], schema: str, tables: list[str] | None = None) -> Catalogue:
    """The catalogue of `schema`'s tables (all of them, or those named) on a psycopg connection."""
    wanted = list(tables or [])
    columns: dict[str, dict[str, Column]] = {}
    keys: dict[str, list[tuple[int, str]]] = {}
    for table, name, type_name, typmod, category, element_category, labels, position in conn.execute(
        _QUERY, (schema, wanted, wanted)
    ):
        columns.setdefault(table, {})[name] = column_of(name, type_name, typmod, category, element_category,
                                                        labels)
        if position is not None:
            keys.setdefault(table, []).append((position, name))
    return {t: TableSchema(found, tuple(c for _, c in sorted(keys.get(t, [])))) for t, found in columns.items()}


def to_json(catalogue: Catalogue) -> str:
    return json.dumps({t: {"columns": [asdict(c) for c in s.columns.values()], "primary_key": list(s.primary_key)}
                       for t, s in catalogue.items()})


def from_json(text: str) -> Catalogue:
    raw = json.loads(text)
    return {
        table: TableSchema(
            {c["name"]: Column(**{**c, "values": tuple(c["values"])}) for c in schema["columns"]},
            tuple(schema["primary_key"]),
        )
        for table, schema in raw.items()
    }


@dataclass
class LiveCatalogue:
    """The catalogue as of now, for the driver: re-read on every `current()` over one kept connection;
    when PostgreSQL cannot be reached, the last one read (in memory, else from `cache_file`)."""

    conninfo: str
    schema: str
    tables: list[str]
    cache_file: Path | None = None
    _conn: psycopg.Connection[Any] | None = field(default=None, repr=False)
    _last: Catalogue | None = field(default=None, repr=False)

    def current(self) -> Catalogue:
        try:
            found = self._read()
        except Exception as exc:  # any failure to read: use what is known, say so (logged or raised below)
            known = self._last if self._last is not None else self._cached()
            if known is None:
                raise CatalogueError(f"cannot read PostgreSQL's catalogue ({exc}) and none was read before: "
                                     "start PostgreSQL or check TIDE_JOB_POSTGRES_CONNINFO") from exc
            log.warning("cannot read PostgreSQL's catalogue (%s); using the last one read", exc)
            self._close()
            return known
        if found != self._last:
            self._remember(found)
        self._last = found
        return found

    def _read(self) -> Catalogue:
        import psycopg

        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(self.conninfo, autocommit=True, connect_timeout=5)
        return read(self._conn, self.schema, self.tables)

    def _close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            finally:
                self._conn = None

    def _cached(self) -> Catalogue | None:
        try:
            return from_json(self.cache_file.read_text()) if self.cache_file else None
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def _remember(self, catalogue: Catalogue) -> None:
        if self.cache_file is None:
            return
        replace_text(self.cache_file, to_json(catalogue))


class CatalogueError(TidelineError):
    """No catalogue can be had: PostgreSQL is unreachable and none was read before."""
