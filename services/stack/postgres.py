"""PostgreSQL from Debian's packages: its own cluster in the state folder, logical WAL on."""

from __future__ import annotations

import subprocess
from pathlib import Path

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from services.settings import StackSettings
from services.stack.process import chown_tree, service_home, unprivileged_user
from services.stack.rows import scalar
from services.stack.service import Service, StackError, Unhealthy
from services.versions import pinned

SYSTEM_USER = "postgres"  # created by Debian's postgresql package


def bin_dir() -> Path:
    path = Path(f"/usr/lib/postgresql/{pinned().postgresql}/bin")
    if not (path / "postgres").is_file():
        raise StackError(
            f"PostgreSQL {pinned().postgresql} server not found at {path}: "
            f"install Debian's postgresql-{pinned().postgresql} (run `make setup`)"
        )
    return path


def data_dir(settings: StackSettings) -> Path:
    return service_home(settings.state_dir, "postgres", unprivileged_user(SYSTEM_USER)) / "data"


def conninfo(settings: StackSettings, dbname: str | None = None) -> str:
    return make_conninfo(
        host=settings.host_of("postgres"),
        port=settings.postgres_port,
        dbname=dbname or settings.postgres_db,
        user=settings.postgres_user,
        password=settings.require_postgres_password(),
        connect_timeout=3,
    )


def address(settings: StackSettings) -> str:
    """host:port/database, for messages (never the credentials)."""
    return f"{settings.host_of('postgres')}:{settings.postgres_port}/{settings.postgres_db}"


def prepare(settings: StackSettings) -> None:
    """initdb once (the superuser is TIDE_POSTGRES_USER with a scram password, no trust auth); when the
    server listens beyond loopback, admit password logins from its own subnets too."""
    data = data_dir(settings)
    if not (data / "PG_VERSION").is_file():
        _initdb(settings, data)
    if not settings.loopback_only:
        _admit_own_subnets(data)


# Password logins from the server's own subnets ("samenet").
OWN_SUBNETS_RULE = "host all all samenet scram-sha-256"


def _admit_own_subnets(data: Path) -> None:
    """initdb's pg_hba.conf admits loopback logins only. A server listening beyond loopback is one in a
    container (docker-compose.yml), whose clients are the other containers and the proxy of its published
    port, all on its own subnet: admit password logins from there, and from nowhere else."""
    hba = data / "pg_hba.conf"
    rules = hba.read_text()
    if OWN_SUBNETS_RULE not in rules.splitlines():
        hba.write_text(rules.rstrip("\n")
                       + f"\n# Tideline: listening beyond loopback (services/stack/postgres.py)\n{OWN_SUBNETS_RULE}\n")


def _initdb(settings: StackSettings, data: Path) -> None:
    password = settings.require_postgres_password()
    user = unprivileged_user(SYSTEM_USER)
    data.parent.mkdir(parents=True, exist_ok=True)
    pwfile = data.parent / "initdb.pw"
    pwfile.write_text(password + "\n")
    pwfile.chmod(0o600)
    chown_tree(data.parent, user)
    try:
        result = subprocess.run(
            [
                str(bin_dir() / "initdb"),
                f"--pgdata={data}",
                f"--username={settings.postgres_user}",
                f"--pwfile={pwfile}",
                "--auth=scram-sha-256",
                "--encoding=UTF8",
                "--locale=C.UTF-8",
            ],
            capture_output=True,
            text=True,
            user=user,
        )
    finally:
        pwfile.unlink(missing_ok=True)
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise StackError(f"initdb failed for {data}: {last}")


def command(settings: StackSettings) -> list[str]:
    # Settings on the command line rather than in postgresql.conf: the cluster's
    # config stays stock and what Tideline relies on is visible in one place.
    options = {
        "listen_addresses": settings.host,
        "port": str(settings.postgres_port),
        "unix_socket_directories": "",  # TCP only: no socket paths to own or to outgrow
        "wal_level": "logical",
        "max_replication_slots": "10",
        "max_wal_senders": "10",
        "wal_sender_timeout": "60s",
        "logging_collector": "off",
        "shared_buffers": "256MB",
    }
    argv = [str(bin_dir() / "postgres"), "-D", str(data_dir(settings))]
    for name, value in options.items():
        argv += ["-c", f"{name}={value}"]
    return argv


def probe(settings: StackSettings) -> str:
    # Our own cluster answers on `postgres` before the application database exists; yours on its database.
    database = settings.postgres_db if settings.source_external else "postgres"
    try:
        with psycopg.connect(conninfo(settings, database)) as conn:
            wal_level = scalar(conn, "SHOW wal_level")
    except psycopg.OperationalError as exc:
        message = str(exc).strip().splitlines()[0]
        if "password authentication failed" in message and not settings.source_external:
            # Permanent, not a start-up delay: the cluster was initialised with another password.
            raise StackError(
                f"PostgreSQL rejected TIDE_POSTGRES_USER/TIDE_POSTGRES_PASSWORD: the cluster in {data_dir(settings)} "
                "was created with other credentials; restore them in .env or wipe it with `tide stack down --purge`"
            ) from exc
        raise Unhealthy(message) from exc
    return f"wal_level={wal_level}"


def on_ready(settings: StackSettings) -> None:
    """Set the slot WAL cap and create the application database (initdb only makes `postgres`).

    The cap goes through ALTER SYSTEM rather than the command line, which would outrank it: so it
    can be raised on the running server (ALTER SYSTEM + pg_reload_conf()) while a stopped connector's
    slot nears it (docs/reliability.md, Slot safety). Every start sets it back to the setting."""
    with psycopg.connect(conninfo(settings, "postgres"), autocommit=True) as conn:
        keep = sql.Literal(settings.postgres_max_slot_wal_keep_size)
        conn.execute(sql.SQL("ALTER SYSTEM SET max_slot_wal_keep_size = {}").format(keep))
        conn.execute("SELECT pg_reload_conf()")
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (settings.postgres_db,)).fetchone()
        if not exists:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(settings.postgres_db)))


SERVICE = Service(
    name="postgres",
    port_fields=("postgres_port",),
    command=command,
    probe=probe,
    prepare=prepare,
    on_ready=on_ready,
    user_when_root=SYSTEM_USER,
)
