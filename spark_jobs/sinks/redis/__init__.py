"""The cache view: one Redis hash per row, written by version-guarded Lua scripts (docs/sinks/redis.md).

A micro-batch: Spark SQL builds each change's script arguments (`_commands`), the executors ship
them in chunks of many rows per EVALSHA (`_ship`), and Redis applies each row atomically with its
version guard and the declared aggregates (`_scripts`). The same job writes the rejected rows to the
dead-letter topic.

Stored values are text: a text column as its text, numbers and timestamps as their text form, json
and arrays as JSON text, NULL as an absent field; beside them the version and commit time. The column
types are kept in `tideline:columns:<table>` so readers (the API, verify) can type the values again.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import redis

from spark_jobs.model.catalogue import Catalogue
from spark_jobs.model.config import PipelineConfig
from spark_jobs.model.errors import StoreStateError
from spark_jobs.sinks.base import MOVE_WAIT_MS, VERSION_MAJOR, VERSION_MINOR, Batch, LetterTopic, Sink
from spark_jobs.sinks.redis._scripts import RAISE_WATERMARK, aggregate_spec, row_scripts
from spark_jobs.sinks.redis.keys import (
    columns_key,
    decode_row,
    glob_escape,
    read_types,
    row_key,
    spec_key,
    text_of,
    tombstone_key,
    typed_value,
    watermark_key,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from spark_jobs.model.settings import JobSettings

# Bumped when the stored encoding changes: a cache written otherwise must be rebuilt.
ENCODING = "text-1"
# Real-Time Mode: the JVM writer sends what arrived within this long (or `chunk_rows` rows) in one
# APPLY_BATCH call, so a burst costs a few round trips and a lone change waits at most this.
LINGER_MS = 2


class CacheMismatchError(StoreStateError):
    """The cache was built with another value encoding or aggregates declaration: `tide rebuild cache`."""


class RedisSink(Sink):
    """The `cache` view in Redis."""

    name = "cache"

    def __init__(self, url: str, pipeline: PipelineConfig, key_prefix: str = "", chunk_rows: int = 500) -> None:
        super().__init__(pipeline)
        self.url = url
        self.key_prefix = key_prefix
        self.chunk_rows = chunk_rows
        self._types_written: dict[str, dict[str, str]] = {}

    @classmethod
    def from_settings(cls, settings: JobSettings, pipeline: PipelineConfig) -> RedisSink:
        return cls(settings.redis_url, pipeline)

    def available(self) -> bool:
        try:
            with redis.Redis.from_url(self.url, socket_connect_timeout=5, socket_timeout=5) as client:
                return bool(client.ping())
        except redis.RedisError:
            return False

    def setup(self, spark: SparkSession | None, catalogue: Catalogue) -> None:
        """Check the cache was built with this declaration and encoding, load the scripts, record the
        column types. Refuses a cache built otherwise: its figures or values would not match its rows."""
        self._spec = aggregate_spec(self.pipeline.aggregate_plans(catalogue), self.key_prefix)
        self._apply, self._prune = row_scripts(self._spec)
        with redis.Redis.from_url(self.url) as client:
            self._check_declaration(client)
            for script in (self._apply, RAISE_WATERMARK, self._prune):
                client.script_load(script.source)
            self._write_types(client, catalogue)

    def clear(self) -> None:
        """Deletes what this sink wrote and nothing else in the database: its tables' rows, its
        bookkeeping (`tideline:*` under its prefix) and the aggregates of the declaration the cache
        was built with (held beside the rows, so aggregates since removed from pipeline.yaml go too)."""
        with redis.Redis.from_url(self.url) as client:
            held = client.hget(spec_key(self.key_prefix), "declaration")
            built_with = json.loads(held) if held else []
            patterns = [glob_escape(row_key(table, "", self.key_prefix)) + "*" for table in self.tables()]
            patterns += [glob_escape(f"{self.key_prefix}{a['key_head']}") + ("*" + glob_escape(a["key_tail"])
                         if a["type"] == "hash" else "") for a in built_with]
            patterns.append(glob_escape(f"{self.key_prefix}tideline:") + "*")
            keys = [key for pattern in patterns for key in client.scan_iter(match=pattern, count=1000)]
            for start in range(0, len(keys), 1000):
                client.unlink(*keys[start:start + 1000])

    def _check_declaration(self, client: redis.Redis) -> None:
        """The aggregates' declaration and the value encoding are stored beside the rows. A cache that
        holds rows but neither was written by an earlier version: run `tide rebuild cache`."""
        wanted = {"declaration": json.dumps(self._spec["aggregates"], sort_keys=True), "encoding": ENCODING}
        held = {text_of(k): text_of(v) for k, v in client.hgetall(spec_key(self.key_prefix)).items()}
        if not held:
            patterns = [glob_escape(row_key(table, "", self.key_prefix)) + "*" for table in self.tables()]
            if any(next(client.scan_iter(match=p, count=1000), None) for p in patterns):
                raise CacheMismatchError("the cache was written by an earlier Tideline (another value encoding or "
                                           "cache_aggregates declaration): run `tide rebuild cache`")
            # redis-py types the mapping's keys as a union and a Mapping's keys are invariant, so a
            # dict[str, str], which it takes, does not match.
            client.hset(spec_key(self.key_prefix), mapping=wanted)  # type: ignore[arg-type]
        elif held.get("encoding") != ENCODING:
            raise CacheMismatchError("the cache holds values in an earlier encoding: run `tide rebuild cache`")
        elif held.get("declaration") != wanted["declaration"]:
            raise CacheMismatchError(
                "the cache's aggregates were built from another cache_aggregates declaration: run `tide rebuild cache`"
            )

    def _write_types(self, client: redis.Redis, catalogue: Catalogue) -> None:
        for table in self.tables():
            schema = catalogue.get(table)
            types = {name: column.type for name, column in schema.columns.items()} if schema else {}
            if types and self._types_written.get(table) != types:
                pipe = client.pipeline()
                pipe.delete(columns_key(table, self.key_prefix))
                # A dict[str, str] mapping, which redis-py takes but types otherwise (see _check_declaration).
                pipe.hset(columns_key(table, self.key_prefix), mapping=types)  # type: ignore[arg-type]
                pipe.execute()
                self._types_written[table] = types

    def write(self, batch: Batch) -> DataFrame:
        """One Spark job: arguments built in SQL, shipped by the executors; the rejected rows come back."""
        from pyspark.sql import functions as F

        from spark_jobs.sinks.redis._commands import commands
        from spark_jobs.sinks.redis._ship import Shipper
        from spark_jobs.sinks.shipping import REJECTED

        with redis.Redis.from_url(self.url) as client:
            self._write_types(client, batch.catalogue)  # a column added at the source: its type first
        mine = batch.newest.where(F.col("table").isin(*self.tables()))
        shipper = Shipper(self.url, self.key_prefix, self._apply, self._prune, self.chunk_rows)
        return commands(mine, self.key_prefix).mapInArrow(shipper, REJECTED)

    def writer_rows(self, changes: DataFrame, catalogue: Catalogue) -> DataFrame:
        from spark_jobs.sinks.redis._commands import writer_rows

        return writer_rows(changes, self.key_prefix, self.name)

    def writer(self, jvm: Any, letters: LetterTopic) -> Any:
        """The JVM writer with this sink's scripts (`setup` built them): spark_jobs/jars/src's
        RedisChangeWriter applies the same APPLY_BATCH calls the Python shipper sends."""
        return jvm.dev.tideline.writers.RedisChangeWriter(
            self.url, self._apply.source, RAISE_WATERMARK.source, self._prune.source, VERSION_MAJOR, VERSION_MINOR,
            letters.bootstrap, letters.topic, f"apply:{self.name}", self.chunk_rows, LINGER_MS, MOVE_WAIT_MS)


__all__ = ["ENCODING", "CacheMismatchError", "RedisSink", "columns_key", "decode_row", "glob_escape", "read_types",
           "row_key", "spec_key", "text_of", "tombstone_key", "typed_value", "watermark_key"]
