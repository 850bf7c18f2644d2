"""`tide warehouse optimize` without Spark: which sinks, which tables, and pausing only what ran
(the compaction itself runs on real Delta tables: tests/integration/sink_delta/test_warehouse.py)."""

from __future__ import annotations

import time

import pytest

from services.jobs import driver
from services.settings import StackSettings
from services.stack.service import StackError
from services.warehouse.maintenance import check_retention, check_sinks, describe, paused, stopped
from spark_jobs.runtime import control
from spark_jobs.sinks.delta.maintenance import Maintained, delta_tables


def test_the_delta_sinks_are_maintained_unless_some_are_named_and_others_are_refused():
    assert check_sinks(None) == ["warehouse", "analytics"]
    assert check_sinks(["analytics", "analytics"]) == ["analytics"]
    with pytest.raises(StackError, match="cache: not a Delta sink"):
        check_sinks(["warehouse", "cache"])
    with pytest.raises(StackError, match="cannot be negative"):
        check_retention(-1)
    check_retention(0)


def test_delta_tables_are_the_folders_with_a_log_and_not_the_folders_inside_them(tmp_path):
    for table in ("orders", "_tideline/tombstones", "_tideline/analytics/orders"):
        (tmp_path / table / "_delta_log").mkdir(parents=True)
    (tmp_path / "orders" / "part=1" / "_delta_log").mkdir(parents=True)  # inside a table: not another
    (tmp_path / "empty").mkdir()
    found = delta_tables([str(tmp_path / "orders"), str(tmp_path / "_tideline"), str(tmp_path / "missing")])
    assert found == [str(tmp_path / "_tideline/analytics/orders"), str(tmp_path / "_tideline/tombstones"),
                     str(tmp_path / "orders")]


def _report(sink: str, *, active: bool, paused: bool, age_s: float = 0.0) -> dict:
    return {"queries": {sink: {"active": active, "paused": paused,
                               "reported_at_ms": (time.time() - age_s) * 1000}}}


def test_a_query_counts_as_stopped_once_paused_or_when_its_driver_no_longer_reports():
    now = time.time()
    assert stopped(None, {"warehouse"}, now)
    assert not stopped(_report("warehouse", active=True, paused=False), {"warehouse"}, now)
    assert not stopped(_report("warehouse", active=True, paused=True), {"warehouse"}, now)
    assert stopped(_report("warehouse", active=False, paused=True), {"warehouse"}, now)
    assert stopped(_report("warehouse", active=True, paused=False, age_s=driver.STATUS_STALE_S + 5),
                   {"warehouse"}, now)
    assert stopped(_report("search", active=True, paused=False), {"warehouse"}, now)


def test_pausing_resumes_only_what_it_paused_even_when_the_work_fails(tmp_path):
    settings = StackSettings(_env_file=None, state_dir=tmp_path)
    path = driver.paused_file(settings)
    control.write_paused(path, {"analytics"})
    with pytest.raises(RuntimeError), paused(settings, ["warehouse", "analytics"], lambda line: None):
        assert control.read_paused(path) == {"warehouse", "analytics"}
        control.write_paused(path, control.read_paused(path) | {"search"})  # the operator, meanwhile
        raise RuntimeError("compaction failed")
    assert control.read_paused(path) == {"analytics", "search"}


@pytest.mark.parametrize(("argv", "line"), [
    (["--sink", "cache"],
     "error: cache: not a Delta sink; `tide warehouse optimize --sink` takes warehouse or analytics"),
    (["--retain-hours", "-1"], "error: --retain-hours -1: a retention cannot be negative (Delta's default: 168)"),
])
def test_the_command_refuses_what_it_cannot_do_in_one_line(argv, line):
    from typer.testing import CliRunner

    from services.cli import app

    result = CliRunner().invoke(app, ["warehouse", "optimize", *argv])
    assert result.exit_code == 1
    assert result.output.strip() == line


def test_a_table_is_reported_by_its_name_under_the_state_folder(tmp_path):
    done = Maintained(str(tmp_path / "warehouse" / "orders"), 26, 1, 30, 1)
    assert describe(done, tmp_path) == "warehouse/orders: files read 26 -> 1, on disk 30 -> 1"
    remote = Maintained("s3a://bucket/warehouse/orders", 3, 1, None, None)
    assert describe(remote, tmp_path) == "s3a://bucket/warehouse/orders: files read 3 -> 1"
