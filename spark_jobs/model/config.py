"""The declarative pipeline file (`pipeline.yaml`): what is captured and what each view looks like.

One file, validated at start-up by every entry point (CLI, migrations, Spark
jobs), so the connector's table list, the publication and the views can never
disagree. An absent view section means that view is off for the table.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import ErrorDetails

from spark_jobs.model.aggregates import AggregateConfigError, AggregatePlan, AggregateView, missing_column, plans
from spark_jobs.model.catalogue import Catalogue
from spark_jobs.model.errors import ConfigurationError

DEFAULT_PATH = Path(__file__).resolve().parents[2] / "pipeline.yaml"
# The view section of a table each sink's query applies (analytics: spark_jobs.model.config.analytics_tables).

Identifier = Annotated[str, Field(pattern=r"^[a-z_][a-z0-9_]*$", max_length=63)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class SourceConfig(_Strict):
    """Where changes come from and how Debezium names what it creates."""

    schema_name: Identifier = Field(default="public", alias="schema")
    # Where Tideline's own signal and heartbeat tables live (docs/capture.md); unset = `schema`. A
    # schema of their own keeps them out of an application's schema and its migrations' sight.
    support_schema: Identifier | None = None
    # Kafka Connect connector name.
    connector: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]+$")] = "tideline-postgres"
    slot: Identifier = "tideline"
    publication: Identifier = "tideline"
    # Topic names are <topic_prefix>.<schema>.<table>.
    topic_prefix: Identifier = "tideline"
    # Partitions per change topic: more partitions, more parallel apply tasks.
    partitions: int = Field(default=3, ge=1, le=1024)
    heartbeat_interval_ms: int = Field(default=10_000, ge=100)
    # How long a change stays in its topic before the log cleaner may compact it away (Kafka's
    # `min.compaction.lag.ms`). A sink paused or behind by less reads every change; past it, a row whose
    # newest record is an update with an unchanged-TOAST placeholder may have lost the record that held
    # the value (docs/apply.md, "TOAST and partial images"). A day, as the follow-up topics keep theirs.
    compaction_lag_hours: int = Field(default=24, ge=0)

    @property
    def support_schema_name(self) -> str:
        return self.support_schema or self.schema_name


class SearchView(_Strict):
    index: Identifier | None = None  # defaults to the table name
    # Columns analysed as full text; other string columns are exact-match keywords.
    text: list[Identifier] = []


class CacheView(_Strict):
    pass


class WarehouseView(_Strict):
    history: bool = False  # SCD type 2 history table beside the current-state table


class WindowSpec(_Strict):
    """One family of event-time windows: [start, start + size), a new one every `slide` seconds
    (tumbling when slide is absent), aligned to the Unix epoch as Spark's window() is."""

    size_seconds: int = Field(ge=1, le=7 * 86_400)
    slide_seconds: int | None = Field(default=None, ge=1)

    @property
    def slide(self) -> int:
        return self.slide_seconds or self.size_seconds

    @model_validator(mode="after")
    def _slide_divides_size(self) -> WindowSpec:
        if self.size_seconds % self.slide != 0:
            raise ValueError(f"size_seconds {self.size_seconds} must be a multiple of slide_seconds {self.slide}")
        return self


class WindowView(_Strict):
    """A Delta table of sum(value_column) and count(*) per event-time window of a table's rows
    (docs/sinks/delta.md): maintained by the warehouse sink from the table's current state."""

    table: Identifier
    time_column: Identifier
    value_column: Identifier
    windows: list[WindowSpec] = Field(min_length=1)
    # A window stays open (its figures follow every change) until its end is this far behind the
    # newest event time seen; a change that would alter a closed window is recorded as late.
    allowed_lateness_seconds: int = Field(ge=0)


