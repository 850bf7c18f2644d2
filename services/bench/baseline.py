"""The source's raw ceilings: how fast PostgreSQL's logical decoding alone drains the same changes,
and how fast PostgreSQL alone reads a table out (what an initial snapshot does).

`DecodingCeiling` creates two logical slots (`test_decoding` and `pgoutput`) before
the changes are written, so they hold exactly the changes the pipeline sees; after
the load it times `pg_recvlogical` draining each slot to the same end LSN, alone,
writing to a file. `test_decoding` prints one line per row change, which gives the
count (and, per kind, the records Debezium makes of them); `pgoutput` is what
Debezium reads. `read_ceiling` times `COPY table TO STDOUT` of the captured tables.

Scenario `baseline` runs the decoding ceiling on PostgreSQL alone, behind the load
generator at the rate asked (by default more than it can run: its reach). The other
scenarios run the same ceilings in their own run and report their rates against them.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections import Counter
from pathlib import Path

from services.bench.core import Bench, BenchError
from services.bench.measure import ratios
from services.stack import postgres
from services.stack.rows import scalar

NAME = "baseline"
DEFAULTS = {"rates": [100_000.0], "duration_s": 60.0, "seed": 1}
SLOTS = {"test_decoding": "bench_ceiling_test_decoding", "pgoutput": "bench_ceiling_pgoutput"}
# test_decoding: "table public.orders: UPDATE: old-key: id[bigint]:1 new-tuple: ..." (old-key: the key changed)
CHANGE_LINE = re.compile(r"^table ([^:]+): (INSERT|UPDATE|DELETE|TRUNCATE):( old-key:)?")
# The Kafka records Debezium writes for each kind of row change (tombstones.on.delete is on; a key change
# is a delete, its tombstone and a create; a truncate event is keyed by services/capture/connect's transform).
RECORDS_PER_CHANGE = {"INSERT": 1, "UPDATE": 1, "KEY UPDATE": 3, "DELETE": 2, "TRUNCATE": 1}


def count_changes(lines, tables: set[str] | None = None) -> Counter:
    """Row changes per (table, kind) in test_decoding output, of `tables` (schema.table) or all."""
    counts: Counter = Counter()
    for line in lines:
        if (match := CHANGE_LINE.match(line)) and (tables is None or match[1] in tables):
            counts[match[1], "KEY UPDATE" if match[3] else match[2]] += 1
    return counts


def debezium_records(counts: Counter) -> int:
    """The records the connector writes to the change topics for these row changes."""
    return sum(RECORDS_PER_CHANGE[kind] * n for (_, kind), n in counts.items())


class DecodingCeiling:
    def __init__(self, bench: Bench) -> None:
        self.bench = bench

    def create(self) -> None:
        with self.bench.connect() as conn:
            for plugin, slot in SLOTS.items():
                conn.execute("SELECT pg_create_logical_replication_slot(%s, %s)", (slot, plugin))

    def drain(self) -> dict:
        """Time pg_recvlogical draining each slot up to the current WAL position; then drop the slots.
        `row_changes` counts every table's; `captured_row_changes` and `debezium_records` only the
        pipeline's tables (what reaches the change topics)."""
        with self.bench.connect() as conn:
            end = scalar(conn, "SELECT pg_current_wal_lsn()::text")
        out_dir = self.bench.settings.state_dir / "ceiling"
        out_dir.mkdir(parents=True, exist_ok=True)
        result: dict = {"end_lsn": end}
        for plugin, slot in SLOTS.items():
            result[plugin] = self._drain_one(plugin, slot, end, out_dir / f"{plugin}.out")
        counts = result["test_decoding"].pop("counts")
        captured = Counter({key: n for key, n in counts.items() if key[0] in self._captured_tables()})
        result["row_changes"] = sum(counts.values())
        result["captured_row_changes"] = sum(captured.values())
        result["debezium_records"] = debezium_records(captured)
        for plugin in SLOTS:
            seconds = result[plugin]["seconds"]
            result[plugin]["row_changes_per_s"] = round(result["row_changes"] / seconds, 1) if seconds else None
        self.drop()
        return result

    def _captured_tables(self) -> set[str]:
        return {f"{self.bench.pipeline.source.schema_name}.{table}" for table in self.bench.pipeline.tables}

    def _drain_one(self, plugin: str, slot: str, end: str, out: Path) -> dict:
        options = ["-o", "proto_version=1", "-o", f"publication_names={self.bench.pipeline.source.publication}"]
        argv = [
            str(postgres.bin_dir() / "pg_recvlogical"),
            "-h", self.bench.settings.host_of("postgres"), "-p", str(self.bench.settings.postgres_port),
            "-U", self.bench.settings.postgres_user, "-d", self.bench.settings.postgres_db,
            "--slot", slot, "--start", "--endpos", end, "--no-loop", "-f", str(out),
            *(options if plugin == "pgoutput" else []),
        ]
        env = {**os.environ, "PGPASSWORD": self.bench.settings.require_postgres_password()}
        began = time.monotonic()
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=1800)
        seconds = time.monotonic() - began
        if done.returncode != 0:
            raise BenchError(f"pg_recvlogical ({plugin}) failed: {done.stderr.strip()[:300]}")
        measured: dict = {"seconds": round(seconds, 3), "bytes": out.stat().st_size}
        if plugin == "test_decoding":
            with open(out, errors="replace") as lines:
                measured["counts"] = count_changes(lines)
        out.unlink()
        return measured

    def drop(self) -> None:
        with self.bench.connect() as conn:
            for slot in SLOTS.values():
                conn.execute(
                    "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s", (slot,)
                )


