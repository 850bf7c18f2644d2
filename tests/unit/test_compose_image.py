"""The one image (docker/tideline.Dockerfile, docker/base-image.sh) checked from the files alone: every
version agrees with the one pin file, nothing is pulled or fetched, no secret or local state goes in."""

from __future__ import annotations

import re
import tomllib

from services.versions import PIN_FILE, PROJECT_ROOT, pinned
from spark_jobs.runtime import class_archive
from tests.unit.compose_files import DOCKER_DIR, DOCKERFILE, compose_services, image_env

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


def _builds() -> dict[str, dict]:
    return {name: service["build"] for name, service in compose_services().items() if "build" in service}


# --- one image, one pin file -----------------------------------------------------------------------


def test_every_service_runs_the_one_image_tagged_with_the_project_version():
    version = tomllib.loads(PIN_FILE.read_text())["project"]["version"]
    for name, service in compose_services().items():
        assert service["image"] == f"tideline:{version}", name


def test_one_service_builds_the_image_with_the_host_network():
    builds = _builds()
    assert list(builds) == ["postgres"], "compose handles postgres first: the image must exist before the others look"
    assert next(iter(compose_services())) == "postgres"
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
    copy = lines.index(f"COPY .tideline/lib {image_env()['TIDE_LIB_DIR']}")
    assert "RUN tide stack fetch --no-class-archive" in lines[copy:]
    assert not [line for line in lines if "mvn " in line and not line.startswith("#")], "Maven runs in the build"


def test_the_hosts_spark_class_archive_stays_out_of_the_build_context():
    """It names the host's class path (spark_jobs/runtime/class_archive.py) and is about 200 MB."""
    ignored = (PROJECT_ROOT / ".dockerignore").read_text().splitlines()
    assert f".tideline/lib/spark/{class_archive.ARCHIVE}" in ignored
    assert ignored.index(f".tideline/lib/spark/{class_archive.ARCHIVE}") > ignored.index("!.tideline/lib")


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

