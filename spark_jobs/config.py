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
from pydantic_core import PydanticCustomError

from spark_jobs.aggregates import AggregateConfigError, AggregatePlan, AggregateView, Catalogue, plans

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


class PipelineConfig(_Strict):
    source: SourceConfig = SourceConfig()
    tables: dict[Identifier, TableConfig]
    # Derived aggregates the cache keeps in Redis (spark_jobs/aggregates.py, docs/sinks/redis.md).
    cache_aggregates: dict[Identifier, AggregateView] = {}

    @field_validator("tables")
    @classmethod
    def _at_least_one_table(cls, tables: dict[str, TableConfig]) -> dict[str, TableConfig]:
        if not tables:
            raise ValueError("name at least one table to capture")
        return tables

    @model_validator(mode="after")
    def _aggregates_match_the_schema(self) -> PipelineConfig:
        try:
            self.aggregate_plans()
        except AggregateConfigError as exc:
            raise PydanticCustomError("aggregate", str(exc)) from exc  # the message alone, on one line
        return self

    def aggregate_plans(self, catalogue: Catalogue | None = None) -> list[AggregatePlan]:
        cached = {table for table, views in self.tables.items() if views.cache is not None}
        return plans(self.cache_aggregates, cached, catalogue)

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


def topic_table(topic: str) -> str:
    """The table name from a change topic name (<prefix>.<schema>.<table>)."""
    match = re.fullmatch(r"[^.]+\.[^.]+\.([^.]+)", topic)
    if not match:
        raise ValueError(f"not a change topic name: {topic}")
    return match.group(1)
