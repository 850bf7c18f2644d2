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

DEFAULT_PATH = Path(__file__).resolve().parent.parent / "pipeline.yaml"

Identifier = Annotated[str, Field(pattern=r"^[a-z_][a-z0-9_]*$", max_length=63)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class SourceConfig(_Strict):
    """Where changes come from and how Debezium names what it creates."""

    schema_name: Identifier = Field(default="public", alias="schema")
    # Kafka Connect connector name.
    connector: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]+$")] = "tideline-postgres"
    slot: Identifier = "tideline"
    publication: Identifier = "tideline"
    # Topic names are <topic_prefix>.<schema>.<table>.
    topic_prefix: Identifier = "tideline"
    # Partitions per change topic: more partitions, more parallel apply tasks.
    partitions: int = Field(default=3, ge=1, le=1024)
    heartbeat_interval_ms: int = Field(default=10_000, ge=100)


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


class PipelineConfig(_Strict):
    source: SourceConfig = SourceConfig()
    tables: dict[Identifier, TableConfig]
    # Event-time window tables by name (each a Delta table <warehouse_dir>/<name>).
    windows: dict[Identifier, WindowView] = {}

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
                raise ValueError(f"windows.{name}.table: {view.table} has no warehouse view; add `warehouse: {{}}` to it")
            if name in self.warehouse_paths():
                raise ValueError(f"windows.{name}: the name is taken by a warehouse table; choose another")
        return self

    def warehouse_paths(self) -> set[str]:
        """Names the warehouse folder already holds: each table and, with history, <table>_history."""
        names = set()
        for table, views in self.tables.items():
            if views.warehouse is not None:
                names |= {table, history_table(table)} if views.warehouse.history else {table}
        return names

    def window_problems(self, catalog: dict[str, dict[str, str]]) -> list[str]:
        """What `windows:` gets wrong about the source schema. `catalog` is table -> column ->
        PostgreSQL type category (pg_type.typcategory: 'D' date/time, 'N' numeric)."""
        problems = []
        for name, view in self.windows.items():
            columns = catalog.get(view.table, {})
            for field, column, category, kind in (
                ("time_column", view.time_column, "D", "a date or timestamp"),
                ("value_column", view.value_column, "N", "a numeric"),
            ):
                if column not in columns:
                    known = ", ".join(sorted(columns)) or "none: does the table exist?"
                    problems.append(f"windows.{name}.{field}: {self.source.schema_name}.{view.table} has no column "
                                    f"{column!r} (columns: {known}); fix pipeline.yaml")
                elif columns[column] != category:
                    problems.append(f"windows.{name}.{field}: {view.table}.{column} is not {kind} column; fix pipeline.yaml")
        return problems

    def history_tables(self) -> list[str]:
        return [t for t, views in self.tables.items() if views.warehouse is not None and views.warehouse.history]

    def qualified_tables(self) -> list[str]:
        return [f"{self.source.schema_name}.{table}" for table in self.tables]

    def topic(self, table: str) -> str:
        return f"{self.source.topic_prefix}.{self.source.schema_name}.{table}"


class PipelineConfigError(Exception):
    """The pipeline file is missing or invalid; the message names the file, the field and the problem."""


def _describe(error: dict) -> str:
    location = ".".join(str(part) for part in error["loc"])
    return f"{location}: {error['msg']}" if location else error["msg"]


def load(path: Path = DEFAULT_PATH) -> PipelineConfig:
    try:
        raw = yaml.safe_load(path.read_text())
    except FileNotFoundError as exc:
        raise PipelineConfigError(f"{path}: file not found; set TIDE_PIPELINE_FILE or create it (see docs/capture.md)") from exc
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise PipelineConfigError(f"{path}{where}: not valid YAML ({getattr(exc, 'problem', exc)})") from exc
    if not isinstance(raw, dict):
        raise PipelineConfigError(f"{path}: expected a mapping with 'source' and 'tables'")
    try:
        return PipelineConfig.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(_describe(error) for error in exc.errors())
        raise PipelineConfigError(f"{path}: {problems}") from exc


def history_table(table: str) -> str:
    """The SCD2 history table's name in the warehouse folder."""
    return f"{table}_history"


def topic_table(topic: str) -> str:
    """The table name from a change topic name (<prefix>.<schema>.<table>)."""
    match = re.fullmatch(r"[^.]+\.[^.]+\.([^.]+)", topic)
    if not match:
        raise ValueError(f"not a change topic name: {topic}")
    return match.group(1)
