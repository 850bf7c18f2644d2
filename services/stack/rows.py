"""The one row (or value) of a query that always returns one, typed: psycopg's `fetchone()` may be None."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.abc import Params, QueryNoTemplate


def one_row(conn: psycopg.Connection, query: QueryNoTemplate, params: Params | None = None) -> tuple[Any, ...]:
    """The row of a query that always returns one (an aggregate, SHOW, a single INSERT ... RETURNING)."""
    row = conn.execute(query, params).fetchone()
    if row is None:
        raise psycopg.ProgrammingError(f"no row from a query that returns one: {query!r}")
    return row


def scalar(conn: psycopg.Connection, query: QueryNoTemplate, params: Params | None = None) -> Any:
    """The first value of `one_row`."""
    return one_row(conn, query, params)[0]
