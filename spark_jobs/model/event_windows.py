"""Event-time windows, the pure rules: which windows a time falls in, and a window's figures.

A window family has a size and a slide (tumbling when they are equal), aligned to the Unix epoch
as Spark's window() is: [start, start + size) for every start that is a multiple of the slide.
A time falls in size / slide windows. The warehouse sink computes the same assignment in Spark SQL
(`spark_jobs/sinks/delta_windows.py`); `tide verify` aggregates PostgreSQL's rows with `aggregate`.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from spark_jobs.model.config import WindowSpec

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# A window: (size_seconds, slide_seconds, start).
WindowKey = tuple[int, int, datetime]


def window_starts(at: datetime, spec: WindowSpec) -> list[datetime]:
    """The starts of the windows of `spec` that contain `at` (an aware datetime), oldest first."""
    micros = (at - EPOCH) // timedelta(microseconds=1)
    slide = spec.slide * 1_000_000
    last = micros - micros % slide  # floor, also before the epoch
    count = spec.size_seconds // spec.slide
    return [EPOCH + timedelta(microseconds=last - k * slide) for k in reversed(range(count))]


def aggregate(
    rows: Iterable[tuple[datetime | None, Decimal | int | float | None]], specs: Iterable[WindowSpec]
) -> dict[WindowKey, tuple[Decimal | int | float | None, int]]:
    """(sum of values, count of rows) per window, as SQL's sum(value), count(*) grouped by window:
    a row without a time is in no window; a null value counts but adds nothing."""
    specs = list(specs)
    figures: dict[WindowKey, tuple[Decimal | int | float | None, int]] = {}
    for at, value in rows:
        if at is None:
            continue
        for spec in specs:
            for start in window_starts(at, spec):
                key = (spec.size_seconds, spec.slide, start)
                total, count = figures.get(key, (None, 0))
                if value is not None:
                    # one column's values: all Decimal, all int or all float, never mixed
                    total = value if total is None else total + value  # type: ignore[operator]
                figures[key] = (total, count + 1)
    return figures
