"""docker-compose.yml's services and their wiring, checked from the files alone (no Docker engine): what
runs, health checks, start order, published ports, volumes, and the connector the stack registers."""

from __future__ import annotations

import re
from pathlib import Path

from services.capture.connector import registration
from services.jobs import driver
from services.settings import StackSettings
from services.stack import runner
from services.up import lifecycle
from services.versions import PROJECT_ROOT
from tests.unit.compose_files import (
    DOCKER_DIR,
    DOCKERFILE,
    cluster_services,
    compose_services,
    compose_yaml,
    container_settings,
    image_env,
    service_env,
    volume_mounts,
)

ONE_SHOTS = {"migrate": ["tide", "db", "migrate"], "register-connector": ["tide", "connector", "apply"]}
# Every process `tide up` runs is a long-running service of the same name, plus the one-shots.
SERVED = [service.name for service in lifecycle.PROCESSES]
# Services a user reaches from the host; everything else stays on the compose network.
PUBLISHED = {"postgres", "redis", "elasticsearch", "api"}


# --- services and wiring -----------------------------------------------------------------------


def test_compose_runs_every_process_of_tide_up_and_the_one_shots():
    assert set(compose_services()) == set(SERVED) | set(ONE_SHOTS)


def test_each_long_running_service_is_tide_serve_with_its_own_probe_as_health_check():
    for name in SERVED:
        service = compose_services()[name]
        assert service["command"] == ["tide", "serve", name], name
        assert service["healthcheck"]["test"] == ["CMD", "/opt/tideline/docker/healthy.sh", name], name
        assert service.get("restart") == "unless-stopped", name
        assert service.get("init") is True, f"{name}: docker-init must pass `docker stop`'s signal on"


def test_the_health_check_reads_the_file_tide_serve_writes():
    """docker/healthy.sh's path is runner.health_file's, in the image's state folder (behaviour: test_serve.py)."""
    state_dir = Path(image_env()["TIDE_STATE_DIR"])
    service = lifecycle.process_named("jobs")
    assert runner.health_file(StackSettings(_env_file=None, state_dir=state_dir), service) == (
        state_dir / "run" / "jobs.healthy"
    )
    assert '"${TIDE_STATE_DIR:?}/run/${1:?usage: healthy.sh SERVICE}.healthy"' \
        in (DOCKER_DIR / "healthy.sh").read_text()
    assert "COPY docker/healthy.sh ./docker/healthy.sh" in DOCKERFILE.read_text()


def test_one_shots_run_the_tide_commands_once():
    for name, command in ONE_SHOTS.items():
        service = compose_services()[name]
        assert service["command"] == command, name
        assert service.get("restart") == "no", name
        assert "healthcheck" not in service, f"{name} exits: a health check would never pass"


def test_dependencies_wait_for_health_or_for_successful_completion():
    services = compose_services()
    for name, service in services.items():
        depends = service.get("depends_on", {})
        assert isinstance(depends, dict), f"{name}: depends_on must name a condition for each dependency"
        for dependency, spec in depends.items():
            assert dependency in services, f"{name} depends on unknown {dependency}"
            expected = "service_completed_successfully" if dependency in ONE_SHOTS else "service_healthy"
            assert spec.get("condition") == expected, f"{name} -> {dependency}: {spec}"


def test_start_order_is_the_order_of_tide_up():
    services = compose_services()
    assert set(services["migrate"]["depends_on"]) == {"postgres"}
    assert set(services["connect"]["depends_on"]) == {"kafka"}
    assert set(services["register-connector"]["depends_on"]) == {"migrate", "connect"}
    assert set(services["jobs"]["depends_on"]) == {"register-connector", "postgres", "kafka", "elasticsearch", "redis"}
    assert set(services["api"]["depends_on"]) == {"jobs"}


def test_ports_are_published_on_loopback_and_only_where_a_user_needs_them():
    for name, service in compose_services().items():
        ports = service.get("ports", [])
        assert bool(ports) == (name in PUBLISHED), f"{name} publishes {ports}"
        for port in ports:
            published = re.fullmatch(r"(?P<ip>[^:]+):(?P<host_port>\$\{[^}]+\}):(?P<container_port>\d+)", str(port))
            assert published and published["ip"] == "127.0.0.1", f"{name} publishes {port} beyond loopback"
            host_port, container_port = published["host_port"], published["container_port"]
            setting = f"{name}_port"
            assert host_port == f"${{TIDE_{setting.upper()}:-{StackSettings.model_fields[setting].default}}}", port
            # ... and the container listens on the setting's default, which the container keeps.
            assert int(container_port) == getattr(container_settings(name), setting), port


def test_state_lives_on_named_volumes_where_the_stack_code_keeps_it():
    compose = compose_yaml()
    declared = set(compose["volumes"])
    state = {name: [container_settings(name).state_dir / name]
             for name in ("postgres", "redis", "kafka", "elasticsearch")}
    jobs = driver.job_settings(container_settings("jobs"))
    state["jobs"] = [jobs.checkpoint_dir, jobs.warehouse_dir, jobs.status_file.parent]
    for name, folders in state.items():
        mounts = volume_mounts(compose["services"][name])
        for folder in folders:
            source, mode = mounts.get(str(folder), (None, None))
            assert source in declared and mode == "rw", f"{name}: {folder} is not on a named volume ({mounts})"
    used = {source for service in compose["services"].values() for source, _ in volume_mounts(service).values()}
    assert declared <= used, f"declared but unused volumes: {declared - used}"


def test_the_image_creates_each_state_folder_so_fresh_volumes_take_its_owner():
    dockerfile = DOCKERFILE.read_text()
    created = re.search(r"for folder in ([a-z0-9 -]+); do", dockerfile)[1].split()
    targets = {target for service in cluster_services().values()
               for target, (source, _) in volume_mounts(service).items() if not source.startswith(".")}
    assert {str(Path(image_env()["TIDE_STATE_DIR"]) / folder) for folder in created} == targets


def test_pipeline_file_is_the_repository_one_mounted_read_only_where_it_is_read():
    for name, service in compose_services().items():
        path = service_env(service).get("TIDE_PIPELINE_FILE")
        if path:
            assert volume_mounts(service)[path] == ("./pipeline.yaml", "ro"), name

# --- the connector ------------------------------------------------------------------------------


def test_the_connector_registered_is_the_committed_file():
    assert registration.TEMPLATE == PROJECT_ROOT / "connectors" / "tideline-postgres.json"
    dockerfile = DOCKERFILE.read_text()
    # The source tree is on the environment's path from its WORKDIR, so PROJECT_ROOT there holds connectors/.
    assert "WORKDIR /opt/tideline" in dockerfile and "COPY connectors ./connectors" in dockerfile
    assert "echo /opt/tideline > /opt/tideline/venv/lib/python3.11/site-packages/tideline.pth" in dockerfile
    mounted = [v for s in compose_services().values() for v in s.get("volumes", []) if "connectors" in v]
    assert not mounted, f"a second connector file is mounted: {mounted}"


def test_connect_worker_has_every_variable_the_connector_config_reads():
    references = set(re.findall(r"\$\{env:([A-Z0-9_]+)\}", registration.TEMPLATE.read_text()))
    assert references == {"TIDE_CDC_USER", "TIDE_CDC_PASSWORD"}
    assert references <= set(service_env(compose_services()["connect"]))
