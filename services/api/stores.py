"""The three reads the API serves, one per view: search (Elasticsearch), cache (Redis), warehouse (Delta).

Each raises `NotFound` for a name or key the view does not have, `BadInput` (validation) for a
request that can never succeed, and `Unavailable` when the store cannot answer now.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterable
from datetime import date, datetime, time
from decimal import Decimal
from pathlib import Path
from typing import Any

import redis
from deltalake import DeltaTable, QueryBuilder
from deltalake.exceptions import DeltaError, TableNotFoundError
from elasticsearch import ApiError, BadRequestError, Elasticsearch, NotFoundError, TransportError

from services.api import validation
from services.api.validation import BadInput
from spark_jobs.model.config import PipelineConfig
from spark_jobs.sinks.base import COMMIT_TS, KEYS_PROPERTY, META_PREFIX, VERSION_MAJOR, VERSION_MINOR
from spark_jobs.sinks.redis import decode_row, read_types, row_key

MAX_SEARCH_SIZE = 100
MAX_WAREHOUSE_LIMIT = 1000


class NotFound(LookupError):
    """Unknown index, table or key (404)."""


class Unavailable(RuntimeError):
    """The store does not answer or refused for a reason that is not the request's (503)."""


def to_json(value: Any) -> Any:
    """A stored value as JSON, exact: NUMERIC as its decimal text (as the other views keep it)."""
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, (datetime, date, time)):
        return value.isoformat()
    if isinstance(value, (bytes, bytearray)):
        return base64.b64encode(value).decode()
    if isinstance(value, (list, tuple)):
        return [to_json(item) for item in value]
    if isinstance(value, dict):
        return {str(key): to_json(item) for key, item in value.items()}
    return value


# ---- search -----------------------------------------------------------------------------------


class Search:
    def __init__(self, es: Elasticsearch, pipeline: PipelineConfig) -> None:
        self.es = es
        # alias -> the view's full-text columns; a nested view's query runs over all its fields
        self.views = {
            (config.search.index or table): list(config.search.text)
            for table, config in pipeline.tables.items() if config.search is not None
        } | {name: [] for name in pipeline.nested}

    def _fields(self, alias: str) -> dict[str, str]:
        """The index's mapped top-level fields and their types (the sink maps columns as they arrive)."""
        try:
            mappings = self.es.indices.get_mapping(index=alias)
        except NotFoundError:
            raise Unavailable(f"search view {alias} has no index yet: start the apply jobs (tide jobs start)") from None
        except (ApiError, TransportError) as exc:
            raise Unavailable(f"Elasticsearch cannot answer: {_short(exc)}") from None
        fields: dict[str, str] = {}
        for index in mappings.values():
            for name, mapping in index["mappings"].get("properties", {}).items():
                fields[name] = mapping.get("type", "object")
        return fields

    def search(self, alias: str, q: str | None, filter_params: Iterable[tuple[str, str]], page: int,
               size: int) -> dict[str, Any]:
        if alias not in self.views:
            known = ", ".join(sorted(self.views)) or "none"
            raise NotFound(f"no search view named {alias!r}; search views: {known}")
        start = validation.page_window(page, size)
        fields = self._fields(alias)
        filters = validation.search_filters(filter_params, fields)
        query = validation.search_query(q, self.views[alias], filters, fields)
        try:
            found = self.es.search(index=alias, query=query, from_=start, size=size, track_total_hits=True)
        except BadRequestError as exc:  # e.g. a date filter Elasticsearch cannot parse
            raise BadInput(f"Elasticsearch refused the search: {_short(exc)}") from None
        except NotFoundError:
            raise Unavailable(f"search view {alias} has no index yet: start the apply jobs (tide jobs start)") from None
        except (ApiError, TransportError) as exc:
            raise Unavailable(f"Elasticsearch cannot answer: {_short(exc)}") from None
        hits = found["hits"]
        return {
            "index": alias,
            "query": q or None,
            "filters": filters,
            "page": page,
            "size": size,
            "total": hits["total"]["value"],
            "hits": [{"id": hit["_id"], "score": hit.get("_score"), "source": hit.get("_source", {})}
                     for hit in hits["hits"]],
        }


def _short(exc: Exception) -> str:
    """One line of an Elasticsearch error: its type and reason, not the whole response body."""
    if isinstance(exc, ApiError):
        info = exc.info if isinstance(exc.info, dict) else {}
        error = info.get("error", {})
        if isinstance(error, dict):
            root = (error.get("root_cause") or [error])[0]
            reason = root.get("reason") or error.get("reason")
            if reason:
                return f"{root.get('type', 'error')}: {str(reason)[:300]}"
        return f"status {exc.meta.status}"
    return type(exc).__name__


