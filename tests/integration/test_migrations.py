"""Migrations against a real PostgreSQL: the demo schema, the CDC role and the publication, both ways.

Starts only PostgreSQL, through the project's stack code, in a private state
folder on private ports, so it never touches a developer's stack or the
shared test stack.
"""

from __future__ import annotations

import psycopg
import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from psycopg.conninfo import make_conninfo
from pydantic import SecretStr
from typer.testing import CliRunner

from migrations.models import Base
from services.capture import objects
from services.cli import app
from services.db import migrate
from services.settings import StackSettings
from services.stack import postgres, process, runner
from spark_jobs.model.config import PipelineConfig, load
from tests.conftest import stack_ports

DEMO_TABLES = {"customers", "products", "orders", "order_items"}
SUPPORT_TABLES = {"debezium_signal", "tideline_heartbeat"}
CHAOS_TABLES = {"chaos_ledger_1", "chaos_ledger_2", "chaos_ledger_3", "chaos_ledger_4", "chaos_bulk"}  # 0003
PORTS = stack_ports(2, shift=20)


@pytest.fixture(scope="module")
def pg(tmp_path_factory) -> StackSettings:
    settings = StackSettings(
        state_dir=tmp_path_factory.mktemp("migrations-stack"),
        postgres_user="tideline",
        postgres_password="test-owner-secret",
        cdc_user="tideline_cdc",
        cdc_password="test-cdc-secret",
        **PORTS,
    )
    runner.up(settings, ["postgres"])
    yield settings
    runner.down(settings, ["postgres"])
    process.purge(settings.state_dir)


@pytest.fixture
def db(pg: StackSettings) -> psycopg.Connection:
    """The database at head, with an owner connection (autocommit: each check sees committed state)."""
    migrate.upgrade(pg)
    with psycopg.connect(postgres.conninfo(pg), autocommit=True) as conn:
        yield conn


def _cdc_conninfo(settings: StackSettings, password: str | None = None) -> str:
    return make_conninfo(
        postgres.conninfo(settings), user=settings.cdc_user, password=password or settings.require_cdc_password()
    )


def _tables(conn: psycopg.Connection) -> set[str]:
    rows = conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'").fetchall()
    return {name for (name,) in rows} - {"alembic_version"}


def _published(conn: psycopg.Connection, publication: str) -> set[str]:
    rows = conn.execute(
        "SELECT schemaname || '.' || tablename FROM pg_publication_tables WHERE pubname = %s", (publication,)
    ).fetchall()
    return {name for (name,) in rows}


def _primary_key(conn: psycopg.Connection, table: str) -> list[str]:
    rows = conn.execute(
        """SELECT a.attname FROM pg_index i
           JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)
           WHERE i.indrelid = %s::regclass AND i.indisprimary
           ORDER BY array_position(i.indkey, a.attnum)""",
        (table,),
    ).fetchall()
    return [name for (name,) in rows]


def test_head_creates_the_demo_schema(db: psycopg.Connection):
    assert _tables(db) == DEMO_TABLES | SUPPORT_TABLES | CHAOS_TABLES
    assert {t: _primary_key(db, t) for t in DEMO_TABLES} == {
        "customers": ["id"],
        "products": ["id"],
        "orders": ["id"],
        "order_items": ["order_id", "line_no"],
    }
    identity = db.execute(
        "SELECT attrelid::regclass::text FROM pg_attribute WHERE attname = 'id' AND attidentity = 'd'"
    ).fetchall()
    assert {name for (name,) in identity} == {"customers", "products", "orders"}
    labels = db.execute("SELECT unnest(enum_range(NULL::order_status))::text").fetchall()
    assert [label for (label,) in labels] == ["pending", "paid", "shipped", "cancelled"]
    # Default identity (primary key), not FULL: placeholders for unchanged TOAST columns are handled downstream.
    identities = db.execute(
        "SELECT relname, relreplident FROM pg_class WHERE relname = ANY(%s)", (sorted(DEMO_TABLES),)
    ).fetchall()
    assert dict(identities) == dict.fromkeys(DEMO_TABLES, "d")
    storage = db.execute(
        "SELECT attstorage FROM pg_attribute WHERE attrelid = 'products'::regclass AND attname = 'description'"
    ).fetchone()[0]
    assert storage == "x"  # EXTENDED: large descriptions are compressed and moved out of line
    indexes = db.execute(
        "SELECT indexname FROM pg_indexes WHERE tablename = ANY(%s) AND indexname LIKE '%%_idx'", (sorted(DEMO_TABLES),)
    ).fetchall()
    # 0004: a foreign key's referencing column is not indexed by PostgreSQL itself
    assert {name for (name,) in indexes} == {"orders_customer_id_idx", "order_items_product_id_idx",
                                             "orders_status_id_idx"}


