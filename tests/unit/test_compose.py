"""docker-compose.yml, the image (docker/tideline.Dockerfile) and the scripts beside them, checked
from the files alone, without a Docker engine: the services and their wiring, that every version
agrees with the one pin file, that every variable and setting used exists, and that Debian's
docker-compose accepts the file. tests/compose/ runs the stack itself.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import yaml

from services.capture.connector import registration
from services.jobs import driver
from services.settings import StackSettings
from services.stack import runner
from services.up import lifecycle
from services.versions import PIN_FILE, PROJECT_ROOT, pinned
from spark_jobs.model.settings import JobSettings

COMPOSE_FILE = PROJECT_ROOT / "docker-compose.yml"
ENV_EXAMPLE = PROJECT_ROOT / ".env.example"
DOCKER_DIR = PROJECT_ROOT / "docker"
DOCKERFILE = DOCKER_DIR / "tideline.Dockerfile"

ONE_SHOTS = {"migrate": ["tide", "db", "migrate"], "register-connector": ["tide", "connector", "apply"]}
# Every process `tide up` runs is a long-running service of the same name, plus the one-shots.
SERVED = [service.name for service in lifecycle.PROCESSES]
# Services a user reaches from the host; everything else stays on the compose network.
PUBLISHED = {"postgres", "redis", "elasticsearch", "api"}
# The passwords each container is given: only those its own code uses.
SECRETS = {
    "postgres": {"TIDE_POSTGRES_PASSWORD"},  # initdb, its probe
    "migrate": {"TIDE_POSTGRES_PASSWORD", "TIDE_CDC_PASSWORD"},  # creates the CDC role
    "connect": {"TIDE_CDC_PASSWORD"},  # the connector's ${env:...} references
    "register-connector": {"TIDE_POSTGRES_PASSWORD", "TIDE_CDC_PASSWORD"},
    "jobs": {"TIDE_POSTGRES_PASSWORD", "TIDE_CDC_PASSWORD"},  # `tide verify`; the queries' catalogue reads
    "api": {"TIDE_POSTGRES_PASSWORD"},  # the slot's state for /status
}
# Dockerfile build args and the pin each must equal. Kafka, Debezium, Elasticsearch and the Spark jars
# need none: they are the jars `tide stack fetch` resolved for the pins, checked again in the build.
VERSION_ARGS = {
    "POSTGRESQL_VERSION": "postgresql",
    "REDIS_VERSION": "redis",
    "SPARK_VERSION": "spark",
    "DELTA_VERSION": "delta",
}
# The Python 3 of each Debian suite the base image may be made from (docker/base-image.sh).
DEBIAN_PYTHON = {"bookworm": (3, 11)}
# ${VAR}, ${VAR:-default}, ${VAR-default}, ${VAR:?error}, ${VAR?error}; $$ is a literal dollar.
_INTERPOLATION = re.compile(r"(?<!\$)\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?P<op>:?[-?])?(?P<arg>[^}]*)\}")


def _compose() -> dict:
    return yaml.safe_load(COMPOSE_FILE.read_text())


def _services() -> dict[str, dict]:
    return _compose()["services"]


def _env(service: dict) -> dict[str, str]:
    return {key: str(value) for key, value in (service.get("environment") or {}).items()}


def _resolve_defaults(value: str) -> str:
    """The value compose would use with no .env: the default, or a stand-in for a required secret."""
    return _INTERPOLATION.sub(lambda m: m["arg"] if m["op"] in (":-", "-") else "from-dot-env", value)


def _container_settings(name: str) -> StackSettings:
    """The `tide` settings inside a service's container: its environment, plus the image's own."""
    env = {**_image_env(), **{key: _resolve_defaults(value) for key, value in _env(_services()[name]).items()}}
    fields = {key.removeprefix("TIDE_").lower(): value for key, value in env.items() if key.startswith("TIDE_")}
    return StackSettings(_env_file=None, **{k: v for k, v in fields.items() if k in StackSettings.model_fields})


def _image_env() -> dict[str, str]:
    """ENV of the Dockerfile's last stage (the image the services run)."""
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    last = text.rsplit("\nFROM ", 1)[1]
    env: dict[str, str] = {}
    for line in last.splitlines():
        if line.startswith("ENV "):
            env.update(pair.split("=", 1) for pair in line.split()[1:])
    return env


def _mounts(service: dict) -> dict[str, tuple[str, str]]:
    """Container path -> (source, mode) of each volume."""
    found = {}
    for volume in service.get("volumes", []):
        source, target, *mode = volume.split(":")
        found[target] = (source, mode[0] if mode else "rw")
    return found


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


