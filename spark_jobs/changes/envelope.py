"""What a Debezium change record looks like: the one description both decoders are built from.

`stream.py` reads records in the JVM (Spark SQL) for the apply jobs; `record.py` reads them in Python
for inspection (`tide tail`, status, chaos). Both take their field names, placeholders and the
version rule from here, and tests/unit/test_changes.py checks that they agree on the same records.

A record's value is Debezium's envelope as Connect's JSON converter writes it: with
`schemas.enable=false` (the connector's setting) the envelope itself; with `schemas.enable=true`
(topics written before docs/apply.md's switch) `{"schema": ..., "payload": <envelope>}`. Both are read.
"""

from __future__ import annotations

import json

# Debezium's `unavailable.value.placeholder` as it arrives for an unchanged TOASTed value: a text or
# json column carries it as a string, an array column as a one-element array, a bytea column as the
# placeholder's bytes in base64 (binary.handling.mode=base64).
UNAVAILABLE = "__debezium_unavailable_value"
UNAVAILABLE_BYTEA = "X19kZWJleml1bV91bmF2YWlsYWJsZV92YWx1ZQ=="
UNAVAILABLE_FORMS = (UNAVAILABLE, json.dumps([UNAVAILABLE], separators=(",", ":")), UNAVAILABLE_BYTEA)
OPS = ("r", "c", "u", "d", "t")
TRUNCATE = "t"
DELETE = "d"
# Debezium sets these on the two records of a primary-key change (delete of the old key, create of the
# new one); the header converter is JSON without schemas, so each is the other key's JSON object.
OLD_KEY_HEADER = "__debezium.oldkey"
NEW_KEY_HEADER = "__debezium.newkey"
# Elasticsearch's _id limit: a longer row id is replaced by a hash (the same in every sink).
MAX_ID_BYTES = 512
# The fields of `source` the decoders read.
SOURCE_FIELDS = ("table", "lsn", "sequence", "snapshot", "ts_ms", "txId")


def version(sequence: str | None, lsn: int | None, snapshot: str | bool | None) -> tuple[int, int]:
    """A change's version from Debezium's `source.sequence` (["<end LSN of the previous commit>",
    "<LSN of this change>"]), compared lexicographically (docs/apply.md, "The version"):

    - no sequence: (0, lsn);
    - initial-snapshot records have no previous commit: (0, lsn), below every streamed change;
    - the first transaction streamed after the snapshot has no previous commit either, yet it committed
      after the snapshot's point although its changes may sit below it in the WAL (begun before the
      slot was consistent): (lsn, lsn), above every snapshot record and below every later commit.

    Raises ValueError if `sequence` is not a two-element JSON list. stream.py's `version_column` is the
    same rule in Spark SQL."""
    lsn = int(lsn or 0)
    if not sequence:
        return (0, lsn)
    parsed = json.loads(sequence)
    if not isinstance(parsed, list) or len(parsed) != 2:
        raise ValueError(f"source.sequence is not a two-element list: {sequence!r}")
    first, second = parsed
    second = int(second or lsn)
    if first is None and snapshot in (None, "false", False):
        return (second, second)
    return (int(first or 0), second)


def row_id(key_values: list[object]) -> str:
    """A row's id from its primary-key values (as JSON parsed them, in key order): the value itself for
    one column, a JSON list for a composite key; a hash when longer than Elasticsearch allows.
    stream.py's `row_id_column` is the same rule in Spark SQL (non-ASCII text stays as it is in both)."""
    import hashlib

    if len(key_values) == 1:
        only = key_values[0]
        encoded = json.dumps(only) if isinstance(only, bool) else str(only)
    else:
        encoded = json.dumps(key_values, separators=(",", ":"), ensure_ascii=False, default=str)
    if len(encoded.encode()) > MAX_ID_BYTES:
        return "sha256:" + hashlib.sha256(encoded.encode()).hexdigest()
    return encoded
