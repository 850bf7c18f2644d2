"""Derived aggregates of the cache view: their declaration in `pipeline.yaml` and its validation.

An aggregate is a SQL `GROUP BY` over one captured table, optionally joined to the
one row of another table its foreign key names (an inner join), kept up to date in
Redis by the cache sink (`spark_jobs/sinks/redis.py`, docs/sinks/redis.md). Its exact
meaning, which the sink maintains and `tide verify` recomputes in SQL:

    SELECT <group_by>, <measure>, ...          -- count(*) or sum(<column>), each FILTER (WHERE ...)
    FROM <table> [JOIN <join.table> ON <join.table>.<primary key> = <table>.<join.foreign_key>]
    WHERE <group_by> IS NOT NULL
    GROUP BY <group_by>
    HAVING any measure <> 0                    -- a group whose figures are all zero has no key

Conditions (`where`) compare a column with a list of values (`in` / `not_in`); a NULL
never matches (SQL's three-valued logic). A sum ignores NULLs. Columns are checked against
PostgreSQL's catalogue (spark_jobs/model/catalogue.py) by `tide jobs start` and again by the jobs when
their queries start, so a typo fails before any data moves.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from spark_jobs.model.catalogue import Catalogue, Column, TableSchema
from spark_jobs.model.errors import ConfigurationError

Identifier = Annotated[str, Field(pattern=r"^[a-z_][a-z0-9_]*$", max_length=63)]
Scalar = str | int | bool


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class Condition(_Strict):
    """`{in: [...]}` or `{not_in: [...]}`: the column's value is (not) one of these."""

    in_: list[Scalar] | None = Field(default=None, alias="in", min_length=1)
    not_in: list[Scalar] | None = Field(default=None, min_length=1)

    @model_validator(mode="after")
    def _exactly_one(self) -> Condition:
        if (self.in_ is None) == (self.not_in is None):
            raise ValueError("give exactly one of `in` or `not_in`")
        return self


Where = dict[str, Condition]  # column (or <join table>.<column>) -> condition; all must hold


class Measure(_Strict):
    """`{count: true}` (rows) or `{sum: column}`, optionally with its own `where`."""

    count: Literal[True] | None = None
    sum: str | None = None
    where: Where = {}

    @model_validator(mode="after")
    def _exactly_one(self) -> Measure:
        if (self.count is None) == (self.sum is None):
            raise ValueError("give exactly one of `count: true` or `sum: <column>`")
        return self


class Join(_Strict):
    """The one row of `table` whose primary key equals this table's column `foreign_key` (many-to-one)."""

    table: Identifier
    foreign_key: Identifier


class AggregateView(_Strict):
    table: Identifier
    join: Join | None = None
    group_by: Identifier
    # hash: one hash per group at `key` (with `{<group_by>}` in it), one field per measure.
    # sorted_set: one sorted set at `key`, member = group, score = its only measure.
    type: Literal["hash", "sorted_set"] = "hash"
    key: Annotated[str, Field(min_length=1, max_length=200)]
    where: Where = {}  # applies to every measure, besides each measure's own
    measures: Annotated[dict[Identifier, Measure], Field(min_length=1)]


# ---- the schema the names are checked against: spark_jobs/model/catalogue.py --------------------------------


def missing_column(field: str, table: str, column: str, columns: Iterable[str]) -> str:
    """The one-line error for a column the schema does not have, naming the ones it has."""
    known = ", ".join(sorted(columns)) or "none: does the table exist?"
    return f"{field}: {table} has no column {column} (columns: {known}); fix pipeline.yaml"


# ---- the checked, resolved form the sink and verify use -----------------------------------------------


@dataclass(frozen=True)
class Term:
    """One condition: `side` is "row" (the aggregate's table) or "join" (the joined row)."""

    side: Literal["row", "join"]
    column: str
    negate: bool
    values: tuple[Scalar, ...]


@dataclass(frozen=True)
class MeasurePlan:
    field: str
    where: tuple[Term, ...]
    side: Literal["row", "join"] = "row"
    column: str | None = None  # None: count rows
    scale: int = 0  # a sum is kept as an exact integer of 10^-scale units


@dataclass(frozen=True)
class AggregatePlan:
    name: str
    table: str
    group_by: str
    type: Literal["hash", "sorted_set"]
    key_head: str  # a hash's key is key_head + group + key_tail; a sorted set's is key_head
    key_tail: str
    measures: tuple[MeasurePlan, ...]
    join_table: str | None = None
    join_foreign_key: str | None = None
    join_key: str | None = None  # the joined table's primary-key column

    @property
    def tables(self) -> tuple[str, ...]:
        return (self.table, self.join_table) if self.join_table else (self.table,)

    def key(self, group: str = "") -> str:
        return self.key_head if self.type == "sorted_set" else f"{self.key_head}{group}{self.key_tail}"


class AggregateConfigError(ConfigurationError, ValueError):
    """One aggregate's declaration is wrong; the message names where and how to fix it. A ValueError too,
    so pydantic reports it where it validates pipeline.yaml."""


