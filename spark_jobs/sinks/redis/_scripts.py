"""The cache sink's Lua scripts: every write to a row is one atomic, version-guarded step in Redis.

Reading the held version (row, tombstone, truncate watermark) and writing the row happen in one
script, so two executors applying different versions of one row can never interleave a read and a
write. `APPLY_BATCH` applies many rows per call: the rows' arguments arrive as one flat ARGV that
the Spark job built (spark_jobs/sinks/redis/_commands.py), so a partition costs a few round trips
and no per-row work in Python. The same scripts keep the declared aggregates (`cache_aggregates`):
a row's old contribution out, its new one in, in the step that changes the row, so a change the
version guard rejects (a replay) never moves a figure (docs/sinks/redis.md).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from string import Template
from typing import Any

from spark_jobs.model.aggregates import AggregatePlan, MeasurePlan
from spark_jobs.sinks.base import COMMIT_TS, VERSION_MAJOR, VERSION_MINOR

# Lua numbers are doubles: integers compare exactly only up to 2^53 (LSNs fit).
MAX_EXACT_VERSION = 2**53
# The arguments of one row in APPLY_BATCH, after its count: row, tombstone and watermark keys, the
# moved-from row and tombstone keys ('' when none), op, major, minor, table, row id, kept count, commit
# time ('' when none), then for an upsert the kept columns and the after image as JSON ('' for a delete).
# A fixed number, so Spark SQL builds them without a function per element (docs/apply.md, "Generated code").
ROW_ARGS = 14

# Shared by every script: a key's version (missing = (0, 0)) and the lexicographic comparison.
# Values are stored as text (docs/sinks/redis.md): a row hash's field is its column's text, NULL an
# absent field; the scripts compare and sum that text.
_PRELUDE = """
local function version(key, major_field, minor_field)
  local held = redis.call('HMGET', key, major_field, minor_field)
  return {tonumber(held[1]) or 0, tonumber(held[2]) or 0}
end
local function above(a, b)
  return a[1] > b[1] or (a[1] == b[1] and a[2] > b[2])
end
"""

# The aggregates (spark_jobs/model/aggregates.py), kept as a function of the stored rows: every script that
# changes a row of a tracked table first computes, from the old and new row, what that change does
# to each aggregate (and to the children index a join needs), then writes the row and those changes
# in the same atomic script. Reads come first, so a bad value fails the script before any write.
# $spec is the JSON of `aggregate_spec` (one script text per pipeline file).
AGGREGATES = Template("""
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

-- A stored value as an id (the row id of one column is its text); nil for NULL (an absent field).
local function id_of(text)
  return text
end

-- A decimal's text as an exact integer count of 10^-scale units (NULL counts 0).
local function scaled(text, scale)
  if not text then return 0 end
  local digits = text
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
    if not value then return false end  -- NULL matches nothing, as in SQL
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



