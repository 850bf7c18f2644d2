"""The compose stack the Docker-route tests share, brought up as the README's Docker section says:
a Docker engine (docker/engine.sh starts one when none answers, and it is stopped afterwards),
`make images`, then `docker-compose up -d`; `docker-compose down -v` at the end. Its own compose
project and host ports (tests/conftest.py: compose_ports), so a developer's compose stack and the
test stacks are never touched."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from services.settings import StackSettings
from services.versions import PROJECT_ROOT
from tests.conftest import _PORT_OFFSET, compose_ports
from tests.waiting import wait_until

ENGINE = PROJECT_ROOT / "docker" / "engine.sh"
PROJECT = f"tideline-e2e-{_PORT_OFFSET}"
ONE_SHOTS = ("migrate", "register-connector")
# A cold start on two busy cores: JVMs, then the Spark driver's four queries.
HEALTHY_S = 600


@dataclass(frozen=True)
class ComposeStack:
    # The host's view of the stack: the published ports, the secrets compose read from .env.
    settings: StackSettings
    env: dict[str, str]

    def run(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
        """`docker-compose ARGS` on this project; whatever it returns."""
        return subprocess.run(["docker-compose", "-p", PROJECT, *args], cwd=PROJECT_ROOT, env=self.env,
                              capture_output=True, text=True, timeout=timeout)

    def check(self, *args: str, timeout: float = 600) -> str:
        """`docker-compose ARGS`; its output, or fail with it."""
        result = self.run(*args, timeout=timeout)
        assert result.returncode == 0, f"docker-compose {' '.join(args)}: {result.stdout}{result.stderr}"
        return result.stdout

    def tide(self, service: str, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
        """`tide ARGS` inside a running service's container, as `docker-compose exec` runs it."""
        return self.run("exec", "-T", "-e", "COLUMNS=200", service, "tide", *args, timeout=timeout)

    def states(self) -> dict[str, dict]:
        """Each service's container state (Docker's State: Status, ExitCode, Health)."""
        ids = self.check("ps", "-q").split()
        if not ids:
            return {}
        inspected = subprocess.run(["docker", "inspect", *ids], capture_output=True, text=True, check=True)
        found = json.loads(inspected.stdout)
        return {c["Config"]["Labels"]["com.docker.compose.service"]: c["State"] for c in found}

    def wait_healthy(self, services: list[str] | None = None, timeout: float = HEALTHY_S) -> None:
        """Poll until each long-running service (or each of `services`) is healthy and the one-shots exited 0;
        fail with the states and the last log lines of what is not."""

        def unready() -> dict[str, str]:
            states = self.states()
            wanted = services or list(states)
            return {name: _describe(states.get(name)) for name in wanted if not _ready(name, states.get(name))}

        try:
            wait_until(lambda: not unready(), timeout, f"compose services healthy ({', '.join(services or ['all'])})",
                       interval=2)
        except AssertionError as exc:
            late = unready()
            logs = self.run("logs", "--no-color", "--tail", "40", *late).stdout
            raise AssertionError(f"{exc}; not ready: {late}\n{logs}") from None


def _ready(service: str, state: dict | None) -> bool:
    if state is None:
        return False
    if service in ONE_SHOTS:
        return state["Status"] == "exited" and state["ExitCode"] == 0
    return state["Status"] == "running" and state.get("Health", {}).get("Status") == "healthy"


def _describe(state: dict | None) -> str:
    if state is None:
        return "no container"
    return f"{state['Status']} (exit {state['ExitCode']}, health {state.get('Health', {}).get('Status')})"


def _timed(what: str, argv: list[str], env: dict[str, str], timeout: float) -> None:
    """Run a step of the README's Docker section; print how long it took (pytest -s shows it)."""
    began = time.monotonic()
    result = subprocess.run(argv, cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{what} failed: {result.stdout[-3000:]}{result.stderr[-3000:]}"
    print(f"\ncompose e2e: {what} took {time.monotonic() - began:.0f}s")


@pytest.fixture(scope="session")
def docker_engine() -> Iterator[None]:
    """A Docker engine that answers: the one running, else one docker/engine.sh starts (and stops after)."""
    answers = subprocess.run(["docker", "info"], capture_output=True).returncode == 0
    if not answers:
        _timed("starting the Docker engine", [str(ENGINE), "start"], dict(os.environ), timeout=120)
    yield
    if not answers:
        subprocess.run([str(ENGINE), "stop"], check=True, timeout=300)


@pytest.fixture(scope="module")
def compose_stack(docker_engine: None) -> Iterator[ComposeStack]:
    """The whole pipeline in compose, every service healthy; removed with its volumes afterwards."""
    ports = compose_ports()
    env = {**os.environ, **{f"TIDE_{name.upper()}": str(port) for name, port in ports.items()}}
    stack = ComposeStack(StackSettings(**ports), env)
    stack.run("down", "-v", "--remove-orphans")  # what an interrupted earlier run may have left
    _timed("make images", ["make", "images"], env, timeout=1800)
    began = time.monotonic()
    try:
        stack.check("up", "-d")
        stack.wait_healthy()
        print(f"\ncompose e2e: docker-compose up -d to every service healthy took {time.monotonic() - began:.0f}s")
        yield stack
    finally:
        stack.check("down", "-v", timeout=300)
