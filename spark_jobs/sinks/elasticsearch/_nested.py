"""Nested views: search documents that join a root row with its parents and children.

Declared in pipeline.yaml (`nested:`), built by the search sink on the executors once a change's flat
write is done, from the sink's own version-guarded flat indices (the join state). Which documents a
change touches is computed by Spark SQL (`touches`, `touch_values`); each touched document is then read
and built whole in Python (`build` here, its Elasticsearch side in `_nested_index`): a join over the flat
indices, which only Elasticsearch holds (docs/apply.md counts this as the search sink's remaining Python
per document).
Why this stays correct for changes in any order across topics and batches: docs/sinks/elasticsearch.md,
"Nested views".

Every document lists in `tl_refs` each row it was built from, as `<table>:<row id>`, including a
parent key whose row was not there. The roots a batch affects are those whose `tl_refs` name a
changed row, plus those a changed row names itself (a root's own key, a child's join column in its
new image); each is rebuilt whole from the flat state, and written only if it differs.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from spark_jobs.changes.envelope import row_id
from spark_jobs.model.config import ChildJoin, JoinNode, NestedView, node_table
from spark_jobs.runtime.expressions import reused

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

REFS = "tl_refs"
Row = dict[str, Any]


def ref(table: str, row_id: str) -> str:
    return f"{table}:{row_id}"


# ---- which documents a change affects (pure) -----------------------------------------------------


@dataclass(frozen=True)
class Touch:
    """What one change means for one nested view: look up documents whose `tl_refs` hold `value`
    (kind "ref") or start with it (kind "prefix", a truncate), or rebuild root `value` (kind "root")."""

    view: str
    kind: str
    value: str


def _join_value(row: Row | None, column: str | None) -> str | None:
    """The row's value of a join column, as a row id; None when absent (or no column is named: the
    pipeline's checks require one on every join)."""
    if column is None:
        return None
    value = (row or {}).get(column)
    return None if value is None else row_id([value])


def touches(changes: DataFrame, views: Mapping[str, NestedView]) -> DataFrame:
    """The distinct lookups (view, kind, value) that find the documents the changes can affect. A
    changed row's own ref finds the documents it is in (renames, deletes, children moved away); a child's
    join column in its new image finds the row it now belongs to (new children); a root's key names its
    own document; a truncate finds every document holding a row of its table."""
    from pyspark.sql import functions as F

    return changes.select(F.explode(touch_array(views)).alias("t")).select("t.*").distinct()


def touch_values(views: Mapping[str, NestedView]) -> Column:
    """Every lookup of a change as a JSON object `{"view","kind","value"}` (an array, empty for most
    changes): what the real-time writer produces to the touches topic once the change is applied."""
    from pyspark.sql import functions as F

    return _lookup_array(views, F.to_json)


@reused
def touch_array(views: Mapping[str, NestedView]) -> Column:
    """Every lookup of a change, an array of (view, kind, value) structs (built once, runtime/expressions.py)."""
    return _lookup_array(views, lambda touch: touch)


def _lookup_array(views: Mapping[str, NestedView], shape: Callable[[Column], Column]) -> Column:
    """The lookups a change makes, each struct `shape`d, as an array. Those it does not make (value NULL)
    are left out by `array_compact`, not by a `filter` lambda: Spark runs a lambda interpreted, and the
    search query evaluates this for every change."""
    from pyspark.sql import functions as F

    return F.array_compact(F.array(*[F.when(value.isNotNull(), shape(_touch(view, kind, value)))
                                     for view, kind, value in _lookups(views)]))


def _lookups(views: Mapping[str, NestedView]) -> list[tuple[str, str, Column]]:
    """Every lookup a change may make: (view, kind, value), the value NULL where the change makes none."""
    from pyspark.sql import functions as F

    found: list[tuple[str, str, Column]] = []
    for name, view in views.items():
        for node, parent in nodes_with_parent(view):
            table = node_table(node)
            here = F.col("table") == table
            own = F.concat(F.lit(f"{table}:"), F.col("row_id"))
            found.append((name, "prefix", F.when(here & (F.col("op") == "t"), F.lit(f"{table}:"))))
            rows = here & (F.col("op") != "t")
            found.append((name, "ref", F.when(rows, own)))
            if isinstance(node, NestedView):
                found.append((name, "root", F.when(rows, F.col("row_id"))))
            elif isinstance(node, ChildJoin) and parent is not None:
                owner = F.when(rows, F.col("after")[node.join_column])
                found.append((name, "ref", F.concat(F.lit(f"{node_table(parent)}:"), owner)))
                if isinstance(parent, NestedView):
                    found.append((name, "root", owner))
    return found


def _touch(view: str, kind: str, value: Column) -> Column:
    from pyspark.sql import functions as F

    return F.struct(F.lit(view).alias("view"), F.lit(kind).alias("kind"), value.alias("value"))


