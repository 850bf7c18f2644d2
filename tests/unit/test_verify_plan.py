"""What `tide verify` reads for each sink comes from the registry: every declared view has a reader,
the views holding aggregates and nested documents are declared ones, and which (table, sink) pairs,
aggregates and nested views are verified follows the sinks' declarations, not their names."""

from __future__ import annotations

from pathlib import Path

import pytest

import services.verify as verify
from services.verify.readers import VerifyError
from services.verify.reconcile import spill
from spark_jobs.model.config import load
from spark_jobs.model.sink_registry import REGISTRY, SINKS, Capability
from tests.demo_catalogue import demo_catalogue

DECLARED_VIEWS = {spec.view for spec in REGISTRY.values() if spec.view is not None}


def test_every_view_a_sink_declares_has_a_reader_and_no_reader_is_left_over():
    assert set(verify.VIEW_READERS) == DECLARED_VIEWS


def test_the_views_holding_aggregates_and_nested_documents_are_declared_by_a_sink():
    for view in (verify.AGGREGATES_VIEW, verify.NESTED_VIEW):
        assert view in DECLARED_VIEWS
        assert REGISTRY[verify.sink_of_view(view)].view == view
    with pytest.raises(VerifyError):
        verify.sink_of_view("nope")


def test_each_table_is_planned_with_every_sink_that_reads_it_in_pipeline_order():
    pipeline = load()
    plan = verify.selection(pipeline, None, None)
    read = {table for sink in SINKS for table in pipeline.sink_tables(sink)}
    assert [table for table, _ in plan] == [table for table in pipeline.tables if table in read]
    for table, wanted in plan:
        assert wanted == [sink for sink in SINKS if table in pipeline.sink_tables(sink)]
    with pytest.raises(VerifyError, match="unknown sink nope"):
        verify.selection(pipeline, None, ["nope"])


@pytest.mark.parametrize("sink", SINKS)
def test_aggregates_and_nested_views_are_verified_with_the_sink_whose_view_holds_them(sink):
    pipeline = load()
    plan = verify.selection(pipeline, None, [sink])
    aggregates = verify.aggregates_to_verify(pipeline, plan, demo_catalogue())
    nested = verify.nested_selection(pipeline, None, [sink])
    holds_aggregates = REGISTRY[sink].view == verify.AGGREGATES_VIEW
    holds_nested = REGISTRY[sink].view == verify.NESTED_VIEW
    assert [a.name for a in aggregates] == (list(pipeline.cache_aggregates) if holds_aggregates else [])
    assert nested == (list(pipeline.nested) if holds_nested else [])
    assert pipeline.cache_aggregates and pipeline.nested  # the demo pipeline declares both


@pytest.mark.parametrize("sink", SINKS)
def test_a_repeated_key_is_a_duplicate_only_in_a_store_that_can_hold_two_rows_for_one(sink, tmp_path: Path):
    source = spill([("1", "h1")], tmp_path / "source", 1)
    stored = spill([("1", "h1"), ("1", "h1")], tmp_path / "sink", 1)
    outcome = verify._outcome("t", sink, source, stored, examples=5)
    kinds = {divergence.kind for divergence in outcome.divergences}
    assert kinds == (set() if Capability.UNIQUE_KEYS in REGISTRY[sink].capabilities else {"duplicate"})