def _builds() -> dict[str, dict]:
    return {name: service["build"] for name, service in _services().items() if "build" in service}


# --- services and wiring -----------------------------------------------------------------------


def test_compose_runs_every_process_of_tide_up_and_the_one_shots():
    assert set(_services()) == set(SERVED) | set(ONE_SHOTS)


def test_each_long_running_service_is_tide_serve_with_its_own_probe_as_health_check():
    for name in SERVED:
        service = _services()[name]
        assert service["command"] == ["tide", "serve", name], name
        assert service["healthcheck"]["test"] == ["CMD", "/opt/tideline/docker/healthy.sh", name], name
        assert service.get("restart") == "unless-stopped", name
        assert service.get("init") is True, f"{name}: docker-init must pass `docker stop`'s signal on"


def test_the_health_check_reads_the_file_tide_serve_writes():
    """docker/healthy.sh's path is runner.health_file's, in the image's state folder (behaviour: test_serve.py)."""
    state_dir = Path(_image_env()["TIDE_STATE_DIR"])
    service = lifecycle.process_named("jobs")
    assert runner.health_file(StackSettings(_env_file=None, state_dir=state_dir), service) == (
        state_dir / "run" / "jobs.healthy"
    )
    assert '"${TIDE_STATE_DIR:?}/run/${1:?usage: healthy.sh SERVICE}.healthy"' \
        in (DOCKER_DIR / "healthy.sh").read_text()
    assert "COPY docker/healthy.sh ./docker/healthy.sh" in DOCKERFILE.read_text()


def test_one_shots_run_the_tide_commands_once():
    for name, command in ONE_SHOTS.items():
        service = _services()[name]
        assert service["command"] == command, name
        assert service.get("restart") == "no", name
        assert "healthcheck" not in service, f"{name} exits: a health check would never pass"


def test_dependencies_wait_for_health_or_for_successful_completion():
    services = _services()
    for name, service in services.items():
        depends = service.get("depends_on", {})
        assert isinstance(depends, dict), f"{name}: depends_on must name a condition for each dependency"
        for dependency, spec in depends.items():
            assert dependency in services, f"{name} depends on unknown {dependency}"
            expected = "service_completed_successfully" if dependency in ONE_SHOTS else "service_healthy"
            assert spec.get("condition") == expected, f"{name} -> {dependency}: {spec}"


def test_start_order_is_the_order_of_tide_up():
    services = _services()
    assert set(services["migrate"]["depends_on"]) == {"postgres"}
    assert set(services["connect"]["depends_on"]) == {"kafka"}
    assert set(services["register-connector"]["depends_on"]) == {"migrate", "connect"}
    assert set(services["jobs"]["depends_on"]) == {"register-connector", "postgres", "kafka", "elasticsearch", "redis"}
    assert set(services["api"]["depends_on"]) == {"jobs"}


def test_ports_are_published_on_loopback_and_only_where_a_user_needs_them():
    for name, service in _services().items():
        ports = service.get("ports", [])
        assert bool(ports) == (name in PUBLISHED), f"{name} publishes {ports}"
        for port in ports:
            published = re.fullmatch(r"(?P<ip>[^:]+):(?P<host_port>\$\{[^}]+\}):(?P<container_port>\d+)", str(port))
            assert published and published["ip"] == "127.0.0.1", f"{name} publishes {port} beyond loopback"
            host_port, container_port = published["host_port"], published["container_port"]
            setting = f"{name}_port"
            assert host_port == f"${{TIDE_{setting.upper()}:-{StackSettings.model_fields[setting].default}}}", port
            # ... and the container listens on the setting's default, which the container keeps.
            assert int(container_port) == getattr(_container_settings(name), setting), port


def test_state_lives_on_named_volumes_where_the_stack_code_keeps_it():
    compose = _compose()
    declared = set(compose["volumes"])
    state = {name: [_container_settings(name).state_dir / name]
             for name in ("postgres", "redis", "kafka", "elasticsearch")}
    jobs = driver.job_settings(_container_settings("jobs"))
    state["jobs"] = [jobs.checkpoint_dir, jobs.warehouse_dir, jobs.status_file.parent]
    for name, folders in state.items():
        mounts = _mounts(compose["services"][name])
        for folder in folders:
            source, mode = mounts.get(str(folder), (None, None))
            assert source in declared and mode == "rw", f"{name}: {folder} is not on a named volume ({mounts})"
    used = {source for service in compose["services"].values() for source, _ in _mounts(service).values()}
    assert declared <= used, f"declared but unused volumes: {declared - used}"


