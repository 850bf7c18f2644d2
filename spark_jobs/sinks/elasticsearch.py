"""The search view: one Elasticsearch document per row, written with compare-and-set.

Layout, mapping rules and the guard are explained in docs/sinks/elasticsearch.md.
Users query an alias (`search.index` or the table name) pointing at a physical
index `<alias>-v<N>`, so `tide rebuild` can fill `<alias>-v<N+1>` and swap.

Why compare-and-set and not `version_type=external`: a row's version is the
pair (commit LSN, change LSN) and does not fit one long, and this node has no
scripts. So each chunk reads what it will overwrite (one `mget`: the documents,
their tombstones and the table's truncate watermark), decides with
`spark_jobs.merge`, and writes with `if_seq_no`/`if_primary_term` (or `create`):
if anyone wrote in between, Elasticsearch answers 409 and the change is re-read
and re-decided.
"""

from __future__ import annotations

import base64
import logging
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, time
from decimal import Decimal
from hashlib import sha256
from itertools import islice
from time import monotonic
from typing import Any

from elasticsearch import BadRequestError, ConflictError, Elasticsearch, helpers

from spark_jobs import merge
from spark_jobs.changes import Change, ColumnType
from spark_jobs.config import PipelineConfig
from spark_jobs.merge import MAX_ID_BYTES, Version, doc_id
from spark_jobs.sinks.base import COMMIT_TS, META_PREFIX, VERSION_MAJOR, VERSION_MINOR, Rejected

log = logging.getLogger("tideline.search")

# Side indices shared by every table: a deleted row's version, and each table's truncate version.
TOMBSTONES = "tideline-tombstones"
WATERMARKS = "tideline-watermarks"
VERSION_FIELDS = [VERSION_MAJOR, VERSION_MINOR]
MAX_TRIES = 5  # compare-and-set retries per change; only concurrent writers of one row use them
# A keyword term may not exceed 32766 bytes; 8191 characters of up to 4 bytes each always fit.
KEYWORD_IGNORE_ABOVE = 8191
# The exact-match sub-field of a full-text column, as Elasticsearch's own dynamic default.
SUBFIELD_IGNORE_ABOVE = 256

_LONGS = {"INT2", "INT4", "INT8", "OID"}
_DOUBLES = {"NUMERIC", "DECIMAL", "MONEY", "FLOAT4", "FLOAT8"}
_DATES = {"TIMESTAMPTZ", "TIMESTAMP", "DATE"}
_OBJECTS = {"JSONB", "JSON"}
# For columns a change names no source type for (hand-built changes): bool before int, datetime before date.
_INFERRED = ((bool, "BOOL"), (int, "INT8"), (float, "FLOAT8"), (Decimal, "NUMERIC"),
             (datetime, "TIMESTAMPTZ"), (date, "DATE"), (dict, "JSONB"), (str, "TEXT"))

_META_PROPERTIES = {VERSION_MAJOR: {"type": "long"}, VERSION_MINOR: {"type": "long"}, COMMIT_TS: {"type": "date"}}
# Side documents: the alias (and row id) they belong to and a version.
_SIDE_MAPPING = {
    "dynamic": "strict",
    "properties": {"alias": {"type": "keyword"}, "id": {"type": "keyword"}, **_META_PROPERTIES},
}


class ElasticsearchSinkError(RuntimeError):
    """The sink cannot apply a batch (node unreachable or overloaded, index or alias missing, endless
    conflicts). The whole batch failed; Spark retries it, which is safe because every write is guarded."""


# ---- mapping and documents (pure) -------------------------------------------------------------


def string_mapping(full_text: bool) -> dict[str, Any]:
    if full_text:
        return {"type": "text", "fields": {"keyword": {"type": "keyword", "ignore_above": SUBFIELD_IGNORE_ABOVE}}}
    return {"type": "keyword", "ignore_above": KEYWORD_IGNORE_ABOVE}


def field_mapping(column: ColumnType, full_text: bool = False) -> dict[str, Any]:
    """The mapping of one column from its PostgreSQL type; an array maps as its element type."""
    name = column.name[1:] if column.is_array else column.name
    if name in _LONGS:
        return {"type": "long"}
    if name in _DOUBLES:
        # NUMERIC is stored exact as a string in _source; Elasticsearch coerces it to double to search.
        return {"type": "double"}
    if name == "BOOL":
        return {"type": "boolean"}
    if name in _DATES:
        return {"type": "date"}
    if name in _OBJECTS:
        return {"type": "object", "dynamic": True}
    if name == "BYTEA":
        return {"type": "binary"}
    return string_mapping(full_text)  # TEXT, VARCHAR, BPCHAR, UUID, enums, anything else


