"""Status end to end, on the running pipeline of conftest.py: `GET /status`, `GET /metrics` and
`tide status` read the real systems; stopping Kafka Connect shows the connector down and the slot lag
growing, then both recover; pausing the search query shows its lag growing while the others stay fresh."""

from __future__ import annotations

import os
import pty
import select
import signal
import subprocess

import psycopg
import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from services.api.app import create_app
from services.settings import StackSettings
from services.stack import postgres, runner
from spark_jobs.model.settings import SINKS
from tests import tide_cli
from tests.e2e.support import E2E_FIELDS, TIDE, tide, tide_env
from tests.waiting import wait_until

pytestmark = pytest.mark.stack

CAUGHT_UP_S = 300  # the warehouse's Delta MERGE batches are slow on 2 cores (docs/apply.md)


@pytest.fixture(scope="module")
def api(run):
    jobs, _, writer = run
    writer.finish()  # the fixture's workload (it runs its minute; stopped early if this module runs alone)
    with TestClient(create_app(jobs)) as client:
        yield client


def _status(api: TestClient) -> dict:
    response = api.get("/status")
    assert response.status_code == 200, response.text
    return response.json()


def _sink(status: dict, name: str) -> dict:
    return next(sink for sink in status["sinks"] if sink["sink"] == name)


def _table(status: dict, sink: str, table: str) -> dict:
    return next(figures for figures in _sink(status, sink)["tables"] if figures["table"] == table)


def _insert_order(stack: StackSettings, total: str = "1.00") -> tuple[int, int]:
    """A new order; its id and a time at or before its commit (the transaction's start, in ms)."""
    with psycopg.connect(postgres.conninfo(stack), autocommit=True) as conn:
        return conn.execute(
            "INSERT INTO orders (status, total) VALUES ('pending', %s) "
            "RETURNING id, floor(extract(epoch FROM now()) * 1000)::bigint",
            (total,),
        ).fetchone()


def _all_caught_up(api: TestClient) -> dict | None:
    status = _status(api)
    ready = status["source"]["connector_running"] and all(
        sink["state"] == "running" and sink["records_behind"] == 0 for sink in status["sinks"]
    )
    return status if ready else None


def _cli_rows(jobs: StackSettings, *args: str) -> dict[str, list[str]]:
    """The rows of `tide ...`'s tables by their first cell."""
    rows = [[cell.strip() for cell in line.split("│")[1:-1]] for line in tide(jobs, *args).splitlines()]
    return {row[0]: row for row in rows if row and row[0]}


def test_status_metrics_and_tide_status_show_every_sink_fresh_after_a_commit(run, api, stack):
    jobs, pipeline, _ = run
    _, committed_at_ms = _insert_order(stack)

    def applied_everywhere():
        status = _all_caught_up(api)
        return status if status and all(
            (_table(status, sink["sink"], "orders")["newest_applied_commit_ms"] or 0) >= committed_at_ms
            for sink in status["sinks"]) else None

    status = wait_until(applied_everywhere, CAUGHT_UP_S, "every sink to apply the new order", interval=1)
    assert {sink["sink"] for sink in status["sinks"]} == set(SINKS)
    assert status["source"]["connector"] == pipeline.source.connector
    assert status["source"]["slot_active"] is True and status["source"]["slot_lag_bytes"] >= 0
    assert status["problems"] == []
    for sink in status["sinks"]:
        assert {table["table"] for table in sink["tables"]} == set(pipeline.sink_tables(sink["sink"]))
        assert sink["oldest_unapplied_age_s"] is None  # nothing waits
        assert 0 <= _table(status, sink["sink"], "orders")["newest_applied_age_s"] < CAUGHT_UP_S

    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(api.get("/metrics").text)
        for sample in family.samples
    }
    assert samples[("tideline_records_behind", (("sink", "cache"), ("table", "orders")))] >= 0
    assert samples[("tideline_replication_slot_active", (("slot", pipeline.source.slot),))] == 1
    assert samples[("tideline_connector_state", (("connector", pipeline.source.connector), ("state", "RUNNING")))] == 1
    assert samples[("tideline_query_state", (("sink", "search"), ("state", "running")))] == 1

    # Search's nested views (its follow-up query) catch up too, and say so; no other sink has them.
    def nested_caught_up():
        status = _status(api)
        return status if _sink(status, "search")["follow_up_records_behind"] == 0 else None

    nested = wait_until(nested_caught_up, CAUGHT_UP_S, "search's nested views to apply their lookups", interval=1)
    assert {sink["sink"] for sink in nested["sinks"] if sink["follow_up_records_behind"] is not None} == {"search"}

    rows = _cli_rows(jobs, "status")
    assert rows[f"connector {pipeline.source.connector}"][1] == "RUNNING"
    assert rows[f"slot {pipeline.source.slot}"][1] == "active"
    assert {name for name in SINKS if rows[name][1] == "running"} == set(SINKS)
    assert rows["nested views"][2].isdigit()  # lookups behind, under search


