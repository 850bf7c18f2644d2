"""The warehouse's tables as readers see them: folder names and column names. No pyspark here."""

from __future__ import annotations

from spark_jobs.model.config import history_table, late_table
from spark_jobs.sinks.base import COMMIT_TS, KEYS_PROPERTY, META_PREFIX, VERSION_MAJOR, VERSION_MINOR

# SCD2 history tables (<table>_history): every version of each row with its validity interval.
VALID_FROM, VALID_TO, IS_CURRENT, SOURCE_OP = "valid_from", "valid_to", "is_current", "source_op"
UNAVAILABLE = "tl_unavailable"  # columns whose value no earlier version could supply (normally empty)

# Event-time window tables (<name>) and their late changes (<name>_late).
SIZE, SLIDE, START, END = "window_size_seconds", "window_slide_seconds", "window_start", "window_end"
VALUE_SUM, ROW_COUNT = "value_sum", "row_count"
VALUE_DELTA, COUNT_DELTA, ROW_ID, WATERMARK, REASON = "value_delta", "count_delta", "row_id", "watermark", "reason"

__all__ = [
    "COMMIT_TS", "COUNT_DELTA", "END", "IS_CURRENT", "KEYS_PROPERTY", "META_PREFIX", "REASON", "ROW_COUNT", "ROW_ID",
    "SIZE", "SLIDE", "SOURCE_OP", "START", "UNAVAILABLE", "VALID_FROM", "VALID_TO", "VALUE_DELTA", "VALUE_SUM",
    "VERSION_MAJOR", "VERSION_MINOR", "WATERMARK", "history_table", "late_table",
]