def infer_type(value: Any) -> ColumnType | None:
    if isinstance(value, list):
        element = next((infer_type(item) for item in value if item is not None), None)
        return ColumnType("_" + element.name) if element else None
    return next((ColumnType(name) for kind, name in _INFERRED if isinstance(value, kind)), None)


def properties(change: Change, full_text: Iterable[str] = ()) -> dict[str, dict[str, Any]]:
    """Mappings of the columns a change carries. A typeless null column gets none: the index is
    `dynamic: false`, so it stays in _source unindexed until a typed value maps it."""
    types = dict(change.columns)
    for column, value in (change.after or {}).items():
        if column not in types and (inferred := infer_type(value)) is not None:
            types[column] = inferred
    text = set(full_text)
    return {column: field_mapping(kind, column in text) for column, kind in types.items()}


def to_json(value: Any) -> Any:
    if isinstance(value, Decimal):
        return str(value)  # a JSON number would be a float; the string keeps "12.50" exact
    if isinstance(value, (datetime, date, time)):
        return value.isoformat()  # an aware timestamptz keeps its offset
    if isinstance(value, (bytes, bytearray)):
        return base64.b64encode(value).decode()
    if isinstance(value, list):
        return [to_json(item) for item in value]
    if isinstance(value, dict):
        return {key: to_json(item) for key, item in value.items()}
    return value


def version_fields(sequence: Version) -> dict[str, int]:
    return {VERSION_MAJOR: sequence[0], VERSION_MINOR: sequence[1]}


def document(row: dict[str, Any], change: Change) -> dict[str, Any]:
    """A row's _source: its columns as JSON plus the version and commit time of the change."""
    committed = None
    if change.commit_ts_ms is not None:
        committed = datetime.fromtimestamp(change.commit_ts_ms / 1000, UTC).isoformat(timespec="milliseconds")
    return {**to_json(row), **version_fields(change.sequence), COMMIT_TS: committed}


def tombstone_id(alias: str, row_id: str) -> str:
    tombstone = f"{alias}/{row_id}"
    if len(tombstone.encode()) > MAX_ID_BYTES:  # a long (unhashed) row id plus the alias may not fit
        return f"{alias}/sha256:{sha256(row_id.encode()).hexdigest()}"
    return tombstone


# ---- the guard (pure) ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Stored:
    """A document as read: its version, its _source (if asked for) and its compare-and-set token."""

    version: Version
    source: dict[str, Any]
    seq_no: int
    primary_term: int

    @classmethod
    def of(cls, hit: dict[str, Any]) -> Stored | None:
        if "error" in hit:
            raise ElasticsearchSinkError(f"cannot read {hit.get('_index')}/{hit.get('_id')}: {hit['error']}")
        if not hit.get("found"):
            return None
        source = hit.get("_source") or {}
        version = (int(source.get(VERSION_MAJOR, 0)), int(source.get(VERSION_MINOR, 0)))
        return cls(version, source, hit["_seq_no"], hit["_primary_term"])


Op = tuple[dict[str, Any], dict[str, Any] | None]  # a bulk header and its body (None for delete)


def write_op(index: str, row_id: str, body: dict[str, Any], held: Stored | None, alias_only: bool) -> Op:
    """Index `body` only if the document is still what was read (`create` if it was absent)."""
    header: dict[str, Any] = {"_index": index, "_id": row_id}
    if alias_only:
        header["require_alias"] = True  # never let a missing alias auto-create an unmapped index
    if held is None:
        return {"create": header}, body
    return {"index": {**header, "if_seq_no": held.seq_no, "if_primary_term": held.primary_term}}, body


def delete_op(index: str, row_id: str, held: Stored) -> Op:
    """Delete only if the document is still what was read."""
    guard = {"if_seq_no": held.seq_no, "if_primary_term": held.primary_term}
    return {"delete": {"_index": index, "_id": row_id, **guard}}, None


