"""Drive the service catalogue: one loop for up, down and status, whatever the service."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from services.settings import StackSettings
from services.stack import process
from services.stack.catalogue import CATALOGUE
from services.stack.jars import ensure
from services.stack.service import Service, StackError, Unhealthy

Report = Callable[[str, str], None]


@dataclass(frozen=True)
class ServiceStatus:
    name: str
    pid: int | None
    port: int | None
    healthy: bool
    detail: str
    log: Path


def pid_file(settings: StackSettings, service: Service) -> Path:
    return settings.run_dir / f"{service.name}.pid"


def log_file(settings: StackSettings, service: Service) -> Path:
    return settings.logs_dir / f"{service.name}.log"


def select(names: Iterable[str] | None = None) -> list[Service]:
    """The named services plus everything they start after, in catalogue order."""
    wanted = set(names or CATALOGUE)
    unknown = wanted - set(CATALOGUE)
    if unknown:
        raise StackError(f"unknown service {', '.join(sorted(unknown))}; known: {', '.join(CATALOGUE)}")
    pending = list(wanted)
    while pending:
        for dependency in CATALOGUE[pending.pop()].after:
            if dependency not in wanted:
                wanted.add(dependency)
                pending.append(dependency)
    return [service for name, service in CATALOGUE.items() if name in wanted]


def _probe(settings: StackSettings, service: Service) -> tuple[bool, str]:
    """(healthy, detail). A StackError from a probe is permanent and propagates: no point waiting."""
    try:
        return True, service.probe(settings)
    except Unhealthy as exc:
        return False, str(exc)


def _why(settings: StackSettings, waiting: list[Service], last_answer: dict[str, str]) -> str:
    return "; ".join(
        f"{s.name}: {last_answer.get(s.name, 'not started')} (log: {log_file(settings, s)})" for s in waiting
    )


def _last_line(path: Path) -> str:
    try:
        lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except FileNotFoundError:
        return "(no log)"
    return lines[-1][:300] if lines else "(empty log)"


def _preflight(settings: StackSettings, services: list[Service]) -> None:
    """Fail before starting anything: a port already taken is the usual culprit."""
    for service in services:
        if process.running(pid_file(settings, service)):
            continue
        for field in service.port_fields:
            port = getattr(settings, field)
            if process.port_in_use(settings.host, port):
                raise StackError(
                    f"port {port} for {service.name} is already in use on {settings.host}: "
                    f"stop what listens there or set TIDE_{field.upper()}"
                )


def _start(settings: StackSettings, service: Service) -> process.Started:
    user = process.unprivileged_user(service.user_when_root)
    service.prepare(settings)
    workdir = process.service_home(settings.state_dir, service.name, user)
    workdir.mkdir(parents=True, exist_ok=True)
    process.chown_tree(workdir, user)
    return process.start(
        service.command(settings),
        pid_file=pid_file(settings, service),
        log_file=log_file(settings, service),
        cwd=workdir,
        env=service.env(settings),
        user=user,
    )


def up(settings: StackSettings, names: Iterable[str] | None = None, report: Report = lambda n, s: None) -> None:
    """Start what is not running of the named stack services (and what they need); wait until healthy."""
    start_and_wait(settings, select(names), report)


def start_and_wait(settings: StackSettings, services: list[Service], report: Report = lambda n, s: None) -> None:
    """Start what is not running and wait until every given service is healthy.

    Idempotent: running services are left alone. Services whose `after`
    dependencies are healthy start together; the loop then polls every probe
    until all pass, a process dies, or the deadline passes.
    """
    settings.state_dir.mkdir(parents=True, exist_ok=True)
    _preflight(settings, services)
    for bundle in dict.fromkeys(b for service in services for b in service.jar_bundles):
        report(bundle, "resolving jars")
        ensure(settings, bundle)

    healthy: set[str] = set()
    # The last probe answer per service: a time-out names why, not only who (e.g. the driver's own error).
    last_answer: dict[str, str] = {}
    started: dict[str, process.Started] = {}
    for service in services:
        if existing := process.running(pid_file(settings, service)):
            started[service.name] = existing
    deadline = time.monotonic() + settings.startup_timeout_s
    while len(healthy) < len(services):
        for service in services:
            if service.name in healthy:
                continue
            if service.name not in started:
                if all(dep in healthy or dep not in {s.name for s in services} for dep in service.after):
                    report(service.name, "starting")
                    started[service.name] = _start(settings, service)
                continue
            if not process.is_running(started[service.name]):
                log = log_file(settings, service)
                raise StackError(f"{service.name} exited during start-up: {_last_line(log)} (log: {log})")
            ok, detail = _probe(settings, service)
            last_answer[service.name] = detail
            if ok:
                service.on_ready(settings)
                healthy.add(service.name)
                report(service.name, f"healthy ({detail})")
        if len(healthy) < len(services):
            if time.monotonic() > deadline:
                waiting = [s for s in services if s.name not in healthy]
                raise StackError(f"not healthy after {settings.startup_timeout_s:.0f}s: {_why(settings, waiting, last_answer)}")
            time.sleep(0.5)  # poll interval between health probes


def with_dependants(names: Iterable[str]) -> list[Service]:
    """The named services plus every service that starts after them (stopping Kafka stops Connect)."""
    wanted = {service.name for service in select(names) if service.name in set(names)}
    for service in CATALOGUE.values():  # catalogue order: dependencies come first
        if wanted & set(service.after):
            wanted.add(service.name)
    return [service for name, service in CATALOGUE.items() if name in wanted]


def down(settings: StackSettings, names: Iterable[str] | None = None, report: Report = lambda n, s: None) -> None:
    """Stop exactly the processes the stack started (by pid file), dependants first. Data stays."""
    stop(settings, with_dependants(names) if names else list(CATALOGUE.values()), report)


def stop(settings: StackSettings, services: list[Service], report: Report = lambda n, s: None) -> list[str]:
    """Stop the given services by pid file, last first (they are in start order); the names stopped."""
    stopped = []
    for service in reversed(services):
        if process.stop(pid_file(settings, service)):
            report(service.name, "stopped")
            stopped.append(service.name)
    return stopped


def status(settings: StackSettings, services: Iterable[Service] | None = None) -> list[ServiceStatus]:
    rows = []
    for service in services or CATALOGUE.values():
        started = process.running(pid_file(settings, service))
        healthy, detail = _probe(settings, service) if started else (False, "not running")
        rows.append(
            ServiceStatus(
                name=service.name,
                pid=started.pid if started else None,
                port=service.port(settings),
                healthy=healthy,
                detail=detail,
                log=log_file(settings, service),
            )
        )
    return rows
