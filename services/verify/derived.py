"""`tide verify` for the derived warehouse views: SCD2 history tables and event-time window tables.

PostgreSQL keeps no history, so verify checks a history table against what it can know:
- its current versions (`is_current`) equal PostgreSQL's rows (compared like any view);
- each (key, version) is stored once (`duplicate`), and each version's valid_to and is_current are
  what `spark_jobs.model.scd2.intervals` derives from the row's versions (`interval`).
That every committed version is there is checked by the end-to-end tests, which record the versions
themselves (tests/e2e/test_derived_views.py).

A window table is checked against PostgreSQL's rows now, aggregated with
`spark_jobs.model.event_windows.aggregate`: for every window, the table's figures plus the deltas recorded
in `<name>_late` must equal the aggregate (docs/sinks/delta.md explains why late deltas are kept apart).
"""

from __future__ import annotations

from decimal import Decimal
from itertools import groupby
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from services.api.stores import quoted
from services.verify import readers
from services.verify.canonical import TableShape, row_doc_id
from services.verify.reconcile import Tally
from spark_jobs.model.config import WindowView, late_table
from spark_jobs.model.event_windows import WindowKey, aggregate
from spark_jobs.model.scd2 import intervals
from spark_jobs.sinks.base import VERSION_MAJOR, VERSION_MINOR
from spark_jobs.sinks.delta.layout import (
    COUNT_DELTA,
    IS_CURRENT,
    ROW_COUNT,
    SIZE,
    SLIDE,
    SOURCE_OP,
    START,
    VALID_FROM,
    VALID_TO,
    VALUE_DELTA,
    VALUE_SUM,
)

Figures = dict[WindowKey, tuple[Any, int]]


def history_structure(path: Path, shape: TableShape, examples: int) -> Tally:
    """Duplicate versions and intervals that do not follow from the versions, per row of the history."""
    tally = Tally(limit=examples)
    columns = [*shape.key, VERSION_MAJOR, VERSION_MINOR, SOURCE_OP, VALID_FROM, VALID_TO, IS_CURRENT]
    order = [*shape.key, VERSION_MAJOR, VERSION_MINOR]
    query = f"SELECT {_names(columns)} FROM t ORDER BY {_names(order)}"
    rows = readers.warehouse_query(path, query)
    for row_id, versions in groupby(rows, key=lambda row: row_doc_id(shape, row)):
        check_history_row(row_id, list(versions), tally)
    return tally


def check_history_row(row_id: str, versions: list[dict], tally: Tally) -> None:
    seen = {(v[VERSION_MAJOR], v[VERSION_MINOR]) for v in versions}
    if len(seen) < len(versions):
        tally.record("duplicate", row_id)
        return
    expected = intervals([((v[VERSION_MAJOR], v[VERSION_MINOR]), v[VALID_FROM], v[SOURCE_OP]) for v in versions])
    if any((v[VALID_TO], v[IS_CURRENT]) != want for v, want in zip(versions, expected, strict=True)):
        tally.record("interval", row_id)


def source_figures(conn: psycopg.Connection, schema: str, view: WindowView) -> Figures:
    """The windows' figures over PostgreSQL's rows now."""
    query = sql.SQL("SELECT {}, {} FROM {}.{}").format(
        sql.Identifier(view.time_column), sql.Identifier(view.value_column),
        sql.Identifier(schema), sql.Identifier(view.table),
    )
    rows = conn.execute(query).fetchall()
    conn.commit()
    return aggregate(rows, view.windows)


def warehouse_figures(warehouse_dir: Path, name: str) -> tuple[Figures, Figures]:
    """(the window table's figures, the sum of recorded late deltas) per window; {} where a table is absent."""
    return _read(warehouse_dir / name, VALUE_SUM, ROW_COUNT), _read(
        warehouse_dir / late_table(name), VALUE_DELTA, COUNT_DELTA
    )


def _read(path: Path, value: str, count: str) -> Figures:
    window = _names([SIZE, SLIDE, START])
    query = (f'SELECT {window}, sum({quoted(value)}) AS "value", sum({quoted(count)}) AS "count" '
             f"FROM t GROUP BY {window}")
    rows = readers.warehouse_query(path, query)
    return {(row[SIZE], row[SLIDE], row[START]): (row["value"], row["count"]) for row in rows}


def _names(columns: list[str]) -> str:
    return ", ".join(quoted(column) for column in columns)


def compare_figures(expected: Figures, figures: Figures, late: Figures, examples: int) -> Tally:
    """Each window's figures plus its late deltas against the expected figures. A window whose
    figures and deltas cancel to nothing counts as absent (all its rows were deleted late)."""
    tally = Tally(limit=examples)
    combined = {key: _plus(figures.get(key), late.get(key)) for key in figures.keys() | late.keys()}
    present = {key: value for key, value in combined.items() if value[1] != 0 or _nonzero(value[0])}
    for key in sorted(expected.keys() | present.keys()):
        label = window_label(key)
        if key not in present:
            tally.record("missing", label)
        elif key not in expected:
            tally.record("extra", label)
        elif not _same(present[key], expected[key]):
            tally.record("different", label)
    return tally


def window_label(key: WindowKey) -> str:
    size, slide, start = key
    return f"{size}s/{slide}s@{start.isoformat()}"


def _plus(a: tuple[Any, int] | None, b: tuple[Any, int] | None) -> tuple[Any, int]:
    values = [x for x in (a, b) if x is not None]
    total = sum((Decimal(str(v[0])) for v in values if v[0] is not None), Decimal(0))
    return total, sum(v[1] for v in values)


def _nonzero(value: Any) -> bool:
    return value is not None and Decimal(str(value)) != 0


def _same(found: tuple[Any, int], expected: tuple[Any, int]) -> bool:
    want = Decimal(0) if expected[0] is None else Decimal(str(expected[0]))
    return found[1] == expected[1] and Decimal(str(found[0])) == want

