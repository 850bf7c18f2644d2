"""The changelog as every sink receives it: decoding Debezium's change records (the one place that
reads their JSON), the newest change per row, and the dead letters of what cannot be applied.

- `envelope`: what a record looks like (placeholders, headers, the version and row-id rules);
- `schema`: the change as one Spark struct (`CHANGE`), what every sink receives;
- `stream`: the apply jobs' decoder, records → `CHANGE` rows in the JVM (imports pyspark);
- `record`: one record → a Python `Change`, for inspection tools (no pyspark);
- `newest`: a batch's changes folded to the newest per row (the version guard's input);
- `dead_letters`: the rows that cannot be applied, with the reason, for the dead-letter topic.

The names below are the Python decoder's, so read-side tools never import pyspark.
"""

from spark_jobs.changes.record import Change, ColumnType, DecodeError, decode, decode_key

__all__ = ["Change", "ColumnType", "DecodeError", "decode", "decode_key"]
