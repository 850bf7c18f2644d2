"""`tide verify` for nested views: the join recomputed in PostgreSQL, compared document by document.

PostgreSQL builds each root's document with `jsonb_build_object` and `jsonb_agg` (one query, read
through a server-side cursor); each level of both sides is canonicalised with its own table's column
types (`canonical.Canonicaliser`), and children are compared as a set (sorted by canonical text), so
only content counts.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from decimal import Decimal
from functools import partial
from typing import Any

import psycopg
from psycopg import sql
from psycopg.types.json import set_json_loads

from services.verify.canonical import Canonicaliser, TableShape, content_hash, row_doc_id
from services.verify.readers import PAGE, VerifyError, search_rows, source_shape
from spark_jobs.model.config import JoinNode, NestedView, PipelineConfig, join_nodes, node_table

KEY = "__root_key__"  # the root row's key columns, beside its document, in the SQL result


def label(name: str) -> str:
    """How a nested view shows in verify's outcomes (its index name may equal a table's name)."""
    return f"{name} (nested)"


def shapes(conn: psycopg.Connection, pipeline: PipelineConfig, view: NestedView) -> dict[str, TableShape]:
    found = {}
    for _, node, _ in join_nodes(view, ""):
        table = node_table(node)
        if table not in found:
            found[table] = source_shape(conn, pipeline.source.schema_name, table)[0]
    return found


def _single_key(shape: TableShape) -> str:
    if len(shape.key) != 1:
        raise VerifyError(f"{shape.table} has a composite primary key; a nested view joins on one-column keys")
    return shape.key[0]


def join_query(schema: str, view: NestedView, shapes: Mapping[str, TableShape]) -> sql.Composed:
    """One row per root: its key columns as a JSON object and its whole document as jsonb."""
    aliases = iter(f"t{n}" for n in range(1_000))

    def document(node: JoinNode, alias: str) -> sql.Composable:
        parts: list[sql.Composable] = []
        for field in node.fields:
            parts += [sql.Literal(field), sql.SQL("{}.{}").format(sql.Identifier(alias), sql.Identifier(field))]
        table = node_table(node)
        for name, parent in node.parents.items():
            assert parent.join_column is not None, "pipeline.yaml's validation requires a parent's join_column"
            inner = next(aliases)
            parts += [sql.Literal(name), sql.SQL("(SELECT {} FROM {}.{} {} WHERE {}.{} = {}.{})").format(
                document(parent, inner), sql.Identifier(schema), sql.Identifier(parent.table), sql.Identifier(inner),
                sql.Identifier(inner), sql.Identifier(_single_key(shapes[parent.table])),
                sql.Identifier(alias), sql.Identifier(parent.join_column))]
        for name, child in getattr(node, "children", {}).items():
            inner = next(aliases)
            parts += [sql.Literal(name), sql.SQL(
                "COALESCE((SELECT jsonb_agg({}) FROM {}.{} {} WHERE {}.{} = {}.{}), '[]'::jsonb)").format(
                document(child, inner), sql.Identifier(schema), sql.Identifier(child.table), sql.Identifier(inner),
                sql.Identifier(inner), sql.Identifier(child.join_column),
                sql.Identifier(alias), sql.Identifier(_single_key(shapes[table])))]
        return sql.SQL("jsonb_build_object({})").format(sql.SQL(", ").join(parts))

    root = next(aliases)
    key = sql.SQL(", ").join(
        part for column in shapes[view.root].key
        for part in (sql.Literal(column), sql.SQL("{}.{}").format(sql.Identifier(root), sql.Identifier(column))))
    return sql.SQL("SELECT jsonb_build_object({}), {} FROM {}.{} {}").format(
        key, document(view, root), sql.Identifier(schema), sql.Identifier(view.root), sql.Identifier(root))


def canonical(node: JoinNode, canons: Mapping[str, Canonicaliser], doc: Mapping[str, Any] | None) -> Any:
    """A document (or one level of it) in canonical form: each field typed by its table's column,
    parents recursively (None stays None), children as a list sorted by their canonical text."""
    if doc is None:
        return None
    row = canons[node_table(node)].row(doc)
    result: dict[str, Any] = {field: row[field] for field in node.fields if field in row}
    for name, parent in node.parents.items():
        result[name] = canonical(parent, canons, doc.get(name))
    for name, child in getattr(node, "children", {}).items():
        children = [canonical(child, canons, item) for item in doc.get(name) or []]
        result[name] = sorted(children, key=lambda item: json.dumps(item, sort_keys=True, default=str))
    return result


def source_pairs(conn: psycopg.Connection, schema: str, view: NestedView,
                 shapes: Mapping[str, TableShape]) -> Iterator[tuple[str, str]]:
    """(root id, content hash) of every root's join document as PostgreSQL computes it."""
    canons = {table: Canonicaliser(shape) for table, shape in shapes.items()}
    set_json_loads(partial(json.loads, parse_float=Decimal), conn)  # NUMERIC stays exact through jsonb
    with conn.cursor(name=f"tideline_verify_nested_{view.root}") as cursor:
        cursor.itersize = PAGE
        cursor.execute(join_query(schema, view, shapes))
        for key, doc in cursor:
            yield row_doc_id(shapes[view.root], key), content_hash(canonical(view, canons, doc))
    conn.commit()


def sink_pairs(
    es_url: str, index: str, view: NestedView, shapes: Mapping[str, TableShape]
) -> Iterator[tuple[str, str]]:
    """(_id, content hash) of every document in the nested index."""
    canons = {table: Canonicaliser(shape) for table, shape in shapes.items()}
    for row_id, doc in search_rows(es_url, index):
        yield row_id, content_hash(canonical(view, canons, doc))
