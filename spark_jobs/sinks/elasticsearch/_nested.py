"""Nested views: search documents that join a root row with its parents and children.

Declared in pipeline.yaml (`nested:`), built by the search sink on the executors after each
micro-batch's flat writes (a later stage of the same Spark job), from the sink's own version-guarded
flat indices (the join state). Which documents a batch touches is computed by Spark SQL (`touches`);
each touched document is then read and built whole in Python, one document at a time: a join over
the flat indices, which only Elasticsearch holds (docs/apply.md counts this as the search sink's
remaining Python per document).
Why this stays correct for changes in any order across topics and batches: docs/sinks/elasticsearch.md,
"Nested views".

Every document lists in `tl_refs` each row it was built from, as `<table>:<row id>`, including a
parent key whose row was not there. The roots a batch affects are those whose `tl_refs` name a
changed row, plus those a changed row names itself (a root's own key, a child's join column in its
new image); each is rebuilt whole from the flat state, and written only if it differs.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from elasticsearch import Elasticsearch, helpers

from spark_jobs.changes.envelope import row_id
from spark_jobs.model.config import ChildJoin, JoinNode, NestedView, PipelineConfig, node_table
from spark_jobs.runtime.expressions import reused
from spark_jobs.sinks.elasticsearch import _store
from spark_jobs.sinks.elasticsearch._store import MAX_TRIES, ElasticsearchSinkError, Stored

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import Column, DataFrame

Op = tuple[dict[str, Any], dict[str, Any] | None]  # a bulk header and its body (None for delete)

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
        for node, parent in _nodes_with_parent(view):
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


def _nodes_with_parent(view: NestedView) -> list[tuple[JoinNode, JoinNode | None]]:
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


# ---- the nested index (executors, after a batch's flat writes) ------------------------------------


def write_op(index: str, doc_id: str, body: dict[str, Any], held: Stored | None) -> Op:
    """Index `body` only if the document is still what was read (`create` if it was absent)."""
    header: dict[str, Any] = {"_index": index, "_id": doc_id}
    if held is None:
        return {"create": header}, body
    return {"index": {**header, "if_seq_no": held.seq_no, "if_primary_term": held.primary_term}}, body


def delete_op(index: str, doc_id: str, held: Stored) -> Op:
    """Delete only if the document is still what was read."""
    return {"delete": {"_index": index, "_id": doc_id, "if_seq_no": held.seq_no,
                       "if_primary_term": held.primary_term}}, None

MAX_TERMS = 10_000  # values per terms query (Elasticsearch allows 65536)


class SearchState:
    """`FlatState` over the flat indices (`target(table)`): mget for rows by id, a scan for children."""

    def __init__(self, es: Elasticsearch, target: Callable[[str], str]) -> None:
        self.es = es
        self.target = target

    def rows(self, table: str, row_ids: list[str], columns: list[str]) -> dict[str, Row]:
        if not row_ids:
            return {}
        hits = self.es.mget(index=self.target(table), ids=row_ids, source_includes=columns)["docs"]
        return {hit["_id"]: hit.get("_source") or {} for hit in hits if Stored.of(hit)}

    def referring(self, table: str, column: str, values: list[str], columns: list[str]) -> dict[str, Row]:
        found: dict[str, Row] = {}
        for start in range(0, len(values), MAX_TERMS):
            query = {"query": {"terms": {column: values[start:start + MAX_TERMS]}}, "_source": columns}
            found |= {hit["_id"]: hit["_source"]
                      for hit in helpers.scan(self.es, index=self.target(table), query=query)}
        return found


class NestedIndex:
    """Keeps one nested view's index equal to the join of the flat state, for the rows a batch touched."""

    def __init__(self, es: Elasticsearch, view: NestedView, target: str, flat_target: Callable[[str], str],
                 chunk: int = 1000) -> None:
        self.es = es
        self.view = view
        self.target = target
        self.flat_target = flat_target
        self.chunk = chunk
        self.tables = sorted({node_table(node) for node, _ in _nodes_with_parent(view)})

    def apply(self, touched: Iterable[Touch]) -> int:
        """Rebuild every document the touches reach; returns how many documents were written or deleted."""
        touched = list(touched)
        self.es.indices.refresh(index=self.target)  # the tl_refs lookup must see every earlier batch's writes
        roots = {touch.value for touch in touched if touch.kind == "root"}
        roots |= self._referencing([t.value for t in touched if t.kind == "ref"], "terms")
        roots |= self._referencing([t.value for t in touched if t.kind == "prefix"], "prefix")
        self._map_new_fields()
        ordered = sorted(roots, key=sort_key)
        return sum(self._rebuild(ordered[start:start + self.chunk]) for start in range(0, len(ordered), self.chunk))

    def _referencing(self, values: list[str], kind: str) -> set[str]:
        found: set[str] = set()
        for start in range(0, len(values), MAX_TERMS):
            part = values[start:start + MAX_TERMS]
            query = {"terms": {REFS: part}} if kind == "terms" else \
                {"bool": {"should": [{"prefix": {REFS: value}} for value in part], "minimum_should_match": 1}}
            hits = helpers.scan(self.es, index=self.target, query={"query": query, "_source": False})
            found |= {hit["_id"] for hit in hits}
        return found

    def _rebuild(self, root_ids: list[str]) -> int:
        """Read the stored documents first, then the flat state, then write each changed one guarded by
        what was read: a concurrent writer of the same index (a rebuild after its alias swap) that wrote
        in between gets a 409 here, and the document is rebuilt from state read after its write."""
        pending, written = root_ids, 0
        for _ in range(MAX_TRIES):
            if not pending:
                return written
            held = {hit["_id"]: Stored.of(hit) for hit in self.es.mget(index=self.target, ids=pending)["docs"]}
            self.es.indices.refresh(index=[self.flat_target(table) for table in self.tables])
            wanted = build(self.view, pending, SearchState(self.es, self.flat_target))
            ops = [op for row_id in pending for op in self._ops(row_id, held[row_id], wanted[row_id])]
            pending, done = self._bulk(ops)
            written += done
        raise ElasticsearchSinkError(f"nested view {self.target}: {len(pending)} documents still conflict")

    def _ops(self, row_id: str, held: Stored | None, wanted: Row | None) -> list[Op]:
        if wanted is None:
            return [delete_op(self.target, row_id, held)] if held else []
        if held is not None and held.source == wanted:
            return []  # unchanged (a replayed batch, or a change that does not show in this view)
        return [write_op(self.target, row_id, wanted, held)]

    def _bulk(self, ops: list[Op]) -> tuple[list[str], int]:
        if not ops:
            return [], 0
        body = [part for header, source in ops for part in (header, source) if part is not None]
        retry, done = [], 0
        for item in self.es.bulk(operations=body)["items"]:
            result = next(iter(item.values()))
            if result.get("error") is None or result["status"] == 404:
                done += 1
            elif result["status"] == 409:
                retry.append(result["_id"])
            else:
                raise ElasticsearchSinkError(f"nested view {self.target}: write of {result['_id']} failed "
                                             f"with {result['status']}: {result['error']}")
        return retry, done

    def _map_new_fields(self) -> None:
        """Put the mapping of fields the flat indices have mapped since (new columns flow in)."""
        flat = {table: self._properties(self.flat_target(table)) for table in self.tables}
        wanted = mapping(self.view, lambda table: flat[table])
        if _missing(self._properties(self.target), wanted):
            self.es.indices.put_mapping(index=self.target, properties=wanted)

    def _properties(self, index: str) -> dict[str, Any]:
        return next(iter(self.es.indices.get_mapping(index=index).values()))["mappings"].get("properties", {})