class TableConfig(_Strict):
    search: SearchView | None = None
    cache: CacheView | None = None
    warehouse: WarehouseView | None = None
    # PostgreSQL's REPLICA IDENTITY, set by `tide db migrate`. With "default", an update that leaves a
    # TOASTed column unchanged carries Debezium's placeholder; once compaction keeps only such an
    # update for a row, a sink rebuilt from the topic cannot know that column. "full" logs the whole
    # old row, so every record carries every value (more WAL per update): docs/capture.md.
    replica_identity: Literal["default", "full"] = "default"
    # Columns that never reach Kafka (e.g. PII): dropped by Debezium (`column.exclude.list`) before a
    # record is written, so no topic, view or rebuild ever holds them. Not allowed on the primary key.
    exclude_columns: list[Identifier] = []


class ParentJoin(_Strict):
    """A row this row refers to: `join_column` (a column of the referring row) holds the parent's
    one-column primary key. Embedded as an object (null when the column is null or the row is absent)."""

    table: Identifier
    join_column: Identifier | None = None
    fields: list[Identifier] = Field(min_length=1)
    parents: dict[Identifier, ParentJoin] = {}


class ChildJoin(_Strict):
    """Rows that refer to this row: `join_column` (a column of the child) holds this row's one-column
    primary key. Embedded as a list ordered by the child's primary key."""

    table: Identifier
    join_column: Identifier | None = None
    fields: list[Identifier] = Field(min_length=1)
    parents: dict[Identifier, ParentJoin] = {}
    children: dict[Identifier, ChildJoin] = {}


class NestedView(_Strict):
    """A search index of join documents: one per row of `root`, with its parents and children
    (docs/sinks/elasticsearch.md, "Nested views"). Every table in it needs a `search` view: the
    flat indices are the join state."""

    root: Identifier
    fields: list[Identifier] = Field(min_length=1)
    parents: dict[Identifier, ParentJoin] = {}
    children: dict[Identifier, ChildJoin] = {}


JoinNode = NestedView | ParentJoin | ChildJoin


def join_nodes(node: JoinNode, path: str) -> list[tuple[str, JoinNode, list[str]]]:
    """(path, node, tables of its ancestors) for a node and everything below it, parents first."""

    def walk(current: JoinNode, where: str, above: list[str]) -> list[tuple[str, JoinNode, list[str]]]:
        table = current.root if isinstance(current, NestedView) else current.table
        found = [(where, current, above)]
        for kind, joins in (("parents", current.parents), ("children", getattr(current, "children", {}))):
            for name, join in joins.items():
                found += walk(join, f"{where}.{kind}.{name}", [*above, table])
        return found

    return walk(node, path, [])


def node_table(node: JoinNode) -> str:
    return node.root if isinstance(node, NestedView) else node.table


def nested_view_errors(name: str, view: NestedView, tables: dict[str, TableConfig]) -> list[str]:
    """Structural problems of one nested view, each naming the fix (columns are checked by
    `nested_column_errors`, which needs the schema)."""
    errors = []
    for path, node, above in join_nodes(view, f"nested.{name}"):
        table = node_table(node)
        if table not in tables:
            errors.append(f"{path}: unknown table {table}; add it under tables: (with a search view) or fix the name")
            continue
        if tables[table].search is None:
            errors.append(f"{path}: table {table} has no search view; add `search: {{}}` to tables.{table} "
                          "(its flat index is the join state)")
        if table in above:
            errors.append(f"{path}: cycle, {table} is already joined above ({' -> '.join([*above, table])}); "
                          "a nested view is a tree: remove this join")
        if not isinstance(node, NestedView) and node.join_column is None:
            holder = f"{table} that holds the {above[-1]} key" if isinstance(node, ChildJoin) else \
                f"{above[-1]} that holds the {table} key"
            errors.append(f"{path}: no join_column; name the column of {holder}")
    return errors


