"""`tide init`: read a schema's tables and write the pipeline.yaml that captures every one that can be.

A table is captured when it has a primary key (every view is keyed by it) and pipeline.yaml can name
it; every other table is listed with the reason it was left out, in the output and in the file. Each
captured table gets a search view (its text columns analysed as full text, a guess to edit), a cache
view and a warehouse view.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import psycopg
import yaml

from services.capture import objects
from spark_jobs.model import catalogue
from spark_jobs.model.config import PipelineConfig, TableConfig

# Column types whose values are prose worth analysing as full text (others are exact-match keywords).
TEXT_TYPES = frozenset({"TEXT", "VARCHAR", "CITEXT"})
_NAME = re.compile(r"^[a-z_][a-z0-9_]*$")
# The schema the signal and heartbeat tables go to: out of the application's own schema.
SUPPORT_SCHEMA = "tideline"

_TABLES = """
SELECT c.relname, c.relkind, c.relispartition, c.relreplident,
       (SELECT p.relname FROM pg_inherits h JOIN pg_class p ON p.oid = h.inhparent WHERE h.inhrelid = c.oid LIMIT 1)
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = %s AND c.relkind IN ('r', 'p')
ORDER BY c.relname
"""


@dataclass(frozen=True)
class Found:
    """One table of the schema, with what decides whether it can be captured."""

    name: str
    partitioned: bool
    partition_of: str | None
    replica_identity: str
    schema: catalogue.TableSchema


@dataclass(frozen=True)
class Choice:
    captured: dict[str, TableConfig]
    skipped: dict[str, str]  # table -> why it is not captured


def read(conn: psycopg.Connection, schema: str) -> list[Found]:
    """Every ordinary and partitioned table of `schema` with its columns and primary key."""
    columns = catalogue.read(conn, schema)
    return [
        Found(name, kind == "p", parent if is_partition else None, identity,
              columns.get(name, catalogue.TableSchema({})))
        for name, kind, is_partition, identity, parent in conn.execute(_TABLES, (schema,))
    ]


def skip_reason(table: Found) -> str | None:
    """Why `table` cannot be captured as it is, naming the fix; None when it can."""
    if table.name in (objects.SIGNAL_TABLE, objects.HEARTBEAT_TABLE):
        return "Tideline's own (Debezium's signals, heartbeats)"
    if not _NAME.match(table.name) or len(table.name) > 63:
        return "pipeline.yaml names tables in lowercase letters, digits and _ only: rename it to capture it"
    if table.partitioned or table.partition_of:
        what = "partitioned table" if table.partitioned else f"partition of {table.partition_of}"
        return f"{what}: partitioned tables are not captured yet"
    if not table.schema.primary_key:
        return f"no primary key: every view is keyed by it; add one, then `tide tables add {table.name}`"
    if table.replica_identity == "n":
        return "REPLICA IDENTITY NOTHING: its updates and deletes would carry no key; set it to DEFAULT"
    return None


def views(table: Found) -> TableConfig:
    """Search (text columns outside the key as full text), cache and warehouse views."""
    key = set(table.schema.primary_key)
    text = [column.name for column in table.schema.columns.values()
            if column.type in TEXT_TYPES and column.name not in key and _NAME.match(column.name)]
    return TableConfig.model_validate({"search": {"text": text}, "cache": {}, "warehouse": {}})


def choose(tables: list[Found]) -> Choice:
    captured, skipped = {}, {}
    for table in tables:
        if (reason := skip_reason(table)) is None:
            captured[table.name] = views(table)
        else:
            skipped[table.name] = reason
    return Choice(captured, skipped)


def render(schema: str, choice: Choice) -> str:
    """pipeline.yaml's text: a header, the source, each captured table, and the skipped tables as
    comments with their reason. Validated as every entry point validates the file."""
    support = SUPPORT_SCHEMA if schema != SUPPORT_SCHEMA else f"{SUPPORT_SCHEMA}_capture"
    text = (
        f"# Written by `tide init` from schema {schema}. Each table: a search view (the `text` columns\n"
        "# analysed as full text: a guess, edit it), a cache view and a warehouse view.\n"
        "# `tide tables add TABLE` / `tide tables remove TABLE` change the list while everything runs.\n"
        "source:\n"
        f"  schema: {schema}\n"
        f"  support_schema: {support}   # Tideline's signal and heartbeat tables, out of your schema\n"
        "tables:\n"
        + "".join(table_entry(name, config) for name, config in choice.captured.items())
        + "".join(f"# not captured: {name}: {reason}\n" for name, reason in choice.skipped.items())
    )
    PipelineConfig.model_validate(yaml.safe_load(text))
    return text


def table_entry(name: str, config: TableConfig) -> str:
    """One table's entry under `tables:`, each view on one line in flow style."""
    lines = [f"  {name}:"]
    for view, value in config.model_dump(mode="json", exclude_defaults=True).items():
        lines.append(f"    {view}: {yaml.safe_dump(value, default_flow_style=True, width=200).strip()}")
    return "\n".join(lines) + "\n"