# ---- cache ------------------------------------------------------------------------------------


class Cache:
    def __init__(self, client: redis.Redis, pipeline: PipelineConfig) -> None:
        self.client = client
        self.tables = sorted(table for table, config in pipeline.tables.items() if config.cache is not None)

    def get(self, table: str, key: str) -> dict[str, Any]:
        if table not in self.tables:
            raise NotFound(f"no cache view for table {table!r}; cached tables: {', '.join(self.tables) or 'none'}")
        row_id = validation.cache_id(key)
        try:
            fields = self.client.hgetall(row_key(table, row_id))
            types = read_types(self.client, table) if fields else {}
        except redis.ResponseError:  # the key holds something that is not a row hash
            fields = {}
        except redis.RedisError as exc:
            raise Unavailable(f"Redis cannot answer: {exc}") from None
        if not fields:
            raise NotFound(f"no row {row_id!r} in the {table} cache")
        decoded = decode_row(fields, types)  # stored as text, typed again by the table's column types
        return {
            "table": table,
            "key": row_id,
            "version": {"major": int(decoded.get(VERSION_MAJOR, 0)), "minor": int(decoded.get(VERSION_MINOR, 0))},
            "commit_ts": decoded.get(COMMIT_TS),
            "row": {name: value for name, value in decoded.items() if not name.startswith(META_PREFIX)},
        }


# ---- warehouse --------------------------------------------------------------------------------

# Types DataFusion orders reliably; the row is ordered by these columns in table order, so pages
# are stable while the table does not change (the primary key is among them in practice).
_SORTABLE = re.compile(r"^(long|integer|short|byte|string|boolean|date|timestamp|timestamp_ntz|decimal\(\d+,\d+\))$")


def quoted(name: str) -> str:
    """A column name as a SQL identifier for DataFusion (which folds unquoted names to lower case)."""
    return '"' + name.replace('"', '""') + '"'


class Warehouse:
    def __init__(self, warehouse_dir: Path, pipeline: PipelineConfig) -> None:
        self.warehouse_dir = warehouse_dir
        # Current-state tables, history tables and window tables (with their late tables) alike.
        self.tables = pipeline.warehouse_tables()

    def rows(self, table: str, limit: int, offset: int) -> dict[str, Any]:
        if table not in self.tables:
            raise NotFound(
                f"no warehouse view for table {table!r}; warehouse tables: {', '.join(self.tables) or 'none'}"
            )
        path = self.warehouse_dir / table
        empty = {"table": table, "limit": limit, "offset": offset, "total": 0, "rows": []}
        if not path.exists():
            return empty  # configured, but no batch has written it yet
        try:
            delta = DeltaTable(str(path))
        except TableNotFoundError:
            return empty
        except DeltaError as exc:
            raise Unavailable(f"cannot open the {table} warehouse table: {exc}") from None
        try:
            order = _row_order(delta)
            order_by = f" ORDER BY {', '.join(quoted(name) for name in order)}" if order else ""
            # Only integers validated by the route and names from the table's own schema reach this text.
            sql = f"SELECT * FROM t{order_by} LIMIT {int(limit)} OFFSET {int(offset)}"
            page = QueryBuilder().register("t", delta).execute(sql).read_all()
            count = QueryBuilder().register("t", delta).execute("SELECT count(*) AS n FROM t").read_all()
        except Exception as exc:  # noqa: BLE001 - DataFusion raises plain Exceptions, deltalake DeltaError/OSError
            raise Unavailable(f"cannot read the {table} warehouse table: {str(exc)[:300]}") from None
        columns = {name: page.column(name).to_pylist() for name in page.column_names}
        rows = [{name: to_json(values[i]) for name, values in columns.items()} for i in range(page.num_rows)]
        return {**empty, "total": count.column("n").to_pylist()[0], "rows": rows}


def _row_order(delta: DeltaTable) -> list[str]:
    """The scalar columns in table order; a history table's versions of one row in version order
    (its key, kept in a table property, then the version, then the rest)."""
    sortable = [f.name for f in delta.schema().fields
                if not f.name.startswith(META_PREFIX) and _SORTABLE.fullmatch(_type_name(f.type))]
    keys = [k for k in delta.metadata().configuration.get(KEYS_PROPERTY, "").split(",") if k]
    if not keys:
        return sortable
    return [*keys, VERSION_MAJOR, VERSION_MINOR, *(name for name in sortable if name not in keys)]


def _type_name(data_type: Any) -> str:
    return str(getattr(data_type, "type", "")).lower()