def _missing(have: Mapping[str, Any], want: Mapping[str, Any]) -> bool:
    """Whether `want` names a field (at any depth) that `have` lacks."""
    return any(name not in have or _missing(have[name].get("properties", {}), spec.get("properties", {}))
               for name, spec in want.items())


class NestedBuilder:
    """The mapInArrow function of the nested stage: settings only, so it pickles to executors. Each
    Arrow batch of touches (view, kind, value) rebuilds the documents they reach; it yields no rows
    (a document that cannot be written fails the batch, which is retried)."""

    def __init__(self, url: str, pipeline: PipelineConfig, flat_targets: Mapping[str, str],
                 nested_targets: Mapping[str, str], chunk: int = 1000) -> None:
        self.url = url
        self.pipeline = pipeline
        self.flat_targets = dict(flat_targets)
        self.nested_targets = dict(nested_targets)
        self.chunk = chunk

    def flat_target(self, table: str) -> str:
        search = self.pipeline.tables[table].search
        return self.flat_targets.get(table) or (search.index if search else None) or table

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa

        with _store.client(self.url) as es:
            for batch in batches:
                touched = [Touch(**item) for item in batch.to_pylist()]  # one per touched row, not per change
                for name, view in self.pipeline.nested.items():
                    mine = [touch for touch in touched if touch.view == name]
                    if mine:
                        target = self.nested_targets.get(name, name)
                        if NestedIndex(es, view, target, self.flat_target, self.chunk).apply(mine):
                            es.indices.refresh(index=target)  # searchable as soon as the batch is done
                yield pa.RecordBatch.from_pylist([], schema=pa.schema([
                    ("origin", pa.struct([("topic", pa.string()), ("partition", pa.int32()), ("offset", pa.int64())])),
                    ("error", pa.string()), ("letter_value", pa.binary())]))
