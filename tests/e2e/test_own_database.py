"""Your own PostgreSQL, as a new user brings it: a cluster Tideline did not start (tests/own_cluster.py)
with a schema of its own (composite keys, a table without a primary key, a TOASTed column, an enum, a
numeric, a jsonb, an array), `tide init`, `tide up` on a fresh stack of its own ports, a workload, and
`tide verify` clean; then `tide tables add` and `tide tables remove` while the workload writes, with
nothing lost in the other tables."""

from __future__ import annotations

import json
import random
import subprocess
import threading
from dataclasses import dataclass

import psycopg
import pytest

from services.jobs import driver
from services.settings import StackSettings
from services.stack import process
from services.up import lifecycle
from tests.conftest import stack_ports
from tests.own_cluster import Cluster, cluster
from tests.tide_cli import tide_result
from tests.waiting import wait_until

pytestmark = pytest.mark.stack

PORTS = stack_ports(1, shift=20)
FIELDS = ["state_dir", "pipeline_file", *PORTS]
SCHEMA = """
CREATE TYPE mood AS ENUM ('calm', 'busy', 'away');
CREATE TABLE accounts (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name text NOT NULL,
    notes text,                                   -- tens of KB: stored out of line (TOAST)
    balance numeric(14, 4) NOT NULL DEFAULT 0,
    mood mood NOT NULL DEFAULT 'calm',
    tags text[],
    profile jsonb
);
CREATE TABLE memberships (
    account_id bigint NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    team text NOT NULL,
    role text NOT NULL,
    since date NOT NULL,
    PRIMARY KEY (account_id, team)                -- a composite key
);
CREATE TABLE audit_log (at timestamptz NOT NULL DEFAULT now(), message text);   -- no primary key
"""
LATER = "CREATE TABLE notes (account_id bigint NOT NULL, seq int NOT NULL, body text, PRIMARY KEY (account_id, seq))"
TEAMS = ["core", "web", "data", "ops"]
CDC_PASSWORD = "own-cdc-password"
# Deadline for every view to equal PostgreSQL after the writer stops (the warehouse's Delta batches are
# the slowest: over a minute for the first after a start, on 2 cores).
CONVERGE_S = 420


def _toasted_text(rnd: random.Random) -> str:
    return "".join(f"{rnd.getrandbits(64):016x}" for _ in range(1500))  # 24 KB that compresses badly: TOASTed


