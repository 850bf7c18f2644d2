"""Preflight and capture set-up against PostgreSQL clusters Tideline did not start (tests/own_cluster.py):
each problem a user can meet, as the line `tide source check` / `tide source setup` prints; a database
a DBA prepared with `tide source sql`, used by a role that could not have prepared it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.conftest import stack_ports
from tests.own_cluster import cluster
from tests.tide_cli import TIDE

pytestmark = pytest.mark.stack

MISCONFIGURED = {"wal_level": "replica", "max_replication_slots": "0", "max_wal_senders": "0",
                 "max_slot_wal_keep_size": "-1"}
READY = {"wal_level": "logical", "max_replication_slots": "4", "max_wal_senders": "4", "max_slot_wal_keep_size": "1GB"}
SCHEMA = """
CREATE TABLE accounts (id bigint PRIMARY KEY, name text NOT NULL);
CREATE TABLE audit_log (at timestamptz NOT NULL DEFAULT now(), message text);
CREATE TABLE queue (id bigint PRIMARY KEY, payload jsonb);
ALTER TABLE queue REPLICA IDENTITY NOTHING;
CREATE ROLE appuser LOGIN PASSWORD 'app-pw';
GRANT CONNECT, TEMPORARY ON DATABASE app TO appuser;
"""
CDC_PASSWORD = "cdc-right-pw"


def tide(url: str, tables: list[str], folder: Path, *args: str, cdc_password: str = CDC_PASSWORD
         ) -> subprocess.CompletedProcess:
    """`tide ARGS` against the cluster at `url`, capturing `tables` of schema public."""
    pipeline = folder / "pipeline.yaml"
    pipeline.write_text(yaml.safe_dump({"source": {"schema": "public", "support_schema": "tideline"},
                                        "tables": {table: {"cache": {}} for table in tables}}))
    env = {**os.environ, "COLUMNS": "250", "TIDE_POSTGRES_URL": url, "TIDE_PIPELINE_FILE": str(pipeline),
           "TIDE_CDC_PASSWORD": cdc_password, "TIDE_STATE_DIR": str(folder / "state")}
    return subprocess.run([*TIDE, *args], env=env, capture_output=True, text=True, timeout=120)


def problem_lines(result: subprocess.CompletedProcess) -> list[str]:
    assert result.returncode == 1, result.stdout + result.stderr
    return [line.strip().removeprefix("- ") for line in result.stderr.splitlines() if line.startswith("  - ")]


@pytest.fixture(scope="module")
def misconfigured():
    with cluster("preflight-misconfigured", stack_ports(2, shift=41)["postgres_port"], MISCONFIGURED) as made:
        with made.connect("owner") as conn:
            conn.execute("CREATE TABLE accounts (id bigint PRIMARY KEY, name text)")
        yield made


@pytest.fixture(scope="module")
def ready():
    with cluster("preflight-ready", stack_ports(2, shift=42)["postgres_port"], READY) as made:
        with made.connect("owner") as conn:
            conn.execute(SCHEMA)
        yield made


@pytest.fixture(scope="module")
def server_problems(misconfigured, tmp_path_factory) -> list[str]:
    return problem_lines(tide(misconfigured.url(), ["accounts"], tmp_path_factory.mktemp("check"), "source", "check"))


@pytest.mark.parametrize("expected", [
    "wal_level is replica, not logical: nothing can be decoded from the WAL; run ALTER SYSTEM SET wal_level = logical; "
    "then restart PostgreSQL",
    "max_replication_slots is 0, all 0 in use: Tideline needs one slot; run ALTER SYSTEM SET max_replication_slots = "
    "4; then restart PostgreSQL (or drop an unused slot)",
    "max_wal_senders is 0, all 0 in use: the connector streams through one; run ALTER SYSTEM SET max_wal_senders = 4; "
    "then restart PostgreSQL",
    "max_slot_wal_keep_size is -1 (unbounded): a stopped connector's slot would keep WAL until the disk fills; run "
    "ALTER SYSTEM SET max_slot_wal_keep_size = '2GB'; SELECT pg_reload_conf();",
], ids=["wal_level", "max_replication_slots", "max_wal_senders", "max_slot_wal_keep_size"])
def test_each_server_setting_capture_needs_is_one_line_with_its_fix(server_problems, expected):
    assert expected in server_problems
    assert len(server_problems) == 4


def test_a_table_without_a_primary_key_is_refused_before_anything_is_created(ready, tmp_path):
    assert problem_lines(tide(ready.url(), ["audit_log"], tmp_path, "source", "setup")) == [
        "public.audit_log has no primary key: every view is keyed by it; add one (ALTER TABLE public.audit_log ADD "
        "PRIMARY KEY (...)) or remove it from pipeline.yaml"]
    with ready.connect() as conn:
        assert conn.execute("SELECT count(*) FROM pg_roles WHERE rolname = 'tideline_cdc'").fetchone()[0] == 0
        assert conn.execute("SELECT count(*) FROM pg_publication").fetchone()[0] == 0


def test_a_table_with_replica_identity_nothing_is_refused(ready, tmp_path):
    assert problem_lines(tide(ready.url(), ["queue"], tmp_path, "source", "check")) == [
        "public.queue has REPLICA IDENTITY NOTHING: once published, its updates and deletes would fail in your "
        "application; run ALTER TABLE public.queue REPLICA IDENTITY DEFAULT"]


def test_a_role_without_the_replication_privilege_is_told_who_may_grant_it(ready, tmp_path):
    found = problem_lines(tide(ready.url("appuser", "app-pw"), ["accounts"], tmp_path, "source", "check"))
    assert found[0] == (
        "role tideline_cdc does not exist, and appuser may not grant the replication privilege (it is not a "
        "superuser): connect as a role that is, or have a DBA run CREATE ROLE tideline_cdc WITH LOGIN REPLICATION ... "
        "(`tide source sql` prints what a DBA can run instead)")
    assert found[1].startswith("public.accounts is owned by owner, not appuser: only its owner may publish it")


def test_a_dba_prepared_database_is_used_as_it_is_and_a_wrong_cdc_password_is_one_line(ready, tmp_path):
    script = tide(ready.url(), ["accounts"], tmp_path, "source", "sql")
    assert script.returncode == 0, script.stderr
    psql = subprocess.run(["psql", "-v", "ON_ERROR_STOP=1", "-v", f"cdc_password={CDC_PASSWORD}", ready.url()],
                          input=script.stdout, capture_output=True, text=True, timeout=60)
    assert psql.returncode == 0, psql.stderr
    with ready.connect() as conn:  # what the application's owner grants its own role, nothing of capture
        conn.execute("GRANT SELECT ON accounts TO appuser")

    done = tide(ready.url("appuser", "app-pw"), ["accounts"], tmp_path, "source", "setup")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "role tideline_cdc already has LOGIN REPLICATION (left as it is)" in done.stdout
    assert "publication tideline already publishes every captured table (left as it is)" in done.stdout
    assert "tideline_cdc logs in for replication" in done.stdout

    wrong = tide(ready.url("appuser", "app-pw"), ["accounts"], tmp_path, "source", "setup", cdc_password="wrong")
    assert problem_lines(wrong) == [
        'tideline_cdc cannot open a replication connection: connection failed: connection to server at "127.0.0.1", '
        f'port {ready.port} failed: FATAL:  password authentication failed for user "tideline_cdc"; check '
        "TIDE_CDC_PASSWORD and that pg_hba.conf admits tideline_cdc to database app"]
