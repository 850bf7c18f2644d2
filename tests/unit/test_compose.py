"""docker-compose.yml and the images under docker/, checked without a Docker engine.

The compose route cannot be run here (no engine), so these tests pin down what can be
checked from the files alone: the services and their wiring, that every version agrees
with the one pin file, that every variable and setting it uses exists, and that Debian's
docker-compose accepts the file.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import yaml

from services.connector import registration
from services.jobs import driver
from services.settings import StackSettings
from services.stack.templates import _PLACEHOLDER
from services.versions import PIN_FILE, PROJECT_ROOT, pinned
from spark_jobs.settings import JobSettings

COMPOSE_FILE = PROJECT_ROOT / "docker-compose.yml"
ENV_EXAMPLE = PROJECT_ROOT / ".env.example"
DOCKER_DIR = PROJECT_ROOT / "docker"

PIPELINE_SERVICES = {
    "postgres", "migrate", "kafka", "connect", "register-connector", "elasticsearch", "redis", "jobs", "api",
}
OPTIONAL_TOOLS = {"kafka-ui", "kibana"}
ONE_SHOTS = {"migrate", "register-connector"}
# Services a user reaches from the host; everything else stays on the compose network.
PUBLISHED = {"postgres", "kafka", "elasticsearch", "redis", "api", "kafka-ui", "kibana"}

# Third-party images and the pin each tag must equal.
PINNED_IMAGES = {
    "postgres": "postgresql",
    "redis": "redis",
    "apache/kafka": "kafka",
    "elasticsearch": "elasticsearch",
    "kibana": "elasticsearch",
}
# Optional tools with no pin of their own (not part of the pipeline).
UNPINNED_TOOLS = {"provectuslabs/kafka-ui"}
# Dockerfile build args and the pin each must equal.
VERSION_ARGS = {
    "KAFKA_VERSION": "kafka",
    "DEBEZIUM_VERSION": "debezium",
    "SPARK_VERSION": "spark",
    "SCALA_BINARY_VERSION": "scala_binary",
    "DELTA_VERSION": "delta",
}
# ${VAR}, ${VAR:-default}, ${VAR-default}, ${VAR:?error}, ${VAR?error}; $$ is a literal dollar.
_INTERPOLATION = re.compile(r"(?<!\$)\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?P<op>:?[-?])?(?P<arg>[^}]*)\}")


def _compose() -> dict:
    return yaml.safe_load(COMPOSE_FILE.read_text())


def _services() -> dict[str, dict]:
    return _compose()["services"]


def _env(service: dict) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {key: str(value) for key, value in env.items()}


def _resolve_defaults(value: str) -> str:
    """The value compose would use with no .env: the default, or a stand-in for a required secret."""
    return _INTERPOLATION.sub(lambda m: m["arg"] if m["op"] in (":-", "-") else "from-dot-env", value)


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


def _image(name: str) -> tuple[str, str]:
    repository, _, tag = name.rpartition(":")
    return repository, tag


def _dockerfiles() -> dict[str, Path]:
    """Dockerfiles referenced by compose builds, by path relative to the repo."""
    found = {}
    for service in _services().values():
        build = service.get("build")
        if build:
            found[build["dockerfile"]] = PROJECT_ROOT / build.get("context", ".") / build["dockerfile"]
    return found


def _build_args(dockerfile: str) -> dict[str, str]:
    args: dict[str, str] = {}
    for service in _services().values():
        build = service.get("build")
        if build and build["dockerfile"] == dockerfile:
            args.update({key: str(value) for key, value in (build.get("args") or {}).items()})
    return args


def _from_lines(path: Path) -> list[str]:
    return [line.split()[1] for line in path.read_text().splitlines() if line.upper().startswith("FROM ")]


def _settings_fields(env: dict[str, str]) -> tuple[dict, dict]:
    stack, job = {}, {}
    for key, value in env.items():
        if key.startswith("TIDE_JOB_") and key.removeprefix("TIDE_JOB_").lower() in JobSettings.model_fields:
            job[key.removeprefix("TIDE_JOB_").lower()] = value
        elif key.startswith("TIDE_") and key.removeprefix("TIDE_").lower() in StackSettings.model_fields:
            stack[key.removeprefix("TIDE_").lower()] = value
    return stack, job


# --- services and wiring -----------------------------------------------------------------------


def test_compose_defines_the_pipeline_services_and_the_optional_tools():
    assert set(_services()) == PIPELINE_SERVICES | OPTIONAL_TOOLS


def test_optional_tools_start_only_when_their_profile_is_asked_for():
    for name, service in _services().items():
        if name in OPTIONAL_TOOLS:
            assert service.get("profiles"), f"{name} must be behind a profile"
        else:
            assert not service.get("profiles"), f"{name} is part of the pipeline and must start by default"


def test_every_long_running_service_has_a_health_check():
    for name, service in _services().items():
        if name in ONE_SHOTS:
            continue
        check = service.get("healthcheck")
        assert check and not check.get("disable"), f"{name} has no health check"
        assert check["test"] and check["test"][0] in ("CMD", "CMD-SHELL"), f"{name}: {check['test']}"


def test_one_shots_do_not_restart_and_run_the_tide_commands():
    services = _services()
    assert services["migrate"]["command"] == ["tide", "db", "migrate"]
    assert services["register-connector"]["command"] == ["tide", "connector", "apply"]
    assert services["jobs"]["command"] == ["python", "-m", "spark_jobs"]
    for name in ONE_SHOTS:
        assert services[name].get("restart") == "no", name
        assert "healthcheck" not in services[name], f"{name} exits: a health check would never pass"


def test_dependencies_wait_for_health_or_for_successful_completion():
    services = _services()
    for name, service in services.items():
        depends = service.get("depends_on", {})
        assert isinstance(depends, dict), f"{name}: depends_on must name a condition for each dependency"
        for dependency, spec in depends.items():
            assert dependency in services, f"{name} depends on unknown {dependency}"
            expected = "service_completed_successfully" if dependency in ONE_SHOTS else "service_healthy"
            assert spec.get("condition") == expected, f"{name} -> {dependency}: {spec}"


def test_one_shots_run_in_order_before_the_jobs():
    services = _services()
    assert "postgres" in services["migrate"]["depends_on"]
    assert {"migrate", "connect"} <= set(services["register-connector"]["depends_on"])
    assert {"register-connector", "kafka", "elasticsearch", "redis"} <= set(services["jobs"]["depends_on"])


def test_ports_are_published_on_loopback_and_only_where_a_user_needs_them():
    for name, service in _services().items():
        ports = service.get("ports", [])
        if name not in PUBLISHED:
            assert not ports, f"{name} should not publish {ports}"
        for port in ports:
            assert str(port).startswith("127.0.0.1:"), f"{name} publishes {port} beyond loopback"


def test_data_checkpoints_and_warehouse_live_on_named_volumes():
    compose = _compose()
    declared = set(compose["volumes"])
    targets = {
        "postgres": "/var/lib/postgresql/data",
        "kafka": "/var/lib/kafka/data",
        "elasticsearch": "/usr/share/elasticsearch/data",
        "redis": "/data",
    }
    jobs_env = _env(compose["services"]["jobs"])
    targets_jobs = {jobs_env["TIDE_JOB_CHECKPOINT_DIR"], jobs_env["TIDE_JOB_WAREHOUSE_DIR"]}
    for name, service in compose["services"].items():
        mounts = dict(reversed(volume.split(":")[:2]) for volume in service.get("volumes", []))
        wanted = targets_jobs if name == "jobs" else {targets[name]} if name in targets else set()
        for target in wanted:
            assert mounts.get(target) in declared, f"{name}: {target} is not on a named volume ({mounts})"


def test_pipeline_file_is_the_repository_one_mounted_read_only_where_it_is_read():
    for name, service in _services().items():
        env = _env(service)
        paths = {env[key] for key in ("TIDE_PIPELINE_FILE", "TIDE_JOB_PIPELINE_FILE") if key in env}
        for path in paths:
            assert f"./pipeline.yaml:{path}:ro" in service.get("volumes", []), f"{name} reads {path}"


# --- versions: one pin file ----------------------------------------------------------------------


def test_every_image_tag_equals_the_pin_file():
    for name, service in _services().items():
        if "build" in service:
            continue
        repository, tag = _image(service["image"])
        if repository in UNPINNED_TOOLS:
            assert tag and tag != "latest", f"{name}: pin the tool's tag ({service['image']})"
            continue
        assert repository in PINNED_IMAGES, f"{name}: {repository} has no pin; add it to the pin file"
        assert tag == getattr(pinned(), PINNED_IMAGES[repository]), f"{name}: {service['image']}"


def test_every_version_build_arg_equals_the_pin_file():
    seen = set()
    for name, service in _services().items():
        for arg, value in (service.get("build", {}).get("args") or {}).items():
            assert arg in VERSION_ARGS, f"{name}: build arg {arg} is not a known pin"
            assert str(value) == getattr(pinned(), VERSION_ARGS[arg]), f"{name}: {arg}={value}"
            seen.add(arg)
    assert seen == set(VERSION_ARGS)


def test_dockerfile_version_args_have_no_default_and_are_all_passed_by_compose():
    for dockerfile, path in _dockerfiles().items():
        declared = re.findall(r"^ARG\s+([A-Z0-9_]+)(=.*)?$", path.read_text(), flags=re.MULTILINE)
        assert declared, dockerfile
        passed = _build_args(dockerfile)
        for arg, default in declared:
            assert not default, f"{dockerfile}: ARG {arg} has a default that could drift from the pin file"
            assert arg in passed, f"{dockerfile}: ARG {arg} is not passed by docker-compose.yml"


def test_connect_runs_on_the_pinned_kafka_image_and_its_tag_names_the_pins():
    services = _services()
    assert "apache/kafka:${KAFKA_VERSION}" in _from_lines(DOCKER_DIR / "connect.Dockerfile")
    repository, tag = _image(services["connect"]["image"])
    assert tag == f"{pinned().kafka}-debezium-{pinned().debezium}"


def test_tideline_image_tag_is_the_project_version():
    version = tomllib.loads(PIN_FILE.read_text())["project"]["version"]
    for name in ("migrate", "register-connector", "jobs"):
        assert _services()[name]["image"] == f"tideline:{version}", name


def test_python_base_image_satisfies_requires_python():
    requires = tomllib.loads(PIN_FILE.read_text())["project"]["requires-python"]
    python_images = [ref for ref in _from_lines(DOCKER_DIR / "jobs.Dockerfile") if ref.startswith("python:")]
    assert python_images
    for ref in python_images:
        major, minor = map(int, re.match(r"python:(\d+)\.(\d+)", ref).groups())
        assert requires == f">={major}.{minor},<{major}.{minor + 1}", ref


def test_images_are_docker_hub_names_without_a_registry_host():
    refs = [service["image"] for service in _services().values()]
    refs += [ref for path in _dockerfiles().values() for ref in _from_lines(path) if not ref.startswith("$")]
    for ref in refs:
        first = ref.split("/")[0]
        assert "/" not in ref or ("." not in first and ":" not in first and first != "localhost"), ref


# --- variables and settings ---------------------------------------------------------------------


def test_every_interpolated_variable_is_in_env_example_or_has_a_default():
    text = "\n".join(_strings(_compose()))
    defined = _env_example_names()
    references = list(_INTERPOLATION.finditer(text))
    assert references
    for match in references:
        if match["op"] in (":-", "-"):
            continue
        assert match["name"] in defined, f"${{{match['name']}}} is neither in .env.example nor defaulted"
    bare = re.findall(r"(?<!\$)\$(?!\{|\$)[A-Za-z_]", text.replace("$$", ""))
    assert not bare, "use ${VAR}, not $VAR"


def test_secrets_have_no_default_in_compose():
    for match in _INTERPOLATION.finditer("\n".join(_strings(_compose()))):
        if match["name"].endswith("PASSWORD"):
            assert match["op"] == ":?", f"{match['name']} must be required, never defaulted"


def test_every_tide_variable_set_in_compose_is_a_real_setting():
    for name, service in _services().items():
        for key in _env(service):
            if key.startswith("TIDE_JOB_"):
                field = key.removeprefix("TIDE_JOB_").lower()
                assert field in JobSettings.model_fields or f"job_{field}" in StackSettings.model_fields, (
                    f"{name}: {key} is not a JobSettings field"
                )
            elif key.startswith("TIDE_"):
                assert key.removeprefix("TIDE_").lower() in StackSettings.model_fields, (
                    f"{name}: {key} is not a StackSettings field"
                )


def test_settings_set_in_compose_validate(monkeypatch):
    for key in list(os.environ):
        if key.startswith("TIDE_"):
            monkeypatch.delenv(key)
    for name, service in _services().items():
        env = {key: _resolve_defaults(value) for key, value in _env(service).items()}
        stack, job = _settings_fields(env)
        if stack:
            StackSettings(_env_file=None, **stack)
        if job:
            JobSettings(**job)


_HOST_SETTINGS = ("TIDE_HOST", "TIDE_POSTGRES_HOST", "TIDE_REDIS_HOST", "TIDE_KAFKA_HOST", "TIDE_CONNECT_HOST",
                  "TIDE_ELASTICSEARCH_HOST", "TIDE_CONNECTOR_DATABASE_HOST")


def test_services_address_each_other_by_service_name():
    services = _services()
    for name, service in services.items():
        env = {key: _resolve_defaults(value) for key, value in _env(service).items()}
        for setting in _HOST_SETTINGS:
            if setting in env:
                assert env[setting] in services, f"{name}: {setting}={env[setting]}"
    jobs = {key: _resolve_defaults(value) for key, value in _env(services["jobs"]).items()}
    assert jobs["TIDE_JOB_KAFKA_BOOTSTRAP"].split(":")[0] in services
    assert re.match(r"http://([^:/]+)", jobs["TIDE_JOB_ELASTICSEARCH_URL"])[1] in services
    assert re.match(r"redis://([^:/]+)", jobs["TIDE_JOB_REDIS_URL"])[1] in services


def test_register_connector_reaches_postgres_and_connect_and_names_postgres_as_connect_sees_it():
    services = _services()
    register = _env(services["register-connector"])
    settings = StackSettings(_env_file=None, **{k.removeprefix("TIDE_").lower(): v for k, v in register.items()
                                                if k in _HOST_SETTINGS or k.endswith("_PORT")})
    assert settings.host_of("postgres") == "postgres" and settings.host_of("connect") == "connect"
    assert settings.connector_database_host == "postgres"
    assert "network_mode" not in services["connect"], "Connect has its own address now"
    assert int(register["TIDE_CONNECT_PORT"]) == int(_env(services["connect"])["CONNECT_REST_PORT"])


def _jobs_container_settings() -> tuple[StackSettings, JobSettings]:
    env = {key: _resolve_defaults(value) for key, value in _env(_services()["jobs"]).items()}
    stack, job = _settings_fields(env)
    return StackSettings(_env_file=None, **stack), JobSettings(**job)


def test_jobs_status_in_the_container_reads_what_the_driver_writes():
    settings, jobs = _jobs_container_settings()
    assert jobs.status_file == driver.status_file(settings)
    assert jobs.checkpoint_dir == settings.state_dir / "checkpoints"  # where `tide jobs status` reads lag
    assert jobs.kafka_bootstrap == settings.kafka_bootstrap
    assert jobs.pipeline_file == settings.pipeline_file


def test_api_reads_the_stores_checkpoints_and_status_file_the_jobs_write():
    services = _services()
    env = {key: _resolve_defaults(value) for key, value in _env(services["api"]).items()}
    stack, _ = _settings_fields(env)
    api = driver.job_settings(StackSettings(_env_file=None, **stack))
    _, jobs = _jobs_container_settings()
    fields = ("elasticsearch_url", "redis_url", "warehouse_dir", "checkpoint_dir", "status_file", "kafka_bootstrap", "jars_dir")
    for field in fields:
        assert getattr(api, field) == getattr(jobs, field), field
    # ... and those paths are the jobs' own named volumes, mounted read-only (the API never writes a view).
    jobs_mounts = {v.split(":")[1]: v.split(":")[0] for v in services["jobs"]["volumes"]}
    api_mounts = {v.split(":")[1]: v.split(":") for v in services["api"]["volumes"]}
    for path in (api.warehouse_dir, api.checkpoint_dir, api.status_file.parent):
        source, _, mode = api_mounts[str(path)]
        assert source == jobs_mounts[str(path)] and mode == "ro", path


# --- the connector and the images ---------------------------------------------------------------


def test_the_connector_registered_is_the_committed_file():
    template = registration.TEMPLATE
    assert template == PROJECT_ROOT / "connectors" / "tideline-postgres.json"
    dockerfile = (DOCKER_DIR / "jobs.Dockerfile").read_text()
    # The image installs the package editable from its WORKDIR, so PROJECT_ROOT there holds connectors/.
    assert "COPY connectors ./connectors" in dockerfile
    assert re.search(r"pip install [^\n]*--no-deps -e \.", dockerfile)
    mounted = [v for s in _services().values() for v in s.get("volumes", []) if "connectors" in v]
    assert not mounted, f"a second connector file is mounted: {mounted}"


def test_connect_worker_has_every_variable_the_connector_config_reads():
    references = set(re.findall(r"\$\{env:([A-Z0-9_]+)\}", registration.TEMPLATE.read_text()))
    assert references == {"TIDE_CDC_USER", "TIDE_CDC_PASSWORD"}
    assert references <= set(_env(_services()["connect"]))


def test_connect_entrypoint_fills_every_placeholder_of_the_worker_template():
    template = PROJECT_ROOT / "services" / "connect" / "connect-distributed.properties"
    entrypoint = (DOCKER_DIR / "connect-entrypoint.sh").read_text()
    assert "services/connect/connect-distributed.properties" in (DOCKER_DIR / "connect.Dockerfile").read_text()
    for name in set(_PLACEHOLDER.findall(template.read_text())):
        assert f"s|\\${{{name}}}|" in entrypoint, f"{name} is not filled by docker/connect-entrypoint.sh"


def test_connect_plugin_comes_from_the_project_pom():
    dockerfile = (DOCKER_DIR / "connect.Dockerfile").read_text()
    assert "-f /src/connect/pom.xml package dependency:copy-dependencies" in dockerfile
    assert "COPY services/connect /src/connect" in dockerfile


def test_jobs_image_installs_the_lock_then_the_package_without_dependencies():
    lines = (DOCKER_DIR / "jobs.Dockerfile").read_text().splitlines()
    lock = next(i for i, line in enumerate(lines) if "pip install" in line and "-r requirements.lock" in line)
    package = next(i for i, line in enumerate(lines) if "pip install" in line and "--no-deps" in line)
    assert lock < package


def test_build_context_leaves_secrets_and_local_state_out():
    ignored = (PROJECT_ROOT / ".dockerignore").read_text().splitlines()
    for entry in (".env", ".venv", ".tideline", ".git"):
        assert entry in ignored, entry


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
