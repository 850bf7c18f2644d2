import pytest
from pydantic import ValidationError

from services.connector.registration import render_config
from services.settings import SettingsError, StackSettings
from spark_jobs.config import load


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
    tables = {**pipeline.tables, "customers": pipeline.tables["customers"].model_copy(update={"exclude_columns": ["email"]})}
    config = render_config(StackSettings(), pipeline.model_copy(update={"tables": tables}))
    assert config["column.exclude.list"] == r"public\.customers\.email"