def test_the_image_creates_each_state_folder_so_fresh_volumes_take_its_owner():
    dockerfile = DOCKERFILE.read_text()
    created = re.search(r"for folder in ([a-z ]+); do", dockerfile)[1].split()
    targets = {target for service in _services().values() for target, (source, _) in _mounts(service).items()
               if not source.startswith(".")}
    assert {str(Path(_image_env()["TIDE_STATE_DIR"]) / folder) for folder in created} == targets


def test_pipeline_file_is_the_repository_one_mounted_read_only_where_it_is_read():
    for name, service in _services().items():
        path = _env(service).get("TIDE_PIPELINE_FILE")
        if path:
            assert _mounts(service)[path] == ("./pipeline.yaml", "ro"), name


# --- one image, one pin file -----------------------------------------------------------------------


def test_every_service_runs_the_one_image_tagged_with_the_project_version():
    version = tomllib.loads(PIN_FILE.read_text())["project"]["version"]
    for name, service in _services().items():
        assert service["image"] == f"tideline:{version}", name


def test_one_service_builds_the_image_with_the_host_network():
    builds = _builds()
    assert list(builds) == ["postgres"], "compose handles postgres first: the image must exist before the others look"
    assert next(iter(_services())) == "postgres"
    (build,) = builds.values()
    assert build["dockerfile"] == "docker/tideline.Dockerfile" and build.get("context", ".") == "."
    assert build["network"] == "host"


def test_every_version_build_arg_equals_the_pin_file():
    (build,) = _builds().values()
    args = {key: str(value) for key, value in build["args"].items()}
    assert set(args) == set(VERSION_ARGS)
    for arg, value in args.items():
        assert value == getattr(pinned(), VERSION_ARGS[arg]), f"{arg}={value}"


def test_dockerfile_version_args_have_no_default_and_are_all_passed_by_compose():
    declared = re.findall(r"^ARG\s+([A-Z0-9_]+)(=.*)?$", DOCKERFILE.read_text(), flags=re.MULTILINE)
    (build,) = _builds().values()
    assert {arg for arg, _ in declared} == set(build["args"])
    for arg, default in declared:
        assert not default, f"ARG {arg} has a default that could drift from the pin file"


def test_the_image_is_built_from_the_base_image_script_makes_and_nothing_pulled():
    script = (DOCKER_DIR / "base-image.sh").read_text()
    base = re.search(r"^image=(\S+)$", script, flags=re.MULTILINE)[1]
    stages = re.findall(r"^FROM (\S+)(?: AS (\S+))?$", DOCKERFILE.read_text(), flags=re.MULTILINE)
    named = {stage for _, stage in stages if stage}
    assert stages[0][0] == base
    assert all(ref in named | {base} for ref, _ in stages), f"an image from elsewhere: {stages}"


def test_the_base_suites_python_satisfies_requires_python():
    suite = re.search(r"^suite=(\S+)$", (DOCKER_DIR / "base-image.sh").read_text(), flags=re.MULTILINE)[1]
    major, minor = DEBIAN_PYTHON[suite]
    requires = tomllib.loads(PIN_FILE.read_text())["project"]["requires-python"]
    assert requires == f">={major}.{minor},<{major}.{minor + 1}"
    assert f"/opt/tideline/venv/lib/python{major}.{minor}/site-packages" in DOCKERFILE.read_text()


def test_the_jars_are_the_ones_tide_stack_fetch_resolved_for_the_pins():
    """The image copies .tideline/lib and runs `tide stack fetch` with no Maven: it fails unless every
    bundle's marker names the pins (services/stack/jars.py)."""
    lines = DOCKERFILE.read_text().splitlines()
    copy = lines.index(f"COPY .tideline/lib {_image_env()['TIDE_LIB_DIR']}")
    assert "RUN tide stack fetch" in lines[copy:]
    assert not [line for line in lines if "mvn " in line and not line.startswith("#")], "Maven runs in the build"


def test_the_python_environment_is_the_lock_installed_from_the_hosts_wheels_without_an_index():
    dockerfile = DOCKERFILE.read_text()
    assert "COPY .tideline/wheels /tmp/wheels" in dockerfile
    assert re.search(r"pip install -q --no-index --find-links /tmp/wheels -r /tmp/requirements\.lock", dockerfile)
    makefile = (PROJECT_ROOT / "Makefile").read_text()
    assert "pip wheel -q --no-deps -r <(sed -E 's/[[:space:]]*;.*//' requirements.lock) -w .tideline/wheels" in makefile


