"""The sink registry is the one place a sink is declared: each declaration's class, view, pace and
capabilities agree with the code, and a name it does not declare is refused."""

from __future__ import annotations

import importlib

import pytest
from pydantic import ValidationError

from spark_jobs.model.config import TableConfig, load
from spark_jobs.model.settings import JobSettings
from spark_jobs.model.sink_registry import REGISTRY, SINKS, Capability, Kind, UnknownSinkError, spec_of
from spark_jobs.sinks.base import Sink, build_sink

# The methods that back each capability: a sink overrides them exactly when it declares the capability.
BACKED_BY = {
    Capability.WAITS_FOR_STORE: ("available",),
    Capability.CLEARS: ("clear",),
    Capability.REAL_TIME: ("writer_rows", "writer"),
    Capability.SWAPS_ON_REBUILD: ("rebuild_target", "promote"),
}


def sink_class(name: str) -> type[Sink]:
    module, _, attribute = REGISTRY[name].sink_class.partition(":")
    return getattr(importlib.import_module(module), attribute)


@pytest.mark.parametrize("name", SINKS)
def test_each_declared_sink_is_a_sink_of_that_name_with_the_methods_its_capabilities_promise(name):
    spec, cls = REGISTRY[name], sink_class(name)
    assert issubclass(cls, Sink) and cls.name == name
    for capability, methods in BACKED_BY.items():
        for method in methods:
            overridden = getattr(cls, method) is not getattr(Sink, method)
            assert overridden == (capability in spec.capabilities), f"{name}.{method} vs {capability}"


@pytest.mark.parametrize("name", SINKS)
def test_each_declared_sink_is_built_from_the_job_settings_and_reads_its_views_tables(name, tmp_path):
    pipeline = load()
    sink = build_sink(name, JobSettings(warehouse_dir=tmp_path), pipeline)
    assert sink.name == name and sink.capabilities == REGISTRY[name].capabilities
    assert sink.tables() == pipeline.sink_tables(name) and sink.tables()
    view = REGISTRY[name].view
    assert view is None or view in TableConfig.model_fields
    assert JobSettings().trigger_interval_of(name) == getattr(JobSettings(), REGISTRY[name].trigger_setting)


@pytest.mark.parametrize("name", SINKS)
def test_a_delta_sink_never_promises_one_row_per_key(name):
    # A Delta table can hold a second row for one key; `tide verify` must report it (`duplicate`), not
    # skip it as a repeated read, so no Delta sink may declare UNIQUE_KEYS.
    spec = REGISTRY[name]
    assert not (spec.kind is Kind.DELTA and Capability.UNIQUE_KEYS in spec.capabilities)


@pytest.mark.parametrize("name", SINKS)
def test_a_sink_without_a_view_is_derived_from_the_tables_of_the_others(name):
    spec, pipeline = REGISTRY[name], load()
    assert spec.derived == (spec.view is None)
    if spec.derived:
        assert pipeline.sink_tables(name) == pipeline.analytics_tables()


def test_a_sink_the_registry_does_not_declare_is_refused_by_name_everywhere():
    with pytest.raises(UnknownSinkError,
                       match=r"^unknown sink nope; choose one of search, cache, warehouse, analytics$"):
        spec_of("nope")
    with pytest.raises(UnknownSinkError):
        load().sink_tables("nope")
    with pytest.raises(ValidationError):
        JobSettings(sinks=["nope"])
