"""Small Spark frames for unit tests of the apply jobs' DataFrame functions (a local session, no jars)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from spark_jobs.changes import envelope
from spark_jobs.changes.schema import CHANGE

COMMITTED = datetime(2024, 1, 1, tzinfo=UTC)


def change(version: tuple[int, int], op: str = "u", table: str = "products", key: Any = 1,
           after: dict[str, str | None] | None = None, unavailable: tuple[str, ...] = (),
           offset: int = 0, error: str | None = None, old_row_id: str | None = None, moved: bool = False,
           committed: datetime = COMMITTED, filled: dict[str, tuple[int, int]] | None = None) -> dict[str, Any]:
    """A CHANGE row as a dict; `after` defaults to a full image naming the version."""
    keys = key if isinstance(key, dict) else {"id": str(key)}
    if after is None and op not in ("d", "t"):
        after = {**keys, "name": f"v{version}", "description": f"text {version}"}
    row_id = None if op == "t" else envelope.row_id([_json_value(v) for v in keys.values()])
    return {
        "table": table, "op": op, "row_id": row_id, "key": None if op == "t" else keys, "after": after,
        "unavailable": list(unavailable),
        "filled": {column: {"major": v[0], "minor": v[1]} for column, v in (filled or {}).items()},
        "version": {"major": version[0], "minor": version[1]},
        "commit_ts": committed, "moved": moved, "old_row_id": old_row_id,
        "origin": {"topic": f"t.public.{table}", "partition": 0, "offset": offset},
        "error": error, "letter_value": None,
    }


def frame(spark: Any, rows: list[dict[str, Any]]) -> Any:
    return spark.createDataFrame(rows, CHANGE)


def _json_value(text: str) -> Any:
    """A key column's text as the JSON value the key record carries (digits are numbers)."""
    return int(text) if text.lstrip("-").isdigit() else text
