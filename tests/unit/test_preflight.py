"""Each preflight problem, as the line a user sees, from the facts that cause it (services/capture/source/preflight.py).
tests/integration/test_own_source.py shows the same lines from real clusters."""

from dataclasses import replace

import pytest

from services.capture.source import preflight
from services.capture.source.facts import Role, SourceFacts, Table
from services.settings import StackSettings
from spark_jobs.model.config import PipelineConfig

PIPELINE = PipelineConfig.model_validate({"source": {"schema": "app"}, "tables": {"accounts": {"cache": {}}}})
SETTINGS = StackSettings(cdc_user="tideline_cdc", postgres_url="postgresql://owner@db/appdb")
OWNER = Role("owner", superuser=False, create_role=True, replication=True, login=True)
ACCOUNTS = Table("app", "accounts", has_primary_key=True, replica_identity="d", owner="owner", owned_by_me=True,
                 cdc_can_select=False, published=False)
READY = SourceFacts(
    database="appdb", server_version=160004, wal_level="logical", max_replication_slots=10, slots_used=2,
    max_wal_senders=10,
    senders_used=1, max_slot_wal_keep_mb=2048, slot_exists=False, slot_active=False, me=OWNER, cdc=None,
    tables={"accounts": ACCOUNTS}, support_tables_exist=False, can_create_schema=True, publication_exists=False,
)


def lines(facts: SourceFacts, pipeline: PipelineConfig = PIPELINE) -> list[str]:
    return preflight.problems(facts, SETTINGS, pipeline)


def test_a_ready_source_has_no_problem():
    assert lines(READY) == []


@pytest.mark.parametrize(("facts", "expected"), [
    (replace(READY, wal_level="replica"),
     "wal_level is replica, not logical: nothing can be decoded from the WAL; run ALTER SYSTEM SET wal_level = "
     "logical; then restart PostgreSQL"),
    (replace(READY, max_replication_slots=2, slots_used=2),
     "max_replication_slots is 2, all 2 in use: Tideline needs one slot; run ALTER SYSTEM SET max_replication_slots "
     "= 6; then restart PostgreSQL (or drop an unused slot)"),
    (replace(READY, max_wal_senders=0, senders_used=0),
     "max_wal_senders is 0, all 0 in use: the connector streams through one; run ALTER SYSTEM SET max_wal_senders = "
     "4; then restart PostgreSQL"),
    (replace(READY, max_slot_wal_keep_mb=-1),
     "max_slot_wal_keep_size is -1 (unbounded): a stopped connector's slot would keep WAL until the disk fills; run "
     "ALTER SYSTEM SET max_slot_wal_keep_size = '2GB'; SELECT pg_reload_conf();"),
], ids=["wal_level", "slots", "wal_senders", "unbounded_wal"])
def test_each_server_setting_problem_is_one_line_with_its_fix(facts, expected):
    assert lines(facts) == [expected]


def test_full_slots_and_senders_are_no_problem_when_the_connector_already_streams_from_its_slot():
    assert lines(replace(READY, max_replication_slots=2, slots_used=2, slot_exists=True)) == []
    assert lines(replace(READY, max_wal_senders=1, senders_used=1, slot_exists=True, slot_active=True)) == []


def test_a_user_who_may_not_grant_replication_is_told_to_connect_as_one_who_may_or_ask_a_dba():
    plain = replace(READY, me=replace(OWNER, create_role=True, replication=False))
    assert lines(plain) == [
        "role tideline_cdc does not exist, and owner may not grant the replication privilege (it is not a superuser, "
        "nor CREATEROLE with REPLICATION): connect as a role that is, or have a DBA run CREATE ROLE tideline_cdc WITH "
        "LOGIN REPLICATION ... (`tide source sql` prints what a DBA can run instead)"]


def test_before_postgresql_16_only_a_superuser_may_grant_replication():
    assert lines(replace(READY, server_version=150004)) == [
        "role tideline_cdc does not exist, and owner may not grant the replication privilege (it is not a superuser): "
        "connect as a role that is, or have a DBA run CREATE ROLE tideline_cdc WITH LOGIN REPLICATION ... "
        "(`tide source sql` prints what a DBA can run instead)"]


def test_an_existing_cdc_role_without_replication_is_named_with_what_it_lacks():
    plain = replace(READY, me=replace(OWNER, create_role=False, replication=False),
                    cdc=Role("tideline_cdc", False, False, replication=False, login=True))
    assert lines(plain)[0].startswith("role tideline_cdc lacks REPLICATION, and owner may not grant")


def test_a_cdc_role_a_dba_made_needs_no_privilege_of_the_connecting_user():
    dba_made = replace(READY, me=replace(OWNER, create_role=False, replication=False),
                       cdc=Role("tideline_cdc", False, False, replication=True, login=True))
    assert lines(dba_made) == []


@pytest.mark.parametrize(("table", "expected"), [
    (replace(ACCOUNTS, has_primary_key=False),
     "app.accounts has no primary key: every view is keyed by it; add one (ALTER TABLE app.accounts ADD PRIMARY KEY "
     "(...)) or remove it from pipeline.yaml"),
    (replace(ACCOUNTS, replica_identity="n"),
     "app.accounts has REPLICA IDENTITY NOTHING: once published, its updates and deletes would fail in your "
     "application; run ALTER TABLE app.accounts REPLICA IDENTITY DEFAULT"),
    (replace(ACCOUNTS, owned_by_me=False, owner="app"),
     "app.accounts is owned by app, not owner: only its owner may publish it and let tideline_cdc read it; connect "
     "as app, or `tide source sql` prints what a DBA can run instead"),
], ids=["no_primary_key", "replica_identity_nothing", "not_owner"])
def test_each_table_problem_is_one_line_with_its_fix(table, expected):
    assert lines(replace(READY, tables={"accounts": table})) == [expected]


def test_a_table_a_dba_published_and_granted_needs_no_ownership():
    prepared = replace(ACCOUNTS, owned_by_me=False, owner="app", published=True, cdc_can_select=True)
    assert lines(replace(READY, tables={"accounts": prepared})) == []


def test_a_missing_table_is_named_with_the_command_that_drops_it_and_for_the_demo_the_migration():
    assert lines(replace(READY, tables={})) == [
        "app.accounts does not exist: create it, or remove it from pipeline.yaml (`tide tables remove accounts`)"]
    assert preflight.problems(replace(READY, tables={}), StackSettings(), PIPELINE) == [
        "app.accounts does not exist: run `tide db migrate`, or remove it from pipeline.yaml "
        "(`tide tables remove accounts`)"]


def test_missing_support_tables_that_cannot_be_created_name_the_grant():
    assert lines(replace(READY, can_create_schema=False)) == [
        "the signal and heartbeat tables are missing from schema app, and owner may not create a schema in database "
        "appdb: GRANT CREATE ON DATABASE appdb TO owner, or `tide source sql` prints what a DBA can run instead"]


def test_every_problem_is_reported_at_once_server_first():
    worst = replace(READY, wal_level="minimal", max_slot_wal_keep_mb=-1,
                    tables={"accounts": replace(ACCOUNTS, has_primary_key=False)})
    found = lines(worst)
    assert [line.split(" ")[0] for line in found] == ["wal_level", "max_slot_wal_keep_size", "app.accounts"]
    error = preflight.PreflightError("db:5432/appdb", found)
    assert str(error).splitlines()[0] == "preflight found 3 problem(s) in db:5432/appdb; nothing was registered:"
    assert str(error).splitlines()[1:] == [f"  - {line}" for line in found]
