"""The executor side of the search sink: Arrow batches of ready JSON → guarded bulk writes.

Per chunk of rows: one `_mget` of the rows' documents, tombstones and watermarks (its body joined
from the rows' prebuilt fragments), parsed by Arrow's JSON reader; the version guard decided with
Arrow compute kernels over whole columns; one `_bulk` of the lines that follow from it (again
joined from prebuilt fragments), whose response Arrow reads too. A 409 (someone wrote the row in
between) sends that row round again; a 400 rejects it. Python holds columns and bytes, not rows.

Two rare cases are decided per row in Python, on the rows that need it only: an update that must keep
stored columns of a table with json columns (an `update` would merge a json object field by field
instead of replacing it, so the stored columns are read and the whole document written), and a
primary-key move (the moved delete keeps the row's image in its tombstone; the create of the new key
takes its unchanged-TOAST columns from the old row or that image).
"""

from __future__ import annotations

import functools
import io
import json
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pajson

from spark_jobs.sinks.base import VERSION_MAJOR, VERSION_MINOR
from spark_jobs.sinks.elasticsearch import _store
from spark_jobs.sinks.elasticsearch._documents import TOMBSTONES, WATERMARKS
from spark_jobs.sinks.elasticsearch._store import MAX_TRIES, ElasticsearchSinkError, Version
from spark_jobs.sinks.shipping import joined, rejected

_VERSION = pa.struct([pa.field(VERSION_MAJOR, pa.int64()), pa.field(VERSION_MINOR, pa.int64())])
_ERROR = pa.struct([pa.field("type", pa.string()), pa.field("reason", pa.string())])
_MGET = pa.schema([pa.field("docs", pa.list_(pa.struct([
    pa.field("found", pa.bool_()), pa.field("_seq_no", pa.int64()), pa.field("_primary_term", pa.int64()),
    pa.field("_source", _VERSION), pa.field("error", _ERROR),
])))])
_ITEM = pa.struct([pa.field("status", pa.int64()), pa.field("error", _ERROR)])
_BULK = pa.schema([pa.field("items", pa.list_(pa.struct([pa.field(op, _ITEM)
                                                          for op in ("create", "index", "update", "delete")])))])
_MGET_FILTER = "docs.found,docs._seq_no,docs._primary_term,docs._source,docs.error"
_BULK_FILTER = "items.*.status,items.*.error.type,items.*.error.reason"


class Shipper:
    """Settings only, so it pickles to executors; `__call__` is the mapInArrow function."""

    def __init__(self, url: str, chunk_rows: int = 1000) -> None:
        self.url = url
        self.chunk_rows = chunk_rows

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        written: set[str] = set()
        http = _http(self.url)
        with _store.client(self.url) as es:
            for batch in batches:
                written |= set(pc.unique(batch.column("target")).drop_null().to_pylist())
                yield self.ship(es, http, batch)
            if written:
                # Searchable as soon as the batch is done, not at the next periodic refresh (freshness).
                es.indices.refresh(index=sorted(written), ignore_unavailable=True)

    def ship(self, es: Any, http: httpx.Client, batch: pa.RecordBatch) -> pa.RecordBatch:
        op = batch.column("op")
        truncates = batch.filter(pc.equal(op, "t"))
        for index in range(truncates.num_rows):  # a handful at most per batch
            version = truncates.column("version")[index].as_py()
            _store.truncate(es, truncates.column("alias")[index].as_py(), truncates.column("target")[index].as_py(),
                            (version["major"], version["minor"]))
        rows = batch.filter(pc.and_(pc.not_equal(op, "t"), pc.is_null(batch.column("error"))))
        refused = batch.filter(pc.is_valid(batch.column("error")))
        reasons: dict[int, str] = {}
        for start in range(0, rows.num_rows, self.chunk_rows):
            chunk = rows.slice(start, self.chunk_rows)
            reasons |= {start + i: reason for i, reason in Chunk(es, http, chunk).apply().items()}
        return rejected(refused, rows, reasons)


@functools.cache
def _http(url: str) -> httpx.Client:
    """One HTTP client per worker process and URL, kept: making one loads the CA bundle (23 ms of a core,
    measured), and a reused Python worker ships many tasks."""
    return httpx.Client(base_url=url, timeout=120)