def test_models_match_the_migrations(db: psycopg.Connection, pg: StackSettings):
    with migrate.engine(pg).connect() as connection:
        diff = compare_metadata(MigrationContext.configure(connection), Base.metadata)
    assert diff == []


def test_publication_is_pipeline_tables_plus_signal_and_heartbeat(db: psycopg.Connection):
    config = load()
    expected = {f"public.{t}" for t in config.tables} | {f"public.{t}" for t in SUPPORT_TABLES}
    assert _published(db, config.source.publication) == expected
    flags = db.execute(
        "SELECT pubinsert, pubupdate, pubdelete, pubtruncate FROM pg_publication WHERE pubname = %s",
        (config.source.publication,),
    ).fetchone()
    assert flags == (True, True, True, True)


def test_cdc_role_is_least_privilege_replication(db: psycopg.Connection, pg: StackSettings):
    attributes = db.execute(
        "SELECT rolreplication, rolsuper, rolcanlogin FROM pg_roles WHERE rolname = %s", (pg.cdc_user,)
    ).fetchone()
    assert attributes == (True, False, True)
    with psycopg.connect(_cdc_conninfo(pg), autocommit=True) as cdc:
        assert cdc.execute("SELECT count(*) FROM customers").fetchone()[0] >= 0
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            cdc.execute("INSERT INTO customers (email, name) VALUES ('x@example.com', 'x')")
        # What Debezium writes: incremental-snapshot watermarks and the heartbeat upsert.
        cdc.execute("INSERT INTO debezium_signal (id, type) VALUES ('test-watermark', 'snapshot-window-open')")
        upsert = (
            "INSERT INTO tideline_heartbeat (id, beat_at) VALUES (1, now()) "
            "ON CONFLICT (id) DO UPDATE SET beat_at = excluded.beat_at"
        )
        cdc.execute(upsert)
        cdc.execute(upsert)
    db.execute("DELETE FROM debezium_signal WHERE id = 'test-watermark'")


def test_cdc_role_can_decode_the_publication_from_a_slot(db: psycopg.Connection, pg: StackSettings):
    publication = load().source.publication
    with psycopg.connect(_cdc_conninfo(pg), autocommit=True) as cdc:
        cdc.execute("SELECT pg_create_logical_replication_slot('test_migrations', 'pgoutput')")
        try:
            db.execute("INSERT INTO customers (email, name) VALUES ('slot@example.com', 'Slot')")
            changes = cdc.execute(
                "SELECT count(*) FROM pg_logical_slot_peek_binary_changes('test_migrations', NULL, NULL, "
                "'proto_version', '1', 'publication_names', %s)",
                (publication,),
            ).fetchone()[0]
            assert changes >= 3  # begin, relation + insert, commit
        finally:
            cdc.execute("SELECT pg_drop_replication_slot('test_migrations')")
            db.execute("DELETE FROM customers WHERE email = 'slot@example.com'")


def test_migrate_at_head_applies_a_changed_cdc_password(db: psycopg.Connection, pg: StackSettings):
    changed = pg.model_copy(update={"cdc_password": SecretStr("rotated-cdc-secret")})  # as a changed .env would
    migrate.upgrade(changed)
    try:
        with psycopg.connect(_cdc_conninfo(changed)) as cdc:
            assert cdc.execute("SELECT current_user").fetchone()[0] == pg.cdc_user
        with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
            psycopg.connect(_cdc_conninfo(pg))
    finally:
        migrate.upgrade(pg)


def test_sync_publication_follows_a_smaller_config(db: psycopg.Connection, pg: StackSettings):
    full = load()
    smaller = PipelineConfig.model_validate(
        {"source": full.source.model_dump(by_alias=True), "tables": {"customers": {}}}
    )
    try:
        with psycopg.connect(postgres.conninfo(pg)) as conn:  # commits on leaving the block
            objects.sync_publication(conn, smaller)
        assert _published(db, full.source.publication) == {
            "public.customers",
            "public.debezium_signal",
            "public.tideline_heartbeat",
        }
    finally:
        with psycopg.connect(postgres.conninfo(pg)) as conn:
            objects.sync_publication(conn, full)
    assert len(_published(db, full.source.publication)) == len(full.tables) + 2


