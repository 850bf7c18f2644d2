"""`tide verify`: reconcile every derived view with PostgreSQL, row by row (docs/verify.md).

Public API (used by the CLI, the end-to-end tests and the benchmarks):

- `verify(settings, ...) -> list[Divergence]`: empty when every view matches;
- `reconcile_views(settings, ...) -> list[Outcome]`: the same, with row counts per (table, sink).

Where the sinks live (Elasticsearch URL, Redis URL and key prefix, warehouse
folder) defaults to the local stack's job environment
(`services.jobs.driver.job_settings`) and can be injected, so tests point verify at
their own aliases, Redis database and temporary warehouse.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import psycopg

from services.api.stores import quoted
from services.jobs.driver import job_settings
from services.settings import StackSettings
from services.stack import postgres
from services.verify import derived, nested, readers
from services.verify.aggregates import cache_figures, source_figures
from services.verify.canonical import Canonicaliser
from services.verify.readers import VerifyError
from services.verify.reconcile import (
    Divergence,
    Spilled,
    bucket_count,
    compare,
    spill,
)
from spark_jobs.model import catalogue
from spark_jobs.model.aggregates import AggregatePlan
from spark_jobs.model.catalogue import Catalogue
from spark_jobs.model.config import PipelineConfig, WindowView, history_table, load
from spark_jobs.model.settings import SINKS, SinkName
from spark_jobs.model.sink_registry import Capability, spec_of
from spark_jobs.sinks.delta.layout import IS_CURRENT

__all__ = ["Divergence", "Outcome", "Targets", "VerifyError", "reconcile_views", "verify"]


@dataclass(frozen=True)
class Targets:
    """Where each sink's store is. `from_settings` gives the local stack's (what `tide jobs` writes)."""

    es_url: str
    redis_url: str
    warehouse_dir: Path
    redis_prefix: str = ""

    @classmethod
    def from_settings(
        cls,
        settings: StackSettings,
        es_url: str | None = None,
        redis_url: str | None = None,
        warehouse_dir: Path | str | None = None,
        redis_prefix: str | None = None,
    ) -> Targets:
        """The local stack's stores (what `tide jobs start` writes), each replaced where given."""
        jobs = job_settings(settings)
        return cls(
            es_url=es_url or jobs.elasticsearch_url,
            redis_url=redis_url or jobs.redis_url,
            warehouse_dir=Path(warehouse_dir or jobs.warehouse_dir),
            redis_prefix=redis_prefix or "",
        )


@dataclass(frozen=True)
class Outcome:
    """The result for one (table, sink): rows on each side and what disagrees (empty when clean)."""

    table: str  # a table, or a window view's name
    sink: str  # a sink name, or "history" / "windows" for the warehouse's derived tables
    source_rows: int
    sink_rows: int
    divergences: tuple[Divergence, ...]
    note: str = ""  # e.g. how many windows have late changes

    @property
    def clean(self) -> bool:
        return not self.divergences


def verify(settings: StackSettings, *args: Any, **kwargs: Any) -> list[Divergence]:
    """Every divergence between PostgreSQL and the selected views; [] when they all match.
    Takes the same arguments as `reconcile_views`."""
    return [divergence for outcome in reconcile_views(settings, *args, **kwargs) for divergence in outcome.divergences]


