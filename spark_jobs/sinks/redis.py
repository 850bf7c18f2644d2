"""The cache view: one Redis hash per row, written by version-guarded Lua scripts.

Format (keys, fields, encoding) is documented in docs/sinks/redis.md. Every
write goes through a script so that reading the held version (row, tombstone,
truncate watermark) and writing the row happen atomically per key: two
executors applying different versions of one row can never interleave a read
and a write. Scripts are sent as EVALSHA calls pipelined in chunks, so a
partition costs a handful of round trips, not one per row.

The same scripts keep the declared aggregates (`cache_aggregates`): a row's old
contribution out, its new one in, in the step that changes the row, so a change
the version guard rejects (a replay) never moves a figure (docs/sinks/redis.md).
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

from spark_jobs.aggregates import AggregateConfigError, AggregatePlan, MeasurePlan
from spark_jobs.changes import Change
from spark_jobs.config import PipelineConfig
from spark_jobs.merge import Version, doc_id, keep_from
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
    """The change's version as the scripts' arguments (`version_text`)."""
    return version_text(change.sequence)


def version_text(version: Version) -> list[str]:
    """A version as the decimal strings the scripts compare and store.

    Passed and stored as the caller's strings, never formatted by Lua: Lua 5.1's
    tostring() prints large numbers in %.14g, which would lose digits.
    """
    if not all(0 <= part < MAX_EXACT_VERSION for part in version):
        raise ValueError(f"version {version} is outside [0, 2^53) and cannot be compared exactly in Lua")
    return [str(part) for part in version]


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

# The aggregates (spark_jobs/aggregates.py), kept as a function of the stored rows: every script that
# changes a row of a tracked table first computes, from the old and new row, what that change does
# to each aggregate (and to the children index a join needs), then writes the row and those changes
# in the same atomic script. Reads come first, so a bad value fails the script before any write.
# $spec is the JSON of `aggregate_spec` (one script text per pipeline file).
_AGGREGATES = Template("""
local SPEC = cjson.decode([==[$spec]==])
local TRACKED = SPEC.tracked

local function error_text(err)
  if type(err) == 'table' then return err.err or cjson.encode(err) end
  return tostring(err)
end

local function fields_of(key)
  local flat = redis.call('HGETALL', key)
  if #flat == 0 then return nil end
  local row = {}
  for i = 1, #flat, 2 do row[flat[i]] = flat[i + 1] end
  return row
end

local function tracked_row(table_name, key)
  if TRACKED[table_name] then return fields_of(key) end
  return nil
end

local function row_of_fields(fields)
  local row = {}
  for i = 1, #fields, 2 do row[fields[i]] = fields[i + 1] end
  return row
end

-- A stored JSON value as an id (doc_id of one column): strings unquoted, numbers as written; nil for NULL.
local function id_of(text)
  if not text or text == 'null' then return nil end
  if string.sub(text, 1, 1) == '"' then return cjson.decode(text) end
  return text
end

