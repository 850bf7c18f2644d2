"""The executor side of the cache sink: Arrow batches of ready arguments → EVALSHA calls on one socket.

Runs inside `mapInArrow`: per Arrow batch it applies the truncates first (a handful at most; each
raises the table's watermark and prunes what is below it), then sends the rows in chunks, one
`APPLY_BATCH` call each, all chunks pipelined before any reply is read. Python touches bytes and
Arrow columns only; the replies list the few rows Redis refused, which come back as rejected rows.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import redis
from redis.exceptions import NoScriptError, ResponseError

from spark_jobs.sinks.base import VERSION_MAJOR, VERSION_MINOR
from spark_jobs.sinks.redis._scripts import RAISE_WATERMARK, Script
from spark_jobs.sinks.redis.keys import glob_escape, row_key, text_of, tombstone_key, watermark_key
from spark_jobs.sinks.shipping import joined, rejected


class Shipper:
    """Settings only, so it pickles to executors; `__call__` is the mapInArrow function."""

    def __init__(self, url: str, prefix: str, apply: Script, prune: Script, chunk_rows: int = 500,
                 scan_count: int = 1000) -> None:
        self.url = url
        self.prefix = prefix
        self.apply = apply
        self.prune = prune
        self.chunk_rows = chunk_rows
        self.scan_count = scan_count

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        with redis.Redis.from_url(self.url, socket_timeout=120) as client:
            for batch in batches:
                yield self.ship(client, batch)

    def ship(self, client: redis.Redis, batch: pa.RecordBatch) -> pa.RecordBatch:
        """Apply one Arrow batch; the rejected rows (origin, reason) as a batch of REJECTED."""
        truncates = batch.filter(pc.equal(batch.column("op"), "t"))
        for index in range(truncates.num_rows):  # a handful at most per batch
            version = truncates.column("version")[index].as_py()
            self.truncate(client, truncates.column("table")[index].as_py(), (version["major"], version["minor"]))
        rows = batch.filter(pc.and_(pc.not_equal(batch.column("op"), "t"), pc.is_null(batch.column("error"))))
        refused = batch.filter(pc.is_valid(batch.column("error")))
        reasons = self.apply_rows(client, rows)
        return rejected(refused, rows, reasons)

    def apply_rows(self, client: redis.Redis, rows: pa.RecordBatch) -> dict[int, str]:
        """Send every chunk, then read every reply; {row index: reason} of the rows Redis refused."""
        chunks = [(start, min(start + self.chunk_rows, rows.num_rows))
                  for start in range(0, rows.num_rows, self.chunk_rows)]
        if not chunks:
            return {}
        args, counts = rows.column("args"), rows.column("arg_count")
        packed = [self._packed(args, counts, start, end) for start, end in chunks]
        connection = client.connection_pool.get_connection()
        try:
            for parts in packed:
                connection.send_packed_command(parts, check_health=False)
            replies = [self._reply(connection, parts) for parts in packed]
        finally:
            client.connection_pool.release(connection)
        return {start + int(index) - 1: _text(reason)
                for (start, _), reply in zip(chunks, replies, strict=True)  # a reply per chunk sent
                for index, reason in reply}

    def _packed(self, args: pa.BinaryArray, counts: pa.Int32Array, start: int, end: int) -> list[Any]:
        """EVALSHA <sha> 0 <the rows' arguments>: a header and a slice of the Arrow data buffer."""
        total = pc.sum(counts.slice(start, end - start)).as_py()
        header = f"*{3 + total}\r\n$7\r\nEVALSHA\r\n$40\r\n{self.apply.sha}\r\n$1\r\n0\r\n".encode()
        return [header, joined(args.slice(start, end - start))]

    def _reply(self, connection: Any, parts: list[Any]) -> list[Any]:
        try:
            return connection.read_response()
        except NoScriptError:
            # The server lost its script cache (restart, SCRIPT FLUSH): a NOSCRIPT call did nothing, so
            # loading the script and sending the chunk again is safe.
            connection.send_command("SCRIPT", "LOAD", self.apply.source)
            connection.read_response()
            connection.send_packed_command(parts, check_health=False)
            return connection.read_response()

    # ---- truncates --------------------------------------------------------------------------------

    def truncate(self, client: redis.Redis, table: str, version: tuple[int, int]) -> None:
        """Raise the table's watermark, then delete its rows (and tombstones) below it. A row written
        concurrently checks the watermark in its own script, atomically: written before the raise, the
        scan below finds it; after, its script refuses it. Pruning runs even when the watermark did not
        rise: a replayed truncate finishes a prune an earlier failed attempt left half done."""
        watermark = watermark_key(table, self.prefix)
        (raised,) = self._run(client, RAISE_WATERMARK, [([watermark], [str(part) for part in version])])
        if isinstance(raised, ResponseError):
            raise raised
        rows = row_key(table, "", self.prefix)
        targets = [
            # A row leaves the aggregates as it goes, so the script needs its table and id.
            (glob_escape(rows) + "*", lambda key: [VERSION_MAJOR, VERSION_MINOR, table, key[len(rows):]]),
            # A tombstone below the watermark guards nothing the watermark does not: reclaim it.
            (glob_escape(tombstone_key(table, "", self.prefix)) + "*", lambda key: ["major", "minor"]),
        ]
        for pattern, arguments in targets:
            cursor = None
            while cursor != 0:
                cursor, keys = client.scan(cursor=cursor or 0, match=pattern, count=self.scan_count)
                calls = [([text_of(key), watermark], arguments(text_of(key))) for key in keys]
                for result in self._run(client, self.prune, calls):
                    if isinstance(result, ResponseError):
                        raise result  # the truncate is retried with its batch; pruning is idempotent

    @staticmethod
    def _run(client: redis.Redis, script: Script, calls: list[tuple[list[str], list[str]]]) -> list[Any]:
        """EVALSHA each call in one pipelined round trip (loading the script if the server lost it)."""
        if not calls:
            return []
        for _ in range(2):
            pipe = client.pipeline(transaction=False)
            for keys, args in calls:
                pipe.evalsha(script.sha, len(keys), *keys, *args)
            results = pipe.execute(raise_on_error=False)
            if not any(isinstance(result, NoScriptError) for result in results):
                return results
            client.script_load(script.source)  # a NOSCRIPT call did nothing: sending all again is safe
        raise NoScriptError(f"script {script.sha} still missing after loading it")


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