def reconcile_views(
    settings: StackSettings,
    tables: Iterable[str] | None = None,
    sinks: Iterable[SinkName] | None = None,
    warehouse_dir: Path | str | None = None,
    es_url: str | None = None,
    redis_url: str | None = None,
    pipeline: PipelineConfig | None = None,
    *,
    redis_prefix: str | None = None,
    examples: int = 5,
    on_outcome: Callable[[Outcome], None] | None = None,
    work_dir: Path | None = None,
) -> list[Outcome]:
    """Compare each selected table with each of its selected views, one (table, sink) at a time.

    PostgreSQL is read once per table; each sink is then read and compared against that spill.
    Raises VerifyError if a table or sink is unknown or a store cannot be read. Rows changed while
    verify runs may show as divergent: run it when the apply jobs have caught up.
    """
    pipeline = pipeline or load(settings.pipeline_file)
    targets = Targets.from_settings(
        settings, es_url=es_url, redis_url=redis_url, warehouse_dir=warehouse_dir, redis_prefix=redis_prefix
    )
    plan = selection(pipeline, tables, sinks)
    outcomes: list[Outcome] = []
    with (
        tempfile.TemporaryDirectory(prefix="tideline-verify-", dir=work_dir) as scratch,
        readers.connect_source(postgres.conninfo(settings)) as conn,
    ):
        for table, wanted in plan:
            # A derived sink (analytics) compares rows only in its history tables: a table only under a
            # window view has no row-by-row view there (its windows: below).
            row_views = [sink for sink in wanted if not spec_of(sink).derived or table in pipeline.history_tables()]
            if not row_views:
                continue
            excluded = pipeline.tables[table].exclude_columns
            shape, estimate = readers.source_shape(conn, pipeline.source.schema_name, table, excluded)
            canon = Canonicaliser(shape)
            buckets = bucket_count(estimate)
            source = spill(_source_pairs(conn, canon), Path(scratch) / table / "source", buckets)
            for sink in row_views:
                if spec_of(sink).derived:  # the history table
                    outcome = _history_outcome(sink, canon, source, targets, Path(scratch), examples)
                else:
                    pairs = _sink_pairs(sink, canon, targets, pipeline)
                    spilled = spill(pairs, Path(scratch) / table / sink, buckets)
                    outcome = _outcome(table, sink, source, spilled, examples)
                    spilled.remove()
                outcomes.append(outcome)
                if on_outcome:
                    on_outcome(outcome)
            source.remove()
        for name, view in pipeline.windows.items():
            if any(table == view.table and any(spec_of(sink).derived for sink in wanted) for table, wanted in plan):
                outcome = _windows_outcome(conn, targets, pipeline, name, view, examples)
                outcomes.append(outcome)
                if on_outcome:
                    on_outcome(outcome)
        for aggregate in aggregates_to_verify(pipeline, plan, catalogue.read(conn, pipeline.source.schema_name)):
            outcome = _aggregate_outcome(sink_of_view(AGGREGATES_VIEW), aggregate, conn, targets, pipeline,
                                         Path(scratch), examples)
            outcomes.append(outcome)
            if on_outcome:
                on_outcome(outcome)
        for name in nested_selection(pipeline, tables, sinks):
            outcome = _nested_outcome(sink_of_view(NESTED_VIEW), conn, pipeline, name, targets,
                                      Path(scratch) / "nested" / name, examples)
            outcomes.append(outcome)
            if on_outcome:
                on_outcome(outcome)
    return outcomes


def aggregates_to_verify(
    pipeline: PipelineConfig, plan: list[tuple[str, list[SinkName]]], found: Catalogue
) -> list[AggregatePlan]:
    """The aggregates over any table whose view holding them (AGGREGATES_VIEW) is being verified
    (`found`: the source's catalogue, which the declarations are resolved against)."""
    holder = sink_of_view(AGGREGATES_VIEW)
    cached = {table for table, wanted in plan if holder in wanted}
    return [aggregate for aggregate in pipeline.aggregate_plans(found) if cached & set(aggregate.tables)]


def _aggregate_outcome(
    sink: SinkName, aggregate: AggregatePlan, conn: psycopg.Connection, targets: Targets, pipeline: PipelineConfig,
    scratch: Path, examples: int,
) -> Outcome:
    """An aggregate is compared like a table: group id for doc id, its figures for the row."""
    folder = scratch / "aggregates" / aggregate.name
    buckets = 16
    source = spill(source_figures(conn, aggregate, pipeline.source.schema_name), folder / "source", buckets)
    held = spill(cache_figures(targets.redis_url, aggregate, targets.redis_prefix), folder / sink, buckets)
    try:
        return _outcome(f"aggregate:{aggregate.name}", sink, source, held, examples)
    finally:
        source.remove()
        held.remove()


