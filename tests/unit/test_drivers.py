"""The local drivers: which queries each runs at what priority, and their reports read as one."""

from __future__ import annotations

import json

from services.jobs import driver
from services.settings import StackSettings
from spark_jobs.model.settings import JobSettings
from spark_jobs.runtime import drivers

ARGV = ["python", "-m", "spark_jobs"]


def test_the_delta_queries_run_in_a_driver_of_their_own_at_the_lower_priority(tmp_path):
    settings = JobSettings(status_file=tmp_path / "status.json", delta_driver_nice=12)
    shipping, delta = drivers.children(settings, ARGV)
    assert (json.loads(shipping.env["TIDE_JOB_SINKS"]), shipping.nice) == (["search", "cache"], 0)
    assert (json.loads(delta.env["TIDE_JOB_SINKS"]), delta.nice) == (["warehouse", "analytics"], 12)
    assert shipping.env["TIDE_JOB_STATUS_FILE"] == str(tmp_path / "status.shipping.json")
    assert delta.env["TIDE_JOB_STATUS_FILE"] == str(tmp_path / "status.delta.json")
    assert shipping.argv == delta.argv == ARGV


def test_one_driver_for_every_query_by_default_and_no_empty_group():
    [only] = drivers.children(JobSettings(), ARGV)
    assert (only.env, only.nice) == ({}, 0)
    [cache] = drivers.children(JobSettings(sinks=["cache"], delta_driver_nice=10), ARGV)
    assert json.loads(cache.env["TIDE_JOB_SINKS"]) == ["cache"]


def test_the_readers_find_every_driver_report_and_not_a_half_written_one(tmp_path):
    status = tmp_path / "status.json"
    assert drivers.status_files(status) == []
    for name in ("status.delta.json", "status.shipping.json", "status.delta.tmp", "other.json"):
        (tmp_path / name).write_text("{}")
    assert drivers.status_files(status) == [tmp_path / "status.delta.json", tmp_path / "status.shipping.json"]
    status.write_text("{}")
    assert drivers.status_files(status)[0] == status


def _report(written_at_ms: int, request: str | None, error: str | None = None, **queries) -> dict:
    return {"written_at_ms": written_at_ms, "queries": queries, "reload": {"request": request, "error": error}}


def test_two_reports_read_as_one_as_old_as_the_older_and_a_reload_handled_once_both_handled_it():
    shipping = _report(2_000, "r2", search={"active": True}, cache={"active": True})
    delta = _report(1_000, "r1", warehouse={"active": False})
    merged = driver.merge_reports([shipping, delta])
    assert merged["written_at_ms"] == 1_000
    assert list(merged["queries"]) == ["search", "cache", "warehouse"]
    assert merged["queries"]["search"] == {"active": True, "reported_at_ms": 2_000}
    assert merged["queries"]["warehouse"]["reported_at_ms"] == 1_000
    assert merged["reload"] == {"request": None, "error": None}
    both = driver.merge_reports([shipping, _report(1_500, "r2", "pipeline.yaml changed the views of orders")])
    assert both["reload"] == {"request": "r2", "error": "pipeline.yaml changed the views of orders"}
    assert driver.merge_reports([]) is None


def test_the_probe_waits_for_a_report_of_every_query_the_pipeline_gives_tables(tmp_path):
    import time

    import pytest

    from services.stack.service import Unhealthy

    settings = StackSettings(state_dir=tmp_path)
    now = int(time.time() * 1000)
    active = {"active": True, "paused": False, "last_error": None}
    drivers.group_status_file(driver.status_file(settings), "shipping").parent.mkdir(parents=True)
    drivers.group_status_file(driver.status_file(settings), "shipping").write_text(
        json.dumps(_report(now, None, search=active, cache=active)))
    with pytest.raises(Unhealthy, match="no driver reports the warehouse, analytics queries yet"):
        driver.probe(settings)
    drivers.group_status_file(driver.status_file(settings), "delta").write_text(
        json.dumps(_report(now, None, warehouse=active, analytics=active)))
    assert driver.probe(settings) == "queries search, cache, warehouse, analytics"


def test_an_empty_nice_value_means_one_driver_and_a_bad_one_is_one_line_naming_the_variable(monkeypatch):
    import pytest

    from spark_jobs.model.settings import JobSettingsError, read_settings

    monkeypatch.setenv("TIDE_JOB_DELTA_DRIVER_NICE", "")
    assert read_settings().delta_driver_nice is None
    monkeypatch.setenv("TIDE_JOB_DELTA_DRIVER_NICE", "25")
    with pytest.raises(JobSettingsError, match=r"^invalid setting TIDE_JOB_DELTA_DRIVER_NICE: "
                                               r"Input should be less than or equal to 19$"):
        read_settings()
