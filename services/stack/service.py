"""What the stack runner needs to know about one service: how to prepare, start and probe it.

A service is data, not code paths: the runner drives every member of the
stack (members.py) through the same loop (prepare → start → poll health).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from services.settings import StackSettings
from spark_jobs.model.errors import TidelineError


class StackError(TidelineError):
    """A one-line, user-facing problem with the stack; the message names the fix."""


class Unhealthy(Exception):
    """A health probe did not pass (yet); the message says what was seen."""


def _nothing(settings: StackSettings) -> None:
    return None


@dataclass(frozen=True)
class Service:
    name: str
    # Settings field names of every port the service binds; the first is the one users connect to.
    port_fields: tuple[str, ...]
    # argv of the foreground process; the runner owns daemonising, logs and the pid file.
    command: Callable[[StackSettings], list[str]]
    # Raises Unhealthy while the service is not ready; returns a short detail once it is.
    probe: Callable[[StackSettings], str]
    # One-time or idempotent setup before start (initdb, storage format, config rendering).
    prepare: Callable[[StackSettings], None] = _nothing
    # Runs once after the first healthy probe of a start (e.g. create the application database).
    on_ready: Callable[[StackSettings], None] = _nothing
    # Services that must be healthy before this one starts.
    after: tuple[str, ...] = ()
    # Maven jar bundles (services/stack/jars.py) resolved before the first start.
    jar_bundles: tuple[str, ...] = ()
    # Unprivileged user to run as when tide runs as root (PostgreSQL and Elasticsearch refuse root).
    user_when_root: str | None = None
    env: Callable[[StackSettings], dict[str, str]] = field(default=lambda settings: {})

    def port(self, settings: StackSettings) -> int | None:
        return getattr(settings, self.port_fields[0]) if self.port_fields else None
