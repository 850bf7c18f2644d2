"""Decoding Debezium's change records: the one place that reads their JSON.

- `envelope`: what a record looks like (placeholders, headers, the version and row-id rules);
- `schema`: the change as one Spark struct (`CHANGE`), what every sink receives;
- `stream`: the apply jobs' decoder, records → `CHANGE` rows in the JVM (imports pyspark);
- `record`: one record → a Python `Change`, for inspection tools (no pyspark).

The names below are the Python decoder's, so read-side tools never import pyspark.
"""

from spark_jobs.changes.record import Change, ColumnType, DecodeError, decode, decode_key

__all__ = ["Change", "ColumnType", "DecodeError", "decode", "decode_key"]