def nested_column_errors(pipeline: PipelineConfig, columns: dict[str, set[str]]) -> list[str]:
    """Fields and join columns of the nested views that the schema (`columns`: table -> column
    names) does not have, or that the pipeline keeps out of Kafka."""
    errors = []
    for name, view in pipeline.nested.items():
        for path, node, above in join_nodes(view, f"nested.{name}"):
            table = node_table(node)
            known = columns.get(table, set()) - set(pipeline.tables[table].exclude_columns)
            wanted = list(node.fields)
            if isinstance(node, ChildJoin) and node.join_column:
                wanted.append(node.join_column)
            if isinstance(node, ParentJoin) and node.join_column:
                referring = above[-1]
                referring_known = columns.get(referring, set()) - set(pipeline.tables[referring].exclude_columns)
                if node.join_column not in referring_known:
                    errors.append(missing_column(f"{path}.join_column", referring, node.join_column, referring_known))
            errors += [missing_column(path, table, column, known) for column in wanted if column not in known]
    return errors


class PipelineConfig(_Strict):
    source: SourceConfig = SourceConfig()
    tables: dict[Identifier, TableConfig]
    # Event-time window tables by name (each a Delta table <warehouse_dir>/<name>).
    windows: dict[Identifier, WindowView] = {}
    # Derived aggregates the cache keeps in Redis (spark_jobs/model/aggregates.py, docs/sinks/redis.md).
    cache_aggregates: dict[Identifier, AggregateView] = {}
    # Search indices of join documents, by index name.
    nested: dict[Identifier, NestedView] = {}

    @model_validator(mode="after")
    def _nested_views_fit_the_tables(self) -> PipelineConfig:
        errors = [error for name, view in self.nested.items() for error in nested_view_errors(name, view, self.tables)]
        flat = {(config.search.index or table) for table, config in self.tables.items() if config.search}
        errors += [f"nested.{name}: the index name is also a table's search index; rename one (search.index)"
                   for name in self.nested if name in flat]
        if errors:
            raise ValueError("; ".join(errors))
        return self

    @field_validator("tables")
    @classmethod
    def _at_least_one_table(cls, tables: dict[str, TableConfig]) -> dict[str, TableConfig]:
        if not tables:
            raise ValueError("name at least one table to capture")
        return tables

    @model_validator(mode="after")
    def _windows_name_warehouse_tables(self) -> PipelineConfig:
        for name, view in self.windows.items():
            table = self.tables.get(view.table)
            if table is None:
                raise ValueError(
                    f"windows.{name}.table: unknown table {view.table!r}; name one of {', '.join(self.tables)}"
                )
            if table.warehouse is None:
                raise ValueError(
                    f"windows.{name}.table: {view.table} has no warehouse view; add `warehouse: {{}}` to it"
                )
            if taken := {name, late_table(name)} & self.warehouse_paths():
                raise ValueError(
                    f"windows.{name}: {', '.join(sorted(taken))} is taken by a warehouse table; choose another"
                )
        return self

    def warehouse_paths(self) -> set[str]:
        """Names the warehouse folder holds for the tables: each table and, with history, <table>_history."""
        names = set()
        for table, views in self.tables.items():
            if views.warehouse is not None:
                names |= {table, history_table(table)} if views.warehouse.history else {table}
        return names

    def warehouse_tables(self) -> list[str]:
        """Every table the warehouse writes: current state, history, each window view and its late table."""
        windows = {table for name in self.windows for table in (name, late_table(name))}
        return sorted(self.warehouse_paths() | windows)

    def window_problems(self, catalogue: Catalogue) -> list[str]:
        """What `windows:` gets wrong about the source schema (`catalogue`: spark_jobs.model.aggregates)."""
        problems = []
        for name, view in self.windows.items():
            info = catalogue.get(view.table)
            columns = info.columns if info else {}
            for field, column, kinds, kind in (
                ("time_column", view.time_column, ("time",), "a date or timestamp"),
                ("value_column", view.value_column, ("integer", "decimal", "number"), "a numeric"),
            ):
                if column not in columns:
                    problems.append(missing_column(f"windows.{name}.{field}", view.table, column, columns))
                elif columns[column].kind not in kinds:
                    problems.append(
                        f"windows.{name}.{field}: {view.table}.{column} is not {kind} column; fix pipeline.yaml"
                    )
        return problems

    def schema_problems(self, catalogue: Catalogue) -> list[str]:
        """Every column the nested views, cache aggregates and windows name that `catalogue` lacks
        (or has with an unusable type), one line each: the one check of all three against a schema."""
        columns = {table: set(info.columns) for table, info in catalogue.items()}
        problems = nested_column_errors(self, columns) if self.nested else []
        try:
            self.aggregate_plans(catalogue)
        except AggregateConfigError as exc:
            problems.append(str(exc))
        return problems + self.window_problems(catalogue)

    def history_tables(self) -> list[str]:
        return [t for t, views in self.tables.items() if views.warehouse is not None and views.warehouse.history]

    def windowed_tables(self) -> list[str]:
        return [t for t in self.tables if any(view.table == t for view in self.windows.values())]

    def analytics_tables(self) -> list[str]:
        """The tables the warehouse's derived tables are built from: with history, or under a window view."""
        derived = {*self.history_tables(), *self.windowed_tables()}
        return [t for t in self.tables if t in derived]

    def aggregate_plans(self, catalogue: Catalogue) -> list[AggregatePlan]:
        cached = {table for table, views in self.tables.items() if views.cache is not None}
        return plans(self.cache_aggregates, cached, catalogue)

    def sink_tables(self, sink: str) -> list[str]:
        """The tables a sink's query reads: those with its view (spark_jobs/model/sink_registry.py); for a
        sink without one (analytics), those its derived tables are built from."""
        from spark_jobs.model.sink_registry import spec_of  # the registry names sinks, this module their views

        view = spec_of(sink).view
        if view is None:
            return self.analytics_tables()
        return [table for table, views in self.tables.items() if getattr(views, view) is not None]

    def qualified_tables(self) -> list[str]:
        return [f"{self.source.schema_name}.{table}" for table in self.tables]

    def topic(self, table: str) -> str:
        return f"{self.source.topic_prefix}.{self.source.schema_name}.{table}"


