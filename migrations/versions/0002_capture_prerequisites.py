"""Capture prerequisites: signal and heartbeat tables, the CDC role, the publication.

Revision ID: 0002
Revises: 0001
Create Date: 2025-11-22

The role's name and password come from settings (TIDE_CDC_USER /
TIDE_CDC_PASSWORD), the publication's name and table list from pipeline.yaml;
services.capture.objects does the work so `tide db migrate` and `tide connector
apply` can re-apply it when either changes.
"""

from __future__ import annotations

from collections.abc import Sequence

import psycopg
import sqlalchemy as sa
from alembic import context, op

from services.capture import objects
from services.settings import StackSettings
from spark_jobs.model.config import PipelineConfig

revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _inputs() -> tuple[psycopg.Connection, StackSettings, PipelineConfig]:
    attributes = context.config.attributes
    settings = attributes["settings"]
    pipeline = attributes.get("pipeline") or objects.load_pipeline(settings)
    driver = op.get_bind().connection.driver_connection
    assert isinstance(driver, psycopg.Connection), "the engine is postgresql+psycopg (migrations.engine)"
    return driver, settings, pipeline


def upgrade() -> None:
    conn, settings, pipeline = _inputs()
    schema = pipeline.source.support_schema_name
    op.create_table(
        objects.SIGNAL_TABLE,
        sa.Column("id", sa.String(42), nullable=False),
        sa.Column("type", sa.String(32), nullable=False),
        sa.Column("data", sa.String(2048)),
        sa.PrimaryKeyConstraint("id", name=f"{objects.SIGNAL_TABLE}_pkey"),
        schema=schema,
    )
    op.create_table(
        objects.HEARTBEAT_TABLE,
        sa.Column("id", sa.Integer, autoincrement=False, nullable=False),
        sa.Column("beat_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=f"{objects.HEARTBEAT_TABLE}_pkey"),
        schema=schema,
    )
    objects.apply(conn, settings, pipeline)


def downgrade() -> None:
    conn, settings, pipeline = _inputs()
    objects.drop_publication(conn, pipeline)
    objects.drop_role(conn, settings.cdc_user, pipeline)
    op.drop_table(objects.HEARTBEAT_TABLE, schema=pipeline.source.support_schema_name)
    op.drop_table(objects.SIGNAL_TABLE, schema=pipeline.source.support_schema_name)
