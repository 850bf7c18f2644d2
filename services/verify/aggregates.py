"""The cache's aggregates against SQL `GROUP BY` (docs/sinks/redis.md, docs/verify.md).

The oracle query is generated from the same declaration (`spark_jobs.model.aggregates`)
the sink maintains, by the definition written there: rows with a NULL group are
left out, a NULL never matches a condition, sums ignore NULLs, and a group whose
figures are all zero has no key in Redis. Each side yields (group id, figures as
canonical text), which verify spills and compares like rows.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from decimal import Decimal

import psycopg
import redis
from psycopg import sql

from services.verify.readers import PAGE, REDIS_BATCH, VerifyError
from spark_jobs.changes.envelope import row_id
from spark_jobs.model.aggregates import AggregatePlan, MeasurePlan, Term
from spark_jobs.sinks.redis import glob_escape


def figures_text(plan: AggregatePlan, figures: list[Decimal | int | str]) -> str:
    """Figures as exact decimal text at each measure's scale, one JSON object (no tabs: it is spilled)."""
    return json.dumps({m.field: _exact(value, m.scale) for m, value in zip(plan.measures, figures, strict=True)},
                      sort_keys=True)


def _exact(value: Decimal | int | str, scale: int) -> str:
    try:
        return format(Decimal(value).quantize(Decimal(1).scaleb(-scale)), "f")
    except ArithmeticError:
        return f"unreadable {value!r}"  # compares different, verify goes on


def oracle_query(plan: AggregatePlan, schema: str) -> sql.Composed:
    """SELECT group, figures ... GROUP BY group: the aggregate's definition in SQL."""
    row, joined = sql.Identifier("r"), sql.Identifier("j")

    def column(side: str, name: str) -> sql.Composed:
        return sql.SQL("{}.{}").format(joined if side == "join" else row, sql.Identifier(name))

    def condition(terms: tuple[Term, ...]) -> sql.Composable:
        if not terms:
            return sql.SQL("true")
        return sql.SQL(" AND ").join(
            sql.SQL("{} {} ({})").format(
                column(t.side, t.column),
                sql.SQL("NOT IN" if t.negate else "IN"),
                sql.SQL(", ").join(sql.Literal(v) for v in t.values),
            )
            for t in terms
        )

    def measure(m: MeasurePlan) -> sql.Composed:
        if m.column is None:
            return sql.SQL("count(*) FILTER (WHERE {})").format(condition(m.where))
        return sql.SQL("coalesce(sum({}) FILTER (WHERE {}), 0)").format(column(m.side, m.column), condition(m.where))

    join: sql.Composable = sql.SQL("")
    if plan.join_table:
        assert plan.join_key is not None and plan.join_foreign_key is not None, "set with join_table (aggregates.plan)"
        join = sql.SQL(" JOIN {}.{} j ON j.{} = r.{}").format(
            sql.Identifier(schema), sql.Identifier(plan.join_table),
            sql.Identifier(plan.join_key), sql.Identifier(plan.join_foreign_key),
        )  # fmt: skip
    group = column("row", plan.group_by)
    query = "SELECT {group}, {measures} FROM {schema}.{table} r{join} WHERE {group} IS NOT NULL GROUP BY 1"
    return sql.SQL(query).format(
        group=group,
        measures=sql.SQL(", ").join(measure(m) for m in plan.measures),
        schema=sql.Identifier(schema),
        table=sql.Identifier(plan.table),
        join=join,
    )


def source_figures(conn: psycopg.Connection, plan: AggregatePlan, schema: str) -> Iterator[tuple[str, str]]:
    """(group id, figures) per non-zero group, from PostgreSQL, in the connection's read-only
    transaction (committed at the end, as `readers.source_rows` does); the caller must consume it."""
    with conn.cursor(name=f"tideline_verify_{plan.name}") as cursor:
        cursor.itersize = PAGE
        cursor.execute(oracle_query(plan, schema))
        for group, *figures in cursor:
            if any(figures):
                yield row_id([group]), figures_text(plan, figures)
    conn.commit()


def cache_figures(url: str, plan: AggregatePlan, key_prefix: str = "") -> Iterator[tuple[str, str]]:
    """(group id, figures) of every group the cache holds for the aggregate."""
    head, tail = key_prefix + plan.key_head, plan.key_tail
    try:
        with redis.Redis.from_url(url) as client:
            if plan.type == "sorted_set":
                for member, score in client.zscan_iter(head, count=1000):
                    yield member.decode(), figures_text(plan, [Decimal(repr(score))])
                return
            pattern = glob_escape(head) + "*" + glob_escape(tail)
            batch: list[bytes] = []
            for key in client.scan_iter(match=pattern, count=1000, _type="HASH"):
                batch.append(key)
                if len(batch) >= REDIS_BATCH:
                    yield from _hash_figures(client, plan, batch, len(head), len(tail))
                    batch = []
            yield from _hash_figures(client, plan, batch, len(head), len(tail))
    except redis.RedisError as exc:
        raise VerifyError(f"cannot read Redis at {url}: {exc}") from exc


def _hash_figures(
    client: redis.Redis, plan: AggregatePlan, keys: list[bytes], head: int, tail: int
) -> Iterator[tuple[str, str]]:
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.hmget(key, [m.field for m in plan.measures])
    for key, values in zip(keys, pipe.execute(), strict=True):
        if any(value is not None for value in values):  # else deleted between SCAN and HMGET
            name = key.decode()
            yield name[head : len(name) - tail], figures_text(plan, [(v or b"missing").decode() for v in values])