def read_ceiling(bench: Bench) -> dict:
    """PostgreSQL alone reading every captured table out (`COPY ... TO STDOUT`, the bytes discarded):
    the rows/s an initial snapshot could at best take from the source."""
    rows, began = 0, time.monotonic()
    with bench.connect() as conn:
        for table in bench.pipeline.tables:
            with conn.cursor().copy(f'COPY "{bench.pipeline.source.schema_name}"."{table}" TO STDOUT') as copy:
                rows += sum(bytes(block).count(b"\n") for block in copy)
    seconds = time.monotonic() - began
    return {"rows": rows, "seconds": round(seconds, 3), "rows_per_s": round(rows / seconds, 1) if seconds else None}


def run(bench: Bench) -> dict:
    options = {**DEFAULTS, **bench.options}
    bench.up(["postgres"])
    bench.seed_demo()
    ceiling = DecodingCeiling(bench)
    ceiling.create()
    rate = max(options["rates"])
    bench.say(f"demo workload at up to {rate:g} operations/s for {options['duration_s']:.0f}s on PostgreSQL alone")
    report = bench.run_load(rate, options["duration_s"])
    bench.say(f"  {report.achieved_rate:,.0f} operations/s, {report.row_changes_per_s:,.0f} row changes/s "
              f"on {report.workers} connections in {report.processes} processes")
    bench.say("draining the slots with pg_recvlogical")
    drained = ceiling.drain()
    return {
        "load": report.as_dict(),
        "row_changes_written": report.row_changes,
        "source_row_changes_per_s": round(report.row_changes_per_s, 1),
        "ceiling": drained,
        "ratios": ratios({"written": report.row_changes_per_s,
                          "test_decoding": drained["test_decoding"]["row_changes_per_s"]},
                         drained["pgoutput"]["row_changes_per_s"]),
    }


def check(bench: Bench, results: dict) -> dict:
    """No sinks here: the check is that decoding returned every row change the statistics counted.
    A statement aborted by a conflict is counted by the statistics (the rows it had changed) but never decoded."""
    written, decoded = results["row_changes_written"], results["ceiling"]["row_changes"]
    conflicts = results["load"]["conflicts"]
    return {
        "clean": decoded == written or (conflicts > 0 and 0 < written - decoded <= 10 * conflicts),
        "row_changes_counted": written,
        "row_changes_decoded": decoded,
        "conflicts": conflicts,
    }


def plot(result: dict, out_dir: Path) -> list[Path]:
    from services.bench import plots

    return [plots.components(result["component_series"], out_dir / "components.png", "CPU and memory per component")]
