"""What `tide up` prints at the end: ready-to-paste lines to write to the source and read each view.

Every value comes from the settings and pipeline.yaml (ports, user, database, view names); the
password never appears, only the `.env` it is read from.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from services.api import server
from services.settings import StackSettings
from spark_jobs.model.config import PipelineConfig
from spark_jobs.sinks.redis import row_key

# The example row (demo schema): the INSERT's name is found by the search line's word.
EXAMPLE_TABLE = "customers"
EXAMPLE_INSERT = (
    "INSERT INTO customers (email, name, country) VALUES ('ada@example.com', 'Ada Lovelace', 'GB') "
    "ON CONFLICT (email) DO NOTHING;"
)
EXAMPLE_WORD = "ada"
# The first row's key: a demo customer with `--demo`, else the first customer inserted.
EXAMPLE_KEY = "1"


@dataclass(frozen=True)
class Section:
    title: str
    commands: list[str]


def _curl(url: str, comment: str) -> str:
    return f"curl -s {shlex.quote(url)}   # {comment}"


def your_database(settings: StackSettings, pipeline: PipelineConfig, env_file: Path) -> list[Section]:
    """With your own PostgreSQL (TIDE_POSTGRES_URL): psql to it, and the first table's search and
    warehouse views (a cache read needs a key of yours: its form is shown as a comment)."""
    password = [f"source {shlex.quote(str(env_file))}"] if env_file.exists() else []
    write = Section("Write to your PostgreSQL as your application does, e.g. with psql:",
                    [*password, 'psql "$TIDE_POSTGRES_URL"'])
    table, views = next(iter(pipeline.tables.items()))
    api = server.url(settings)
    reads = [*([_curl(f"{api}/search/{views.search.index or table}?size=1", "search view")] if views.search else []),
             *([_curl(f"{api}/warehouse/{table}?limit=5", "warehouse view (Delta Lake)")] if views.warehouse else []),
             *([f"# cache view: curl -s {api}/cache/{table}/<primary key>"] if views.cache else [])]
    return [write, Section(f"Query the views of {table} (query API {api}, its docs at {api}/docs):", reads)]


def sections(settings: StackSettings, pipeline: PipelineConfig, env_file: Path) -> list[Section]:
    if settings.source_external:
        return your_database(settings, pipeline, env_file)
    host = shlex.quote(settings.host_of("postgres"))
    psql = (
        f'PGPASSWORD="$TIDE_POSTGRES_PASSWORD" psql -h {host} -p {settings.postgres_port} '
        f"-U {shlex.quote(settings.postgres_user)} {shlex.quote(settings.postgres_db)}"
    )
    password = [f"source {shlex.quote(str(env_file))}"] if env_file.exists() else []
    write = Section("Write to the source (PostgreSQL), then type SQL, e.g. the INSERT below:",
                    [*password, psql, EXAMPLE_INSERT])
    views = pipeline.tables.get(EXAMPLE_TABLE)
    if views is None:
        return [write]
    api = server.url(settings)
    reads: list[str] = []
    if views.search is not None:
        reads.append(_curl(f"{api}/search/{views.search.index or EXAMPLE_TABLE}?q={EXAMPLE_WORD}", "search view"))
    if views.cache is not None:
        reads.append(_curl(f"{api}/cache/{EXAMPLE_TABLE}/{EXAMPLE_KEY}", "cache view, by primary key"))
    if views.warehouse is not None:
        reads.append(_curl(f"{api}/warehouse/{EXAMPLE_TABLE}?limit=5", "warehouse view (Delta Lake)"))
    if views.cache is not None:
        database = f" -n {settings.job_redis_db}" if settings.job_redis_db else ""
        reads.append(
            f"redis-cli -h {shlex.quote(settings.host_of('redis'))} -p {settings.redis_port}{database} "
            f"HGETALL {row_key(EXAMPLE_TABLE, EXAMPLE_KEY)}   # the cache in Redis itself"
        )
    return [write, Section(f"Query the views (query API {api}, its docs at {api}/docs):", reads)]
