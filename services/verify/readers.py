"""One streaming reader per store for `tide verify`: rows go by in pages, never all at once.

Each reader yields rows as plain dicts of column values (plus the sink's own doc
id where the store is keyed by one); `canonical.Canonicaliser` does the typing.
Readers only undo their store's transport encoding (Redis's JSON field values,
Delta's JSON text and Spark's timestamps), so that canonicalisation sees the
same kinds of values from every side.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import redis
from deltalake import DeltaTable, QueryBuilder
from deltalake.exceptions import DeltaError, TableNotFoundError
from psycopg import sql
from psycopg.adapt import Loader
from psycopg.rows import dict_row
from psycopg.types.datetime import DateLoader, TimestampLoader, TimestamptzLoader

from services.api.stores import quoted
from services.verify.canonical import Column, TableShape
from spark_jobs.model.errors import TidelineError
from spark_jobs.sinks.redis import glob_escape, row_key

Row = dict[str, Any]
PAGE = 5000  # rows per round trip (cursor fetch, search page)
REDIS_BATCH = 500  # keys per pipelined HGETALL round trip
PIT_KEEP_ALIVE = "5m"  # between two pages, not for the whole scan


class VerifyError(TidelineError):
    """A store cannot be read (unreachable, refused the query, or not what verify expects). The
    message names the store and the problem; nothing was compared for that table and sink."""


# ---- PostgreSQL ---------------------------------------------------------------------------------

_RELATION = """
SELECT c.oid, c.reltuples::bigint FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = %s AND c.relname = %s AND c.relkind IN ('r', 'p')
"""
# Domains resolve to their base type; arrays name their element type. typmod carries NUMERIC's scale.
_COLUMNS = """
SELECT a.attname, t.typname, t.typcategory = 'A' AND t.typelem <> 0, elem.typname,
       CASE WHEN declared.typtype = 'd' THEN declared.typtypmod ELSE a.atttypmod END
FROM pg_attribute a
JOIN pg_type declared ON declared.oid = a.atttypid
JOIN pg_type t ON t.oid = CASE WHEN declared.typtype = 'd' THEN declared.typbasetype ELSE declared.oid END
LEFT JOIN pg_type elem ON elem.oid = t.typelem
WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attnum
"""
_PRIMARY_KEY = """
SELECT a.attname FROM pg_index i
CROSS JOIN LATERAL unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, position)
JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
WHERE i.indrelid = %s AND i.indisprimary
ORDER BY k.position
"""


def numeric_scale(typmod: int) -> int | None:
    """NUMERIC(p, s)'s s from the type modifier (-1 = unconstrained); s may be negative since PG 15."""
    if typmod < 4:
        return None
    return (((typmod - 4) & 0x7FF) ^ 1024) - 1024


def source_shape(
    conn: psycopg.Connection, schema: str, table: str, excluded: Iterable[str] = ()
) -> tuple[TableShape, int]:
    """The table's columns (less those the pipeline keeps out of Kafka) and primary key from the
    catalogue, and its estimated row count."""
    found = conn.execute(_RELATION, (schema, table)).fetchone()
    if found is None:
        raise VerifyError(f"PostgreSQL has no table {schema}.{table}: run `tide db migrate` or fix pipeline.yaml")
    oid, estimate = found
    columns = []
    for name, type_name, is_array, element, typmod in conn.execute(_COLUMNS, (oid,)).fetchall():
        if name in excluded:
            continue
        kind = element if is_array else type_name
        columns.append(Column(name, kind, is_array, numeric_scale(typmod) if kind == "numeric" else None))
    key = tuple(name for (name,) in conn.execute(_PRIMARY_KEY, (oid,)).fetchall())
    conn.commit()
    if not key:
        raise VerifyError(f"{schema}.{table} has no primary key: views are keyed by it")
    return TableShape(schema, table, tuple(columns), key), max(estimate, 0)


def source_rows(conn: psycopg.Connection, shape: TableShape) -> Iterator[Row]:
    """Every row, through a server-side cursor (PAGE rows per fetch), in one read-only snapshot.

    Runs in the connection's transaction, which is committed at the end; the caller must consume it.
    """
    query = sql.SQL("SELECT {} FROM {}.{}").format(
        sql.SQL(", ").join(sql.Identifier(name) for name in shape.column_names),
        sql.Identifier(shape.schema),
        sql.Identifier(shape.table),
    )
    with conn.cursor(name=f"tideline_verify_{shape.table}", row_factory=dict_row) as cursor:
        cursor.itersize = PAGE
        cursor.execute(query)
        yield from cursor
    conn.commit()


