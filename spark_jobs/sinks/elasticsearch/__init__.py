"""The search view: one Elasticsearch document per row, written with compare-and-set (docs/sinks/elasticsearch.md).

Users query an alias (`search.index` or the table name) pointing at a physical index `<alias>-v<N>`,
so `tide rebuild` can fill `<alias>-v<N+1>` and swap. A micro-batch is one Spark job: Spark SQL builds
each row's document and request fragments (`_documents`), the executors ship them with a version
guard decided on whole Arrow columns (`_ship`), and, when nested views exist, a second stage of the
same job (after a shuffle, so every flat write is done) rebuilds the join documents the batch touched
(`_nested`). The driver only keeps the mappings equal to the catalogue before the batch (`_mapping`).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from elasticsearch import Elasticsearch

from spark_jobs.model.catalogue import Catalogue
from spark_jobs.model.config import PipelineConfig
from spark_jobs.sinks.base import MOVE_WAIT_MS, VERSION_MAJOR, VERSION_MINOR, Batch, LetterTopic, Sink
from spark_jobs.sinks.elasticsearch import _mapping, _store
from spark_jobs.sinks.elasticsearch._documents import TOMBSTONES, WATERMARKS
from spark_jobs.sinks.elasticsearch._store import ElasticsearchSinkError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from spark_jobs.model.settings import JobSettings

# A nested view's index starts with its reference list only; fields follow the flat indices' mappings.
_NESTED_PROPERTIES = {"tl_refs": {"type": "keyword"}}
# The real-time writer: a lone change waits this long for company before its bulk request goes out.
LINGER_MS = 5
# ... and the indices it wrote are refreshed (made searchable) at most every refresh_ms (TIDE_JOB_ES_REFRESH_MS)
# by one thread per executor JVM: a refresh per bulk request would cost Elasticsearch more than the writes.
REFRESH_MS = 100


class ElasticsearchSink(Sink):
    """The `search` view. `targets` maps a table to a physical index to write instead of its alias
    (`rebuild_target` builds such a sink over new index versions, `promote` swaps the aliases to them);
    tombstones and watermarks belong to the alias, so the live and the rebuild index share them."""

    name = "search"

    def __init__(self, url: str, pipeline: PipelineConfig, bulk_size: int = 1000, targets: dict[str, str] | None = None,
                 shards: int = 1, replicas: int = 0, nested_targets: dict[str, str] | None = None,
                 refresh_ms: int = REFRESH_MS) -> None:
        super().__init__(pipeline)
        self.url = url
        # Real-Time Mode: the writer produces here what each applied change means for the nested views,
        # and the sink's follow-up query rebuilds those documents (spark_jobs/realtime.py).
        self.touches_topic = f"{pipeline.source.topic_prefix}.search-touches"
        self.bulk_size = bulk_size
        self.refresh_ms = refresh_ms
        self.targets = dict(targets or {})
        self.nested_targets = dict(nested_targets or {})
        # One node here: 1 shard, no replicas. A cluster raises both (configuration, not code).
        self.shards = shards
        self.replicas = replicas
        self._mapped: dict[str, set[str]] = {}  # fields known mapped, per target index (driver)
        self._refused: dict[str, dict[str, str]] = {}  # table -> column -> why it cannot be mapped

    @classmethod
    def from_settings(cls, settings: JobSettings, pipeline: PipelineConfig) -> ElasticsearchSink:
        return cls(settings.elasticsearch_url, pipeline, settings.es_bulk_size, refresh_ms=settings.es_refresh_ms)

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
        """The index a table of this sink's (`tables()`: each has a search view, so an alias) is written to."""
        return self.targets.get(table) or self.alias(table)  # type: ignore[return-value]  # never None: see above

    def _full_text(self, table: str) -> list[str]:
        search = self.pipeline.tables[table].search
        return search.text if search else []

    def available(self) -> bool:
        """Whether the cluster answers and is at least yellow (checked on the driver before a batch)."""
        try:
            with Elasticsearch(self.url, request_timeout=5, max_retries=0) as es:
                return es.cluster.health(timeout="5s")["status"] in ("yellow", "green")
        except Exception:  # noqa: BLE001 - any failure means "not now"
            return False

    def _settings(self) -> dict[str, Any]:
        return {"number_of_shards": self.shards, "number_of_replicas": self.replicas}

    # -- setup, mappings and versions (driver)

    def setup(self, spark: SparkSession | None, catalogue: Catalogue) -> None:
        """Create the side indices and, per search table, `<alias>-v1` behind its alias, then map the
        catalogue's columns. Idempotent: an existing alias keeps its target, an existing index its mapping."""
        with _store.client(self.url) as es:
            for side in (TOMBSTONES, WATERMARKS):
                if es.indices.exists(index=side):
                    es.indices.put_mapping(index=side, properties=_mapping.SIDE_MAPPING["properties"])
                else:
                    _store.create_index(es, side, settings=self._settings(), mappings=_mapping.SIDE_MAPPING)
            for alias in self.aliases():
                if not es.indices.exists_alias(name=alias):
                    nested = alias in self.pipeline.nested
                    properties = _NESTED_PROPERTIES if nested else dict(_mapping.META_PROPERTIES)
                    _store.create_index(es, f"{alias}-v1", settings=self._settings(),
                                        mappings={"dynamic": False, "properties": properties})
                    es.indices.put_alias(index=f"{alias}-v1", name=alias)
            self._map_columns(es, catalogue)

    def _map_columns(self, es: Elasticsearch, catalogue: Catalogue) -> None:
        """Map every catalogue column a target index lacks (its type and full-text style from the
        pipeline); remember the columns Elasticsearch refuses, per table."""
        for table in self.tables():
            schema = catalogue.get(table)
            if schema is None:
                continue
            target = self.target(table)
            excluded = set(self.pipeline.tables[table].exclude_columns)
            columns = [column for name, column in schema.columns.items() if name not in excluded]
            if target not in self._mapped:
                self._mapped[target] = _mapping.mapped_fields(es, target)
            new = {name: m for name, m in _mapping.properties(columns, self._full_text(table)).items()
                   if name not in self._mapped[target]}
            refused = _mapping.put_mappings(es, target, new)
            self._mapped[target] |= set(new) - set(refused)
            self._refused[table] = {**self._refused.get(table, {}), **refused}

    def create_version(self, alias: str) -> str:
        """Create `<alias>-v<N+1>` with the current index's mapping (string columns restyled by the
        table's current `search.text`), for a rebuild to fill. The alias is not moved."""
        full_text = next((self._full_text(t) for t in self.pipeline.tables if self.alias(t) == alias), [])
        with _store.client(self.url) as es:
            current = next(iter(es.indices.get_mapping(index=alias).values()))["mappings"]
            versions = [int(m.group(1)) for name in es.indices.get(index=f"{alias}-v*")
                        if (m := re.fullmatch(rf"{re.escape(alias)}-v(\d+)", name))]
            index = f"{alias}-v{max(versions, default=0) + 1}"
            es.indices.create(index=index, settings=self._settings(), mappings=_mapping.restyled(current, full_text))
            return index

    def rebuild_target(self) -> ElasticsearchSink:
        """This sink over a new version of every index, flat and nested (after `setup`: the aliases exist)."""
        targets = {table: self.create_version(alias) for table in self.tables() if (alias := self.alias(table))}
        nested = {name: self.create_version(name) for name in self.pipeline.nested}
        return ElasticsearchSink(self.url, self.pipeline, self.bulk_size, targets=targets, shards=self.shards,
                                 replicas=self.replicas, nested_targets=nested, refresh_ms=self.refresh_ms)

    def promote(self, target: Sink) -> dict[str, str]:
        """Every alias moved to the index `target` filled, one atomic `_aliases` call each."""
        assert isinstance(target, ElasticsearchSink), target
        swapped = {**{self.alias(table) or table: index for table, index in target.targets.items()},
                   **target.nested_targets}
        for alias, index in swapped.items():
            self.swap_alias(alias, index)
        return swapped

    def swap_alias(self, alias: str, index: str) -> None:
        """Point `alias` at `index` only, in one atomic `_aliases` call. Old indices are kept."""
        with _store.client(self.url) as es:
            current = es.indices.get_alias(name=alias).body if es.indices.exists_alias(name=alias) else {}
            old = [name for name in current if name != index]
            actions = [{"remove": {"index": name, "alias": alias}} for name in old]
            es.indices.update_aliases(actions=[*actions, {"add": {"index": index, "alias": alias}}])

    # -- the batch

    def write(self, batch: Batch) -> DataFrame:
        """One Spark job: documents built in SQL, shipped with compare-and-set from the executors, then
        the nested views' documents the batch touched; the rejected rows come back."""
        from pyspark.sql import functions as F

        from spark_jobs.sinks.elasticsearch._documents import documents
        from spark_jobs.sinks.elasticsearch._ship import Shipper
        from spark_jobs.sinks.shipping import REJECTED

        with _store.client(self.url) as es:
            self._map_columns(es, batch.catalogue)  # a column added at the source is mapped first
        tables = self.tables()
        mine = batch.newest.where(F.col("table").isin(*tables))
        aliases = {table: alias for table in tables if (alias := self.alias(table))}  # all have one
        targets = {table: self.target(table) for table in tables}
        prepared = documents(mine, batch.catalogue, tables, aliases, targets, self._refused)
        # Rejects are few: one partition. The exchange also lets the nested stage below reuse this
        # output instead of running the flat writes a second time.
        flat = prepared.mapInArrow(Shipper(self.url, self.bulk_size), REJECTED).repartition(1)
        if not self.pipeline.nested:
            return flat
        from spark_jobs.sinks.elasticsearch._nested import touches

        # The nested documents read the flat indices, so they are built only once every flat write is
        # done: `done` is one row that exists only after all the writing tasks have ended.
        done = flat.groupBy().count()
        return flat.unionByName(self._rebuild_nested(touches(mine, self.pipeline.nested).crossJoin(done).drop("count")))

    def _rebuild_nested(self, touched: DataFrame, prepared: bool = False) -> DataFrame:
        """The nested documents the lookups (view, kind, value) reach, rebuilt from the flat indices on
        the executors; no rows come back (a document that cannot be written fails the batch).
        `prepared`: the flat writes are done and the indices prepared for this batch (the driver, now)."""
        from spark_jobs.sinks.elasticsearch._nested_index import NestedBuilder
        from spark_jobs.sinks.shipping import REJECTED

        builder = NestedBuilder(self.url, self.pipeline, self.targets, self.nested_targets, self.bulk_size,
                                prepared=prepared)
        if prepared:
            with _store.client(self.url) as es:
                builder.prepare(es)
        return touched.repartition(2, "view", "value").mapInArrow(builder, REJECTED)

    # -- Real-Time Mode

    def writer_rows(self, changes: DataFrame, catalogue: Catalogue) -> DataFrame:
        from pyspark.sql import functions as F

        from spark_jobs.sinks.elasticsearch._documents import writer_rows
        from spark_jobs.sinks.elasticsearch._nested import touch_values

        tables = self.tables()
        touches = touch_values(self.pipeline.nested) if self.pipeline.nested else F.array().cast("array<string>")
        aliases = {table: alias for table in tables if (alias := self.alias(table))}  # all have one
        return writer_rows(changes, catalogue, tables, aliases, {t: self.target(t) for t in tables}, self._refused,
                           touches, self.name)

    def writer(self, jvm: Any, letters: LetterTopic) -> Any:
        """spark_jobs/jars/src's SearchChangeWriter: the same compare-and-set writes as the micro-batch
        shipper, then the nested views' lookups to `touches_topic` (none without nested views)."""
        return jvm.dev.tideline.writers.SearchChangeWriter(
            self.url, WATERMARKS, VERSION_MAJOR, VERSION_MINOR, letters.bootstrap, letters.topic,
            self.follow_up_topic() or "", f"apply:{self.name}", self.bulk_size, LINGER_MS,
            self.refresh_ms, MOVE_WAIT_MS)

    def follow_up_topic(self) -> str | None:
        return self.touches_topic if self.pipeline.nested else None

    def follow_up(self, records: DataFrame) -> DataFrame:
        """The nested views' documents the writer's lookups reach: each lookup was produced after its
        change's flat write was acknowledged, so the indices are prepared (refreshed, mapped) here on the
        driver, once for the batch, instead of in each task (Elasticsearch refreshes on one thread here,
        and the writers' refreshes wait behind these)."""
        from pyspark.sql import functions as F

        touch = F.from_json(F.col("value").cast("string"), "view string, kind string, value string").alias("t")
        touched = records.select(touch).select("t.*").where(F.col("view").isin(*self.pipeline.nested)).distinct()
        return self._rebuild_nested(touched, prepared=True)


__all__ = ["ElasticsearchSink", "ElasticsearchSinkError"]