def nested_selection(pipeline: PipelineConfig, tables: Iterable[str] | None, sinks: Iterable[SinkName] | None
                     ) -> list[str]:
    """The nested views to verify: all of them with the sink of the view that holds them (NESTED_VIEW),
    narrowed to those whose root table is selected when tables are named."""
    chosen_tables = [tables] if isinstance(tables, str) else list(tables or pipeline.tables)
    chosen_sinks = [sinks] if isinstance(sinks, str) else list(sinks or SINKS)
    if sink_of_view(NESTED_VIEW) not in chosen_sinks:
        return []
    return [name for name, view in pipeline.nested.items() if view.root in chosen_tables]


def _nested_outcome(sink: SinkName, conn: psycopg.Connection, pipeline: PipelineConfig, name: str, targets: Targets,
                    scratch: Path, examples: int) -> Outcome:
    """One nested view against the same join computed by PostgreSQL, document by document."""
    view = pipeline.nested[name]
    shapes = nested.shapes(conn, pipeline, view)
    buckets = bucket_count(readers.source_shape(conn, pipeline.source.schema_name, view.root)[1])
    source = spill(nested.source_pairs(conn, pipeline.source.schema_name, view, shapes), scratch / "source", buckets)
    spilled = spill(nested.sink_pairs(targets.es_url, name, view, shapes), scratch / sink, buckets)
    outcome = _outcome(nested.label(name), sink, source, spilled, examples)
    source.remove()
    spilled.remove()
    return outcome


def _history_outcome(
    sink: SinkName, canon: Canonicaliser, source: Spilled, targets: Targets, scratch: Path, examples: int
) -> Outcome:
    """The history table's current versions against PostgreSQL, plus its own structure."""
    table = canon.shape.table
    path = targets.warehouse_dir / history_table(table)
    rows = readers.warehouse_rows(path, canon.shape, where=quoted(IS_CURRENT))
    spilled = spill(((_warehouse_id(canon, row), canon.digest(row)) for row in rows), scratch / table / "history",
                    source.buckets)
    tally = compare(source, spilled, examples, unique_ids=_unique_keys(sink))
    spilled.remove()
    structure = derived.history_structure(path, canon.shape, examples)
    divergences = tally.divergences(table, "history") + structure.divergences(table, "history")
    return Outcome(table, "history", source.rows, spilled.rows, tuple(divergences))


def _windows_outcome(
    conn: psycopg.Connection, targets: Targets, pipeline: PipelineConfig, name: str, view: WindowView, examples: int
) -> Outcome:
    """A window table (plus its late deltas) against PostgreSQL's rows aggregated the same way."""
    expected = derived.source_figures(conn, pipeline.source.schema_name, view)
    figures, late = derived.warehouse_figures(targets.warehouse_dir, name)
    tally = derived.compare_figures(expected, figures, late, examples)
    note = f"{len(late)} windows with late changes" if late else ""
    return Outcome(name, "windows", len(expected), len(figures), tuple(tally.divergences(name, "windows")), note)


def selection(
    pipeline: PipelineConfig, tables: Iterable[str] | None, sinks: Iterable[SinkName] | None
) -> list[tuple[str, list[SinkName]]]:
    """(table, sinks with a view of it) to verify, in pipeline order; unknown names are errors."""
    # A lone name is one table or sink, not a sequence of letters.
    chosen_tables = [tables] if isinstance(tables, str) else list(tables or pipeline.tables)
    chosen_sinks = [sinks] if isinstance(sinks, str) else list(sinks or SINKS)
    unknown = [table for table in chosen_tables if table not in pipeline.tables]
    if unknown:
        raise VerifyError(f"not in the pipeline file: {', '.join(unknown)} (tables: {', '.join(pipeline.tables)})")
    bad_sinks = [sink for sink in chosen_sinks if sink not in SINKS]
    if bad_sinks:
        raise VerifyError(f"unknown sink {', '.join(bad_sinks)}: choose from {', '.join(SINKS)}")
    known_sinks = cast(list[SinkName], chosen_sinks)  # every name checked against SINKS just above
    plan = []
    for table in pipeline.tables:
        if table in chosen_tables:
            wanted = [sink for sink in known_sinks if table in pipeline.sink_tables(sink)]
            if wanted:
                plan.append((table, wanted))
    if not plan:
        raise VerifyError("no selected table has a selected view: nothing to verify")
    return plan


