"""The source's raw ceiling: how fast PostgreSQL's logical decoding alone drains the same changes.

`DecodingCeiling` creates two logical slots (`test_decoding` and `pgoutput`) before
the changes are written, so they hold exactly the changes the pipeline sees; after
the load it times `pg_recvlogical` draining each slot to the same end LSN, alone,
writing to a file. `test_decoding` prints one line per row change, which gives the
count; `pgoutput` is what Debezium reads.

Scenario `baseline` runs the ceiling on PostgreSQL alone: demo workload as fast as
one connection per worker goes, then the drains. The freshness and throughput
scenarios run the same ceiling in their own run and report their rates against it.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from services.bench.core import Bench, BenchError
from services.stack import postgres

NAME = "baseline"
DEFAULTS = {"rates": [2000.0], "duration_s": 90.0, "seed": 1}
SLOTS = {"test_decoding": "bench_ceiling_test_decoding", "pgoutput": "bench_ceiling_pgoutput"}
DEMO_TABLES = ("customers", "products", "orders", "order_items")


def row_changes(bench: Bench) -> int:
    """Inserted + updated + deleted rows of the demo tables so far (PostgreSQL's statistics counters)."""
    with bench.connect() as conn:
        conn.execute("SELECT pg_stat_force_next_flush()")  # this session's counts; others flush within a second
        return conn.execute(
            "SELECT coalesce(sum(n_tup_ins + n_tup_upd + n_tup_del), 0)::bigint FROM pg_stat_user_tables WHERE relname = ANY(%s)",
            (list(DEMO_TABLES),),
        ).fetchone()[0]


class DecodingCeiling:
    def __init__(self, bench: Bench) -> None:
        self.bench = bench

    def create(self) -> None:
        with self.bench.connect() as conn:
            for plugin, slot in SLOTS.items():
                conn.execute("SELECT pg_create_logical_replication_slot(%s, %s)", (slot, plugin))

    def drain(self) -> dict:
        """Time pg_recvlogical draining each slot up to the current WAL position; then drop the slots."""
        with self.bench.connect() as conn:
            end = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0]
        out_dir = self.bench.settings.state_dir / "ceiling"
        out_dir.mkdir(parents=True, exist_ok=True)
        result: dict = {"end_lsn": end}
        for plugin, slot in SLOTS.items():
            result[plugin] = self._drain_one(plugin, slot, end, out_dir / f"{plugin}.out")
        changes = result["test_decoding"].pop("row_changes")
        result["row_changes"] = changes
        for plugin in SLOTS:
            seconds = result[plugin]["seconds"]
            result[plugin]["row_changes_per_s"] = round(changes / seconds, 1) if seconds else None
        self.drop()
        return result

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
        measured = {"seconds": round(seconds, 3), "bytes": out.stat().st_size}
        if plugin == "test_decoding":
            with open(out, errors="replace") as lines:
                measured["row_changes"] = sum(1 for line in lines if line.startswith("table "))
        out.unlink()
        return measured

    def drop(self) -> None:
        with self.bench.connect() as conn:
            for slot in SLOTS.values():
                conn.execute(
                    "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s", (slot,)
                )


def run(bench: Bench) -> dict:
    options = {**DEFAULTS, **bench.options}
    bench.up(["postgres"])
    bench.seed_demo()
    ceiling = DecodingCeiling(bench)
    ceiling.create()
    rate = max(options["rates"])
    bench.say(f"demo workload at up to {rate:g} operations/s for {options['duration_s']:.0f}s on PostgreSQL alone")
    before = row_changes(bench)
    report = bench.run_load(rate, options["duration_s"])
    time.sleep(1.5)  # PostgreSQL flushes other sessions' statistics at most once a second
    written = row_changes(bench) - before
    bench.say("draining the slots with pg_recvlogical")
    drained = ceiling.drain()
    return {
        "load": report.as_dict(),
        "row_changes_written": written,
        "source_row_changes_per_s": round(written / report.seconds, 1),
        "ceiling": drained,
    }


def check(bench: Bench, results: dict) -> dict:
    """No sinks here: the check is that decoding returned every row change the statistics counted.
    A transaction aborted by a conflict is counted by the statistics but never decoded."""
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