def _post(http: httpx.Client, path: str, body: bytes, content_type: str, filter_path: str) -> bytes:
    response = http.post(path, content=body, headers={"content-type": content_type},
                         params={"filter_path": filter_path})
    if response.status_code >= 300:
        raise ElasticsearchSinkError(f"{path} answered {response.status_code}: {response.text[:300]}")
    return response.content


def _read_json(body: bytes, schema: pa.Schema) -> pa.Table:
    options = pajson.ReadOptions(block_size=max(1 << 20, 2 * len(body)))
    parse = pajson.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
    return pajson.read_json(io.BytesIO(body), read_options=options, parse_options=parse)


def _above(a: tuple[pa.Array, pa.Array], b: tuple[pa.Array, pa.Array]) -> pa.Array:
    """Per row: version a > version b, lexicographically."""
    return pc.or_(pc.greater(a[0], b[0]), pc.and_(pc.equal(a[0], b[0]), pc.greater(a[1], b[1])))


def _highest(a: tuple[pa.Array, pa.Array], b: tuple[pa.Array, pa.Array]) -> tuple[pa.Array, pa.Array]:
    higher = _above(a, b)
    return pc.if_else(higher, a[0], b[0]), pc.if_else(higher, a[1], b[1])


def _text(values: pa.Array) -> pa.Array:
    return pc.cast(values, pa.string())


