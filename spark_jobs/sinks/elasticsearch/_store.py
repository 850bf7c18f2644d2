"""The search sink's per-index operations that are not per row: reading a stored version, a table's
truncate (watermark and sweep), index creation. Used by the shipper on the executors and by setup.

Why compare-and-set and not `version_type=external`: a row's version is the pair (commit LSN, change
LSN), which does not fit one long, and this node has no scripts. So each chunk reads what it will
overwrite (its documents, their tombstones and the table's truncate watermark), decides, and writes
with `if_seq_no`/`if_primary_term` (or `create`): if anyone wrote in between, Elasticsearch answers
409 and the row is read and decided again.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import islice
from typing import Any

from elasticsearch import BadRequestError, ConflictError, Elasticsearch, helpers

from spark_jobs.model.errors import StoreError
from spark_jobs.sinks.base import VERSION_MAJOR, VERSION_MINOR
from spark_jobs.sinks.elasticsearch._documents import WATERMARKS

Version = tuple[int, int]
ZERO: Version = (0, 0)
VERSION_FIELDS = [VERSION_MAJOR, VERSION_MINOR]
MAX_TRIES = 5  # compare-and-set retries per change; only concurrent writers of one row use them


class ElasticsearchSinkError(StoreError):
    """The sink cannot apply a batch (node unreachable or overloaded, index or alias missing, endless
    conflicts). The whole batch failed; Spark retries it, which is safe because every write is guarded."""


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


def client(url: str) -> Elasticsearch:
    # Retrying after a timeout is safe: a write that did land makes the retry a 409, read again.
    return Elasticsearch(url, request_timeout=60, max_retries=3, retry_on_timeout=True)


def version_fields(version: Version) -> dict[str, int]:
    return {VERSION_MAJOR: version[0], VERSION_MINOR: version[1]}


def below(watermark: Version) -> dict[str, Any]:
    """A query for documents whose (major, minor) version is below `watermark`."""
    major, minor = watermark
    return {"bool": {"minimum_should_match": 1, "should": [
        {"range": {VERSION_MAJOR: {"lt": major}}},
        {"bool": {"filter": [{"term": {VERSION_MAJOR: major}}, {"range": {VERSION_MINOR: {"lt": minor}}}]}},
    ]}}


def watermarks(es: Elasticsearch, aliases: list[str]) -> dict[str, Version | None]:
    """Each alias's truncate watermark (None if its table was never truncated)."""
    if not aliases:
        return {}
    hits = es.mget(docs=[{"_index": WATERMARKS, "_id": alias, "_source": VERSION_FIELDS}
                         for alias in aliases])["docs"]
    # One hit per alias asked, in order (Elasticsearch's answer, not checked here).
    return {alias: stored.version if (stored := Stored.of(hit)) else None
            for alias, hit in zip(aliases, hits, strict=False)}


def truncate(es: Elasticsearch, alias: str, target: str, version: Version, chunk: int = 1000) -> None:
    """Raise the alias's watermark to `version` (compare-and-set), then sweep `target` below it. The
    sweep runs for a replay too: a rebuild index may still hold rows the live index lost."""
    for _ in range(MAX_TRIES):
        held = Stored.of(es.options(ignore_status=404).get(index=WATERMARKS, id=alias).body)
        if held and held.version >= version:
            break  # a replay, or an older truncate: the watermark already covers it
        mark = {"alias": alias, **version_fields(version)}
        cas = {"if_seq_no": held.seq_no, "if_primary_term": held.primary_term} if held else {"op_type": "create"}
        try:
            es.index(index=WATERMARKS, id=alias, document=mark, **cas)
            break
        except ConflictError:
            continue
    else:
        raise ElasticsearchSinkError(f"watermark of {alias} still conflicts after {MAX_TRIES} tries")
    sweep(es, target, max(version, held.version if held else ZERO), chunk)


def sweep(es: Elasticsearch, target: str, watermark: Version, chunk: int = 1000) -> None:
    """Delete every document below the watermark (no _delete_by_query on this node: scroll + bulk).
    A 409 means the document was rewritten meanwhile, so sweep again to judge its new version."""
    for _ in range(MAX_TRIES):
        es.indices.refresh(index=target)  # the scroll must see every write acknowledged so far
        hits = helpers.scan(es, index=target, query={"query": below(watermark), "_source": False},
                            seq_no_primary_term=True)
        conflicts = 0
        while batch := list(islice(hits, chunk)):
            ops = [{"delete": {"_index": h["_index"], "_id": h["_id"], "if_seq_no": h["_seq_no"],
                               "if_primary_term": h["_primary_term"]}} for h in batch]
            items = [next(iter(item.values())) for item in es.bulk(operations=ops)["items"]]
            if failed := [i for i in items if i.get("error") and i["status"] not in (404, 409)]:
                raise ElasticsearchSinkError(f"sweep of {target} failed: {failed[0]['error']}")
            conflicts += sum(i["status"] == 409 for i in items)
        if not conflicts:
            return
    raise ElasticsearchSinkError(f"sweep of {target} still conflicts after {MAX_TRIES} tries")


def sweep_if_truncated_meanwhile(es: Elasticsearch, targets: dict[str, str], seen: dict[str, Version | None]) -> None:
    """A truncate applied by another executor between our first read and our writes would miss what we
    wrote if its sweep ran first. Re-reading the watermarks after the writes closes that window: either
    one is unchanged (our writes were visible to that sweep) or we sweep ourselves."""
    for alias, now in watermarks(es, sorted(targets)).items():
        if now is not None and now > (seen.get(alias) or ZERO):
            sweep(es, targets[alias], now)


def create_index(es: Elasticsearch, index: str, **body: Any) -> None:
    """Create an index; another driver creating it first is fine."""
    try:
        es.indices.create(index=index, **body)
    except BadRequestError as exc:
        if exc.error != "resource_already_exists_exception":
            raise
