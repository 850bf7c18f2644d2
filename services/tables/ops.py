"""`tide tables add` and `tide tables remove`: the steps, in the order that keeps every other table whole.

add:    check the table (exists, keyed, its topic unused) → the pipeline with it, validated →
        preflight, publication, grants and connector include list (`tide connector apply`) →
        pipeline.yaml written → the jobs take up its topic → the API restarted → the incremental
        snapshot of its existing rows (progress shown by the caller).
remove: the pipeline without it, validated → connector, publication and grants without it →
        pipeline.yaml written → the jobs drop its topic (each affected query continues from where it was, less
        that topic). Its views and topic are kept as they were, no longer updated.

Changes committed to the new table while it is added are covered: the connector streams them from
the moment its include list names the table, and the incremental snapshot that follows reads every
row as it is then (Debezium drops a snapshot row whose key changed inside its window: the streamed
change wins).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import psycopg

from services.capture import objects
from services.capture.connector import registration, topics
from services.capture.source import introspect
from services.settings import StackSettings
from services.stack import postgres
from services.stack.service import StackError
from services.tables import jobs, pipeline_file
from spark_jobs.model.config import PipelineConfig, PipelineConfigError, TableConfig

Say = Callable[[str], None]


@dataclass(frozen=True)
class ViewChoice:
    """The views to give a new table; `text` None = guess the full-text columns as `tide init` does."""

    search: bool = True
    text: list[str] | None = None
    cache: bool = True
    warehouse: bool = True
    history: bool = False


def _found(settings: StackSettings, pipeline: PipelineConfig, table: str) -> introspect.Found:
    schema = pipeline.source.schema_name
    with psycopg.connect(postgres.conninfo(settings)) as conn:
        tables = {found.name: found for found in introspect.read(conn, schema)}
    if table not in tables:
        raise StackError(f"{schema}.{table} does not exist in {postgres.address(settings)}: create it first "
                         f"(tables of {schema}: {', '.join(sorted(tables)) or 'none'})")
    return tables[table]


def table_views(found: introspect.Found, choice: ViewChoice) -> TableConfig:
    """The new entry: `tide init`'s views, less those turned off, with the full-text columns given."""
    if (reason := introspect.skip_reason(found)) is not None:
        raise StackError(f"{found.name} cannot be captured: {reason}")
    guessed = introspect.views(found)
    unknown = sorted(set(choice.text or ()) - set(found.schema.columns))
    if unknown:
        raise StackError(f"--search names {', '.join(unknown)}, not a column of {found.name}: "
                         f"choose from {', '.join(found.schema.columns)}")
    assert guessed.search is not None, "introspect.views always guesses a search view"
    search = {"text": choice.text if choice.text is not None else guessed.search.text}
    return TableConfig.model_validate({
        **({"search": search} if choice.search else {}),
        **({"cache": {}} if choice.cache else {}),
        **({"warehouse": {"history": choice.history}} if choice.warehouse else {}),
    })


def _require_unused_topic(settings: StackSettings, pipeline: PipelineConfig, table: str) -> None:
    """A topic left by an earlier capture of the table holds rows as they were then, and misses the
    deletes since: the jobs would apply them before the snapshot. Refuse rather than resurrect."""
    topic = pipeline.topic(table)
    consumer = topics.open_consumer(settings)
    try:
        held = sum(topics.end_offsets(consumer, topic).values())
    finally:
        consumer.close()
    if held:
        raise StackError(f"topic {topic} already holds {held} records from an earlier capture of {table}: "
                         f"delete it and {table}'s views first (docs/own-database.md, Removing a table)")


def add(settings: StackSettings, table: str, choice: ViewChoice, say: Say) -> PipelineConfig:
    """Every step of `add` but the snapshot; returns the new pipeline (the caller snapshots `table`)."""
    path = settings.pipeline_file
    pipeline = objects.load_pipeline(settings)
    if table in pipeline.tables:
        raise StackError(f"{table} is already captured (pipeline.yaml); `tide snapshot {table}` re-reads its rows")
    views = table_views(_found(settings, pipeline, table), choice)
    text = pipeline_file.with_table(path.read_text(), table, views, path)
    new = pipeline_file.validated(path, text)
    _require_unused_topic(settings, new, table)
    registration.apply(settings, new)
    say(f"publication {new.source.publication} and connector {new.source.connector} capture {table} "
        f"(topic {new.topic(table)})")
    pipeline_file.write(path, text)
    added = ", ".join(view for view in ("search", "cache", "warehouse") if getattr(views, view))
    say(f"pipeline.yaml: {table} added with {added}")
    jobs.reload(settings, new, say)
    jobs.restart_api(settings, say)
    return new


def remove(settings: StackSettings, table: str, say: Say) -> PipelineConfig:
    """Every step of `remove`; returns the new pipeline."""
    path = settings.pipeline_file
    pipeline = objects.load_pipeline(settings)
    if table not in pipeline.tables:
        raise StackError(f"{table} is not captured (pipeline.yaml has {', '.join(pipeline.tables)})")
    text = pipeline_file.without_table(path.read_text(), table, path)
    try:
        new = pipeline_file.validated(path, text)
    except PipelineConfigError as exc:
        raise StackError(f"cannot remove {table}: without it {exc}") from None
    registration.apply(settings, new)
    say(f"publication {new.source.publication} and connector {new.source.connector} no longer capture {table}")
    pipeline_file.write(path, text)
    say(f"pipeline.yaml: {table} removed")
    jobs.reload(settings, new, say)
    jobs.restart_api(settings, say)
    say(f"kept as they were, no longer updated: topic {pipeline.topic(table)} and the views of {table}")
    return new


__all__ = ["ViewChoice", "add", "remove", "table_views"]
