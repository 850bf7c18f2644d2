"""A PostgreSQL cluster of a test's own, made as a DBA makes one (initdb, pg_ctl), not by Tideline: the
"existing database" Tideline is pointed at with TIDE_POSTGRES_URL. Its data folder is under the
checkout's .tideline/, on a port of the tests' own (tests/conftest.py's bands, shifted)."""

from __future__ import annotations

import secrets
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import psycopg
from psycopg.conninfo import make_conninfo

from services.stack import postgres
from services.stack.process import chown_tree, service_home, unprivileged_user
from services.versions import PROJECT_ROOT

OWNER = "owner"  # the cluster's superuser, as initdb makes it
STATE = PROJECT_ROOT / ".tideline" / "own-clusters"


@dataclass(frozen=True)
class Cluster:
    port: int
    password: str
    database: str

    def url(self, user: str = OWNER, password: str | None = None) -> str:
        return f"postgresql://{user}:{password or self.password}@127.0.0.1:{self.port}/{self.database}"

    def connect(self, user: str = OWNER, password: str | None = None, autocommit: bool = True) -> psycopg.Connection:
        return psycopg.connect(make_conninfo(self.url(user, password), connect_timeout=5), autocommit=autocommit)


def _run(argv: list[str], user: str | None) -> None:
    result = subprocess.run(argv, capture_output=True, text=True, user=user, timeout=120)
    assert result.returncode == 0, f"{' '.join(argv)}: {result.stdout}{result.stderr}"


@contextmanager
def cluster(name: str, port: int, settings: dict[str, str], database: str = "app") -> Iterator[Cluster]:
    """initdb a fresh cluster, start it with `settings` (-c name=value), create `database`; stopped and
    deleted afterwards."""
    user = unprivileged_user(postgres.SYSTEM_USER)
    home = service_home(STATE, name, user)
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    password = secrets.token_hex(12)
    (home / "pw").write_text(password + "\n")
    chown_tree(home, user)
    bin_dir, data = postgres.bin_dir(), home / "data"
    _run([str(bin_dir / "initdb"), f"--pgdata={data}", f"--username={OWNER}", f"--pwfile={home / 'pw'}",
          "--auth=scram-sha-256", "--encoding=UTF8", "--locale=C.UTF-8"], user)
    options = {"listen_addresses": "127.0.0.1", "port": str(port), "unix_socket_directories": "", **settings}
    _run([str(bin_dir / "pg_ctl"), "-D", str(data), "-l", str(home / "log"), "-w", "-t", "60", "start",
          "-o", " ".join(f"-c {key}={value}" for key, value in options.items())], user)
    try:
        made = Cluster(port, password, database)
        with psycopg.connect(make_conninfo(made.url(), dbname="postgres"), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{database}"')
        yield made
    finally:
        subprocess.run([str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"], capture_output=True,
                       user=user, timeout=120)
        shutil.rmtree(home, ignore_errors=True)
