"""`tide up` as a new user runs it, on a fresh state folder: the lines it prints are pasted into bash
as they are (psql with an INSERT typed into it, then curl and redis-cli), and `tide down` leaves
nothing behind. On ports of its own, so the shared test stack is not disturbed.
"""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest

from services.stack import process, runner
from services.up import lifecycle
from tests.conftest import UP_FIELDS
from tests.tide_cli import run_tide
from tests.waiting import wait_until

pytestmark = pytest.mark.stack

# Deadlines, not targets (measured times are in docs/up.md). The warehouse's first Delta batch
# after a start takes over a minute on the 2-core machine.
SEARCHABLE_S = 60
WAREHOUSE_S = 300


def _printed(output: str) -> dict[str, str]:
    """The indented command lines `tide up` printed, by what they are for."""
    lines = [line.strip() for line in output.splitlines() if line.startswith("  ")]
    kinds = {
        "source": lambda line: line.startswith("source "),
        "psql": lambda line: " psql " in line,
        "insert": lambda line: line.startswith("INSERT INTO "),
        "search": lambda line: line.startswith("curl ") and "/search/" in line,
        "cache": lambda line: line.startswith("curl ") and "/cache/" in line,
        "warehouse": lambda line: line.startswith("curl ") and "/warehouse/" in line,
        "redis": lambda line: line.startswith("redis-cli "),
    }
    found = {kind: [line for line in lines if matches(line)] for kind, matches in kinds.items()}
    assert all(len(matching) == 1 for matching in found.values()), output
    return {kind: matching[0] for kind, matching in found.items()}


def _bash(script: str, stdin: str = "") -> str:
    """Run pasted lines in a new bash, in another folder, without the test's TIDE_* variables."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("TIDE_")}
    result = subprocess.run(["bash", "-c", script], input=stdin, env=env, cwd="/", capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, f"{script}\n{result.stdout}{result.stderr}"
    return result.stdout


def _json(line: str) -> dict:
    return json.loads(_bash(line))


def test_tide_up_prints_lines_that_work_as_pasted_and_tide_down_stops_everything(fresh_stack, record_property):
    settings = fresh_stack
    output = run_tide(settings, "up", "--demo", fields=UP_FIELDS)
    assert settings.require_postgres_password() not in output
    printed = _printed(output)

    assert "INSERT 0 1" in _bash(f"{printed['source']}\n{printed['psql']}", stdin=printed["insert"])
    inserted = time.monotonic()
    hits = wait_until(lambda: _json(printed["search"])["hits"], SEARCHABLE_S, "the INSERT to be searchable")
    record_property("insert_searchable_s", round(time.monotonic() - inserted, 1))
    assert [hit["source"]["name"] for hit in hits] == ["Ada Lovelace"]

    cached = wait_until(lambda: _json(printed["cache"]).get("row"), SEARCHABLE_S, "the cache line's row")
    assert cached["id"] == 1
    fields = _bash(printed["redis"]).split("\n")
    assert fields[fields.index("id") + 1] == "1"
    rows = wait_until(lambda: _json(printed["warehouse"])["rows"], WAREHOUSE_S, "warehouse rows")
    assert rows[0]["id"] == 1

    started = {service.name: process.running(runner.pid_file(settings, service)) for service in lifecycle.PROCESSES}
    assert all(started.values()), started
    run_tide(settings, "down", fields=UP_FIELDS)
    assert [name for name, pid in started.items() if process.is_running(pid)] == []
    assert list(settings.run_dir.glob("*.pid")) == []
    assert [port for port in settings.ports().values() if process.port_in_use(settings.host, port)] == []