def test_stopping_connect_shows_the_connector_down_and_the_slot_lag_growing_then_both_recover(run, api, stack):
    jobs, pipeline, _ = run
    wait_until(lambda: _all_caught_up(api), CAUGHT_UP_S, "the connector running and every sink caught up")
    runner.down(stack, ["connect"])
    try:
        down = wait_until(lambda: (s := _status(api))["source"]["connector_state"] == "unreachable"
                          and s["source"]["slot_active"] is False and s, 60, "the connector down, the slot inactive")
        first_lag = down["source"]["slot_lag_bytes"]

        def lag_grew():
            _insert_order(stack)  # WAL the slot must keep while nobody reads it
            return _status(api)["source"]["slot_lag_bytes"] > first_lag

        wait_until(lag_grew, 60, "the slot lag to grow while Connect is down", interval=1)
        peak = _status(api)["source"]["slot_lag_bytes"]
        rows = _cli_rows(jobs, "status")
        assert rows[f"connector {pipeline.source.connector}"][1] == "unreachable"
        assert rows[f"slot {pipeline.source.slot}"][1] == "inactive"
        assert _status(api)["warnings"] == []  # far below the default threshold
        # With the threshold below the lag, `tide status` warns, naming the slot and the setting.
        warned = tide_cli.run_tide(jobs.model_copy(update={"slot_lag_warn_bytes": first_lag}), "status",
                                   fields=(*E2E_FIELDS, "slot_lag_warn_bytes"))
        warning = " ".join(warned[warned.index("warning:"):].split())
        assert f"replication slot {pipeline.source.slot} holds" in warning and "TIDE_SLOT_LAG_WARN_BYTES" in warning
    finally:
        runner.up(stack, ["connect"])

    def recovered():
        source = _status(api)["source"]
        return source["connector_running"] and source["slot_active"] and source["slot_lag_bytes"] < peak

    wait_until(recovered, 180, "the connector running again and the slot lag back down", interval=1)
    wait_until(lambda: _all_caught_up(api), CAUGHT_UP_S, "every sink caught up after the outage")


def test_pausing_the_search_query_shows_its_lag_growing_while_the_others_stay_fresh(run, api, stack):
    jobs, _, _ = run
    wait_until(lambda: _all_caught_up(api), CAUGHT_UP_S, "every sink caught up before the pause")
    tide(jobs, "jobs", "pause", "search")
    try:
        wait_until(lambda: _sink(_status(api), "search")["state"] == "paused", 60, "the search query paused")
        assert _cli_rows(jobs, "jobs", "status")["search"][1] == "paused"
        _, committed_at_ms = _insert_order(stack)

        def others_fresh_search_behind(since_ms: int):
            status = _status(api)
            others = all(_sink(status, sink)["records_behind"] == 0
                         and (_table(status, sink, "orders")["newest_applied_commit_ms"] or 0) >= since_ms
                         for sink in ("cache", "warehouse"))
            return status if others and _sink(status, "search")["records_behind"] > 0 else None

        before = wait_until(lambda: others_fresh_search_behind(committed_at_ms), CAUGHT_UP_S,
                            "cache and warehouse fresh, search behind", interval=1)
        _, again_at_ms = _insert_order(stack)
        after = wait_until(lambda: others_fresh_search_behind(again_at_ms), CAUGHT_UP_S,
                           "cache and warehouse fresh again", interval=1)
        behind_before, behind_after = (_table(s, "search", "orders") for s in (before, after))
        assert behind_after["records_behind"] > behind_before["records_behind"]
        assert behind_after["oldest_unapplied_age_s"] > behind_before["oldest_unapplied_age_s"]
        assert behind_before["oldest_unapplied_commit_ms"] >= committed_at_ms
        assert all(sink["state"] == "running" for sink in after["sinks"] if sink["sink"] != "search")
    finally:
        tide(jobs, "jobs", "resume", "search")
    wait_until(lambda: _all_caught_up(api), CAUGHT_UP_S, "search caught up after resume", interval=1)


def test_tide_status_watch_redraws_on_a_terminal_until_ctrl_c(run):
    jobs, pipeline, _ = run
    terminal, child_side = pty.openpty()  # a real terminal: Rich redraws live only there
    watch = subprocess.Popen([*TIDE, "status", "--watch", "--interval", "0.5"], env=tide_env(jobs),
                             stdin=child_side, stdout=child_side, stderr=child_side)
    os.close(child_side)
    screen: list[str] = []

    def redrawn() -> bool:
        if select.select([terminal], [], [], 0.5)[0]:
            screen.append(os.read(terminal, 65536).decode(errors="replace"))
        return "".join(screen).count("records behind") >= 3

    try:
        wait_until(redrawn, 90, "the sinks table drawn three times")
    finally:
        watch.send_signal(signal.SIGINT)  # Ctrl-C
        code = watch.wait(timeout=60)
        os.close(terminal)
    assert code == 0, "".join(screen)[-2000:]
    assert f"connector {pipeline.source.connector}" in "".join(screen)


def test_bad_requests_to_status_endpoints_get_a_4xx_with_a_message(api):
    for method, path, code in (("POST", "/status", 405), ("DELETE", "/metrics", 405), ("GET", "/status/search", 404),
                               ("GET", "/%00", 404), ("PUT", "/", 405)):
        response = api.request(method, path)
        assert response.status_code == code, (method, path, response.text)
        assert response.json()["detail"], response.text
    unknown = api.get("/status", params={"sink": "x" * 5000})  # the endpoint takes no parameters: ignored
    assert unknown.status_code == 200


def test_the_dashboard_page_names_the_orders_search_view(run, api):
    _, pipeline, _ = run
    page = api.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert f'data-index="{pipeline.tables["orders"].search.index}"' in page.text
