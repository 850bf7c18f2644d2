"""The warehouse: Delta Lake tables written by two queries, `warehouse` (current state,
`warehouse.WarehouseSink`) and `analytics` (SCD2 history and event-time windows,
`analytics.AnalyticsSink`). docs/sinks/delta.md describes the tables.

`layout` names the tables' columns and folders and imports no pyspark, so readers (verify, the API)
use it without Spark. The sinks are loaded on first use of their names (`from spark_jobs.sinks.delta
import WarehouseSink` in spark_jobs/pipeline.py), so importing this package imports no pyspark.
The private modules are the sinks' pieces: `_version` (the version rule as SQL text), `_types`
(PostgreSQL types in Spark SQL), `_plan`, `_tables`, `_marks` (tombstones, watermarks), `_facts`,
`_source`, `_merge`, `_current` (the current-state apply), `_history`, `_windows`; `maintenance` compacts
and vacuums the tables (`tide warehouse optimize`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from spark_jobs.sinks.delta.analytics import AnalyticsSink
    from spark_jobs.sinks.delta.warehouse import WarehouseSink

_LAZY = {"WarehouseSink": "spark_jobs.sinks.delta.warehouse", "AnalyticsSink": "spark_jobs.sinks.delta.analytics"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["AnalyticsSink", "WarehouseSink"]