def nodes_with_parent(view: NestedView) -> list[tuple[JoinNode, JoinNode | None]]:
    pairs: list[tuple[JoinNode, JoinNode | None]] = []

    def walk(node: JoinNode, parent: JoinNode | None) -> None:
        pairs.append((node, parent))
        for join in [*node.parents.values(), *getattr(node, "children", {}).values()]:
            walk(join, node)

    walk(view, None)
    return pairs


# ---- building documents from the flat state (pure, given a reader) -------------------------------


class FlatState(Protocol):
    """Reads the join state: the flat search indices, by table."""

    def rows(self, table: str, row_ids: list[str], columns: list[str]) -> dict[str, Row]:
        """The rows that exist among `row_ids` (absent ids are left out), with `columns` at least."""

    def referring(self, table: str, column: str, values: list[str], columns: list[str]) -> dict[str, Row]:
        """Every row of `table` whose `column` is one of `values`, by row id, with `columns` at least."""


def sort_key(row_id: str) -> tuple:
    """Children in primary-key order: a composite id is a JSON list; numbers sort as numbers."""
    try:
        parsed = json.loads(row_id)
    except ValueError:
        parsed = row_id
    values = parsed if isinstance(parsed, list) else [parsed]
    return tuple((0, v, "") if isinstance(v, (int, float)) and not isinstance(v, bool) else (1, 0, str(v))
                 for v in values)


def _fields(row: Row, fields: Iterable[str]) -> Row:
    return {field: row.get(field) for field in fields}


def _read_columns(node: JoinNode) -> list[str]:
    """What a node's rows are read for: its fields and the join columns it holds (its own, as a child,
    and those naming its parents)."""
    own = [node.join_column] if isinstance(node, ChildJoin) and node.join_column else []
    return sorted({*node.fields, *own, *(parent.join_column for parent in node.parents.values() if parent.join_column)})


def build(view: NestedView, root_ids: Iterable[str], state: FlatState) -> dict[str, Row | None]:
    """Each root's document (None if the root row is absent), with `tl_refs`, from the flat state.
    Reads level by level: one read per join for all roots together."""
    ids = sorted(set(root_ids))
    roots = state.rows(view.root, ids, _read_columns(view))
    built = _attach(view, view.root, roots, state)
    return {row_id: _finish(*built[row_id]) if row_id in built else None for row_id in ids}


def _finish(doc: Row, refs: set[str]) -> Row:
    return {**doc, REFS: sorted(refs)}


def _attach(node: JoinNode, table: str, rows: dict[str, Row], state: FlatState) -> dict[str, tuple[Row, set[str]]]:
    """The documents of `rows` (rows of `table` at `node`) with their parents and children, and refs."""
    built = {rid: (_fields(row, node.fields), {ref(table, rid)}) for rid, row in rows.items()}
    for name, parent in node.parents.items():
        wanted = {rid: _join_value(row, parent.join_column) for rid, row in rows.items()}
        found = state.rows(parent.table, sorted({v for v in wanted.values() if v is not None}), _read_columns(parent))
        parents = _attach(parent, parent.table, found, state)
        for rid, value in wanted.items():
            doc, refs = built[rid]
            doc[name] = parents[value][0] if value in parents else None
            if value is not None:
                refs.add(ref(parent.table, value))  # found or not: a late parent row finds this document
                refs |= parents[value][1] if value in parents else set()
    for name, child in getattr(node, "children", {}).items():
        found = state.referring(child.table, child.join_column, sorted(rows), _read_columns(child)) if rows else {}
        children = _attach(child, child.table, found, state)
        for rid in rows:
            built[rid][0][name] = []
        for child_id in sorted(found, key=sort_key):
            owner = _join_value(found[child_id], child.join_column)
            if owner in built:
                built[owner][0][name].append(children[child_id][0])
                built[owner][1].update(children[child_id][1])
    return built


# ---- the index mapping (pure) ---------------------------------------------------------------------


def mapping(view: NestedView, flat: Callable[[str], Mapping[str, Any]]) -> dict[str, Any]:
    """The nested index's properties: each field mapped as in its table's flat index (`flat(table)`
    gives that index's properties; a field not mapped there yet is left out until it is), parents as
    objects, children as `nested` (so a query can match one child's fields together)."""

    def properties(node: JoinNode) -> dict[str, Any]:
        known = flat(node_table(node))
        props = {field: known[field] for field in node.fields if field in known}
        for name, parent in node.parents.items():
            props[name] = {"type": "object", "properties": properties(parent)}
        for name, child in getattr(node, "children", {}).items():
            props[name] = {"type": "nested", "properties": properties(child)}
        return props

    return {**properties(view), REFS: {"type": "keyword"}}
