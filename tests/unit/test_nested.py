"""Nested views, pure parts: config validation, which documents a change affects, document assembly."""

from __future__ import annotations

import copy

import pytest
import yaml

from spark_jobs.model import config
from spark_jobs.model.config import PipelineConfig, PipelineConfigError, nested_column_errors
from spark_jobs.sinks.elasticsearch._nested import REFS, build, mapping, sort_key, touches
from tests.demo_catalogue import demo_catalogue
from tests.unit.spark_frames import change, frame

PIPELINE = config.load()
RAW = yaml.safe_load(config.DEFAULT_PATH.read_text())
VIEW = PIPELINE.nested["orders"]


def with_nested(tmp_path, edit) -> PipelineConfig:
    raw = copy.deepcopy(RAW)
    edit(raw)
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(raw))
    return config.load(path)


def items(raw: dict) -> dict:
    return raw["nested"]["orders"]["children"]["items"]


def error_of(tmp_path, edit) -> str:
    """What loading the file, then checking it against the schema (as the jobs do at start), says."""
    with pytest.raises(PipelineConfigError) as caught:
        config.check_schema(with_nested(tmp_path, edit), demo_catalogue())
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_the_demo_pipeline_declares_the_orders_view_over_flat_order_rows():
    assert VIEW.root == "orders"
    assert PIPELINE.tables["orders"].search.index == "order_rows"
    assert VIEW.parents["customer"].fields == ["id", "name", "email", "country"]
    assert VIEW.children["items"].parents["product"].fields == ["id", "name", "sku"]


def test_unknown_table_is_named_with_the_fix(tmp_path):
    message = error_of(tmp_path, lambda raw: items(raw).update(table="order_lines"))
    assert "nested.orders.children.items: unknown table order_lines" in message


def test_unknown_column_is_named_with_the_choices(tmp_path):
    message = error_of(tmp_path, lambda raw: raw["nested"]["orders"]["parents"]["customer"]["fields"].append("phone"))
    assert "nested.orders.parents.customer: customers has no column phone (columns: country, " in message
    assert "email" in message


def test_unknown_join_column_of_a_parent_names_the_referring_table(tmp_path):
    message = error_of(tmp_path,
                       lambda raw: raw["nested"]["orders"]["parents"]["customer"].update(join_column="buyer_id"))
    assert "join_column: orders has no column buyer_id" in message


def test_a_child_without_a_join_key_is_refused(tmp_path):
    message = error_of(tmp_path, lambda raw: items(raw).pop("join_column"))
    assert ("nested.orders.children.items: no join_column; "
            "name the column of order_items that holds the orders key") in message


def test_a_cycle_is_refused(tmp_path):
    def loop(raw):
        items(raw)["parents"]["order"] = {"table": "orders", "join_column": "order_id", "fields": ["id"]}

    message = error_of(tmp_path, loop)
    assert "nested.orders.children.items.parents.order: cycle, orders is already joined above" in message
    assert "(orders -> order_items -> orders)" in message


def test_a_table_without_a_search_view_is_refused(tmp_path):
    message = error_of(tmp_path, lambda raw: raw["tables"]["products"].pop("search"))
    assert "table products has no search view; add `search: {}` to tables.products" in message


def test_a_nested_index_name_may_not_be_a_flat_index(tmp_path):
    message = error_of(tmp_path, lambda raw: raw["tables"]["orders"]["search"].pop("index"))
    assert "nested.orders: the index name is also a table's search index" in message


def test_an_excluded_column_is_not_a_field():
    pipeline = PIPELINE.model_copy(update={"tables": {
        **PIPELINE.tables,
        "customers": PIPELINE.tables["customers"].model_copy(update={"exclude_columns": ["email"]})}})
    columns = {table: set(schema.columns) for table, schema in demo_catalogue().items()}
    assert any("customers has no column email" in e for e in nested_column_errors(pipeline, columns))


# ---- touches (Spark SQL) -------------------------------------------------------------------------------


def found(spark, *rows) -> set[tuple[str, str, str]]:
    return {(t["view"], t["kind"], t["value"]) for t in touches(frame(spark, list(rows)), PIPELINE.nested).collect()}


def test_a_root_change_names_its_own_document(spark):
    assert found(spark, change((1, 1), table="orders", key=7, after={"id": "7", "customer_id": "3"})) == {
        ("orders", "ref", "orders:7"), ("orders", "root", "7")}