def plan(change: Change, target: str, alias: str, doc: Stored | None, tombstone: Stored | None,
         watermark: Version | None) -> list[Op]:
    """The bulk operations that bring one row from what was read to `change`, or to nothing.

    A document older than its tombstone or the watermark is stale (a delete or truncate only half
    landed, or a rebuild index that missed a delete made in the live index): it is removed even
    when the change itself is a replay, so every path converges.
    """
    row_id = doc_id(change.key)
    held = merge.stored_version(doc and doc.version, tombstone and tombstone.version, watermark)
    if merge.applies(change, held):
        if change.is_delete:
            mark = {"alias": alias, "id": row_id, **version_fields(change.sequence)}
            ops = [delete_op(target, row_id, doc)] if doc else []
            return ops + [write_op(TOMBSTONES, tombstone_id(alias, row_id), mark, tombstone, False)]
        row = merge.merged_row(change, doc.source if doc else None, doc.version if doc else merge.ZERO)
        return [write_op(target, row_id, document(row, change), doc, alias_only=target == alias)]
    if doc and doc.version < merge.stored_version(None, tombstone and tombstone.version, watermark):
        return [delete_op(target, row_id, doc)]
    return []


def restyled(mappings: dict[str, Any], full_text: Iterable[str]) -> dict[str, Any]:
    """A copy of an index's mappings whose string columns follow `full_text` (a rebuild picks up
    a changed `search.text`; an existing index cannot change a field's type)."""
    text = set(full_text)
    props = {
        name: string_mapping(name in text)
        if mapping.get("type") in ("text", "keyword") and not name.startswith(META_PREFIX) else mapping
        for name, mapping in mappings.get("properties", {}).items()
    }
    return {**mappings, "properties": props}


def below(watermark: Version) -> dict[str, Any]:
    """A query for documents whose (major, minor) version is below `watermark`."""
    major, minor = watermark
    return {"bool": {"minimum_should_match": 1, "should": [
        {"range": {VERSION_MAJOR: {"lt": major}}},
        {"bool": {"filter": [{"term": {VERSION_MAJOR: major}}, {"range": {VERSION_MINOR: {"lt": minor}}}]}},
    ]}}


# A nested view's index starts with its reference list only; fields follow the flat indices' mappings.
_NESTED_PROPERTIES = {"tl_refs": {"type": "keyword"}}


# ---- the sink -----------------------------------------------------------------------------------