def _infinity_aware(loader: type[Loader]) -> type[Loader]:
    """`loader`, but PostgreSQL's `infinity` / `-infinity` load as those words instead of raising
    DataError (Python has no such date): the canonical row then holds a marker no sink's value
    equals, and verify reports the row rather than stopping (no sink can hold it)."""

    class InfinityAware(loader):  # type: ignore[misc, valid-type]
        def load(self, data: Any) -> Any:
            text = bytes(data)
            return text.decode() if text in (b"infinity", b"-infinity") else super().load(data)

    return InfinityAware


_INFINITY_LOADERS = {
    "date": _infinity_aware(DateLoader),
    "timestamp": _infinity_aware(TimestampLoader),
    "timestamptz": _infinity_aware(TimestamptzLoader),
}


def connect_source(conninfo: str) -> psycopg.Connection:
    try:
        conn = psycopg.connect(conninfo)
    except psycopg.OperationalError as exc:
        raise VerifyError(f"cannot reach PostgreSQL: {str(exc).strip().splitlines()[0]}") from exc
    for type_name, loader in _INFINITY_LOADERS.items():
        conn.adapters.register_loader(type_name, loader)
    # One consistent snapshot per table read, and no chance of writing to the source of truth.
    conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
    conn.read_only = True
    return conn


# ---- Elasticsearch ------------------------------------------------------------------------------


def search_rows(url: str, alias: str) -> Iterator[tuple[str, Row]]:
    """(_id, _source) of every document behind `alias`: refreshed, then a point in time paged with
    search_after on `_shard_doc` (no deep from/size, no scroll contexts). A missing alias yields nothing."""
    with httpx.Client(base_url=url, timeout=120) as http:
        # The sink does not force refreshes: without one, rows written in the last second are "missing".
        if _es(http, "POST", f"/{alias}/_refresh", missing_ok=True) is None:
            return
        opened = _es(http, "POST", f"/{alias}/_pit", params={"keep_alive": PIT_KEEP_ALIVE}, missing_ok=True)
        if opened is None:
            return
        pit = opened["id"]
        try:
            yield from _pages(http, pit)
        finally:
            _es(http, "DELETE", "/_pit", json={"id": pit}, missing_ok=True)


def _pages(http: httpx.Client, pit: str) -> Iterator[tuple[str, Row]]:
    after: list[Any] | None = None
    while True:
        body: dict[str, Any] = {
            "size": PAGE,
            "pit": {"id": pit, "keep_alive": PIT_KEEP_ALIVE},
            "sort": ["_shard_doc"],
            "track_total_hits": False,
        }
        if after is not None:
            body["search_after"] = after
        page = _es(http, "POST", "/_search", json=body)
        pit = page.get("pit_id", pit)
        hits = page["hits"]["hits"]
        if not hits:
            return
        for hit in hits:
            yield hit["_id"], hit.get("_source") or {}
        after = hits[-1]["sort"]


def _es(http: httpx.Client, method: str, path: str, missing_ok: bool = False, **kwargs: Any) -> Any:
    try:
        response = http.request(method, path, **kwargs)
    except httpx.HTTPError as exc:
        raise VerifyError(f"cannot reach Elasticsearch at {http.base_url}: {exc}") from exc
    if response.status_code == 404 and missing_ok:
        return None
    if response.is_error:
        raise VerifyError(f"Elasticsearch {method} {path} answered {response.status_code}: {response.text[:300]}")
    return response.json()


# ---- Redis ----------------------------------------------------------------------------------------


def cache_rows(url: str, shape: TableShape, key_prefix: str = "") -> Iterator[tuple[str, Row]]:
    """(doc id, decoded hash) of every `<prefix><table>:<id>` hash: SCAN (which may return a key
    twice; the comparison skips repeats) and HGETALL pipelined REDIS_BATCH keys per round trip."""
    prefix = row_key(shape.table, "", key_prefix)
    try:
        with redis.Redis.from_url(url) as client:
            batch: list[bytes] = []
            for key in client.scan_iter(match=glob_escape(prefix) + "*", count=1000, _type="HASH"):
                batch.append(key)
                if len(batch) >= REDIS_BATCH:
                    yield from _hashes(client, batch, len(prefix), shape)
                    batch = []
            yield from _hashes(client, batch, len(prefix), shape)
    except redis.RedisError as exc:
        raise VerifyError(f"cannot read Redis at {url}: {exc}") from exc