-- A decimal (JSON number, JSON string or plain text) as an exact integer count of 10^-scale units.
local function scaled(text, scale)
  if not text or text == 'null' then return 0 end
  local digits = text
  if string.sub(digits, 1, 1) == '"' then digits = string.sub(digits, 2, -2) end
  local sign, whole, fraction = string.match(digits, '^(-?)(%d+)%.?(%d*)$$')
  if not whole then error('not an exact decimal: ' .. text) end
  if #fraction > scale then
    if not string.match(string.sub(fraction, scale + 1), '^0*$$') then
      error(text .. ' has more than ' .. scale .. ' decimal places')
    end
    fraction = string.sub(fraction, 1, scale)
  end
  local units = tonumber(whole .. fraction .. string.rep('0', scale - #fraction))
  if units >= 9007199254740992 then error(text .. ' is too large to sum exactly (2^53 units)') end
  if sign == '-' then return -units end
  return units
end

local function decimal_text(units, scale)
  local sign = ''
  if units < 0 then sign = '-' end
  local digits = string.format('%d', math.abs(units))
  if scale == 0 then return sign .. digits end
  digits = string.rep('0', scale + 1 - #digits) .. digits
  return sign .. string.sub(digits, 1, #digits - scale) .. '.' .. string.sub(digits, #digits - scale + 1)
end

local function value_of(side, column, row, parent)
  if side == 'join' then return parent[column] end
  return row[column]
end

local function matches(where, row, parent)
  for _, term in ipairs(where) do
    local value = value_of(term.side, term.column, row, parent)
    if not value or value == 'null' then return false end  -- NULL matches nothing, as in SQL
    local found = false
    for _, wanted in ipairs(term.values) do
      if value == wanted then found = true end
    end
    if found == term.negate then return false end
  end
  return true
end

local function parent_of(aggregate, row)
  if not aggregate.join or not row then return nil end
  local parent_id = id_of(row[aggregate.join.column])
  if not parent_id then return nil end
  return fields_of(SPEC.prefix .. aggregate.join.table .. ':' .. parent_id)
end

-- Add sign x the row's contribution (joined to parent) to deltas[group][field].
local function contribute(aggregate, row, parent, sign, deltas)
  if not row or (aggregate.join and not parent) then return end  -- an inner join: no parent, no figures
  local group = id_of(row[aggregate.group_by])
  if not group then return end
  for _, measure in ipairs(aggregate.measures) do
    if matches(measure.where, row, parent) then
      local amount = 1
      if measure.column then amount = scaled(value_of(measure.side, measure.column, row, parent), measure.scale) end
      deltas[group] = deltas[group] or {}
      deltas[group][measure.field] = (deltas[group][measure.field] or 0) + sign * amount
    end
  end
end

local function children_key(child_table, column, parent_id)
  return SPEC.prefix .. 'tideline:children:' .. child_table .. ':' .. column .. ':' .. parent_id
end

-- The writes that move one group's figures by `changes`; none if they cancel out.
local function group_writes(aggregate, group, changes, writes)
  if aggregate.type == 'sorted_set' then
    local amount = changes[aggregate.measures[1].field] or 0
    if amount == 0 then return end
    local key = SPEC.prefix .. aggregate.key_head
    local score = (tonumber(redis.call('ZSCORE', key, group)) or 0) + amount
    if score == 0 then table.insert(writes, {'ZREM', key, group})
    else table.insert(writes, {'ZADD', key, string.format('%d', score), group}) end
    return
  end
  local key = SPEC.prefix .. aggregate.key_head .. group .. aggregate.key_tail
  local moved, zero, fields = false, true, {}
  for _, measure in ipairs(aggregate.measures) do
    local amount = changes[measure.field] or 0
    if amount ~= 0 then moved = true end
    local figure = scaled(redis.call('HGET', key, measure.field), measure.scale) + amount
    if figure ~= 0 then zero = false end
    table.insert(fields, measure.field)
    table.insert(fields, decimal_text(figure, measure.scale))
  end
  if not moved then return end
  if zero then table.insert(writes, {'DEL', key})  -- as in SQL, a group with nothing to show has no row
  else table.insert(writes, {'HSET', key, unpack(fields)}) end
end

-- Everything a row of `table_name` going from `old` to `new` (nil: absent) does to the aggregates.
local function aggregate_writes(table_name, row_id, old, new)
  local writes = {}
  if not TRACKED[table_name] then return writes end
  for _, edge in ipairs(SPEC.edges) do
    if edge.table == table_name then
      local before = old and id_of(old[edge.column])
      local after = new and id_of(new[edge.column])
      if before ~= after then
        if before then table.insert(writes, {'SREM', children_key(edge.table, edge.column, before), row_id}) end
        if after then table.insert(writes, {'SADD', children_key(edge.table, edge.column, after), row_id}) end
      end
    end
  end
  for _, aggregate in ipairs(SPEC.aggregates) do
    local deltas = {}
    if aggregate.table == table_name then
      contribute(aggregate, old, parent_of(aggregate, old), -1, deltas)
      contribute(aggregate, new, parent_of(aggregate, new), 1, deltas)
    end
    if aggregate.join and aggregate.join.table == table_name then
      -- A parent's change moves every stored child's contribution (an order's status: all its items).
      local children = redis.call('SMEMBERS', children_key(aggregate.table, aggregate.join.column, row_id))
      for _, child_id in ipairs(children) do
        local child = fields_of(SPEC.prefix .. aggregate.table .. ':' .. child_id)
        contribute(aggregate, child, old, -1, deltas)
        contribute(aggregate, child, new, 1, deltas)
      end
    end
    for group, changes in pairs(deltas) do group_writes(aggregate, group, changes, writes) end
  end
  return writes
end

local function run(writes)
  for _, command in ipairs(writes) do redis.call(unpack(command)) end
end
""")


# KEYS: row, tombstone, truncate watermark.
# ARGV: op ('u' or 'd'), major, minor, table, row id, number of columns that may keep their stored value,
# for each its name and the major, minor the stored row must reach (`merge.keep_from`), then field, value pairs.
_APPLY = Template("""
local incoming = {tonumber(ARGV[2]), tonumber(ARGV[3])}
local row_version = version(KEYS[1], '$major', '$minor')
local held = row_version
for _, other in ipairs({version(KEYS[2], 'major', 'minor'), version(KEYS[3], 'major', 'minor')}) do
  if above(other, held) then held = other end
end
if not above(incoming, held) then return 0 end  -- older than what we hold, or a replay
local old = tracked_row(ARGV[4], KEYS[1])
if ARGV[1] == 'd' then
  local ok, writes = pcall(aggregate_writes, ARGV[4], ARGV[5], old, nil)
  if not ok then return redis.error_reply(error_text(writes)) end
  redis.call('DEL', KEYS[1])
  -- The guard above already proved incoming beats any existing tombstone, so this only raises it.
  redis.call('HSET', KEYS[2], 'major', ARGV[2], 'minor', ARGV[3])
  run(writes)
  return 1
end
local last_kept = 6 + 3 * tonumber(ARGV[6])
local sent = {}
for i = last_kept + 1, #ARGV, 2 do sent[ARGV[i]] = true end
local fields, kept = {}, {}
for i = 7, last_kept, 3 do
  if not above({tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2])}, row_version) then
    kept[ARGV[i]] = redis.call('HGET', KEYS[1], ARGV[i])
  end
  if kept[ARGV[i]] then
    table.insert(fields, ARGV[i])
    table.insert(fields, kept[ARGV[i]])
  elseif not sent[ARGV[i]] then
    -- Writing the row without it would put a partial image in the view (invariant 6).
    return redis.error_reply('no stored value for unchanged-TOAST column ' .. ARGV[i])
  end
end
for i = last_kept + 1, #ARGV, 2 do
  if not kept[ARGV[i]] then
    table.insert(fields, ARGV[i])
    table.insert(fields, ARGV[i + 1])
  end
end
local writes = {}
if TRACKED[ARGV[4]] then
  local ok, result = pcall(aggregate_writes, ARGV[4], ARGV[5], old, row_of_fields(fields))
  if not ok then return redis.error_reply(error_text(result)) end
  writes = result
end
-- The new row's version beats the tombstone, so the tombstone is no longer needed to guard the key.
redis.call('DEL', KEYS[1], KEYS[2])
redis.call('HSET', KEYS[1], unpack(fields))
run(writes)
return 1
""").substitute(major=VERSION_MAJOR, minor=VERSION_MINOR)

# KEYS: truncate watermark. ARGV: major, minor. Never lowers the watermark.
_RAISE_WATERMARK = """
if not above({tonumber(ARGV[1]), tonumber(ARGV[2])}, version(KEYS[1], 'major', 'minor')) then return 0 end
redis.call('HSET', KEYS[1], 'major', ARGV[1], 'minor', ARGV[2])
return 1
"""

# KEYS: a row or tombstone of the table, the table's watermark. ARGV: that key's version field names,
# then for a row its table and id (a row leaves the aggregates like a delete). Deletes the key if its
# version is below the watermark; anything else matching the pattern is left alone.
_PRUNE = """
if redis.call('TYPE', KEYS[1]).ok ~= 'hash' or redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then return 0 end
if not above(version(KEYS[2], 'major', 'minor'), version(KEYS[1], ARGV[1], ARGV[2])) then return 0 end
local writes = {}
if ARGV[3] then
  local ok, result = pcall(aggregate_writes, ARGV[3], ARGV[4], tracked_row(ARGV[3], KEYS[1]), nil)
  if not ok then return redis.error_reply(error_text(result)) end
  writes = result
end
redis.call('DEL', KEYS[1])
run(writes)
return 1
"""


@dataclass(frozen=True)
class _Script:
    source: str

    @property
    def sha(self) -> str:
        return hashlib.sha1(self.source.encode()).hexdigest()  # what SCRIPT LOAD returns


RAISE_WATERMARK = _Script(_PRELUDE + _RAISE_WATERMARK)
_Call = tuple[list[str], list[str]]  # (keys, args) of one EVALSHA


def aggregate_spec(plans: Sequence[AggregatePlan], prefix: str = "") -> dict[str, Any]:
    """What the scripts need of the aggregates, as JSON-ready data. Condition values are encoded as the
    row hashes store them (`encode_value`), so a script compares stored text with stored text.
    No nulls: Lua's cjson turns them into a value that is true."""

    def measure(m: MeasurePlan) -> dict[str, Any]:
        where = [
            {"side": t.side, "column": t.column, "negate": t.negate, "values": [encode_value(v) for v in t.values]}
            for t in m.where
        ]
        return {"field": m.field, "where": where, "side": m.side, "scale": m.scale} | (
            {"column": m.column} if m.column else {}
        )

    aggregates = [
        {"table": p.table, "group_by": p.group_by, "type": p.type, "key_head": p.key_head, "key_tail": p.key_tail,
         "measures": [measure(m) for m in p.measures]}
        | ({"join": {"table": p.join_table, "column": p.join_foreign_key}} if p.join_table else {})
        for p in plans
    ]  # fmt: skip
    edges = sorted({(p.table, p.join_foreign_key) for p in plans if p.join_table})
    return {
        "prefix": prefix,
        "tracked": {table: True for p in plans for table in p.tables},
        "edges": [{"table": table, "column": column} for table, column in edges],
        "aggregates": aggregates,
    }


def row_scripts(spec: dict[str, Any]) -> tuple[_Script, _Script]:
    """The APPLY and PRUNE scripts for one set of aggregates (and key prefix)."""
    text = json.dumps(spec, separators=(",", ":"), sort_keys=True)
    if "]==]" in text:
        raise ValueError("an aggregate's declaration contains ]==], which the scripts cannot embed")
    library = _AGGREGATES.substitute(spec=text)
    return _Script(_PRELUDE + library + _APPLY), _Script(_PRELUDE + library + _PRUNE)


def spec_key(prefix: str = "") -> str:
    return f"{prefix}tideline:aggregates"


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
        self.aggregates = aggregate_spec(pipeline.aggregate_plans(), key_prefix)
        self.apply_script, self.prune_script = row_scripts(self.aggregates)

    def available(self) -> bool:
        """Whether Redis answers (checked on the driver before a batch)."""
        try:
            with redis.Redis.from_url(self.url, socket_connect_timeout=5, socket_timeout=5) as client:
                return bool(client.ping())
        except redis.RedisError:
            return False

    def setup(self, pipeline: PipelineConfig) -> None:
        """Load the scripts (idempotent; `write` reloads them too if the server lost them), and refuse
        a cache whose aggregates were declared differently: its figures would not match its rows."""
        with redis.Redis.from_url(self.url) as client:
            self._check_aggregates(client)
            for script in (self.apply_script, RAISE_WATERMARK, self.prune_script):
                client.script_load(script.source)

    def _check_aggregates(self, client: redis.Redis) -> None:
        """The declaration the aggregates were built with is stored beside them. A cache holding rows
        but no declaration was built before the aggregates existed: deltas on it would be wrong too."""
        wanted = json.dumps(self.aggregates["aggregates"], sort_keys=True)
        held = client.hget(spec_key(self.key_prefix), "declaration")
        if held is None:
            patterns = [glob_escape(row_key(table, "", self.key_prefix)) + "*" for table in self.aggregates["tracked"]]
            if any(next(client.scan_iter(match=p, count=self.scan_count), None) for p in patterns):
                raise AggregateConfigError(
                    "the cache was built before its cache_aggregates were declared: run `tide rebuild cache`"
                )
            client.hset(spec_key(self.key_prefix), "declaration", wanted)
        elif held.decode() != wanted:
            raise AggregateConfigError(
                "the cache's aggregates were built from another cache_aggregates declaration: run `tide rebuild cache`"
            )

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
                results = self._run(client, self.apply_script, [call for _, call in chunk])
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
            return keys, ["d", *version_args(change), change.table, row_id, "0"]
        keep = [arg for column, needed in sorted(keep_from(change).items())
                for arg in (column, *version_text(needed))]
        return keys, ["u", *version_args(change), change.table, row_id, str(len(keep) // 3), *keep, *row_fields(change)]

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
        rows = row_key(change.table, "", self.key_prefix)
        targets = [
            # A row leaves the aggregates as it goes, so the script needs its table and id.
            (f"{prefix}{table}:*", lambda key: [VERSION_MAJOR, VERSION_MINOR, change.table, key[len(rows) :]]),
            # A tombstone below the watermark guards nothing the watermark does not: reclaim it.
            (glob_escape(tombstone_key(change.table, "", self.key_prefix)) + "*", lambda key: ["major", "minor"]),
        ]
        for pattern, arguments in targets:
            cursor = None
            while cursor != 0:
                cursor, keys = client.scan(cursor=cursor or 0, match=pattern, count=self.scan_count)
                calls = [([key.decode(), watermark], arguments(key.decode())) for key in keys]
                for result in self._run(client, self.prune_script, calls):
                    if isinstance(result, ResponseError):
                        raise result  # the truncate is retried with its batch; pruning is idempotent

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
