"""The cache view: one Redis hash per row, written by version-guarded Lua scripts.

Format (keys, fields, encoding) is documented in docs/sinks/redis.md. Every
write goes through a script so that reading the held version (row, tombstone,
truncate watermark) and writing the row happen atomically per key: two
executors applying different versions of one row can never interleave a read
and a write. Scripts are sent as EVALSHA calls pipelined in chunks, so a
partition costs a handful of round trips, not one per row.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, time
from decimal import Decimal
from string import Template
from typing import Any
from uuid import UUID

import redis
from redis.exceptions import NoScriptError, ResponseError

from spark_jobs.changes import Change
from spark_jobs.config import PipelineConfig
from spark_jobs.merge import doc_id
from spark_jobs.sinks.base import COMMIT_TS, META_PREFIX, VERSION_MAJOR, VERSION_MINOR, Rejected

# Lua numbers are doubles: integers compare exactly only up to 2^53 (LSNs fit).
MAX_EXACT_VERSION = 2**53


def row_key(table: str, row_id: str, prefix: str = "") -> str:
    return f"{prefix}{table}:{row_id}"


def tombstone_key(table: str, row_id: str, prefix: str = "") -> str:
    return f"{prefix}tideline:tombstone:{table}:{row_id}"


def watermark_key(table: str, prefix: str = "") -> str:
    return f"{prefix}tideline:truncated:{table}"


def glob_escape(text: str) -> str:
    """`text` as a literal in a SCAN MATCH pattern."""
    return re.sub(r"([*?\[\]\\])", r"\\\1", text)


def _json_default(value: Any) -> Any:
    if isinstance(value, Decimal):
        return str(value)  # a JSON string keeps NUMERIC exact ("12.50"); a JSON number would be a float
    if isinstance(value, (datetime, date, time)):
        return value.isoformat()  # timestamptz is aware, so this carries its offset
    if isinstance(value, UUID):
        return str(value)
    if isinstance(value, (bytes, bytearray)):
        return base64.b64encode(value).decode()
    raise TypeError(f"cannot encode {type(value).__name__} for Redis")


def encode_value(value: Any) -> str:
    """One column value as JSON text (the hash field's value)."""
    return json.dumps(value, default=_json_default, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def decode_row(fields: dict[bytes | str, bytes | str]) -> dict[str, Any]:
    """A stored hash (HGETALL) back to values: every field, metadata included, is JSON text."""
    return {(k.decode() if isinstance(k, bytes) else k): json.loads(v) for k, v in fields.items()}


def version_args(change: Change) -> list[str]:
    """The change's version as the decimal strings the scripts compare and store.

    Passed and stored as the caller's strings, never formatted by Lua: Lua 5.1's
    tostring() prints large numbers in %.14g, which would lose digits.
    """
    if not all(0 <= part < MAX_EXACT_VERSION for part in change.sequence):
        raise ValueError(f"version {change.sequence} is outside [0, 2^53) and cannot be compared exactly in Lua")
    return [str(part) for part in change.sequence]


def row_fields(change: Change) -> list[str]:
    """The flat field, value list of an upsert's hash: columns (JSON) then metadata."""
    if change.after is None:
        raise ValueError(f"op {change.op} without an after image")
    fields: list[str] = []
    for column, value in change.after.items():
        if column.startswith(META_PREFIX):
            raise ValueError(f"column {column} clashes with the sink's metadata prefix {META_PREFIX}")
        fields += [column, encode_value(value)]
    major, minor = version_args(change)
    committed = None
    if change.commit_ts_ms is not None:
        committed = datetime.fromtimestamp(change.commit_ts_ms / 1000, UTC).isoformat(timespec="milliseconds")
    return fields + [VERSION_MAJOR, major, VERSION_MINOR, minor, COMMIT_TS, encode_value(committed)]


# Shared by every script: a key's version (missing = (0, 0)) and the lexicographic comparison.
_PRELUDE = """
local function version(key, major_field, minor_field)
  local held = redis.call('HMGET', key, major_field, minor_field)
  return {tonumber(held[1]) or 0, tonumber(held[2]) or 0}
end
local function above(a, b)
  return a[1] > b[1] or (a[1] == b[1] and a[2] > b[2])
end
"""

# KEYS: row, tombstone, truncate watermark.
# ARGV: op ('u' or 'd'), major, minor, number of unchanged-TOAST columns, their names, then field, value pairs.
_APPLY = Template("""
local incoming = {tonumber(ARGV[2]), tonumber(ARGV[3])}
local held = version(KEYS[1], '$major', '$minor')
for _, other in ipairs({version(KEYS[2], 'major', 'minor'), version(KEYS[3], 'major', 'minor')}) do
  if above(other, held) then held = other end
end
if not above(incoming, held) then return 0 end  -- older than what we hold, or a replay
if ARGV[1] == 'd' then
  redis.call('DEL', KEYS[1])
  -- The guard above already proved incoming beats any existing tombstone, so this only raises it.
  redis.call('HSET', KEYS[2], 'major', ARGV[2], 'minor', ARGV[3])
  return 1
end
local fields = {}
local unavailable = tonumber(ARGV[4])
for i = 5, 4 + unavailable do
  local kept = redis.call('HGET', KEYS[1], ARGV[i])
  if not kept then
    -- Writing the row without it would put a partial image in the view (invariant 6).
    return redis.error_reply('no stored value for unchanged-TOAST column ' .. ARGV[i])
  end
  table.insert(fields, ARGV[i])
  table.insert(fields, kept)
end
for i = 5 + unavailable, #ARGV do table.insert(fields, ARGV[i]) end
-- The new row's version beats the tombstone, so the tombstone is no longer needed to guard the key.
redis.call('DEL', KEYS[1], KEYS[2])
redis.call('HSET', KEYS[1], unpack(fields))
return 1
""").substitute(major=VERSION_MAJOR, minor=VERSION_MINOR)

# KEYS: truncate watermark. ARGV: major, minor. Never lowers the watermark.
_RAISE_WATERMARK = """
if not above({tonumber(ARGV[1]), tonumber(ARGV[2])}, version(KEYS[1], 'major', 'minor')) then return 0 end
redis.call('HSET', KEYS[1], 'major', ARGV[1], 'minor', ARGV[2])
return 1
"""

# KEYS: a row or tombstone of the table, the table's watermark. ARGV: that key's version field names.
# Deletes it if its version is below the watermark; anything else matching the pattern is left alone.
_PRUNE = """
if redis.call('TYPE', KEYS[1]).ok ~= 'hash' or redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then return 0 end
if not above(version(KEYS[2], 'major', 'minor'), version(KEYS[1], ARGV[1], ARGV[2])) then return 0 end
redis.call('DEL', KEYS[1])
return 1
"""


@dataclass(frozen=True)
class _Script:
    source: str

    @property
    def sha(self) -> str:
        return hashlib.sha1(self.source.encode()).hexdigest()  # what SCRIPT LOAD returns


APPLY, RAISE_WATERMARK, PRUNE = (_Script(_PRELUDE + body) for body in (_APPLY, _RAISE_WATERMARK, _PRUNE))
_Call = tuple[list[str], list[str]]  # (keys, args) of one EVALSHA


class RedisSink:
    """The `cache` view in Redis. Holds plain settings only, so it pickles to executors."""

    name = "cache"

    def __init__(
        self, url: str, pipeline: PipelineConfig, key_prefix: str = "", chunk_size: int = 500, scan_count: int = 1000
    ) -> None:
        self.url = url
        self.key_prefix = key_prefix
        self.chunk_size = chunk_size
        self.scan_count = scan_count
        self.tables = frozenset(table for table, views in pipeline.tables.items() if views.cache is not None)

    def available(self) -> bool:
        """Whether Redis answers (checked on the driver before a batch)."""
        try:
            with redis.Redis.from_url(self.url, socket_connect_timeout=5, socket_timeout=5) as client:
                return bool(client.ping())
        except redis.RedisError:
            return False

    def setup(self, pipeline: PipelineConfig) -> None:
        """Load the scripts (idempotent). `write` reloads them too if the server lost them."""
        with redis.Redis.from_url(self.url) as client:
            for script in (APPLY, RAISE_WATERMARK, PRUNE):
                client.script_load(script.source)

    def write(self, changes: Sequence[Change]) -> list[Rejected]:
        """Apply one partition's changes. Truncates go first (rows above them survive either way).

        Raises on connection errors (the batch is retried; every write is idempotent).
        """
        mine = sorted((c for c in changes if c.table in self.tables), key=lambda c: c.op != "t")
        if not mine:
            return []
        rejected: list[Rejected] = []
        upserts: list[tuple[Change, _Call]] = []
        with redis.Redis.from_url(self.url) as client:
            for change in mine:
                try:
                    if change.op == "t":
                        self._truncate(client, change)
                    else:
                        upserts.append((change, self._apply_call(change)))
                except (ValueError, TypeError, LookupError, ResponseError) as exc:  # this row only
                    rejected.append(Rejected(change, str(exc)))
            for start in range(0, len(upserts), self.chunk_size):
                chunk = upserts[start : start + self.chunk_size]
                results = self._run(client, APPLY, [call for _, call in chunk])
                rejected += [Rejected(c, str(r)) for (c, _), r in zip(chunk, results) if isinstance(r, ResponseError)]
        return rejected

    def _apply_call(self, change: Change) -> _Call:
        row_id = doc_id(change.key)
        keys = [
            row_key(change.table, row_id, self.key_prefix),
            tombstone_key(change.table, row_id, self.key_prefix),
            watermark_key(change.table, self.key_prefix),
        ]
        if change.is_delete:
            return keys, ["d", *version_args(change), "0"]
        toast = sorted(change.unavailable)
        return keys, ["u", *version_args(change), str(len(toast)), *toast, *row_fields(change)]

    def _truncate(self, client: redis.Redis, change: Change) -> None:
        """Raise the watermark, then delete the table's rows (and tombstones) below it.

        Pruning runs even when the watermark did not rise: a replayed truncate
        finishes a prune that an earlier failed attempt left half done.
        """
        watermark = watermark_key(change.table, self.key_prefix)
        (raised,) = self._run(client, RAISE_WATERMARK, [([watermark], version_args(change))])
        if isinstance(raised, ResponseError):
            raise raised
        table = glob_escape(change.table)
        prefix = glob_escape(self.key_prefix)
        targets = [
            (f"{prefix}{table}:*", [VERSION_MAJOR, VERSION_MINOR]),
            # A tombstone below the watermark guards nothing the watermark does not: reclaim it.
            (glob_escape(tombstone_key(change.table, "", self.key_prefix)) + "*", ["major", "minor"]),
        ]
        for pattern, version_fields in targets:
            cursor = None
            while cursor != 0:
                cursor, keys = client.scan(cursor=cursor or 0, match=pattern, count=self.scan_count)
                self._run(client, PRUNE, [([key.decode(), watermark], version_fields) for key in keys])

    def _run(self, client: redis.Redis, script: _Script, calls: list[_Call]) -> list[Any]:
        """EVALSHA each call in one pipelined round trip; per-call errors come back as values."""
        results = self._pipeline(client, script, calls)
        missing = [i for i, result in enumerate(results) if isinstance(result, NoScriptError)]
        if missing:
            # The server lost its script cache (restart, SCRIPT FLUSH). A NOSCRIPT call did nothing,
            # so resending just those is safe; the version guard makes their order irrelevant.
            client.script_load(script.source)
            for i, result in zip(missing, self._pipeline(client, script, [calls[i] for i in missing])):
                if isinstance(result, NoScriptError):
                    raise result
                results[i] = result
        return results

    @staticmethod
    def _pipeline(client: redis.Redis, script: _Script, calls: list[_Call]) -> list[Any]:
        if not calls:
            return []
        pipe = client.pipeline(transaction=False)
        for keys, args in calls:
            pipe.evalsha(script.sha, len(keys), *keys, *args)
        return pipe.execute(raise_on_error=False)
