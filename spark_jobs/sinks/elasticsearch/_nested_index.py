"""A nested view's index kept equal to the join of the flat indices (spark_jobs/sinks/elasticsearch/_nested.py
says what a view is, which documents a change touches and how one is built). Runs on the executors: in
the micro-batch path after the batch's flat writes (a later stage of the same job); in Real-Time Mode in
the follow-up query's tasks, after the driver has prepared the indices once for the batch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from elasticsearch import Elasticsearch, helpers

from spark_jobs.model.config import NestedView, PipelineConfig, node_table
from spark_jobs.sinks.elasticsearch import _store
from spark_jobs.sinks.elasticsearch._nested import REFS, Row, Touch, build, mapping, nodes_with_parent, sort_key
from spark_jobs.sinks.elasticsearch._store import MAX_TRIES, ElasticsearchSinkError, Stored

if TYPE_CHECKING:
    import pyarrow as pa

Op = tuple[dict[str, Any], dict[str, Any] | None]  # a bulk header and its body (None for delete)


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
ONE_SEARCH_VALUES = 1000  # a lookup of at most this many values tries one search first ...
ONE_SEARCH_HITS = 10_000  # ... of this many hits (Elasticsearch's index.max_result_window)


def every_hit(es: Elasticsearch, index: str, query: dict[str, Any], columns: list[str] | None,
              values: int) -> list[dict[str, Any]]:
    """Every hit of `query` (a lookup of `values` values, each finding a document or a few), with `columns`
    of its source (None: ids only). A scroll costs Elasticsearch a search context and a request per page
    and one to close it, so a lookup of few values (a small batch's) is one search; a lookup finding more
    than that search holds, or of more values than that (a backlog's batch), scrolls."""
    source: bool | dict[str, Any] = False if columns is None else {"includes": columns}
    if values <= ONE_SEARCH_VALUES:
        found = es.search(index=index, query=query, source=source, size=ONE_SEARCH_HITS,
                          track_total_hits=ONE_SEARCH_HITS + 1)["hits"]
        if found["total"]["value"] <= ONE_SEARCH_HITS:
            return list(found["hits"])
    return list(helpers.scan(es, index=index, query={"query": query, "_source": source}))


def lookup(es: Elasticsearch, index: str, values: list[str], query: Callable[[list[str]], dict[str, Any]],
           columns: list[str] | None) -> list[dict[str, Any]]:
    """Every hit of `query(part)` for each part of `values` of at most MAX_TERMS (`every_hit`)."""
    parts = [values[start:start + MAX_TERMS] for start in range(0, len(values), MAX_TERMS)]
    return [hit for part in parts for hit in every_hit(es, index, query(part), columns, len(part))]


class SearchState:
    """`FlatState` over the flat indices (`target(table)`): mget for rows by id, a search for children."""

    def __init__(self, es: Elasticsearch, target: Callable[[str], str]) -> None:
        self.es = es
        self.target = target

    def rows(self, table: str, row_ids: list[str], columns: list[str]) -> dict[str, Row]:
        if not row_ids:
            return {}
        hits = self.es.mget(index=self.target(table), ids=row_ids, source_includes=columns)["docs"]
        return {hit["_id"]: hit.get("_source") or {} for hit in hits if Stored.of(hit)}

    def referring(self, table: str, column: str, values: list[str], columns: list[str]) -> dict[str, Row]:
        hits = lookup(self.es, self.target(table), values, lambda part: {"terms": {column: part}}, columns)
        return {hit["_id"]: hit["_source"] for hit in hits}


class NestedIndex:
    """Keeps one nested view's index equal to the join of the flat state, for the rows a batch touched.
    `prepared`: the caller ran `prepare` after the flat writes the touches follow (the follow-up query's
    driver, once per batch), so `apply` does not again."""

    def __init__(self, es: Elasticsearch, view: NestedView, target: str, flat_target: Callable[[str], str],
                 chunk: int = 1000, prepared: bool = False) -> None:
        self.es = es
        self.view = view
        self.target = target
        self.flat_target = flat_target
        self.chunk = chunk
        self.prepared = prepared
        self.tables = sorted({node_table(node) for node, _ in nodes_with_parent(view)})

    def prepare(self) -> None:
        """Make the lookups see every write acknowledged so far (earlier batches' documents for the `tl_refs`
        lookup, the flat rows for the joins: one refresh of them all) and map the fields the flat indices
        have mapped since. Elasticsearch runs refreshes on one thread here, shared with the writers'."""
        self.es.indices.refresh(index=[self.target, *self._flat_indices()])
        self._map_new_fields()

    def apply(self, touched: Iterable[Touch]) -> int:
        """Rebuild every document the touches reach; returns how many documents were written or deleted."""
        touched = list(touched)
        if not self.prepared:
            self.prepare()
        roots = {touch.value for touch in touched if touch.kind == "root"}
        roots |= self._referencing([t.value for t in touched if t.kind == "ref"], "terms")
        roots |= self._referencing([t.value for t in touched if t.kind == "prefix"], "prefix")
        ordered = sorted(roots, key=sort_key)
        return sum(self._rebuild(ordered[start:start + self.chunk]) for start in range(0, len(ordered), self.chunk))

    def _flat_indices(self) -> list[str]:
        return [self.flat_target(table) for table in self.tables]

    def _referencing(self, values: list[str], kind: str) -> set[str]:
        def query(part: list[str]) -> dict[str, Any]:
            if kind == "terms":
                return {"terms": {REFS: part}}
            return {"bool": {"should": [{"prefix": {REFS: value}} for value in part], "minimum_should_match": 1}}

        return {hit["_id"] for hit in lookup(self.es, self.target, values, query, None)}

    def _rebuild(self, root_ids: list[str]) -> int:
        """Read the stored documents first, then the flat state, then write each changed one guarded by
        what was read: a concurrent writer of the same index (a rebuild after its alias swap) that wrote
        in between gets a 409 here, and the document is rebuilt from state read after its write."""
        pending, written = root_ids, 0
        for attempt in range(MAX_TRIES):
            if not pending:
                return written
            held = {hit["_id"]: Stored.of(hit) for hit in self.es.mget(index=self.target, ids=pending)["docs"]}
            if attempt:  # the conflicting writer read flat rows written after `prepare`
                self.es.indices.refresh(index=self._flat_indices())
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
                 nested_targets: Mapping[str, str], chunk: int = 1000, prepared: bool = False) -> None:
        self.url = url
        self.pipeline = pipeline
        self.flat_targets = dict(flat_targets)
        self.nested_targets = dict(nested_targets)
        self.chunk = chunk
        self.prepared = prepared  # see NestedIndex; then the documents written show at the next scheduled refresh

    def flat_target(self, table: str) -> str:
        search = self.pipeline.tables[table].search
        return self.flat_targets.get(table) or (search.index if search else None) or table

    def index(self, es: Elasticsearch, name: str) -> NestedIndex:
        view = self.pipeline.nested[name]
        return NestedIndex(es, view, self.nested_targets.get(name, name), self.flat_target, self.chunk, self.prepared)

    def prepare(self, es: Elasticsearch) -> None:
        """`NestedIndex.prepare` for every view (on the driver, before a batch whose flat writes are done)."""
        for name in self.pipeline.nested:
            self.index(es, name).prepare()

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa

        with _store.client(self.url) as es:
            for batch in batches:
                touched = [Touch(**item) for item in batch.to_pylist()]  # one per touched row, not per change
                for name in self.pipeline.nested:
                    mine = [touch for touch in touched if touch.view == name]
                    if mine:
                        nested = self.index(es, name)
                        if nested.apply(mine) and not self.prepared:
                            es.indices.refresh(index=nested.target)  # searchable as soon as the batch is done
                yield pa.RecordBatch.from_pylist([], schema=pa.schema([
                    ("origin", pa.struct([("topic", pa.string()), ("partition", pa.int32()), ("offset", pa.int64())])),
                    ("error", pa.string()), ("letter_value", pa.binary())]))
