import pytest
from pydantic import ValidationError

from services.capture.connector.registration import render_config, topic_configs
from services.settings import SettingsError, StackSettings
from spark_jobs.model.config import load


def test_two_services_on_one_port_is_rejected_naming_both():
    with pytest.raises(ValidationError, match="redis_port and postgres_port are both set to port 5432"):
        StackSettings(postgres_port=5432, redis_port=5432)


def test_port_out_of_range_is_rejected():
    with pytest.raises(ValidationError):
        StackSettings(kafka_port=70000)


def test_heap_size_must_be_a_jvm_size():
    with pytest.raises(ValidationError):
        StackSettings(kafka_heap="lots")


def test_missing_password_names_the_fix():
    settings = StackSettings(postgres_password=None)
    with pytest.raises(SettingsError, match="TIDE_POSTGRES_PASSWORD is not set: run `make env`"):
        settings.require_postgres_password()


def test_password_is_masked_in_repr():
    settings = StackSettings(postgres_password="s3cret-value")
    assert "s3cret-value" not in repr(settings)
    assert settings.require_postgres_password() == "s3cret-value"


def test_each_service_is_reached_at_host_unless_given_its_own():
    settings = StackSettings(host="10.0.0.5", connect_host="connect", kafka_host="kafka")
    assert settings.host_of("postgres") == "10.0.0.5" and settings.host_of("connect") == "connect"
    assert settings.kafka_bootstrap == f"kafka:{settings.kafka_port}"


def test_the_connector_reaches_postgres_at_its_own_host_else_postgres_host():
    pipeline = load()
    both = StackSettings(postgres_host="db", connector_database_host="db-from-connect")
    assert render_config(both, pipeline)["database.hostname"] == "db-from-connect"
    assert render_config(StackSettings(postgres_host="db"), pipeline)["database.hostname"] == "db"


def test_excluded_columns_become_debeziums_column_exclude_list():
    pipeline = load()
    assert "column.exclude.list" not in render_config(StackSettings(), pipeline)
    tables = {**pipeline.tables,
              "customers": pipeline.tables["customers"].model_copy(update={"exclude_columns": ["email"]})}
    config = render_config(StackSettings(), pipeline.model_copy(update={"tables": tables}))
    assert config["column.exclude.list"] == r"public\.customers\.email"


def test_change_topics_keep_changes_uncompacted_for_the_pipelines_lag_whoever_creates_them():
    pipeline = load()
    source = pipeline.source.model_copy(update={"compaction_lag_hours": 2})
    config = render_config(StackSettings(), pipeline.model_copy(update={"source": source}))
    assert config["topic.creation.default.min.compaction.lag.ms"] == str(2 * 3600 * 1000)
    # What `ensure_change_topics` gives the topics it creates first: the same settings, less the shape.
    assert topic_configs(config) == {"cleanup.policy": "compact", "min.compaction.lag.ms": "7200000",
                                     "min.insync.replicas": config["topic.creation.default.min.insync.replicas"]}


def test_an_existing_postgresql_url_fills_the_postgres_settings_and_leaves_its_port_out_of_ours():
    settings = StackSettings(postgres_url="postgresql://app:s3cret@db.internal:6543/shop", postgres_user="tideline",
                             postgres_password="local", redis_port=6543)
    assert settings.source_external
    assert (settings.host_of("postgres"), settings.postgres_port, settings.postgres_db, settings.postgres_user) == \
        ("db.internal", 6543, "shop", "app")
    assert settings.require_postgres_password() == "s3cret"
    assert "postgres_port" not in settings.ports()  # its port is not ours to keep distinct or free
    assert "s3cret" not in repr(settings)


def test_a_url_without_a_password_keeps_tide_postgres_password():
    settings = StackSettings(postgres_url="host=10.1.2.3 port=5433 dbname=shop user=app", postgres_password="pw")
    assert settings.require_postgres_password() == "pw" and settings.postgres_port == 5433


@pytest.mark.parametrize(("url", "message"), [
    ("postgresql://app@/shop", "TIDE_POSTGRES_URL has no TCP host"),
    ("postgresql://app@a,b/shop", "TIDE_POSTGRES_URL names several hosts"),
    ("nonsense=", "TIDE_POSTGRES_URL is not a PostgreSQL connection URL"),
])
def test_an_unusable_url_is_refused_naming_the_fix(url, message):
    with pytest.raises(ValidationError, match=message):
        StackSettings(postgres_url=url)


def test_the_local_stack_runs_postgres_only_without_a_url():
    from services.stack.members import managed

    assert "postgres" in managed(StackSettings())
    assert list(managed(StackSettings(postgres_url="postgresql://a@h/d"))) == ["redis", "kafka", "connect",
                                                                               "elasticsearch"]


def test_the_dba_script_makes_every_capture_object_and_never_holds_the_password():
    from services.capture.source import dba

    pipeline = load().model_copy(update={"source": load().source.model_copy(update={"support_schema": "tideline"})})
    settings = StackSettings(cdc_password="never-printed")
    script = dba.script(settings, pipeline, "shop")
    assert "never-printed" not in script
    assert 'CREATE ROLE "tideline_cdc" WITH LOGIN REPLICATION' in script and "PASSWORD :'cdc_password';" in script
    assert 'CREATE SCHEMA IF NOT EXISTS "tideline";' in script
    assert ('GRANT SELECT ON "public"."customers", "public"."products", "public"."orders", "public"."order_items" TO'
            in script)
    assert ('CREATE PUBLICATION "tideline" FOR TABLE "public"."customers", "public"."products", "public"."orders", '
            '"public"."order_items", "tideline"."debezium_signal", "tideline"."tideline_heartbeat" WITH '
            "(publish = 'insert, update, delete, truncate');") in script