class Chunk:
    """One chunk of rows (≤ chunk_rows), applied with compare-and-set until every row is decided."""

    def __init__(self, es: Any, http: httpx.Client, rows: pa.RecordBatch) -> None:
        self.es, self.http, self.rows = es, http, rows
        version = rows.column("version")
        self.incoming = (pc.struct_field(version, [0]), pc.struct_field(version, [1]))

    def apply(self) -> dict[int, str]:
        """{row index: reason} of the rows refused; raises if rows still conflict after MAX_TRIES."""
        pending = np.arange(self.rows.num_rows)
        reasons: dict[int, str] = {}
        first_seen: dict[str, Version | None] | None = None
        pairs = pc.unique(pc.binary_join_element_wise(self.rows.column("alias"), self.rows.column("target"), "\u0000"))
        targets = dict(pair.split("\u0000", 1) for pair in pairs.to_pylist())  # a few aliases per chunk
        for _ in range(MAX_TRIES):
            if not len(pending):
                break
            seen, lines, owners, deletes = self.decide(pending)
            first_seen = first_seen or seen
            retry, refused = self.bulk(lines, owners, deletes)
            reasons |= refused
            pending = np.array(sorted(set(retry) - set(refused)), dtype=np.int64)
        if len(pending):
            raise ElasticsearchSinkError(f"{len(pending)} rows still conflict after {MAX_TRIES} tries")
        if first_seen is not None:
            _store.sweep_if_truncated_meanwhile(self.es, targets, first_seen)
        return reasons

    # ---- read --------------------------------------------------------------------------------------

    def read(self, rows: pa.RecordBatch) -> tuple[dict[str, Version | None], pa.StructArray]:
        """The aliases' watermarks, then each row's document and tombstone (docs[2i], docs[2i + 1])."""
        aliases = sorted(set(rows.column("alias").to_pylist()))
        marks = "".join(f'{{"_index":"{WATERMARKS}","_id":{json.dumps(a)},'
                        f'"_source":["{VERSION_MAJOR}","{VERSION_MINOR}"]}},'
                        for a in aliases).encode()
        body = b'{"docs":[' + marks + bytes(joined(rows.column("mget_pair")))[:-1] + b"]}"
        docs = _read_json(_post(self.http, "/_mget", body, "application/json", _MGET_FILTER), _MGET).column("docs")
        docs = pc.list_flatten(docs).combine_chunks() if isinstance(docs, pa.ChunkedArray) else pc.list_flatten(docs)
        errors = pc.drop_null(pc.struct_field(docs, [4, 1]))
        if len(errors):
            raise ElasticsearchSinkError(f"cannot read documents: {errors[0]}")
        head = docs.slice(0, len(aliases)).to_pylist()  # one per alias, as Elasticsearch answers (not checked)
        held = {alias: (int(hit["_source"][VERSION_MAJOR] or 0), int(hit["_source"][VERSION_MINOR] or 0))
                if hit["found"] else None for alias, hit in zip(aliases, head, strict=False)}
        return held, docs.slice(len(aliases))

    # ---- decide ------------------------------------------------------------------------------------

    def decide(self, pending: np.ndarray
               ) -> tuple[dict[str, Version | None], list[pa.Array], list[np.ndarray], list[bool]]:
        """Read the pending rows' stored state and turn it into bulk lines: (watermarks seen, groups of
        lines, the row index of each line per group, whether each group deletes documents)."""
        rows = self.rows.take(pa.array(pending))
        marks, stored = self.read(rows)
        docs = stored.take(pa.array(np.arange(0, 2 * rows.num_rows, 2)))
        tombs = stored.take(pa.array(np.arange(1, 2 * rows.num_rows, 2)))
        state = _State(rows, docs, tombs, marks, (pc.take(self.incoming[0], pa.array(pending)),
                                                  pc.take(self.incoming[1], pa.array(pending))))
        groups = state.lines()
        lines = [group for group, _, _ in groups]
        owners = [pending[index] for _, index, _ in groups]
        deletes = [delete for _, _, delete in groups]
        rare = state.rare()
        if len(rare):
            for rare_lines, rare_owners, delete in _rare_lines(self.es, rows, rare):
                lines.append(rare_lines)
                owners.append(pending[rare_owners])
                deletes.append(delete)
        return marks, lines, owners, deletes

    # ---- write -------------------------------------------------------------------------------------

    def bulk(self, lines: list[pa.Array], owners: list[np.ndarray], deletes: list[bool]
             ) -> tuple[list[int], dict[int, str]]:
        """Send the lines; the rows to read again (409, or a document gone before its update) and those
        Elasticsearch refused (400). A delete of a document already gone (404) is done."""
        sent = [i for i, group in enumerate(lines) if len(group)]
        if not sent:
            return [], {}
        body = b"".join(bytes(joined(lines[i])) for i in sent)
        owner = np.concatenate([owners[i] for i in sent])
        deleting = np.concatenate([np.full(len(owners[i]), deletes[i]) for i in sent])
        answer = _post(self.http, "/_bulk", body, "application/x-ndjson", _BULK_FILTER)
        items = _read_json(answer, _BULK).column("items")
        items = pc.list_flatten(items.combine_chunks() if isinstance(items, pa.ChunkedArray) else items)
        status = pc.coalesce(*(pc.struct_field(items, [i, 0]) for i in range(4))).to_numpy(zero_copy_only=False)
        conflict = owner[(status == 409) | ((status == 404) & ~deleting)].tolist()
        bad = np.flatnonzero(status == 400)
        refused: dict[int, str] = {}
        if len(bad):
            errors = pc.coalesce(*(pc.struct_field(items, [i, 1]) for i in range(4))).take(pa.array(bad)).to_pylist()
            refused = {int(owner[i]): f"elasticsearch {e['type']}: {e['reason']}"
                       for i, e in zip(bad, errors, strict=True)}  # errors taken at `bad`
        failed = np.flatnonzero((status >= 300) & ~np.isin(status, (400, 404, 409)))
        if len(failed):
            error = pc.coalesce(*(pc.struct_field(items, [i, 1]) for i in range(4)))[int(failed[0])]
            raise ElasticsearchSinkError(f"bulk item failed with {int(status[failed[0]])}: {error}")
        return conflict, refused


