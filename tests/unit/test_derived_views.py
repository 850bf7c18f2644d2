"""Pure rules of the derived warehouse views: SCD2 versions and intervals, event-time window
assignment and figures, and the pipeline file's checks of the `windows:` section."""

from __future__ import annotations

import random
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.verify.derived import check_history_row, compare_figures
from services.verify.reconcile import Tally
from spark_jobs.model.config import PipelineConfigError, WindowSpec, load
from spark_jobs.model.event_windows import EPOCH, aggregate, window_starts
from spark_jobs.model.scd2 import intervals
from tests.demo_catalogue import demo_catalogue

T0 = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
MINUTE = timedelta(minutes=1)
PIPELINE = Path(__file__).resolve().parents[2] / "pipeline.yaml"


# ---- SCD2


def test_intervals_chain_each_version_to_the_next_and_only_a_live_newest_is_current():
    versions = [((3, 0), T0 + 2 * MINUTE, "u"), ((1, 0), T0, "c"), ((2, 0), T0 + MINUTE, "u")]
    assert intervals(versions) == [(None, True), (T0 + MINUTE, False), (T0 + 2 * MINUTE, False)]
    assert intervals([((1, 0), T0, "c"), ((2, 0), T0 + MINUTE, "d")]) == [(T0 + MINUTE, False), (None, False)]
    assert intervals([((1, 0), T0, "c"), ((2, 0), T0 + MINUTE, "t")])[1] == (None, False)
    assert intervals([]) == []


@given(st.lists(st.integers(min_value=0, max_value=50), min_size=1, max_size=20, unique=True), st.randoms())
def test_intervals_do_not_depend_on_arrival_order(majors, rnd):
    versions = [((m, 0), T0 + m * MINUTE, rnd.choice("cud")) for m in majors]
    shuffled = random.Random(rnd.random()).sample(versions, len(versions))
    by_version = dict(zip(versions, intervals(versions), strict=True))
    assert dict(zip(shuffled, intervals(shuffled), strict=True)) == by_version
    newest = max(versions)
    assert [v for v, (_, current) in by_version.items() if current] == ([newest] if newest[2] != "d" else [])


# ---- windows


def test_tumbling_and_sliding_window_starts_are_epoch_aligned():
    at = T0 + timedelta(minutes=3, seconds=20)
    assert window_starts(at, WindowSpec(size_seconds=60)) == [T0 + 3 * MINUTE]
    assert window_starts(at, WindowSpec(size_seconds=300, slide_seconds=60)) == [T0 + k * MINUTE for k in range(-1, 4)]
    assert window_starts(T0, WindowSpec(size_seconds=60)) == [T0], "a start belongs to its own window"
    before_epoch = EPOCH - timedelta(seconds=1)
    assert window_starts(before_epoch, WindowSpec(size_seconds=60)) == [EPOCH - MINUTE]


@given(st.integers(min_value=-10**12, max_value=10**12), st.sampled_from([(60, None), (300, 60), (120, 30)]))
def test_every_window_of_a_time_contains_it(micros, sizes):
    spec = WindowSpec(size_seconds=sizes[0], slide_seconds=sizes[1])
    at = EPOCH + timedelta(microseconds=micros)
    starts = window_starts(at, spec)
    assert len(starts) == spec.size_seconds // spec.slide
    assert all(start <= at < start + timedelta(seconds=spec.size_seconds) for start in starts)


def test_aggregate_is_sum_and_count_per_window_like_sql():
    rows = [(T0, Decimal("10.00")), (T0 + timedelta(seconds=59), None), (T0 + MINUTE, Decimal("1.50")),
            (None, Decimal(9))]
    assert aggregate(rows, [WindowSpec(size_seconds=60)]) == {
        (60, 60, T0): (Decimal("10.00"), 2), (60, 60, T0 + MINUTE): (Decimal("1.50"), 1),
    }


def test_a_slide_that_does_not_divide_the_size_is_refused():
    with pytest.raises(ValueError, match="must be a multiple of slide_seconds"):
        WindowSpec(size_seconds=300, slide_seconds=70)


# ---- the pipeline file


def _with_windows(tmp_path: Path, replace: tuple[str, str]) -> Path:
    path = tmp_path / "pipeline.yaml"
    path.write_text(PIPELINE.read_text().replace(*replace))
    return path


def test_the_demo_pipeline_declares_history_and_windows():
    pipeline = load(PIPELINE)
    assert pipeline.history_tables() == ["customers", "products"]
    view = pipeline.windows["order_revenue"]
    assert (view.table, view.time_column, view.value_column) == ("orders", "created_at", "total")
    assert [(w.size_seconds, w.slide) for w in view.windows] == [(60, 60), (300, 60)]


