"""Drive the stack's members (members.py): one loop for up, down and status, whatever the service, and `serve`
for one service in a container."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from services.settings import StackSettings
from services.stack import postgres, process
from services.stack.jars import ensure
from services.stack.members import every_member, managed, members
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


def select(settings: StackSettings, names: Iterable[str] | None = None) -> list[Service]:
    """The named services of this stack plus everything they start after, in the members' order."""
    known = members(settings)
    wanted = set(names or known)
    unknown = wanted - set(known)
    if unknown:
        raise StackError(f"unknown service {', '.join(sorted(unknown))}; known: {', '.join(known)}")
    pending = list(wanted)
    while pending:
        for dependency in known[pending.pop()].after:
            if dependency not in wanted:
                wanted.add(dependency)
                pending.append(dependency)
    return [service for name, service in known.items() if name in wanted]


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


@dataclass(frozen=True)
class Launch:
    """How to run a prepared service: its argv, working folder, extra environment and user."""

    argv: list[str]
    cwd: Path
    env: dict[str, str]
    user: str | None


def _prepare(settings: StackSettings, service: Service) -> Launch:
    user = process.unprivileged_user(service.user_when_root)
    service.prepare(settings)
    workdir = process.service_home(settings.state_dir, service.name, user)
    workdir.mkdir(parents=True, exist_ok=True)
    process.chown_tree(workdir, user)
    return Launch(service.command(settings), workdir, service.env(settings), user)


def _start(settings: StackSettings, service: Service) -> process.Started:
    launch = _prepare(settings, service)
    return process.start(
        launch.argv,
        pid_file=pid_file(settings, service),
        log_file=log_file(settings, service),
        cwd=launch.cwd,
        env=launch.env,
        user=launch.user,
    )


def up(settings: StackSettings, names: Iterable[str] | None = None, report: Report = lambda n, s: None) -> None:
    """Start what is not running of the named stack services (and what they need); wait until healthy.
    With a source of the user's own (TIDE_POSTGRES_URL) PostgreSQL is only probed: it must answer."""
    ours = managed(settings)
    if names and settings.source_external and postgres.SERVICE.name in names:
        raise StackError("TIDE_POSTGRES_URL names your own PostgreSQL: the stack starts none; "
                         "unset TIDE_POSTGRES_URL to run the local one")
    if settings.source_external and not names:
        report(postgres.SERVICE.name, f"yours, at {postgres.address(settings)}: healthy ({probe_source(settings)})")
    start_and_wait(settings, [service for service in select(settings, names) if service.name in ours], report)


def probe_source(settings: StackSettings) -> str:
    """An existing source either answers or is a one-line StackError: nothing here can start it."""
    try:
        return postgres.probe(settings)
    except Unhealthy as exc:
        raise StackError(f"cannot reach your PostgreSQL at {postgres.address(settings)}: {exc} "
                         "(check TIDE_POSTGRES_URL)") from exc


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
                raise StackError(
                    f"not healthy after {settings.startup_timeout_s:.0f}s: {_why(settings, waiting, last_answer)}")
            time.sleep(0.5)  # poll interval between health probes


def with_dependants(settings: StackSettings, names: Iterable[str]) -> list[Service]:
    """The named services plus every service that starts after them (stopping Kafka stops Connect)."""
    every = every_member(settings)  # the members' order: dependencies come first
    unknown = set(names) - {service.name for service in every}
    if unknown:
        raise StackError(f"unknown service {', '.join(sorted(unknown))}; known: {', '.join(members(settings))}")
    wanted = set(names)
    for service in every:
        if wanted & set(service.after):
            wanted.add(service.name)
    return [service for service in every if service.name in wanted]


def down(settings: StackSettings, names: Iterable[str] | None = None, report: Report = lambda n, s: None) -> None:
    """Stop exactly the processes the stack started (by pid file), dependants first. Data stays."""
    stop(settings, with_dependants(settings, names) if names else every_member(settings), report)


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
    for service in services or members(settings).values():
        started = process.running(pid_file(settings, service))
        healthy, detail = _probe(settings, service) if started else (False, "not running")
        if service.name == postgres.SERVICE.name and settings.source_external:
            healthy, detail = _probe(settings, service)
            detail = f"yours, {postgres.address(settings)}: {detail}"
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


# How often `serve` probes its service: until it is healthy, then while it is (docker/healthy.sh
# calls a pass older than 30 s stale).
SERVE_PROBE_S = {False: 1.0, True: 5.0}


class _Stopping(Exception):
    """Raised in `serve` by the first stop signal, once it is passed on: stop probing, wait for the exit."""


def health_file(settings: StackSettings, service: Service) -> Path:
    """Rewritten by each passing probe while `serve` runs the service, removed by a failing one."""
    return settings.run_dir / f"{service.name}.healthy"


def serve(settings: StackSettings, service: Service, report: Report = lambda n, s: None) -> int:
    """Run one service in the foreground until it exits, as a container's main process; its exit code.

    The same steps as `up` (jars, prepare, command, environment, user; on_ready after the first
    passing probe), but the process writes to this process's output and has no pid file: the
    container is what is started and stopped. SIGTERM and SIGINT are passed on (PostgreSQL stops
    fast on SIGINT), and the first ends the probing. Until then the probe keeps running; `health_file`
    records each pass, so the container's health check (docker/healthy.sh) is this probe without starting
    Python for every check.
    A probe's StackError (a permanent failure) stops the service and propagates."""
    for bundle in service.jar_bundles:
        ensure(settings, bundle)
    launch = _prepare(settings, service)
    health = health_file(settings, service)
    health.parent.mkdir(parents=True, exist_ok=True)
    health.unlink(missing_ok=True)
    child = subprocess.Popen(launch.argv, stdin=subprocess.DEVNULL, cwd=launch.cwd, env={**os.environ, **launch.env},
                             user=launch.user)
    stopping = False

    def pass_on(received: int, frame: object) -> None:
        nonlocal stopping
        child.send_signal(received)
        if not stopping:  # the first one ends the probing too (a probe of a stopping Kafka waits 30 s)
            stopping = True
            raise _Stopping

    previous = {signum: signal.signal(signum, pass_on) for signum in (signal.SIGTERM, signal.SIGINT)}
    healthy = ready = False
    try:
        report(service.name, f"started (pid {child.pid})")
        while child.poll() is None:
            passed, detail = _probe(settings, service)
            if passed and not ready:
                service.on_ready(settings)
                ready = True
            if passed != healthy:
                report(service.name, f"healthy ({detail})" if passed else f"unhealthy: {detail}")
            healthy = passed
            if healthy:
                health.write_text(detail + "\n")
            else:
                health.unlink(missing_ok=True)
            with contextlib.suppress(subprocess.TimeoutExpired):  # still running: probe again
                child.wait(timeout=SERVE_PROBE_S[healthy])
    except _Stopping:
        health.unlink(missing_ok=True)
        report(service.name, "stopping")
        child.wait()
    finally:
        health.unlink(missing_ok=True)
        if child.poll() is None:
            child.terminate()
            child.wait()
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    code = child.returncode
    if code < 0:  # ended by a signal: exit as a shell reports it (143 for SIGTERM)
        report(service.name, f"stopped by {signal.Signals(-code).name}")
        return 128 - code
    report(service.name, f"exited ({code})")
    return code