class Writer(threading.Thread):
    """Random inserts, updates (most leave the TOASTed notes unchanged) and deletes until stopped."""

    def __init__(self, made: Cluster, seed: int, tables: tuple[str, ...]) -> None:
        super().__init__(daemon=True)
        self.made, self.rnd, self.tables = made, random.Random(seed), tables
        self.stop_event = threading.Event()
        self.done, self.error = 0, None

    def run(self) -> None:
        try:
            with self.made.connect() as conn:
                while not self.stop_event.wait(0.05):
                    getattr(self, f"_{self.rnd.choice(self.tables)}")(conn)
                    self.done += 1
        except BaseException as exc:  # noqa: BLE001 - reported by the test that stops it
            self.error = exc

    def _some_account(self, conn: psycopg.Connection) -> int | None:
        row = conn.execute("SELECT id FROM accounts ORDER BY random() LIMIT 1").fetchone()
        return row[0] if row else None

    def _accounts(self, conn: psycopg.Connection) -> None:
        rnd, choice = self.rnd, self.rnd.random()
        if choice < 0.4:
            conn.execute("INSERT INTO accounts (name, notes, balance, mood, tags, profile) "
                         "VALUES (%s, %s, %s, %s, %s, %s)",
                         (f"account {rnd.randrange(10**6)}", _toasted_text(rnd), f"{rnd.uniform(-1e6, 1e6):.4f}",
                          rnd.choice(["calm", "busy", "away"]),
                          [f"t{rnd.randrange(9)}" for _ in range(rnd.randrange(4))],
                          json.dumps({"level": rnd.randrange(5), "ok": rnd.random() < 0.5})))
        elif (account := self._some_account(conn)) is None:
            return
        elif choice < 0.85:  # notes untouched: the change carries Debezium's placeholder for it
            conn.execute("UPDATE accounts SET balance = balance + %s, mood = %s WHERE id = %s",
                         (f"{rnd.uniform(-100, 100):.4f}", rnd.choice(["calm", "busy", "away"]), account))
        elif choice < 0.93:
            conn.execute("UPDATE accounts SET notes = %s WHERE id = %s", (_toasted_text(rnd), account))
        else:
            conn.execute("DELETE FROM accounts WHERE id = %s", (account,))

    def _memberships(self, conn: psycopg.Connection) -> None:
        if (account := self._some_account(conn)) is None:
            return
        team, choice = self.rnd.choice(TEAMS), self.rnd.random()
        if choice < 0.6:
            conn.execute("INSERT INTO memberships VALUES (%s, %s, %s, current_date - %s) "
                         "ON CONFLICT (account_id, team) "
                         "DO UPDATE SET role = EXCLUDED.role", (account, team, self.rnd.choice(["lead", "member"]),
                                                                self.rnd.randrange(900)))
        else:
            conn.execute("DELETE FROM memberships WHERE account_id = %s AND team = %s", (account, team))

    def _notes(self, conn: psycopg.Connection) -> None:
        if (account := self._some_account(conn)) is None:
            return
        seq, choice = self.rnd.randrange(5), self.rnd.random()
        if choice < 0.7:
            conn.execute("INSERT INTO notes VALUES (%s, %s, %s) ON CONFLICT (account_id, seq) DO UPDATE SET body = "
                         "EXCLUDED.body", (account, seq, f"note {self.rnd.randrange(10**6)}"))
        else:
            conn.execute("DELETE FROM notes WHERE account_id = %s AND seq = %s", (account, seq))

    def wait_for(self, operations: int, timeout_s: float = 120) -> None:
        """Until the writer has done `operations` in all (or failed: `finish` reports why)."""
        wait_until(lambda: self.done >= operations or self.error is not None, timeout_s,
                   f"the workload to reach {operations} operations")

    def finish(self) -> int:
        self.stop_event.set()
        self.join(timeout=60)
        assert not self.is_alive() and self.error is None, self.error
        return self.done


def _audit(conn: psycopg.Connection) -> None:
    conn.execute("INSERT INTO audit_log (message) VALUES ('written by the application, never captured')")