def test_the_analytics_query_reads_the_history_and_windowed_tables_and_owns_folders_apart_from_the_warehouse():
    from spark_jobs.sinks.delta import AnalyticsSink, WarehouseSink

    pipeline = load(PIPELINE)
    assert pipeline.sink_tables("analytics") == ["customers", "products", "orders"]
    warehouse, analytics = WarehouseSink("/w", pipeline).folders(), AnalyticsSink("/w", pipeline).folders()
    assert not set(warehouse) & set(analytics), "a rebuild of one must not clear the other's tables"
    named = {folder.removeprefix("/w/") for folder in warehouse + analytics}
    assert set(pipeline.warehouse_tables()) <= named, "every table the API serves is cleared by one rebuild"
    assert {folder.removeprefix("/w/") for folder in analytics} >= {"customers_history", "order_revenue_late"}


def test_a_window_on_an_unknown_table_is_one_line_naming_the_tables(tmp_path):
    path = _with_windows(tmp_path, ("table: orders", "table: ordrs"))
    with pytest.raises(PipelineConfigError) as error:
        load(path)
    message = str(error.value)
    assert "windows.order_revenue.table: unknown table 'ordrs'" in message and "orders" in message
    assert "\n" not in message


def test_unknown_or_mistyped_window_columns_are_named_against_the_catalogue():
    pipeline = load(PIPELINE)
    assert pipeline.window_problems(demo_catalogue()) == []
    wrong = pipeline.model_copy(update={"windows": {"order_revenue": pipeline.windows["order_revenue"].model_copy(
        update={"time_column": "created", "value_column": "status"})}})
    problems = wrong.window_problems(demo_catalogue())
    assert problems[0].startswith(
        "windows.order_revenue.time_column: orders has no column created (columns: created_at, ")
    assert problems[1] == "windows.order_revenue.value_column: orders.status is not a numeric column; fix pipeline.yaml"


def test_one_schema_check_names_each_missing_column_of_nested_views_aggregates_and_windows():
    """The check the driver runs at start-up against PostgreSQL's catalogue, here against one lacking
    columns that each kind of view names."""
    pipeline = load(PIPELINE)
    assert pipeline.schema_problems(demo_catalogue()) == []
    catalogue = dict(demo_catalogue())
    orders = catalogue["orders"]
    catalogue["orders"] = replace(orders, columns={c: i for c, i in orders.columns.items()
                                                   if c not in ("created_at", "total")})
    problems = pipeline.schema_problems(catalogue)
    expected = ["nested.orders: orders has no column total (columns: customer_id, id, status, updated_at); "
                "fix pipeline.yaml",
                "cache_aggregates.customer_stats.measures.paid_total.sum: orders has no column total",
                "windows.order_revenue.time_column: orders has no column created_at",
                "windows.order_revenue.value_column: orders has no column total"]
    assert all(any(p.startswith(e) for p in problems) for e in expected), problems
    assert all("\n" not in p for p in problems)


# ---- tide verify's checks of the derived tables


def test_window_figures_plus_late_deltas_are_compared_with_the_source_aggregate():
    minute = lambda k: (60, 60, T0 + k * MINUTE)  # noqa: E731 - a window key
    expected = {minute(0): (Decimal("10.00"), 1), minute(1): (Decimal("6.00"), 2), minute(2): (Decimal(1), 1)}
    figures = {minute(0): (Decimal("10.00"), 1), minute(1): (Decimal("1.00"), 1), minute(3): (Decimal(4), 1)}
    late = {minute(1): (Decimal("5.00"), 1), minute(3): (Decimal(-4), -1)}
    tally = compare_figures(expected, figures, late, examples=5)
    assert tally.counts == {"missing": 1, "extra": 0, "different": 0, "duplicate": 0, "interval": 0}
    assert tally.examples["missing"] == [f"60s/60s@{(T0 + 2 * MINUTE).isoformat()}"]
    wrong = compare_figures(expected, {**figures, minute(2): (Decimal(2), 1)}, late, examples=5)
    assert wrong.counts["different"] == 1 and wrong.counts["missing"] == 0


def _version(major, valid_from, op, valid_to, current):
    return {"tl_version_major": major, "tl_version_minor": 0, "source_op": op, "valid_from": valid_from,
            "valid_to": valid_to, "is_current": current}


def test_history_rows_with_a_repeated_version_or_a_broken_interval_are_reported():
    tally = Tally()
    check_history_row("1", [_version(1, 10, "c", 20, False), _version(2, 20, "u", None, True)], tally)
    assert tally.clean
    check_history_row("2", [_version(1, 10, "c", None, True), _version(1, 10, "c", None, True)], tally)
    check_history_row("3", [_version(1, 10, "c", None, True), _version(2, 20, "u", None, True)], tally)
    check_history_row("4", [_version(1, 10, "c", 20, False), _version(2, 20, "d", None, True)], tally)
    assert tally.examples["duplicate"] == ["2"] and tally.examples["interval"] == ["3", "4"]
