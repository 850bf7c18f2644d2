"""docker-compose.yml and the image's Dockerfile as the test_compose_* unit tests read them, without a Docker
engine (tests/compose/ runs the stack itself): the services, their environment, mounts and settings."""

from __future__ import annotations

import re

import yaml

from services.settings import StackSettings
from services.versions import PROJECT_ROOT

COMPOSE_FILE = PROJECT_ROOT / "docker-compose.yml"
# The cluster profile's override (docs/cluster.md).
CLUSTER_FILE = PROJECT_ROOT / "docker-compose.cluster.yml"
ENV_EXAMPLE = PROJECT_ROOT / ".env.example"
DOCKER_DIR = PROJECT_ROOT / "docker"
DOCKERFILE = DOCKER_DIR / "tideline.Dockerfile"
# ${VAR}, ${VAR:-default}, ${VAR-default}, ${VAR:?error}, ${VAR?error}; $$ is a literal dollar.
INTERPOLATION = re.compile(r"(?<!\$)\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?P<op>:?[-?])?(?P<arg>[^}]*)\}")


def compose_yaml() -> dict:
    return yaml.safe_load(COMPOSE_FILE.read_text())


def compose_services() -> dict[str, dict]:
    return compose_yaml()["services"]


def cluster_services() -> dict[str, dict]:
    """The services with the cluster override on top, merged as compose merges them: a service's keys
    replaced, its environment and depends_on mappings joined."""
    merged = {name: dict(service) for name, service in compose_services().items()}
    for name, override in yaml.safe_load(CLUSTER_FILE.read_text())["services"].items():
        service = merged.setdefault(name, {})
        for key, value in override.items():
            joined = isinstance(value, dict) and key in ("environment", "depends_on")
            service[key] = {**service.get(key, {}), **value} if joined else value
    return merged


def service_env(service: dict) -> dict[str, str]:
    return {key: str(value) for key, value in (service.get("environment") or {}).items()}


def _resolve_defaults(value: str) -> str:
    """The value compose would use with no .env: the default, or a stand-in for a required secret."""
    return INTERPOLATION.sub(lambda m: m["arg"] if m["op"] in (":-", "-") else "from-dot-env", value)


def container_settings(name: str, services: dict[str, dict] | None = None) -> StackSettings:
    """The `tide` settings inside a service's container (of `services`, default docker-compose.yml's): its
    environment, plus the image's own."""
    service = (services or compose_services())[name]
    env = {**image_env(), **{key: _resolve_defaults(value) for key, value in service_env(service).items()}}
    fields = {key.removeprefix("TIDE_").lower(): value for key, value in env.items() if key.startswith("TIDE_")}
    return StackSettings(_env_file=None, **{k: v for k, v in fields.items() if k in StackSettings.model_fields})


def image_env() -> dict[str, str]:
    """ENV of the Dockerfile's last stage (the image the services run)."""
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    last = text.rsplit("\nFROM ", 1)[1]
    env: dict[str, str] = {}
    for line in last.splitlines():
        if line.startswith("ENV "):
            env.update(pair.split("=", 1) for pair in line.split()[1:])
    return env


def volume_mounts(service: dict) -> dict[str, tuple[str, str]]:
    """Container path -> (source, mode) of each volume."""
    found = {}
    for volume in service.get("volumes", []):
        source, target, *mode = volume.split(":")
        found[target] = (source, mode[0] if mode else "rw")
    return found
