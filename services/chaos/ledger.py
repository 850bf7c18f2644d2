"""Concurrent writers: each runs the demo workload, one transaction at a time, and appends the next
number of its own gap-free sequence to its own ledger table in the same transaction.

A transaction that fails (a deadlock between writers, PostgreSQL restarting under it) rolls back
with its ledger row, so the sequence stays gap-free. After a lost connection the writer reconnects
and reads where its ledger stands: a COMMIT whose answer was lost may or may not have landed, and
the database, not the writer, knows.
"""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass

import psycopg
from psycopg import sql

from services.demo import workload
from services.stack.rows import one_row, scalar

MAX_WRITERS = 4  # ledger tables migration 0003 creates


def ledger_table(writer: int) -> str:
    if not 1 <= writer <= MAX_WRITERS:
        raise ValueError(f"writer {writer} has no ledger table: migration 0003 creates {MAX_WRITERS}")
    return f"chaos_ledger_{writer}"


class LedgerWriter(threading.Thread):
    def __init__(self, conninfo: str, writer: int, seed: int, pause_s: float) -> None:
        super().__init__(daemon=True, name=f"chaos-writer-{writer}")
        self.conninfo, self.table, self.pause_s = conninfo, ledger_table(writer), pause_s
        self.rnd = random.Random(seed)
        self.stop = threading.Event()
        self.acknowledged = 0  # the highest seq whose COMMIT returned
        self.committed = 0
        self.rolled_back = 0  # conflicts between writers, rolled back with their ledger row
        self.reconnects = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                try:
                    with psycopg.connect(self.conninfo, autocommit=True, connect_timeout=5) as conn:
                        self._write(conn)
                except psycopg.OperationalError:
                    self.reconnects += 1
                    self.stop.wait(1.0)  # back-off while PostgreSQL restarts
        except BaseException as exc:  # noqa: BLE001 - reported by the run that stops it
            self.error = exc

    def _write(self, conn: psycopg.Connection) -> None:
        table = sql.Identifier(self.table)
        seq = scalar(conn, sql.SQL("SELECT coalesce(max(seq), 0) FROM {}").format(table))
        while not self.stop.wait(self.pause_s):
            try:
                with conn.transaction():
                    operation = workload.step(conn, self.rnd) or "nothing to do"
                    conn.execute(sql.SQL("INSERT INTO {} (seq, operation) VALUES (%s, %s)").format(table),
                                 (seq + 1, operation))
            except (psycopg.errors.IntegrityError, psycopg.errors.TransactionRollback):
                # e.g. two writers renumbering one order's items at once, or a deadlock between writers
                self.rolled_back += 1
                continue
            seq += 1
            self.acknowledged = seq
            self.committed += 1

    def finish(self) -> None:
        self.stop.set()
        self.join(timeout=60)
        if self.is_alive():
            raise RuntimeError(f"{self.name} did not stop")
        if self.error is not None:
            raise self.error


@dataclass(frozen=True)
class LedgerState:
    table: str
    rows: int
    first: int | None
    last: int | None
    acknowledged: int

    @property
    def problems(self) -> list[str]:
        """Empty when the ledger is 1..last without a gap and holds every acknowledged commit."""
        found = []
        if self.rows and (self.first != 1 or self.last != self.rows):
            found.append(f"{self.table}: {self.rows} rows but seq runs {self.first}..{self.last} (a gap)")
        if (self.last or 0) < self.acknowledged:
            found.append(f"{self.table}: ends at {self.last}, below the acknowledged commit {self.acknowledged}")
        return found


def ledger_state(conn: psycopg.Connection, writer: LedgerWriter) -> LedgerState:
    rows, first, last = one_row(
        conn, sql.SQL("SELECT count(*), min(seq), max(seq) FROM {}").format(sql.Identifier(writer.table))
    )
    return LedgerState(writer.table, rows, first, last, writer.acknowledged)


def empty_ledgers(conn: psycopg.Connection, writers: int) -> None:
    """Start each ledger at seq 1 (a run captures the ledgers from its own fresh snapshot)."""
    for writer in range(1, writers + 1):
        conn.execute(sql.SQL("TRUNCATE {}").format(sql.Identifier(ledger_table(writer))))

