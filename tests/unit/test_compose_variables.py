"""docker-compose.yml's variables and settings, checked from the files alone: every variable and setting
used exists, secrets reach only their containers, and Debian's docker-compose accepts the file."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

from services.jobs import driver
from services.settings import StackSettings
from services.versions import PROJECT_ROOT
from spark_jobs.model.settings import JobSettings
from tests.unit.compose_files import (
    COMPOSE_FILE,
    ENV_EXAMPLE,
    INTERPOLATION,
    compose_services,
    compose_yaml,
    container_settings,
    image_env,
    service_env,
    volume_mounts,
)

# The passwords each container is given: only those its own code uses.
SECRETS = {
    "postgres": {"TIDE_POSTGRES_PASSWORD"},  # initdb, its probe
    "migrate": {"TIDE_POSTGRES_PASSWORD", "TIDE_CDC_PASSWORD"},  # creates the CDC role
    "connect": {"TIDE_CDC_PASSWORD"},  # the connector's ${env:...} references
    "register-connector": {"TIDE_POSTGRES_PASSWORD", "TIDE_CDC_PASSWORD"},
    "jobs": {"TIDE_POSTGRES_PASSWORD", "TIDE_CDC_PASSWORD"},  # `tide verify`; the queries' catalogue reads
    "api": {"TIDE_POSTGRES_PASSWORD"},  # the slot's state for /status
}


def _env_example_names() -> set[str]:
    return {
        line.split("=", 1)[0].strip()
        for line in ENV_EXAMPLE.read_text().splitlines()
        if "=" in line and not line.lstrip().startswith("#")
    }


def _strings(node) -> list[str]:
    """Every string compose interpolates: the parsed file's keys and values (comments excluded)."""
    if isinstance(node, dict):
        return [s for key, value in node.items() for s in _strings(key) + _strings(value)]
    if isinstance(node, list):
        return [s for item in node for s in _strings(item)]
    return [node] if isinstance(node, str) else []


# --- variables and settings ---------------------------------------------------------------------


def test_every_interpolated_variable_is_in_env_example_or_has_a_default():
    text = "\n".join(_strings(compose_yaml()))
    defined = _env_example_names()
    references = list(INTERPOLATION.finditer(text))
    assert references
    for match in references:
        if match["op"] in (":-", "-"):
            continue
        assert match["name"] in defined, f"${{{match['name']}}} is neither in .env.example nor defaulted"
    bare = re.findall(r"(?<!\$)\$(?!\{|\$)[A-Za-z_]", text.replace("$$", ""))
    assert not bare, "use ${VAR}, not $VAR"


def test_secrets_have_no_default_and_reach_only_the_containers_that_use_them():
    for match in INTERPOLATION.finditer("\n".join(_strings(compose_yaml()))):
        if match["name"].endswith("PASSWORD"):
            assert match["op"] == ":?", f"{match['name']} must be required, never defaulted"
    for name, service in compose_services().items():
        given = {key for key in service_env(service) if key.endswith("PASSWORD")}
        assert given == SECRETS.get(name, set()), name


def test_every_tide_variable_set_in_compose_is_a_real_setting():
    for name, service in compose_services().items():
        for key in service_env(service):
            assert key.startswith("TIDE_") and key.removeprefix("TIDE_").lower() in StackSettings.model_fields, (
                f"{name}: {key} is not a StackSettings field"
            )


def test_settings_set_in_compose_validate(monkeypatch):
    for key in list(os.environ):
        if key.startswith("TIDE_"):
            monkeypatch.delenv(key)
    for name in compose_services():
        container_settings(name)


def test_services_listen_beyond_loopback_and_reach_each_other_by_service_name():
    services = compose_services()
    for name in services:
        settings = container_settings(name)
        assert not settings.loopback_only, name
        for other in ("postgres", "redis", "kafka", "connect", "elasticsearch"):
            assert settings.host_of(other) == other, f"{name} reaches {other} at {settings.host_of(other)}"
        assert settings.connector_database_host is None  # PostgreSQL as Connect reaches it: its own name


def test_the_jobs_run_with_the_settings_the_local_stack_derives_and_the_api_reads_the_same_stores():
    """The jobs' TIDE_JOB_* come from driver.job_env (as for `tide jobs start`), so the container sets none
    of its own beyond the stack settings of the same name; the API's view of them is the jobs' own."""
    services = compose_services()
    jobs_env = service_env(services["jobs"])
    assert {key for key in jobs_env if key.startswith("TIDE_JOB_")} <= {
        f"TIDE_{field.upper()}" for field in StackSettings.model_fields if field.startswith("job_")
    }
    jobs = driver.job_settings(container_settings("jobs"))
    api = driver.job_settings(container_settings("api"))
    assert jobs.elasticsearch_url == "http://elasticsearch:9200" and jobs.kafka_bootstrap == "kafka:9092"
    for field in ("elasticsearch_url", "redis_url", "warehouse_dir", "checkpoint_dir", "status_file", "kafka_bootstrap",
                  "jars_dir"):
        assert getattr(api, field) == getattr(jobs, field), field
    # ... and those paths are the jobs' own named volumes, mounted read-only: the API never writes a view.
    jobs_mounts, api_mounts = volume_mounts(services["jobs"]), volume_mounts(services["api"])
    for path in (api.warehouse_dir, api.checkpoint_dir, api.status_file.parent):
        assert api_mounts[str(path)] == (jobs_mounts[str(path)][0], "ro"), path
    assert jobs.jars_dir == Path(image_env()["TIDE_LIB_DIR"]) / "spark"
    assert JobSettings.model_fields["master"].default == "local[4]"


# --- Debian's docker-compose (v1.29) reads the file ----------------------------------------------


def _docker_compose(*args: str, env_file: Path) -> subprocess.CompletedProcess:
    tool = shutil.which("docker-compose")
    assert tool, "docker-compose not found: install Debian's docker-compose package (make setup)"
    env = {key: value for key, value in os.environ.items() if not key.startswith("TIDE_")}
    return subprocess.run(
        [tool, "--env-file", str(env_file), "-f", str(COMPOSE_FILE), *args],
        capture_output=True, text=True, env=env, cwd=PROJECT_ROOT, timeout=60,
    )


def test_docker_compose_accepts_the_file_with_the_example_env():
    result = _docker_compose("config", "-q", env_file=ENV_EXAMPLE)
    assert result.returncode == 0, result.stderr


def test_docker_compose_refuses_the_file_without_the_secrets(tmp_path):
    empty = tmp_path / "empty.env"
    empty.write_text("")
    result = _docker_compose("config", "-q", env_file=empty)
    assert result.returncode != 0
    assert "TIDE_POSTGRES_PASSWORD" in result.stderr or "TIDE_CDC_PASSWORD" in result.stderr, result.stderr