def _hashes(client: redis.Redis, keys: list[bytes], prefix_length: int, shape: TableShape) -> Iterator[tuple[str, Row]]:
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.hgetall(key)
    for key, fields in zip(keys, pipe.execute(), strict=True):
        if fields:  # empty: deleted between SCAN and HGETALL
            yield key.decode("utf-8", "surrogateescape")[prefix_length:], decode_hash(fields, shape)


def decode_hash(fields: dict[bytes, bytes], shape: TableShape) -> Row:
    """A row hash as values the canonicaliser reads: field values are text (docs/sinks/redis.md), a
    column's absent field is NULL. json and array columns are parsed, booleans read; a value that does
    not parse stays as marked raw text, so the row compares different."""
    texts = {name.decode("utf-8", "surrogateescape"): value.decode("utf-8", "surrogateescape")
             for name, value in fields.items()}
    row: Row = {name: texts.get(name) for name in shape.column_names}
    row |= {name: text for name, text in texts.items() if name not in row}
    for column in shape.columns:
        text = texts.get(column.name)
        if text is None:
            continue
        if column.array or column.type in ("json", "jsonb"):
            try:
                row[column.name] = json.loads(text)
            except ValueError:
                row[column.name] = "\x00not json: " + text[:200]
        elif column.type == "bool":
            row[column.name] = {"true": True, "false": False}.get(text, "\x00not a boolean: " + text[:200])
    return row


# ---- Delta Lake ------------------------------------------------------------------------------------


def warehouse_rows(path: Path, shape: TableShape, where: str | None = None) -> Iterator[Row]:
    """Every row of the Delta table at `path` (the current state; or those matching the SQL
    condition `where`), the columns of `shape` it has. No table there yields nothing."""
    stored = warehouse_columns(path)
    wanted = [column for column in shape.columns if column.name in stored]
    if not wanted:
        return
    decoders = {column.name: _decoder(column, stored[column.name]) for column in wanted}
    query = f"SELECT {', '.join(quoted(column.name) for column in wanted)} FROM t"
    for row in warehouse_query(path, query + (f" WHERE {where}" if where else "")):
        yield {name: decode(row[name]) for name, decode in decoders.items()}


def warehouse_columns(path: Path) -> dict[str, str]:
    """{column: Delta type name} of the table at `path`; {} if there is no table."""
    table = _delta_table(path)
    return {field.name: str(field.type).lower() for field in table.schema().fields} if table else {}


def warehouse_query(path: Path, query: str) -> Iterator[Row]:
    """The rows of a SQL query over the Delta table at `path` (named `t`), read with delta-rs: no
    JVM (a Spark session's heap ran out on 200,000 rows), one Arrow record batch at a time,
    deletion vectors applied. No table there yields nothing."""
    table = _delta_table(path)
    if table is None:
        return
    try:
        for batch in QueryBuilder().register("t", table).execute(query):
            columns = [(name, batch.column(name).to_pylist()) for name in batch.column_names]
            for index in range(batch.num_rows):
                yield {name: values[index] for name, values in columns}
    except Exception as exc:  # DataFusion raises plain Exceptions, deltalake DeltaError/OSError
        raise VerifyError(f"cannot read the warehouse table {path}: {str(exc)[:300]}") from exc


def _delta_table(path: Path) -> DeltaTable | None:
    try:
        return DeltaTable(str(path))
    except TableNotFoundError:
        return None
    except DeltaError as exc:
        raise VerifyError(f"cannot open the warehouse table {path}: {exc}") from exc


def _decoder(column: Column, stored_type: str) -> Any:
    if column.type in ("json", "jsonb") and "string" in stored_type:
        return lambda value: _map(value, _parse_json)  # the warehouse keeps jsonb as JSON text
    return lambda value: value


def _map(value: Any, convert: Any) -> Any:
    if value is None:
        return None
    if isinstance(value, list):
        return [_map(item, convert) for item in value]
    return convert(value)


def _parse_json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return "\x00not json: " + text[:200]
