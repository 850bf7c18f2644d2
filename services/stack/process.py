"""Start, find and stop stack processes by pid file.

A pid file records the pid *and* the process's start time (from /proc), so
`down` only ever signals the exact process the stack started, never a recycled
pid. (Not the argv: Redis and others rewrite their process title.)
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from services.stack.service import StackError


@dataclass(frozen=True)
class Started:
    pid: int
    start_ticks: int


def read_pid_file(path: Path) -> Started | None:
    try:
        data = json.loads(path.read_text())
        return Started(pid=int(data["pid"]), start_ticks=int(data["start_ticks"]))
    except (FileNotFoundError, ValueError, KeyError):
        return None


def _reap(pid: int) -> None:
    """Collect the exit status if the process is our own child, so it does not linger as a zombie."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, start time in clock ticks since boot) of a pid, or None if there is no such process."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return fields[0], int(fields[19])


def _threads_alive(pid: int) -> bool:
    """Whether any thread of the process is still alive. A killed multi-threaded process (a JVM)
    shows its main thread as a zombie while the other threads still exit and hold its sockets."""
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except (FileNotFoundError, ProcessLookupError):
        return False
    for task in tasks:
        try:
            if (task / "stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X"):
                return True
        except (FileNotFoundError, ProcessLookupError):
            continue
    return False


def is_running(started: Started) -> bool:
    _reap(started.pid)
    stat = _stat(started.pid)
    if stat is None or stat[1] != started.start_ticks:
        return False
    return stat[0] != "Z" or _threads_alive(started.pid)


def running(pid_file: Path) -> Started | None:
    started = read_pid_file(pid_file)
    return started if started and is_running(started) else None


def port_in_use(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


def unprivileged_user(name: str | None) -> str | None:
    """The user to run as: `name` when we are root, else ourselves (None)."""
    if name is None or os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam(name)
    except KeyError:
        raise StackError(
            f"user '{name}' does not exist; it is needed to run a service as non-root: run `make setup`"
        ) from None
    return name


# Where services that refuse root keep their files when the state folder is not
# reachable by their unprivileged user (e.g. a checkout under a 0700 home folder).
FALLBACK_ROOT = Path("/var/lib/tideline")


def _reachable(path: Path, user: str) -> bool:
    return subprocess.run(["test", "-x", str(path)], user=user).returncode == 0


def service_home(state_dir: Path, name: str, user: str | None) -> Path:
    """The folder a service keeps its files in: `<state>/<name>`, or, when `user` cannot reach
    the state folder, a folder under /var/lib/tideline that `<state>/<name>` links to."""
    home = state_dir / name
    state_dir.mkdir(parents=True, exist_ok=True)
    if user is None or home.is_symlink() or _reachable(state_dir, user):
        return home.resolve() if home.is_symlink() else home
    digest = hashlib.sha1(str(state_dir.resolve()).encode()).hexdigest()[:12]
    real = FALLBACK_ROOT / digest / name
    real.mkdir(parents=True, exist_ok=True)
    FALLBACK_ROOT.chmod(0o755)
    if home.exists():
        raise StackError(f"{home} is not reachable by user '{user}'; move the state folder (TIDE_STATE_DIR) elsewhere")
    home.symlink_to(real, target_is_directory=True)
    return real


def purge(state_dir: Path) -> None:
    """Delete the state folder and any service folder it links to outside itself."""
    if state_dir.is_dir():
        for entry in state_dir.iterdir():
            if entry.is_symlink():
                shutil.rmtree(entry.resolve(), ignore_errors=True)
    shutil.rmtree(state_dir, ignore_errors=True)


def chown_tree(path: Path, user: str | None) -> None:
    if user is None:
        return
    entry = pwd.getpwnam(user)
    for root, dirs, files in os.walk(path):
        os.chown(root, entry.pw_uid, entry.pw_gid)
        for name in dirs + files:
            os.chown(os.path.join(root, name), entry.pw_uid, entry.pw_gid, follow_symlinks=False)


@contextmanager
def _ctrl_c_deferred() -> Iterator[None]:
    """Hold a Ctrl-C until the block ends: between starting a process and writing its pid file it
    would leave a process nothing can find to stop. (A handler, not a blocked signal: a child
    inherits a blocked mask, but exec resets a handler.)"""
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread receives signals
        return
    received: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: received.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if received and callable(previous):
            previous(signal.SIGINT, None)  # the default handler raises KeyboardInterrupt


def start(
    argv: list[str], *, pid_file: Path, log_file: Path, cwd: Path, env: dict[str, str], user: str | None
) -> Started:
    """Start argv detached in its own session (it outlives `tide`, and Ctrl-C in tide does not reach it)."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    pid_file.parent.mkdir(parents=True, exist_ok=True)
    with _ctrl_c_deferred(), open(log_file, "ab") as log:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env={**os.environ, **env},
            start_new_session=True,
            user=user,
        )
        stat = _stat(proc.pid)
        started = Started(pid=proc.pid, start_ticks=stat[1] if stat else -1)
        pid_file.write_text(json.dumps({"pid": started.pid, "start_ticks": started.start_ticks, "argv": argv}))
    return started


def stop(pid_file: Path, timeout_s: float = 60.0) -> bool:
    """SIGTERM the process group, SIGKILL it after timeout_s. Returns whether anything was running."""
    started = running(pid_file)
    if started is None:
        pid_file.unlink(missing_ok=True)
        return False
    _signal_group(started.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while is_running(started) and time.monotonic() < deadline:
        time.sleep(0.2)  # poll: waiting for the process to exit
    if is_running(started):
        _signal_group(started.pid, signal.SIGKILL)
        while is_running(started):
            time.sleep(0.1)  # poll: SIGKILL is asynchronous
    pid_file.unlink(missing_ok=True)
    return True


def _signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, sig)
