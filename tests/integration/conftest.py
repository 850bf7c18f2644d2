"""Fixtures the integration modules share."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from services.settings import StackSettings
from services.stack import jars


@pytest.fixture(scope="module")
def spark(stack: StackSettings) -> Iterator[Any]:
    """A local Spark session on one core (the sinks' and verify's own code paths), or the one running."""
    from pyspark.sql import SparkSession

    from spark_jobs.runtime.session import build_session

    existing = SparkSession.getActiveSession()
    session = existing or build_session("tideline-test", jars.bundle_dir(stack, "spark"), master="local[1]")
    yield session
    if existing is None:
        session.stop()