@dataclass
class Own:
    """Your database and the Tideline pointed at it, with what `tide init` and `tide up` printed."""

    made: Cluster
    settings: StackSettings
    init_output: str = ""
    up_output: str = ""

    def tide(self, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
        return tide_result(self.settings, *args, fields=FIELDS, timeout=timeout,
                           extra={"TIDE_POSTGRES_URL": self.made.url(), "TIDE_CDC_PASSWORD": CDC_PASSWORD})

    def run_tide(self, *args: str) -> str:
        """The command's output with its whitespace collapsed (Rich folds long lines to the terminal's width)."""
        result = self.tide(*args)
        assert result.returncode == 0, result.stdout + result.stderr
        return " ".join(result.stdout.split())

    def write(self, operations: int, seed: int, tables: tuple[str, ...]) -> int:
        """Run the workload until it has done `operations` (about 20 a second on an idle machine)."""
        writer = Writer(self.made, seed, tables)
        writer.start()
        try:
            writer.wait_for(operations)
        finally:
            done = writer.finish()
        return done

    def verified(self) -> str:
        """`tide verify` until it exits 0 (every view equals PostgreSQL); its output."""
        last: list[subprocess.CompletedProcess] = []

        def clean() -> bool:
            last[:] = [self.tide("verify", timeout=300)]
            return last[0].returncode == 0

        try:
            wait_until(clean, CONVERGE_S, "tide verify to find every view equal to PostgreSQL", interval=10)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{last[0].stdout}{last[0].stderr}" if last else str(exc)) from None
        return " ".join(last[0].stdout.split())


@pytest.fixture(scope="module")
def own(tmp_path_factory):
    """Your database with its schema and rows; `tide init`; `tide up` on a fresh stack; torn down after."""
    folder = tmp_path_factory.mktemp("own-db")
    settings = StackSettings(state_dir=folder / "state", pipeline_file=folder / "pipeline.yaml", **PORTS)
    with cluster("own-database", stack_ports(2, shift=40)["postgres_port"],
                 {"wal_level": "logical", "max_slot_wal_keep_size": "1GB"}) as made:
        with made.connect() as conn:
            conn.execute(SCHEMA)
            seeder = Writer(made, 1, ("accounts", "memberships"))
            for _ in range(300):
                getattr(seeder, f"_{seeder.rnd.choice(seeder.tables)}")(conn)
            _audit(conn)
        own = Own(made, settings)
        own.init_output = own.run_tide("init", "--schema", "public")
        try:
            own.up_output = own.run_tide("up")
            yield own
        finally:
            lifecycle.down(settings, lambda name, state: None)
            process.purge(settings.state_dir)


def test_init_and_up_capture_your_database_and_a_workload_verifies_clean(own, record_property):
    record_property("init_output", own.init_output)
    record_property("up_output", own.up_output)
    assert "accounts: search (full text: name, notes), cache, warehouse" in own.init_output
    assert "memberships: search (full text: role), cache, warehouse" in own.init_output
    assert ("skipped audit_log: no primary key: every view is keyed by it; add one, then `tide tables add audit_log`"
            in own.init_output)
    assert "created tideline.debezium_signal, tideline.tideline_heartbeat" in own.up_output
    with own.made.connect() as conn:  # Tideline made only what capture needs, in a schema of its own
        tables = {row[0] for row in conn.execute("SELECT schemaname || '.' || tablename FROM pg_tables "
                                                 "WHERE schemaname NOT IN ('pg_catalog', 'information_schema')")}
        assert tables == {"public.accounts", "public.memberships", "public.audit_log", "tideline.debezium_signal",
                          "tideline.tideline_heartbeat"}
    assert own.write(300, seed=2, tables=("accounts", "memberships")) > 50
    output = own.verified()
    assert "accounts → warehouse" in output and "memberships → cache" in output


def test_tables_add_captures_a_new_table_while_the_workload_writes_and_loses_nothing(own, record_property):
    with own.made.connect() as conn:  # the application's migration adds a table, with rows
        conn.execute(LATER)
        conn.execute("INSERT INTO notes SELECT id, 0, 'first note of ' || name FROM accounts")
    writer = Writer(own.made, 3, ("accounts", "memberships", "notes"))
    writer.start()
    try:
        added = own.run_tide("tables", "add", "notes")
    finally:
        wrote = writer.finish()
    record_property("tables_add_output", added)
    assert wrote > 0
    assert "notes captured" in added and "existing rows snapshotted" in added
    assert "apply jobs: search reads accounts, memberships, notes" in added
    output = own.verified()
    assert "notes → search" in output and "notes → warehouse" in output


def test_tables_remove_stops_capturing_a_table_while_the_workload_writes_and_the_others_lose_nothing(
        own, record_property):
    writer = Writer(own.made, 4, ("accounts", "memberships", "notes"))
    writer.start()
    try:
        removed = own.run_tide("tables", "remove", "memberships")
        writer.wait_for(writer.done + 150)  # writes after the removal, which the other tables' views must get
    finally:
        wrote = writer.finish()
    record_property("tables_remove_output", removed)
    assert wrote > 0 and "memberships no longer captured" in removed
    status = driver.read_status(own.settings)
    assert all("memberships" not in query["tables"] for query in status["queries"].values())
    output = own.verified()
    assert "memberships" not in output and "accounts → cache" in output and "notes → cache" in output