class _State:
    """The pending rows beside what was read for them: whole columns, decided at once."""

    def __init__(self, rows: pa.RecordBatch, docs: pa.StructArray, tombs: pa.StructArray,
                 marks: dict[str, Version | None], incoming: tuple[pa.Array, pa.Array]) -> None:
        self.rows = rows
        self.col = rows.column
        zero = pa.scalar(0, pa.int64())
        self.found = pc.fill_null(pc.struct_field(docs, [0]), False)
        self.doc = (pc.fill_null(pc.struct_field(docs, [3, 0]), zero),
                    pc.fill_null(pc.struct_field(docs, [3, 1]), zero))
        self.seq, self.term = _text(pc.struct_field(docs, [1])), _text(pc.struct_field(docs, [2]))
        self.tomb_found = pc.fill_null(pc.struct_field(tombs, [0]), False)
        tomb = (pc.fill_null(pc.struct_field(tombs, [3, 0]), zero), pc.fill_null(pc.struct_field(tombs, [3, 1]), zero))
        self.tomb_seq, self.tomb_term = _text(pc.struct_field(tombs, [1])), _text(pc.struct_field(tombs, [2]))
        alias = self.col("alias")
        mark_major = mark_minor = pa.nulls(rows.num_rows, pa.int64())
        for name, version in marks.items():
            if version is not None:
                here = pc.equal(alias, name)
                mark_major, mark_minor = (pc.if_else(here, version[0], mark_major),
                                          pc.if_else(here, version[1], mark_minor))
        mark = (pc.fill_null(mark_major, zero), pc.fill_null(mark_minor, zero))
        guard = _highest(tomb, mark)  # what a row below which is stale however the change looks
        held = _highest(self.doc, guard)
        self.applies = _above(incoming, held)
        self.stale = pc.and_(pc.and_(pc.invert(self.applies), self.found), _above(guard, self.doc))
        self.upsert = pc.is_valid(self.col("doc"))
        self.alias_only = pc.equal(self.col("target"), alias)
        fill_low, fill_high = self.col("fill_low"), self.col("fill_high")
        no_fill = pc.is_null(fill_high)
        self.keep_stored_fills = pc.or_(no_fill, pc.fill_null(pc.invert(_above(
            (pc.struct_field(fill_high, [0]), pc.struct_field(fill_high, [1])), self.doc)), False))
        self.take_fills = pc.fill_null(
            _above((pc.struct_field(fill_low, [0]), pc.struct_field(fill_low, [1])), self.doc), False)
        has_keep, objects = self.col("has_keep"), self.col("keeps_objects")
        moved_from = pc.and_(pc.is_valid(self.col("old_row_id")), has_keep)
        update = pc.and_(pc.and_(self.found, has_keep), pc.invert(objects))
        # Rows decided in Python (the module docstring): mixed fill versions, json-keeping updates,
        # primary-key moves on either side.
        mixed = pc.invert(pc.or_(self.keep_stored_fills, self.take_fills))
        self.rare_mask = pc.and_(self.applies, pc.or_(
            pc.and_(self.upsert, pc.or_(pc.and_(pc.and_(self.found, has_keep), pc.or_(objects, mixed)),
                                         pc.and_(pc.invert(self.found), moved_from))),
            pc.and_(pc.invert(self.upsert), pc.fill_null(self.col("moved"), False))))
        vector = pc.and_(self.applies, pc.invert(self.rare_mask))
        self.create = pc.and_(pc.and_(vector, self.upsert), pc.invert(self.found))
        self.index = pc.and_(pc.and_(pc.and_(vector, self.upsert), self.found), pc.invert(has_keep))
        self.update = pc.and_(pc.and_(vector, self.upsert), update)
        self.delete = pc.and_(pc.or_(pc.and_(vector, pc.invert(self.upsert)), self.stale), self.found)
        self.tombstone = pc.and_(vector, pc.invert(self.upsert))

    def rare(self) -> np.ndarray:
        return np.flatnonzero(self.rare_mask.to_numpy(zero_copy_only=False))

    def _cas(self, seq: pa.Array, term: pa.Array) -> list[Any]:
        return [',"if_seq_no":', seq, ',"if_primary_term":', term]

    def _alias(self) -> pa.Array:
        return pc.if_else(self.alias_only, ',"require_alias":true', "")

    def lines(self) -> list[tuple[pa.Array, np.ndarray, bool]]:
        """(lines, row indices, deletes) per kind of operation, each line a bulk action with its source."""
        head, doc, partial = self.col("head"), self.col("doc"), self.col("partial")
        chosen = pc.if_else(pc.fill_null(self.take_fills, False), doc, pc.coalesce(partial, doc))
        kinds = [
            (self.create, ['{"create":{', head, self._alias(), "}}\n", doc, "\n"]),
            (self.index, ['{"index":{', head, *self._cas(self.seq, self.term), self._alias(), "}}\n", doc, "\n"]),
            (self.update,
             ['{"update":{', head, *self._cas(self.seq, self.term), self._alias(), '}}\n{"doc":', chosen, "}\n"]),
            (self.delete, ['{"delete":{', head, *self._cas(self.seq, self.term), "}}\n"]),
            (pc.and_(self.tombstone, self.tomb_found),
             ['{"index":{', self.col("tomb_head"), *self._cas(self.tomb_seq, self.tomb_term), "}}\n",
              self.col("tomb_doc"), "\n"]),
            (pc.and_(self.tombstone, pc.invert(self.tomb_found)),
             ['{"create":{', self.col("tomb_head"), "}}\n", self.col("tomb_doc"), "\n"]),
        ]
        found = []
        for mask, parts in kinds:
            index = np.flatnonzero(pc.fill_null(mask, False).to_numpy(zero_copy_only=False))
            if len(index):
                picked = [part.take(pa.array(index)) if isinstance(part, pa.Array) else part for part in parts]
                found.append((pc.binary_join_element_wise(*picked, ""), index, mask is self.delete))
        return found


