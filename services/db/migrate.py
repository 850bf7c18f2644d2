"""The source database's migrations (Alembic, the project's `migrations/` folder), applied from
Python: `tide db ...`, `tide up` and the tests call these.

Alembic's script folder is found from this file's place in the tree, so nothing depends on the
current directory or on an `alembic.ini`, and nothing here imports `migrations` (its env.py imports
this module: the dependency runs one way). The
connection comes from `StackSettings` through `services.stack.postgres.conninfo`,
the one place that knows how to reach PostgreSQL.
"""

from __future__ import annotations

from pathlib import Path

import psycopg
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, create_engine
from sqlalchemy.pool import NullPool

from services.capture import objects
from services.settings import StackSettings
from services.stack import postgres
from spark_jobs.model.config import PipelineConfig

__all__ = ["CAPTURE_REVISION", "alembic_config", "current", "downgrade", "engine", "head", "upgrade"]

SCRIPT_LOCATION = Path(__file__).resolve().parents[2] / "migrations"
# The revision that creates the CDC role, grants and publication (services/capture/objects.py).
CAPTURE_REVISION = "0002"


def engine(settings: StackSettings) -> Engine:
    """An engine that connects exactly like the rest of Tideline (same conninfo, same timeout).

    NullPool: migrations are one short session; nothing should linger holding locks.
    """
    return create_engine(
        "postgresql+psycopg://",
        creator=lambda: psycopg.connect(postgres.conninfo(settings)),
        poolclass=NullPool,
    )


def alembic_config(settings: StackSettings, pipeline: PipelineConfig | None = None) -> Config:
    """Alembic's config without a file; env.py reads `settings` (and `pipeline`, if given) from its attributes."""
    config = Config()
    # Config values go through ConfigParser interpolation: escape '%' in the path.
    config.set_main_option("script_location", str(SCRIPT_LOCATION).replace("%", "%%"))
    config.attributes["settings"] = settings
    if pipeline is not None:
        config.attributes["pipeline"] = pipeline
    return config


def head() -> str:
    script = ScriptDirectory(str(SCRIPT_LOCATION))
    return script.get_current_head() or "base"


def current(settings: StackSettings) -> str:
    """The revision the database is at ("base" for none). Reads only; runs no migration code."""
    with engine(settings).connect() as connection:
        heads = MigrationContext.configure(connection).get_current_heads()
    return ",".join(heads) or "base"


def upgrade(settings: StackSettings, revision: str = "head", pipeline: PipelineConfig | None = None) -> None:
    """Apply migrations up to `revision`, then re-apply the capture prerequisites if they are installed.

    Idempotent. The re-apply is why a changed `.env` password or a changed table
    list in pipeline.yaml takes effect on the next `tide db migrate`, even when
    the database is already at head (Alembic would otherwise run nothing).
    Everything happens in one transaction: a failure leaves the database as it was.
    """
    config = alembic_config(settings, pipeline)
    with engine(settings).begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, revision)
        heads = MigrationContext.configure(connection).get_current_heads()
        if _applied(CAPTURE_REVISION, heads):
            driver = connection.connection.driver_connection
            assert isinstance(driver, psycopg.Connection), "the engine is postgresql+psycopg (engine())"
            objects.apply(driver, settings, pipeline or objects.load_pipeline(settings))


def downgrade(settings: StackSettings, revision: str) -> None:
    """Undo migrations down to `revision` ("base" removes everything Tideline created), in one transaction."""
    config = alembic_config(settings)
    with engine(settings).begin() as connection:
        config.attributes["connection"] = connection
        command.downgrade(config, revision)


def _applied(revision: str, heads: tuple[str, ...]) -> bool:
    """Whether `revision` is one of `heads` or an ancestor of one."""
    script = ScriptDirectory(str(SCRIPT_LOCATION))
    return any(rev.revision == revision for rev in script.iterate_revisions(heads, "base"))
