"""The analytics sink on real Spark + Delta (local files): the SCD2 history that keeps every version of a
row, and event-time windows that follow the rows until closed, then record late changes."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest

from spark_jobs.model.config import PipelineConfig, TableConfig, WarehouseView, WindowSpec, WindowView
from spark_jobs.model.event_windows import aggregate
from spark_jobs.sinks.base import VERSION_MAJOR, VERSION_MINOR
from spark_jobs.sinks.delta import AnalyticsSink
from tests.integration.sink_delta.support import MEMBERS, order, product, truncate, versions, write

pytestmark = pytest.mark.stack

MINUTE = timedelta(minutes=1)
T0 = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
DERIVED = PipelineConfig(
    tables={"products": TableConfig(warehouse=WarehouseView(history=True)),
            "orders": TableConfig(warehouse=WarehouseView())},
    windows={"revenue": WindowView(table="orders", time_column="created_at", value_column="total",
                                   windows=[WindowSpec(size_seconds=60),
                                            WindowSpec(size_seconds=180, slide_seconds=60)],
                                   allowed_lateness_seconds=60)},
)


@pytest.fixture
def derived(tmp_path_factory: pytest.TempPathFactory, spark) -> AnalyticsSink:
    sink = AnalyticsSink(str(tmp_path_factory.mktemp("derived")), DERIVED)
    sink.setup(spark, MEMBERS)
    return sink


def at(version, when: datetime, found: dict) -> dict:
    return {**found, "version": {"major": version[0], "minor": version[1]}, "commit_ts": when}


def history(spark, sink: AnalyticsSink, table: str = "products") -> list[dict]:
    frame = spark.read.format("delta").load(sink.history.path(table))
    return [r.asDict() for r in frame.orderBy("id", VERSION_MAJOR, VERSION_MINOR).collect()]


def naive(moment: datetime) -> datetime:
    return moment.replace(tzinfo=None)


def test_history_keeps_every_version_in_order_whatever_the_arrival_order_and_replays_add_nothing(spark, derived):
    v1 = at((0, 1), T0, product((0, 1), op="r", description="long text"))
    v2 = at((2, 1), T0 + MINUTE, product((2, 1), unavailable={"description"}, price="2.00"))
    v3 = at((3, 1), T0 + 2 * MINUTE, product((3, 1), op="d"))
    v4 = at((4, 1), T0 + 3 * MINUTE, product((4, 1), op="c", description="again"))
    other = at((2, 5), T0 + MINUTE, product((2, 5), key=2, op="c"))
    # v2 arrives a batch after v1 and v3 (a replay after a re-delivery), v4 with it, v2 twice.
    assert write(spark, derived, [v1, v3, other], 0) == []
    assert write(spark, derived, [v4, v2, {**v2, "origin": {**v2["origin"], "offset": 9}}], 1) == []
    found = [r for r in history(spark, derived) if r["id"] == 1]
    assert [(r["source_op"], r["valid_from"], r["valid_to"], r["is_current"]) for r in found] == [
        ("r", naive(T0), naive(T0 + MINUTE), False),
        ("u", naive(T0 + MINUTE), naive(T0 + 2 * MINUTE), False),
        ("d", naive(T0 + 2 * MINUTE), naive(T0 + 3 * MINUTE), False),
        ("c", naive(T0 + 3 * MINUTE), None, True),
    ]
    assert found[1]["description"] == "long text", "an unchanged TOASTed column comes from the version before"
    assert found[1]["price"] == Decimal("2.00") and found[1]["tl_unavailable"] == []
    assert found[2]["name"] is None, "a delete carries only its key"
    held = versions(spark, derived.history.path("products"))
    assert write(spark, derived, [v4, v2, v1, v3], 2) == []
    assert len(history(spark, derived)) == 5
    assert versions(spark, derived.history.path("products")) == held, "a replay must not commit to the history"


def test_a_truncate_closes_every_live_row_in_the_history(spark, derived):
    write(spark, derived, [at((1, k), T0, product((1, k), key=k, op="c")) for k in (1, 2)], 0)
    write(spark, derived, [at((2, 1), T0 + MINUTE, product((2, 1), key=2, op="d"))], 1)
    write(spark, derived, [at((3, 0), T0 + 2 * MINUTE, truncate((3, 0), "products"))], 2)
    found = history(spark, derived)
    assert [(r["id"], r["source_op"]) for r in found] == [(1, "c"), (1, "t"), (2, "c"), (2, "d")]
    assert not any(r["is_current"] for r in found) and found[0]["valid_to"] == naive(T0 + 2 * MINUTE)


def test_a_snapshot_range_is_appended_and_a_batch_reads_only_the_history_files_its_keys_span(spark, derived):
    from delta.tables import DeltaTable

    path = derived.history.path("products")
    write(spark, derived, [at((1, k), T0, product((1, k), key=k, op="r")) for k in range(1, 11)], 0)
    first = versions(spark, path)[0]
    second = [at((2, k), T0, product((2, k), key=k, op="r")) for k in range(1000, 1011)]
    write(spark, derived, second, 1)
    assert DeltaTable.forPath(spark, path).history(1).collect()[0]["operation"] == "WRITE", \
        "a key range the history holds no version in is appended"
    held = versions(spark, path)
    write(spark, derived, second, 1)
    assert versions(spark, path) == held, "its replay is merged: no commit"
    # The files of keys 1-10 gone: reading them would fail the next batch, which must not need them.
    commit = (Path(path) / "_delta_log" / f"{first:020d}.json").read_text().splitlines()
    for added in (json.loads(line)["add"]["path"] for line in commit if '"add"' in line):
        (Path(path) / added).unlink()
    write(spark, derived, [at((3, 1), T0 + MINUTE, product((3, 1), key=1005, price="9.00"))], 2)
    found = spark.read.format("delta").load(path).where("id = 1005").orderBy(VERSION_MAJOR).collect()
    assert [(r["source_op"], r["is_current"], r["valid_to"]) for r in found] == [
        ("r", False, naive(T0 + MINUTE)), ("u", True, None)], "the earlier version was found and closed"


def test_a_run_of_unchanged_toast_versions_takes_the_value_from_the_last_version_that_had_it(spark, derived):
    write(spark, derived, [at((1, 1), T0, product((1, 1), op="c", description="kept"))], 0)
    repriced = [at((k, 1), T0 + k * MINUTE, product((k, 1), unavailable={"description"})) for k in (2, 3, 4)]
    write(spark, derived, repriced[:2], 1)  # two in a row, their source in an earlier batch
    write(spark, derived, repriced[2:], 2)
    found = history(spark, derived)
    assert [(r["description"], r["tl_unavailable"]) for r in found] == [("kept", [])] * 4


def window_figures(spark, sink: AnalyticsSink) -> dict:
    frame = spark.read.format("delta").load(sink.windows.path("revenue"))
    return {(r["window_size_seconds"], r["window_slide_seconds"], r["window_start"].replace(tzinfo=UTC)):
            (r["value_sum"], r["row_count"]) for r in frame.collect()}


def late_deltas(spark, sink: AnalyticsSink) -> dict:
    from delta.tables import DeltaTable

    path = sink.windows.path("revenue_late")
    if not DeltaTable.isDeltaTable(spark, path):
        return {}
    found: dict = {}
    for r in spark.read.format("delta").load(path).collect():
        key = (r["window_size_seconds"], r["window_slide_seconds"], r["window_start"].replace(tzinfo=UTC))
        value, count = found.get(key, (Decimal(0), 0))
        found[key] = (value + r["value_delta"], count + r["count_delta"])
    return found


def figures_with_late_deltas(spark, sink: AnalyticsSink) -> dict:
    """Each window's figures plus its recorded late deltas (what `tide verify` compares), windows that
    cancel to nothing left out."""
    figures, deltas = window_figures(spark, sink), late_deltas(spark, sink)
    combined = {key: tuple(a + b for a, b in zip(figures.get(key, (0, 0)), deltas.get(key, (0, 0)), strict=True))
                for key in figures | deltas}
    return {key: value for key, value in combined.items() if value != (0, 0)}


def test_windows_follow_the_current_rows_until_closed_then_record_late_changes(spark, derived):
    spec = DERIVED.windows["revenue"].windows
    placed = {1: ("10.00", T0), 2: ("5.00", T0 + MINUTE), 3: ("7.00", T0 + 5 * MINUTE)}
    write(spark, derived, [order((1, k), k, total, when, "r") for k, (total, when) in placed.items()], 0)
    assert window_figures(spark, derived) == aggregate(((when, Decimal(t)) for t, when in placed.values()), spec)
    # The watermark is now T0+5m - 60 s: windows ending by T0+4m are closed.
    late = [order((2, 1), 4, "100.00", T0 + 30 * timedelta(seconds=1), "c"),   # new, in closed windows only
            order((2, 2), 2, "6.00", T0 + MINUTE),                               # an edit in a closed window
            order((2, 3), 5, "1.00", T0 + 4 * MINUTE + timedelta(seconds=5), "c"),  # on time
            order((2, 4), 3, None, None, "d")]                                   # a delete in open windows
    write(spark, derived, late, 1)
    now = {1: ("10.00", T0), 2: ("6.00", T0 + MINUTE), 4: ("100.00", T0 + timedelta(seconds=30)),
           5: ("1.00", T0 + 4 * MINUTE + timedelta(seconds=5))}
    expected = aggregate(((when, Decimal(t)) for t, when in now.values()), spec)
    figures, deltas = window_figures(spark, derived), late_deltas(spark, derived)
    assert deltas[(60, 60, T0)] == (Decimal("100.00"), 1) and deltas[(60, 60, T0 + MINUTE)] == (Decimal("1.00"), 0)
    assert figures[(60, 60, T0)] == (Decimal("10.00"), 1), "a closed window keeps its figures"
    assert figures[(60, 60, T0 + 4 * MINUTE)] == (Decimal("1.00"), 1), "an open window follows the rows"
    assert (60, 60, T0 + 5 * MINUTE) not in figures, "an open window whose rows are gone is removed"
    assert figures_with_late_deltas(spark, derived) == expected
    paths = (derived.windows.path("revenue"), derived.windows.path("revenue_late"), derived.windows.watermarks_path)
    held = versions(spark, *paths)
    write(spark, derived, late, 1)
    assert versions(spark, *paths) == held and late_deltas(spark, derived) == deltas, "a replay commits nothing"


def test_a_stale_change_of_a_row_deleted_after_its_window_closed_records_no_late_change(spark, derived):
    spec = DERIVED.windows["revenue"].windows
    snapshot = [order((1, 1), 1, "10.00", T0, "r"), order((1, 2), 2, "7.00", T0 + 5 * MINUTE, "r")]
    write(spark, derived, snapshot, 0)  # the watermark is now T0+4m: the windows around T0 are closed
    write(spark, derived, [order((2, 1), 1, None, None, "d")], 1)  # recorded late: -10.00, -1
    expected = aggregate([(T0 + 5 * MINUTE, Decimal("7.00"))], spec)
    assert figures_with_late_deltas(spark, derived) == expected
    # Sent again after the delete (a stale redelivery, or a resend after a Connect crash): the MERGE
    # refuses it (the row's tombstone is newer), so the windows must not count it either.
    write(spark, derived, [snapshot[0]], 2)
    assert figures_with_late_deltas(spark, derived) == expected