class ElasticsearchSink:
    """The search view. Holds plain settings only, so it pickles to executors; `write` opens the client.

    `targets` maps a table to a physical index to write instead of its alias: `tide rebuild` fills
    `create_version(alias)` that way, then calls `swap_alias`. Tombstones and watermarks belong to
    the alias, so the live and the rebuild index share them.
    """

    name = "search"

    def __init__(self, url: str, pipeline: PipelineConfig, bulk_size: int = 1000,
                 targets: dict[str, str] | None = None, shards: int = 1, replicas: int = 0,
                 nested_targets: dict[str, str] | None = None) -> None:
        self.url = url
        self.pipeline = pipeline
        self.bulk_size = bulk_size
        self.targets = dict(targets or {})
        # Nested views (by index name) to write into a physical index instead of their alias.
        self.nested_targets = dict(nested_targets or {})
        # One node here: 1 shard, no replicas. A cluster raises both (configuration, not code).
        self.shards = shards
        self.replicas = replicas

    # -- names

    def alias(self, table: str) -> str | None:
        """The name users query for a table, or None if the table has no search view."""
        config = self.pipeline.tables.get(table)
        if config is None or config.search is None:
            return None
        return config.search.index or table

    def aliases(self) -> list[str]:
        """Every alias this sink writes: the tables' flat indices, then the nested views."""
        return [alias for table in self.pipeline.tables if (alias := self.alias(table))] + list(self.pipeline.nested)

    def target(self, table: str) -> str:
        return self.targets.get(table) or self.alias(table)  # type: ignore[return-value]

    def _full_text(self, table: str) -> list[str]:
        search = self.pipeline.tables[table].search
        return search.text if search else []

    def _client(self) -> Elasticsearch:
        # Retrying a bulk after a timeout is safe: a write that did land makes the retry a 409, re-read.
        return Elasticsearch(self.url, request_timeout=60, max_retries=3, retry_on_timeout=True)

    def available(self) -> bool:
        """Whether the cluster answers and is at least yellow (checked on the driver before a batch)."""
        try:
            with Elasticsearch(self.url, request_timeout=5, max_retries=0) as es:
                return es.cluster.health(timeout="5s")["status"] in ("yellow", "green")
        except Exception:  # noqa: BLE001 - any failure means "not now"
            return False

    def _settings(self) -> dict[str, Any]:
        return {"number_of_shards": self.shards, "number_of_replicas": self.replicas}

    # -- setup and versions (driver)

    def setup(self, pipeline: PipelineConfig | None = None) -> None:
        """Create the side indices and, per search table, `<alias>-v1` behind its alias. Idempotent:
        an existing alias keeps its target, an existing index its mapping."""
        if pipeline is not None:
            self.pipeline = pipeline
        with self._client() as es:
            for side in (TOMBSTONES, WATERMARKS):
                if not es.indices.exists(index=side):
                    _create(es, side, settings=self._settings(), mappings=_SIDE_MAPPING)
            for alias in self.aliases():
                if not es.indices.exists_alias(name=alias):
                    nested = alias in self.pipeline.nested
                    mappings = {"dynamic": False, "properties": _NESTED_PROPERTIES if nested else dict(_META_PROPERTIES)}
                    _create(es, f"{alias}-v1", settings=self._settings(), mappings=mappings)
                    es.indices.put_alias(index=f"{alias}-v1", name=alias)

    def create_version(self, alias: str) -> str:
        """Create `<alias>-v<N+1>` with the current index's mapping (string columns restyled by the
        table's current `search.text`), for a rebuild to fill. The alias is not moved."""
        full_text = next((self._full_text(t) for t in self.pipeline.tables if self.alias(t) == alias), [])
        with self._client() as es:
            current = next(iter(es.indices.get_mapping(index=alias).values()))["mappings"]
            versions = [int(m.group(1)) for name in es.indices.get(index=f"{alias}-v*")
                        if (m := re.fullmatch(rf"{re.escape(alias)}-v(\d+)", name))]
            index = f"{alias}-v{max(versions, default=0) + 1}"
            es.indices.create(index=index, settings=self._settings(), mappings=restyled(current, full_text))
            return index

    def swap_alias(self, alias: str, index: str) -> None:
        """Point `alias` at `index` only, in one atomic `_aliases` call. Old indices are kept."""
        with self._client() as es:
            current = es.indices.get_alias(name=alias) if es.indices.exists_alias(name=alias) else {}
            old = [name for name in current if name != index]
            actions = [{"remove": {"index": name, "alias": alias}} for name in old]
            es.indices.update_aliases(actions=[*actions, {"add": {"index": index, "alias": alias}}])

    # -- writes (executors)

    def write(self, changes: Sequence[Change]) -> list[Rejected]:
        """Apply one partition's changes (newest per row). Truncates first (order does not matter for
        the result, but rows they remove need no write). Raises ElasticsearchSinkError if the node
        cannot take the batch; bad rows come back as Rejected."""
        mine = [change for change in changes if self.alias(change.table)]
        if not mine:
            return []
        rejected: list[Rejected] = []
        with self._client() as es:
            for change in mine:
                if change.op == "t":
                    self._truncate(es, change)
            rows = [change for change in mine if change.op != "t"]
            known: dict[str, set[str]] = {}  # mapped fields per target, learned once per call
            for start in range(0, len(rows), self.bulk_size):
                rejected += self._apply_chunk(es, rows[start:start + self.bulk_size], known)
        return rejected

    def _apply_chunk(self, es: Elasticsearch, chunk: list[Change], known: dict[str, set[str]]) -> list[Rejected]:
        pending, rejected = self._map_new_columns(es, chunk, known)
        targets = {self.alias(change.table): self.target(change.table) for change in pending}
        aliases = sorted(targets)
        first_seen: dict[str, Version | None] | None = None
        for _ in range(MAX_TRIES):
            if not pending:
                break
            watermarks, held = self._read(es, aliases, pending)
            first_seen = first_seen or watermarks
            ops = [(change, op) for change, (doc, tomb) in zip(pending, held)
                   for op in plan(change, self.target(change.table), self.alias(change.table), doc, tomb,
                                  watermarks[self.alias(change.table)])]
            pending, refused = self._bulk(es, ops)
            rejected += refused
        if pending:
            raise ElasticsearchSinkError(f"{len(pending)} rows still conflict after {MAX_TRIES} tries")
        if first_seen is not None:
            self._sweep_if_truncated_meanwhile(es, targets, first_seen)
        return rejected

    def _read(self, es: Elasticsearch, aliases: list[str], changes: list[Change]
              ) -> tuple[dict[str, Version | None], list[tuple[Stored | None, Stored | None]]]:
        """One mget: each alias's watermark, then each row's document and tombstone. The full _source
        is fetched only for rows with columns it may keep (unchanged-TOAST or filled in the batch)."""
        docs = [{"_index": WATERMARKS, "_id": alias, "_source": VERSION_FIELDS} for alias in aliases]
        for change in changes:
            row_id, alias = doc_id(change.key), self.alias(change.table)
            docs.append({"_index": self.target(change.table), "_id": row_id,
                         "_source": True if merge.keep_from(change) else VERSION_FIELDS})
            docs.append({"_index": TOMBSTONES, "_id": tombstone_id(alias, row_id), "_source": VERSION_FIELDS})
        found = [Stored.of(hit) for hit in es.mget(docs=docs)["docs"]]
        watermarks = {alias: stored and stored.version for alias, stored in zip(aliases, found)}
        rows = found[len(aliases):]
        return watermarks, list(zip(rows[0::2], rows[1::2]))

    def _bulk(self, es: Elasticsearch, ops: list[tuple[Change, Op]]) -> tuple[list[Change], list[Rejected]]:
        """Send the operations; return the changes to re-read (409) and those Elasticsearch refused (400)."""
        if not ops:
            return [], []
        body = [part for _, (header, source) in ops for part in (header, source) if part is not None]
        items = es.bulk(operations=body)["items"]
        retry: dict[int, Change] = {}
        refused: dict[int, Rejected] = {}
        for (change, _), item in zip(ops, items):
            result = next(iter(item.values()))
            error = result.get("error")
            if error is None:
                continue  # includes a 404 "not_found" delete: already gone is success
            if result["status"] == 409:
                retry[id(change)] = change
            elif result["status"] == 400:  # a value the mapping cannot take: this row only
                refused[id(change)] = Rejected(change, f"elasticsearch {error['type']}: {error['reason']}")
            else:
                raise ElasticsearchSinkError(f"bulk item failed with {result['status']}: {error}")
        return [c for key, c in retry.items() if key not in refused], list(refused.values())

    # -- nested views (driver, after a batch's flat writes)

    def finish_batch(self, truncates: Sequence[Change], rows: Any) -> int:
        """Bring every nested view up to date with the batch just written flat (`rows` is the batch's
        RDD of changes; only the small lookups it implies reach the driver). Returns documents written."""
        if not self.pipeline.nested:
            return 0
        from spark_jobs.sinks import nested

        views = self.pipeline.nested
        touched = [touch for change in truncates for touch in nested.touches(views, change)]
        touched += rows.flatMap(lambda change: nested.touches(views, change)).collect()
        return self.update_nested(touched)

    def update_nested(self, touched: Sequence[Any]) -> int:
        """Rebuild the nested documents these touches (`nested.touches` of changes already written
        flat) reach; returns how many documents were written or deleted."""
        from spark_jobs.sinks import nested

        written = 0
        with self._client() as es:
            for name, view in self.pipeline.nested.items():
                mine = [touch for touch in touched if touch.view == name]
                if not mine:
                    continue
                started = monotonic()
                target = self.nested_targets.get(name, name)
                done = nested.NestedIndex(es, view, target, self.target, self.bulk_size).apply(mine)
                log.info("nested %s: %d touches, %d documents written in %.0f ms",
                         target, len(mine), done, (monotonic() - started) * 1000)
                written += done
        return written

    # -- mappings

    def _map_new_columns(self, es: Elasticsearch, chunk: list[Change], known: dict[str, set[str]]
                         ) -> tuple[list[Change], list[Rejected]]:
        """Put the mappings of columns this index has not seen (ALTER TABLE ADD COLUMN flows in).
        A column Elasticsearch refuses to map rejects the changes that carry it."""
        wanted: dict[str, dict[str, dict[str, Any]]] = {}
        for change in chunk:
            target = self.target(change.table)
            if change.is_delete:
                continue
            if target not in known:
                mappings = es.indices.get_mapping(index=target).values()
                known[target] = {name for m in mappings for name in m["mappings"].get("properties", {})}
            for column, mapping in properties(change, self._full_text(change.table)).items():
                if column not in known[target]:
                    wanted.setdefault(target, {})[column] = mapping
        refused = {target: _put_mappings(es, target, new, known[target]) for target, new in wanted.items()}
        kept, rejected = [], []
        for change in chunk:
            reasons = refused.get(self.target(change.table), {})
            bad = [reasons[column] for column in (change.after or {}) if column in reasons]
            if bad:
                rejected.append(Rejected(change, bad[0]))
            else:
                kept.append(change)
        return kept, rejected

    # -- truncate

    def _truncate(self, es: Elasticsearch, change: Change) -> None:
        alias = self.alias(change.table)
        for _ in range(MAX_TRIES):
            held = Stored.of(es.options(ignore_status=404).get(index=WATERMARKS, id=alias))
            if held and held.version >= change.sequence:
                break  # a replay, or an older truncate: the watermark already covers it
            mark = {"alias": alias, **version_fields(change.sequence)}
            cas = {"if_seq_no": held.seq_no, "if_primary_term": held.primary_term} if held else {"op_type": "create"}
            try:
                es.index(index=WATERMARKS, id=alias, document=mark, **cas)
                break
            except ConflictError:
                continue
        else:
            raise ElasticsearchSinkError(f"watermark of {alias} still conflicts after {MAX_TRIES} tries")
        # Always sweep, also for a replay: a rebuild index may still hold rows the live index lost.
        self._sweep(es, self.target(change.table), max(change.sequence, held.version if held else merge.ZERO))

    def _sweep(self, es: Elasticsearch, target: str, watermark: Version) -> None:
        """Delete every document below the watermark (no _delete_by_query on this node: scroll + bulk).
        A 409 means the document was rewritten meanwhile, so sweep again to judge its new version."""
        for _ in range(MAX_TRIES):
            es.indices.refresh(index=target)  # the scroll must see every write acknowledged so far
            hits = helpers.scan(es, index=target, query={"query": below(watermark), "_source": False},
                                seq_no_primary_term=True)
            conflicts = 0
            while batch := list(islice(hits, self.bulk_size)):
                ops = [{"delete": {"_index": h["_index"], "_id": h["_id"], "if_seq_no": h["_seq_no"],
                                   "if_primary_term": h["_primary_term"]}} for h in batch]
                items = [next(iter(item.values())) for item in es.bulk(operations=ops)["items"]]
                if failed := [i for i in items if i.get("error") and i["status"] not in (404, 409)]:
                    raise ElasticsearchSinkError(f"sweep of {target} failed: {failed[0]['error']}")
                conflicts += sum(i["status"] == 409 for i in items)
            if not conflicts:
                return
        raise ElasticsearchSinkError(f"sweep of {target} still conflicts after {MAX_TRIES} tries")

    def _sweep_if_truncated_meanwhile(self, es: Elasticsearch, targets: dict[str, str],
                                      seen: dict[str, Version | None]) -> None:
        """A truncate applied by another executor between our first read and our writes would miss
        what we wrote if its sweep ran first. Re-reading the watermark after the writes closes that
        window: either it is unchanged (our writes were visible to that sweep) or we sweep ourselves."""
        aliases = sorted(targets)
        now = es.mget(docs=[{"_index": WATERMARKS, "_id": alias, "_source": VERSION_FIELDS} for alias in aliases])
        for alias, hit in zip(aliases, now["docs"]):
            stored = Stored.of(hit)
            if stored and stored.version > (seen.get(alias) or merge.ZERO):
                self._sweep(es, targets[alias], stored.version)


def _create(es: Elasticsearch, index: str, **body: Any) -> None:
    """Create an index; another driver creating it first is fine."""
    try:
        es.indices.create(index=index, **body)
    except BadRequestError as exc:
        if exc.error != "resource_already_exists_exception":
            raise


def _put_mappings(es: Elasticsearch, target: str, new: dict[str, dict[str, Any]], known: set[str]) -> dict[str, str]:
    """Add `new` fields to the mapping; the reasons of those Elasticsearch refuses, by column. Tries
    all at once, then one by one so one conflicting column does not block the others."""
    try:
        es.indices.put_mapping(index=target, properties=new)
        known.update(new)
        return {}
    except BadRequestError:
        pass
    refused = {}
    for column, mapping in new.items():
        try:
            es.indices.put_mapping(index=target, properties={column: mapping})
            known.add(column)
        except BadRequestError as exc:
            refused[column] = f"elasticsearch mapping conflict on {column}: {exc.message}"
    return refused