def test_a_parent_change_finds_the_documents_that_reference_it(spark):
    assert found(spark, change((1, 1), table="customers", key=3, after={"id": "3", "name": "x"})) == {
        ("orders", "ref", "customers:3")}
    assert found(spark, change((1, 1), table="products", key=5, op="d")) == {("orders", "ref", "products:5")}


def test_a_child_names_the_root_of_its_new_image_and_is_found_where_it_was(spark):
    key = {"order_id": "7", "line_no": "2"}
    moved = change((1, 1), table="order_items", key=key, after={"order_id": "8", "line_no": "2", "product_id": "5"})
    assert found(spark, moved) == {("orders", "ref", "order_items:[7,2]"), ("orders", "ref", "orders:8"),
                                   ("orders", "root", "8")}
    assert found(spark, change((1, 1), table="order_items", key=key, op="d")) \
        == {("orders", "ref", "order_items:[7,2]")}


def test_a_truncate_finds_every_document_with_a_row_of_the_table(spark):
    assert found(spark, change((1, 1), table="customers", op="t")) == {("orders", "prefix", "customers:")}


def test_a_table_outside_every_view_touches_nothing_and_repeats_count_once(spark):
    assert found(spark, change((1, 1), table="heartbeat", key=1, after={"id": "1"})) == set()
    twice = [change((1, 1), table="customers", key=3), change((2, 1), table="customers", key=3, offset=1)]
    assert len(touches(frame(spark, twice), PIPELINE.nested).collect()) == 1


# ---- assembly ---------------------------------------------------------------------------------------


class Rows:
    """A flat state in memory: {table: {row id: row}}."""

    def __init__(self, tables: dict[str, dict[str, dict]]) -> None:
        self.tables = tables
        self.reads = 0

    def rows(self, table, row_ids, columns):
        self.reads += 1
        found = self.tables.get(table, {})
        return {i: _only(found[i], columns) for i in row_ids if i in found}

    def referring(self, table, column, values, columns):
        self.reads += 1
        return {i: _only(r, columns) for i, r in self.tables.get(table, {}).items() if str(r.get(column)) in values}


def _only(row: dict, columns: list[str]) -> dict:
    """As Elasticsearch's source filtering returns it: the columns asked for that the row has."""
    return {name: value for name, value in row.items() if name in columns}


ORDER = {"id": 7, "customer_id": 3, "status": "paid", "total": "12.50", "created_at": "t0", "updated_at": "t1",
         "tl_version_major": 9}


def item(order_id: int, line: int, product: int | None) -> dict:
    return {"order_id": order_id, "line_no": line, "product_id": product, "quantity": 1, "unit_price": "1.00"}


def test_a_document_holds_the_order_its_customer_and_items_in_key_order_with_refs():
    state = Rows({
        "orders": {"7": ORDER},
        "customers": {"3": {"id": 3, "name": "Ann", "email": "a@x", "country": "NL", "created_at": "t"}},
        "order_items": {"[7,10]": item(7, 10, 5), "[7,2]": item(7, 2, 6), "[8,1]": item(8, 1, 5)},
        "products": {"5": {"id": 5, "name": "Mug", "sku": "M", "price": "3.00"}},
    })
    doc = build(VIEW, ["7"], state)["7"]
    assert doc == {
        "id": 7, "status": "paid", "total": "12.50", "created_at": "t0", "updated_at": "t1",
        "customer": {"id": 3, "name": "Ann", "email": "a@x", "country": "NL"},
        "items": [
            {"line_no": 2, "quantity": 1, "unit_price": "1.00", "product": None},  # product 6 not arrived yet
            {"line_no": 10, "quantity": 1, "unit_price": "1.00", "product": {"id": 5, "name": "Mug", "sku": "M"}},
        ],
        REFS: ["customers:3", "order_items:[7,10]", "order_items:[7,2]", "orders:7", "products:5", "products:6"],
    }
    assert state.reads == 4  # orders, customers, order_items, products: one read per join for all roots


def test_a_missing_root_has_no_document_and_a_missing_parent_is_null_but_referenced():
    state = Rows({"orders": {"7": ORDER}})
    docs = build(VIEW, ["7", "9"], state)
    assert docs["9"] is None
    assert docs["7"]["customer"] is None and docs["7"]["items"] == []
    assert docs["7"][REFS] == ["customers:3", "orders:7"]


def test_children_sort_by_key_numbers_as_numbers():
    assert sorted(["[7,10]", "[7,2]", "[10,1]"], key=sort_key) == ["[7,2]", "[7,10]", "[10,1]"]
    assert sorted(["b", "a", "10", "9"], key=sort_key) == ["9", "10", "a", "b"]