def _rare_lines(es: Any, rows: pa.RecordBatch, rare: np.ndarray) -> list[tuple[pa.Array, np.ndarray, bool]]:
    """Bulk lines for the rows decided per row (the module docstring), each whole document written with
    compare-and-set on what was read: (lines, row indices, deletes) like `_State.lines`."""
    written: list[tuple[str, int]] = []
    deleted: list[tuple[str, int]] = []
    for index, row in zip(rare, rows.take(pa.array(rare)).to_pylist(), strict=True):
        head = json.loads("{" + row["head"] + "}")
        current = _get(es, row["target"], row["row_id"])
        if row["doc"] is None:  # a delete whose row moved to another key: its image goes with the tombstone
            tomb_head = json.loads("{" + row["tomb_head"] + "}")
            tomb = _get(es, TOMBSTONES, tomb_head["_id"])
            image = json.loads(row["tomb_doc"]) | ({"image": current.source} if current else {})
            if current:
                deleted.append((json.dumps({"delete": {**head, **_cas(current)}}) + "\n", index))
            action = {"index": {**tomb_head, **_cas(tomb)}} if tomb else {"create": tomb_head}
            written.append((json.dumps(action) + "\n" + json.dumps(image) + "\n", index))
            continue
        document = json.loads(row["doc"])
        source = current.source if current else _moved_image(es, row)
        document |= {column: source[column] for column in _kept_columns(row, current) if column in source}
        action = {"index": {**head, **_cas(current)}} if current else {"create": head}
        written.append((json.dumps(action) + "\n" + json.dumps(document) + "\n", index))
    return [(pa.array([line for line, _ in group], pa.string()), np.array([i for _, i in group], dtype=np.int64),
             delete)
            for group, delete in ((written, False), (deleted, True)) if group]


def _get(es: Any, index: str, doc_id: str) -> _store.Stored | None:
    return _store.Stored.of(es.options(ignore_status=404).get(index=index, id=doc_id))


def _cas(stored: _store.Stored | None) -> dict[str, int]:
    return {"if_seq_no": stored.seq_no, "if_primary_term": stored.primary_term} if stored else {}


def _kept_columns(row: dict[str, Any], current: _store.Stored | None) -> list[str]:
    """The fill-version rule per column: unchanged-TOAST columns always, filled ones when the stored row
    is at least as new as the change the filled value came from."""
    held = current.version if current else (0, 0)
    filled = [(column, (v["major"], v["minor"])) for column, v in (row["filled"] or [])]
    return [*(row["unavailable"] or []), *(column for column, version in filled if held >= version)]


def _moved_image(es: Any, row: dict[str, Any]) -> dict[str, Any]:
    """The old key's row (still there) or the image its moved delete left in the tombstone."""
    if not row["old_row_id"]:
        return {}
    old = _get(es, row["target"], row["old_row_id"])
    if old:
        return old.source
    tomb = es.options(ignore_status=404).get(index=TOMBSTONES, id=f"{row['alias']}/{row['old_row_id']}")
    return ((tomb.get("_source") or {}).get("image") or {}) if tomb.get("found") else {}