def test_downgrade_to_base_removes_everything_and_upgrade_again_works(db: psycopg.Connection, pg: StackSettings):
    migrate.downgrade(pg, "base")
    assert migrate.current(pg) == "base"
    assert _tables(db) == set()
    assert db.execute("SELECT 1 FROM pg_type WHERE typname = 'order_status'").fetchone() is None
    assert db.execute("SELECT 1 FROM pg_publication").fetchone() is None
    assert db.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (pg.cdc_user,)).fetchone() is None

    migrate.upgrade(pg)
    assert migrate.current(pg) == migrate.head() == "0004"
    assert _tables(db) == DEMO_TABLES | SUPPORT_TABLES | CHAOS_TABLES
    with psycopg.connect(_cdc_conninfo(pg)) as cdc:
        assert cdc.execute("SELECT count(*) FROM orders").fetchone()[0] == 0


def test_downgrade_to_0001_keeps_the_demo_tables(db: psycopg.Connection, pg: StackSettings):
    migrate.downgrade(pg, "0001")
    assert _tables(db) == DEMO_TABLES
    assert db.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (pg.cdc_user,)).fetchone() is None


def _env(monkeypatch: pytest.MonkeyPatch, settings: StackSettings) -> None:
    for field in ("postgres_port", "postgres_user", "postgres_password", "cdc_user", "cdc_password", "state_dir"):
        value = getattr(settings, field)
        value = value.get_secret_value() if hasattr(value, "get_secret_value") else value
        monkeypatch.setenv(f"TIDE_{field.upper()}", str(value))
    for field, port in PORTS.items():
        monkeypatch.setenv(f"TIDE_{field.upper()}", str(port))


def test_cli_migrate_and_current(pg: StackSettings, monkeypatch: pytest.MonkeyPatch):
    _env(monkeypatch, pg)
    result = CliRunner().invoke(app, ["db", "migrate"])
    assert result.exit_code == 0, result.output
    result = CliRunner().invoke(app, ["db", "current"])
    assert result.exit_code == 0, result.output
    assert "at revision 0004 (head)" in result.output


def test_cli_names_an_unreachable_postgres_in_one_line(pg: StackSettings, monkeypatch: pytest.MonkeyPatch):
    _env(monkeypatch, pg)
    monkeypatch.setenv("TIDE_POSTGRES_PORT", "45433")  # nothing listens there
    result = CliRunner().invoke(app, ["db", "migrate"])
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: cannot reach PostgreSQL at 127.0.0.1:45433:")
    assert "tide stack up postgres" in lines[0]


def test_cli_names_rejected_credentials_in_one_line(pg: StackSettings, monkeypatch: pytest.MonkeyPatch):
    _env(monkeypatch, pg)
    monkeypatch.setenv("TIDE_POSTGRES_PASSWORD", "not-the-password")
    result = CliRunner().invoke(app, ["db", "current"])
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"error: PostgreSQL at 127.0.0.1:{pg.postgres_port} refused the connection:")
    assert "TIDE_POSTGRES_PASSWORD" in lines[0]


def test_downgrade_keeps_a_cdc_role_still_used_elsewhere(db: psycopg.Connection, pg: StackSettings):
    # A privilege Tideline did not grant: the role is cluster-wide and may serve others.
    db.execute("CREATE SCHEMA elsewhere")
    db.execute(f'GRANT USAGE ON SCHEMA elsewhere TO "{pg.cdc_user}"')
    try:
        migrate.downgrade(pg, "0001")
        assert db.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (pg.cdc_user,)).fetchone() is not None
        assert db.execute("SELECT 1 FROM pg_publication").fetchone() is None
        assert _tables(db) == DEMO_TABLES
    finally:
        db.execute("DROP SCHEMA elsewhere")
        migrate.upgrade(pg)


def _replica_identity(conn: psycopg.Connection, table: str) -> str:
    return conn.execute("SELECT relreplident FROM pg_class WHERE oid = %s::regclass", (table,)).fetchone()[0]


def test_replica_identity_follows_pipeline_yaml(db: psycopg.Connection, pg: StackSettings):
    default = load()
    tables = {name: views.model_dump() for name, views in default.tables.items()}
    tables["products"]["replica_identity"] = "full"
    full_products = PipelineConfig.model_validate({"source": default.source.model_dump(by_alias=True),
                                                   "tables": tables})
    try:
        with psycopg.connect(postgres.conninfo(pg)) as conn:
            objects.sync_replica_identity(conn, full_products)
        assert _replica_identity(db, "products") == "f" and _replica_identity(db, "customers") == "d"
    finally:
        with psycopg.connect(postgres.conninfo(pg)) as conn:
            objects.sync_replica_identity(conn, default)
    assert _replica_identity(db, "products") == "d"