def test_the_mapping_follows_the_flat_indices_with_children_nested():
    flat = {"orders": {"id": {"type": "long"}, "status": {"type": "keyword"}},
            "customers": {"name": {"type": "text"}}, "order_items": {}, "products": {"sku": {"type": "keyword"}}}
    assert mapping(VIEW, flat.__getitem__) == {
        "id": {"type": "long"}, "status": {"type": "keyword"},
        "customer": {"type": "object", "properties": {"name": {"type": "text"}}},
        "items": {"type": "nested", "properties": {
            "product": {"type": "object", "properties": {"sku": {"type": "keyword"}}}}},
        REFS: {"type": "keyword"},
    }


# ---- verify: canonical documents and the SQL join ------------------------------------------------------

from decimal import Decimal  # noqa: E402

from services.verify.canonical import Canonicaliser, Column, TableShape  # noqa: E402
from services.verify.nested import canonical, join_query  # noqa: E402

SHAPES = {
    "orders": TableShape("public", "orders", (Column("id", "int8"), Column("customer_id", "int8"),
                                              Column("status", "order_status"), Column("total", "numeric", scale=2),
                                              Column("created_at", "timestamptz"), Column("updated_at", "timestamptz")),
                         ("id",)),
    "customers": TableShape("public", "customers", (Column("id", "int8"), Column("name", "text"),
                                                    Column("email", "text"), Column("country", "bpchar")), ("id",)),
    "order_items": TableShape("public", "order_items", (Column("order_id", "int8"), Column("line_no", "int4"),
                                                        Column("product_id", "int8"), Column("quantity", "int4"),
                                                        Column("unit_price", "numeric", scale=2)),
                              ("order_id", "line_no")),
    "products": TableShape("public", "products", (Column("id", "int8"), Column("name", "text"),
                                                  Column("sku", "text")), ("id",)),
}
CANONS = {table: Canonicaliser(shape) for table, shape in SHAPES.items()}


def test_a_search_document_and_the_sql_join_of_the_same_rows_are_canonically_equal():
    from_search = {"id": 7, "status": "paid", "total": "12.50", "created_at": "2026-01-02T03:04:05.000001Z",
                   "updated_at": None, "customer": {"id": 3, "name": "Ann", "email": "a@x", "country": "NL"},
                   "items": [{"line_no": 1, "quantity": 2, "unit_price": "1.00", "product": None},
                             {"line_no": 2, "quantity": 1, "unit_price": "3.10",
                              "product": {"id": 5, "name": "Mug", "sku": "M"}}],
                   REFS: ["orders:7"]}
    from_sql = {"id": 7, "status": "paid", "total": Decimal("12.5"), "created_at": "2026-01-02T03:04:05.000001+00:00",
                "updated_at": None, "customer": {"id": 3, "name": "Ann", "email": "a@x", "country": "NL"},
                "items": [{"line_no": 2, "quantity": 1, "unit_price": Decimal("3.1"),
                           "product": {"id": 5, "name": "Mug", "sku": "M"}},
                          {"line_no": 1, "quantity": 2, "unit_price": Decimal("1.00"), "product": None}]}
    assert canonical(VIEW, CANONS, from_search) == canonical(VIEW, CANONS, from_sql)
    renamed = {**from_sql, "customer": {**from_sql["customer"], "name": "Bo"}}
    assert canonical(VIEW, CANONS, from_search) != canonical(VIEW, CANONS, renamed)
    assert canonical(VIEW, CANONS, {**from_search, "items": from_search["items"][:1]}) != \
        canonical(VIEW, CANONS, from_sql)


def test_the_sql_join_nests_parents_as_objects_and_children_as_aggregates():
    text = join_query("public", VIEW, SHAPES).as_string(None)
    assert text.startswith("SELECT jsonb_build_object('id', \"t0\".\"id\"), jsonb_build_object('id', \"t0\".\"id\"")
    assert "(SELECT jsonb_build_object('id', \"t1\".\"id\", 'name', \"t1\".\"name\"" in text
    assert "FROM \"public\".\"customers\" \"t1\" WHERE \"t1\".\"id\" = \"t0\".\"customer_id\")" in text
    assert "COALESCE((SELECT jsonb_agg(jsonb_build_object('line_no'" in text
    assert "WHERE \"t2\".\"order_id\" = \"t0\".\"id\"), '[]'::jsonb)" in text
    assert "\"t3\".\"id\" = \"t2\".\"product_id\"" in text
