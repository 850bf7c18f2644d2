"""Pure checks of what users send the query API: filter names and values, cache keys, paging.

Everything here raises `BadInput` with a message a user can act on; the app turns it into a 422.
Nothing a user sends is ever pasted into a query string: search filters become structured `term`
clauses, cache keys become one exact Redis key, and the warehouse takes only validated integers.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Iterable, Mapping
from typing import Any

from spark_jobs.changes.envelope import row_id

FIELD = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")  # a pipeline.yaml identifier (a column name)
MAX_QUERY_CHARS = 500
MAX_FILTER_VALUE_CHARS = 256
MAX_FILTERS = 20
MAX_FILTER_VALUES = 100  # values of one repeated filter field
MAX_KEY_CHARS = 4096
HASHED_KEY = re.compile(r"^sha256:[0-9a-f]{64}$")
MAX_RESULT_WINDOW = 10_000  # Elasticsearch's index.max_result_window: from + size may not exceed it
RESERVED_PARAMS = frozenset({"q", "page", "size"})


class BadInput(ValueError):
    """A request that can never succeed as sent; the message says what to change."""


def _no_control_characters(text: str, what: str) -> None:
    if any(unicodedata.category(char) in ("Cc", "Cs") for char in text):
        raise BadInput(f"{what} contains control characters")


def search_filters(params: Iterable[tuple[str, str]], fields: Mapping[str, str]) -> dict[str, list[str]]:
    """`field=value` query parameters (all but q/page/size) as {field: [values]}.

    `fields` maps the index's mapped fields to their Elasticsearch types; a field it does not
    map is refused (a term on it could only ever match nothing). Repeating a field means any of
    its values (OR); different fields must all match (AND).
    """
    filters: dict[str, list[str]] = {}
    for name, value in params:
        if name in RESERVED_PARAMS:
            continue
        if not FIELD.fullmatch(name):
            raise BadInput(f"filter {name[:80]!r} is not a field name (lower-case letters, digits, _)")
        if name not in fields:
            known = ", ".join(sorted(fields)) or "none yet"
            raise BadInput(f"filter {name!r} is not a field of this index; fields: {known}")
        if len(value) > MAX_FILTER_VALUE_CHARS:
            raise BadInput(f"filter {name} value is longer than {MAX_FILTER_VALUE_CHARS} characters")
        _no_control_characters(value, f"filter {name} value")
        kind = fields[name]
        if kind in ("long", "integer", "short", "byte"):
            if not re.fullmatch(r"-?\d{1,19}", value):
                raise BadInput(f"filter {name} is a whole number field; {value[:80]!r} is not a whole number")
        elif kind in ("double", "float", "half_float", "scaled_float"):
            try:
                float(value)
            except ValueError:
                raise BadInput(f"filter {name} is a number field; {value[:80]!r} is not a number") from None
        elif kind == "boolean" and value not in ("true", "false"):
            raise BadInput(f"filter {name} is true or false, not {value[:80]!r}")
        elif kind in ("object", "nested", "binary"):
            raise BadInput(f"filter {name} is a {kind} field and cannot be filtered on")
        filters.setdefault(name, []).append(value)
        if len(filters[name]) > MAX_FILTER_VALUES:
            raise BadInput(f"at most {MAX_FILTER_VALUES} values for filter {name}")
    if len(filters) > MAX_FILTERS:
        raise BadInput(f"at most {MAX_FILTERS} filter fields per search")
    return filters


def filter_field(name: str, kind: str) -> str:
    """The field a `term` filter targets: a full-text column's exact-match `.keyword` sub-field."""
    return f"{name}.keyword" if kind == "text" else name


def search_query(text: str | None, text_fields: list[str], filters: Mapping[str, list[str]],
                 fields: Mapping[str, str]) -> dict[str, Any]:
    """The Elasticsearch query: `simple_query_string` (which never fails on syntax and treats
    operators as text when they do not parse) over the view's text fields, AND term filters."""
    clauses: dict[str, Any] = {}
    if text and text.strip():
        if len(text) > MAX_QUERY_CHARS:
            raise BadInput(f"q is longer than {MAX_QUERY_CHARS} characters")
        _no_control_characters(text, "q")
        match: dict[str, Any] = {"query": text, "default_operator": "and", "lenient": True}
        if text_fields:
            match["fields"] = list(text_fields)
        clauses["must"] = [{"simple_query_string": match}]
    if filters:
        clauses["filter"] = [
            {"terms": {filter_field(name, fields[name]): values}} if len(values) > 1
            else {"term": {filter_field(name, fields[name]): values[0]}}
            for name, values in filters.items()
        ]
    return {"bool": clauses} if clauses else {"match_all": {}}


def page_window(page: int, size: int) -> int:
    """The `from` of a page; refuses pages past what Elasticsearch serves with from/size."""
    start = (page - 1) * size
    if start + size > MAX_RESULT_WINDOW:
        raise BadInput(f"page * size may not exceed {MAX_RESULT_WINDOW}; narrow the search with q or filters")
    return start


def cache_id(key: str) -> str:
    """A row's id in the cache (`spark_jobs.changes.envelope.row_id`) from what a user typed.

    - `42` or `ada@example.com`: a one-column key, as is;
    - `[7,2]` (any JSON spacing): a composite key, values in primary-key order;
    - a key longer than 512 bytes is hashed the way the sink hashed it; `sha256:<hex>` is taken as is.
    """
    if not key:
        raise BadInput("the key is empty")
    if len(key) > MAX_KEY_CHARS:
        raise BadInput(f"the key is longer than {MAX_KEY_CHARS} characters")
    _no_control_characters(key, "the key")
    if key.startswith("sha256:"):
        if not HASHED_KEY.fullmatch(key):
            raise BadInput("a hashed key is sha256: followed by 64 lower-case hex digits")
        return key
    if key.startswith("["):
        try:
            values = json.loads(key)
        except ValueError:
            raise BadInput("a composite key is a JSON list of its values, e.g. [7,2]") from None
        if not isinstance(values, list) or len(values) < 2:
            raise BadInput("a composite key lists two or more values, e.g. [7,2]")
        if any(isinstance(value, (list, dict)) for value in values):
            raise BadInput("a composite key's values are numbers or strings, not lists or objects")
        return row_id(list(values))
    return row_id([key])
