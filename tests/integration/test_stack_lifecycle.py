"""`up` is idempotent, `down` stops exactly what `up` started, and a taken port is a clear error.

Runs PostgreSQL and Redis (the fast services) in a private state folder on
private ports, so it never disturbs the shared test stack.
"""

from __future__ import annotations

import socket
from pathlib import Path

import psycopg
import pytest

from services.settings import StackSettings
from services.stack import postgres, process, runner
from services.stack.service import StackError
from tests.conftest import stack_ports

SERVICES = ["postgres", "redis"]


@pytest.fixture
def mini_settings(tmp_path_factory) -> StackSettings:
    settings = StackSettings(
        state_dir=tmp_path_factory.mktemp("mini-stack"),
        **stack_ports(1, shift=20),
    )
    yield settings
    runner.down(settings, SERVICES)
    process.purge(settings.state_dir)


def _pids(settings: StackSettings) -> dict[str, int]:
    return {
        service.name: started.pid
        for service in runner.select(settings, SERVICES)
        if (started := process.running(runner.pid_file(settings, service)))
    }


def test_up_twice_keeps_the_same_processes_and_down_stops_them(mini_settings):
    runner.up(mini_settings, SERVICES)
    first = _pids(mini_settings)
    assert set(first) == set(SERVICES)

    runner.up(mini_settings, SERVICES)
    assert _pids(mini_settings) == first

    with psycopg.connect(postgres.conninfo(mini_settings)) as conn:
        assert conn.execute("SHOW wal_level").fetchone()[0] == "logical"
        assert conn.execute("SELECT current_database()").fetchone()[0] == mini_settings.postgres_db

    runner.down(mini_settings, SERVICES)
    assert _pids(mini_settings) == {}
    assert [pid for pid in first.values() if _alive(pid)] == []
    assert not process.port_in_use(mini_settings.host, mini_settings.postgres_port)
    assert not process.port_in_use(mini_settings.host, mini_settings.redis_port)
    # Data stays: a second up finds the same cluster without initdb.
    assert (postgres.data_dir(mini_settings) / "PG_VERSION").is_file()


def _alive(pid: int) -> bool:
    """A process exists and is not a zombie waiting to be reaped by init."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_taken_port_is_named_with_its_setting_and_nothing_starts(mini_settings):
    with socket.socket() as squatter:
        squatter.bind((mini_settings.host, mini_settings.redis_port))
        squatter.listen()
        with pytest.raises(StackError, match=rf"port {mini_settings.redis_port} for redis is already in use "
                                             r".* set TIDE_REDIS_PORT"):
            runner.up(mini_settings, SERVICES)
    assert _pids(mini_settings) == {}