class PipelineConfigError(ConfigurationError):
    """The pipeline file is missing or invalid; the message names the file, the field and the problem."""


def _describe(error: ErrorDetails) -> str:
    location = ".".join(str(part) for part in error["loc"])
    return f"{location}: {error['msg']}" if location else error["msg"]


def load(path: Path = DEFAULT_PATH) -> PipelineConfig:
    try:
        raw = yaml.safe_load(path.read_text())
    except FileNotFoundError as exc:
        raise PipelineConfigError(
            f"{path}: file not found; set TIDE_PIPELINE_FILE or create it (see docs/capture.md)"
        ) from exc
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise PipelineConfigError(f"{path}{where}: not valid YAML ({getattr(exc, 'problem', exc)})") from exc
    if not isinstance(raw, dict):
        raise PipelineConfigError(f"{path}: expected a mapping with 'source' and 'tables'")
    try:
        pipeline = PipelineConfig.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(_describe(error) for error in exc.errors())
        raise PipelineConfigError(f"{path}: {problems}") from exc
    return pipeline


def check_schema(pipeline: PipelineConfig, catalogue: Catalogue, path: Path = DEFAULT_PATH) -> None:
    """Raise PipelineConfigError (one line naming the file) if the columns the nested views, cache
    aggregates and windows name are not in the source's catalogue, or have unusable types."""
    problems = pipeline.schema_problems(catalogue)
    if problems:
        raise PipelineConfigError(f"{path}: {'; '.join(problems)}")


def history_table(table: str) -> str:
    """The SCD2 history table's name in the warehouse folder."""
    return f"{table}_history"


def late_table(name: str) -> str:
    """A window view's table of late changes, in the warehouse folder."""
    return f"{name}_late"


def topic_table(topic: str) -> str:
    """The table name from a change topic name (<prefix>.<schema>.<table>)."""
    match = re.fullmatch(r"[^.]+\.[^.]+\.([^.]+)", topic)
    if not match:
        raise ValueError(f"not a change topic name: {topic}")
    return match.group(1)