def test_build_context_leaves_secrets_and_local_state_out():
    entries = (PROJECT_ROOT / ".dockerignore").read_text().splitlines()
    for entry in (".env", ".venv", ".tideline", ".git"):
        assert entry in entries, entry
    # From the state folder, only what the image copies: never a stack's data or logs.
    assert [e for e in entries if e.startswith("!.tideline")] == ["!.tideline/lib", "!.tideline/wheels"]


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


def test_secrets_have_no_default_and_reach_only_the_containers_that_use_them():
    for match in _INTERPOLATION.finditer("\n".join(_strings(_compose()))):
        if match["name"].endswith("PASSWORD"):
            assert match["op"] == ":?", f"{match['name']} must be required, never defaulted"
    for name, service in _services().items():
        given = {key for key in _env(service) if key.endswith("PASSWORD")}
        assert given == SECRETS.get(name, set()), name


def test_every_tide_variable_set_in_compose_is_a_real_setting():
    for name, service in _services().items():
        for key in _env(service):
            assert key.startswith("TIDE_") and key.removeprefix("TIDE_").lower() in StackSettings.model_fields, (
                f"{name}: {key} is not a StackSettings field"
            )


def test_settings_set_in_compose_validate(monkeypatch):
    for key in list(os.environ):
        if key.startswith("TIDE_"):
            monkeypatch.delenv(key)
    for name in _services():
        _container_settings(name)


def test_services_listen_beyond_loopback_and_reach_each_other_by_service_name():
    services = _services()
    for name in services:
        settings = _container_settings(name)
        assert not settings.loopback_only, name
        for other in ("postgres", "redis", "kafka", "connect", "elasticsearch"):
            assert settings.host_of(other) == other, f"{name} reaches {other} at {settings.host_of(other)}"
        assert settings.connector_database_host is None  # PostgreSQL as Connect reaches it: its own name


def test_the_jobs_run_with_the_settings_the_local_stack_derives_and_the_api_reads_the_same_stores():
    """The jobs' TIDE_JOB_* come from driver.job_env (as for `tide jobs start`), so the container sets none
    of its own beyond the stack settings of the same name; the API's view of them is the jobs' own."""
    services = _services()
    jobs_env = _env(services["jobs"])
    assert {key for key in jobs_env if key.startswith("TIDE_JOB_")} <= {
        f"TIDE_{field.upper()}" for field in StackSettings.model_fields if field.startswith("job_")
    }
    jobs = driver.job_settings(_container_settings("jobs"))
    api = driver.job_settings(_container_settings("api"))
    assert jobs.elasticsearch_url == "http://elasticsearch:9200" and jobs.kafka_bootstrap == "kafka:9092"
    for field in ("elasticsearch_url", "redis_url", "warehouse_dir", "checkpoint_dir", "status_file", "kafka_bootstrap",
                  "jars_dir"):
        assert getattr(api, field) == getattr(jobs, field), field
    # ... and those paths are the jobs' own named volumes, mounted read-only: the API never writes a view.
    jobs_mounts, api_mounts = _mounts(services["jobs"]), _mounts(services["api"])
    for path in (api.warehouse_dir, api.checkpoint_dir, api.status_file.parent):
        assert api_mounts[str(path)] == (jobs_mounts[str(path)][0], "ro"), path
    assert jobs.jars_dir == Path(_image_env()["TIDE_LIB_DIR"]) / "spark"
    assert JobSettings.model_fields["master"].default == "local[4]"


# --- the connector ------------------------------------------------------------------------------


def test_the_connector_registered_is_the_committed_file():
    assert registration.TEMPLATE == PROJECT_ROOT / "connectors" / "tideline-postgres.json"
    dockerfile = DOCKERFILE.read_text()
    # The source tree is on the environment's path from its WORKDIR, so PROJECT_ROOT there holds connectors/.
    assert "WORKDIR /opt/tideline" in dockerfile and "COPY connectors ./connectors" in dockerfile
    assert "echo /opt/tideline > /opt/tideline/venv/lib/python3.11/site-packages/tideline.pth" in dockerfile
    mounted = [v for s in _services().values() for v in s.get("volumes", []) if "connectors" in v]
    assert not mounted, f"a second connector file is mounted: {mounted}"


def test_connect_worker_has_every_variable_the_connector_config_reads():
    references = set(re.findall(r"\$\{env:([A-Z0-9_]+)\}", registration.TEMPLATE.read_text()))
    assert references == {"TIDE_CDC_USER", "TIDE_CDC_PASSWORD"}
    assert references <= set(_env(_services()["connect"]))


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
