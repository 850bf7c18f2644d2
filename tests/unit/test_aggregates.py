"""Cache aggregates: the declaration's checks (one-line errors at start-up), its resolved form,
what the scripts are given, and the SQL oracle verify runs. The maintenance itself runs in Redis
(Lua), so it is tested against a real Redis in tests/integration/test_sink_redis.py."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path

import pytest
import yaml

from services.verify.aggregates import figures_text, oracle_query
from spark_jobs.model import config
from spark_jobs.model.config import PipelineConfigError
from spark_jobs.sinks.redis._scripts import aggregate_spec, row_scripts
from tests.demo_catalogue import demo_catalogue

SHIPPED = yaml.safe_load(config.DEFAULT_PATH.read_text())


def pipeline_file(tmp_path: Path, aggregates: dict, tables: dict | None = None) -> Path:
    raw = {**SHIPPED, "cache_aggregates": aggregates}
    if tables is not None:
        raw["tables"] = tables
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def units_sold(**changes) -> dict:
    base = {
        "table": "order_items", "join": {"table": "orders", "foreign_key": "order_id"}, "group_by": "product_id",
        "type": "sorted_set", "key": "top:units",
        "measures": {"units": {"sum": "quantity", "where": {"orders.status": {"not_in": ["cancelled"]}}}},
    }  # fmt: skip
    return {"units": {**base, **changes}}


def error(tmp_path: Path, aggregates: dict, tables: dict | None = None) -> str:
    """What `tide jobs start` (and the jobs) say of the declaration, checked against the schema."""
    path = pipeline_file(tmp_path, aggregates, tables)
    with pytest.raises(PipelineConfigError) as caught:
        config.check_schema(config.load(path), demo_catalogue(), path)
    message = str(caught.value)
    assert "\n" not in message, "one line"
    assert message.startswith(str(tmp_path / "pipeline.yaml")), "names the file"
    return message


def test_the_shipped_declaration_resolves_to_exact_scales_and_the_join_key():
    stats, top = config.load().aggregate_plans(demo_catalogue())
    assert (stats.name, stats.table, stats.group_by, stats.key("42")) \
        == ("customer_stats", "orders", "customer_id", "customer:42:stats")
    assert [(m.field, m.column, m.scale) for m in stats.measures] \
        == [("order_count", None, 0), ("paid_total", "total", 2)]
    assert stats.measures[1].where[0].values == ("paid", "shipped")
    assert (top.join_table, top.join_foreign_key, top.join_key, top.key()) \
        == ("orders", "order_id", "id", "top_products:units_sold")
    assert top.measures[0].where[0].side == "join" and top.measures[0].where[0].negate


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"table": "invoices"}, "cache_aggregates.units.table: unknown table invoices (tables: "),
        ({"group_by": "sku"},
         "cache_aggregates.units.group_by: order_items has no column sku (columns: line_no, order_id, "),
        ({"join": {"table": "orders", "foreign_key": "order_no"}},
         "cache_aggregates.units.join.foreign_key: order_items has no column order_no (columns: "),
        ({"join": {"table": "order_items", "foreign_key": "order_id"}},
         "cache_aggregates.units.join.table: order_items joins itself: a cycle"),
        ({"measures": {"units": {"sum": "orders.qty"}}},
         "cache_aggregates.units.measures.units.sum: orders has no column qty (columns: "),
        ({"measures": {"units": {"sum": "customers.id"}}}, "customers is not the joined table"),
        ({"measures": {"units": {"count": True, "where": {"orders.status": {"in": ["payed"]}}}}},
         "measures.units.where.orders.status: payed not among pending, paid, shipped, cancelled"),
        ({"measures": {"units": {"sum": "unit_price"}}},
         "a sorted set has one measure, a count or a sum of an integer column"),
        ({"measures": {"units": {"sum": "orders.status"}}}, "orders.status is not an integer or numeric(p,s) column"),
        ({"key": "top:{product_id}"}, "cache_aggregates.units.key: a sorted set is one key"),
        ({"type": "hash", "key": "top:units"}, "a hash aggregate's key needs {product_id} once"),
        ({"type": "hash", "key": "orders:{product_id}"}, "would mix with the cached rows of orders"),
        ({"key": "tideline:top"}, "tideline: keys are the sink's own bookkeeping"),
        ({"measures": {"units": {"count": True, "sum": "quantity"}}},
         "give exactly one of `count: true` or `sum: <column>`"),
        ({"where": {"quantity": {"in": [1], "not_in": [2]}}}, "give exactly one of `in` or `not_in`"),
    ],
)
def test_a_wrong_declaration_is_a_one_line_error_naming_where_and_what(tmp_path, changes, expected):
    assert expected in error(tmp_path, units_sold(**changes))


def test_an_aggregate_over_a_table_without_a_cache_view_says_how_to_add_one(tmp_path):
    orders = {view: spec for view, spec in SHIPPED["tables"]["orders"].items() if view != "cache"}
    tables = {**SHIPPED["tables"], "orders": orders}
    assert "join.table: table orders has no cache view: add `cache: {}` to tables.orders" \
        in error(tmp_path, units_sold(), tables)


def test_two_aggregates_on_one_key_are_refused(tmp_path):
    twice = {**units_sold(), "units_again": units_sold()["units"]}
    assert "cache_aggregates.units_again.key: the same key as an earlier aggregate" in error(tmp_path, twice)


def test_the_scripts_get_condition_values_as_the_rows_store_them_and_no_nulls():
    spec = aggregate_spec(config.load().aggregate_plans(demo_catalogue()), "p:")
    stats, top = spec["aggregates"]
    assert stats["measures"][1]["where"][0]["values"] == ["paid", "shipped"], "the text the row hashes hold"
    assert "column" not in stats["measures"][0] and "join" not in stats
    assert top["join"] == {"table": "orders", "column": "order_id"}
    assert spec["edges"] == [{"table": "order_items", "column": "order_id"}]
    assert spec["tracked"] == {"orders": True, "order_items": True} and spec["prefix"] == "p:"
    assert "null" not in json.dumps(spec)
    apply, _prune = row_scripts(spec)
    assert apply.sha != row_scripts(aggregate_spec([], "p:"))[0].sha, "the declaration is part of the script"


def test_the_oracle_is_the_definition_in_sql():
    stats, top = config.load().aggregate_plans(demo_catalogue())
    assert oracle_query(stats, "public").as_string(None) == (
        'SELECT "r"."customer_id", count(*) FILTER (WHERE true), '
        """coalesce(sum("r"."total") FILTER (WHERE "r"."status" IN ('paid', 'shipped')), 0) """
        'FROM "public"."orders" r WHERE "r"."customer_id" IS NOT NULL GROUP BY 1'
    )
    assert oracle_query(top, "public").as_string(None) == (
        'SELECT "r"."product_id", '
        """coalesce(sum("r"."quantity") FILTER (WHERE "j"."status" NOT IN ('cancelled')), 0) """
        'FROM "public"."order_items" r JOIN "public"."orders" j ON j."id" = r."order_id" '
        'WHERE "r"."product_id" IS NOT NULL GROUP BY 1'
    )


def test_figures_compare_as_exact_text_whichever_store_they_come_from():
    stats, top = config.load().aggregate_plans(demo_catalogue())
    from_sql = figures_text(stats, [3, Decimal("129.9")])
    assert from_sql == figures_text(stats, ["3", "129.90"]) == '{"order_count": "3", "paid_total": "129.90"}'
    assert figures_text(stats, ["3", "129.91"]) != from_sql
    assert figures_text(top, [Decimal(repr(7.0))]) == figures_text(top, [7]) == '{"units_sold": "7"}'
    assert "unreadable" in figures_text(top, ["missing"])