# One row of APPLY_BATCH, its arguments at ARGV[at + 1] ... (see ROW_ARGS). The kept columns' JSON names
# each column that may keep its stored value with the major, minor the stored row must reach
# (`keep_from`); the after image's JSON is every column's text, null for NULL (an absent field). A delete
# whose row moved to another key (`moved` = 'm' op) keeps the row's fields under its tombstone, for the
# create of the new key to take its unchanged-TOAST columns from. Returns nil, or the reason the row
# cannot be applied.
_APPLY_ROW = Template("""
local function apply_row(at)
  local row, tomb, mark, from_row, from_tomb = ARGV[at + 1], ARGV[at + 2], ARGV[at + 3], ARGV[at + 4], ARGV[at + 5]
  local op, table_name, row_id = ARGV[at + 6], ARGV[at + 9], ARGV[at + 10]
  local incoming = {tonumber(ARGV[at + 7]), tonumber(ARGV[at + 8])}
  local row_version = version(row, '$major', '$minor')
  local held = row_version
  for _, other in ipairs({version(tomb, 'major', 'minor'), version(mark, 'major', 'minor')}) do
    if above(other, held) then held = other end
  end
  if not above(incoming, held) then return nil end  -- older than what we hold, or a replay
  local old = tracked_row(table_name, row)
  if op == 'd' or op == 'm' then
    local ok, writes = pcall(aggregate_writes, table_name, row_id, old, nil)
    if not ok then return error_text(writes) end
    local image = {}
    if op == 'm' then image = redis.call('HGETALL', row) end
    redis.call('DEL', row, tomb)
    -- The guard above proved incoming beats any existing tombstone, so this only raises it.
    redis.call('HSET', tomb, 'major', ARGV[at + 7], 'minor', ARGV[at + 8], unpack(image))
    run(writes)
    return nil
  end
  local sent = {}
  for name, value in pairs(cjson.decode(ARGV[at + 14])) do
    if value ~= cjson.null then sent[name] = value end
  end
  local fields, kept = {}, {}
  for name, from in pairs(cjson.decode(ARGV[at + 13])) do
    if not above({from.major, from.minor}, row_version) then
      kept[name] = redis.call('HGET', row, name)
    end
    if not kept[name] and not sent[name] and from_row ~= '' then
      -- A create after a primary-key change: the value is the moved row's, wherever it is now.
      kept[name] = redis.call('HGET', from_row, name) or redis.call('HGET', from_tomb, name)
    end
    if kept[name] then
      table.insert(fields, name)
      table.insert(fields, kept[name])
    elseif not sent[name] then
      -- Writing the row without it would put a partial image in the view (invariant 6).
      return 'no stored value for unchanged-TOAST column ' .. name
    end
  end
  for name, value in pairs(sent) do
    if not kept[name] then
      table.insert(fields, name)
      table.insert(fields, value)
    end
  end
  table.insert(fields, '$major')
  table.insert(fields, ARGV[at + 7])
  table.insert(fields, '$minor')
  table.insert(fields, ARGV[at + 8])
  if ARGV[at + 12] ~= '' then
    table.insert(fields, '$commit_ts')
    table.insert(fields, ARGV[at + 12])
  end
  local writes = {}
  if TRACKED[table_name] then
    local ok, result = pcall(aggregate_writes, table_name, row_id, old, row_of_fields(fields))
    if not ok then return error_text(result) end
    writes = result
  end
  -- The new row's version beats the tombstone, so the tombstone is no longer needed to guard the key.
  redis.call('DEL', row, tomb)
  redis.call('HSET', row, unpack(fields))
  run(writes)
  return nil
end
""").substitute(major=VERSION_MAJOR, minor=VERSION_MINOR, commit_ts=COMMIT_TS)

# ARGV: rows, each its argument count then its arguments (`apply_row`). Returns {index, reason} for
# every row that could not be applied (1-based index in the call); the others are applied or skipped.
_APPLY_BATCH = """
local rejected = {}
local at, index = 1, 1
while at <= #ARGV do
  -- A Redis error in one row (a key of another type) is that row's reason, not the whole call's: its
  -- reads come first, so it fails before writing anything.
  local ok, reason = pcall(apply_row, at)
  if not ok then reason = error_text(reason) end
  if reason then table.insert(rejected, {index, reason}) end
  at = at + tonumber(ARGV[at]) + 1
  index = index + 1
end
return rejected
"""

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
class Script:
    source: str

    @property
    def sha(self) -> str:
        return hashlib.sha1(self.source.encode()).hexdigest()  # what SCRIPT LOAD returns


RAISE_WATERMARK = Script(_PRELUDE + _RAISE_WATERMARK)


def text_value(value: Any) -> str:
    """A condition's value as a row hash stores it: its text (booleans as true/false)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def aggregate_spec(plans: Sequence[AggregatePlan], prefix: str = "") -> dict[str, Any]:
    """What the scripts need of the aggregates, as JSON-ready data. Condition values are the text the
    row hashes store, so a script compares stored text with stored text.
    No nulls: Lua's cjson turns them into a value that is true."""

    def measure(m: MeasurePlan) -> dict[str, Any]:
        where = [
            {"side": t.side, "column": t.column, "negate": t.negate, "values": [text_value(v) for v in t.values]}
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


def row_scripts(spec: dict[str, Any]) -> tuple[Script, Script]:
    """The APPLY_BATCH and PRUNE scripts for one set of aggregates (and key prefix)."""
    text = json.dumps(spec, separators=(",", ":"), sort_keys=True)
    if "]==]" in text:
        raise ValueError("an aggregate's declaration contains ]==], which the scripts cannot embed")
    library = AGGREGATES.substitute(spec=text)
    return Script(_PRELUDE + library + _APPLY_ROW + _APPLY_BATCH), Script(_PRELUDE + library + _PRUNE)