def _source_pairs(conn: psycopg.Connection, canon: Canonicaliser) -> Iterator[tuple[str, str]]:
    for row in readers.source_rows(conn, canon.shape):
        yield canon.doc_id(row), canon.digest(row)


def _sink_pairs(
    sink: SinkName, canon: Canonicaliser, targets: Targets, pipeline: PipelineConfig
) -> Iterator[tuple[str, str]]:
    view = spec_of(sink).view
    if view is None:
        raise VerifyError(f"the {sink} sink has no view of its own: its rows are read as its history tables")
    return VIEW_READERS[view](canon, targets, pipeline)


def _search_pairs(canon: Canonicaliser, targets: Targets, pipeline: PipelineConfig) -> Iterator[tuple[str, str]]:
    table = canon.shape.table
    search = pipeline.tables[table].search
    alias = (search.index if search else None) or table
    return ((row_id, canon.digest(row)) for row_id, row in readers.search_rows(targets.es_url, alias))


def _cache_pairs(canon: Canonicaliser, targets: Targets, pipeline: PipelineConfig) -> Iterator[tuple[str, str]]:
    cached = readers.cache_rows(targets.redis_url, canon.shape, targets.redis_prefix)
    return ((row_id, canon.digest(row)) for row_id, row in cached)


def _warehouse_pairs(canon: Canonicaliser, targets: Targets, pipeline: PipelineConfig) -> Iterator[tuple[str, str]]:
    # The warehouse is keyed by its columns, not by a stored id: the id is derived as for PostgreSQL.
    stored = readers.warehouse_rows(targets.warehouse_dir / canon.shape.table, canon.shape)
    return ((_warehouse_id(canon, row), canon.digest(row)) for row in stored)


RowPairs = Callable[[Canonicaliser, Targets, PipelineConfig], Iterator[tuple[str, str]]]
# How a table's rows are read from the store of each pipeline.yaml view a sink declares (SinkSpec.view),
# as (doc id, digest) pairs: keyed by the view, as the reading is the store's. A derived sink (no view)
# is read as its history tables (`_history_outcome`). tests/unit/test_verify_plan.py holds these keys
# to the registry's views, so a sink declared with a new view fails there until it has a reader.
VIEW_READERS: dict[str, RowPairs] = {"search": _search_pairs, "cache": _cache_pairs, "warehouse": _warehouse_pairs}
# The views whose stores also hold what pipeline.yaml declares across rows: `cache_aggregates` are kept
# with the cache view's rows (PipelineConfig.aggregate_plans: over the tables that have one), `nested`
# join documents are indices beside the search view's.
AGGREGATES_VIEW = "cache"
NESTED_VIEW = "search"


def sink_of_view(view: str) -> SinkName:
    """The sink whose query writes `view` (a pipeline.yaml view section), as the registry declares."""
    for sink in SINKS:
        if spec_of(sink).view == view:
            return sink
    raise VerifyError(f"no sink declares the view {view}")


def _unique_keys(sink: SinkName) -> bool:
    return Capability.UNIQUE_KEYS in spec_of(sink).capabilities


def _warehouse_id(canon: Canonicaliser, row: dict) -> str:
    missing = [name for name in canon.shape.key if name not in row]
    if missing:
        raise VerifyError(f"the warehouse table {canon.shape.table} has no key column {', '.join(missing)}")
    return canon.doc_id(row)


def _outcome(table: str, sink: SinkName, source: Spilled, spilled: Spilled, examples: int) -> Outcome:
    # A store keyed by id (UNIQUE_KEYS): a repeat is a scan artefact. A Delta table can hold two rows.
    tally = compare(source, spilled, examples, unique_ids=_unique_keys(sink))
    return Outcome(table, sink, source.rows, spilled.rows, tuple(tally.divergences(table, sink)))