def plan(name: str, view: AggregateView, cached_tables: set[str], catalogue: Catalogue) -> AggregatePlan:
    """Check one declaration against the pipeline's cached tables and the schema; its resolved form."""
    where = f"cache_aggregates.{name}"

    def fail(field: str, problem: str) -> AggregateConfigError:
        return AggregateConfigError(f"{where}.{field}: {problem}")

    def table_info(field: str, table: str) -> TableSchema:
        if table not in catalogue:
            raise fail(field, f"unknown table {table} (tables: {', '.join(sorted(catalogue))})")
        if table not in cached_tables:
            raise fail(field, f"table {table} has no cache view: add `cache: {{}}` to tables.{table}")
        return catalogue[table]

    def column(field: str, info: TableSchema, table: str, name: str) -> Column:
        if name not in info.columns:
            raise AggregateConfigError(missing_column(f"{where}.{field}", table, name, info.columns))
        return info.columns[name]

    row = table_info("table", view.table)
    joined: TableSchema | None = None
    join_key = None
    if view.join is not None:
        if view.join.table == view.table:
            raise fail("join.table",
                       f"{view.table} joins itself: a cycle (a row would be its own parent); join another table")
        joined = table_info("join.table", view.join.table)
        column("join.foreign_key", row, view.table, view.join.foreign_key)
        if len(joined.primary_key) != 1:
            raise fail("join.table", f"{view.join.table} needs a one-column primary key to be joined on")
        join_key = joined.primary_key[0]

    def resolve(field: str, name: str) -> tuple[Literal["row", "join"], Column, str]:
        """`column` of the aggregate's table or `<join table>.column`."""
        table, _, bare = name.rpartition(".")
        if not table:
            return "row", column(field, row, view.table, name), name
        if joined is None or view.join is None or table != view.join.table:
            raise fail(field, f"{name}: {table} is not the joined table; "
                              f"declare `join: {{table: {table}, foreign_key: ...}}`")
        return "join", column(field, joined, table, bare), bare

    def terms(field: str, conditions: Where) -> tuple[Term, ...]:
        resolved = []
        for name, condition in conditions.items():
            side, info, bare = resolve(f"{field}.{name}", name)
            values = tuple(condition.in_ or condition.not_in or ())
            unknown = [v for v in values if info.kind == "enum" and v not in info.values]
            if unknown:
                raise fail(f"{field}.{name}", f"{', '.join(map(str, unknown))} not among {', '.join(info.values)}")
            resolved.append(Term(side, bare, condition.not_in is not None, values))
        return tuple(resolved)

    column("group_by", row, view.table, view.group_by)
    shared = terms("where", view.where)
    measures = []
    for field, measure in view.measures.items():
        own = terms(f"measures.{field}.where", measure.where)
        if measure.sum is None:
            measures.append(MeasurePlan(field, shared + own))
            continue
        side, info, bare = resolve(f"measures.{field}.sum", measure.sum)
        if info.kind not in ("integer", "decimal"):
            raise fail(f"measures.{field}.sum", f"{measure.sum} is not an integer or numeric(p,s) column")
        measures.append(MeasurePlan(field, shared + own, side, bare, info.scale or 0))

    placeholder = "{" + view.group_by + "}"
    if view.type == "hash":
        if view.key.count(placeholder) != 1:
            raise fail("key",
                       f"a hash aggregate's key needs {placeholder} once, e.g. {view.group_by}:{placeholder}:stats")
        head, tail = view.key.split(placeholder)
    else:
        if "{" in view.key:
            raise fail("key", "a sorted set is one key: no {placeholder} (the group is the member)")
        if len(measures) != 1 or measures[0].scale != 0:
            raise fail("measures",
                       "a sorted set has one measure, a count or a sum of an integer column (scores are doubles)")
        head, tail = view.key, ""
    for table in cached_tables:
        if head.startswith(f"{table}:"):
            raise fail("key",
                       f"{view.key} would mix with the cached rows of {table} ({table}:<id>): choose another key")
    if head.startswith("tideline:"):
        raise fail("key", "tideline: keys are the sink's own bookkeeping: choose another key")
    return AggregatePlan(
        name, view.table, view.group_by, view.type, head, tail, tuple(measures),
        view.join.table if view.join else None, view.join.foreign_key if view.join else None, join_key,
    )  # fmt: skip


def plans(
    aggregates: dict[str, AggregateView], cached_tables: set[str], catalogue: Catalogue
) -> list[AggregatePlan]:
    """Every declaration checked against the source's catalogue and resolved, in file order; raises
    AggregateConfigError on the first problem."""
    resolved = [plan(name, view, cached_tables, catalogue) for name, view in aggregates.items()]
    keys = [(p.key_head, p.key_tail) for p in resolved]
    for index, (p, key) in enumerate(zip(resolved, keys, strict=True)):
        if key in keys[:index]:
            raise AggregateConfigError(f"cache_aggregates.{p.name}.key: the same key as an earlier aggregate")
    return resolved
